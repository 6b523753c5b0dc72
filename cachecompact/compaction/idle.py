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
* **Returns before the TTL** (``1 - p``): no collapse was due. The edit is then an ordinary
  warm edit, worth what the policy's cache model says of it (`policy.economics`: the turns'
  smaller reads, less the re-write of everything after the edit, the summary and the reasoning
  it invalidates), but never more than nothing: the policy itself did not make that edit at the
  last request (its thresholds keep history the agent may still need), and idle compaction
  does not overrule them. Counting its future savings as a gain made it fire on sessions that
  were merely big, and cost evidence recall: on the 2025 Claude Code set, 0.968 -> 0.949 for
  5% less (docs/benchmarks.md).

So ``value = p * (summary_cold - summary_warm) + (1 - p) * min(0, early.net)``, and idle
compaction fires only when the value is positive. ``p`` comes from the session's own gaps: of the gaps after which
a person spoke that outlasted the time the session has already been quiet, the share that
outlasted the TTL (`GapMeter.returns_after`), half when there are none. An agent that knows how
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
    return p_late * (summary_cold - summary_warm) + (1.0 - p_late) * min(0.0, early.net)
