"""Fit the default policy's free parameters on half A of the shared traces; report half B.

    python benchmarks/fit_policy.py [--write docs/policy.md]

Most thresholds of the default policy are derived from prices and the window (docs/policy.md).
Five describe the agent rather than the window and are fitted here, on the long traces of
half A only (`cachecompact.tools.bench.run.split_halves`), at both benchmark windows, by coordinate
search in this order:

* ``keep_recent_tokens`` and ``key_max_chars``, jointly: how much of the newest tool output
  stays verbatim (how far back an agent looks, in tokens), and how many characters of an
  older result's lines its placeholder keeps (its working set and key lines). The two trade
  against each other, so a search over one at a time would stop at the first;
* ``soft``: the utilization L1 starts at, and the target after compacting;
* ``big_result_share``: which new results are shortened on entry (share of that budget);
* ``min_batch_fraction``: how much a cache-breaking edit must remove (share of the window);
* ``key_fraction``: the share of a cleared result's size its kept lines may take.

The objective is the issue's: the lowest adjusted cost (cost + re-read turns for lost
evidence) summed over both windows, among candidates whose evidence recall on half A is at
least 0.97 at 200k and 0.93 at 50k (if none qualifies, the highest recall). Half B is then
measured with the chosen values and reported next to half A. Skips when ../shared/traces is
absent.
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from typing import Any

from cachecompact.compaction.catalog import CachecompactConfig, register_strategy
from cachecompact.compaction.policy import Economics, LevelSettings, PolicyConfig, Triggers
from cachecompact.tools.bench.bench_report import LONG_TURNS, publish
from cachecompact.tools.bench.harness import TraceResult, replay
from cachecompact.tools.bench.run import load_corpus, split_halves
from cachecompact.tools.traces import Trace, default_trace_dir

WINDOWS = (200_000, 50_000)
RECALL_FLOOR = {200_000: 0.97, 50_000: 0.93}
JOINT = ("keep_recent_tokens", "key_max_chars")
GRID: dict[str | tuple[str, ...], tuple[Any, ...]] = {
    JOINT: tuple((k, c) for k in (20_000, 30_000, 35_000, 40_000, 50_000, 60_000) for c in (1_500, 16_000)),
    "soft": (0.6, 0.7, 0.8),
    "big_result_share": (0.25, 0.5, 1.0),
    "min_batch_fraction": (0.02, 0.04, 0.08),
    "key_fraction": (0.25, 0.5),
}


def _policy(params: dict[str, Any]) -> PolicyConfig:
    lv = replace(LevelSettings(), keep_recent_tokens=params["keep_recent_tokens"],
                 big_result_share=params["big_result_share"],
                 key_max_chars=params["key_max_chars"], key_fraction=params["key_fraction"])
    return PolicyConfig(levels=lv, triggers=Triggers(soft=params["soft"]),
                        economics=replace(Economics(), min_batch_fraction=params["min_batch_fraction"]))


def _run(args: tuple[Trace, dict[str, Any], int]) -> tuple[str, int, TraceResult]:
    trace, params, window = args
    if not params:
        return "none", window, replay(trace, "none", window=window)
    name = "fit-" + "-".join(str(v) for v in params.values())
    register_strategy(name, CachecompactConfig(policy=_policy(params)))  # in the worker process that runs it
    return name, window, replay(trace, name, window=window)


def _measure(pool: ProcessPoolExecutor, traces: list[Trace], params: dict[str, Any],
             none_cost: dict[tuple[str, int], float]) -> dict[int, tuple[float, float, float, int]]:
    """Per window: (adjusted cost $, adjusted cost vs none over the traces none completes,
    evidence recall, failed traces) over ``traces``."""
    out: dict[int, tuple[float, float, float, int]] = {}
    res = list(pool.map(_run, [(t, params, w) for w in WINDOWS for t in traces]))
    for w in WINDOWS:
        rs = [r for _, win, r in res if win == w and r.completed]
        failed = sum(1 for _, win, r in res if win == w and not r.completed)
        common = [r for r in rs if (r.trace, w) in none_cost]
        base = sum(none_cost[(r.trace, w)] for r in common)
        refs = sum(r.references for r in rs)
        out[w] = (sum(r.adjusted_cost_usd for r in rs),
                  sum(r.adjusted_cost_usd for r in common) / base if base else float("nan"),
                  sum(r.evidence_recall * r.references for r in rs) / refs if refs else 1.0, failed)
    return out


def _score(m: dict[int, tuple[float, float, float, int]]) -> tuple[int, float]:
    """Feasible (recall floors met, nothing failed) first, then the lowest adjusted cost in dollars."""
    ok = all(m[w][2] >= RECALL_FLOOR[w] and m[w][3] == 0 for w in WINDOWS)
    return (0 if ok else 1, sum(m[w][0] for w in WINDOWS) if ok else -sum(m[w][2] for w in WINDOWS))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--write", help="update the fitted-parameters section of this markdown file")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    if default_trace_dir() is None:
        print("no shared traces (../shared/traces); nothing to fit")
        return 0
    t0 = time.perf_counter()
    traces, _, _ = load_corpus([])
    halves = split_halves(traces)
    long_ = [t for t in traces if t.turns >= LONG_TURNS]
    a = [t for t in long_ if halves[t.name] == "A"]
    b = [t for t in long_ if halves[t.name] == "B"]
    defaults = {"keep_recent_tokens": LevelSettings().keep_recent_tokens, "soft": Triggers().soft,
                "big_result_share": LevelSettings().big_result_share,
                "min_batch_fraction": Economics().min_batch_fraction,
                "key_max_chars": LevelSettings().key_max_chars, "key_fraction": LevelSettings().key_fraction}
    lines = [f"Half A: {len(a)} long traces, half B: {len(b)} (split by repository, see `split_halves`).", "",
             "| step | parameter | value | A @200k: adjusted $ (vs none) | evidence | A @50k: adjusted $ | evidence "
             "| failed |", "|---|---|---|---|---|---|---|---|"]
    with ProcessPoolExecutor(args.workers) as pool:
        none_cost = {(r.trace, w): r.cost_usd for _, w, r in pool.map(_run, [(t, {}, w) for w in WINDOWS
                                                                            for t in long_]) if r.completed}
        best = dict(defaults)
        for step, (param, values) in enumerate(GRID.items(), 1):
            names = param if isinstance(param, tuple) else (param,)
            scored = []
            for v in values:
                vals = v if isinstance(param, tuple) else (v,)
                cand = {**best, **dict(zip(names, vals, strict=True))}
                m = _measure(pool, a, cand, none_cost)
                scored.append((_score(m), vals, m))
                lines.append(f"| {step} | {', '.join(f'`{x}`' for x in names)} | {', '.join(map(str, vals))} | "
                             f"${m[200_000][0]:.2f} ({m[200_000][1]:.3f}x) | "
                             f"{m[200_000][2]:.3f} | ${m[50_000][0]:.2f} | {m[50_000][2]:.3f} | "
                             f"{m[200_000][3] + m[50_000][3]} |")
                print(lines[-1], flush=True)
            best.update(zip(names, min(scored, key=lambda x: x[0])[1], strict=True))
        held = _measure(pool, b, best, none_cost)
        fit = _measure(pool, a, best, none_cost)
    lines += ["", "Chosen: " + ", ".join(f"`{k}` = {v}" for k, v in best.items()) + ".", "",
              "| half | @200k: adjusted cost vs none | evidence recall | @50k: adjusted $ | evidence recall | failed |",
              "|---|---|---|---|---|---|",
              f"| A (fit) | {fit[200_000][1]:.3f}x | {fit[200_000][2]:.3f} | ${fit[50_000][0]:.2f} | "
              f"{fit[50_000][2]:.3f} | {fit[200_000][3] + fit[50_000][3]} |",
              f"| B (held out) | {held[200_000][1]:.3f}x | {held[200_000][2]:.3f} | ${held[50_000][0]:.2f} | "
              f"{held[50_000][2]:.3f} | {held[200_000][3] + held[50_000][3]} |",
              "", f"({time.perf_counter() - t0:.0f} s.)"]
    text = "\n".join(lines)
    return publish(text, args.write, "fit")


if __name__ == "__main__":
    sys.exit(main())
