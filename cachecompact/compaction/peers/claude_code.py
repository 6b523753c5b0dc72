"""``claude-code``: Claude Code's compaction as analysed in ../shared/docs/peers.md.

* time-based microcompact: after an idle gap longer than ``micro_gap_s`` (the cache is cold
  anyway), the results of re-runnable tools except the last ``keep_results`` are replaced by
  ``[Old tool result content cleared]``;
* auto-compaction at ``window - buffer_tokens`` (33k): everything but the message being
  answered becomes one summary, made on the cached prefix (its forked summarizer, so the
  summary call reads the conversation from cache: ``summary_mode = "prefix-reuse"``);
* every breakpoint with the 1-hour TTL, as Claude Code 2.1 writes them
  (``usage.cache_creation.ephemeral_1h_input_tokens`` in the 2026 logs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from ...base.errors import InvalidEditError
from ...base.values import SummaryMode
from ...history.ledger import ReplaceWithSummary
from ..levels import build_view
from ..strategy import LedgerStrategy, Strategy, StrategyContext, TurnReport

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

    def build(self, ctx: StrategyContext) -> Strategy:
        return ClaudeCodePolicy(ctx, self)


class ClaudeCodePolicy(LedgerStrategy):
    def __init__(self, ctx: StrategyContext, cfg: ClaudeCodeConfig | None = None) -> None:
        super().__init__(ctx)
        self.cfg = cfg or ClaudeCodeConfig()
        self.ttl: str | None = self.cfg.ttl  # the engine renders this strategy's breakpoints with it
        self.prefix_ttl: str | None = None  # the same TTL for the prefix's breakpoint
        self.threshold = ctx.window_tokens - self.cfg.buffer_tokens

    def before_request(self, now: float, model: str, max_tokens: int = 0,
                       params: dict[str, Any] | None = None) -> TurnReport:
        s = self.session
        before = self._tokens()
        report = TurnReport(before, before)
        if s.prefix_end is None:
            return report
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

    def _microcompact(self) -> None:
        s = self.session
        view = build_view(s)
        results = [r for r in view.results if r.visible and not r.edited and r.name in CC_COMPACTABLE]
        old = results[:-self.cfg.keep_results] if self.cfg.keep_results else results
        before = self._tokens()
        seqs = []
        for r in old:
            try:
                seqs.append(s.edit(ReplaceWithSummary(r.message, r.message, CLEARED, "claude-code: time-based "
                                                      "microcompact", tool_use_id=r.tool_use_id), level="L1").seq)
            except InvalidEditError:
                continue
        if seqs:
            self._emit("compaction", level="L1", reason="claude-code: time-based microcompact", tokens_before=before,
                       tokens_after=self._tokens(), entries=seqs)

    def reactive(self, reported_tokens: int, limit: int, now: float, model: str, max_tokens: int = 0) -> bool:
        s = self.session
        pe = s.prefix_end or 0
        return bool(self._summarize(pe, len(s) - 2, "L4", "claude-code: reactive, prompt too long"))
