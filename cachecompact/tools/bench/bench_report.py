"""Aggregate a `BenchResult` into tables, ``results.json``, a markdown report and PNG plots."""

from __future__ import annotations

import json
import math
import statistics
import sys
import textwrap
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .._terminal import WIDTH
from .harness import TraceResult
from .run import BenchResult, window_label

__all__ = ["LONG_TURNS", "TASKS_LEGEND", "TERMINAL_COLUMNS", "TRACE_LEGEND", "WIDTH", "aggregate", "cheaper_than_ours",
           "closing_verdict",
           "dominated_by", "markdown", "publish", "replace_section", "task_rows", "text_report", "trace_sets",
           "write_outputs"]

LONG_TURNS = 50  # "long traces" for the targets
OURS = "cachecompact"


def _names(b: BenchResult, long_only: bool, half: str | None, set_: str | None = None) -> list[str]:
    return [t["name"] for t in b.traces if (not long_only or t["turns"] >= LONG_TURNS)
            and (half is None or t.get("half") == half) and (set_ is None or t.get("set") == set_)]


def trace_sets(b: BenchResult) -> list[str]:
    """The corpus's sets (its folders: `run.trace_set`), in the order they first appear."""
    return list(dict.fromkeys(str(t.get("set")) for t in b.traces if t.get("set")))


def _key(r: TraceResult) -> int:
    """The bench window a run stands for (`OWN_WINDOW` for a run at the model's own)."""
    return r.window_key if r.window_key >= 0 else r.window


def aggregate(b: BenchResult, window: int, long_only: bool = True, half: str | None = None,
              set_: str | None = None) -> list[dict[str, Any]]:
    """One row per strategy at ``window`` over the chosen traces (a half, a set). Costs are summed
    over the traces every strategy of the row completed together with ``none``; recall is
    weighted by references."""
    names = _names(b, long_only, half, set_)
    by = {(r.trace, r.strategy): r for r in b.results if _key(r) == window}
    none_cost = {t: by[(t, "none")].cost_usd for t in names if (t, "none") in by and by[(t, "none")].completed}
    oracle = b.oracle.get(str(window), {})
    ours = {t: by[(t, OURS)] for t in names if (t, OURS) in by and by[(t, OURS)].completed}
    rows = []
    for s in b.strategies:
        rs = [by[(t, s)] for t in names if (t, s) in by]
        ok = [r for r in rs if r.completed]
        common = [r for r in ok if r.trace in none_cost]
        paired = [(r, ours[r.trace]) for r in ok if r.trace in ours]  # traces both it and cachecompact finished
        p_refs = sum(r.references for r, _ in paired)
        o_refs = sum(o.references for _, o in paired)
        o_adj = sum(o.adjusted_cost_usd for _, o in paired)
        base = sum(none_cost[r.trace] for r in common)
        refs = sum(r.references for r in ok)
        orc = [(r, min(x, none_cost.get(r.trace, math.inf))) for r in ok
               if (x := oracle.get(r.trace)) is not None]
        orc_sum = sum(c for _, c in orc)
        comps: dict[str, int] = {}
        for r in ok:
            for k, v in r.compactions.items():
                comps[k] = comps.get(k, 0) + v
        rows.append({
            "strategy": s, "traces": len(rs), "completed": len(ok),
            "failed": [{"trace": r.trace, "reason": r.failure} for r in rs if not r.completed],
            "cost_usd": sum(r.cost_usd for r in ok),
            "adjusted_cost_usd": sum(r.adjusted_cost_usd for r in ok),
            "cost_vs_none": sum(r.cost_usd for r in common) / base if base else None,
            "adjusted_vs_none": sum(r.adjusted_cost_usd for r in common) / base if base else None,
            "cost_vs_oracle": sum(r.cost_usd for r, _ in orc) / orc_sum if orc_sum else None,
            # paired with cachecompact over the traces both finished: the fair "cheaper than" test
            "adjusted_vs_ours": sum(r.adjusted_cost_usd for r, _ in paired) / o_adj if o_adj else None,
            "paired_traces": len(paired),
            "paired_recall": sum(r.evidence_recall * r.references for r, _ in paired) / p_refs if p_refs else 1.0,
            "paired_recall_ours": sum(o.evidence_recall * o.references for _, o in paired) / o_refs if o_refs else 1.0,
            "summary_cost_usd": sum(r.summary_cost_usd for r in ok),
            "rereads": sum(r.rereads for r in ok),
            # the closed loop: re-run calls over every run, finished or not (a stuck run's count), their
            # share of the agent's requests, loops, and what each finished session cost, every run's bill
            # (a stuck one's included) spread over the finished ones
            "closed_loop": any(r.closed_loop for r in rs),
            "reruns": sum(r.reruns for r in rs),
            "rerun_share": (sum(r.reruns for r in rs) / req if (req := sum(r.requests for r in rs)) else 0.0),
            "loops": sum(r.loops for r in rs),
            "cost_per_completed": sum(r.cost_usd for r in rs) / len(ok) if ok else None,
            "evidence_recall": sum(r.evidence_recall * r.references for r in ok) / refs if refs else 1.0,
            "references": refs,
            "name_recall": sum(r.name_recall * r.references for r in ok) / refs if refs else 1.0,
            "rewrite_share": sum(r.rewrite_usd for r in ok) / max(1e-9, sum(r.cost_usd for r in ok)),
            "hit_rate": (sum(r.hit_rate * r.mean_tokens * len(r.token_series) for r in ok)
                         / max(1e-9, sum(r.mean_tokens * len(r.token_series) for r in ok))),
            "cache_breaks": sum(r.cache_breaks for r in ok),
            "peak_tokens": max((r.peak_tokens for r in ok), default=0),
            "compactions": comps,
            "overhead_ms_per_turn": statistics.fmean([r.overhead_ms_per_turn for r in ok]) if ok else 0.0,
            # preserved thinking (the emulator's own counts): every run, finished or not
            "refused": sum(r.refused for r in rs),
            "thinking_dropped": sum(r.thinking_dropped for r in rs),
            "thinking_stripped": sum(r.thinking_stripped for r in rs),
            "thinking_issued_tokens": sum(r.thinking_issued_tokens for r in ok),
            "reasoning_kept": (sum(r.thinking_kept_tokens for r in ok) / issued
                               if (issued := sum(r.thinking_issued_tokens for r in ok)) else None),
            # the task as the person gave it: requests that showed the caller's first messages as it sent them
            "prefix_kept": (sum(r.prefix_kept * r.requests for r in ok) / asked
                            if (asked := sum(r.requests for r in ok)) else None),
        })
    return rows


def dominated_by(rows: list[dict[str, Any]], ours: str = OURS) -> list[str]:
    """Peers that finish as many traces as ``ours`` and, over the traces both finished, are
    cheaper in adjusted cost and higher in evidence recall (a paired comparison: totals over
    different sets of traces would compare different work)."""
    me = next((r for r in rows if r["strategy"] == ours), None)
    if me is None:
        return []
    out = []
    for r in rows:
        if r["strategy"] in (ours, "cachecompact-no-econ") or r["adjusted_vs_ours"] is None:
            continue
        if r["completed"] >= me["completed"] and r["adjusted_vs_ours"] < 1.0 \
                and r["paired_recall"] > r["paired_recall_ours"]:
            out.append(r["strategy"])
    return out


def cheaper_than_ours(rows: list[dict[str, Any]], ours: str = OURS) -> list[str]:
    """Peers with a lower adjusted cost than ``ours`` over the traces both finished, whatever
    their recall (the issue's "below every peer" test), each with the number of those traces."""
    return [f"{r['strategy']} ({r['paired_traces']} traces)" for r in rows
            if r["strategy"] not in (ours, "cachecompact-no-econ")
            and r["adjusted_vs_ours"] is not None and r["adjusted_vs_ours"] < 1.0]


def task_rows(b: BenchResult, window: int) -> list[dict[str, Any]]:
    rows = []
    for s in b.strategies:
        rs = [t for t in b.tasks if t.strategy == s and t.window == window]
        if not rs:
            continue
        passed = sum(t.passed for t in rs)
        cost = sum(t.cost_usd for t in rs)
        quotes = sum(t.quotes for t in rs)
        rows.append({"strategy": s, "tasks": len(rs), "passed": passed, "rereads": sum(t.rereads for t in rs),
                     "quotes": quotes, "reread_rate": sum(t.rereads for t in rs) / quotes if quotes else 0.0,
                     "turns": sum(t.turns for t in rs), "cost_usd": cost,
                     "cost_per_pass": cost / passed if passed else None,
                     "failures": [f"{t.task}: {t.failure}" for t in rs if not t.passed]})
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


def trace_table(rows: list[dict[str, Any]]) -> list[list[str]]:
    head = ["strategy", "done", "cost", "vs none", "adjusted", "adj vs none", "adj vs ours", "vs oracle",
            "evidence recall", "name recall", "re-reads", "re-runs", "loops", "per session", "summaries", "hit rate",
            "re-writes", "breaks", "peak tok", "refused", "dropped", "stripped", "reasoning kept", "prefix kept",
            "compactions"]
    out = [head]
    for r in rows:
        comps = " ".join(f"{k}:{v}" for k, v in sorted(r["compactions"].items())) or "-"
        closed = r.get("closed_loop")
        out.append([r["strategy"], f"{r['completed']}/{r['traces']}", _fmt(r["cost_usd"], "$"),
                    _fmt(r["cost_vs_none"], "x"), _fmt(r["adjusted_cost_usd"], "$"), _fmt(r["adjusted_vs_none"], "x"),
                    _fmt(r["adjusted_vs_ours"], "x"), _fmt(r["cost_vs_oracle"], "x"),
                    _fmt(r["evidence_recall"], "%"), _fmt(r["name_recall"], "%"),
                    str(r["rereads"]),
                    f"{r['reruns']} ({r['rerun_share']:.1%})" if closed else "-", str(r["loops"]) if closed else "-",
                    _fmt(r.get("cost_per_completed"), "$"), _fmt(r["summary_cost_usd"], "$"), _fmt(r["hit_rate"], "%"),
                    _fmt(r["rewrite_share"], "%"), str(r["cache_breaks"]), f"{r['peak_tokens']:,}",
                    str(r["refused"]), str(r["thinking_dropped"]), str(r["thinking_stripped"]),
                    _fmt(r["reasoning_kept"], "%"), _fmt(r.get("prefix_kept"), "%"), comps])
    return out


def tasks_table(rows: list[dict[str, Any]]) -> list[list[str]]:
    out = [["strategy", "passed", "re-reads", "re-read rate", "turns", "cost", "cost per passed task"]]
    for r in rows:
        out.append([r["strategy"], f"{r['passed']}/{r['tasks']}", f"{r['rereads']}/{r['quotes']}",
                    f"{r['reread_rate']:.1%}", str(r["turns"]), _fmt(r["cost_usd"], "$"),
                    _fmt(r["cost_per_pass"], "$")])
    return out


# The terminal shows these columns of a trace table, within `WIDTH`; report.md has them all.
TERMINAL_COLUMNS = ("strategy", "done", "adjusted", "adj vs none", "adj vs ours", "evidence recall", "re-runs",
                    "loops", "per session", "hit rate", "compactions")
# a table whose runs carried thinking (a model with preserved thinking) shows what the API did with it instead
THINKING_COLUMNS = ("strategy", "done", "adjusted", "adj vs none", "adj vs ours", "evidence recall", "re-runs",
                    "loops", "refused", "dropped", "stripped", "reasoning kept")
TERMINAL_HEADS = {"adj vs none": "adj/none", "adj vs ours": "adj/ours", "evidence recall": "recall",
                  "reasoning kept": "reasoning"}
TRACE_LEGEND = ("closed loop; re-runs: calls made again to see a hidden result; loops: re-runs still hidden; per "
                "session: cost/finished")
OPEN_LOOP_LEGEND = ("open loop; adjusted: cost + a re-read turn per lost result; adj/none, adj/ours: paired ratios; "
                    "recall: of evidence")
THINKING_LEGEND = ("refused: requests the API refused; dropped: thinking blocks it dropped; stripped: blocks left out "
                   "of the turns a request showed; reasoning: of the thinking in those turns, the share sent and valid")
TASKS_LEGEND = "passed: every step done within its turn budget; re-reads: quotes that needed the tool run again"


def _render(rows: list[list[str]], md: bool, columns: tuple[str, ...] | None = None) -> str:
    """A table: Markdown with every column, or for the terminal only ``columns`` (all when None),
    aligned, with the last column cut so that no line passes `WIDTH`."""
    if md:
        lines = ["| " + " | ".join(rows[0]) + " |", "|" + "|".join("---" for _ in rows[0]) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in rows[1:]]
        return "\n".join(lines)
    if columns is not None:
        keep = [rows[0].index(c) for c in columns]
        rows = [[TERMINAL_HEADS.get(rows[0][i], rows[0][i]) for i in keep], *([r[i] for i in keep] for r in rows[1:])]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    room = WIDTH - sum(w + 2 for w in widths[:-1])
    if widths[-1] > room:
        widths[-1] = max(room, len(rows[0][-1]))
        rows = [[*r[:-1], r[-1] if len(r[-1]) <= widths[-1] else r[-1][: widths[-1] - 1] + "…"] for r in rows]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _thinks(rows: list[dict[str, Any]]) -> bool:
    return any(r["thinking_issued_tokens"] or r["refused"] or r["thinking_dropped"] for r in rows)


def _columns(rows: list[dict[str, Any]]) -> tuple[str, ...]:
    return THINKING_COLUMNS if _thinks(rows) else TERMINAL_COLUMNS


def _legend(rows: list[dict[str, Any]], md: bool = True) -> list[str]:
    first = TRACE_LEGEND if any(r.get("closed_loop") for r in rows) else OPEN_LOOP_LEGEND
    said = [first, THINKING_LEGEND] if _thinks(rows) else [first]
    return said if md else [textwrap.fill(x, WIDTH, break_on_hyphens=False) for x in said]


def _quoted(items: list[str]) -> str:
    """Strategy names, each quoted (its trace count after it, when given), or "no peer"."""
    if not items:
        return "no peer"
    return ", ".join(f"'{n}'" + (f" {rest}" if rest else "") for n, _, rest in (x.partition(" ") for x in items))


def _verdict(rows: list[dict[str, Any]], md: bool = True) -> list[str]:
    dom, cheaper = dominated_by(rows), cheaper_than_ours(rows)
    # strategy names in quotes: "none" is also a strategy (issue 50: "Cheaper alone: none (3 traces)"
    # read as "no peer" while it named the strategy `none`)
    text = (f"Peers cheaper in adjusted cost *and* higher in evidence recall than cachecompact "
            f"(paired, over the traces both finished): {_quoted(dom)}. "
            f"Cheaper in adjusted cost alone: {_quoted(cheaper)}.")
    return [text if md else textwrap.fill(text, WIDTH), ""]


def _sections(b: BenchResult, md: bool) -> list[str]:
    parts: list[str] = []
    h = "### " if md else ""
    long_only = any(t["turns"] >= LONG_TURNS for t in b.traces)  # else every trace: a table is never empty
    kind = "long traces" if long_only else f"all traces (none has {LONG_TURNS}+ turns)"
    for w in b.windows:
        if b.results:
            for label, half in ((f"{kind}, all", None), (f"{kind}, half A (fit)", "A"),
                                (f"{kind}, half B (held out)", "B")):
                rows = aggregate(b, w, long_only, half)
                n = len(_names(b, long_only, half))
                parts += [f"{h}window {window_label(w)}: {label} ({n} traces)", "",
                          _render(trace_table(rows), md, None if md else _columns(rows)), *_legend(rows, md), ""]
                if half is None:
                    parts += _verdict(rows, md)
            sets = trace_sets(b)
            for set_ in sets if len(sets) > 1 else []:
                n = len(_names(b, long_only, None, set_))
                if not n:
                    continue
                rows = aggregate(b, w, long_only, None, set_)
                parts += [f"{h}window {window_label(w)}: {kind}, set {set_} ({n} traces)", "",
                          _render(trace_table(rows), md, None if md else _columns(rows)), *_legend(rows, md), "",
                          *_verdict(rows, md)]
        trows = task_rows(b, w)
        if trows:
            parts += [f"{h}window {window_label(w)}: closed-loop tasks", "", _render(tasks_table(trows), md),
                      TASKS_LEGEND, ""]
    return parts


def failed_runs(b: BenchResult) -> list[str]:
    """Every run that did not finish, with its whole reason: one line per trace, window and
    reason, naming the strategies that failed that way (none is ever left out of a table
    without a word: its table counts it in "done", and here is why)."""
    groups: dict[tuple[int, str, str], list[str]] = {}
    for r in b.results:  # a run the own-window table shares with a numbered window is listed once
        if not r.completed:
            strategies = groups.setdefault((r.window, r.trace, r.failure or "no reason recorded"), [])
            if r.strategy not in strategies:
                strategies.append(r.strategy)
    return [f"{', '.join(strategies)} at {window:,} tokens on {trace}: {reason}"
            for (window, trace, reason), strategies in groups.items()]


def closing_verdict(b: BenchResult) -> list[str]:
    """A few lines that end the terminal report (issue 50: its last screen was the failed runs
    and a long list of files): per window, over the long traces, cachecompact against `none`
    and against the peer that cost least next to it (paired over the traces both finished),
    each at its evidence recall."""
    if not b.results:
        return []
    long_only = any(t["turns"] >= LONG_TURNS for t in b.traces)
    out = []
    for w in b.windows:
        rows = {r["strategy"]: r for r in aggregate(b, w, long_only)}
        ours = rows.get(OURS)
        if ours is None or not ours["completed"]:
            continue
        vs_none = ours["adjusted_vs_none"]
        line = (f"window {window_label(w)}: cachecompact "
                + (f"{vs_none:.2f}x 'none'" if vs_none is not None else "(no 'none' run to compare)")
                + f" at recall {ours['evidence_recall']:.3f}, {ours['completed']}/{ours['traces']} finished")
        # a peer that finished fewer sessions than ours is not "cheapest": it is cheap where it did not fail
        peers = [r for n, r in rows.items() if n not in (OURS, "none") and not n.startswith(OURS)
                 and r["adjusted_vs_ours"] is not None and r["paired_traces"]
                 and r["completed"] >= ours["completed"]]
        if peers:
            best = min(peers, key=lambda r: r["adjusted_vs_ours"])
            line += (f"; cheapest peer '{best['strategy']}' {best['adjusted_vs_ours']:.2f}x ours at recall "
                     f"{best['paired_recall']:.3f} (ours {best['paired_recall_ours']:.3f}) over the "
                     f"{best['paired_traces']} traces both finished")
        out.append(textwrap.fill(line, WIDTH, subsequent_indent="    "))
    return ["verdict (adjusted cost, long traces):", *out] if out else []


def text_report(b: BenchResult) -> str:
    lines = _sections(b, md=False)
    failed = failed_runs(b)
    if failed:
        lines += [f"runs that did not finish ({len(failed)} groups; not in the sums, counted in 'done'):",
                  *(textwrap.fill(x, WIDTH, subsequent_indent="    ", break_on_hyphens=False) for x in failed), ""]
    return "\n".join([*lines, *closing_verdict(b)])


def markdown(b: BenchResult, command: str) -> str:
    long_n = sum(1 for t in b.traces if t["turns"] >= LONG_TURNS)
    parts = [
        "# cachecompact bench", "",
        f"Command: `{command}`  ",
        f"Corpus: {b.corpus}: {len(b.traces)} traces ({long_n} with >= {LONG_TURNS} turns); model pricing `{b.model}`; "
        f"windows {', '.join(window_label(w) for w in b.windows)}; {len(b.tasks)} task runs; "
        f"{'closed' if b.closed_loop else 'open'} loop; wall time {b.wall_s:.0f} s.", "",
        *_sections(b, md=True),
        "Closed loop (the default; `--open-loop` for the other): the replayed agent acts on what each request "
        "shows: when a recorded call needs a tool result whose evidence the request hides, it first re-runs the "
        "call that produced it (same tool and input; the recorded result comes back through the strategy), at most "
        "twice per result and call; *re-runs* counts those calls (and their share of the agent's requests), "
        "*loops* the re-runs whose result came back hidden, and a session past 16 loops is stuck and does not "
        "finish; *per session* is every run's cost, a stuck one's included, over the sessions finished. "
        "Columns: cost = agent requests (the re-runs included) + summarizer calls over completed traces; *vs none* "
        "ratios are over the traces both completed; *adj vs ours* is a peer's adjusted cost over cachecompact's on "
        "the traces both completed; *adjusted* adds one re-read turn (context read from cache, the lost tool result "
        "written, 150 output tokens) for each tool result whose evidence was never made visible (closed loop: one "
        "that could not be re-run, a sub-agent's, or was given up on; open loop: the first time it is lost); evidence "
        "recall is measured at first sight, before any re-run; *vs oracle* against the billed "
        "masking oracle (never above none); re-writes = the share of the cost spent writing again what the previous "
        "request had cached (edits and idle expiries); evidence recall = share of references whose evidence lines "
        "were still visible verbatim; name recall = share whose identifier appeared anywhere. Preserved thinking "
        "(a model whose turns think and whose API checks each thinking block against what precedes it), as the "
        "emulator saw it: *refused* = requests it refused (a 400 on a thinking block); *dropped* = thinking blocks "
        "it dropped (invalid, or unreadable by the model, when the request asked drop_block or the model drops "
        "silently); *stripped* = thinking blocks the emulator had issued with a turn the request still showed, left "
        "out of it; *reasoning kept* = of the thinking tokens issued with the turns a request showed, the share sent "
        "and valid. *prefix kept* = the share of requests that showed the caller's first 3 messages as it sent "
        "them (an API-written summary stands in for them; README guarantee 2).",
    ]
    if b.skipped:
        parts += ["", "## Skipped files", ""] + [f"- `{s['file']}`: {s['reason']}" for s in b.skipped]
    failed = failed_runs(b)
    if failed:
        parts += ["", "## Runs that did not finish (counted in *done*, not in the sums)", ""]
        parts += [f"- {x}" for x in failed]
    return "\n".join(parts) + "\n"


def plots(b: BenchResult, out: Path, n: int = 3) -> list[Path]:
    """Cumulative cost and context size over turns for the ``n`` longest traces, per window."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    written = []
    for w in b.windows:
        by = {(r.trace, r.strategy): r for r in b.results if _key(r) == w}
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
            ax[0].set_title(f"{t['name']} ({t['turns']} turns, window {window_label(w)}); "
                            "triangles = compaction events")
            fig.tight_layout()
            p = out / f"{t['name'].replace('/', '__')}.w{'own' if w == 0 else f'{w // 1000}k'}.png"
            fig.savefig(p, dpi=90)
            plt.close(fig)
            written.append(p)
    return written


def write_outputs(b: BenchResult, out: Path, command: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    data = {
        "model": b.model, "windows": b.windows, "corpus": b.corpus, "wall_s": b.wall_s, "strategies": b.strategies,
        "closed_loop": b.closed_loop,
        "traces": b.traces, "skipped": b.skipped, "oracle": b.oracle,
        "aggregate": {str(w): {"long": aggregate(b, w), "long_A": aggregate(b, w, True, "A"),
                               "long_B": aggregate(b, w, True, "B"), "all": aggregate(b, w, False),
                               "sets": {s: aggregate(b, w, True, None, s) for s in trace_sets(b)},
                               "tasks": task_rows(b, w)} for w in b.windows},
        "results": [asdict(r) for r in b.results],
        "tasks": [asdict(t) for t in b.tasks],
    }
    (out / "results.json").write_text(json.dumps(data, indent=1))
    (out / "report.md").write_text(markdown(b, command))
    return [out / "results.json", out / "report.md", *plots(b, out)]


def publish(text: str, write: str | Path | None, name: str) -> int:
    """Print a benchmark's text and, with ``write``, put it in that markdown file's ``name``
    section; the exit status (1 when the section's markers are missing)."""
    print(text)
    if write and not replace_section(write, name, text):
        print(f"no <!-- {name}:start --> / <!-- {name}:end --> markers in {write}", file=sys.stderr)
        return 1
    return 0


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
