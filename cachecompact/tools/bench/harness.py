"""Replay a trace through the real SDK, wrapped with a strategy, against the in-process emulator.

The agent loop sends the full history each turn at the trace's recorded times (the
emulator's simulated clock, so idle gaps expire caches as they did); the emulator answers
with the recorded assistant messages; the recorded tool results are appended. Every
strategy, ours and the peers', comes from the one registry and runs in the same
`CompactionMiddleware`; summaries go to the emulator's summarizing model. Everything is
measured from the emulator's request log: usage, cost, context size, cache hits; the recall
probe adds evidence recall, name recall and the re-read turns lost evidence would cost.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import anthropic

from ...adapters.middleware import CompactionMiddleware, summarizer_factory
from ...adapters.sdk_errors import ContextFullError
from ...base.headers import CLOCK_HEADER
from ...base.pricing import ModelInfo, get_model
from ...compaction.catalog import get_strategy
from ..emulator import Emulator, ReplayResponder, SummarizingResponder
from ..traces import Trace
from ._agent import ClosedLoopAgent
from ._recall import RecallProbe, reread_cost

__all__ = ["IDLE_SUFFIX", "MAX_TOKENS", "RERUN_GAP_S", "TraceResult", "check_strategy", "replay", "rewrite_cost"]

MAX_TOKENS = 4096
IDLE_SUFFIX = "+idle"  # a strategy name with this ending replays with its idle compaction


def check_strategy(name: str) -> str:
    """The registered strategy a bench name stands for (``name+idle``: that strategy with its
    idle compaction replayed); `UnknownStrategyError` for none."""
    base = name.removesuffix(IDLE_SUFFIX)
    get_strategy(base)
    return base


@dataclass
class TraceResult:
    trace: str
    strategy: str
    window: int
    turns: int
    completed: bool
    failure: str | None = None
    window_key: int = -1  # the bench's window this run stands for (0: the model's own), -1: ``window``
    model: str = ""  # the prices it was billed at
    cost_usd: float = 0.0  # agent requests + summarizer calls
    summary_cost_usd: float = 0.0
    adjusted_cost_usd: float = 0.0  # cost + one re-read turn per tool result whose evidence was lost
    rereads: int = 0
    hit_rate: float = 0.0
    rewrite_usd: float = 0.0  # writing again what the previous request had cached (see `rewrite_cost`)
    cache_breaks: int = 0
    peak_tokens: int = 0
    mean_tokens: float = 0.0
    compactions: dict[str, int] = field(default_factory=dict)
    overhead_ms_per_turn: float = 0.0
    evidence_recall: float = 1.0  # at first sight: before any re-run (closed loop), as the open loop measures
    name_recall: float = 1.0
    references: int = 0
    prefix_kept: float = 1.0  # the share of requests that showed the first messages as recorded (`_recall`)
    # the closed loop (`_agent.ClosedLoopAgent`): re-run tool calls the agent made because what it needed
    # was hidden, loops (re-runs whose result came back hidden), references given up on, and whether the
    # replay ran closed loop at all (False: the open loop, ``--open-loop``)
    closed_loop: bool = False
    reruns: int = 0
    loops: int = 0
    lost: int = 0
    requests: int = 0  # agent requests sent (the recorded calls and the re-runs)
    idle_decisions: int = 0  # idle compaction: decisions made (``+idle``), and how many summarized
    idle_fired: int = 0
    cost_series: list[float] = field(default_factory=list)  # cumulative $ after each request
    token_series: list[int] = field(default_factory=list)  # input tokens of each request
    event_turns: list[tuple[int, str]] = field(default_factory=list)  # (request index, level)
    wall_s: float = 0.0
    # preserved thinking, as the emulator saw it (docs/benchmarks.md, *The columns*): requests it refused,
    # thinking blocks it dropped, blocks left out of the turns a request showed, and the thinking it issued
    # with those turns against what of it reached the model valid (reasoning kept = kept / issued)
    refused: int = 0
    thinking_dropped: int = 0
    thinking_dropped_latest: int = 0  # of those, in a request's latest assistant turn (drop_block's case)
    thinking_stripped: int = 0
    thinking_issued_tokens: int = 0
    thinking_kept_tokens: int = 0

    @property
    def reasoning_kept(self) -> float:
        return self.thinking_kept_tokens / self.thinking_issued_tokens if self.thinking_issued_tokens else 1.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _breaks(rates: list[float], window: int = 10, ratio: float = 0.8) -> int:
    n = 0
    for i in range(1, len(rates)):
        base = statistics.fmean(rates[max(0, i - window): i])
        if rates[i] < ratio * base:
            n += 1
    return n


def rewrite_cost(log: list[dict[str, Any]], price: ModelInfo) -> float:
    """Dollars an agent's requests (the emulator's log, in order) spent writing again what the
    previous request had cached: each request's cache writes beyond what it added since the
    previous one, at its own write prices. Idle expiries count too; the bench replays recorded
    gaps, so a strategy's TTL choice shows here as well as its edits."""
    out, prev = 0.0, None
    for r in log:
        u = r["usage"]
        total = r["total_input_tokens"]
        written = int(u.get("cache_creation_input_tokens") or 0)
        if prev is not None and written:
            again = max(0, written - max(0, total - prev))
            cc = u.get("cache_creation") or {}
            w1h = min(written, int(cc.get("ephemeral_1h_input_tokens") or 0))
            p = price.at(total)
            out += again * (w1h * p.write_1h + (written - w1h) * p.write_5m) / written / 1e6
        prev = total
    return out


MAX_REASON = 2000  # a failure's reason, whole: the API's message, never its first 160 characters


def api_message(err: anthropic.APIStatusError) -> str:
    """The API's own error message, whole (the SDK's ``message`` wraps it in "Error code: 400 -
    {...}", which used most of the 160 characters a reason was once cut to)."""
    body = err.body
    inner = body.get("error") if isinstance(body, dict) else None
    msg = inner.get("message") if isinstance(inner, dict) else None
    return str(msg if isinstance(msg, str) else err.message)[:MAX_REASON]


RERUN_GAP_S = 2.0  # simulated seconds a re-run turn takes (the tool and the model's short call)


def _rerun_time(at: float, nxt: float | None, k: int) -> float:
    """When the ``k``-th re-run request before the recorded call at ``at`` goes out: a couple of
    seconds apart, and always before the next recorded time, so recorded gaps stay as they were."""
    if not k:
        return at
    room = (nxt - at) if nxt is not None and nxt > at else 60.0
    return at + min(k * RERUN_GAP_S, room * k / (k + 1))


def replay(trace: Trace, strategy: str, *, model: str = "claude-sonnet-4-6", window: int = 200_000,
           idle: bool | None = None, closed: bool = True) -> TraceResult:
    """Run one trace under one strategy; never raises for a failing trace (see ``failure``).

    ``closed`` (the default) replays closed loop: the agent re-runs the call that produced what
    its next recorded call needs when the request hides it (`_agent.ClosedLoopAgent`), and the
    harness answers the re-run with the recorded result; ``closed=False`` replays every recorded
    reply whatever the request showed, and charges a notional re-read turn instead.

    ``idle`` (or a strategy name ending in `IDLE_SUFFIX`) runs the strategy's idle compaction
    between requests: where the recorded gap passes the moment the strategy wants to decide
    (`CompactionEngine.idle_due`), it decides at that moment, as the scheduler would. Every
    summary call is billed at the replay's clock: the request's time, or that moment."""
    name = strategy
    if idle is None:
        idle = strategy.endswith(IDLE_SUFFIX)
    strategy = check_strategy(strategy)  # an unknown name is an error, not a failed trace
    price = get_model(model)
    t_start = time.perf_counter()
    recorded = ReplayResponder(trace.messages, trace.usage)
    looper = ClosedLoopAgent(recorded) if closed else None
    probe = RecallProbe(recorded) if looper is None else None
    model_of_replay: ClosedLoopAgent | RecallProbe = looper if looper is not None else RecallProbe(recorded)
    if probe is not None:
        model_of_replay = probe
    res = TraceResult(trace=trace.name, strategy=name, window=window, turns=trace.turns, completed=True,
                      model=price.name, closed_loop=closed)
    clock = [0.0]  # the replay's time: summary calls carry it
    with Emulator(SummarizingResponder(model_of_replay), context_window=window) as emu:
        raw = anthropic.Anthropic(base_url=emu.url, api_key="bench", max_retries=0)
        mw = CompactionMiddleware(None, strategy=strategy, window_tokens=window,
                                  summarizer=summarizer_factory(raw, None, clock=lambda: clock[0]))
        client = raw.with_middleware(mw)
        history = [trace.messages[0]]
        model_of_replay.caller = history  # what the caller sent: the prefix the request should show (`prefix_kept`)
        i = 1
        k = 0  # re-run turns made before the recorded call at ``i``
        ledger_sizes: list[int] = []  # ledger entries after each request: when compactions happened
        try:
            while i < len(trace.messages):
                at = trace.timestamps[i - 1] or float(i)
                if idle and not k:
                    for sid, due in mw.engine.idle_due():
                        if due < at:  # the session went quiet past that moment: decide there
                            clock[0] = due
                            res.idle_decisions += 1
                            res.idle_fired += sum(d.fired for d in mw.engine.compact_idle(sid, now=due))
                when = _rerun_time(at, trace.timestamps[i] if i < len(trace.timestamps) else None, k)
                clock[0] = when
                kw: dict[str, Any] = {"model": model, "max_tokens": MAX_TOKENS, "messages": history,
                                      "extra_headers": {CLOCK_HEADER: repr(when)}}
                if trace.system:
                    kw["system"] = trace.system
                if trace.tools:
                    kw["tools"] = trace.tools
                reply = client.messages.create(**kw)
                ledger_sizes.append(sum(len(s.ledger) for s in mw.sessions()))
                content = [b.model_dump(exclude_none=True) for b in reply.content]
                history.append({"role": "assistant", "content": content})
                reruns = [b["id"] for b in content if b.get("type") == "tool_use" and looper is not None
                          and b.get("id") in looper.pending]
                if looper is not None and reruns:  # the tool executor: the recorded result, again
                    history.append({"role": "user", "content": [looper.pending.pop(r) for r in reruns]})
                    k += 1
                    continue
                if looper is not None and looper.stuck:
                    res.completed, res.failure = False, (
                        f"request {len(ledger_sizes)}: stuck: {looper.loops} re-runs came back hidden (a loop; "
                        f"the cap is {looper.loop_cap})")
                    break
                k = 0
                i += 1
                if i < len(trace.messages):
                    history.append(trace.messages[i])
                    i += 1
        except anthropic.BadRequestError as err:
            res.completed, res.failure = False, f"request {len(ledger_sizes) + 1}: API 400: {api_message(err)}"
        except ContextFullError as err:
            res.completed, res.failure = False, f"request {len(ledger_sizes) + 1}: context full: {err}"[:MAX_REASON]
        except Exception as err:  # a strategy bug is a failed trace, reported, not a crashed benchmark
            res.completed, res.failure = False, \
                f"request {len(ledger_sizes) + 1}: {type(err).__name__}: {err}"[:MAX_REASON]
        log = list(emu.requests)
        res.refused = len(emu.core.refusals)
    agent = [r for r in log if r.get("status") == 200 and not r.get("internal")]
    for r in agent:
        th = r.get("thinking") or {}
        res.thinking_dropped += int(th.get("dropped") or 0)
        res.thinking_dropped_latest += int(th.get("dropped_latest") or 0)
        res.thinking_stripped += int(th.get("stripped") or 0)
        res.thinking_issued_tokens += int(th.get("issued_tokens") or 0)
        res.thinking_kept_tokens += int(th.get("kept_of_issued") or 0)
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
    # the open loop charges a notional re-read turn per hidden source; the closed loop made its re-runs
    # for real (they are in the bill) and charges one only for what it gave up on
    notional = probe.rereads if probe is not None else looper.lost if looper is not None else []
    res.rereads = len(notional) if looper is None else looper.reruns
    extra = sum(reread_cost(price, res.token_series[n] if n < len(res.token_series) else 0, tokens)
                for n, tokens in notional)
    res.adjusted_cost_usd = res.cost_usd + extra
    reads = sum(r["usage"]["cache_read_input_tokens"] for r in agent)
    res.hit_rate = reads / max(1, sum(r["total_input_tokens"] for r in agent))
    res.rewrite_usd = rewrite_cost(agent, price)
    res.cache_breaks = _breaks(rates)
    res.peak_tokens = max(res.token_series, default=0)
    res.mean_tokens = statistics.fmean(res.token_series) if res.token_series else 0.0
    measured = looper or probe
    assert measured is not None
    res.evidence_recall, res.name_recall, res.references = measured.recall, measured.name_recall, measured.references
    answered = measured.requests if isinstance(measured, ClosedLoopAgent) else len(measured.per_request)
    res.prefix_kept = measured.prefix_kept / answered if answered else 1.0
    res.requests = len(agent)
    if looper is not None:
        res.reruns, res.loops, res.lost = looper.reruns, looper.loops, len(looper.lost)
    res.overhead_ms_per_turn = 1000 * mw.overhead_s / max(1, len(agent))
    for ev in mw.events.history:
        if ev.kind in ("compaction", "externalized") and ev.level:
            res.compactions[ev.level] = res.compactions.get(ev.level, 0) + 1
    levels = [e.level for s in mw.sessions() for e in s.ledger.entries]
    prev_n = 0
    for k, n in enumerate(ledger_sizes):
        for lvl in sorted(set(levels[prev_n:n])):
            res.event_turns.append((k, lvl))
        prev_n = n
    prev = 0
    for k, r in enumerate(agent):  # server-side clearing (the anthropic-clear peers)
        c = r.get("cleared_tool_uses", 0)
        if c > prev:
            res.compactions["server-clear"] = res.compactions.get("server-clear", 0) + 1
            res.event_turns.append((k, "server-clear"))
        prev = c
    res.wall_s = time.perf_counter() - t_start
    return res
