"""``cachecompact bench``: every strategy on every trace, in parallel, with a progress bar."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..pricing import get_model, override
from ..traces import Trace, TraceFormatError, default_trace_dir, discover, load_trace, synthetic_trace
from .harness import MAX_TOKENS, STRATEGIES, TraceResult, replay
from .oracle import oracle_cost

__all__ = ["BenchResult", "load_corpus", "run_bench"]

SYNTHETIC_CORPUS = 12


@dataclass
class BenchResult:
    model: str
    window: int
    strategies: list[str]
    traces: list[dict[str, Any]]  # name, source, turns, format
    results: list[TraceResult]
    oracle: dict[str, float | None]  # trace -> oracle cost (None when infeasible)
    skipped: list[dict[str, str]] = field(default_factory=list)  # files that could not be loaded
    wall_s: float = 0.0
    corpus: str = ""


def load_corpus(paths: Sequence[str | Path], synthetic: int | None = None
                ) -> tuple[list[Trace], list[dict[str, str]], str]:
    """Traces from ``paths`` (or the shared corpus, or the synthetic one); bad files are skipped
    and listed with the reason, never half-loaded."""
    skipped: list[dict[str, str]] = []
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
    for f in discover(list(paths)):
        try:
            traces.append(load_trace(f))
        except TraceFormatError as err:
            skipped.append({"file": str(f), "reason": err.reason})
    return traces, skipped, label


def _job(args: tuple[Trace, str, str, int]) -> TraceResult:
    trace, strategy, model, window = args
    return replay(trace, strategy, model=model, window=window)


def _oracle(args: tuple[Trace, str, int]) -> tuple[str, float | None]:
    trace, model, window = args
    override(model, context_window=window)
    o = oracle_cost(trace, get_model(model), window, MAX_TOKENS)
    return trace.name, (o.cost_usd if o.feasible else None)


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
              model: str = "claude-sonnet-4-6", window: int = 200_000, workers: int | None = None,
              progress: bool = True, synthetic: int | None = None) -> BenchResult:
    names = list(strategies or STRATEGIES)
    unknown = [s for s in names if s not in STRATEGIES]
    if unknown:
        raise KeyError(f"unknown strategy {', '.join(unknown)}; known: {', '.join(STRATEGIES)}")
    get_model(model)  # fail early on an unknown model
    t0 = time.perf_counter()
    traces, skipped, label = load_corpus(paths, synthetic)
    jobs = [(t, s, model, window) for t in traces for s in names]
    jobs.sort(key=lambda j: -len(j[0].messages))  # longest first: better packing across workers
    workers = workers or min(os.cpu_count() or 1, 2)
    results: list[TraceResult] = []
    oracle: dict[str, float | None] = {}
    tick, close = _progress(len(jobs) + len(traces), "cachecompact bench") if progress else (lambda: None,
                                                                                              lambda: None)
    try:
        if workers <= 1:
            for t in traces:
                k, v = _oracle((t, model, window))
                oracle[k] = v
                tick()
            for j in jobs:
                results.append(_job(j))
                tick()
        else:
            with ProcessPoolExecutor(max_workers=workers) as pool:
                futs: list[Future[Any]] = [pool.submit(_oracle, (t, model, window)) for t in traces]
                futs += [pool.submit(_job, j) for j in jobs]
                for f in as_completed(futs):
                    out = f.result()
                    if isinstance(out, TraceResult):
                        results.append(out)
                    else:
                        name, cost = out
                        oracle[name] = cost
                    tick()
    finally:
        close()
    order = {(t.name, s): (i, k) for i, t in enumerate(traces) for k, s in enumerate(names)}
    results.sort(key=lambda r: order.get((r.trace, r.strategy), (0, 0)))
    return BenchResult(
        model=model, window=window, strategies=names,
        traces=[{"name": t.name, "source": t.source, "turns": t.turns, "format": t.format} for t in traces],
        results=results, oracle=oracle,
        skipped=skipped, wall_s=time.perf_counter() - t0, corpus=label)
