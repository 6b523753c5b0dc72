"""Aggregate a `BenchResult` into tables, ``results.json``, a markdown report and PNG plots."""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .run import BenchResult

__all__ = ["LONG_TURNS", "aggregate", "markdown", "replace_section", "table", "write_outputs"]

LONG_TURNS = 50  # "long traces" for the targets


def aggregate(b: BenchResult, long_only: bool = False) -> list[dict[str, Any]]:
    """One row per strategy, over traces every strategy completed (so sums are comparable)."""
    turns = {t["name"]: t["turns"] for t in b.traces}
    names = [t for t in turns if not long_only or turns[t] >= LONG_TURNS]
    by = {(r.trace, r.strategy): r for r in b.results}
    none_cost = {t: by[(t, "none")].cost_usd for t in names if (t, "none") in by and by[(t, "none")].completed}
    rows = []
    for s in b.strategies:
        rs = [by[(t, s)] for t in names if (t, s) in by]
        ok = [r for r in rs if r.completed]
        common = [r for r in ok if r.trace in none_cost]
        cost = sum(r.cost_usd for r in ok)
        both = [r for r in ok if b.oracle.get(r.trace) is not None]
        oracle_sum = sum(b.oracle[r.trace] or 0.0 for r in both)
        refs = sum(r.references for r in ok)
        comps: dict[str, int] = {}
        for r in ok:
            for k, v in r.compactions.items():
                comps[k] = comps.get(k, 0) + v
        rows.append({
            "strategy": s,
            "traces": len(rs),
            "completed": len(ok),
            "failed": [r.trace for r in rs if not r.completed],
            "cost_usd": cost,
            "cost_vs_none": (sum(r.cost_usd for r in common) / sum(none_cost[r.trace] for r in common)
                             if common and sum(none_cost[r.trace] for r in common) else None),
            "cost_vs_oracle": (sum(r.cost_usd for r in both) / oracle_sum) if oracle_sum else None,
            "summary_cost_usd": sum(r.summary_cost_usd for r in ok),
            "hit_rate": (sum(r.hit_rate * r.mean_tokens * len(r.token_series) for r in ok)
                         / max(1e-9, sum(r.mean_tokens * len(r.token_series) for r in ok))),
            "cache_breaks": sum(r.cache_breaks for r in ok),
            "peak_tokens": max((r.peak_tokens for r in ok), default=0),
            "mean_tokens": statistics.fmean([r.mean_tokens for r in ok]) if ok else 0.0,
            "compactions": comps,
            "overhead_ms_per_turn": statistics.fmean([r.overhead_ms_per_turn for r in ok]) if ok else 0.0,
            "recall": (sum(r.recall * r.references for r in ok) / refs) if refs else 1.0,
        })
    return rows


def _fmt(v: Any, kind: str = "") -> str:
    if v is None:
        return "-"
    if kind == "$":
        return f"${v:,.2f}"
    if kind == "x":
        return f"{v:.2f}x"
    if kind == "%":
        return f"{v:.3f}"
    if isinstance(v, float):
        return f"{v:,.1f}"
    return str(v)


def table(rows: list[dict[str, Any]]) -> list[list[str]]:
    head = ["strategy", "done", "cost", "vs none", "vs oracle", "summaries", "hit rate", "breaks", "peak tok",
            "mean tok", "recall", "overhead/turn", "compactions"]
    out = [head]
    for r in rows:
        comps = " ".join(f"{k}:{v}" for k, v in sorted(r["compactions"].items())) or "-"
        out.append([r["strategy"], f"{r['completed']}/{r['traces']}", _fmt(r["cost_usd"], "$"),
                    _fmt(r["cost_vs_none"], "x"), _fmt(r["cost_vs_oracle"], "x"), _fmt(r["summary_cost_usd"], "$"),
                    _fmt(r["hit_rate"], "%"), str(r["cache_breaks"]), f"{r['peak_tokens']:,}",
                    f"{r['mean_tokens']:,.0f}", _fmt(r["recall"], "%"), f"{r['overhead_ms_per_turn']:.2f} ms", comps])
    return out


def _render(rows: list[list[str]], md: bool) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    if md:
        lines = ["| " + " | ".join(rows[0]) + " |", "|" + "|".join("---" for _ in rows[0]) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in rows[1:]]
        return "\n".join(lines)
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def text_table(b: BenchResult, long_only: bool = False) -> str:
    return _render(table(aggregate(b, long_only)), md=False)


def markdown(b: BenchResult, command: str) -> str:
    long_n = sum(1 for t in b.traces if t["turns"] >= LONG_TURNS)
    parts = [
        "# cachecompact bench",
        "",
        f"Command: `{command}`  ",
        f"Corpus: {b.corpus}: {len(b.traces)} traces ({long_n} with >= {LONG_TURNS} turns); model pricing "
        f"`{b.model}`, context window {b.window:,} tokens; wall time {b.wall_s:.0f} s.",
        "",
        f"## Long traces (>= {LONG_TURNS} turns)",
        "",
        _render(table(aggregate(b, long_only=True)), md=True),
        "",
        "## All traces",
        "",
        _render(table(aggregate(b)), md=True),
        "",
        "Columns: cost = agent requests + summarizer calls, summed over completed traces; *vs none* and *vs "
        "oracle* are ratios of sums over the traces both completed; hit rate = cache reads / input tokens; "
        "breaks = requests whose hit rate fell below 0.8x the rolling mean of the previous 10; recall = share of "
        "identifiers that later tool calls used and that were still visible in the request sent.",
    ]
    if b.skipped:
        parts += ["", "## Skipped files", ""] + [f"- `{s['file']}`: {s['reason']}" for s in b.skipped]
    failed = [r for r in b.results if not r.completed]
    if failed:
        parts += ["", "## Failed runs (not counted as complete)", ""]
        parts += [f"- {r.strategy} on `{r.trace}`: {r.failure}" for r in failed]
    parts += ["", "## Per trace", "", "| trace | turns | oracle | " + " | ".join(b.strategies) + " |",
              "|---|---:|---:|" + "---:|" * len(b.strategies)]
    by = {(r.trace, r.strategy): r for r in b.results}
    for t in b.traces:
        cells = []
        for s in b.strategies:
            r = by.get((t["name"], s))
            cells.append("-" if r is None else (f"${r.cost_usd:.2f}" + ("" if r.completed else " (failed)")))
        o = b.oracle.get(t["name"])
        parts.append(f"| {t['name']} | {t['turns']} | {'-' if o is None else f'${o:.2f}'} | " + " | ".join(cells)
                     + " |")
    return "\n".join(parts) + "\n"


def plots(b: BenchResult, out: Path, n: int = 3) -> list[Path]:
    """Cumulative cost and context size over turns for the ``n`` longest traces."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    by = {(r.trace, r.strategy): r for r in b.results}
    written = []
    for t in sorted(b.traces, key=lambda x: -x["turns"])[:n]:
        fig, ax = plt.subplots(2, 1, figsize=(10, 8), sharex=True)
        for s in b.strategies:
            r = by.get((t["name"], s))
            if r is None or not r.cost_series:
                continue
            (line,) = ax[0].plot(r.cost_series, label=s)
            ax[1].plot(r.token_series, color=line.get_color(), label=s)
            marks = [k for k, _ in r.event_turns if k < len(r.token_series)]
            ax[1].scatter(marks, [r.token_series[k] for k in marks], color=line.get_color(), s=12, marker="v")
        ax[0].set_ylabel("cumulative cost ($)")
        ax[1].set_ylabel("input tokens per request")
        ax[1].set_xlabel("request (turn)")
        ax[0].legend(fontsize=7, ncol=2)
        ax[0].set_title(f"{t['name']} ({t['turns']} turns); triangles = compaction events")
        fig.tight_layout()
        p = out / f"{t['name'].replace('/', '__')}.png"
        fig.savefig(p, dpi=90)
        plt.close(fig)
        written.append(p)
    return written


def write_outputs(b: BenchResult, out: Path, command: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    data = {
        "model": b.model, "window": b.window, "corpus": b.corpus, "wall_s": b.wall_s, "strategies": b.strategies,
        "traces": b.traces, "skipped": b.skipped, "oracle": b.oracle,
        "aggregate": {"all": aggregate(b), "long": aggregate(b, long_only=True)},
        "results": [asdict(r) for r in b.results],
    }
    (out / "results.json").write_text(json.dumps(data, indent=1))
    (out / "report.md").write_text(markdown(b, command))
    return [out / "results.json", out / "report.md", *plots(b, out)]


def replace_section(path: str | Path, name: str, text: str) -> bool:
    """Put ``text`` between ``<!-- name:start -->`` and ``<!-- name:end -->`` in a markdown file
    (how the benchmark scripts keep docs/ in step with what they measured)."""
    p = Path(path)
    doc = p.read_text()
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    if start not in doc or end not in doc:
        return False
    p.write_text(doc[: doc.index(start) + len(start)] + "\n" + text + "\n" + doc[doc.index(end):])
    return True
