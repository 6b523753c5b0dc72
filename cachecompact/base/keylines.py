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
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .identifiers import candidate_tokens

__all__ = ["MAX_LINE", "Focus", "key_lines"]


@dataclass(frozen=True, slots=True)
class Focus:
    """What the agent worked with after a result (its working set since): ``last_use`` maps each
    identifier its calls used to the last message that used it, shared by every result, and
    ``after`` is the result's message. A line names the focus when one of its identifiers was
    used after ``after``. Plain data: the lines are chosen here, with nothing to call back."""

    last_use: Mapping[str, int]
    after: int

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
# a line-number gutter: Claude Code's Read ("   351→"), ``cat -n`` / ``nl`` ("   351\t")
_GUTTER = re.compile(r"^\s*\d+(?:→|\t)")


def _is_key(line: str) -> bool:
    """``line`` without its gutter: the file's own line is classified, the kept line keeps its number."""
    if not line.strip() or _NOISE.match(line):
        return False
    return bool(_DEF.match(line) or _ASSIGN.match(line) or _CONFIG.match(line) or _ERROR.search(line)
                or _HIT.match(line))


def key_lines(text: str, budget_chars: int, *, skip: str = "", focus: Focus | None = None) -> list[str]:
    """Key lines of ``text`` in file order, at most ``budget_chars`` in all; lines that also occur
    in ``skip`` (e.g. a preview shown anyway) are left out. Lines naming an identifier in
    ``focus`` (what the agent's own later calls used) take up to half the budget first, so a
    common name cannot crowd out the definitions; key lines come next, then more focus lines
    if room is left."""
    lines = [x.rstrip() for x in text.split("\n")]
    bodies = [_GUTTER.sub("", x, count=1) for x in lines]  # once: each pass below classifies the bodies
    picked: dict[int, None] = {}
    seen: set[str] = set()
    used = 0

    def take(pred: Callable[[str], bool], budget: int) -> None:
        nonlocal used
        for k, line in enumerate(lines):
            if k in picked or line in seen or not line.strip() or len(line) > MAX_LINE or not pred(bodies[k]) \
                    or (skip and line in skip):
                continue
            if used + len(line) + 1 > budget:
                return
            seen.add(line)
            picked[k] = None
            used += len(line) + 1

    last, after = (focus.last_use, focus.after) if focus is not None else ({}, 0)

    def named(body: str) -> bool:
        return any(last.get(x, -1) > after for x in candidate_tokens(body))

    if focus:
        take(named, budget_chars // 2)
    take(_is_key, budget_chars)
    if focus:
        take(named, budget_chars)
    return [lines[k] for k in sorted(picked)]
