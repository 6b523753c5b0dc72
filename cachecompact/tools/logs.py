"""``cachecompact forensics TRACE...``: the proxy's cache forensics, offline, on recorded logs.

Claude Code's session logs carry each call's billed usage. Each call is rebuilt as the
simulator sees it (`rebuild_calls`: the messages since Claude Code's last compaction or
microcompact, the unrecorded system prompt and tools as one fitted block, the breakpoint on
the last message, with the TTL the call's usage shows it wrote) and passed with its recorded
usage to the same `Forensics` engine the proxy and the middleware use. Each sub-agent
conversation (Claude Code's Agent tool, logged in ``progress`` or ``isSidechain`` entries) is
a thread of its own: another system prompt, so its own cache entries. The result says, per
class, how many misses the log holds and what they cost, and how many stay unexplained
(``provider_suspected``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import xxhash

from ..base.errors import TraceFormatError
from ..base.pricing import ModelInfo, get_model, model_prices
from ..base.tokens import TokenCounter
from ..cache.forensics import CLASSES, Finding, Forensics, snapshot_from_sim
from ..cache.simulator import SimBlock, SimRequest, message_blocks
from .traces.claude_code import load_claude_code
from .traces.model import Trace

__all__ = ["LogForensics", "RecordedCall", "RecordedSession", "fit_line", "forensics_of_log", "rebuild_calls",
           "summarize_logs", "written_ttl"]


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares intercept and slope of ys ~ a + b * xs."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return my, 1.0
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return my - b * mx, b


@dataclass(slots=True)
class RecordedCall:
    """One API call of a recorded Claude Code session, rebuilt as the simulator sees it."""

    index: int  # the assistant message that answered it
    start: int  # first message of its context (after Claude Code's last compaction)
    recorded: dict[str, int]  # input / write / read as billed
    usage: dict[str, Any]
    estimated: int  # our estimate of the messages' tokens
    request: SimRequest


@dataclass(slots=True)
class RecordedSession:
    name: str
    model: str
    prefix: float
    ratio: float
    messages: list[dict[str, Any]]
    calls: list[RecordedCall]


def written_ttl(usage: dict[str, Any]) -> str:
    """The TTL a recorded call wrote with: "1h" when its usage reports 1-hour writes only."""
    cc = usage.get("cache_creation")
    if isinstance(cc, dict) and int(cc.get("ephemeral_1h_input_tokens") or 0) > 0 \
            and not int(cc.get("ephemeral_5m_input_tokens") or 0):
        return "1h"
    return "5m"


def rebuild_calls(path: str | Path | Trace, counter: TokenCounter | None = None) -> RecordedSession | None:
    """Each call of a Claude Code log (or of one thread of it, loaded with
    ``keep_compaction=True``) as a `SimRequest`: the messages since the last compaction, a
    fitted unknown prefix (system + tools) as one block, the fitted tokenizer ratio, and the
    breakpoint Claude Code puts on the last message (see the module docstring). None when the
    log has fewer than 3 usable calls."""
    counter = counter or TokenCounter()
    trace = path if isinstance(path, Trace) else load_claude_code(path, keep_compaction=True)
    model = trace.model or "claude-sonnet-4"
    per_msg = [message_blocks(m, i, counter)[0] for i, m in enumerate(trace.messages)]
    starts = sorted(set(trace.compactions))
    raw_calls: list[tuple[int, int, dict[str, int], dict[str, Any]]] = []
    for i, (m, u) in enumerate(zip(trace.messages, trace.usage, strict=True)):
        if m["role"] != "assistant" or not u or i == 0:
            continue
        s = max((c for c in starts if c <= i - 1), default=0)
        rec = {"input": int(u.get("input_tokens") or 0), "write": int(u.get("cache_creation_input_tokens") or 0),
               "read": int(u.get("cache_read_input_tokens") or 0)}
        called = trace.models[i] if i < len(trace.models) else model
        if sum(rec.values()) and i > s and called != "<synthetic>":
            raw_calls.append((i, s, rec, u))
    if len(raw_calls) < 3:
        return None
    est = [sum(b.tokens for blocks in per_msg[s:i] for b in blocks) for i, s, _, _ in raw_calls]
    prefix, ratio = fit_line([float(x) for x in est], [float(sum(r.values())) for _, _, r, _ in raw_calls])
    prefix = max(prefix, 0.0)
    ttls = [written_ttl(u) for _, _, _, u in raw_calls]
    head_ttl = "1h" if ttls.count("1h") * 2 > len(ttls) else "5m"  # the client's TTL for its system prompt
    head = SimBlock(xxhash.xxh3_128_digest(f"{trace.name}:system+tools".encode()), round(prefix), "text", head_ttl,
                    True, "system (not recorded: system prompt and tools)")
    out = RecordedSession(trace.name, get_model(model).name, prefix, ratio, trace.messages, [])
    for (i, s, rec, u), e, ttl in zip(raw_calls, est, ttls, strict=True):
        blocks = [SimBlock(b.key, max(0, round(b.tokens * ratio)), b.kind, None, b.cacheable, b.where)
                  for blocks_ in per_msg[s:i] for b in blocks_]
        k = len(blocks) - 1
        while k >= 0 and not blocks[k].cacheable:
            k -= 1
        if k >= 0:
            b = blocks[k]
            blocks[k] = SimBlock(b.key, b.tokens, b.kind, ttl if head_ttl == "1h" else "5m", True, b.where)
        t = trace.timestamps[i - 1] or trace.timestamps[i] or 0.0
        call_model = (trace.models[i] if i < len(trace.models) else None) or model
        req = SimRequest(model=call_model, time=t, blocks=[head, *blocks], n_tools=0, n_system=1)
        out.calls.append(RecordedCall(i, s, rec, u, e, req))
    return out




@dataclass
class LogForensics:
    """Findings of one log: its main chain's calls, then each sub-agent's (``threads`` counts
    the conversations that had enough calls to judge)."""

    name: str
    calls: int
    findings: list[Finding] = field(default_factory=list)
    threads: int = 1
    subagent_calls: int = 0

    @property
    def misses(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for f in self.findings:
            if f.cls != "read_as_expected":
                out[f.cls] = out.get(f.cls, 0) + 1
        return out

    @property
    def wasted(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for f in self.findings:
            if f.cls != "read_as_expected":
                out[f.cls] = out.get(f.cls, 0.0) + f.wasted_usd
        return out


def forensics_of_log(path: str | Path, counter: TokenCounter | None = None) -> LogForensics | None:
    """Findings for every call of one Claude Code log; None when it has too few calls with usage.
    Raises `TraceFormatError` for a file that is not such a log."""
    counter = counter or TokenCounter()
    trace = load_claude_code(path, keep_compaction=True)
    rs = rebuild_calls(trace, counter)
    if rs is None:
        return None
    out = LogForensics(rs.name, 0, threads=0)
    start = next((t for t in trace.timestamps if t is not None), None)

    def prices(model: str) -> ModelInfo:  # the prices of the day the log was recorded
        return model_prices(model).as_of(start)

    for thread in [rs, *(rebuild_calls(sub, counter) for sub in trace.subagents)]:
        if thread is None:
            continue
        engine = Forensics(prices)  # a thread's cache entries are its own (another system prompt)
        body = {"messages": thread.messages}
        for c in thread.calls:
            out.findings.append(engine.observe(snapshot_from_sim(c.request, body), c.usage))
        out.calls += len(thread.calls)
        out.threads += 1
        if thread is not rs:
            out.subagent_calls += len(thread.calls)
    return out


def summarize_logs(paths: Sequence[str | Path]) -> tuple[list[LogForensics], list[dict[str, str]], dict[str, Any]]:
    """Run every log; returns the per-log results, the skipped files with reasons, and totals per
    class (misses, dollars)."""
    counter = TokenCounter()
    done: list[LogForensics] = []
    skipped: list[dict[str, str]] = []
    for p in paths:
        try:
            r = forensics_of_log(p, counter)
        except TraceFormatError as err:
            skipped.append({"file": str(p), "reason": err.reason})
            continue
        except (OSError, ValueError) as err:
            skipped.append({"file": str(p), "reason": str(err)[:200]})
            continue
        if r is None:
            skipped.append({"file": str(p), "reason": "fewer than 3 calls with recorded usage"})
            continue
        done.append(r)
    totals: dict[str, Any] = {"logs": len(done), "calls": sum(r.calls for r in done),
                              "subagent_calls": sum(r.subagent_calls for r in done),
                              "misses": {c: 0 for c in CLASSES if c != "read_as_expected"},
                              "wasted_usd": {c: 0.0 for c in CLASSES if c != "read_as_expected"}}
    for r in done:
        for k, v in r.misses.items():
            totals["misses"][k] += v
        for k, w in r.wasted.items():
            totals["wasted_usd"][k] += w
    totals["explained"] = sum(v for k, v in totals["misses"].items() if k != "provider_suspected")
    totals["unexplained"] = totals["misses"]["provider_suspected"]
    return done, skipped, totals
