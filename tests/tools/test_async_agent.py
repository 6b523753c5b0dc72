"""A new user's async streaming agent at a 60k window with 2.5-10k-token results, 80 turns
(benchmarks/async_agent.py), under cachecompact and every peer, through `wrap()` and the real
SDK against the emulator: cachecompact must cost the least and must not thrash."""

from __future__ import annotations

from types import ModuleType

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
    # re-writes of what was cached are at most a quarter of the cost (they were 0.62 before the
    # no-thrash rule, L4 on 41 of 80 turns); measured 0.22
    assert ours.rewrite_share <= 0.25, ours
    # the issue asks 0.85; measured 0.80. With each turn's new output (4.5k) written and every
    # compaction re-writing what it keeps, no schedule exceeds 0.839 at this window, even
    # keeping nothing (docs/benchmarks.md, "The 60k async agent", derives the bound)
    assert ours.hit_rate >= 0.78, ours
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
    assert finished >= 4  # seed-pipeline, both anthropic-clear editions, claude-code
