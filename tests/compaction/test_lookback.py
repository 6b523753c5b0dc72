"""The lookback meter: how far back the agent looks, and the recent budget learnt from it."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import pytest

from cachecompact import Session
from cachecompact.base.shares import wilson_upper
from cachecompact.compaction._lookback import LADDER_RATIO, MIN_EXPECTED, InView, LookbackMeter
from cachecompact.compaction.cache_aware import CacheAwareCompactor
from cachecompact.history.draft import Draft
from cachecompact.history.ledger import ReplaceWithSummary

from .test_levels import GOAL, tool_turn
from .test_policy import _grow, cfg


def _file(rng: random.Random, k: int) -> str:
    """A module with one setting among ordinary indented lines naming ``local_k_j`` (about 1k tokens)."""
    body = [f"    local_{k}_{j} = compute_{rng.randint(100, 999)}(x)" for j in range(60)]
    return "\n".join([f"SETTING_{k} = {rng.randint(1000, 9999)}", "def run(x):", *body, "    return x"])


def _agent(turns: int = 40, gap: int = 6) -> list[dict[str, Any]]:
    """An agent that reads one file per turn and, from turn ``gap`` on, also names a line of the
    file it read ``gap`` turns earlier."""
    rng = random.Random(7)
    msgs: list[dict[str, Any]] = [{"role": "user", "content": GOAL}]
    for k in range(turns):
        inp: dict[str, Any] = {"path": f"mod_{k}.py"}
        if k >= gap:
            inp["note"] = f"local_{k - gap}_30"
        msgs += tool_turn(k, "read", _file(rng, k), inp)
    return msgs


def _meter(msgs: list[dict[str, Any]], store: Path | None = None, prefix: int = 1) -> tuple[LookbackMeter, Session]:
    s = Session.create(store, prefix_messages=prefix)
    s.sync(msgs)
    m = LookbackMeter(300)
    m.observe(Draft(s))
    return m, s


def test_a_lookback_is_measured_to_the_output_it_reached_and_counts_the_history_behind_it() -> None:
    m, _ = _meter(_agent(turns=20, gap=6))
    assert len(m.lookbacks) == 14
    distances = [d for d, _ in m.lookbacks]
    spans = [sp for _, sp in m.lookbacks]
    assert spans == sorted(spans)  # history only grows
    assert min(distances) > 4_000 and max(distances) < 6_000  # six files of about 760 tokens back
    assert all(d <= sp for d, sp in m.lookbacks)  # the first round after the prefix: all of it


def test_the_budget_covers_the_share_asked_for_and_no_more() -> None:
    m, _ = _meter(_agent(turns=80, gap=6))  # every look-back reaches about 4.6k tokens back
    budget = m.budget(0.9, cap=200_000)
    assert budget is not None and 4_600 < budget < 4_600 * LADDER_RATIO ** 2
    far, at_risk = m.beyond(budget)
    assert far == 0 and at_risk >= MIN_EXPECTED / 0.1
    # an agent that reaches twice as far needs about twice the budget
    far_agent, _ = _meter(_agent(turns=80, gap=12))
    bigger = far_agent.budget(0.9, cap=200_000)
    assert bigger is not None and bigger > 1.7 * budget
    assert m.budget(0.0, cap=200_000) is None  # the meter is off


def test_coverage_rises_only_where_the_agent_missed_more_than_the_rate_allows() -> None:
    m, _ = _meter(_agent(turns=80, gap=6))
    n = len(m.lookbacks)
    assert m.turns > 0 and n > 0
    assert m.coverage_for(0.9, 0.02) == 0.9  # no miss yet: the configured coverage
    m.missed = max(1, round(0.01 * m.turns))  # under the rate: unchanged
    assert m.coverage_for(0.9, 0.02) == 0.9
    m.missed = round(0.08 * m.turns)  # four times the rate: a quarter of the tail stays uncovered
    assert abs(m.coverage_for(0.9, 0.02) - min(1 - MIN_EXPECTED / n, 1 - 0.1 * 0.02 * m.turns / m.missed)) < 1e-9
    assert m.coverage_for(0.9, 0.02) > 0.9
    m.missed = 10 * m.turns  # never beyond what the look-backs seen can certify
    assert m.coverage_for(0.9, 0.02) == 1 - MIN_EXPECTED / n
    assert m.coverage_for(0.9, 0.0) == 0.9  # the rate off: coverage alone


def test_look_backs_made_with_little_history_behind_them_say_nothing_about_far_budgets() -> None:
    """Early in a session every look-back is short because nothing lies far behind: those made
    with less history than a budget are not counted for or against it."""
    m, _ = _meter(_agent(turns=60, gap=1))  # about 45k tokens of history in all
    far, at_risk = m.beyond(50_000)
    assert (far, at_risk) == (0, 0)
    assert m.budget(0.9, cap=40_000) is not None  # near budgets have evidence
    assert 0 < m.beyond(20_000)[1] < len(m.lookbacks)


def test_a_handful_of_lookbacks_proves_nothing() -> None:
    """Five far look-backs are expected before a share of (1 - coverage) is trusted."""
    enough = MIN_EXPECTED / 0.1
    few, _ = _meter(_agent(turns=int(enough) + 2, gap=1))
    assert few.budget(0.9, cap=200_000) is None
    more, _ = _meter(_agent(turns=int(enough) + 20, gap=1))
    assert more.budget(0.9, cap=200_000) is not None
    assert wilson_upper(0.0, 9) <= 0.1 < wilson_upper(0.0, 8)


def test_lookbacks_into_the_immutable_prefix_count_and_are_never_at_risk() -> None:
    """Issue 63: the first read sits in the prefix, and the agent's first submission reaches back
    to it. That is the session's first evidence of its reach (as far back as the history after
    the prefix), though the prefix itself is never hidden."""
    msgs = _agent(turns=12, gap=1)
    m, s = _meter(msgs, prefix=len(msgs) - 2)  # everything but the last turn is the prefix
    assert len(m.lookbacks) == 1
    after_prefix = sum(b.tokens for j in range(s.prefix_end or 0, len(s)) for b in s.renderer.plain_message(j).blocks)
    assert 0 <= m.lookbacks[0][0] <= after_prefix  # made before any history after the prefix: 0
    assert m.exposed == 0 and m.missed == 0
    far = _agent(turns=12, gap=8)  # turn 8 names a line of turn 0's file, which the prefix holds
    m, _ = _meter(far, prefix=3)
    first = m.lookbacks[0][0]
    assert first > 5_000, first  # seven files of history after the prefix, about 760 tokens each
    assert m.exposed == 0


def test_a_rerun_of_an_earlier_call_reached_back_to_its_output() -> None:
    msgs = _agent(turns=30, gap=100)  # no look-backs of its own
    msgs += tool_turn(100, "read", "again", {"path": "mod_3.py"})  # the call of turn 3, again
    m, _ = _meter(msgs)
    assert len(m.lookbacks) == 1 and m.lookbacks[0][0] > 20_000


def test_repeating_a_call_whose_result_is_never_cleared_lost_nothing() -> None:
    """Recording the same finding twice is not a re-read: a one-word result is never cleared."""
    msgs = _agent(turns=30, gap=100)
    msgs += tool_turn(100, "record", "recorded", {"note": "same"})
    msgs += tool_turn(101, "record", "recorded", {"note": "same"})
    m, _ = _meter(msgs)
    assert m.lookbacks == []


def test_a_name_the_agent_used_again_is_measured_from_its_last_use() -> None:
    """Once the agent has named something, its line is in its working set (or given back): the
    next look-back to it reaches only as far as that use."""
    msgs = _agent(turns=30, gap=100)
    msgs += tool_turn(100, "edit", "ok", {"note": "local_2_30"})  # far: 28 files back
    msgs += tool_turn(101, "edit", "ok", {"note": "local_2_30"})  # near: one turn back
    m, _ = _meter(msgs)
    (far, _), (near, _) = m.lookbacks
    assert far > 20_000 and near < 500


def test_the_meter_is_derived_from_the_transcript_alone(tmp_path: Path) -> None:
    """A restarted process (or another replica) learns the same budget from the stored session."""
    msgs = _agent()
    first, s = _meter(msgs, tmp_path / "store")
    again = LookbackMeter(300)
    again.observe(Draft(Session.open(tmp_path / "store", s.session_id)))
    assert again.lookbacks == first.lookbacks
    half = LookbackMeter(300)  # observed in two steps, the same as in one
    s2 = Session.create(None, prefix_messages=1)
    s2.sync(msgs[:31])
    half.observe(Draft(s2))
    s2.sync(msgs)
    half.observe(Draft(s2))
    assert half.lookbacks == first.lookbacks and half.budget(0.9, 10**6) == first.budget(0.9, 10**6)


def test_the_meter_counts_the_lookbacks_that_compaction_left_without_evidence() -> None:
    """A look-back whose newest line compaction hid is exposed, and it missed when no line naming
    it was in view; a line the summary kept verbatim is in view. The ledger at the time of the
    call decides, as the request showed it."""
    msgs = _agent(turns=12, gap=100)
    s = Session.create(None, prefix_messages=1)
    s.sync(msgs)
    kept = next(x.strip() for x in msgs[4]["content"][0]["content"].split("\n") if "local_1_30 " in x)
    s.edit(ReplaceWithSummary(1, 8, f"[summary of the first four reads]\n{kept}", "test"), level="L3")
    msgs += tool_turn(200, "edit", "ok", {"note": "local_1_30"})  # the summary's verbatim line shows it
    msgs += tool_turn(201, "edit", "ok", {"note": "local_2_30"})  # nothing shows it
    msgs += tool_turn(202, "edit", "ok", {"note": "local_9_30"})  # its read is in view
    s.sync(msgs)
    m = LookbackMeter(300)
    m.observe(Draft(s))
    assert len(m.lookbacks) == 3
    assert (m.exposed, m.missed) == (1, 1)


def test_lines_given_back_are_in_view_where_they_were_given_back() -> None:
    line = "local_0_30 = compute_555(x)"
    s = Session.create(None, prefix_messages=1)
    s.sync(_agent(turns=4, gap=100))
    s.edit(ReplaceWithSummary(6, 6, f"ok\n\n[given back]\n{line}", "given back", tool_use_id="toolu_2"),
           level="restore")
    view = InView(s.ledger.effective())
    assert line in view.given_back and view.any([(2, "toolu_0", line)])
    assert not view.shows(6, "toolu_2", "a line the edit does not hold")
    assert view.shows(4, "toolu_1", "any line of an unedited result")


def test_the_compactor_learns_the_budget_and_says_so_once_per_step() -> None:
    msgs = _agent(turns=100, gap=3)
    s = Session.create(None, prefix_messages=1)
    c = CacheAwareCompactor.for_session(s, cfg(200_000, lookback_coverage=0.9))
    events = []
    for k, i in enumerate(range(1, len(msgs), 2)):
        s.counter.calibration = 1.10 + 0.01 * (k % 3)  # as reported usage would move it
        events += _grow(s, c, [msgs[i:i + 2]], t0=10.0 * k)
    changes = [e for e in events if e.kind == "recent_budget"]
    assert len(changes) == 1 and changes[0].detail["learnt"] is not None
    lim = c._limits(1000, "claude-sonnet-4-6")
    assert lim.keep_recent < lim.configured_recent  # three files back is far less than 50k tokens
    assert lim.collapse_keep == lim.keep_recent  # L3 keeps what the agent looks back into
    assert c.state()["learnt"] == changes[0].detail["learnt"]
    # a fixed budget: no learning
    fixed_session = Session.create(None, prefix_messages=1)
    fixed = CacheAwareCompactor.for_session(fixed_session, cfg(200_000, lookback_coverage=0.0))
    _grow(fixed_session, fixed, [msgs[i:i + 2] for i in range(1, len(msgs), 2)])
    flim = fixed._limits(1000, "claude-sonnet-4-6")
    assert flim.keep_recent == flim.configured_recent


@pytest.mark.parametrize("distance", [2, 6, 10])
def test_a_closed_loop_agent_at_40k_rarely_reads_again_what_it_needs(distance: int) -> None:
    """Issue 37: a closed-loop agent at a 40k window that needs a fact it read about six turns
    earlier re-read the file on 46% of its submissions once the recent budget was learnt (under
    15% before). Here the agent of the task suite (it quotes facts only from what the request
    shows, else re-reads the file) needs facts at several distances back, each within what a 40k
    window can hold (a read is ~2.5k tokens: 10 reads back is ~25k of the ~37k the input may use):
    it re-reads at most 15% of them."""
    from cachecompact.tools.bench._tasks import make_task, run_task

    quotes = rereads = 0
    for seed in range(3):
        r = run_task(make_task(seed, files=24, quote_gap=(distance, distance)), "cachecompact", window=40_000)
        assert r.passed, r.failure
        quotes += r.quotes
        rereads += r.rereads
    assert quotes >= 60 and rereads / quotes <= 0.15, (rereads, quotes)


def test_reach_is_the_coverage_quantile_of_the_distances_with_room() -> None:
    m, _ = _meter(_agent(turns=40, gap=6))
    distances = sorted(d for d, _ in m.lookbacks)
    assert m.reach(0.9) == int(distances[math.ceil(0.9 * len(distances)) - 1] * 1.1)
    assert m.reach(0.0) == 0 and LookbackMeter().reach(0.9) == 0  # off, or nothing seen yet


@pytest.mark.parametrize("gap", [0, 3, 8, 12])
def test_a_cut_made_to_stop_thrashing_keeps_what_the_agent_looks_back_at(gap: int) -> None:
    """At a small window where every collapse would thrash, the no-thrash cut keeps less than the
    configured budget, but never less than the agent's own look-backs reach: an agent that names
    a line of the file it read ``gap`` turns back keeps seeing it (none when it never looks back)."""
    msgs = _agent(turns=70, gap=gap or 1000)
    s = Session.create(None, prefix_messages=1)
    c = CacheAwareCompactor.for_session(s, cfg(24_000))
    cuts = 0
    for i in range(1, len(msgs), 2):
        _grow(s, c, [msgs[i:i + 2]], t0=10.0 * i)
        floor = c._lookback.reach(c._coverage_now)
        for e in s.ledger.entries:
            if e.kind == "summary" and e.transcript_len == len(s.transcript) and "must pay back" in (e.reason or ""):
                cuts += 1
                # raw tokens, as the meter counts them
                kept = sum(b.tokens for j in range(e.end + 1, len(s)) for b in s.renderer.plain_message(j).blocks)
                assert kept >= floor, (gap, kept, floor)
    assert cuts > 0
    if gap:
        m = c._lookback
        assert m.missed <= max(2, 0.05 * len(m.lookbacks)), (m.missed, len(m.lookbacks))


def test_nothing_is_hidden_before_the_agent_has_looked_back_unless_the_window_forces_it() -> None:
    """Issue 63: compacting before the agent has shown any reach hides what it may come back to
    (at 1M, clearing under the configured 50k at 104k made an agent that looks 16 reads back
    re-read its first 8 submissions). The same session compacts once the agent looks back, and
    one that never does is compacted only when the window forces it."""
    def run(gap: int, window: int) -> tuple[CacheAwareCompactor, Session, list[Any]]:
        msgs = _agent(turns=150, gap=gap)
        s = Session.create(None, prefix_messages=1)
        c = CacheAwareCompactor.for_session(s, cfg(window))
        events = []
        for k, i in enumerate(range(1, len(msgs), 2)):
            events += _grow(s, c, [msgs[i:i + 2]], t0=10.0 * k)
        return c, s, events

    c, s, events = run(gap=1000, window=200_000)  # never looks back; ~115k of 200k: nothing forces
    assert not c._lookback.lookbacks and not s.ledger.entries
    said = [e for e in events if e.kind == "deferred" and "not yet looked back" in e.reason]
    assert len(said) == 1  # said once
    c, s, _ = run(gap=3, window=200_000)  # looks three reads back: compacted, keeping what it reaches
    assert c._lookback.lookbacks and any(e.kind == "summary" or e.level == "L1" for e in s.ledger.entries)
    assert c._lookback.missed == 0
    c, s, _ = run(gap=1000, window=60_000)  # the window forces it
    assert s.ledger.entries and not c._lookback.lookbacks


def _turn_by_turn(msgs: list[dict[str, Any]], window: int, max_tokens: int = 1000) -> tuple[Session, list[Any]]:
    """``msgs`` sent one turn at a time through the default compactor at ``window``: the session
    and every event."""
    s = Session.create(None, prefix_messages=1)
    s.sync(msgs[:1])  # the task as the agent wrote it (`_grow` starts from what the session holds)
    c = CacheAwareCompactor.for_session(s, cfg(window))
    events = []
    for k, i in enumerate(range(1, len(msgs), 2)):
        events += _grow(s, c, [msgs[i:i + 2]], t0=10.0 * k, max_tokens=max_tokens)
    return s, events


def test_a_reach_the_window_cannot_hold_is_said_with_its_numbers() -> None:
    """Issue 63, tight windows said aloud: an agent that looks 30 reads back (~23k tokens) in a
    24k window gets one event naming the prefix, the reach, the summary, the turn and the window."""
    msgs = _agent(turns=60, gap=30)
    events = _turn_by_turn(msgs, 24_000)[1]
    small = [e for e in events if e.kind == "window_too_small"]
    assert 1 <= len(small) <= 2, [e.reason for e in small]
    d = small[0].detail
    assert d["need"] == d["prefix"] + d["reach"] + d["summary"] + d["turn"] > d["critical"]
    assert d["window"] == 24_000 and "too small for this agent's reach" in small[0].reason
    assert not [e for e in _turn_by_turn(msgs, 200_000)[1] if e.kind == "window_too_small"]


def test_a_reserve_the_window_cannot_hold_is_planned_as_l5_plans_it() -> None:
    """Issue 62: Claude Code at 40k reserves 32,000 of output beside a 25k prefix. Planned for that
    reserve, the critical threshold (8,751) lay below the prefix itself: no summary could ever get
    under it, the event said so with numbers that did not add up, and only L5 acted. The policy
    plans for the reserve the window can hold (the quarter L5 works to), which the client reaches
    by lowering max_tokens on the API's 400; a reserve the window holds is planned as asked."""
    msgs = _agent(turns=60, gap=30)
    msgs[0] = {"role": "user", "content": GOAL + " Background:\n" + "notes on the project " * 3_000}
    events = _turn_by_turn(msgs, 40_000, max_tokens=32_000)[1]
    small = [e for e in events if e.kind == "window_too_small"]
    assert small, [e.kind for e in events]
    d = small[0].detail
    assert d["critical"] > d["prefix"] + d["summary"] + d["turn"], d  # a summary fits below it
    assert d["kept"] > 0, d  # and the newest part of what the agent reaches with it (before: 0)
    # a turn at a time, the window is then not forced each turn (before: 56 of 60 turns cleared)
    done = [e for e in events if e.kind == "compaction"]
    assert len(done) <= 40, len(done)
    # a small prefix leaves room beside the same reserve: planned as asked, under the 40k - 32k left
    plain = _turn_by_turn(_agent(turns=60, gap=30), 40_000, max_tokens=32_000)[1]
    assert all(e.detail["critical"] < 10_000 for e in plain if e.kind == "window_too_small")  # below the quarter


def test_each_compaction_says_what_it_hid_and_the_chance_it_is_used() -> None:
    """Issue 63: an edit's event names the messages and tokens it hid, what it kept, and the
    estimated chance that the agent reaches past what it kept (from its look-backs)."""
    s, events = _turn_by_turn(_agent(turns=120, gap=3), 60_000)
    done = [e for e in events if e.kind == "compaction"]
    assert done
    for e in done:
        h = e.detail["hidden"]
        first, last = h["messages"]
        assert 1 <= first <= last < len(s) and h["tokens"] > 0 and h["kept_tokens"] > 0
        assert h["chance_of_use"] is not None and 0 < h["chance_of_use"] < 0.5  # three reads back: rarely past
