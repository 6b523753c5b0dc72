"""Key lines of tool output: the lines a reader most often needs again, kept verbatim.

When a tool result is shortened or cleared, its key lines are what a careful human would
copy into their notes: definitions (``def``/``class``/``function``/``struct``... signatures),
top-level assignments and configuration entries (``NAME = value``, ``key: value``), error and
failure lines, and the ``path:line:`` hits of a search. Everything else (bodies, comments,
blank lines, long data) is dropped. Lines are kept whole and in order, within a budget, so a
later step can quote them exactly.
"""

from __future__ import annotations

import re

__all__ = ["MAX_LINE", "key_lines"]

MAX_LINE = 240  # longer lines are data, not definitions: never kept

_DEF = re.compile(
    r"^\s*(?:export\s+|pub(?:\(crate\))?\s+|public\s+|private\s+|protected\s+|static\s+|async\s+|abstract\s+)*"
    r"(?:def|class|function|func|fn|interface|struct|enum|trait|impl|type|module|package|const|let|var)\s+"
    r"[A-Za-z_][\w.]*")
_ASSIGN = re.compile(r"^[A-Za-z_][\w.\-\[\]'\"]*\s*(?::\s*[\w\[\], .|]+)?\s*(?:=|:=)\s*\S")  # unindented
_CONFIG = re.compile(r"^[A-Za-z_][\w.\-]*\s*:\s+\S")  # unindented ``key: value``
_ERROR = re.compile(r"\b(?:[A-Z]\w*(?:Error|Exception)|FAILED|FAIL|Traceback|panic|fatal)\b")
_HIT = re.compile(r"^(?:\./)?[\w./\-]+:\d+[:\-]")
_NOISE = re.compile(r"^\s*(?:#|//|/\*|\*|--|<!--)")


def _is_key(line: str) -> bool:
    if not line.strip() or len(line) > MAX_LINE or _NOISE.match(line):
        return False
    return bool(_DEF.match(line) or _ASSIGN.match(line) or _CONFIG.match(line) or _ERROR.search(line)
                or _HIT.match(line))


def key_lines(text: str, budget_chars: int, *, skip: str = "") -> list[str]:
    """Key lines of ``text`` in order, at most ``budget_chars`` in all; lines that also occur in
    ``skip`` (e.g. a preview shown anyway) are left out."""
    out: list[str] = []
    seen: set[str] = set()
    used = 0
    for line in text.split("\n"):
        line = line.rstrip()
        if line in seen or not _is_key(line) or (skip and line in skip):
            continue
        if used + len(line) + 1 > budget_chars:
            break
        seen.add(line)
        out.append(line)
        used += len(line) + 1
    return out
