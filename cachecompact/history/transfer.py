"""Copy a session between stores, record for record (``cachecompact store export|import``).

Records are copied as decoded values and re-encoded canonically, which reproduces the
stored bytes exactly (both stores keep canonical JSON), so an exported directory verifies
byte for byte with the standalone verifier in docs/ledger-format.md. The source is verified
first (`Session.open`, read-only): a corrupt session is refused, never copied. The copy is
taken under the source's lock, and a half-made destination is deleted.
"""

from __future__ import annotations

import contextlib

from ..store.contract import LOGS, SessionStore, Store
from .session import Session

__all__ = ["copy_session"]


def copy_session(src: SessionStore, create: Store | None = None, *, dst: SessionStore | None = None) -> SessionStore:
    """Copy ``src`` into a new session (``create.create(id, meta)``, or an already created ``dst``).

    The source is copied under its lock, so a live session is copied as of one moment; if the
    copy fails, a session this call created is deleted again (nothing half-copied stays)."""
    with src.lock():
        Session.open(src, readonly=True)  # verify every chain before copying anything
        meta = {k: v for k, v in src.read_meta().items() if k not in ("format", "version")}
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
                if data is not None:
                    dst.put_blob(ref, data)
        except BaseException:
            if made is not None and create is not None:
                with contextlib.suppress(Exception):
                    create.delete(made)
            raise
    return dst
