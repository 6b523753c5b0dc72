"""Peer strategies, modelled from ../shared/docs/peers.md on the same cost model as ours.

* `BodyMiddleware` rewrites the request body directly (what those systems do):
  ``none`` (automatic caching, no compaction), ``window-20`` (the last 20 messages) and
  ``anthropic-clear`` (server-side ``clear_tool_uses_20250919``, trigger 100k, keep 3, with
  or without ``clear_at_least``).
* `OpenHandsCondenser` and `ClaudeCodePolicy` are `Strategy` objects run by the
  `CompactionMiddleware`, so they compact through ledger edits like ours; only *what* they
  decide differs. See docs/benchmarks.md for each model's assumptions.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from anthropic import Middleware
from anthropic._middleware import CallNext
from anthropic._request import APIRequest
from anthropic._response import APIResponse

from ..compactor import TurnReport
from ..errors import InvalidEditError
from ..events import Event, EventBus
from ..ledger import ReplaceWithSummary, widen_to_pairs
from ..levels import build_view
from ..session import Session
from ..summarize import Summarizer, SummaryRequest, format_summary, open_issues_of

__all__ = ["BodyMiddleware", "ClaudeCodePolicy", "OpenHandsCondenser", "anthropic_clear", "none", "window"]

CC_COMPACTABLE = frozenset({"Read", "Bash", "Grep", "Glob", "WebSearch", "WebFetch", "Edit", "Write",
                            "bash", "read_file", "grep", "edit_file", "str_replace_editor"})
AUTO = {"type": "ephemeral"}


class BodyMiddleware(Middleware):
    """Applies ``transform(body) -> body`` to every ``POST /v1/messages``; times itself."""

    def __init__(self, transform: Callable[[dict[str, Any]], dict[str, Any]], name: str) -> None:
        self.transform = transform
        self.name = name
        self.overhead_s = 0.0

    def handle(self, request: APIRequest, call_next: CallNext) -> APIResponse[Any]:
        if request.url.split("?", 1)[0] != "/v1/messages" or not isinstance(request.json, dict):
            return call_next(request)
        t0 = time.perf_counter()
        body = self.transform(dict(request.json))
        self.overhead_s += time.perf_counter() - t0
        return call_next(request.copy(body=body))


def none(body: dict[str, Any]) -> dict[str, Any]:
    """No compaction; automatic caching (one top-level cache_control), as most agents do now."""
    return {**body, "cache_control": AUTO}


OMITTED = {"role": "user", "content": "[earlier messages omitted]"}


def window(n: int) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The naive sliding window: the last ``n`` messages. A cut that lands on tool results moves
    to the next assistant message, and a marker user message is put first (the request must
    start with a user message), as Claude Code's prompt-too-long head trim does."""
    def transform(body: dict[str, Any]) -> dict[str, Any]:
        msgs = body["messages"]
        if len(msgs) <= n:
            return {**body, "cache_control": AUTO}
        start = len(msgs) - n
        if msgs[start]["role"] == "user" and _has_results(msgs[start]):
            start += 1
        kept = msgs[start:]
        if kept and kept[0]["role"] == "assistant":
            kept = [OMITTED, *kept]
        return {**body, "messages": kept, "cache_control": AUTO}
    return transform


def _has_results(m: dict[str, Any]) -> bool:
    c = m.get("content")
    return isinstance(c, list) and any(isinstance(b, dict) and b.get("type") == "tool_result" for b in c)


def anthropic_clear(trigger: int = 100_000, keep: int = 3, clear_at_least: int | None = None
                    ) -> Callable[[dict[str, Any]], dict[str, Any]]:
    edit: dict[str, Any] = {"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens", "value": trigger},
                            "keep": {"type": "tool_uses", "value": keep}}
    if clear_at_least:
        edit["clear_at_least"] = {"type": "input_tokens", "value": clear_at_least}

    def transform(body: dict[str, Any]) -> dict[str, Any]:
        return {**body, "context_management": {"edits": [edit]}, "cache_control": AUTO}
    return transform


class _LedgerPeer:
    """Shared plumbing for peers that compact through our session and ledger."""

    def __init__(self, session: Session, summarizer: Summarizer, events: EventBus | None = None) -> None:
        self.session = session
        self.summarizer = summarizer
        self.events = events or EventBus()
        self.summary_cost = 0.0
        self.last_request_at: float | None = None

    def _tokens(self) -> int:
        return self.session.counter.calibrated(self.session.render(breakpoints=False).raw_tokens)

    def _summarize_range(self, start: int, end: int, level: str, reason: str) -> list[int]:
        s = self.session
        span = widen_to_pairs(s.transcript, start, end)
        if span is None or span[1] < span[0]:
            return []
        prev = next((e for e in s.ledger.effective() if e.kind == "summary" and e.start == span[0]), None)
        body = s.render(breakpoints=False).body
        msgs = [m for m in s.messages()[span[0]: span[1] + 1]]
        first = s.messages()[0]["content"]
        goal = first if isinstance(first, str) else " ".join(b.get("text", "") for b in first if isinstance(b, dict))
        req = SummaryRequest(msgs, goal, open_issues_of(prev.summary or "") if prev else [], span, body=body)
        before = self._tokens()
        t0 = time.perf_counter()
        try:
            res = self.summarizer.summarize(req)
            entry = s.edit(ReplaceWithSummary(span[0], span[1], format_summary(res.summary), reason), level=level)
        except Exception as err:  # peers have their own (weaker) failure handling; count and go on
            self.events.emit(Event("failure", s.session_id, level, f"{type(err).__name__}: {err}"))
            return []
        self.summary_cost += res.cost_usd
        self.events.emit(Event("compaction", s.session_id, level, reason, before, self._tokens(), res.cost_usd,
                               time.perf_counter() - t0, [entry.seq]))
        return [entry.seq]

    def after_response(self, now: float, usage: dict[str, Any] | None = None) -> None:
        self.last_request_at = now

    def reactive(self, reported_tokens: int, limit: int, now: float, model: str, max_tokens: int = 0) -> bool:
        pe = self.session.prefix_end or 0
        return bool(self._summarize_range(pe, len(self.session) - 2, "L4", "reactive: prompt too long"))


class OpenHandsCondenser(_LedgerPeer):
    """OpenHands LLMSummarizingCondenser (max_size 120 events, keep_first 4): once the view has
    more than ``max_size`` events, keep the first ``keep_first`` and the last
    ``max_size/2 - keep_first - 1`` and summarise the rest together with the previous summary
    (rolling). Its summarizer runs with prompt caching disabled."""

    def __init__(self, session: Session, summarizer: Summarizer, events: EventBus | None = None,
                 max_size: int = 120, keep_first: int = 4) -> None:
        super().__init__(session, summarizer, events)
        self.max_size, self.keep_first = max_size, keep_first

    def before_request(self, now: float, model: str, max_tokens: int = 0,
                       params: dict[str, Any] | None = None) -> TurnReport:
        s = self.session
        before = self._tokens()
        report = TurnReport(before, before)
        view_len = len(s.render(breakpoints=False).body["messages"])
        if view_len > self.max_size and s.prefix_end is not None:
            tail = self.max_size // 2 - self.keep_first - 1
            self._summarize_range(s.prefix_end, len(s) - tail - 1, "L4", "openhands: condense forgotten events")
        report.tokens_after = self._tokens()
        return report


class ClaudeCodePolicy(_LedgerPeer):
    """Claude Code as analysed in peers.md: time-based microcompact (idle > ``micro_gap_s``,
    keep the last 5 results of re-runnable tools, placeholder text) and auto-compaction at
    ``window - 33k`` with a full summary made on the cached prefix (its forked summarizer)."""

    def __init__(self, session: Session, summarizer: Summarizer, events: EventBus | None = None,
                 window_tokens: int = 200_000, buffer_tokens: int = 33_000, keep_results: int = 5,
                 micro_gap_s: float = 3600.0) -> None:
        super().__init__(session, summarizer, events)
        self.threshold = window_tokens - buffer_tokens
        self.keep_results, self.micro_gap_s = keep_results, micro_gap_s

    def before_request(self, now: float, model: str, max_tokens: int = 0,
                       params: dict[str, Any] | None = None) -> TurnReport:
        s = self.session
        before = self._tokens()
        report = TurnReport(before, before)
        if s.prefix_end is None:
            return report
        if self.last_request_at is not None and now - self.last_request_at > self.micro_gap_s:
            self._microcompact()
        if self._tokens() >= self.threshold:
            # the summary covers everything but the message the next call answers
            last_user = max(i for i in range(len(s)) if s.transcript[i].role == "user")
            self._summarize_range(s.prefix_end, last_user - 1, "L4", "claude-code: auto-compact")
        report.tokens_after = self._tokens()
        return report

    def _microcompact(self) -> None:
        s = self.session
        view = build_view(s)
        results = [r for r in view.results if r.visible and not r.edited and r.name in CC_COMPACTABLE
                   and r.message >= view.prefix_end]
        old = results[:-self.keep_results] if self.keep_results else results
        before = self._tokens()
        seqs = []
        for r in old:
            text = "[Old tool result content cleared]"
            try:
                seqs.append(s.edit(ReplaceWithSummary(r.message, r.message, text, "claude-code: time-based "
                                                      "microcompact", tool_use_id=r.tool_use_id), level="L1").seq)
            except InvalidEditError:
                continue
        if seqs:
            self.events.emit(Event("compaction", s.session_id, "L1", "claude-code: time-based microcompact",
                                   before, self._tokens(), entries=seqs))
