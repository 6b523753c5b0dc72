"""What choosing the cache TTL per breakpoint saves on real Claude Code sessions, at their real times.

    python benchmarks/ttl_choice.py [PATH ...]   (default: ../shared/traces/claude-code*)

Each recorded call of a log (and of each sub-agent thread) is rebuilt as `cachecompact
forensics` rebuilds it (`replay_forensics.rebuild_calls`: the messages Claude Code sent, the
fitted system prompt and tools as one block, its breakpoint on the last message) and billed
by the emulator's cache model (`CacheSimulator`) at the recorded time, three ways:

- **5m**: every breakpoint with the 5-minute TTL (the API's default);
- **1h**: every breakpoint with the 1-hour TTL (what Claude Code 2.1 writes);
- **chosen**: per request, what `policy.choose_ttls` picks from the session's gaps so far
  (`gaps.GapMeter`: who spoke next, how long it took), priced by the call's own model.

The history and times are the recorded ones, so compaction plays no part: this isolates the
TTL. Output tokens are the same for all three and left out. A *miss* is a call that reads
less than its previous call left (beyond a 5% tolerance) with nothing changed before it: a TTL
expiry. Skips (exit 0, a message) when no log is found.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from cachecompact.base.pricing import model_prices
from cachecompact.base.tokens import TokenCounter
from cachecompact.cache.simulator import CacheSimulator, SimBlock, SimRequest
from cachecompact.compaction._gaps import GapMeter
from cachecompact.compaction.policy import choose_ttls
from cachecompact.tools._logs import RecordedSession, rebuild_calls
from cachecompact.tools.traces import discover
from cachecompact.tools.traces.claude_code_logs import load_claude_code

MODES = ("5m", "1h", "chosen")


@dataclass
class Tally:
    calls: int = 0
    dollars: float = 0.0
    misses: int = 0
    one_hour: int = 0  # requests whose conversation breakpoint was 1h


def _with_ttls(req: SimRequest, prefix: str, rest: str) -> SimRequest:
    blocks = [replace(b, ttl=(prefix if k == 0 else rest)) if b.ttl is not None else b
              for k, b in enumerate(req.blocks)]
    return replace(req, blocks=blocks)


def _called_a_tool(rs: RecordedSession, index: int) -> bool:
    c = rs.messages[index]["content"]
    return isinstance(c, list) and any(isinstance(b, dict) and b.get("type") == "tool_use" for b in c)


def run_thread(rs: RecordedSession, out: dict[str, Tally]) -> None:
    for mode in MODES:
        sim = CacheSimulator(lambda m: model_prices(m).min_cacheable)
        gaps = GapMeter()
        prev_time: float | None = None
        prev_total = 0
        prev_segment = -1
        prev_call = None
        for c in rs.calls:
            req = c.request
            head: SimBlock = req.blocks[0]
            total = sum(b.tokens for b in req.blocks)
            if prev_time is not None and prev_call is not None:
                gaps.observe(req.time - prev_time, after_tool_call=_called_a_tool(rs, prev_call.index))
            if mode == "chosen":
                warm = prev_time is not None and c.start == prev_segment
                read = min(prev_total, total) if warm else 0
                choice = choose_ttls(model_prices(req.model), p_between=gaps.between(), prefix_tokens=head.tokens,
                                     total_tokens=total, prefix_written=max(0, head.tokens - read),
                                     rest_written=max(0, total - max(read, head.tokens)))
                prefix, rest = choice.prefix, choice.rest
            else:
                prefix = rest = mode
            res = sim.process(_with_ttls(req, prefix, rest))
            price = model_prices(req.model)
            t = out[mode]
            t.calls += 1
            t.one_hour += rest == "1h"
            t.dollars += price.cost(res.usage())
            if prev_time is not None and c.start == prev_segment and \
                    res.cache_read_input_tokens < 0.95 * min(prev_total, total):
                t.misses += 1
            prev_time, prev_total, prev_segment, prev_call = req.time, total, c.start, c
    return None


def run(paths: list[Path]) -> dict[str, dict[str, Tally]]:
    counter = TokenCounter()
    sets: dict[str, dict[str, Tally]] = {}
    for p in paths:
        trace = load_claude_code(p, keep_compaction=True)
        set_name = next((d.name for d in p.parents if d.name.startswith("claude-code")), p.parent.name)
        tallies = sets.setdefault(set_name, {m: Tally() for m in MODES})
        for thread in [trace, *trace.subagents]:
            rs = rebuild_calls(thread, counter)
            if rs is not None:
                run_thread(rs, tallies)
    return sets


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="*", type=Path)
    args = ap.parse_args(argv)
    roots = args.paths or sorted((Path(__file__).resolve().parents[2] / "shared" / "traces").glob("claude-code*"))
    files = discover([r for r in roots if r.exists()])
    if not files:
        print("no Claude Code logs found; give their paths (../shared/traces is absent)")
        return 0
    sets = run(files)
    print("| set | TTL | calls | input cost | vs 5m | vs 1h | TTL misses | requests at 1h |")
    print("|---|---|---|---|---|---|---|---|")
    for name, t in sets.items():
        for m in MODES:
            print(f"| {name} | {m} | {t[m].calls} | ${t[m].dollars:.2f} | {t[m].dollars / t['5m'].dollars:.3f}x | "
                  f"{t[m].dollars / t['1h'].dollars:.3f}x | {t[m].misses} | {t[m].one_hour} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
