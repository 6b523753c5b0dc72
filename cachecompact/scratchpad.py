"""Content-addressed storage for tool output taken out of the context (L2), readable again.

A reference is ``sp_`` + the first 32 hex digits of the sha256 of the UTF-8 content, and
the file is ``DIR/<ref>.txt`` (mode 0600). References are checked against that exact
pattern before any path is built, so ``../../etc/passwd`` or any id that would leave the
folder is refused with `ScratchpadRefError`.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from .errors import ScratchpadRefError

__all__ = ["READ_SCRATCHPAD_TOOL", "Scratchpad", "ScratchpadRefError"]

REF_RE = re.compile(r"^sp_[0-9a-f]{32}$")
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
    """A folder of externalized outputs, keyed by content hash (writing twice is a no-op)."""

    def __init__(self, path: str | os.PathLike[str] | None) -> None:
        self._path = Path(path) if path is not None else None

    @property
    def path(self) -> Path:
        """The folder; a private temporary one (mode 0700) is made on first use when none was given."""
        if self._path is None:
            self._path = Path(tempfile.mkdtemp(prefix="cachecompact-scratchpad-"))
        return self._path

    @classmethod
    def for_session(cls, session_path: Path | None) -> Scratchpad:
        """``<session dir>/scratchpad`` for a persisted session; for an in-memory one a temporary
        folder made only if something is externalized, so nothing lands in the working directory."""
        return cls(Path(session_path) / "scratchpad" if session_path is not None else None)

    def _file(self, ref: str) -> Path:
        if not isinstance(ref, str) or not REF_RE.match(ref):
            raise ScratchpadRefError(f"invalid scratchpad reference {str(ref)[:80]!r}: expected sp_ + 32 hex digits")
        p = self.path / f"{ref}.txt"
        if p.resolve().parent != self.path.resolve():
            raise ScratchpadRefError(f"scratchpad reference {ref!r} escapes {self.path}")
        return p

    @staticmethod
    def ref_for(text: str) -> str:
        return "sp_" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]

    def put(self, text: str) -> str:
        """Store ``text`` (atomically, fsynced, mode 0600); return its reference."""
        ref = self.ref_for(text)
        self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
        final = self._file(ref)
        if final.exists():
            return ref
        tmp = self.path / f".{ref}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            data = text.encode("utf-8")
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, final)
        return ref

    def read(self, ref: str, offset: int = 0, limit: int = MAX_READ) -> str:
        """``limit`` characters from ``offset``; raises `ScratchpadRefError` for unknown refs."""
        p = self._file(ref)
        if not isinstance(offset, int) or offset < 0 or not isinstance(limit, int) or limit < 1:
            raise ScratchpadRefError("offset must be >= 0 and limit >= 1")
        try:
            text = p.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ScratchpadRefError(f"unknown scratchpad reference {ref!r}") from None
        return text[offset: offset + min(limit, MAX_READ)]

    def handle_tool_call(self, tool_input: dict[str, Any]) -> tuple[str, bool]:
        """Run a ``read_scratchpad`` call: (tool_result content, is_error)."""
        try:
            ref = tool_input.get("ref")
            offset = int(tool_input.get("offset", 0))
            limit = int(tool_input.get("limit", MAX_READ))
            chunk = self.read(str(ref), offset, limit)
            total = len(self._file(str(ref)).read_text(encoding="utf-8"))
        except (ScratchpadRefError, TypeError, ValueError) as err:
            return f"read_scratchpad error: {err}", True
        end = offset + len(chunk)
        more = f"\n[... {total - end} more characters; call again with offset={end}]" if end < total else ""
        return chunk + more, False
