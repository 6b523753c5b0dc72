"""Identifiers in agent text: file paths, code symbols, ids and numbers.

Used to measure reference recall (what later tool calls need that compaction may have
hidden), to keep a digest of them in cleared tool results, and to find the lines of a cleared
result that name what the agent's later calls used (`keylines`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

__all__ = ["candidate_tokens", "digest", "identifiers", "identifiers_in_input"]

_TOKEN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_./-]*[A-Za-z0-9_]|[0-9]{3,}")
_STOP = frozenset({"true", "false", "none", "null", "self", "return", "import", "from", "class", "def", "python",
                   "echo", "grep", "sed", "cat", "head", "tail", "find", "bash", "test", "tests", "with", "this",
                   "that", "file", "files", "print", "else", "elif", "for", "while", "not", "and"})


def _is_identifier(tok: str) -> bool:
    """Paths, dotted names, snake_case, camelCase, ids with digits, and numbers of 3+ digits.
    Memoised: agent text repeats its tokens (every turn's new output is scanned)."""
    known = _KNOWN.get(tok)
    if known is None:
        known = _classify(tok)
        if len(_KNOWN) >= _KNOWN_MAX:
            _KNOWN.clear()
        _KNOWN[tok] = known
    return known


_KNOWN: dict[str, bool] = {}
_KNOWN_MAX = 200_000


def _classify(tok: str) -> bool:
    if tok.lower() in _STOP or len(tok) < 3:
        return False
    if tok.isdigit():
        return len(tok) >= 3
    if "/" in tok or "." in tok.strip("."):
        return any(c.isalpha() for c in tok)
    if "_" in tok.strip("_"):
        return True
    if any(c.isdigit() for c in tok) and any(c.isalpha() for c in tok) and len(tok) >= 4:
        return True
    return any(c.isupper() for c in tok[1:]) and any(c.islower() for c in tok)  # camelCase / PascalCase


def candidate_tokens(text: str) -> Iterator[str]:
    """Every token of ``text`` that could be an identifier, unchecked: enough to test membership
    in a set that holds identifiers only, at half the cost of `identifiers`."""
    for m in _TOKEN.finditer(text):
        yield m.group(0).rstrip(":.-")


def identifiers(text: str) -> list[str]:
    """Distinct identifiers in order of first appearance (trailing ``:`` / ``.`` stripped)."""
    seen: dict[str, None] = {}
    for m in _TOKEN.finditer(text):
        tok = m.group(0).rstrip(":.-")
        if _is_identifier(tok):
            seen.setdefault(tok, None)
    return list(seen)


def identifiers_in_input(values: Iterable[object]) -> list[str]:
    """Identifiers in a tool call's input values (strings, nested lists and dicts)."""
    out: dict[str, None] = {}

    def walk(v: object) -> None:
        if isinstance(v, str):
            for x in identifiers(v):
                out.setdefault(x, None)
        elif isinstance(v, dict):
            for x in v.values():
                walk(x)
        elif isinstance(v, (list, tuple)):
            for x in v:
                walk(x)

    for v in values:
        walk(v)
    return list(out)


def digest(text: str, max_chars: int, skip: str = "") -> str:
    """Identifiers of ``text`` (those not already in ``skip``), comma-separated, within ``max_chars``.

    Paths and dotted names come first: they are what later tool calls most often reuse.
    """
    ids = [x for x in identifiers(text) if x not in skip]
    ids.sort(key=lambda x: 0 if ("/" in x or "." in x) else 1)
    out: list[str] = []
    used = 0
    for x in ids:
        if used + len(x) + 2 > max_chars:
            break
        out.append(x)
        used += len(x) + 2
    return ", ".join(out)
