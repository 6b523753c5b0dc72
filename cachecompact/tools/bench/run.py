"""``cachecompact bench``: every strategy on every trace at every window, plus the closed-loop
tasks, in parallel, with a progress bar."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import xxhash

from ...base.errors import ConfigError, UnknownModelError
from ...base.pricing import get_model, model_prices
from ...compaction.catalog import strategy_names
from ..traces import Trace, TraceFormatError, default_trace_dir, discover_all, load_trace, synthetic_trace
from ._oracle import oracle_cost
from ._tasks import TaskResult, make_task, run_task
from .harness import MAX_TOKENS, TraceResult, check_strategy, replay

__all__ = ["DEFAULT_WINDOWS", "OWN_WINDOW", "TASK_SEEDS", "BenchResult", "load_corpus", "run_bench", "split_halves",
           "trace_model", "window_label"]

SYNTHETIC_CORPUS = 12
SAMPLE_PER_SET = 2  # long traces per set in the default run (`--full` runs every trace); 4 took 557 s closed loop
OWN_WINDOW = 0  # in ``windows``: each trace at its recorded model's own context window
DEFAULT_WINDOWS = (OWN_WINDOW, 200_000, 50_000)
FALLBACK_MODEL = "claude-sonnet-4-6"  # what a trace recorded on another vendor's model is priced as
TASK_SEEDS = tuple(range(1, 7))  # six closed-loop tasks
TASK_WINDOWS = (50_000,)


@dataclass
class BenchResult:
    model: str
    windows: list[int]
    strategies: list[str]
    traces: list[dict[str, Any]]  # name, source, turns, format, half, set
    results: list[TraceResult]
    oracle: dict[str, dict[str, float | None]]  # window -> trace -> billed masking oracle (None: infeasible)
    tasks: list[TaskResult] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)  # files that could not be loaded
    wall_s: float = 0.0
    corpus: str = ""
    closed_loop: bool = True  # the traces were replayed closed loop (`harness.replay`)


def trace_set(source: str, roots: Sequence[str | Path]) -> str:
    """The set a trace belongs to: the folder it lies in directly under the corpus folder it
    came from (``claude-code-2026`` of ``../shared/traces``), or its own folder's name."""
    src = Path(source).resolve()
    for root in roots:
        r = Path(root).resolve()
        if r.is_dir() and src.is_relative_to(r):
            rel = src.relative_to(r).parts
            return rel[0] if len(rel) > 1 else r.name
    return src.parent.name or "traces"


def _kind(t: Trace) -> str:
    return "claude-code" if "claude-code" in t.source or t.format.startswith("claude") else "swe"


def _groups(traces: Sequence[Trace]) -> dict[str, str]:
    """Trace name -> group: traces that are not independent share a group. Sessions resumed from
    one another share long messages; runs of one SWE-bench instance by different models share
    the instance name (union-find over both)."""
    parent = {t.name: t.name for t in traces}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    seen: dict[str, str] = {}
    for t in traces:
        keys = {"instance:" + t.name.split("/")[-1]} if _kind(t) == "swe" else set()
        for m in t.messages:
            raw = json.dumps(m, sort_keys=True)
            if len(raw) > 400:  # long messages only: short ones ("continue") are shared by chance
                keys.add(xxhash.xxh3_64_hexdigest(raw.encode()))
        for k in keys:
            if k in seen:
                parent[find(t.name)] = find(seen[k])
            else:
                seen[k] = t.name
    return {t.name: find(t.name) for t in traces}


def split_halves(traces: Sequence[Trace]) -> dict[str, str]:
    """A deterministic split into halves A (fit) and B (held out): whole groups (see `_groups`),
    per kind of agent, largest first, each to the half with fewer long traces of that kind so
    far (ties broken by a hash of the group), so both halves hold both kinds of agent."""
    group = _groups(traces)
    members: dict[tuple[str, str], list[Trace]] = {}
    for t in traces:
        members.setdefault((_kind(t), group[t.name]), []).append(t)
    out: dict[str, str] = {}
    size: dict[tuple[str, str], int] = {}
    for key in sorted(members, key=lambda g: (g[0], -sum(x.turns >= 50 for x in members[g]),
                                              xxhash.xxh3_64_hexdigest(g[1].encode()))):
        kind = key[0]
        half = "A" if size.get((kind, "A"), 0) <= size.get((kind, "B"), 0) else "B"
        size[(kind, half)] = size.get((kind, half), 0) + sum(x.turns >= 50 for x in members[key])
        for t in members[key]:
            out[t.name] = half
    return out


def sample_corpus(traces: Sequence[Trace], roots: Sequence[str | Path], per_set: int = SAMPLE_PER_SET) -> list[Trace]:
    """A representative subset: from each set (`trace_set`), ``per_set`` long traces spread
    evenly over the set's range of lengths (the shortest and the longest among them), so the
    default run covers every set in a few minutes; short traces are left out."""
    by_set: dict[str, list[Trace]] = {}
    for t in traces:
        if t.turns >= 50:
            by_set.setdefault(trace_set(t.source, roots), []).append(t)
    out: list[Trace] = []
    for members in by_set.values():
        members.sort(key=lambda t: (t.turns, t.name))
        if len(members) <= per_set:
            out += members
            continue
        step = (len(members) - 1) / (per_set - 1) if per_set > 1 else 0
        out += [members[round(k * step)] for k in range(per_set)]
    keep = {t.name for t in out}
    return [t for t in traces if t.name in keep]


def load_corpus(paths: Sequence[str | Path], synthetic: int | None = None
                ) -> tuple[list[Trace], list[dict[str, str]], str]:
    """Traces from ``paths`` (or the shared corpus, or the synthetic one); bad files are skipped
    and listed with the reason, never half-loaded."""
    if synthetic is not None or (not paths and default_trace_dir() is None):
        n = synthetic or SYNTHETIC_CORPUS
        return [synthetic_trace(s) for s in range(n)], [], f"synthetic corpus ({n} traces, seeds 0-{n - 1})"
    if not paths:
        tdir = default_trace_dir()
        assert tdir is not None
        paths = [tdir]
        label = f"shared traces ({os.path.relpath(tdir)})"
    else:
        label = ", ".join(map(str, paths))
    traces = []
    files, skipped = discover_all(list(paths))
    for f in files:
        try:
            traces.append(load_trace(f))
        except TraceFormatError as err:
            skipped.append({"file": str(f), "reason": err.reason})
        except Exception as err:  # one file's problem is never the whole run's: said, and skipped
            skipped.append({"file": str(f), "reason": f"could not be loaded ({type(err).__name__}: "
                                                      f"{' '.join(str(err).split())[:160]}); a bug, please report it"})
    return traces, skipped, label


def trace_model(trace: Trace) -> str:
    """The price-table entry a trace is priced by: the Claude model it recorded (a dated id, or
    one of a known family, priced as its family's entry), else `FALLBACK_MODEL` (the
    mini-swe-agent runs recorded other vendors' models)."""
    for name in [trace.model, *reversed([m for m in trace.models if m])]:
        if name and name != "<synthetic>":
            try:
                return model_prices(name).name if "claude" in name else FALLBACK_MODEL
            except UnknownModelError:
                continue
    return FALLBACK_MODEL


def window_label(w: int) -> str:
    return "the model's own" if w == OWN_WINDOW else f"{w:,}"


def _job(args: tuple[Trace, str, str, int, int, bool]) -> TraceResult:
    trace, strategy, model, window, key, closed = args
    r = replay(trace, strategy, model=model, window=window, closed=closed)
    r.window_key = key
    return r


def _oracle(args: tuple[Trace, str, int, int]) -> tuple[str, int, float | None]:
    trace, model, window, key = args
    o = oracle_cost(trace, get_model(model), window, MAX_TOKENS)
    return trace.name, key, (o.cost_usd if o.feasible and math.isfinite(o.cost_usd) else None)


def _task(args: tuple[int, str, str, int]) -> TaskResult:
    seed, strategy, model, window = args
    return run_task(make_task(seed), strategy, model=model, window=window)


def _progress(total: int, desc: str) -> tuple[Callable[[], None], Callable[[], None]]:
    """A tqdm bar when installed, else a plain counter on stderr."""
    try:
        from tqdm import tqdm

        bar = tqdm(total=total, desc=desc, unit="run", file=sys.stderr, dynamic_ncols=True)
        return (lambda: bar.update(1)), bar.close
    except ImportError:
        done = [0]

        def tick() -> None:
            done[0] += 1
            print(f"\r{desc}: {done[0]}/{total}", end="", file=sys.stderr, flush=True)

        return tick, lambda: print(file=sys.stderr)


def run_bench(paths: Sequence[str | Path] = (), strategies: Sequence[str] | None = None,
              model: str | None = None, windows: Sequence[int] = DEFAULT_WINDOWS,
              workers: int | None = None, progress: bool = True, synthetic: int | None = None,
              tasks: bool = True, traces: bool = True, task_seeds: Sequence[int] = TASK_SEEDS,
              full: bool = True, corpus: Sequence[Trace] | None = None, oracle_runs: bool = True,
              progress_label: str = "cachecompact bench", closed_loop: bool = True) -> BenchResult:
    """Replay traces and run the tasks under each strategy at each window (see docs/benchmarks.md).
    ``model=None`` prices each trace by its recorded model (`trace_model`); a model id prices
    them all as that one. `OWN_WINDOW` in ``windows`` runs each trace at its model's own window
    (once: where that is another window of the run, the result is shared). Without ``full``,
    the shared corpus is sampled (`sample_corpus`); given paths are always run whole; given
    ``corpus`` traces are run instead of any file. Without ``oracle_runs`` no oracle cost is
    computed (`cachecompact whatif` needs none); ``progress_label`` names the progress bar.
    ``closed_loop`` (the default) replays each trace closed loop (`harness.replay`); False
    replays the recorded replies whatever the requests showed."""
    names = list(dict.fromkeys(strategies or strategy_names()))  # each once, in the order given
    windows = list(dict.fromkeys(windows))
    for s in names:
        check_strategy(s)
    if model is not None:
        get_model(model)  # fail early on an unknown model
    if not windows or any(w < 8_000 and w != OWN_WINDOW for w in windows):
        raise ConfigError(f"windows must be at least 8000 tokens, got {list(windows)}")
    t0 = time.perf_counter()
    skipped: list[dict[str, str]]
    if corpus is not None:
        corpus, skipped, label = list(corpus), [], f"{len(corpus)} given traces"
    else:
        corpus, skipped, label = load_corpus(paths, synthetic) if traces else ([], [], "no traces")
    tdir = default_trace_dir()
    roots = list(paths) or ([tdir] if tdir is not None else [])
    if not full and not paths and synthetic is None and tdir is not None and not label.endswith("given traces"):
        n_all = len(corpus)
        corpus = sample_corpus(corpus, roots)
        label += f", a sample of {len(corpus)} of its {n_all} traces (--full runs them all)"
    if traces and not corpus:  # before any run: a typo in a path must not cost a task suite first
        why = "; ".join(f"{s['file']}: {s['reason']}" for s in skipped[:3]) + ("; ..." if len(skipped) > 3 else "")
        raise ConfigError(f"no trace could be loaded from {', '.join(map(str, paths))}"
                          + (f" ({why})" if why else " (no .json or .jsonl files there)"))
    jobs: list[tuple[Callable[..., Any], Any]] = []
    priced_as = {t.name: model or trace_model(t) for t in corpus}
    shared: list[tuple[str, int]] = []  # (trace, window): its own-window results are those of this window
    for w in windows:
        for t in corpus:
            m = priced_as[t.name]
            at = get_model(m).context_window if w == OWN_WINDOW else w
            if w == OWN_WINDOW and at in windows:
                shared.append((t.name, at))
                continue
            if oracle_runs:
                jobs.append((_oracle, (t, m, at, w)))
            jobs += [(_job, (t, s, m, at, w, closed_loop)) for s in names]
    task_model = model or FALLBACK_MODEL
    if tasks:
        jobs += [(_task, (seed, s, task_model, w)) for w in TASK_WINDOWS for seed in task_seeds for s in names]
    jobs.sort(key=lambda j: -(len(j[1][0].messages) if isinstance(j[1][0], Trace) else 120))  # long ones first
    workers = workers or min(os.cpu_count() or 1, 2)
    results: list[TraceResult] = []
    task_results: list[TaskResult] = []
    oracle: dict[str, dict[str, float | None]] = {str(w): {} for w in windows}
    tick, close = _progress(len(jobs), progress_label) if progress else (lambda: None, lambda: None)

    def take(out: Any) -> None:
        if isinstance(out, TraceResult):
            results.append(out)
        elif isinstance(out, TaskResult):
            task_results.append(out)
        else:
            name, key, cost = out
            oracle[str(key)][name] = cost
        tick()

    try:
        if workers <= 1:
            for fn, args in jobs:
                take(fn(args))
        else:
            with ProcessPoolExecutor(max_workers=workers) as pool:
                futs: list[Future[Any]] = [pool.submit(fn, args) for fn, args in jobs]
                for f in as_completed(futs):
                    take(f.result())
    finally:
        close()
    for name, at in shared:  # the own-window table shows the run at that window
        results += [replace(r, window_key=OWN_WINDOW) for r in list(results) if r.trace == name and r.window_key == at]
        oracle[str(OWN_WINDOW)][name] = oracle[str(at)].get(name)
    halves = split_halves(corpus)
    order = {(t.name, s, w): (k, i, j) for k, w in enumerate(windows) for i, t in enumerate(corpus)
             for j, s in enumerate(names)}
    results.sort(key=lambda r: order.get((r.trace, r.strategy, r.window_key), (0, 0, 0)))
    task_results.sort(key=lambda r: (r.window, r.task, names.index(r.strategy) if r.strategy in names else 0))
    return BenchResult(
        model=model or "each trace's recorded model", windows=list(windows), strategies=names,
        traces=[{"name": t.name, "source": t.source, "turns": t.turns, "format": t.format, "half": halves[t.name],
                 "set": trace_set(t.source, roots), "model": priced_as[t.name]} for t in corpus],
        results=results, oracle=oracle, tasks=task_results, skipped=skipped, wall_s=time.perf_counter() - t0,
        corpus=label, closed_loop=closed_loop)
