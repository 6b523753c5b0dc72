"""What a summary keeps verbatim: the tool-output lines that name what the agent has used since.

An L3 or L4 summary replaces whole rounds. Which of their tool-output lines will the agent need
again? Not the newest ones: the ones it *acted on*. A line naming a path, symbol or id that a
later tool call or a later assistant text used is part of the agent's working set, and the
agent comes back to its working set (measured on the 2026 Claude Code logs: 61% of the
references a 20k recent budget loses name an identifier the agent had already used after the
line appeared). So a compaction keeps those lines verbatim beside the summary, the most
recently used first, within a character budget. The lines come from the original transcript,
so a later summary that subsumes this one keeps them again instead of losing them in a chain.

Which lines are kept is decided from the transcript alone, never by the summarizer, so an LLM
summary and the offline one keep the same evidence.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...base.identifiers import candidate_tokens, identifiers, identifiers_in_input
from ...base.keylines import MAX_LINE
from ...base.wire import TextBlock, ToolResultBlock, ToolUseBlock, content_blocks, result_text

if TYPE_CHECKING:
    from ...history.draft import Draft

__all__ = ["WORKING_SET_HEADER", "working_lines"]

WORKING_SET_HEADER = "Tool output the agent has used since (verbatim lines):"


def _last_uses(session: Draft, start: int) -> dict[str, int]:
    """identifier -> the last assistant message (index >= ``start``) whose calls or text used it."""
    t = session.transcript
    last: dict[str, int] = {}
    for i in range(start, len(t)):
        m = t[i]
        if m.role != "assistant":
            continue
        for b in content_blocks(m):
            if isinstance(b, ToolUseBlock):
                found = identifiers_in_input([b.input])
            elif isinstance(b, TextBlock):
                found = identifiers(b.text)
            else:
                continue
            for x in found:
                last[x] = i
    return last


def working_lines(session: Draft, start: int, end: int, budget_chars: int) -> list[str]:
    """The lines of the tool results in transcript messages ``start..end`` (as originally sent)
    that name an identifier the agent used after the result: the most recently used first,
    each line once, whole (lines over `MAX_LINE` characters are data and never kept), at most
    ``budget_chars`` characters in all, returned in transcript order."""
    if budget_chars <= 0 or end < start:
        return []
    t = session.transcript
    last = _last_uses(session, start)
    if not last:
        return []
    scored: dict[str, tuple[int, int, int]] = {}  # line -> (last use, message, line number)
    for i in range(start, min(end, len(t) - 1) + 1):
        if not t.is_tool_result_message(i):
            continue
        for b in content_blocks(t[i]):
            if not isinstance(b, ToolResultBlock):
                continue
            for k, raw in enumerate(result_text(b).split("\n")):
                line = raw.rstrip()
                if not line.strip() or len(line) > MAX_LINE:
                    continue
                use = max((last.get(x, -1) for x in candidate_tokens(line)), default=-1)
                if use > i and (line not in scored or scored[line][0] < use):
                    scored[line] = (use, i, k)
    picked: list[tuple[int, int, str]] = []
    used = 0
    for line, (_, i, k) in sorted(scored.items(), key=lambda kv: -kv[1][0]):
        if used + len(line) + 1 > budget_chars:
            continue
        used += len(line) + 1
        picked.append((i, k, line))
    return [line for _, _, line in sorted(picked)]
