"""Compaction while a session is quiet: whether summarizing now, on the warm cache, pays.

A session that stays quiet past its cache's TTL has its whole context written again when the
agent returns. cachecompact already collapses old history on such a cold return (the cold rule
in `cache_aware`: the write is due anyway, so a collapse costs no extra write), so the return
writes the compacted context either way. What doing the same collapse *before* the cache expires
changes is the summary call, and what it costs when the agent comes back early:

* **Returns after the TTL** (chance ``p``): the summary was made on the warm cache, where the
  summarizer can read the session's own cached request at the read price (prefix reuse),
  instead of at a cold return, where the same call pays the full input or write price. The
  saving is ``summary_cold - summary_warm``; the write on return is the same compacted context.
* **Returns before the TTL** (``1 - p``): no collapse was due, and the policy itself did not
  make this edit at the last request (its thresholds keep history the agent may still need).
  The edit then costs what it costs now: the re-write of everything after it, the summary and
  the reasoning it invalidates (`policy.Economy`). Its later savings are not counted: the
  policy would have made its own collapse when one paid, so what the idle edit saves by
  coming first is small and unknown. Counting them, even capped at zero (``min(0, net)``, the
  rule until issue 50), fired whenever the cache model called the edit a gain: with the
  session's own model as summarizer and a person who came back after 4.5 minutes every time,
  it fired in 3 of 4 pauses at p 0.25 to 0.12 and the run cost 3.1% more than without it.

So ``value = p * (summary_cold - summary_warm) - (1 - p) * early.cost_now``, and idle
compaction fires only when the value is positive. ``p`` comes from the session's own gaps
(`GapMeter.returns_after`): of the gaps after which a person spoke that outlasted the time the
session has already been quiet, the share that outlasted the TTL, with one pseudo-gap at the
share of all the person's gaps that outlasted it (half when there are none). An agent that knows how
long it will wait gives that instead (``away_s``), and ``p`` is 1 or 0.

Against Claude Code's own idle compaction, which waits a fixed ~55 minutes and summarizes the
whole conversation, the saving is larger: that client's return writes its whole history when it
does not compact. The comparison with cachecompact's own cold return is the honest one here,
because that is what the session would do without this.
"""

from __future__ import annotations

from .policy import Economy

__all__ = ["DECIDE_BEFORE_S", "idle_value", "late_chance"]

# how long before the cache expires the scheduler decides: the summary call must be answered
# while the cache is still warm, and a large prefix-reuse read takes tens of seconds
DECIDE_BEFORE_S = 60.0


def late_chance(quiet_s: float, ttl_s: float, *, from_gaps: tuple[float, int], away_s: float | None) -> float:
    """The chance the agent returns after the cache expired: from ``away_s`` when the caller
    knows how long it will be away (seconds from now), else the gaps' (`GapMeter.returns_after`)."""
    if away_s is not None:
        return 1.0 if quiet_s + away_s > ttl_s else 0.0
    return from_gaps[0]


def idle_value(p_late: float, *, summary_cold: float, summary_warm: float, early: Economy) -> float:
    """The expected dollars saved by summarizing now rather than leaving it to the return (the
    module docstring): positive means it pays."""
    return p_late * (summary_cold - summary_warm) - (1.0 - p_late) * early.cost_now
