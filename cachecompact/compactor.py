"""The default compaction strategy: runs the policy each turn and appends the ledger edits.

`Compactor.before_request` is called with the session synced to the agent's history, right
before the request is rendered; `after_response` records when the request ran and the
usage it reported; `reactive` handles a prompt-too-long error. Everything it does is an
`Event` (see events.py). A strategy is anything with these three methods, so the peer
strategies of the benchmark plug in the same way.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from .events import Event, EventBus
from .ledger import LedgerEntry, ReplaceWithSummary
from .levels import (
    Proposal,
    View,
    build_view,
    propose_full,
    propose_micro,
    propose_tool_summary,
    propose_truncate,
    propose_turn_collapse,
)
from .policy import LEVEL_ORDER, ContextFullError, PolicyConfig, Trigger, economics, evaluate
from .pricing import get_model
from .scratchpad import Scratchpad
from .session import Session
from .summarize import (
    ExtractiveSummarizer,
    Summarizer,
    SummaryRequest,
    format_summary,
    open_issues_of,
)
from .wire import ToolUseBlock, canonical_bytes, content_blocks, tool_result_ids

__all__ = ["Compactor", "Strategy", "TurnReport"]

REPEAT_WINDOW_S = 30.0
BodyFn = Callable[[], "dict[str, Any] | None"]


def _no_body() -> dict[str, Any] | None:
    return None


class Strategy(Protocol):
    def before_request(self, now: float, model: str, max_tokens: int = 0,
                       params: dict[str, Any] | None = None) -> TurnReport: ...

    def after_response(self, now: float, usage: dict[str, Any] | None = None) -> None: ...

    def reactive(self, reported_tokens: int, limit: int, now: float, model: str, max_tokens: int = 0) -> bool: ...


@dataclass(slots=True)
class TurnReport:
    tokens_before: int
    tokens_after: int
    events: list[Event] = field(default_factory=list)
    entries: list[LedgerEntry] = field(default_factory=list)


def _goal(session: Session) -> str:
    """The task goal: the text of the first user message."""
    if not len(session):
        return ""
    m = session.transcript[0]
    return "\n".join(getattr(b, "text", "") for b in content_blocks(m) if getattr(b, "text", None)).strip()


class Compactor:
    """Cache-aware compaction for one session (the `cachecompact` default strategy)."""

    def __init__(self, session: Session, config: PolicyConfig | None = None, *,
                 summarizer: Summarizer | None = None, scratchpad: Scratchpad | None = None,
                 events: EventBus | None = None) -> None:
        self.session = session
        self.cfg = config or PolicyConfig()
        self.summarizer: Summarizer = summarizer or ExtractiveSummarizer()
        self.scratchpad = scratchpad or Scratchpad.for_session(session.path)
        self.events = events or EventBus()
        self.steps = 0
        self.last_compact_step = 0
        self.failures = 0
        self.tripped = False
        self.last_request_at: float | None = None
        self._seen = 0
        self._pending: str | None = None
        self.summary_cost = 0.0
        self.repeats = 0
        self._calls: dict[bytes, list[float]] = {}
        self._last_estimate_raw = 0

    def resume(self) -> None:
        """Pick up a reopened session: count its steps and when it was last compacted."""
        t = self.session.transcript
        self._seen = len(t)
        asst = [i for i in range(len(t)) if t[i].role == "assistant"]
        self.steps = len(asst)
        if self.session.ledger.entries:
            at = self.session.ledger.entries[-1].transcript_len
            self.last_compact_step = sum(1 for i in asst if i < at)

    # -- bookkeeping -------------------------------------------------------------------------

    def _emit(self, kind: str, **kw: Any) -> Event:
        return self.events.emit(Event(kind=kind, session_id=self.session.session_id, **kw))

    def _observe_new(self, now: float, report: TurnReport) -> tuple[int, bool]:
        """Count steps and new user messages since the last turn; track repeated tool calls."""
        t = self.session.transcript
        start, self._seen = self._seen, len(t)
        new_user = False
        for i in range(start, len(t)):
            m = t[i]
            if m.role == "assistant":
                self.steps += 1
                for b in content_blocks(m):
                    if isinstance(b, ToolUseBlock):
                        ev = self._track_call(canonical_bytes([b.name, b.input]), now)
                        if ev is not None:
                            report.events.append(ev)
            elif not tool_result_ids(m):
                new_user = True
        return start, new_user

    def _track_call(self, key: bytes, now: float) -> Event | None:
        times = self._calls.setdefault(key, [])
        repeated = bool(times) and now - times[-1] <= REPEAT_WINDOW_S
        times.append(now)
        if not repeated:
            return None
        self.repeats += 1
        if self.repeats <= 2:
            return None
        return self._emit("repeated_tool_calls", reason=f"{self.repeats} identical tool calls within "
                                                        f"{REPEAT_WINDOW_S:.0f}s in this session",
                          detail={"call": key.decode(errors="replace")[:200]})

    def _tokens(self, view: View) -> int:
        return self.session.counter.calibrated(view.total_tokens)

    # -- levels --------------------------------------------------------------------------------

    def _propose(self, level: str, view: View, since: int) -> Proposal:
        c, ctr = self.cfg, self.session.counter
        target_raw = int(c.soft * c.limit / max(ctr.calibration, 1e-9))
        if level == "L1":
            return propose_micro(view, keep_recent=c.keep_recent_results, write_tools=c.write_tools,
                                 exempt_tools=c.exempt_tools, min_tokens=c.min_clear_tokens, is_write=c.is_write)
        if level == "L2":
            return propose_tool_summary(view, self.scratchpad, ctr, since=since, big_tokens=c.big_result_tokens,
                                        result_chars=c.result_chars_budget, turn_chars=c.turn_chars_budget,
                                        preview_chars=c.preview_chars, old_min_tokens=c.old_result_min_tokens,
                                        exempt_tools=c.exempt_tools | c.write_tools)
        if level == "L3":
            return propose_turn_collapse(view, target_tokens=target_raw, keep_rounds=c.keep_rounds_l3,
                                         summary_tokens=c.summary_tokens, min_batch_tokens=c.min_batch_tokens)
        if level == "L4":
            return propose_full(view, keep_rounds=c.keep_rounds_l4, summary_tokens=c.summary_tokens)
        return propose_truncate(view, target_tokens=target_raw)

    def _summarize(self, p: Proposal, cold: bool, body: BodyFn) -> tuple[ReplaceWithSummary, float]:
        assert p.summarize is not None
        s, e = p.summarize
        r = self.session.render(breakpoints=False)
        msgs = []
        for mi in range(r._nm):
            m = r._arr.msgs[mi]
            src = m.blocks[0].transcript_index if m.blocks else None
            if src is None and m.blocks and m.blocks[0].entry_seq is not None:
                src = self.session.ledger.entries[m.blocks[0].entry_seq].start
            if src is not None and s <= src <= e:
                msgs.append(m.d)
        prev = open_issues_of(p.previous_summary.summary or "") if p.previous_summary else []
        req = SummaryRequest(messages=msgs, goal=_goal(self.session), previous_open_issues=prev, range=(s, e),
                             body=body(), cache_warm=not cold)
        res = self.summarizer.summarize(req)
        return ReplaceWithSummary(s, e, format_summary(res.summary), f"{p.level}: {p.reason}"), res.cost_usd

    def _apply(self, p: Proposal, cold: bool, body: BodyFn) -> tuple[list[LedgerEntry], float]:
        """Append a proposal's edits (summarising first for L3/L4). Raises on failure."""
        edits = list(p.edits)
        cost = 0.0
        if p.summarize is not None:
            edit, cost = self._summarize(p, cold, body)
            edits.append(edit)
        entries = [self.session.edit(e, level=p.level) for e in edits]
        return entries, cost

    # -- the turn --------------------------------------------------------------------------------

    def before_request(self, now: float, model: str, max_tokens: int = 0,
                       params: dict[str, Any] | None = None) -> TurnReport:
        """Decide and apply this turn's compaction; raises `ContextFullError` when nothing fits."""
        report = TurnReport(0, 0)
        since, new_user = self._observe_new(now, report)
        s = self.session
        if s.prefix_end is None or not len(s):
            return report
        view = build_view(s)
        tokens0 = self._tokens(view)
        report.tokens_before = report.tokens_after = tokens0
        cfg = self.cfg
        # L2 on entry: results never sent yet, so externalizing them breaks nothing
        if not self.tripped:
            p2 = propose_tool_summary(view, self.scratchpad, s.counter, since=max(since, view.prefix_end),
                                      big_tokens=cfg.big_result_tokens, result_chars=cfg.result_chars_budget,
                                      turn_chars=cfg.turn_chars_budget, preview_chars=cfg.preview_chars,
                                      exempt_tools=cfg.exempt_tools | cfg.write_tools)
            if p2.edits:
                entries = [s.edit(e, level="L2") for e in p2.edits]
                view = build_view(s)
                report.entries += entries
                report.events.append(self._emit("externalized", level="L2", reason=p2.reason, tokens_before=tokens0,
                                                tokens_after=self._tokens(view), entries=[e.seq for e in entries]))
        tokens = self._tokens(view)
        cold = self.last_request_at is not None and now - self.last_request_at > cfg.cache_ttl_s
        share = view.tool_result_tokens / view.total_tokens if view.total_tokens else 0.0
        trig = evaluate(cfg, tokens=tokens, steps_since=self.steps - self.last_compact_step, steps=self.steps,
                        tool_share=share, new_user_message=new_user, max_tokens=max_tokens)
        if trig.max_level is None and cold and self._pending:
            trig = Trigger(self._pending, "cache is cold: applying the deferred compaction at no re-write cost")
        if trig.max_level is None:
            report.tokens_after = tokens
            return report
        if self.tripped:
            report.events.append(self._emit("skipped", reason="auto-compaction is stopped for this session "
                                                              f"after {cfg.failure_limit} consecutive failures",
                                            tokens_before=tokens, tokens_after=tokens))
            self._check_full(tokens, trig, report)
            return report
        def body() -> dict[str, Any] | None:  # the agent's request, only needed for a prefix-reuse summary
            return s.render(model=model, max_tokens=max_tokens or 1, **(params or {})).body if model else None

        tokens = self._compact(view, trig, since, cold, body, report, model)
        report.tokens_after = tokens
        self._check_full(tokens, trig, report)
        return report

    def _choose(self, view: View, trig: Trigger, since: int) -> list[Proposal]:
        """Candidates from L1 up to the trigger's level; stop at the first that reaches the target."""
        tokens = self._tokens(view)
        target = self.cfg.soft * self.cfg.limit
        out: list[Proposal] = []
        top = LEVEL_ORDER.index(trig.max_level or "L1")
        for level in LEVEL_ORDER[: top + 1]:
            p = self._propose(level, view, since)
            if p.empty:
                continue
            out.append(p)
            if tokens - self.session.counter.calibrated(p.tokens_removed) <= target:
                break
        return out

    def _compact(self, view: View, trig: Trigger, since: int, cold: bool, body: BodyFn,
                 report: TurnReport, model: str) -> int:
        s, cfg = self.session, self.cfg
        tokens = self._tokens(view)
        target = cfg.soft * cfg.limit
        cands = self._choose(view, trig, since)
        if not cands:
            if trig.forced:
                cands = [p for p in [self._propose("L5", view, since)] if not p.empty]
            if not cands:
                return tokens
        reached = [p for p in cands if tokens - s.counter.calibrated(p.tokens_removed) <= target]
        p = reached[0] if reached else max(cands, key=lambda x: x.tokens_removed)
        if cfg.cache_aware and not trig.forced and p.break_at is not None:
            price = get_model(model) if model else get_model("claude-sonnet-4-6")
            est_summary = (cfg.summary_tokens * price.output + view.total_tokens * price.read) / 1e6 \
                if p.summarize else 0.0
            econ = economics(cfg, price, removed=p.tokens_removed, suffix=view.suffix_tokens(p.break_at),
                             steps=self.steps, cold=cold, summary_cost=est_summary)
            small = not cold and p.tokens_removed < cfg.min_batch_tokens
            if small or not econ.pays:
                self._pending = p.level
                why = (f"removes {p.tokens_removed} < {cfg.min_batch_tokens} tokens" if small else
                       f"re-write ${econ.rewrite_cost:.4f} + summary ${econ.summary_cost:.4f} > saving "
                       f"${econ.saving_per_turn:.5f}/turn x {econ.remaining_turns}")
                report.events.append(self._emit("deferred", level=p.level, reason=f"{trig.reason}; {why}",
                                                tokens_before=tokens, tokens_after=tokens,
                                                detail={"net_usd": econ.net}))
                return tokens
        t0 = time.perf_counter()
        try:
            entries, cost = self._apply(p, cold, body)
        except Exception as err:  # any failure (SummaryRejected, API errors, bugs) counts for the breaker
            cost = getattr(err, "cost_usd", 0.0)
            self.summary_cost += cost
            self._fail(p.level, f"{type(err).__name__}: {err}", tokens, cost, report)
            if trig.forced and p.level != "L5":
                fallback = self._propose("L5", build_view(s), since)
                if not fallback.empty:
                    entries, _ = self._apply(fallback, cold, _no_body)
                    report.entries += entries
                    after = self._tokens(build_view(s))
                    report.events.append(self._emit("compaction", level="L5", reason=f"fallback after {p.level} "
                                                    "failed", tokens_before=tokens, tokens_after=after,
                                                    entries=[e.seq for e in entries]))
                    return after
            return tokens
        self.summary_cost += cost
        after_view = build_view(s)
        after = self._tokens(after_view)
        report.entries += entries
        if after >= tokens:
            self._fail(p.level, "no reduction", tokens, cost, report)
            return after
        self.failures = 0
        self.last_compact_step = self.steps
        self._pending = None
        report.events.append(self._emit("compaction", level=p.level, reason=f"{trig.reason}: {p.reason}",
                                        tokens_before=tokens, tokens_after=after, cost_usd=cost,
                                        duration_s=time.perf_counter() - t0, entries=[e.seq for e in entries]))
        if trig.forced and after > target and p.level != "L5":
            more = self._propose("L5", after_view, since)
            if not more.empty:
                extra, _ = self._apply(more, cold, _no_body)
                report.entries += extra
                final = self._tokens(build_view(s))
                report.events.append(self._emit("compaction", level="L5", reason="still over the target after "
                                                f"{p.level}", tokens_before=after, tokens_after=final,
                                                entries=[e.seq for e in extra]))
                return final
        return after

    def _fail(self, level: str, why: str, tokens: int, cost: float, report: TurnReport) -> None:
        self.failures += 1
        report.events.append(self._emit("failure", level=level, reason=why, tokens_before=tokens,
                                        tokens_after=tokens, cost_usd=cost,
                                        detail={"consecutive_failures": self.failures}))
        if self.failures >= self.cfg.failure_limit and not self.tripped:
            self.tripped = True
            report.events.append(self._emit("breaker_open", reason=f"{self.failures} consecutive compaction "
                                            "failures: auto-compaction is stopped for this session"))

    def _check_full(self, tokens: int, trig: Trigger, report: TurnReport) -> None:
        if trig.forced and tokens > self.cfg.full_after * self.cfg.limit:
            report.events.append(self._emit("context_full", reason="still over the limit after compaction",
                                            tokens_before=tokens, tokens_after=tokens))
            raise ContextFullError(
                f"context is full ({tokens} of {self.cfg.limit} tokens, {tokens / self.cfg.limit:.0%}) even after "
                "compaction: start a new session")

    # -- after the call, and prompt-too-long -------------------------------------------------------

    def after_response(self, now: float, usage: dict[str, Any] | None = None) -> None:
        """Record the request time (for TTL reasoning) and calibrate token estimates."""
        self.last_request_at = now
        if usage:
            total = sum(int(usage.get(k) or 0) for k in ("input_tokens", "cache_creation_input_tokens",
                                                          "cache_read_input_tokens"))
            est = self.session.render(breakpoints=False).raw_tokens
            self.session.counter.observe(est, total)

    def reactive(self, reported_tokens: int, limit: int, now: float, model: str, max_tokens: int = 0) -> bool:
        """After a prompt-too-long error: L4, then L5 if needed, until the request fits with a 5%
        margin. Returns False when nothing more can be removed."""
        s = self.session
        raw = s.render(breakpoints=False).raw_tokens
        if raw > 0:
            s.counter.calibration = max(s.counter.calibration, reported_tokens / raw)
        goal = int((limit - max_tokens) * 0.95)
        changed = False
        for level in ("L4", "L5"):
            view = build_view(s)
            tokens = self._tokens(view)
            if tokens <= goal:
                return changed
            if level == "L4":
                p = self._propose("L4", view, len(s))
            else:
                p = propose_truncate(view, target_tokens=int(goal / max(s.counter.calibration, 1e-9)))
            if p.empty:
                continue
            try:
                entries, cost = self._apply(p, True, _no_body)
            except Exception as err:  # the breaker counts it; L5 is next
                self._fail(level, f"reactive {type(err).__name__}: {err}", tokens, getattr(err, "cost_usd", 0.0),
                           TurnReport(tokens, tokens))
                continue
            self.summary_cost += cost
            changed = True
            self._emit("compaction", level=level, reason=f"prompt too long ({reported_tokens} > {limit})",
                       tokens_before=tokens, tokens_after=self._tokens(build_view(s)), cost_usd=cost,
                       entries=[e.seq for e in entries])
        return changed and self._tokens(build_view(s)) <= goal
