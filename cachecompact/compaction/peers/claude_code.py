"""``claude-code``: Claude Code's compaction as analysed in ../shared/docs/peers.md.

* time-based microcompact: after an idle gap longer than ``micro_gap_s`` (the cache is cold
  anyway), the results of re-runnable tools except the last ``keep_results`` are replaced by
  ``[Old tool result content cleared]``;
* auto-compaction at ``window - buffer_tokens`` (33k): everything but the message being
  answered becomes one summary, made on the cached prefix (its forked summarizer, so the
  summary call reads the conversation from cache: ``summary_mode = "prefix-reuse"``);
* every breakpoint with the 1-hour TTL, as Claude Code 2.1 writes them
  (``usage.cache_creation.ephemeral_1h_input_tokens`` in the 2026 logs);
* idle compaction (Claude Code 2.1.286+, when the replay turns it on: ``bench``/``whatif``
  ``claude-code+idle``): about 55 minutes after a reply that called no tool, a context of at
  least 200k tokens (``CLAUDE_CODE_IDLE_COMPACT_MIN_TOKENS``) is summarized whole, as
  auto-compaction does, on its clock rather than by price (../shared/docs/anthropic-cache-facts.md,
  2026-12-02 addendum). The summary's edit is appended by the next request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, cast

from ...base.errors import InvalidEditError
from ...base.values import TTL, IdleDecision, SummaryMode
from ...history.ledger import ReplaceWithSummary, widen_to_pairs
from ..levels import build_view
from ..strategy import LedgerStrategy, Plan, Strategy, StrategyContext, summarize_range

__all__ = ["CC_COMPACTABLE", "ClaudeCodeConfig", "ClaudeCodePolicy"]

CC_COMPACTABLE = frozenset({"Read", "Bash", "Grep", "Glob", "WebSearch", "WebFetch", "Edit", "Write",
                            "bash", "read_file", "grep", "edit_file", "str_replace_editor"})
CLEARED = "[Old tool result content cleared]"


@dataclass(frozen=True)
class ClaudeCodeConfig:
    name: ClassVar[str] = "claude-code"
    buffer_tokens: int = 33_000  # auto-compaction fires at window - buffer
    keep_results: int = 5
    micro_gap_s: float = 3600.0
    prefix_messages: int = 1
    summary_model: str | None = None  # the agent's own model
    summary_mode: SummaryMode = "prefix-reuse"
    ttl: str = "1h"  # the cache TTL of its breakpoints
    idle_after_s: float = 55 * 60.0  # idle compaction: this long after the last reply that called no tool
    idle_min_tokens: int = 200_000  # ... of a context at least this big (CLAUDE_CODE_IDLE_COMPACT_MIN_TOKENS)

    def build(self, ctx: StrategyContext) -> Strategy:
        return ClaudeCodePolicy(ctx, self)


class ClaudeCodePolicy(LedgerStrategy):
    def __init__(self, ctx: StrategyContext, cfg: ClaudeCodeConfig | None = None) -> None:
        super().__init__(ctx)
        self.cfg = cfg or ClaudeCodeConfig()
        # every request is rendered with this TTL, the prefix's breakpoint too (its plan says so)
        self.ttl = cast(TTL, self.cfg.ttl)
        self.threshold = ctx.window_tokens - self.cfg.buffer_tokens
        self._idle_edit: ReplaceWithSummary | None = None  # an idle summary the next request appends
        self._idle_at: float | None = None  # the request time of the quiet period it was decided in

    def before_request(self, now: float, model: str, max_tokens: int = 0,
                       params: dict[str, Any] | None = None) -> Plan:
        s = self.draft
        before = self._tokens()
        report = Plan(before, before, ttl=self.ttl)
        if s.prefix_end is None:
            return report
        if self._idle_edit is not None:
            edit, self._idle_edit = self._idle_edit, None
            try:
                entry = s.stage(edit, level="L4")
                self._emit("compaction", level="L4", reason=edit.reason, tokens_before=before,
                           tokens_after=self._tokens(), entries=[entry.seq], detail={"idle": True})
            except InvalidEditError as err:
                self._emit("failure", level="L4", reason=f"claude-code idle compaction: {err}")
        if self.last_request_at is not None and now - self.last_request_at > self.cfg.micro_gap_s:
            self._microcompact()
        if self._tokens() >= self.threshold:
            # the summary covers everything but the message the next call answers
            last_user = max(i for i in range(len(s)) if s.transcript[i].role == "user")
            if last_user - 1 >= s.prefix_end:
                body = s.render(model=model, max_tokens=max_tokens or 1, **(params or {})).body if model else None
                self._summarize(s.prefix_end, last_user - 1, "L4", "claude-code: auto-compact", body=body,
                                cache_warm=True)
        report.tokens_after = self._tokens()
        return report

    def idle_due(self) -> float | None:
        if self.last_request_at is None or self._idle_edit is not None or self._idle_at == self.last_request_at \
                or self._tokens() < self.cfg.idle_min_tokens:
            return None
        return self.last_request_at + self.cfg.idle_after_s

    def idle(self, now: float, model: str, max_tokens: int, body: dict[str, Any] | None, *,
             away_s: float | None = None) -> IdleDecision:
        """The whole conversation summarized on Claude Code's clock (no price weighed)."""
        s = self.draft
        sid = s.session_id
        tokens = self._tokens()
        if self.last_request_at is None or s.prefix_end is None or self._idle_at == self.last_request_at:
            return IdleDecision(session_id=sid, at=now, fired=False, reason="claude-code: nothing to decide")
        self._idle_at = self.last_request_at
        if tokens < self.cfg.idle_min_tokens:
            return IdleDecision(session_id=sid, at=now, fired=False, reason=f"claude-code: {tokens} tokens < "
                                f"{self.cfg.idle_min_tokens}", tokens_before=tokens, tokens_after=tokens)
        span = widen_to_pairs(s.transcript, s.prefix_end, len(s) - 1)
        if span is None or span[1] < span[0]:
            return IdleDecision(session_id=sid, at=now, fired=False, reason="claude-code: nothing to summarize")
        warm = now - self.last_request_at <= (3600.0 if self.ttl == "1h" else 300.0)
        try:
            edit, res = summarize_range(s, span[0], span[1], self.summarizer, reason="claude-code: idle compaction",
                                        body=body, cache_warm=warm)
        except Exception as err:  # a peer's summarizer failed: count it and go on
            cost = getattr(err, "cost_usd", 0.0)
            self.summary_cost += cost
            self._emit("failure", level="L4", reason=f"claude-code idle: {type(err).__name__}: {err}", cost_usd=cost)
            return IdleDecision(session_id=sid, at=now, fired=False, reason=f"claude-code: {err}", cost_usd=cost)
        self.summary_cost += res.cost_usd
        self._idle_edit = edit
        self._emit("idle_summary", level="L4", reason="claude-code: idle compaction", tokens_before=tokens,
                   cost_usd=res.cost_usd)
        return IdleDecision(session_id=sid, at=now, fired=True, reason="claude-code: idle compaction", level="L4",
                            cost_usd=res.cost_usd, tokens_before=tokens)

    def _microcompact(self) -> None:
        s = self.draft
        view = build_view(s)
        results = [r for r in view.results if r.visible and not r.edited and r.name in CC_COMPACTABLE]
        old = results[:-self.cfg.keep_results] if self.cfg.keep_results else results
        before = self._tokens()
        seqs = []
        for r in old:
            try:
                seqs.append(s.stage(ReplaceWithSummary(r.message, r.message, CLEARED, "claude-code: time-based "
                                                      "microcompact", tool_use_id=r.tool_use_id), level="L1").seq)
            except InvalidEditError:
                continue
        if seqs:
            self._emit("compaction", level="L1", reason="claude-code: time-based microcompact", tokens_before=before,
                       tokens_after=self._tokens(), entries=seqs)

    def reactive(self, reported_tokens: int, limit: int, now: float, model: str, max_tokens: int = 0) -> bool:
        s = self.draft
        pe = s.prefix_end or 0
        return bool(self._summarize(pe, len(s) - 2, "L4", "claude-code: reactive, prompt too long"))
