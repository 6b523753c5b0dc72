"""L4 full compact: everything after the immutable prefix except a recent tail becomes one
structured summary. The full transcript stays on disk."""

from __future__ import annotations

from .view import Proposal, View

__all__ = ["propose_full"]


def propose_full(view: View, *, keep_rounds: int, summary_tokens: int) -> Proposal:
    """L4: everything after the immutable prefix except the last ``keep_rounds`` rounds."""
    start, prev = view.editable_start()
    tail = view.tail_start(keep_rounds)
    p = Proposal("L4", f"summarize everything after the prefix except the last {keep_rounds} rounds",
                 previous_summary=prev)
    end = max((e for e in view.round_ends if start <= e < tail), default=None)
    if end is None or view.tokens_between(start, end) <= summary_tokens:
        return p
    p.summarize = (start, end)
    p.tokens_removed = max(0, view.tokens_between(start, end) - summary_tokens)
    p.break_at = start
    return p
