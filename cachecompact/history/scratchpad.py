"""Content-addressed storage for tool output taken out of the context (L2), readable again.

L2 names the content in its placeholder and keeps it with its plan (`Draft.keep`); the session
stores it with the plan's ledger entries (`Session.commit`). This module reads it back for the
``read_scratchpad`` tool, from a session (its store, or its memory), a store or a folder.

A reference is ``sp_`` + the first 32 hex digits of the sha256 of the UTF-8 content; in a
folder the file is ``DIR/<ref>.txt`` (mode 0600). References are checked against that exact
pattern before anything is looked up, so ``../../etc/passwd`` or any id that would leave the
folder is refused with `ScratchpadRefError`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from pathlib import Path
from typing import Any

from ..base.errors import ScratchpadRefError
from ..base.refs import REF_RE, blob_ref, check_ref
from ..base.safefs import atomic_replace, ensure_dir
from ..store import SessionStore
from .session import Session

__all__ = ["READ_SCRATCHPAD_TOOL", "REF_RE", "Scratchpad", "ScratchpadRefError"]

MAX_READ = 20_000

READ_SCRATCHPAD_TOOL: dict[str, Any] = {
    "name": "read_scratchpad",
    "description": ("Read back tool output that was moved out of the conversation to save context. "
                    "Pass the reference shown in the shortened result (sp_...) and optionally a character "
                    "offset and limit to page through long output."),
    "input_schema": {
        "type": "object",
        "properties": {
            "ref": {"type": "string", "description": "The scratchpad reference, e.g. sp_0123..."},
            "offset": {"type": "integer", "minimum": 0, "description": "Character offset to start at."},
            "limit": {"type": "integer", "minimum": 1, "maximum": MAX_READ,
                      "description": f"Characters to return (at most {MAX_READ})."},
        },
        "required": ["ref"],
    },
}


class Scratchpad:
    """Externalized outputs, keyed by content hash (writing twice is a no-op).

    Backed by a session (a persisted one keeps the content with its records: the session
    directory's ``scratchpad/`` folder, or the database; an in-memory one in its memory), by a
    session's store, or by a folder; with none, a private temporary folder (mode 0700) made on
    first use, so nothing lands in the working directory.
    """

    def __init__(self, where: str | os.PathLike[str] | SessionStore | Session | None = None) -> None:
        self._session = where if isinstance(where, Session) and where.store is None else None
        if isinstance(where, Session):
            where = where.store
        self._store = where if isinstance(where, SessionStore) else None
        self._path = Path(where) if isinstance(where, (str, os.PathLike)) else None

    @property
    def path(self) -> Path:
        """The folder the content lives in (file-backed scratchpads only)."""
        if self._store is not None:
            loc = Path(self._store.location) / "scratchpad"
            return loc
        if self._path is None:
            self._path = Path(tempfile.mkdtemp(prefix="cachecompact-scratchpad-"))
            # an in-memory session's folder lives as long as its scratchpad (or the process)
            weakref.finalize(self, shutil.rmtree, self._path, ignore_errors=True)
        return self._path

    @classmethod
    def for_session(cls, session: Session | None) -> Scratchpad:
        """The scratchpad of ``session``: its store when persisted, else its memory."""
        return cls(session)

    @staticmethod
    def ref_for(text: str) -> str:
        return blob_ref(text.encode("utf-8"))

    def put(self, text: str) -> str:
        """Store ``text`` (atomically, fsynced, private); return its reference."""
        ref = self.ref_for(text)
        data = text.encode("utf-8")
        if self._session is not None:
            self._session.put_blob(data)
            return ref
        if self._store is not None:
            self._store.put_blob(ref, data)
            return ref
        folder = self.path
        ensure_dir(folder)
        final = folder / f"{ref}.txt"
        try:
            held = final.is_file() and not final.is_symlink() and final.read_bytes() == data
        except OSError:
            held = False
        if not held:
            atomic_replace(final, data)  # absent, damaged or unreadable: the right bytes mend it
        return ref

    def _get(self, ref: str) -> str:
        ref = check_ref(ref)
        if self._session is not None:
            data = self._session.blob(ref)
        elif self._store is not None:
            data = self._store.get_blob(ref)
        else:
            p = self.path / f"{ref}.txt"
            data = p.read_bytes() if p.is_file() and not p.is_symlink() else None
        if data is None:
            raise ScratchpadRefError(f"unknown scratchpad reference {ref!r}: its content is not in the store "
                                     "(deleted?); run the tool again")
        if blob_ref(data) != ref:  # the name is the content's hash: edited or damaged content is never served
            raise ScratchpadRefError(f"scratchpad content {ref!r} does not match its reference (it was changed or "
                                     "damaged after it was stored), so it is not served; run the tool again")
        return data.decode("utf-8")

    def read(self, ref: str, offset: int = 0, limit: int = MAX_READ) -> str:
        """``limit`` characters from ``offset``; raises `ScratchpadRefError` for unknown refs."""
        check_ref(ref)
        if not isinstance(offset, int) or offset < 0 or not isinstance(limit, int) or limit < 1:
            raise ScratchpadRefError("offset must be >= 0 and limit >= 1")
        return self._get(ref)[offset: offset + min(limit, MAX_READ)]

    def handle_tool_call(self, tool_input: dict[str, Any]) -> tuple[str, bool]:
        """Run a ``read_scratchpad`` call: (tool_result content, is_error)."""
        try:
            ref = tool_input.get("ref")
            offset = int(tool_input.get("offset", 0))
            limit = int(tool_input.get("limit", MAX_READ))
            chunk = self.read(str(ref), offset, limit)
            total = len(self._get(str(ref)))
        except (ScratchpadRefError, TypeError, ValueError) as err:
            return f"read_scratchpad error: {err}", True
        end = offset + len(chunk)
        more = f"\n[... {total - end} more characters; call again with offset={end}]" if end < total else ""
        return chunk + more, False
