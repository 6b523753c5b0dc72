"""Replay a trace through the real SDK, wrapped with a strategy, against the in-process emulator.

The agent loop sends the full history each turn at the trace's recorded times (the
emulator's simulated clock, so idle gaps expire caches as they did); the emulator answers
with the recorded assistant messages; the recorded tool results are appended. Everything is
measured from the emulator's request log: usage, cost, context size, cache hits.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import anthropic

from ..compactor import Strategy
from ..emulator import CLOCK_HEADER, Emulator, ReplayResponder, SummarizingResponder
from ..events import EventBus
from ..middleware import CompactionMiddleware
from ..policy import ContextFullError, PolicyConfig
from ..pricing import override
from ..session import Session
from ..summarize import LLMSummarizer, Summarizer
from ..traces import Trace
from .peers import BodyMiddleware, ClaudeCodePolicy, OpenHandsCondenser, anthropic_clear, none, window
from .recall import RecallProbe

__all__ = ["STRATEGIES", "TraceResult", "replay"]

MAX_TOKENS = 4096


@dataclass
class TraceResult:
    trace: str
    strategy: str
    turns: int
    completed: bool
    failure: str | None = None
    cost_usd: float = 0.0  # agent requests + summarizer calls
    summary_cost_usd: float = 0.0
    hit_rate: float = 0.0
    cache_breaks: int = 0
    peak_tokens: int = 0
    mean_tokens: float = 0.0
    compactions: dict[str, int] = field(default_factory=dict)
    overhead_ms_per_turn: float = 0.0
    recall: float = 1.0
    references: int = 0
    cost_series: list[float] = field(default_factory=list)  # cumulative $ after each request
    token_series: list[int] = field(default_factory=list)  # input tokens of each request
    event_turns: list[tuple[int, str]] = field(default_factory=list)  # (request index, level)
    wall_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _summarizer(client: anthropic.Anthropic, model: str, mode: str) -> LLMSummarizer:
    return LLMSummarizer(client, model=model, mode=mode, extra_headers={"x-cachecompact-internal": "1"})  # type: ignore[arg-type]


PeerFactory = Callable[[Session, Summarizer, EventBus, int], Strategy]


def _ledger(strategy: str | PeerFactory, *, summ_model: str | None, mode: str, prefix: int = 3,
            config: Callable[[PolicyConfig], PolicyConfig] | None = None) -> Callable[..., Any]:
    def make(client: anthropic.Anthropic, model: str, window: int) -> CompactionMiddleware:
        cfg = PolicyConfig(window_tokens=window, margin_tokens=window // 10)
        chosen: Any = strategy
        if not isinstance(strategy, str):
            factory = strategy

            def chosen(s: Session, summ: Summarizer, ev: EventBus) -> Strategy:
                return factory(s, summ, ev, window)
        return CompactionMiddleware(store_dir=None, config=config(cfg) if config else cfg, strategy=chosen,
                                    summarizer=_summarizer(client, summ_model or model, mode),
                                    prefix_messages=prefix)
    return make


def _body(transform: Callable[[dict[str, Any]], dict[str, Any]], name: str) -> Callable[..., Any]:
    def make(client: anthropic.Anthropic, model: str, window: int) -> BodyMiddleware:
        return BodyMiddleware(transform, name)
    return make


STRATEGIES: dict[str, Callable[..., Any]] = {
    "none": _body(none, "none"),
    "window-20": _body(window(20), "window-20"),
    "seed-pipeline": _ledger("seed-pipeline", summ_model="claude-haiku-4-5", mode="forced-tool"),
    "anthropic-clear": _body(anthropic_clear(), "anthropic-clear"),
    "anthropic-clear-atleast": _body(anthropic_clear(clear_at_least=25_000), "anthropic-clear-atleast"),
    "openhands": _ledger(lambda s, summ, ev, w: OpenHandsCondenser(s, summ, ev), summ_model=None,
                         mode="forced-tool", prefix=4),
    "claude-code": _ledger(lambda s, summ, ev, w: ClaudeCodePolicy(s, summ, ev, window_tokens=w),
                           summ_model=None, mode="prefix-reuse", prefix=1),
    "cachecompact": _ledger("default", summ_model="claude-haiku-4-5", mode="auto"),
    "cachecompact-no-econ": _ledger("default", summ_model="claude-haiku-4-5", mode="auto",
                                    config=lambda c: replace(c, cache_aware=False)),
}


def _breaks(rates: list[float], window: int = 10, ratio: float = 0.8) -> int:
    n = 0
    for i in range(1, len(rates)):
        base = statistics.fmean(rates[max(0, i - window): i])
        if rates[i] < ratio * base:
            n += 1
    return n


def replay(trace: Trace, strategy: str, *, model: str = "claude-sonnet-4-6", window: int = 200_000) -> TraceResult:
    """Run one trace under one strategy; never raises for a failing trace (see ``failure``)."""
    if strategy not in STRATEGIES:
        raise KeyError(f"unknown strategy {strategy!r}; known: {', '.join(STRATEGIES)}")
    override(model, context_window=window)
    t_start = time.perf_counter()
    probe = RecallProbe(ReplayResponder(trace.messages))
    res = TraceResult(trace=trace.name, strategy=strategy, turns=trace.turns, completed=True)
    with Emulator(SummarizingResponder(probe)) as emu:
        raw = anthropic.Anthropic(base_url=emu.url, api_key="bench", max_retries=0)
        mw = STRATEGIES[strategy](raw, model, window)
        client = raw.with_middleware(mw)
        history = [trace.messages[0]]
        i = 1
        ledger_sizes: list[int] = []  # ledger entries after each request: when compactions happened

        def ledger_size() -> int:
            return sum(len(x.session.ledger) for x in mw._live.values()) if isinstance(mw, CompactionMiddleware) else 0
        try:
            while i < len(trace.messages):
                kw: dict[str, Any] = {"model": model, "max_tokens": MAX_TOKENS, "messages": history,
                                      "extra_headers": {CLOCK_HEADER: repr(trace.timestamps[i - 1] or float(i))}}
                if trace.system:
                    kw["system"] = trace.system
                if trace.tools:
                    kw["tools"] = trace.tools
                reply = client.messages.create(**kw)
                ledger_sizes.append(ledger_size())
                history.append({"role": "assistant",
                                "content": [b.model_dump(exclude_none=True) for b in reply.content]})
                i += 1
                if i < len(trace.messages):
                    history.append(trace.messages[i])
                    i += 1
        except anthropic.BadRequestError as err:
            res.completed, res.failure = False, f"API 400: {str(err.message)[:160]}"
        except ContextFullError as err:
            res.completed, res.failure = False, f"context full: {err}"
        except Exception as err:  # a strategy bug is a failed trace, reported, not a crashed benchmark
            res.completed, res.failure = False, f"{type(err).__name__}: {err}"[:200]
        log = list(emu.requests)
    agent = [r for r in log if r.get("status") == 200 and not r.get("internal")]
    internal = [r for r in log if r.get("status") == 200 and r.get("internal")]
    res.summary_cost_usd = sum(r["cost_usd"] for r in internal)  # what the emulator billed the summarizer
    total = 0.0
    rates = []
    for r in agent:
        total += r["cost_usd"]
        res.cost_series.append(total)
        res.token_series.append(r["total_input_tokens"])
        u = r["usage"]
        t = u["input_tokens"] + u["cache_read_input_tokens"] + u["cache_creation_input_tokens"]
        rates.append(u["cache_read_input_tokens"] / t if t else 0.0)
    res.cost_usd = total + res.summary_cost_usd
    reads = sum(r["usage"]["cache_read_input_tokens"] for r in agent)
    res.hit_rate = reads / max(1, sum(r["total_input_tokens"] for r in agent))
    res.cache_breaks = _breaks(rates)
    res.peak_tokens = max(res.token_series, default=0)
    res.mean_tokens = statistics.fmean(res.token_series) if res.token_series else 0.0
    res.recall, res.references = probe.recall, probe.references
    overhead = getattr(mw, "overhead_s", 0.0)
    res.overhead_ms_per_turn = 1000 * overhead / max(1, len(agent))
    if isinstance(mw, CompactionMiddleware):
        for ev in mw.events.history:
            if ev.kind in ("compaction", "externalized") and ev.level:
                res.compactions[ev.level] = res.compactions.get(ev.level, 0) + 1
        levels = [e.level for x in mw._live.values() for e in x.session.ledger.entries]
        prev_n = 0
        for k, n in enumerate(ledger_sizes):
            for lvl in sorted(set(levels[prev_n:n])):
                res.event_turns.append((k, lvl))
            prev_n = n
    else:
        prev = 0
        for k, r in enumerate(agent):
            c = r.get("cleared_tool_uses", 0)
            if c > prev:
                res.compactions["server-clear"] = res.compactions.get("server-clear", 0) + 1
                res.event_turns.append((k, "server-clear"))
            prev = c
    res.wall_s = time.perf_counter() - t_start
    return res
