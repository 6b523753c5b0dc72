"""The lookback meter: the recent budget shrinks only for an agent whose look-backs placeholders serve."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path
from typing import Any

from cachecompact import Session
from cachecompact.compaction.cache_aware import CacheAwareCompactor
from cachecompact.compaction.catalog import CachecompactConfig, register_strategy
from cachecompact.compaction.levels import build_view, propose_micro
from cachecompact.compaction.lookback import BUDGET_STEPS, LookbackMeter
from cachecompact.compaction.policy import LevelSettings, PolicyConfig
from cachecompact.tools.bench.tasks import make_task, run_task

from .test_levels import GOAL, tool_turn
from .test_policy import _grow, cfg


def _file(rng: random.Random, k: int) -> str:
    """A module with one setting (a key line) among ordinary indented lines naming ``local_k_j``."""
    body = [f"    local_{k}_{j} = compute_{rng.randint(100, 999)}(x)" for j in range(60)]
    return "\n".join([f"SETTING_{k} = {rng.randint(1000, 9999)}", "def run(x):", *body, "    return x"])


def _agent(quote: str, turns: int = 40, gap: int = 6) -> list[dict[str, Any]]:
    """An agent that reads one file per turn and, from turn ``gap`` on, also names something it
    read ``gap`` turns earlier: the setting (a key line) or an ordinary line."""
    rng = random.Random(7)
    msgs: list[dict[str, Any]] = [{"role": "user", "content": GOAL}]
    for k in range(turns):
        inp: dict[str, Any] = {"path": f"mod_{k}.py"}
        if k >= gap:
            inp["note"] = f"SETTING_{k - gap}" if quote == "setting" else f"local_{k - gap}_30"
        msgs += tool_turn(k, "read", _file(rng, k), inp)
    return msgs


def _meter(msgs: list[dict[str, Any]], store: Path | None = None, prefix: int = 1) -> tuple[LookbackMeter, Session]:
    s = Session.create(store, prefix_messages=prefix)
    s.sync(msgs)
    lv = LevelSettings()
    m = LookbackMeter(lv.key_fraction, lv.key_max_chars, lv.min_clear_tokens)
    m.observe(s)
    return m, s


def test_served_lookbacks_shrink_the_budget_and_unserved_ones_do_not() -> None:
    served, _ = _meter(_agent("setting"))
    unserved, _ = _meter(_agent("ordinary"))
    assert len(served.lookbacks) == len(unserved.lookbacks) == 34
    assert all(u < 0 for _, u in served.lookbacks) and all(u == r for r, u in unserved.lookbacks)
    configured = 8_000  # each file is about 1k tokens: a look-back 6 files back reaches past a quarter of it
    assert served.far_and_lost(configured // 4) == (34, 0)
    assert served.divisor(configured, 0.03) == BUDGET_STEPS[0]
    assert unserved.divisor(configured, 0.03) == 1
    assert served.divisor(configured, 0.0) == 1  # 0 turns the meter off


def test_a_handful_of_lookbacks_proves_nothing() -> None:
    few, _ = _meter(_agent("setting", turns=20))  # 14 look-backs: Jeffreys' estimate stays above 3%
    assert len(few.lookbacks) == 14 and few.divisor(8_000, 0.03) == 1
    more, _ = _meter(_agent("setting", turns=23))
    assert len(more.lookbacks) == 17 and more.divisor(8_000, 0.03) > 1


def test_one_turn_is_one_lookback_however_many_names_it_uses() -> None:
    """Twenty settings quoted in one call are one sample, not twenty."""
    msgs = _agent("setting", turns=12, gap=100)  # no look-backs of its own
    msgs += tool_turn(99, "record", "ok", {"names": [f"SETTING_{k}" for k in range(12)]})
    m, _ = _meter(msgs)
    assert len(m.lookbacks) == 1 and m.divisor(4_000, 0.03) == 1


def test_only_lookbacks_beyond_a_budget_decide_it() -> None:
    """Near look-backs cannot be lost at a smaller budget, so they do not dilute the far ones."""
    msgs = _agent("setting", turns=40, gap=1)  # 39 served look-backs one file back
    m, _ = _meter(msgs)
    assert m.far_and_lost(4_000) == (0, 0) and m.divisor(16_000, 0.03) == 1  # no evidence about 4k


def test_shortening_on_arrival_follows_only_when_near_lookbacks_are_served_too() -> None:
    """Each turn quotes a setting six files back (served) and an ordinary line of the file just
    read (unserved, but near): L1/L2 may keep less, yet new results must arrive whole."""
    rng = random.Random(7)
    msgs: list[dict[str, Any]] = [{"role": "user", "content": GOAL}]
    for k in range(40):
        inp: dict[str, Any] = {"path": f"mod_{k}.py"}
        if k >= 6:
            inp["note"] = f"SETTING_{k - 6}"
            inp["line"] = f"local_{k - 1}_30"
        msgs += tool_turn(k, "read", _file(rng, k), inp)
    m, _ = _meter(msgs)
    assert m.divisor(8_000, 0.03) == BUDGET_STEPS[0]
    assert m.divisor(8_000, 0.03, at_entry=True) == 1
    served, _ = _meter(_agent("setting"))
    assert served.divisor(8_000, 0.03, at_entry=True) == BUDGET_STEPS[0]


def test_lookbacks_into_the_immutable_prefix_are_never_at_risk() -> None:
    msgs = _agent("ordinary", turns=12)
    m, _ = _meter(msgs, prefix=len(msgs) - 2)  # everything but the last turn is the prefix
    assert m.lookbacks == []


def test_a_rerun_of_an_earlier_call_reached_back_to_output_no_placeholder_keeps() -> None:
    msgs = _agent("setting", turns=30, gap=100)
    msgs += tool_turn(100, "read", "again", {"path": "mod_3.py"})  # the call of turn 3, again
    m, _ = _meter(msgs)
    assert len(m.lookbacks) == 1
    reach, unserved = m.lookbacks[0]
    assert unserved == reach > 20_000


def test_repeating_a_call_whose_result_is_never_cleared_lost_nothing() -> None:
    """Recording the same finding twice is not a re-read: a one-word result is never cleared."""
    msgs = _agent("setting", turns=30, gap=100)
    msgs += tool_turn(100, "record", "recorded", {"note": "same"})
    rng = random.Random(3)
    for k in range(30):  # far more output in between
        msgs += tool_turn(200 + k, "read", _file(rng, 500 + k), {"path": f"other_{k}.py"})
    msgs += tool_turn(101, "record", "recorded", {"note": "same"})
    m, _ = _meter(msgs)
    assert m.lookbacks == []


def test_what_the_meter_counts_as_served_a_real_placeholder_keeps() -> None:
    """The meter's key lines are a subset of what L1's placeholder keeps, whatever its working set."""
    msgs = _agent("setting", turns=30)
    s = Session.create(None, prefix_messages=1)
    s.sync(msgs)
    view = build_view(s)
    lv = LevelSettings()
    p = propose_micro(view, keep_recent=3, write_tools=lv.write_tools, exempt_tools=frozenset(),
                      min_tokens=lv.min_clear_tokens, keep_recent_tokens=2_000, key_fraction=lv.key_fraction,
                      key_max_chars=lv.key_max_chars)
    cleared = {e.start: e.summary for e in p.edits}
    assert len(cleared) > 20
    for i, text in cleared.items():
        k = (i - 2) // 2
        assert f"SETTING_{k} = " in text


def test_the_meter_is_derived_from_the_transcript_alone(tmp_path: Path) -> None:
    """A restarted process (or another replica) learns the same budget from the stored session."""
    msgs = _agent("setting")
    first, s = _meter(msgs, tmp_path / "store")
    again = LookbackMeter(LevelSettings().key_fraction, LevelSettings().key_max_chars)
    again.observe(Session.open(tmp_path / "store", s.session_id))
    assert again.lookbacks == first.lookbacks
    # observed in two steps, the same as in one
    half = LookbackMeter(LevelSettings().key_fraction, LevelSettings().key_max_chars)
    s2 = Session.create(None, prefix_messages=1)
    s2.sync(msgs[:31])
    half.observe(s2)
    s2.sync(msgs)
    half.observe(s2)
    assert half.lookbacks == first.lookbacks


def test_a_lookup_agent_at_a_small_window_pays_less_with_the_meter() -> None:
    """Through the SDK and the emulator: the closed-loop task's facts are settings and signatures,
    which placeholders keep, so the learnt budget passes with no re-read for less."""
    register_strategy("cachecompact-no-lookback", CachecompactConfig(policy=PolicyConfig(
        levels=replace(LevelSettings(), lookback_miss_share=0.0))))
    # task 2: on task 1 the no-thrash rule's shorter collapses leave the meter nothing to gain
    off = run_task(make_task(2), "cachecompact-no-lookback", window=50_000)
    on = run_task(make_task(2), "cachecompact", window=50_000)
    assert off.passed and on.passed and off.rereads == on.rereads == 0
    assert on.cost_usd < 0.95 * off.cost_usd


def test_the_compactor_says_when_the_budget_changes_once_not_per_calibration() -> None:
    msgs = _agent("setting", turns=40)
    s = Session.create(None, prefix_messages=1)
    c = CacheAwareCompactor.for_session(s, cfg(24_000))
    events = []
    for k, i in enumerate(range(1, len(msgs), 2)):
        s.counter.calibration = 1.10 + 0.01 * (k % 3)  # as reported usage would move it
        events += _grow(s, c, [msgs[i:i + 2]], t0=10.0 * k)
    changes = [e for e in events if e.kind == "recent_budget"]
    assert len(changes) == 1 and changes[0].detail["divisor"] == BUDGET_STEPS[0]
    assert changes[0].detail["far_lookbacks"] >= 16 and changes[0].detail["lost"] == 0
    assert c.state()["recent_divisor"] == BUDGET_STEPS[0]
    # one look-back to an ordinary line far back: the budget grows back, and the event names
    # the counts at the smaller budget that failed
    ordinary = tool_turn(500, "read", "ok", {"path": "x.py", "note": "local_30_30"})
    back = [e for e in _grow(s, c, [ordinary], t0=1_000.0) if e.kind == "recent_budget"]
    assert len(back) == 1 and back[0].detail["divisor"] == 1 and back[0].detail["lost"] == 1
    assert back[0].detail["judged_at"] == c._limits(1000, "claude-sonnet-4-6").configured_recent // BUDGET_STEPS[0]
    assert "back to the configured" in back[0].reason
    # L3's kept tail keeps the configured budget
    s2 = Session.create(None, prefix_messages=1)
    c = CacheAwareCompactor.for_session(s2, cfg(24_000))
    _grow(s2, c, [msgs[i:i + 2] for i in range(1, len(msgs), 2)])
    lim = c._limits(1000, "claude-sonnet-4-6")
    assert lim.keep_recent == lim.configured_recent // BUDGET_STEPS[0]
    assert lim.entry_recent == lim.keep_recent  # every look-back served: new results are shortened by it too
    assert lim.big_result == max(lim.old_result, int(LevelSettings().big_result_share * lim.keep_recent))
    assert lim.collapse_keep == min(lim.configured_recent, int(LevelSettings().collapse_keep_share * 24_000))
