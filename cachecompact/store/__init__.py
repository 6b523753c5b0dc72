"""Session storage behind one contract: the embedded file store, or PostgreSQL for fleets.

`open_store(spec)` picks the backend from a URL: ``postgresql://...`` (or ``postgres://``) is
the `PostgresStore` (the ``[postgres]`` extra); anything else is a directory for the
`FileStore`.
"""

from __future__ import annotations

import importlib
import os
import threading
from pathlib import Path

from ..base.errors import CacheCompactError, ConfigError
from ..base.safefs import ensure_dir
from .contract import (
    LOGS,
    AtomicAppends,
    BatchReads,
    BlobOwners,
    DeferredSync,
    LogName,
    SessionStore,
    SharedReadLock,
    Store,
    TornTail,
    check_session_id,
)
from .files import EVENTS, FileSessionStore, FileStore, half_made

__all__ = [
    "EVENTS",
    "LOGS",
    "AtomicAppends",
    "BatchReads",
    "BlobOwners",
    "DeferredSync",
    "FileSessionStore",
    "FileStore",
    "LogName",
    "SessionStore",
    "SharedReadLock",
    "Store",
    "TornTail",
    "check_session_id",
    "half_made",
    "is_database_url",
    "open_store",
    "open_writable_store",
]


def is_database_url(spec: object) -> bool:
    return isinstance(spec, str) and spec.split("://", 1)[0] in ("postgresql", "postgres")


def open_store(spec: str | os.PathLike[str] | Store) -> Store:
    """A `Store` from a URL or a directory path (a `Store` is returned as is)."""
    if isinstance(spec, Store):
        return spec
    if not isinstance(spec, (str, os.PathLike)):
        raise ConfigError(f"store must be a directory path, a postgresql:// URL or a Store (None keeps sessions "
                          f"in memory), got {type(spec).__name__} {spec!r}")
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


def open_writable_store(spec: str | os.PathLike[str] | Store | None) -> Store | None:
    """`open_store`, and a file store's directory proved writable now: an adapter is built with
    it, so a misconfigured path fails when the adapter is made, not on its first request."""
    if spec is None:
        return None
    store = open_store(spec)
    if isinstance(store, FileStore):
        root = store.root
        try:
            ensure_dir(root)
            probe = root / f".probe-{os.getpid()}-{threading.get_ident()}"
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            os.close(fd)
            os.unlink(probe)
        except (OSError, CacheCompactError) as err:
            raise ConfigError(f"store {root} is not a writable directory: {err}") from None
    return store
