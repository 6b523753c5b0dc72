"""Session storage behind one contract: the embedded file store, or PostgreSQL for fleets.

`open_store(spec)` picks the backend from a URL: ``postgresql://...`` (or ``postgres://``) is
the `PostgresStore` (the ``[postgres]`` extra); anything else is a directory for the
`FileStore`.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

from ..base.errors import ConfigError
from .contract import LOGS, LogName, SessionStore, Store, TornTail, check_session_id
from .files import EVENTS, FileSessionStore, FileStore, half_made

__all__ = [
    "EVENTS",
    "LOGS",
    "FileSessionStore",
    "FileStore",
    "LogName",
    "SessionStore",
    "Store",
    "TornTail",
    "check_session_id",
    "half_made",
    "is_database_url",
    "open_store",
]


def is_database_url(spec: object) -> bool:
    return isinstance(spec, str) and spec.split("://", 1)[0] in ("postgresql", "postgres")


def open_store(spec: str | os.PathLike[str] | Store) -> Store:
    """A `Store` from a URL or a directory path (a `Store` is returned as is)."""
    if isinstance(spec, Store):
        return spec
    if is_database_url(spec):
        try:
            module = importlib.import_module(".postgres", __package__)  # the optional [postgres] extra
        except ImportError as err:
            raise ConfigError(str(err) if "postgres extra" in str(err) else
                              f"a postgresql:// store needs the postgres extra: pip install 'cachecompact[postgres]' "
                              f"({err})") from None
        store: Store = module.PostgresStore(str(spec))
        return store
    if isinstance(spec, str) and "://" in spec:
        raise ConfigError(f"store {spec.split('://', 1)[0]}://... is not supported; use a directory path or a "
                          "postgresql:// URL")
    return FileStore(Path(spec))
