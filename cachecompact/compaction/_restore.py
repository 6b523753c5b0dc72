"""Give back what the agent reached for: lines of cleared output that its newest calls name.

Compaction hides old tool output behind a summary or a placeholder. When the agent's next
call names a symbol, path or id that only hidden output showed (it edits the function a
collapsed `Read` listed, it greps for the setting a cleared result defined), the agent is
working with that thing again, and it will likely name it again. So the line that showed it
comes back: appended, verbatim and marked, to the result of that very call, which was never
sent before, so no cached byte changes. The line is written once with the new turn and read
with the rest of the context after it, and the agent does not spend a turn re-reading the file.

`restore_edits` plans the ledger edit for the newest calls from the lines the lookback meter
keeps (identifier -> the newest tool-output lines naming it) and the view it keeps of what each
request showed. Both derive from the transcript and the ledger alone, so every replica plans
the same edits. On a session's first request nothing had been hidden from the calls the caller
brought, so nothing comes back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from ..base.identifiers import identifiers_in_input
from ..base.wire import TextBlock, ToolResultBlock, ToolUseBlock, content_blocks, result_text
from ..history.ledger import GIVEN_BACK_LEVEL, ReplaceWithSummary

if TYPE_CHECKING:
    from ..history.draft import Draft
    from ._lookback import LookbackMeter

__all__ = ["RESTORE_LEVEL", "RESTORE_REASON", "restore_edits"]

RESTORE_REASON = "lines the agent reached for, given back"
RESTORE_LEVEL: Final = GIVEN_BACK_LEVEL
RESTORE_HEADER = ("[cachecompact: earlier tool output naming what this call used, which compaction had cleared "
                  "from the context:]")


def restore_edits(session: Draft, meter: LookbackMeter, budget_chars: int,
                  skip_ids: frozenset[str] = frozenset()) -> list[ReplaceWithSummary]:
    """When the newest assistant message's calls name an identifier that only hidden tool
    output showed (hidden in the request those calls were made from), an edit appending the
    newest such lines (whole, each once, at most ``budget_chars``) to the first plain result
    answering those calls. That result must be the transcript's last message, so it was never
    sent; an identifier its own result shows needs nothing back. ``meter`` must have observed
    the transcript (it holds the lines and the view of each request)."""
    t = session.transcript
    a = len(t) - 2
    pe = session.prefix_end or 0
    if budget_chars <= 0 or a < pe or t[a].role != "assistant" or not t.is_tool_result_message(a + 1):
        return []
    uses = [b for b in content_blocks(t[a]) if isinstance(b, ToolUseBlock)]
    view = meter.view_at(session, a) if uses else None
    if view is None:
        return []  # nothing was hidden from the request that made these calls
    lines: dict[str, None] = {}
    used = 0
    for x in identifiers_in_input([b.input for b in uses]):
        known = meter.lines.get(x, ())
        if x in meter.pinned or any(m > a for m, _, _ in known):
            continue  # the prefix, or the call's own result, shows it
        seen = [e for e in known if e[0] < a]
        if not seen or view.any(seen):
            continue
        line = seen[-1][2]
        if line in lines or used + len(line) + 1 > budget_chars:
            continue
        lines[line] = None
        used += len(line) + 1
    if not lines:
        return []
    ids = {b.id for b in uses}
    for blk in content_blocks(t[a + 1]):
        if not isinstance(blk, ToolResultBlock) or blk.tool_use_id not in ids or blk.tool_use_id in skip_ids:
            continue
        if isinstance(blk.content, list) and any(not isinstance(x, TextBlock) for x in blk.content):
            continue  # an image or document: its text alone would not render it
        text = result_text(blk) + "\n\n" + RESTORE_HEADER + "\n" + "\n".join(lines)
        return [ReplaceWithSummary(a + 1, a + 1, text, RESTORE_REASON, tool_use_id=blk.tool_use_id)]
    return []
