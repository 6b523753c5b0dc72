"""Scratchpad references: the one spelling of the name tool output taken out of the context gets.

A reference is ``sp_`` and the first 32 hex digits of the content's sha256, so every reader can
check what it got (docs/ledger-format.md, *scratchpad*). It lives in `base` because both sides
use it: a strategy names content in a placeholder before anything is stored, and a store files
content under it.
"""

from __future__ import annotations

import hashlib
import re

from .errors import ScratchpadRefError

__all__ = ["REF_PATTERN", "REF_RE", "blob_ref", "check_ref", "text_ref"]

REF_PATTERN = r"sp_[0-9a-f]{32}"  # a scratchpad reference: sp_ + 32 hex digits of a sha256 (the one spelling)
REF_RE = re.compile(rf"^{REF_PATTERN}$")


def blob_ref(data: bytes) -> str:
    """The reference of scratchpad content: ``sp_`` + the first 32 hex digits of its sha256. The
    name is the content's hash, so every reader can check what it got (docs/ledger-format.md)."""
    return "sp_" + hashlib.sha256(data).hexdigest()[:32]


def text_ref(text: str) -> str:
    """The reference of text kept as scratchpad content (its UTF-8 bytes)."""
    return blob_ref(text.encode("utf-8"))


def check_ref(ref: object) -> str:
    """Return ``ref`` if it is a scratchpad reference, else raise `ScratchpadRefError` (a ref
    names a file and a row: nothing else may reach a store)."""
    if not isinstance(ref, str) or not REF_RE.match(ref):
        raise ScratchpadRefError(f"invalid scratchpad reference {str(ref)[:80]!r}: expected sp_ + 32 hex digits")
    return ref
