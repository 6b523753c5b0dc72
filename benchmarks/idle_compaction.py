"""Idle compaction on real Claude Code sessions, replayed at their recorded times (issue 40).

    python benchmarks/idle_compaction.py [--results results.json] [--workers 2] [PATH ...]
        (default: the Claude Code sets of ../shared/traces)

Replays each session through the emulator under five options and prints one table per set:

- **none**: no compaction, 5-minute cache;
- **Claude Code's way** at the TTL the session's log wrote with (`whatif.recorded_ttl`), and the
  same **with its idle compaction** (2.1.286+: about 55 minutes after a reply that called no
  tool, at 200k tokens or more, the whole context summarized; ``claude-code+idle``);
- **cachecompact**, and **cachecompact with its priced idle compaction** (``cachecompact+idle``,
  docs/policy.md, *While the session is quiet*).

Columns: the replay's bill; its ratio to Claude Code's way with its idle compaction; adjusted
cost (plus one re-read turn per lost result); evidence recall; how many idle compactions ran;
and the dollars spent on requests that follow a gap of more than 5 minutes, the requests a TTL
expiry can hit ("after a gap"), whose difference from Claude Code's way is the TTL-expiry
dollars an option avoids. ``--results`` reads a `cachecompact bench` results.json made with the
strategies below instead of replaying. Skips (exit 0, a message) when no session is found.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cachecompact.tools._whatif import recorded_ttl
from cachecompact.tools.bench.run import OWN_WINDOW, run_bench
from cachecompact.tools.traces import default_trace_dir, discover, load_trace

STRATEGIES = ("none", "claude-code", "claude-code@5m", "claude-code+idle", "claude-code@5m+idle", "cachecompact",
              "cachecompact+idle")
ROWS = ("none", "Claude Code's way", "Claude Code's way + its idle compaction", "cachecompact", "cachecompact + idle")
GAP_S = 300.0  # a request after a longer gap can meet an expired 5-minute cache


@dataclass
class Row:
    cost: float = 0.0
    adjusted: float = 0.0
    refs: int = 0
    seen: float = 0.0
    fired: int = 0
    after_gap: float = 0.0


def _set_of(name: str) -> str:
    return name.split("/")[0] if name.startswith("claude-code-2026") else "claude-code (2025)"


def _after_gaps(r: dict[str, Any], times: list[float | None]) -> float:
    """Dollars of the replay's agent requests that follow a recorded gap of more than `GAP_S`
    (request k was sent at the trace's time 2k)."""
    series = r["cost_series"]
    per = [series[0], *(b - a for a, b in itertools.pairwise(series))] if series else []
    out = 0.0
    for k in range(1, len(per)):
        t0 = times[2 * k - 2] if 2 * k - 2 < len(times) else None
        t1 = times[2 * k] if 2 * k < len(times) else None
        if t0 is not None and t1 is not None and t1 - t0 > GAP_S:
            out += per[k]
    return out


def tables(results: list[dict[str, Any]], traces: dict[str, Any]) -> str:
    by: dict[str, dict[str, dict[str, Any]]] = {}
    for r in results:
        by.setdefault(r["trace"], {})[r["strategy"]] = r
    sets: dict[str, dict[str, Row]] = {}
    left: list[str] = []
    for name, runs in sorted(by.items()):
        t = traces.get(name)
        if t is None:
            continue
        way = "claude-code" if recorded_ttl(t) == "1h" else "claude-code@5m"
        chosen = dict(zip(ROWS, (runs.get("none"), runs.get(way), runs.get(f"{way}+idle"), runs.get("cachecompact"),
                                 runs.get("cachecompact+idle")), strict=True))
        if not all(c is not None and c["completed"] for c in chosen.values()):
            left.append(name)
            continue
        rows = sets.setdefault(_set_of(name), {k: Row() for k in ROWS})
        for k, run in chosen.items():
            assert run is not None
            x = rows[k]
            x.cost += run["cost_usd"]
            x.adjusted += run["adjusted_cost_usd"]
            x.refs += run["references"]
            x.seen += run["evidence_recall"] * run["references"]
            x.fired += int(run.get("idle_fired") or 0)
            x.after_gap += _after_gaps(run, t.timestamps)
    out = []
    for st, rows in sets.items():
        n = sum(1 for name in by if _set_of(name) == st and name not in left and name in traces)
        base = rows[ROWS[2]]
        out.append(f"{st}: {n} sessions")
        out.append(f"{'option':40} {'cost':>9} {'x CC+idle':>9} {'adjusted':>9} {'recall':>6} {'idle runs':>9} "
                   f"{'after a gap':>11}")
        for k in ROWS:
            x = rows[k]
            out.append(f"{k:40} {x.cost:9.2f} {x.cost / base.cost:9.3f} {x.adjusted:9.2f} "
                       f"{x.seen / max(1, x.refs):6.3f} {x.fired:9d} {x.after_gap:11.2f}")
        out.append("")
    if left:
        out.append("left out (an option did not finish): " + ", ".join(left))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="*")
    ap.add_argument("--results", help="a `cachecompact bench` results.json with the strategies above")
    ap.add_argument("--workers", type=int, default=None)
    args = ap.parse_args(argv)
    root = default_trace_dir()
    paths = [Path(p) for p in args.paths] or ([p for p in sorted(root.glob("claude-code*")) if p.is_dir()]
                                               if root is not None else [])
    files = discover(list(paths))
    if not files:
        print("no Claude Code session found (../shared/traces is absent): nothing to replay")
        return 0
    traces = {}
    for f in files:
        try:
            t = load_trace(f)
        except Exception as err:  # a file the bench skips too
            print(f"skipped {f}: {err}", file=sys.stderr)
            continue
        traces[t.name] = t
    if args.results:
        results: list[dict[str, Any]] = json.loads(Path(args.results).read_text())["results"]
    else:
        res = run_bench(paths=[str(p) for p in paths], strategies=list(STRATEGIES), model=None,
                        windows=[OWN_WINDOW], workers=args.workers, tasks=False, full=True, oracle_runs=False)
        results = [r.to_dict() for r in res.results]
    print(tables(results, traces))
    return 0


if __name__ == "__main__":
    sys.exit(main())
