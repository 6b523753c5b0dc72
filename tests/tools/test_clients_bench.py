"""benchmarks/clients.py, issue 62's measure, on one drawn scenario: Claude Code at its defaults
through compact mode at 80k, where the window forces cuts, completes with every prompt answered
as its own, and no L5 drop stands where a summary would fit (each L5 event names why none could)."""

from __future__ import annotations

import pytest

from ..conftest import load_benchmark

pytestmark = pytest.mark.integration  # Node and the Claude Code CLI


def test_claude_code_through_compact_mode_drops_no_round_a_summary_could_hold() -> None:
    bench = load_benchmark("clients")
    if not bench.BIN["claude-code"].exists():
        pytest.skip(f"the Claude Code CLI is not installed at {bench.BIN['claude-code']} (.ci/run installs it)")
    sc = bench.Scenario.draw(6, "claude-code")  # 5 prompts of 2 calls of 1,000 lines, a pasted first prompt
    r = bench.converse("claude-code", sc, 80_000, "compact", think=0)
    assert r.completed and r.right == sc.prompts, r
    assert r.levels.get("L4", 0) > 0, r  # the window forced cuts, and summaries made them
    assert not set(r.l5_why) - bench.NO_ROOM, r  # every L5 says why no summary could stand in
    assert r.refused == 0 and r.streaming_failures == 0, r
