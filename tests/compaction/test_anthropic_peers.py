"""The Anthropic peers as their docs configure them (issue 48): clearing and threshold compaction
at their documented absolute defaults, with named sweeps and scaled extras; on-demand compaction
as the two recipes run it (in the background, keeping recent turns), with a trigger derived from
the model's prices and the session's own figures."""

from __future__ import annotations

import copy
import math
import random
from types import SimpleNamespace
from typing import Any

import anthropic
import pytest

import cachecompact
from cachecompact.base.pricing import priced
from cachecompact.compaction.catalog import get_strategy, strategy_names
from cachecompact.compaction.peers.body import AnthropicClearConfig
from cachecompact.compaction.peers.ondemand import OnDemandConfig, OnDemandStrategy
from cachecompact.tools.emulator import Emulator, ScriptedResponder
from cachecompact.tools.emulator.responders import Reply

MODEL = "claude-sonnet-4-6"


def _edit(name: str, window: int) -> dict[str, Any]:
    cfg = get_strategy(name)
    strategy = cfg.build(SimpleNamespace(window_tokens=window))  # type: ignore[arg-type]
    body = strategy.shape({"model": MODEL, "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]})
    edit: dict[str, Any] = body["context_management"]["edits"][0]
    return edit


@pytest.mark.parametrize("window", [50_000, 200_000, 1_000_000])
def test_clearing_triggers_at_its_documented_default_whatever_the_window(window: int) -> None:
    edit = _edit("anthropic-clear", window)
    assert edit["trigger"] == {"type": "input_tokens", "value": 100_000}  # clear_tool_uses_20250919's default
    assert edit["keep"] == {"type": "tool_uses", "value": 3} and "clear_at_least" not in edit  # no default
    assert _edit("anthropic-clear-atleast", window)["clear_at_least"]["value"] == 25_000
    assert _edit("anthropic-clear-50k", window)["trigger"]["value"] == 50_000
    assert _edit("anthropic-clear-200k", window)["trigger"]["value"] == 200_000
    assert _edit("anthropic-clear-scaled", window)["trigger"]["value"] == window // 2  # the old bench's extra
    scaled = AnthropicClearConfig(trigger_fraction=0.5, clear_at_least_tokens=25_000)
    body = scaled.build(SimpleNamespace(window_tokens=window)).shape({"messages": []})  # type: ignore[arg-type]
    assert body["context_management"]["edits"][0]["clear_at_least"]["value"] == round(25_000 * window / 200_000)


def test_the_sweeps_are_extras_a_default_run_leaves_out() -> None:
    extras = set(strategy_names(extras=True)) - set(strategy_names())
    assert {"anthropic-compact-50k", "anthropic-compact-100k", "anthropic-compact-300k", "anthropic-compact-500k",
            "anthropic-clear-50k", "anthropic-clear-200k", "anthropic-compact-scaled", "anthropic-clear-scaled",
            "anthropic-ondemand-scaled", "cachecompact-own-summaries", "cachecompact-api-summaries"} == extras


def _cycle_cost_per_turn(t: float, after: float, g: float, model: str, summary: int) -> float:
    """The cycle model, evaluated directly: every turn reads the context (its mean over the cycle),
    and once a cycle the swap re-writes what it keeps and the compaction request reads the context
    and writes the summary."""
    p = priced(model)
    r, w, o = p.read, p.write_5m, p.output
    turns = (t - after) / g
    return r * (after + t) / 2 + (after * (w - r) + t * r + summary * o) / turns


@pytest.mark.parametrize("seed", range(8))
def test_the_derived_trigger_is_where_a_cycle_costs_least(seed: int) -> None:
    """A family of sessions (growth, kept turns, summary size, model, window from the seed): the
    trigger lies where the cycle model's cost per turn is least, to within 1%, found by a grid
    search that shares no code with the strategy."""
    rng = random.Random(seed)
    model = rng.choice(["claude-sonnet-4-6", "claude-opus-5-5", "claude-opus-4-6", "claude-haiku-5-5"])
    window = rng.choice([200_000, 1_000_000])
    st = OnDemandStrategy(SimpleNamespace(window_tokens=window, prices=None), OnDemandConfig())  # type: ignore[arg-type]
    g = rng.randint(500, 8_000)
    st.sizes = [20_000 + g * k for k in range(12)]
    st.summary_tokens = rng.randint(800, 4_000)
    kept = rng.randint(2_000, 30_000)
    t = st.trigger(model, kept, 8_000)
    after = st.summary_tokens + kept
    limit = window - 8_000 - window // 20
    best = min(range(after + g, limit - g, 250),
               key=lambda x: _cycle_cost_per_turn(x, after, g, model, st.summary_tokens))
    if best < limit - g - 250:  # an interior optimum: the trigger is at it
        assert _cycle_cost_per_turn(t, after, g, model, st.summary_tokens) <= 1.01 * _cycle_cost_per_turn(
            best, after, g, model, st.summary_tokens)
    else:  # the window caps it
        assert t == limit - g
    # faster growth, later trigger (as sqrt(g)); the -scaled extra ignores all of it
    st.sizes = [20_000 + 4 * g * k for k in range(12)]
    assert st.trigger(model, kept, 8_000) >= t
    scaled = OnDemandStrategy(SimpleNamespace(window_tokens=window, prices=None),  # type: ignore[arg-type]
                              OnDemandConfig(trigger_fraction=0.75))
    assert scaled.trigger(model, kept, 8_000) == int(0.75 * window)
    assert math.isfinite(t)


def _reader() -> tuple[ScriptedResponder, list[dict[str, Any]]]:
    """A model that reads the next file each turn; keeps every body the emulator answered."""
    seen: list[dict[str, Any]] = []
    n = iter(range(10_000))

    def reply(body: dict[str, Any]) -> Reply:
        seen.append(copy.deepcopy(body))
        k = next(n)
        return Reply([{"type": "text", "text": f"reading part {k}"},
                      {"type": "tool_use", "id": f"toolu_{k:04d}", "name": "read", "input": {"path": f"p{k}.py"}}],
                     "tool_use")
    return ScriptedResponder(reply), seen


def test_ondemand_compacts_in_the_background_and_keeps_the_recent_turns_verbatim() -> None:
    """The recipes through wrap() and the real SDK: the compaction request covers the history as
    it stood, on the conversation's own model; the request that started it goes whole; the next
    one carries the block first and then exactly the caller's messages after the cut, verbatim."""
    responder, seen = _reader()
    with Emulator(responder) as emu:
        client = cachecompact.wrap(anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0), store=None,
                                   strategy="anthropic-ondemand", window_tokens=200_000)
        msgs: list[dict[str, Any]] = [{"role": "user", "content": "Read every part and report."}]
        sent: list[list[dict[str, Any]]] = []
        for _ in range(60):
            sent.append(copy.deepcopy(msgs))
            r = client.messages.create(model=MODEL, max_tokens=1000, messages=msgs, system="You read code.")
            msgs.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]})
            use = next(b for b in r.content if b.type == "tool_use")
            msgs.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                      "content": f"# {use.input}\n" + "x = compute(1)\n" * 900}]})
        log = [r for r in emu.requests if r.get("status") == 200]
    internal = [k for k, r in enumerate(log) if r["internal"]]
    assert internal, "no compaction in 60 turns of 6k tokens at a 200k window"
    first = internal[0]
    agent_before = sum(1 for r in log[:first] if not r["internal"])  # agent requests before the compaction call
    # the request that started it went whole; the one after carries the block first
    assert not any(isinstance(m.get("content"), list) and any(b.get("type") == "compaction" for b in m["content"])
                   for m in seen[agent_before]["messages"])
    nxt = seen[agent_before + 1]["messages"]
    assert nxt[0]["role"] == "assistant" and nxt[0]["content"][0]["type"] == "compaction"
    caller = sent[agent_before + 1]
    kept = nxt[1:]
    assert kept == caller[len(caller) - len(kept):]  # the caller's own messages after the cut, verbatim
    assert kept[0]["role"] == "assistant"  # a change of role after the summarized messages
    # the model the compaction ran on was the conversation's
    assert log[first]["model"] == MODEL
