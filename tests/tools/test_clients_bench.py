"""benchmarks/clients.py, issue 62's measure, on drawn scenarios: Claude Code at its defaults
through compact mode at 80k, where the window forces cuts, completes with every prompt answered
as its own, and no L5 drop stands where a summary would fit (each L5 event names why none could);
at 200k, in long tool loops, it costs what it does direct."""

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


def test_claude_code_at_200k_costs_what_it_does_direct() -> None:
    """Issue 62: planned for Claude Code's 128,000 reserve at a 200k window, compact mode kept the
    input under ~62k and compacted every few calls of a long tool loop (1.5x direct over six drawn
    scenarios, up to 1.9x), while Claude Code direct lowers max_tokens on the API's 400 and lets
    the context grow. Known by its User-Agent to lower it, it is planned for a quarter of the
    window, and costs what it does direct."""
    bench = load_benchmark("clients")
    if not bench.BIN["claude-code"].exists():
        pytest.skip(f"the Claude Code CLI is not installed at {bench.BIN['claude-code']} (.ci/run installs it)")
    sc = bench.Scenario.draw(0, "claude-code", heavy=True)  # 3 prompts of 16 calls of 1,000 lines
    direct = bench.converse("claude-code", sc, 200_000, "direct", think=0)
    compact = bench.converse("claude-code", sc, 200_000, "compact", think=0)
    assert direct.completed and compact.completed and compact.right == direct.right == sc.prompts, (direct, compact)
    assert compact.usd <= 1.1 * direct.usd, (direct, compact)  # 1.79x before
    assert compact.levels.get("L1", 0) < 5, compact  # it no longer clears old output every call or two
