"""Give back what the agent reached for: lines of cleared output that its newest calls name.

Compaction hides old tool output behind a summary or a placeholder. When the agent's next
call names a symbol, path or id that only hidden output showed (it edits the function a
collapsed `Read` listed, it greps for the setting a cleared result defined), the agent is
working with that thing again, and it will likely name it again. So the line that showed it
comes back: appended, verbatim and marked, to the result of that very call, which was never
sent before, so no cached byte changes. It costs the line once, and the agent does not have
to spend a turn re-reading the file.

`restore_edits` plans the ledger edits for the newest calls from the lines the lookback meter
keeps (identifier -> the newest tool-output lines naming it). Both derive from the transcript
and the ledger alone, so every replica plans the same edits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..base.identifiers import identifiers_in_input
from ..base.wire import TextBlock, ToolResultBlock, ToolUseBlock, content_blocks, result_text
from ..history.ledger import ReplaceWithSummary
from .lookback import GIVEN_BACK_LEVEL, InView

if TYPE_CHECKING:
    from ..history.session import Session
    from .lookback import LookbackMeter

__all__ = ["RESTORE_LEVEL", "RESTORE_REASON", "restore_edits"]

RESTORE_REASON = "lines the agent reached for, given back"
RESTORE_LEVEL = GIVEN_BACK_LEVEL
RESTORE_HEADER = ("[cachecompact: earlier tool output naming what this call used, which compaction had cleared "
                  "from the context:]")


def restore_edits(session: Session, index: LookbackMeter, since: int, budget_chars: int,
                  skip_ids: frozenset[str] = frozenset()) -> list[ReplaceWithSummary]:
    """For every assistant message from ``since`` on whose calls name an identifier that only
    hidden tool output showed, an edit appending the newest such lines (whole, each once, at
    most ``budget_chars`` per message) to the first plain result answering those calls."""
    entries = session.ledger.effective()
    if not entries or budget_chars <= 0:
        return []
    t = session.transcript
    view = InView(entries)
    out: list[ReplaceWithSummary] = []
    pe = session.prefix_end or 0
    for a in range(max(since, pe), len(t) - 1):
        if t[a].role != "assistant":
            continue
        uses = [b for b in content_blocks(t[a]) if isinstance(b, ToolUseBlock)]
        if not uses:
            continue
        lines: dict[str, None] = {}
        used = 0
        for x in identifiers_in_input([b.input for b in uses]):
            if x in index.pinned:
                continue
            seen = [e for e in index.lines.get(x, ()) if e[0] < a]
            if not seen or view.any(seen):
                continue
            line = seen[-1][2]
            if line in lines or used + len(line) + 1 > budget_chars:
                continue
            lines[line] = None
            used += len(line) + 1
        if not lines:
            continue
        ids = {b.id for b in uses}
        for blk in content_blocks(t[a + 1]):
            if not isinstance(blk, ToolResultBlock) or blk.tool_use_id not in ids or blk.tool_use_id in skip_ids:
                continue
            if isinstance(blk.content, list) and any(not isinstance(x, TextBlock) for x in blk.content):
                continue  # an image or document: its text alone would not render it
            text = result_text(blk) + "\n\n" + RESTORE_HEADER + "\n" + "\n".join(lines)
            out.append(ReplaceWithSummary(a + 1, a + 1, text, RESTORE_REASON, tool_use_id=blk.tool_use_id))
            break
    return out
