"""A new user's async streaming agent at a 60k window with 2.5-10k-token results, 80 turns
(benchmarks/async_agent.py), under cachecompact and every peer, through `wrap()` and the real
SDK against the emulator: cachecompact must cost the least and must not thrash."""

from __future__ import annotations

import itertools
from types import ModuleType
from typing import Any

import pytest

from cachecompact.compaction.catalog import strategy_names

from ..conftest import load_benchmark

pytestmark = pytest.mark.slow  # every strategy through an 80-turn scenario


@pytest.fixture(scope="module")
def agent() -> ModuleType:
    return load_benchmark("async_agent")


def test_the_60k_async_agent_costs_less_than_every_peer_without_thrashing(agent: ModuleType) -> None:
    ours = agent.run("cachecompact")
    assert ours.failure is None and ours.turns == 80
    # re-writes of what was cached: 0.62 of the cost before the no-thrash rule (L4 on 41 of 80
    # turns); 0.22 while files over 8.2k were shortened on arrival (issue 47 shows them whole);
    # 0.81 with the configured budget as the floor of a no-thrash cut; measured 0.35 with the
    # agent's look-backs as the floor and the least-thrashing plan when the window forces one
    assert ours.rewrite_share <= 0.40, ours
    # the issue asked 0.85; no schedule that shows every file whole reaches it at this window
    # (docs/benchmarks.md, "The 60k async agent", derives the bound); measured 0.734
    assert ours.hit_rate >= 0.70, ours
    finished = 0
    for name in strategy_names():
        if name.startswith("cachecompact"):
            continue
        peer = agent.run(name)
        if peer.failure is not None:  # it cannot hold the window: the agent stops at turn ~9
            assert peer.turns < 80
            continue
        finished += 1
        assert ours.cost_usd < peer.cost_usd, (name, peer, ours)
    # seed-pipeline, anthropic-ondemand and claude-code; both anthropic-clear editions trigger at the
    # documented 100k and so never fire at this 60k window (issue 48), and anthropic-compact (150k)
    # neither: they fail at turn 9 and are counted above
    assert finished >= 3


def test_a_compaction_never_summarises_the_result_the_agent_has_not_seen(agent: ModuleType) -> None:
    """However hard the no-thrash rule cuts what a summary keeps, the newest round stays: its
    result is what the agent asked for and has not been shown yet. With the first files in a
    larger immutable prefix the rule used to keep no round at all, and the agent never saw
    the file it had just read."""
    import asyncio

    import anthropic

    from cachecompact import wrap
    from cachecompact.tools.emulator import Emulator, ScriptedResponder, SummarizingResponder

    model, lasts = agent.scripted_model(), []

    def seen(body: dict[str, Any]) -> Any:
        lasts.append(body["messages"][-1])
        return model.respond(body)

    with Emulator(SummarizingResponder(ScriptedResponder(seen)), context_window=60_000) as emu:

        async def run() -> None:
            async with wrap(anthropic.AsyncAnthropic(base_url=emu.url, api_key="t", max_retries=0), store=None,
                            window_tokens=60_000, prefix_messages=7) as client:
                await agent._loop(client, 40)

        asyncio.run(run())
        sizes = [r["total_input_tokens"] for r in emu.requests if r.get("status") == 200 and not r.get("internal")]
    assert len(lasts) == len(sizes) == 40
    assert any(b < a for a, b in itertools.pairwise(sizes))  # it did compact
    for k, last in enumerate(lasts[1:], 1):  # every request ends with the result of the call just made
        assert any(b.get("type") == "tool_result" for b in last["content"] if isinstance(b, dict)), k


def test_misses_of_the_apis_own_context_editing_are_told_apart(agent: ModuleType,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """Anthropic's server-side clearing changes what the server caches without changing the body:
    forensics called each such miss `provider_suspected` (47 warnings in this run) until the
    request's `context_management` edits were taken into account."""
    import logging

    with caplog.at_level(logging.INFO, "cachecompact"):
        # the trigger scaled to this 60k window (30k): at the documented 100k it never fires here
        r = agent.run("anthropic-clear-scaled")
    assert r.failure is None
    assert "provider_suspected" not in caplog.text
    assert caplog.text.count("server_edit: the request asks the API to edit its context") >= 10
    assert not [x for x in caplog.records if "server_edit" in x.getMessage() and x.levelno > logging.INFO]
