"""Which rules of the default policy pay for themselves (issue 63: fold the special cases into one
model, or delete those a measurement shows add nothing).

Each variant is the default policy with one setting changed, e.g. ``levels.working_set_chars=0``
(no verbatim working set in summaries, nothing given back). Every variant runs beside the default
in the same run, on:

* the retention grid's **fit** half (`retention_grid.py`: closed-loop agents through ``wrap()``;
  re-reads, compactions, cost with the summary calls), the half rules are chosen on; and
* the closed-loop bench's default sample of real sessions (`cachecompact bench`: cost, evidence
  recall, re-runs, loops), at the windows given.

A rule whose variant is no dearer and re-reads no more on both is a candidate for deletion; the
held half (`retention_grid.py --half held`) then reports what the deletion did.

    python benchmarks/ablate.py [--variant NAME=SECTION.FIELD=VALUE ...] [--grid-window 40000 ...]
                                [--bench-window own 200000 50000] [--no-grid] [--no-bench] [--json FILE]
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import retention_grid as grid  # noqa: E402

from cachecompact.compaction.catalog import get_strategy, register_strategy, with_policy  # noqa: E402
from cachecompact.compaction.policy import PolicyConfig  # noqa: E402
from cachecompact.tools.bench.run import OWN_WINDOW, run_bench  # noqa: E402

# the rules issue 63 names as special cases, each switched off by one setting
DEFAULT_VARIANTS = {
    "no-working-set": "levels.working_set_chars=0",
    "no-miss-rate": "levels.miss_rate=0.0",
    "no-mark": "economics.mark_compacted=False",
    "no-batch": "economics.min_batch_fraction=0.0",
}


def variant_policy(spec: str, base: PolicyConfig) -> PolicyConfig:
    """``base`` with ``SECTION.FIELD=VALUE`` applied (a literal: ``0``, ``1.0``, ``False``)."""
    path, _, raw = spec.partition("=")
    section, _, name = path.partition(".")
    if not raw or not name or not hasattr(base, section) or not hasattr(getattr(base, section), name):
        raise SystemExit(f"--variant: {spec!r} is not SECTION.FIELD=VALUE of PolicyConfig (e.g. "
                         "levels.working_set_chars=0)")
    part = getattr(base, section)
    return replace(base, **{section: replace(part, **{name: ast.literal_eval(raw)})})


def run_grid(policies: dict[str, PolicyConfig | None], windows: list[int], half: str = "fit") -> list[dict[str, Any]]:
    """Each policy on one half of the grid (the fit half chooses; the held half reports what a
    deletion chosen there did) at ``windows`` (all when empty), cell by cell."""
    todo = [c for c in grid.cells() if c.half == half and (not windows or c.window in windows)]
    rows = []
    for i, cell in enumerate(todo):
        for name, pol in policies.items():
            grid.POLICY = pol
            r = grid.run(cell, "ours")
            rows.append({**asdict(r), "variant": name, "cell": asdict(r.cell), "fits": r.cell.fits})
            print(f"[grid {i + 1}/{len(todo)}] {cell.window // 1000}k N={cell.lookback} size={cell.size} {name}: "
                  f"re-reads {r.rereads}/{r.uses} ${r.cost:.2f} compactions {r.compactions}", file=sys.stderr,
                  flush=True)
    grid.POLICY = None
    return rows


def run_real(policies: dict[str, PolicyConfig | None], windows: list[int]) -> list[dict[str, Any]]:
    """Each policy as a strategy on the bench's default sample, closed loop (the pool forks, so
    the strategies registered here reach its workers)."""
    names = []
    for name, pol in policies.items():
        strategy = "cachecompact" if pol is None else f"ablate-{name}"
        if pol is not None:
            register_strategy(strategy, with_policy(get_strategy("cachecompact"), pol))
        names.append(strategy)
    res = run_bench(strategies=names, windows=windows, tasks=False, full=False, oracle_runs=False,
                    progress_label="ablate bench")
    return [{**asdict(r), "variant": r.strategy.removeprefix("ablate-") if r.strategy != "cachecompact" else "default"}
            for r in res.results]


def summarize(grid_rows: list[dict[str, Any]], bench_rows: list[dict[str, Any]], order: list[str]) -> str:
    out = []
    if grid_rows:
        out += ["| variant | grid re-reads (cells that fit) | re-reads (all) | cost | cost / default | compactions |",
                "|---|---|---|---|---|---|"]
        base = sum(r["cost"] for r in grid_rows if r["variant"] == "default") or 1.0
        for v in order:
            rs = [r for r in grid_rows if r["variant"] == v]
            fit = [r for r in rs if r["fits"]]
            cost = sum(r["cost"] for r in rs)
            out.append(f"| {v} | {sum(r['rereads'] for r in fit)}/{sum(r['uses'] for r in fit)} | "
                       f"{sum(r['rereads'] for r in rs)}/{sum(r['uses'] for r in rs)} | ${cost:.2f} | "
                       f"{cost / base:.3f}x | {sum(r['compactions'] for r in rs)} |")
        out.append("")
    if bench_rows:
        out += ["| variant | window | cost | cost / default | evidence recall | re-runs / requests | loops |",
                "|---|---|---|---|---|---|---|"]
        keys = sorted({r["window_key"] for r in bench_rows})
        for k in keys:
            base = sum(r["cost_usd"] for r in bench_rows if r["variant"] == "default" and r["window_key"] == k) or 1.0
            for v in order:
                rs = [r for r in bench_rows if r["variant"] == v and r["window_key"] == k]
                if not rs:
                    continue
                cost = sum(r["cost_usd"] for r in rs)
                refs = sum(r["references"] for r in rs) or 1
                recall = sum(r["evidence_recall"] * r["references"] for r in rs) / refs
                reqs = sum(r["requests"] for r in rs) or 1
                label = "own" if k == OWN_WINDOW else f"{k // 1000}k"
                out.append(f"| {v} | {label} | ${cost:.2f} | {cost / base:.3f}x | {recall:.4f} | "
                           f"{sum(r['reruns'] for r in rs)}/{reqs} ({sum(r['reruns'] for r in rs) / reqs:.1%}) | "
                           f"{sum(r['loops'] for r in rs)} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variant", action="append", metavar="NAME=SECTION.FIELD=VALUE",
                    help="a variant (repeatable; default: the rules issue 63 names)")
    ap.add_argument("--grid-window", type=int, action="append", default=[],
                    help="grid windows (repeatable; default: all)")
    ap.add_argument("--half", choices=["fit", "held"], default="fit",
                    help="the grid's half: fit (default; rules are chosen on it) or held (to report)")
    ap.add_argument("--bench-window", nargs="+", default=["own", "200000", "50000"])
    ap.add_argument("--no-grid", action="store_true")
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--json", help="write every run's row here")
    a = ap.parse_args(argv)
    specs = dict(v.split("=", 1) for v in a.variant) if a.variant else DEFAULT_VARIANTS
    base = get_strategy("cachecompact").policy
    policies: dict[str, PolicyConfig | None] = {"default": None}
    policies.update({name: variant_policy(spec, base) for name, spec in specs.items()})
    t0 = time.perf_counter()
    grid_rows = [] if a.no_grid else run_grid(policies, a.grid_window, a.half)
    windows = [OWN_WINDOW if w == "own" else int(w) for w in a.bench_window]
    bench_rows = [] if a.no_bench else run_real(policies, windows)
    if a.json:
        Path(a.json).write_text(json.dumps({"variants": specs, "grid": grid_rows, "bench": bench_rows}),
                                encoding="utf-8")
    print(f"variants: {', '.join(f'{k} ({v})' for k, v in specs.items())}; {time.perf_counter() - t0:.0f} s")
    print(summarize(grid_rows, bench_rows, list(policies)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
