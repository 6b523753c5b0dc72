"""``cachecompact whatif PATH...``: what your own sessions would have cost under each option.

Each session (a Claude Code log, or any trace `cachecompact bench` reads) is replayed through
the emulator the way the bench replays its traces: the recorded conversation at its recorded
times, so idle gaps expire caches as they did, priced by the session's own recorded model at
that model's own window. The options are cachecompact with each TTL choice (the policy's own,
5 minutes, 1 hour), no compaction with each TTL, and the peers: Claude Code's way with each TTL
and OpenHands'. The baseline every saving is measured against is Claude Code's way with the
TTL the session's log shows it wrote with (5 minutes where the log records no writes).

The replay is the comparison, not the recorded bill: a log records neither the system prompt
nor the tools, so a replay costs less than the session did, by the same amount under every
option. The recorded cost is printed beside the replays for scale, and each row is compared
with the replay of Claude Code's own strategy, which stands for what happened.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..base.errors import ConfigError
from ..base.pricing import model_prices
from ._logs import billed, written_ttl
from ._terminal import fold
from .bench.run import OWN_WINDOW, BenchResult, load_corpus, run_bench, trace_model, window_label
from .traces import Trace

__all__ = ["BASELINE", "BASELINE_IDLE", "OPTIONS", "Option", "WhatIf", "left_out", "plot", "recorded_cost",
           "recorded_split", "table", "what_if"]

BASELINE = "as recorded"  # per session: claude-code at the TTL its log wrote with
BASELINE_IDLE = "as recorded+idle"  # the same, with Claude Code's idle compaction (2.1.286+)
OPTIONS = ("claude-code", "claude-code@5m", BASELINE_IDLE, "none", "none@1h", "cachecompact", "cachecompact@5m",
           "cachecompact@1h", "cachecompact+idle", "openhands")
_SAID = {BASELINE: "Claude Code's way, its own TTL",
         BASELINE_IDLE: "Claude Code's way + idle compaction, own TTL",
         "claude-code": "Claude Code's way, 1 h TTL",
         "claude-code@5m": "Claude Code's way, 5 min TTL", "none": "no compaction, 5 min TTL",
         "none@1h": "no compaction, 1 h TTL", "cachecompact": "cachecompact (TTL it chooses)",
         "cachecompact@5m": "cachecompact, 5 min TTL", "cachecompact@1h": "cachecompact, 1 h TTL",
         "openhands": "OpenHands' condenser",
         "claude-code+idle": "Claude Code's way + idle compaction, 1 h TTL",
         "claude-code@5m+idle": "Claude Code's way + idle compaction, 5 min",
         "cachecompact+idle": "cachecompact + priced idle compaction"}


@dataclass
class Option:
    """One option summed over the sessions every option replayed to the end."""

    name: str
    cost_usd: float = 0.0  # the replay's bill: requests and summaries
    adjusted_usd: float = 0.0  # plus one re-read turn per hidden result the agent gave up re-running
    reruns: int = 0  # calls the closed-loop agent made again to see what an edit hid (billed in cost_usd)
    requests: int = 0  # the requests replayed, re-runs included
    recall: float = 1.0  # evidence recall, weighted by the references each session made
    failed: int = 0  # sessions this option could not replay to the end
    rewrite_usd: float = 0.0  # writing again what the previous request had cached: TTL expiries and edits

    @property
    def label(self) -> str:
        return _SAID.get(self.name, self.name)


@dataclass
class WhatIf:
    sessions: list[dict[str, Any]]  # name, model, turns, recorded cost (None: no usage in the log)
    options: list[Option]
    window: int
    paired: int  # sessions every option replayed to the end (the sums are over these)
    skipped: list[dict[str, str]] = field(default_factory=list)
    wall_s: float = 0.0
    per_session: dict[str, dict[str, float]] = field(default_factory=dict)  # session -> option -> cost
    # every (session, option) that did not replay to the end, with its whole reason
    failures: list[dict[str, str]] = field(default_factory=list)
    # the sessions some option could not finish: what each option that did finish cost
    partial: dict[str, dict[str, float]] = field(default_factory=dict)
    # the recorded bill, split so that it adds up to `cachecompact forensics` on the same files
    recorded: dict[str, float] = field(default_factory=dict)
    hidden: list[str] = field(default_factory=list)  # options run only to make a baseline: no row in the table

    def option(self, name: str) -> Option:
        return next(o for o in self.options if o.name == name)


def _day_prices(trace: Trace) -> Any:
    """Prices as of the session's first recorded time (its sub-agents' included), as forensics prices it."""
    times = [t for th in (trace, *trace.subagents) for t in th.timestamps if t is not None]
    first = min(times, default=None)
    return lambda m: model_prices(m).as_of(first)


def recorded_cost(trace: Trace, seen: set[str] | None = None) -> float | None:
    """What the session's main chain cost as billed (its sub-agents are not replayed), at the
    prices of the day it was recorded; None when the log records no usage. ``seen``: response
    ids an earlier log billed (a resumed session's copied history is billed once); updated."""
    if not any(trace.usage):
        return None
    mine: set[str] = set()
    cost = billed([trace], _day_prices(trace), trace_model(trace), seen or frozenset(), mine)[0]
    if seen is not None:
        seen |= mine
    return cost


def recorded_split(corpus: Sequence[Trace], replayed: set[str]) -> dict[str, float]:
    """The recorded bill of every loaded log, as `cachecompact forensics` counts it (each
    response once, in file order), split into what the replays cover and what they do not:
    the main chains of the sessions every option replayed, the main chains of the sessions
    left out, and the sub-agents (never replayed)."""
    seen: set[str] = set()
    out = {"replayed_usd": 0.0, "left_out_usd": 0.0, "subagents_usd": 0.0}
    for t in corpus:
        mine: set[str] = set()
        prices = _day_prices(t)
        main = billed([t], prices, trace_model(t), seen, mine)[0]
        out["replayed_usd" if t.name in replayed else "left_out_usd"] += main
        out["subagents_usd"] += billed(t.subagents, prices, trace_model(t), seen, mine)[0]
        seen |= mine
    out["total_usd"] = out["replayed_usd"] + out["left_out_usd"] + out["subagents_usd"]
    return out


def recorded_ttl(trace: Trace) -> str:
    """The TTL most of the session's recorded writes used ("5m" where it records none)."""
    ttls = [written_ttl(u) for u in trace.usage if u and int(u.get("cache_creation_input_tokens") or 0)]
    return "1h" if ttls and ttls.count("1h") * 2 > len(ttls) else "5m"


def what_if(paths: Sequence[str | Path], options: Sequence[str] = OPTIONS, window: int = OWN_WINDOW,
            workers: int | None = None, progress: bool = True,
            on_skip: Callable[[dict[str, str]], None] | None = None) -> WhatIf:
    """Replay every session under every option (both cores by default) and sum them. When no
    file can be loaded, ``on_skip`` hears of each with why before the error (otherwise the
    table lists them)."""
    t0 = time.perf_counter()
    asked = [n for n in dict.fromkeys(options) if n != BASELINE]
    idle_peer = BASELINE_IDLE in asked or any(n.startswith("claude-code") and n.endswith("+idle") for n in asked)
    # the baselines are made of these, per session; Claude Code's own rows are always shown
    shown = [p for p in ("claude-code", "claude-code@5m") if p not in asked] + asked
    hidden = [p for p in ("claude-code+idle", "claude-code@5m+idle") if idle_peer and p not in asked]
    names = [n for n in shown if n != BASELINE_IDLE] + hidden
    corpus, skipped, _ = load_corpus(paths)
    if not corpus:
        for sk in skipped:
            if on_skip is not None:
                on_skip(sk)
        why = "" if on_skip is not None else " (" + "; ".join(f"{x['file']}: {x['reason']}" for x in skipped[:3]) + ")"
        raise ConfigError(f"no session could be loaded from {', '.join(map(str, paths))}"
                          + (why if skipped else "") + (": each file is listed above with why" if on_skip else ""))
    res: BenchResult = run_bench(strategies=names, model=None, windows=[window], workers=workers, progress=progress,
                                 tasks=False, full=True, corpus=corpus, oracle_runs=False,
                                 progress_label="cachecompact whatif")
    runs = {(r.trace, r.strategy): r for r in res.results}
    for t in corpus:  # the baselines: Claude Code's way at the TTL the session wrote with
        way = "claude-code" if recorded_ttl(t) == "1h" else "claude-code@5m"
        for base, run in ((BASELINE, way), (BASELINE_IDLE, f"{way}+idle")):
            if (t.name, run) in runs:
                runs[(t.name, base)] = runs[(t.name, run)]
    names = [BASELINE, *shown, *hidden]
    complete = [t for t in corpus if all((t.name, s) in runs and runs[(t.name, s)].completed for s in names)]
    failures = [{"session": t.name, "option": s, "reason": (runs[(t.name, s)].failure or "no reason recorded")
                 if (t.name, s) in runs else "not run"}
                for t in corpus for s in names if s not in (BASELINE, BASELINE_IDLE)
                and not ((t.name, s) in runs and runs[(t.name, s)].completed)]
    partial = {t.name: {s: runs[(t.name, s)].cost_usd for s in names
                        if (t.name, s) in runs and runs[(t.name, s)].completed}
               for t in corpus if t not in complete}
    out: list[Option] = []
    for s in names:
        o = Option(s, failed=sum(1 for t in corpus if not ((t.name, s) in runs and runs[(t.name, s)].completed)))
        refs = 0
        got = 0.0
        for t in complete:
            r = runs[(t.name, s)]
            o.cost_usd += r.cost_usd
            o.adjusted_usd += r.adjusted_cost_usd
            o.rewrite_usd += r.rewrite_usd
            o.reruns += r.reruns
            o.requests += r.requests
            refs += r.references
            got += r.evidence_recall * r.references
        o.recall = got / refs if refs else 1.0
        out.append(o)
    seen: set[str] = set()
    sessions = [{"name": t.name, "model": trace_model(t), "turns": t.turns, "recorded_usd": recorded_cost(t, seen),
                 "recorded_ttl": recorded_ttl(t), "replayed_by_every_option": t in complete} for t in corpus]
    per = {t.name: {s: runs[(t.name, s)].cost_usd for s in names} for t in complete}
    return WhatIf(sessions, out, window, len(complete), skipped + res.skipped, time.perf_counter() - t0, per,
                  failures, partial, recorded_split(corpus, {t.name for t in complete}), hidden)


def table(w: WhatIf, top: int = 3) -> str:
    """The short table a terminal shows (at most 120 columns), a legend, and the sessions that
    would have saved most."""
    base = w.option(BASELINE)
    left = len(w.sessions) - w.paired
    head = (f"{len(w.sessions)} sessions loaded ({sum(s['turns'] for s in w.sessions):,} turns), replayed at "
            f"{window_label(w.window)} window, priced by each session's model; {w.paired} replayed to the end under "
            f"every option, and the rows below sum those {w.paired}"
            + (f"; {left} left out, listed below with why" if left else ""))
    lines = [head]
    rc = w.recorded
    if rc and rc.get("total_usd"):
        lines.append(f"recorded, as billed: ${rc['total_usd']:,.2f} in all, which `cachecompact forensics` on the same "
                     f"files also totals = ${rc['replayed_usd']:,.2f} (main chains of the {w.paired} sessions replayed)"
                     f" + ${rc['left_out_usd']:,.2f} (main chains of the {left} left out) + "
                     f"${rc['subagents_usd']:,.2f} (sub-agents, which whatif does not replay); each response once, "
                     "a resumed log's copies included. The replays lack the system prompt and tools a log omits, "
                     "so compare the rows with each other")
    rows = [("option", "cost", "vs own way", "saving", "re-writes", "adjusted", "recall", "re-runs", "failed")]
    for o in table_options(w):
        ratio = o.cost_usd / base.cost_usd if base.cost_usd else 1.0
        rows.append((o.label, f"${o.cost_usd:,.2f}", f"{ratio:.2f}x", _usd(base.cost_usd - o.cost_usd),
                     f"${o.rewrite_usd:,.2f}", f"${o.adjusted_usd:,.2f}", f"{o.recall:.3f}",
                     f"{o.reruns} ({o.reruns / max(1, o.requests):.1%})", str(o.failed)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for k, r in enumerate(rows):
        lines.append("  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(r)))
        if k == 0:
            lines.append("  ".join("-" * x for x in widths))
    lines.append("cost: the replay's bill, closed loop (re-runs: calls the agent made again to see what an edit hid); "
                 "saving: against Claude Code's way at each session's own TTL; re-writes: cached tokens written again "
                 "(expiries, edits); adjusted: plus a re-read turn per result given up on; recall: evidence in view")
    best = min((o for o in w.options if o.name != BASELINE), key=lambda o: o.adjusted_usd, default=None)
    if best is not None and w.per_session:
        gains = sorted(((c[BASELINE] - c[best.name], name) for name, c in w.per_session.items()), reverse=True)
        shown = [f"{n} ${g:,.2f}" for g, n in gains[:top] if g > 0]
        if shown:
            lines.append(f"most saved by {best.label}: " + "; ".join(shown))
    lines += left_out(w)
    for s in w.skipped:
        lines.append(f"skipped {s['file']}: {s['reason']}")
    return fold("\n".join(lines))


def left_out(w: WhatIf) -> list[str]:
    """Every session some option could not replay to the end: the options that failed, grouped
    by their whole reason, and what the options that did finish cost on it."""
    if not w.partial:
        return []
    out = [f"left out of the sums ({len(w.partial)} sessions some option could not replay to the end):"]
    recorded = {s["name"]: s["recorded_usd"] for s in w.sessions}
    for name, done in w.partial.items():
        rec = recorded.get(name)
        out.append(f"- {name}" + (f" (recorded ${rec:,.2f})" if rec is not None else "") + ":")
        reasons: dict[str, list[str]] = {}
        for f in w.failures:
            if f["session"] == name:
                reasons.setdefault(f["reason"], []).append(_SAID.get(f["option"], f["option"]))
        for reason, options in reasons.items():
            out.append(f"    not finished by {', '.join(options)}: {reason}")
        if done:
            out.append("    finished: " + "; ".join(f"{_SAID.get(o, o)} ${c:,.2f}" for o, c in done.items()))
    return out


def table_options(w: WhatIf) -> list[Any]:
    """The options the table and the plot show alike (issue 50: the plot drew the hidden ones
    too, 13 bars beside an 11-row table)."""
    return [o for o in w.options if o.name not in w.hidden]


def _usd(x: float) -> str:
    return f"-${-x:,.2f}" if x < 0 else f"${x:,.2f}"


def plot(w: WhatIf, path: Path) -> Path | None:
    """A bar per option (cost and adjusted cost, dollars on the axis), the baseline marked;
    None when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(11, 4.5))
    options = table_options(w)
    labels = [o.label for o in options]
    ys = range(len(labels))
    ax.barh([y + 0.2 for y in ys], [o.cost_usd for o in options], height=0.4, label="cost")
    ax.barh([y - 0.2 for y in ys], [o.adjusted_usd for o in options], height=0.4, label="adjusted cost")
    ax.axvline(w.option(BASELINE).cost_usd, color="grey", linestyle="--", linewidth=1,
               label="Claude Code's way, its own TTL")
    ax.set_yticks(list(ys), labels)
    ax.invert_yaxis()
    ax.set_xlabel("dollars, summed over the sessions")
    ax.set_title(f"what {w.paired} sessions would have cost (replayed at {window_label(w.window)} window)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def write(w: WhatIf, out: Path) -> list[Path]:
    """``whatif.json`` (every number) and ``whatif.png`` in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    data = {"window": w.window, "paired": w.paired, "wall_s": w.wall_s, "sessions": w.sessions,
            "options": [{**asdict(o), "label": o.label} for o in w.options], "per_session": w.per_session,
            "skipped": w.skipped, "failures": w.failures, "partial": w.partial, "recorded": w.recorded}
    (out / "whatif.json").write_text(json.dumps(data, indent=1))
    png = plot(w, out / "whatif.png")
    return [out / "whatif.json", *([png] if png else [])]
