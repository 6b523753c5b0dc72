"""Triggers, cache economics, the compactor's choices, safety, and full trace replays."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import anthropic
import pytest

from cachecompact import Session
from cachecompact.compactor import Compactor
from cachecompact.emulator import Emulator
from cachecompact.events import Event
from cachecompact.policy import ContextFullError, PolicyConfig, PolicyConfigError, economics, evaluate
from cachecompact.presets import SeedPipeline, preset
from cachecompact.pricing import get_model
from cachecompact.quality import compaction_regression_suite
from cachecompact.summarize import LLMSummarizer, SummaryRejected, SummaryRequest, SummaryResult
from cachecompact.traces import discover, load_trace, synthetic_trace
from cachecompact.validate import validate_request

from .test_levels import GOAL, tool_turn

MODEL = "claude-sonnet-4-6"


@pytest.mark.parametrize("kw", [
    {"soft": 0.9, "hard": 0.8}, {"soft": -0.1}, {"critical": 1.5}, {"window_tokens": 100, "margin_tokens": 200},
    {"keep_recent_results": -1}, {"failure_limit": 0}, {"full_after": 0.5}, {"min_remaining_turns": 60},
    {"tool_share": 0}, {"cache_ttl_s": 0},
])
def test_absurd_thresholds_are_refused(kw: dict[str, Any]) -> None:
    with pytest.raises(PolicyConfigError, match="invalid PolicyConfig"):
        PolicyConfig(**kw)


def test_trigger_table() -> None:
    c = PolicyConfig()  # limit 180k
    def ev(tokens: int, since: int = 0, steps: int = 20, share: float = 0.0, user: bool = False) -> Any:
        return evaluate(c, tokens=tokens, steps_since=since, steps=steps, tool_share=share, new_user_message=user)
    assert ev(100_000).max_level is None
    assert ev(130_000, since=4).max_level is None
    assert ev(130_000, since=5).max_level == "L1"
    assert ev(130_000, since=0, user=True).max_level == "L1"
    assert ev(160_000).max_level == "L3" and not ev(160_000).forced
    assert ev(172_000).max_level == "L4" and ev(172_000).forced
    assert ev(70_000, share=0.65, steps=8).max_level == "L2"
    assert ev(70_000, share=0.65, steps=7).max_level is None
    assert evaluate(c, tokens=150_000, steps_since=0, steps=1, tool_share=0, new_user_message=False,
                    max_tokens=60_000).forced  # the next request would not fit the window


def test_economics_pays_only_when_the_saving_beats_the_rewrite() -> None:
    c, price = PolicyConfig(), get_model(MODEL)
    deep = economics(c, price, removed=40_000, suffix=130_000, steps=60, cold=False)
    shallow = economics(c, price, removed=40_000, suffix=130_000, steps=6, cold=False)
    assert deep.pays and not shallow.pays
    assert shallow.rewrite_cost == pytest.approx((90_000 * 3.75 - 130_000 * 0.30) / 1e6)
    cold = economics(c, price, removed=40_000, suffix=130_000, steps=6, cold=True)
    assert cold.rewrite_cost == 0 and cold.pays


def _grow(s: Session, c: Compactor, turns: list[list[dict[str, Any]]], t0: float = 0.0, gap: float = 10.0,
          max_tokens: int = 1000) -> list[Event]:
    events: list[Event] = []
    msgs = s.messages() or [{"role": "user", "content": GOAL}]
    now = t0
    for t in turns:
        msgs = msgs + t
        s.sync(msgs)
        now += gap
        events += c.before_request(now, MODEL, max_tokens).events
        validate_request(s.render(model=MODEL, max_tokens=max_tokens).body)
        c.after_response(now)
    return events


def test_l2_on_entry_and_cheapest_level_and_prefix_untouched(tmp_path: Path) -> None:
    s = Session.create(tmp_path / "s", prefix_messages=3)
    c = Compactor(s, PolicyConfig(window_tokens=40_000, margin_tokens=4_000, min_batch_tokens=0))
    turns = [tool_turn(k, "read_file", f"line {k} " * 400) for k in range(30)]
    turns.insert(5, tool_turn(99, "bash", "x " * 40_000, {"command": "cat big.log"}))
    events = _grow(s, c, turns)
    kinds = [(e.kind, e.level) for e in events]
    assert ("externalized", "L2") in kinds
    assert ("compaction", "L1") in kinds  # the cheapest level that suffices
    assert all(e.start >= s.prefix_end for e in s.ledger.entries)  # type: ignore[operator]
    assert max(s.counter.calibrated(s.render().raw_tokens) for _ in [0]) <= c.cfg.limit
    assert Session.open(tmp_path / "s").prefix_hash == s.prefix_hash


def test_economics_defers_then_cold_cache_applies_it() -> None:
    s = Session.create(None, prefix_messages=1)
    # removes little relative to the suffix, early in the session: not worth a warm re-write
    c = Compactor(s, PolicyConfig(window_tokens=30_000, margin_tokens=2_000, min_batch_tokens=0,
                                  max_remaining_turns=5, min_steps_l1=1))
    turns = [tool_turn(k, "read_file", f"w{k} " * 1500) for k in range(8)]
    events = _grow(s, c, turns[:7], gap=5)
    assert any(e.kind == "deferred" for e in events)
    n = len(s.ledger)
    events = _grow(s, c, turns[7:], t0=1000.0, gap=400)  # idle longer than the TTL: cold
    assert any(e.kind == "compaction" for e in events) and len(s.ledger) > n


class Boom:
    def summarize(self, req: SummaryRequest) -> SummaryResult:
        raise SummaryRejected("garbage", cost_usd=0.01)


def test_circuit_breaker_after_three_failures_and_context_full() -> None:
    s = Session.create(None, prefix_messages=1)
    c = Compactor(s, PolicyConfig(window_tokens=30_000, margin_tokens=2_000, keep_recent_results=50,
                                  min_batch_tokens=0, cache_aware=False), summarizer=Boom())
    turns = [tool_turn(k, "write_file", f"w{k} " * 300) for k in range(60)]  # writes: L1 cannot help
    seen: list[Event] = []
    c.events.subscribe(seen.append)
    with pytest.raises(ContextFullError, match="start a new session"):
        _grow(s, c, turns)
    kinds = [e.kind for e in seen]
    assert kinds.count("failure") >= 3 and "breaker_open" in kinds and c.tripped
    assert "context_full" in kinds
    assert all(e.cost_usd == 0.01 for e in seen if e.kind == "failure" and e.level in ("L3", "L4"))


def test_no_reduction_counts_as_failure() -> None:
    s = Session.create(None, prefix_messages=1)
    c = Compactor(s, PolicyConfig(window_tokens=30_000, margin_tokens=2_000))
    c._fail("L1", "no reduction", 100, 0.0, __import__("cachecompact.compactor").compactor.TurnReport(0, 0))
    assert c.failures == 1 and not c.tripped


def test_repeated_tool_calls_are_flagged() -> None:
    s = Session.create(None, prefix_messages=1)
    c = Compactor(s)
    same = {"command": "pytest -x"}
    turns = [tool_turn(k, "bash", "FAILED", same) for k in range(5)]
    events = _grow(s, c, turns, gap=5)
    assert c.repeats >= 3 and any(e.kind == "repeated_tool_calls" for e in events)


def test_reactive_fits_the_request_or_says_it_cannot() -> None:
    s = Session.create(None, prefix_messages=1)
    c = Compactor(s, PolicyConfig(window_tokens=200_000, margin_tokens=20_000))
    msgs: list[dict[str, Any]] = [{"role": "user", "content": GOAL}]
    for k in range(40):
        msgs += tool_turn(k, "read_file", f"v{k} " * 700)
    s.sync(msgs)
    est = s.counter.calibrated(s.render().raw_tokens)
    assert c.reactive(est, limit=est // 2, now=0.0, model=MODEL, max_tokens=1000)
    assert s.counter.calibrated(s.render().raw_tokens) <= (est // 2 - 1000) * 0.95
    validate_request(s.render(model=MODEL, max_tokens=10).body)
    tiny = Session.create(None, prefix_messages=1)
    tiny.sync([{"role": "user", "content": GOAL * 200}])
    assert not Compactor(tiny).reactive(10_000, limit=100, now=0.0, model=MODEL)


def test_seed_pipeline_preset_runs_every_layer() -> None:
    s = Session.create(None, prefix_messages=3)
    sp = preset("seed-pipeline", s, limit_tokens=40_000)
    assert isinstance(sp, SeedPipeline)
    turns = [tool_turn(k, "read_file", f"line {k} " * 300) for k in range(40)]
    turns.insert(3, [{"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_big", "name": "bash",
                                                         "input": {"command": "cat"}}]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_big",
                                                   "content": "y" * 210_000}]}])
    msgs: list[dict[str, Any]] = [{"role": "user", "content": GOAL}]
    for k, t in enumerate(turns):
        msgs += t
        s.sync(msgs)
        sp.before_request(float(k), MODEL, 1000)
        validate_request(s.render(model=MODEL, max_tokens=10).body)
    reasons = {e.reason.split(":")[0] for e in s.ledger.entries}
    assert {"snip_compact", "micro_compact"} <= reasons
    assert any(e.level == "L2" for e in s.ledger.entries)
    with pytest.raises(ValueError):
        preset("nope", s)


def test_regression_suite_alerts_past_five_points() -> None:
    async def agent(task: int, compact: bool) -> dict[str, bool]:
        return {"success": not (compact and task % 10 == 0)}

    rep = asyncio.run(compaction_regression_suite(agent, list(range(20))))
    assert rep.delta == pytest.approx(-0.10) and rep.alert and rep.failures_only_with_compaction == [0, 10]

    def fine(task: int, compact: bool) -> bool:
        return True

    assert not asyncio.run(compaction_regression_suite(fine, [1, 2])).alert


def _replay_under_default(trace: Any, client: anthropic.Anthropic, cfg: PolicyConfig) -> Compactor:
    s = Session.create(None, system=trace.system, tools=trace.tools)
    c = Compactor(s, cfg, summarizer=LLMSummarizer(client))
    msgs, i = trace.messages, 1
    hist = [msgs[0]]
    prefix_hash = None
    while i < len(msgs):
        now = trace.timestamps[i - 1] or float(i)
        s.sync(hist)
        c.before_request(now, MODEL, 4096)
        r = s.render(model=MODEL, max_tokens=4096)
        validate_request(r.body)
        assert r.tokens + 4096 <= cfg.window_tokens, f"{trace.name}: {r.tokens} tokens"
        prefix_hash = prefix_hash or r.prefix_hash
        assert r.prefix_hash in (None, prefix_hash)
        assert all(e.start >= (s.prefix_end or 0) for e in s.ledger.entries)
        c.after_response(now)
        hist.append(msgs[i])
        i += 1
        if i < len(msgs):
            hist.append(msgs[i])
            i += 1
    return c


@pytest.mark.parametrize("window", [200_000, 60_000])
def test_every_shared_trace_replays_under_the_default_policy(shared_traces: Path, window: int) -> None:
    """Never over the window, never an invalid request, never an edit of the immutable prefix;
    the emulator's offline summarizer stands in for the LLM (through the real SDK)."""
    cfg = PolicyConfig() if window == 200_000 else PolicyConfig(window_tokens=window, margin_tokens=6_000)
    levels: set[str] = set()
    with Emulator() as emu:
        client = anthropic.Anthropic(base_url=emu.url, api_key="test", max_retries=0)
        for f in discover([shared_traces]):
            c = _replay_under_default(load_trace(f), client, cfg)
            levels |= {e.level for e in c.events.history if e.kind in ("compaction", "externalized") and e.level}
    if window == 60_000:
        assert {"L1", "L2"} <= levels and levels & {"L3", "L4"}


def test_synthetic_replay_under_a_small_window() -> None:
    with Emulator() as emu:
        client = anthropic.Anthropic(base_url=emu.url, api_key="test", max_retries=0)
        c = _replay_under_default(synthetic_trace(5), client, PolicyConfig(window_tokens=50_000, margin_tokens=5_000))
    assert any(e.kind == "compaction" for e in c.events.history)


def test_resume_recounts_steps_and_last_compaction(tmp_path: Path) -> None:
    s = Session.create(tmp_path / "s", prefix_messages=1)
    c = Compactor(s, PolicyConfig(window_tokens=30_000, margin_tokens=2_000, cache_aware=False))
    _grow(s, c, [tool_turn(k, "read_file", f"w{k} " * 1500) for k in range(8)])
    assert len(s.ledger) > 0 and 0 < c.last_compact_step <= c.steps
    again = Compactor(Session.open(tmp_path / "s"))
    again.resume()
    assert again.steps == c.steps == 8
    assert again.last_compact_step == c.last_compact_step
