"""L5 truncate, the last resort (prompt too long): drop the oldest whole API rounds after the
immutable prefix, so the original task always survives."""

from __future__ import annotations

from ...history.ledger import SkipRange
from .view import Proposal, View

__all__ = ["propose_truncate"]


def propose_truncate(view: View, *, target_tokens: int, keep_rounds: int = 1,
                     drop_summary: bool = False, keep: int | None = None) -> Proposal:
    """L5: drop the oldest whole rounds after the prefix (and after a leading summary, which is
    kept unless ``drop_summary``: the last resort when even that does not fit) until under
    ``target_tokens``; never the last ``keep_rounds`` rounds.

    ``keep``: the person's newest request (`strategy.latest_request`). It is never dropped: a
    cut that reaches it becomes two, one before the round it ends and one after it, so the
    request goes on word for word between what was dropped (issue 62: dropping it left the agent
    working on an older request, or on none). A part an earlier cut already dropped whole is not
    dropped again: an edit that hides nothing would only lengthen the ledger (Claude Code at 40k
    logged a 0-token skip of the same range at every later L5)."""
    start, prev = view.editable_start()
    if prev is not None and not drop_summary:
        start = prev.end + 1
    tail = view.tail_start(keep_rounds)
    need = view.total_tokens - target_tokens
    p = Proposal("L5", "drop the oldest whole rounds (last resort)")
    chosen: list[tuple[int, int]] = []
    removed, kept = 0, False
    for e in view.round_ends:
        if e < start or e >= tail:
            continue
        chosen = [(a, b) for a, b in _around(view, start, e, keep) if view.tokens_between(a, b) > 0]
        kept = keep is not None and start <= keep <= e
        removed = sum(view.tokens_between(a, b) for a, b in chosen)
        if removed >= need:
            break
    if not chosen:
        return p
    why = "L5: dropped oldest rounds to fit the window" + (f" (messages[{keep}], the person's newest request, "
                                                            "kept)" if kept else "")
    p.edits = [SkipRange(a, b, why) for a, b in chosen]
    p.tokens_removed = removed
    p.break_at = chosen[0][0]
    return p


def _around(view: View, start: int, end: int, keep: int | None) -> list[tuple[int, int]]:
    """The ranges that drop ``start..end`` but ``keep``: as it is when ``keep`` lies outside it;
    else up to the last round end before ``keep`` (the round that holds it starts after it), and
    from the round after the one ``keep`` ends (a range starts at an assistant message after a
    user one, as every range of this level does)."""
    if keep is None or not start <= keep <= end:
        return [(start, end)]
    out = []
    before = [e for e in view.round_ends if start <= e < keep]
    if before:
        out.append((start, before[-1]))
    after = next((e + 1 for e in view.round_ends if e >= keep), None)
    if after is not None and after <= end:
        out.append((after, end))
    return out
