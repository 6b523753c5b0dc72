"""The frontier of the one knob: cost against evidence recall for each look-back coverage.

    python benchmarks/knob_frontier.py [--coverage 0.9 0.925 0.95] [--window own 200000] [--full]
                                       [--set claude-code-2026] [--ttl auto 5m 1h] [--recent 50000]

The knob is ``lookback_coverage`` (`wrap(lookback_coverage=...)`, `--lookback-coverage` on the
proxy, `LevelSettings.lookback_coverage`): the recent budget every level keeps verbatim (and a
collapse keeps after its summary) is learnt, per session, to cover that share of the agent's own
look-backs. ``--recent`` runs fixed budgets instead (``recent_tokens``, learning off), for the
frontier of the knob before it. Each value runs as its own strategy, beside `none`,
through the same bench (`cachecompact.tools.bench.run.run_bench`: the real SDK against the emulator,
each trace priced by its recorded model), on the default sample of the shared traces (four long
traces per set; ``--full``: every trace). The table gives, per window and half, the adjusted cost
against `none` and the evidence recall. The default is the cheapest value whose half-A recall
meets the floor (0.97) at every window from 200k up (the model's own included) with one
standard error to spare. Below 200k the room beside the prefix clamps the budget whatever the
knob, so recall there is reported against its floor (0.93), not fitted on. The error counts
*sessions*, not references: one session's references share its agent and its task, so they do
not vary independently, and an interval over references (Wilson's)
claims a precision that the next session does not have. The recall is the ratio of recalled
to all references over half A's sessions, and its standard error the ratio estimator's
(linearised, clustered by session: sqrt(n/(n-1) sum (recalled_i - R refs_i)^2) / sum refs_i).
A value that meets the floor only on the nose is as likely to miss it on other sessions (half B
says so). Half B is reported beside it. ``--set`` runs one set of the shared traces whole (its
halves are then split within it); ``--ttl`` runs each budget with the TTL the policy chooses
(``auto``, the default) and with a fixed one, so a fixed TTL's saving can be read against the
budget that reaches the same recall. Skips when ../shared/traces is absent.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

from cachecompact.compaction.catalog import CachecompactConfig, register_strategy
from cachecompact.compaction.policy import LevelSettings, PolicyConfig
from cachecompact.tools.bench.bench_report import LONG_TURNS, aggregate
from cachecompact.tools.bench.run import OWN_WINDOW, BenchResult, run_bench, window_label
from cachecompact.tools.traces import default_trace_dir


def floor(window: int) -> float:
    return 0.97 if window == OWN_WINDOW or window >= 200_000 else 0.93


def fitted_at(window: int) -> bool:
    """Whether the knob is fitted at ``window``: below 200k the room beside the prefix and a
    summary clamps the recent budget whatever the coverage (recall there is flat across it), so
    such a window is reported against its floor, not fitted on."""
    return window == OWN_WINDOW or window >= 200_000


def session_lower(res: BenchResult, window: int, strategy: str, half: str) -> tuple[int, float]:
    """Half ``half``'s long sessions at ``window``: how many, and the evidence recall less one
    standard error clustered by session (0 with fewer than two sessions)."""
    halves = {t["name"]: t for t in res.traces}
    rows = [(r.evidence_recall * r.references, r.references) for r in res.results
            if r.strategy == strategy and r.completed and (r.window_key if r.window_key != -1 else r.window) == window
            and halves[r.trace]["half"] == half and halves[r.trace]["turns"] >= LONG_TURNS]
    n, refs = len(rows), sum(x for _, x in rows)
    if n < 2 or refs <= 0:
        return n, 0.0
    ratio = sum(h for h, _ in rows) / refs
    se = math.sqrt(n / (n - 1) * sum((h - ratio * x) ** 2 for h, x in rows)) / refs
    return n, ratio - se


def _label(name: str) -> str:
    """A row's knob value, and its TTL when fixed: ``cachecompact-recent-30k@5m`` is "30k, 5m",
    ``cachecompact-coverage-0.925`` is "0.925", ``cachecompact-ws3000-coverage-0.925`` "0.925, 3000 chars"."""
    value, _, ttl = name.rsplit("-", 1)[-1].partition("@")
    ws = name.split("-ws", 1)[1].split("-", 1)[0] if "-ws" in name else ""
    return ", ".join([value, *([f"{ws} chars"] if ws else []), *([ttl] if ttl else [])])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--coverage", type=float, nargs="+", default=[0.9, 0.925, 0.95])
    ap.add_argument("--recent", type=int, nargs="+", default=[],
                    help="fixed recent budgets in tokens (learning off), beside the coverages")
    ap.add_argument("--working-set", type=int, nargs="+", default=[], metavar="CHARS",
                    help="also vary LevelSettings.working_set_chars: each coverage with each of these")
    ap.add_argument("--window", nargs="+", default=["own", "200000"])
    ap.add_argument("--full", action="store_true")
    ap.add_argument("--set", dest="set_name", metavar="NAME",
                    help="only this set of the shared traces, every trace of it (e.g. claude-code-2026)")
    ap.add_argument("--ttl", nargs="+", default=["auto"], choices=["auto", "5m", "1h"],
                    help="the cache TTL of each budget's runs: the policy's choice (auto) or a fixed one")
    ap.add_argument("--json", metavar="PATH", help="also write every run (and the traces' halves and sets) here")
    args = ap.parse_args(argv)
    tdir = default_trace_dir()
    if tdir is None:
        print("skipped: ../shared/traces is absent (the frontier is measured on the shared traces)")
        return 0
    paths = []
    if args.set_name:
        sets = sorted(p.name for p in tdir.iterdir() if p.is_dir() and p.name != "licenses")
        if args.set_name not in sets:
            ap.error(f"--set {args.set_name}: not a set of {tdir} ({', '.join(sets)})")
        paths = [tdir / args.set_name]
    windows = [OWN_WINDOW if w == "own" else int(w) for w in args.window]
    names = []
    settings = [(f"cachecompact-coverage-{q:g}", LevelSettings(lookback_coverage=q)) for q in args.coverage
                if not args.working_set] + \
        [(f"cachecompact-ws{c}-coverage-{q:g}", LevelSettings(lookback_coverage=q, working_set_chars=c))
         for q in args.coverage for c in args.working_set] + \
        [(f"cachecompact-recent-{k // 1000}k", LevelSettings(keep_recent_tokens=k, lookback_coverage=0.0))
         for k in args.recent]
    for name, levels in settings:
        register_strategy(name, CachecompactConfig(policy=PolicyConfig(levels=levels)))
        names += [name if ttl == "auto" else f"{name}@{ttl}" for ttl in args.ttl]
    t0 = time.time()
    res = run_bench(paths, ["none", *names], windows=windows, tasks=False, full=args.full, progress=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"traces": res.traces, "results": [r.to_dict() for r in res.results]}, fh)
    long_only = any(t["turns"] >= LONG_TURNS for t in res.traces)
    print(f"{res.corpus}; {time.time() - t0:.0f} s\n")
    print("| knob | window | adj vs none, all | recall, all | adj vs none, half A | recall, half A | "
          "adj vs none, half B | recall, half B | half A: sessions, references, recall less one SE |")
    print("|---|---|---|---|---|---|---|---|---|")
    ok_a: dict[str, bool] = {n: True for n in names}
    cost_a: dict[str, float] = {n: 0.0 for n in names}
    for w in windows:
        rows = {h: {r["strategy"]: r for r in aggregate(res, w, long_only, h)} for h in (None, "A", "B")}
        for n in names:
            cells = []
            for h in (None, "A", "B"):
                r = rows[h][n]
                adj = r["adjusted_vs_none"]
                cells += [f"{adj:.3f}x" if adj is not None else "-", f"{r['evidence_recall']:.3f}"]
            a = rows["A"][n]
            sessions, low = session_lower(res, w, n, "A")
            if fitted_at(w):
                ok_a[n] &= low >= floor(w)
            cost_a[n] += a["adjusted_cost_usd"]
            print(f"| {_label(n)} | {window_label(w)} | " + " | ".join(cells)
                  + f" | {sessions}, {a['references']}, {low:.3f} |")
    meeting = [n for n in names if ok_a[n]]
    best = min(meeting, key=lambda n: cost_a[n]) if meeting else None
    print(f"\nhalf A: the cheapest value meeting the recall floor with one standard error to spare at every window "
          f"from 200k up: "
          f"{_label(best) if best else 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
