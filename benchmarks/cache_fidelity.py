"""Billing fidelity: the cache simulator against Anthropic's recorded usage in Claude Code logs.

    python benchmarks/cache_fidelity.py [--write docs/cache-model.md]

See cachecompact/tools/bench/fidelity.py for the method. Skips (exit 0) when ../shared/traces is absent.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from cachecompact.tools.bench.bench_report import publish
from cachecompact.tools.bench.fidelity import HIT_CLASSES, LOG_CANNOT_SHOW, MISS_CLASSES, session_fidelity, summarize
from cachecompact.tools.traces import default_trace_dir, discover


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--write", help="update the fidelity section of this markdown file")
    args = ap.parse_args()
    tdir = default_trace_dir()
    sets = [d for d in ("claude-code", "claude-code-2026", "claude-code-2026-1m")
            if tdir is not None and (tdir / d).is_dir()]
    if tdir is None or not sets:
        print("no Claude Code traces found (../shared/traces/claude-code*); nothing to measure")
        return 0
    lines: list[str] = []
    for name in sets:
        lines += _one_set(name, [r for f in discover([tdir / name]) if (r := session_fidelity(f)) is not None])
    text = "\n".join(lines + LEGEND)
    return publish(text, args.write, "fidelity")


def _one_set(name: str, results: list[Any]) -> list[str]:
    """One set's table, per session, and its summary: the bill priced as billed (writes at their
    recorded TTL, output and thinking, `usage.iterations`) against the same bill with the
    simulator's input, write and read; a session outside +-5% is named."""
    lines = [
        f"### {name}",
        "",
        "| session | model | calls | fitted prefix P | ratio k | total-input fit error | recorded read share "
        "| simulated read share | abs. error | recorded cost | simulated cost | sim / rec "
        "| unexplained misses as billed | every disagreement as billed |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    outside = []
    for r in results:
        rec, sim = r.share("recorded"), r.share("simulated")
        billed, simulated = r.cost("recorded"), r.cost("simulated")
        ratio = simulated / billed if billed else 1.0
        explained, agreed = (r.cost("explained") / billed, r.cost("agreed") / billed) if billed else (1.0, 1.0)
        if abs(ratio - 1) > 0.05:
            outside.append((r.name.removesuffix("__chat"), ratio, explained, r.gap_by_class()))
        lines.append(f"| {r.name.removesuffix('__chat')} | {r.model} | {len(r.calls)} | {r.prefix_tokens:,.0f} | "
                     f"{r.ratio:.2f} | {r.total_fit_error:.1%} | {rec:.3f} | {sim:.3f} | {abs(rec - sim):.3f} | "
                     f"${billed:.2f} | ${simulated:.2f} | {ratio:.3f} | {explained:.3f} | {agreed:.3f} |")
    s = summarize(results)
    lines += [
        "",
        f"- Calls compared: **{s['calls']}** in {s['sessions']} sessions.",
        f"- Per call, |recorded - simulated| share of input read from cache: mean **{s['call_mae']:.3f}**, "
        f"median **{s['call_median']:.4f}**, 90th percentile **{s['call_p90']:.3f}**.",
        f"- Hit/miss classification (read share >= 0.5) agrees on **{s['hit_miss_agreement']:.1%}** of calls; "
        f"{s['misses_rules_cannot_explain']} calls were recorded as misses where the documented rules predict a "
        f"hit, {s['hits_rules_cannot_explain']} the other way round.",
        f"- Per session, |recorded - simulated| read share: mean **{s['session_mae']:.3f}**, "
        f"worst **{s['session_max']:.3f}**.",
        f"- Cost as billed, simulated / recorded, all sessions: **{s['cost_ratio']:.3f}**; per session from "
        f"**{s['session_cost_min']:.3f}** to **{s['session_cost_max']:.3f}**.",
        "- Recorded misses the replay reads, by what the log shows (the first class that holds; those the log "
        f"cannot explain are {', '.join(sorted(LOG_CANNOT_SHOW))}): "
        + ", ".join(f"{k} {v}" for k, v in s["miss_classes"].items() if v) + ".",
        "- Recorded hits the replay misses: " + (", ".join(f"{k} {v}" for k, v in s["hit_classes"].items() if v)
                                                 or "none") + ".",
        f"- Sessions outside +-5%: {len(outside)} of {len(results)}"
        + (", each with its gap (simulated - billed) by class:" if outside else "."),
    ]
    for n, x, e, gaps in outside:
        parts = ", ".join(f"{k} {v:+.2f}" for k, v in sorted(gaps.items(), key=lambda kv: kv[1]) if abs(v) >= 0.005)
        lines.append(f"  - {n}: {x:.3f} ({e:.3f} with the misses the log cannot explain as billed); gap in $: {parts}")
    lines.append("")
    return lines


# what each class means, printed once under the tables
LEGEND = ["Classes of a recorded miss the replay reads:", ""] + [f"- `{k}`: {v}" for k, v in MISS_CLASSES.items()] + [
    "", "Classes of a recorded hit the replay misses (`hit:` in the gaps):", ""] + [
    f"- `{k}`: {v}" for k, v in HIT_CLASSES.items()] + [
    "", "`both hit`: the calls both read, whose writes differ by the token estimate's error; `both miss`: likewise.",
    ""]


if __name__ == "__main__":
    sys.exit(main())
