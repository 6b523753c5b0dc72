"""Copy a session between stores, record for record (``cachecompact store export|import``).

Records are copied as decoded values and re-encoded canonically, which reproduces the
stored bytes exactly (both stores keep canonical JSON), so an exported directory verifies
byte for byte with the standalone verifier in docs/ledger-format.md. The source is verified
first (`Session.open`, read-only): a corrupt session is refused, never copied. The copy is
taken under the source's lock, and a half-made destination is deleted.
"""

from __future__ import annotations

import contextlib
from typing import Any

from ..base.errors import InvalidSessionIdError, StoreError
from ..store.contract import BLOB_REF_RE, LOGS, SessionStore, Store, blob_matches, check_session_id
from .session import Session

__all__ = ["copy_session"]


def _check_names(src: SessionStore, meta: dict[str, Any]) -> None:
    """Every name the copy will use as a path or a key is checked before anything is written
    (issue 46: a blob row named ``../../x`` was written outside the export): each blob's name
    is a blob reference, and the metadata's session id and link are valid session ids. Raises
    `StoreError` naming the row."""
    where = f"{src.location} (session metadata)"
    link = meta.get("link")
    try:
        if meta.get("session_id") is not None:  # the id the copy is made under (a folder may be named otherwise)
            check_session_id(meta["session_id"], "session_id")
        if isinstance(link, dict) and link.get("session") is not None:
            check_session_id(link["session"], "link.session")
    except InvalidSessionIdError as err:
        raise StoreError(f"{where}: {err}; nothing copied") from None
    for ref in src.blob_refs():
        if not BLOB_REF_RE.match(ref):
            raise StoreError(f"{src.location} (blobs): blob {ref[:80]!r} is not a blob reference (sp_ or body_ + 32 "
                             "hex digits); nothing copied")


def copy_session(src: SessionStore, create: Store | None = None, *, dst: SessionStore | None = None) -> SessionStore:
    """Copy ``src`` into a new session (``create.create(id, meta)``, or an already created ``dst``).

    The source is copied under its lock, so a live session is copied as of one moment; every
    name it will write under is checked first (`_check_names`), and every blob's content must be
    what its name says (`blob_matches`). If the copy fails, a session this call created is
    deleted again (nothing half-copied stays); raises `StoreError` naming the bad row."""
    with src.lock():
        # every chain verified before anything is copied; the rows themselves are checked below, each
        # refusal naming its row (`ledger verify` reports the rest of a damaged session's findings)
        Session.open(src, readonly=True, verify=False)
        meta = {k: v for k, v in src.read_meta().items() if k not in ("format", "version")}
        _check_names(src, meta)
        made = None
        if dst is None:
            assert create is not None
            made = str(meta.get("session_id") or src.session_id)
            dst = create.create(made, meta)
        try:
            for log in LOGS:
                records = [rec for _, rec in src.read_all(log)]
                if records:
                    dst.read_new(log)
                    dst.append(log, records, 0)
            for ev in src.read_events():
                dst.append_event(ev)
            for ref in src.blob_refs():
                data = src.get_blob(ref)
                if data is None:
                    continue
                if not blob_matches(ref, data):
                    raise StoreError(f"{src.location} (blobs): blob {ref!r} does not hold what its name says (its "
                                     "content was changed); nothing copied")
                dst.put_blob(ref, data)
        except BaseException:
            if made is not None and create is not None:
                with contextlib.suppress(Exception):
                    create.delete(made)
            raise
    return dst
