"""L5 truncate, the last resort (prompt too long): drop the oldest whole API rounds after the
immutable prefix, so the original task always survives."""

from __future__ import annotations

from ...history.ledger import SkipRange
from .view import Proposal, View

__all__ = ["propose_truncate"]


def propose_truncate(view: View, *, target_tokens: int, keep_rounds: int = 1,
                     drop_summary: bool = False) -> Proposal:
    """L5: drop the oldest whole rounds after the prefix (and after a leading summary, which is
    kept unless ``drop_summary``: the last resort when even that does not fit) until under
    ``target_tokens``; never the last ``keep_rounds`` rounds."""
    start, prev = view.editable_start()
    if prev is not None and not drop_summary:
        start = prev.end + 1
    tail = view.tail_start(keep_rounds)
    need = view.total_tokens - target_tokens
    p = Proposal("L5", "drop the oldest whole rounds (last resort)")
    chosen = None
    for e in view.round_ends:
        if e < start or e >= tail:
            continue
        chosen = e
        if view.tokens_between(start, e) >= need:
            break
    if chosen is None:
        return p
    p.edits = [SkipRange(start, chosen, "L5: dropped oldest rounds to fit the window")]
    p.tokens_removed = view.tokens_between(start, chosen)
    p.break_at = start
    return p
