"""The lookback meter: the recent budget shrinks only for an agent whose look-backs placeholders serve."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path
from typing import Any

from cachecompact import Session
from cachecompact.bench.tasks import make_task, run_task
from cachecompact.compactor import Compactor
from cachecompact.lookback import BUDGET_STEPS, LookbackMeter
from cachecompact.policy import LevelSettings, PolicyConfig
from cachecompact.strategies import CachecompactConfig, register

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


def _meter(msgs: list[dict[str, Any]], store: Path | None = None) -> tuple[LookbackMeter, Session]:
    s = Session.create(store, prefix_messages=1)
    s.sync(msgs)
    lv = LevelSettings()
    m = LookbackMeter(lv.key_fraction, lv.key_max_chars)
    m.observe(s)
    return m, s


def test_served_lookbacks_shrink_the_budget_and_unserved_ones_do_not() -> None:
    served, _ = _meter(_agent("setting"))
    unserved, _ = _meter(_agent("ordinary"))
    assert len(served.lookbacks) == len(unserved.lookbacks) == 34
    assert served.served_share() == 1.0 and unserved.served_share() == 0.0
    configured = 8_000  # each file is about 1k tokens: a look-back 6 files back reaches past a quarter of it
    assert served.budget(configured, 0.03) == configured // BUDGET_STEPS[0]
    assert unserved.budget(configured, 0.03) == configured
    assert served.budget(configured, 0.0) == configured  # 0 turns the meter off


def test_a_handful_of_lookbacks_proves_nothing() -> None:
    few, _ = _meter(_agent("setting", turns=20))  # 14 look-backs: Jeffreys' estimate stays above 3%
    assert len(few.lookbacks) == 14 and few.budget(8_000, 0.03) == 8_000
    more, _ = _meter(_agent("setting", turns=23))
    assert len(more.lookbacks) == 17 and more.budget(8_000, 0.03) < 8_000


def test_a_lookback_counts_only_where_the_history_was_longer_than_the_budget() -> None:
    m, _ = _meter(_agent("setting"))
    # at a budget longer than the whole session no look-back could have been lost: no evidence
    assert m.budget(10_000_000, 0.03) == 10_000_000


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


def test_results_in_the_immutable_prefix_always_serve() -> None:
    msgs = _agent("ordinary", turns=12)
    s = Session.create(None, prefix_messages=len(msgs) - 2)  # everything but the last turn is the prefix
    s.sync(msgs)
    m = LookbackMeter(0.5, 16_000)
    m.observe(s)
    assert m.lookbacks and all(served for _, served, _ in m.lookbacks)


def test_a_lookup_agent_at_a_small_window_pays_less_with_the_meter() -> None:
    """Through the SDK and the emulator: the closed-loop task's facts are settings and signatures,
    which placeholders keep, so the learnt budget passes with no re-read for less."""
    register("cachecompact-no-lookback", CachecompactConfig(policy=PolicyConfig(
        levels=replace(LevelSettings(), lookback_miss_share=0.0))))
    off = run_task(make_task(1), "cachecompact-no-lookback", window=50_000)
    on = run_task(make_task(1), "cachecompact", window=50_000)
    assert off.passed and on.passed and off.rereads == on.rereads == 0
    assert on.cost_usd < 0.9 * off.cost_usd


def test_the_compactor_says_when_the_budget_changes() -> None:
    msgs = _agent("setting", turns=40)
    s = Session.create(None, prefix_messages=1)
    c = Compactor.for_session(s, cfg(24_000))
    turns = [msgs[i:i + 2] for i in range(1, len(msgs), 2)]
    events = _grow(s, c, turns)
    changes = [e for e in events if e.kind == "recent_budget"]
    assert len(changes) == 1 and changes[0].detail["before"] is None
    assert changes[0].detail["after"] == c._configured_recent // BUDGET_STEPS[0]
    assert "100% of the agent's" in changes[0].reason
    assert c.state()["recent_budget"] == changes[0].detail["after"]
