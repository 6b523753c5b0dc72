"""L3 turn collapse: the oldest completed API rounds become one structured summary.

Everything older than the recent budget goes (and at least enough to get under the target):
every token kept past a cache break is re-written at the break and read again on every later
turn, so the cost per turn only falls as the kept tail shrinks (docs/policy.md). The recent
budget and the last rounds stay verbatim. Ranges start at the editable
start (subsuming an earlier summary there) and end where a round ends, so the request stays
valid.
"""

from __future__ import annotations

from .view import Proposal, View

__all__ = ["propose_turn_collapse"]


def propose_turn_collapse(view: View, *, target_tokens: int, keep_rounds: int, summary_tokens: int,
                          min_batch_tokens: int, keep_tokens: int | None = None) -> Proposal:
    """L3: the oldest completed rounds: all but the newest ``keep_tokens``, and at least enough to
    get under ``target_tokens``; never the last ``keep_rounds`` rounds. Without ``keep_tokens``,
    just enough to get under the target, and at least ``min_batch_tokens``. With it, the batch
    size never eats into the recent budget: a collapse that would remove less than a batch is
    proposed as it is, and the caller's economics defer it (issue 47: a cold-cache collapse
    removed "at least a batch", 80k at a 1M window, and cut a 77k context to 27k, under the
    55k the agent's look-backs had asked for)."""
    start, prev = view.editable_start()
    tail = view.tail_start(keep_rounds)
    p = Proposal("L3", "collapse the oldest completed rounds into a structured summary", previous_summary=prev)
    need = view.total_tokens - target_tokens
    ends = [e for e in view.round_ends if start <= e < tail - 1 or (e == tail - 1 and e >= start)]
    chosen = None
    last = view.n - 1
    for e in ends:
        removed = view.tokens_between(start, e) - summary_tokens
        chosen = e
        if keep_tokens is None:
            if removed >= max(need, min_batch_tokens):
                break
        elif removed >= need and view.tokens_between(e + 1, last) <= keep_tokens:
            break
    if chosen is None or view.tokens_between(start, chosen) <= summary_tokens:
        return p  # nothing to gain: the summary would not be smaller than what it replaces
    p.summarize = (start, chosen)
    p.tokens_removed = max(0, view.tokens_between(start, chosen) - summary_tokens)
    p.break_at = start
    return p
