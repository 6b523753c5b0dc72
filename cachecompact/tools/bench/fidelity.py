"""How closely the cache simulator reproduces the usage Anthropic actually billed.

Claude Code logs record, for every API call, ``cache_read_input_tokens``,
``cache_creation_input_tokens`` and ``input_tokens``. We rebuild each call's request from
the log (the messages since the last compaction, up to the call), replay the sequence
through `CacheSimulator` with the breakpoints Claude Code used (the system prompt cached,
one breakpoint on the last message, 5-minute TTL), and compare the share of input read
from cache, call by call and per session.

Two things are not in the logs and are fitted per session by least squares on the calls'
recorded total input: the fixed unknown prefix ``P`` (system prompt + tool definitions) and
the tokenizer ratio ``k`` between Claude's tokenizer and our cl100k estimate:
``recorded_total(call) ~= P + k * estimated_messages(call)``.

The replay runs on the log's own clock as `_call_facts` reads it (issue 50): copied times
repaired, each request at the last piece of what it answers, each entry alive for its TTL from
the end of the response that read or wrote it, no gap read from a time the log lost. A call
whose hit or miss the replay does not reproduce gets a class from what the log shows around it
(`MISS_CLASSES`, `HIT_CLASSES`); the classes in `LOG_CANNOT_SHOW` are the misses nothing in the
log explains, and `SessionFidelity.cost("explained")` prices them as recorded.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...base.pricing import ModelInfo, get_model
from ...base.tokens import TokenCounter
from ...cache.simulator import CacheSimulator
from .._logs import RecordedCall, rebuild_calls, written_ttl
from ..traces.claude_code_logs import load_claude_code
from ._call_facts import CallFacts, call_facts

__all__ = ["HIT_CLASSES", "LOG_CANNOT_SHOW", "MISS_CLASSES", "CallFit", "SessionFidelity", "session_fidelity"]

# a call recorded as a miss (read share < 0.5) that the replay reads: the first class that holds
MISS_CLASSES = {
    "compaction": "Claude Code compacted since the call before (a boundary, a summary, SessionStart:compact): it "
                  "re-reads only the shared system prompt, which the fitted prefix cannot tell apart",
    "model_switch": "another model than the call before's",
    "param_change": "the effort changed, or /effort, /clear or ultra effort since the call before",
    "resume": "Claude Code started again since the call before (resume, startup or fork; /exit; another session "
              "id or version)",
    "time_lost": "the log lost this call's time or the one before's (a resumed log's copy without hook times)",
    "prefix_only_at_prompt": "at a person's prompt within the TTL, it read the system prompt and tools alone; "
                             "nothing in the log marks it",
    "prefix_only_mid_turn": "mid-turn, within the TTL, it read the system prompt and tools alone; nothing in the log "
                            "marks it",
    "cold": "it read nothing, within the TTL, with nothing in the log to mark it",
    "partial": "it read part of the messages, with nothing in the log to mark it",
}
# a call recorded as a hit that the replay misses
HIT_CLASSES = {
    "first_call": "the session's first call read a system prompt another session had cached",
    "compaction": "after Claude Code's compaction it read the shared system prompt the replay does not split off",
    "other_process": "past the TTL, but another Claude Code process (another session id) ran on the conversation "
                     "in the gap, and its requests, in another log, kept the entry alive",
    "kept_past_ttl": "it read an entry more than its TTL after the response that last used it",
    "other": "anything else",
}
# what the log cannot explain: a provider's eviction, a replica without the entry, or a change Claude Code does not log
LOG_CANNOT_SHOW = frozenset({"time_lost", "prefix_only_at_prompt", "prefix_only_mid_turn", "cold", "partial"})
_TTL_S = {"5m": 300.0, "1h": 3600.0}


@dataclass(slots=True)
class CallFit:
    index: int  # assistant message index in the trace
    recorded: dict[str, int]
    simulated: dict[str, int]
    estimated_total: int
    usage: dict[str, Any] = field(default_factory=dict)  # the call's usage as billed (output, thinking, iterations)
    ttl: str = "5m"  # the TTL its writes were billed at (`_logs.written_ttl`), on both sides
    cls: str | None = None  # where the replay's hit or miss differs from the bill: why (`MISS_CLASSES`, `HIT_CLASSES`)

    @property
    def recorded_total(self) -> int:
        return sum(self.recorded.values())

    @staticmethod
    def _share(u: dict[str, int]) -> float:
        tot = sum(u.values())
        return u["read"] / tot if tot else 0.0

    @property
    def recorded_share(self) -> float:
        return self._share(self.recorded)

    @property
    def simulated_share(self) -> float:
        return self._share(self.simulated)


@dataclass(slots=True)
class SessionFidelity:
    name: str
    model: str
    prefix_tokens: float
    ratio: float
    calls: list[CallFit] = field(default_factory=list)

    def share(self, which: str) -> float:
        tot = sum(sum(getattr(c, which).values()) for c in self.calls)
        return sum(getattr(c, which)["read"] for c in self.calls) / tot if tot else 0.0

    def cost(self, which: str) -> float:
        """Dollars for the session's calls: ``"recorded"`` as billed (`ModelInfo.cost` of each
        call's usage: writes at their recorded TTL, output with its thinking, and every
        ``usage.iterations`` step); ``"simulated"`` the same bill with the call's input, write and
        read replaced by the simulator's, written at the TTL the call wrote with (issue 50: writes
        were priced at the 5-minute rate and only the three input kinds counted); ``"explained"``
        the simulated bill with the misses the log cannot explain (`LOG_CANNOT_SHOW`) as billed;
        ``"agreed"`` with every call whose hit or miss the replay does not reproduce as billed."""
        info = get_model(self.model)
        total = 0.0
        for c in self.calls:
            billed = info.cost(c.usage) if c.usage else self._inputs(info, c.recorded, c.ttl)
            if which == "recorded" or (which == "explained" and c.recorded_share < 0.5 <= c.simulated_share
                                       and c.cls in LOG_CANNOT_SHOW) or (which == "agreed" and c.cls is not None):
                total += billed
            else:  # what the call's inputs cost as recorded, taken out; the simulator's, put in
                total += billed - self._inputs(info, c.recorded, c.ttl) + self._inputs(info, c.simulated, c.ttl)
        return total

    def gap_by_class(self) -> dict[str, float]:
        """Simulated minus billed dollars, by what the call is: its class where the replay's hit or
        miss differs from the bill (a hit-side class is prefixed ``hit:``), else ``both hit`` (the
        token estimate's error on the write) or ``both miss``. The values add up to the session's gap."""
        info = get_model(self.model)
        out: dict[str, float] = {}
        for c in self.calls:
            if c.cls is None:
                key = "both hit" if c.recorded_share >= 0.5 else "both miss"
            else:
                key = c.cls if c.recorded_share < 0.5 else f"hit:{c.cls}"
            out[key] = out.get(key, 0.0) + self._inputs(info, c.simulated, c.ttl) - self._inputs(info, c.recorded,
                                                                                                    c.ttl)
        return out

    @staticmethod
    def _inputs(info: ModelInfo, u: dict[str, int], ttl: str) -> float:
        p = info.at(u["input"] + u["write"] + u["read"])
        return (u["input"] * p.input + u["write"] * p.write_price(ttl) + u["read"] * p.read) / 1e6

    @property
    def total_fit_error(self) -> float:
        """Mean absolute relative error of the fitted total input per call."""
        errs = [abs(self.prefix_tokens + self.ratio * c.estimated_total - c.recorded_total) / c.recorded_total
                for c in self.calls if c.recorded_total]
        return statistics.fmean(errs) if errs else 0.0


def session_fidelity(path: str | Path, counter: TokenCounter | None = None) -> SessionFidelity | None:
    """Fit and replay one Claude Code session on the log's own clock (module docstring); None
    when it has fewer than 3 usable calls."""
    rs = rebuild_calls(load_claude_code(path, keep_compaction=True, repair_times=True), counter)
    if rs is None:
        return None
    facts = call_facts(path, [c.message_id for c in rs.calls])
    sim = CacheSimulator(lambda name: get_model(name).min_cacheable)
    out = SessionFidelity(rs.name, rs.model, rs.prefix, rs.ratio)
    clock = [0.0, 0.0]  # the replay's clock: the previous call's request and response times
    sent_before: float | None = None
    for n, (c, f) in enumerate(zip(rs.calls, facts, strict=True)):
        sent = max(c.request.time, f.sent or c.request.time) if c.time_known else None
        at = clock[0] + max(0.0, sent - sent_before) if n and sent is not None and sent_before is not None \
            else clock[0]
        done = at + max(0.0, f.ended - sent) if sent is not None and f.ended is not None else at
        req = c.request
        req.time, req.done = at, done
        r = sim.process(req)
        simulated = {"input": r.input_tokens, "write": r.cache_creation_input_tokens, "read": r.cache_read_input_tokens}
        fit = CallFit(c.index, c.recorded, simulated, c.estimated, c.usage, written_ttl(c.usage))
        gap = at - clock[1] if n else 0.0  # from the previous response's end
        fit.cls = _why(fit, c, f, rs.calls[n - 1] if n else None, gap, rs.prefix, n)
        out.calls.append(fit)
        clock, sent_before = [at, done], sent
    return out


def _why(fit: CallFit, c: RecordedCall, f: CallFacts, prev: RecordedCall | None, gap: float, prefix: float,
         n: int) -> str | None:
    """The class of a call whose hit or miss the replay does not reproduce (None where it does)."""
    rec, sim = fit.recorded_share >= 0.5, fit.simulated_share >= 0.5
    if rec == sim:
        return None
    if rec:  # billed a hit, replayed a miss
        if n == 0:
            return "first_call"
        if c.compaction or f.compacted:
            return "compaction"
        if gap <= _TTL_S[fit.ttl]:
            return "other"
        return "other_process" if f.resumed else "kept_past_ttl"
    if c.compaction or f.compacted:
        return "compaction"
    if prev is not None and prev.request.model != c.request.model:
        return "model_switch"
    if f.changed:
        return "param_change"
    if f.resumed:
        return "resume"
    if not c.time_known or (prev is not None and not prev.time_known):
        return "time_lost"
    read = fit.recorded["read"]
    if read == 0:
        return "cold"
    if read <= 1.1 * prefix:
        return "prefix_only_at_prompt" if c.human else "prefix_only_mid_turn"
    return "partial"


def summarize(results: list[SessionFidelity]) -> dict[str, Any]:
    """Aggregate errors over sessions (call-weighted and session-level)."""
    errs = [abs(c.recorded_share - c.simulated_share) for r in results for c in r.calls]
    agree = [(c.recorded_share >= 0.5) == (c.simulated_share >= 0.5) for r in results for c in r.calls]
    sess_err = [abs(r.share("recorded") - r.share("simulated")) for r in results]
    ratios = [r.cost("simulated") / r.cost("recorded") for r in results if r.cost("recorded")]
    return {
        "sessions": len(results),
        "calls": len(errs),
        "call_mae": statistics.fmean(errs),
        "call_median": statistics.median(errs),
        "call_p90": sorted(errs)[int(0.9 * (len(errs) - 1))],
        "hit_miss_agreement": sum(agree) / len(agree),
        # recorded mostly-miss where the documented rules predict a hit, and the reverse
        "misses_rules_cannot_explain": sum(1 for r in results for c in r.calls
                                           if c.recorded_share < 0.5 <= c.simulated_share),
        "hits_rules_cannot_explain": sum(1 for r in results for c in r.calls
                                         if c.simulated_share < 0.5 <= c.recorded_share),
        "session_mae": statistics.fmean(sess_err),
        "session_max": max(sess_err),
        "miss_classes": {k: sum(1 for r in results for c in r.calls
                                if c.cls == k and c.recorded_share < 0.5 <= c.simulated_share) for k in MISS_CLASSES},
        "hit_classes": {k: sum(1 for r in results for c in r.calls
                               if c.cls == k and c.simulated_share < 0.5 <= c.recorded_share) for k in HIT_CLASSES},
        "cost_ratio": sum(r.cost("simulated") for r in results) / sum(r.cost("recorded") for r in results),
        "session_cost_min": min(ratios) if ratios else 1.0,
        "session_cost_max": max(ratios) if ratios else 1.0,
    }
