"""``seed-pipeline``: the first design note's 4-layer pipeline, reproduced as ledger edits.

1. tool_result_budget: when a message's tool results exceed 200 KB, the largest ones over
   30,000 characters are shortened (2,000-character preview) until under budget;
2. snip_compact: past 50 messages, keep the first 3 and the last 47, drop the middle;
3. micro_compact: keep the 3 most recent tool results, clear older ones over 120 characters;
4. compact_history: above the token limit, summarise everything after the first messages
   (the transcript is the backup: it is never edited);
5. reactive: on prompt-too-long, summarise and keep only the last few messages.

It runs every layer on every turn and ignores cache economics, which is the point of the
comparison: snip and micro edits move each turn, so the cached prefix breaks often. Its
limit is the window minus the seed's 10% margin.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from ...base.errors import InvalidEditError
from ...base.values import SummaryMode
from ...history.ledger import ReplaceWithSummary, SkipRange, widen_to_pairs
from ..levels import build_view, propose_entry_summary, results_since
from ..strategy import LedgerStrategy, Plan, Strategy, StrategyContext

__all__ = ["SeedPipeline", "SeedPipelineConfig"]


@dataclass(frozen=True)
class SeedPipelineConfig:
    name: ClassVar[str] = "seed-pipeline"
    snip_over: int = 50
    head: int = 3
    tail: int = 47
    keep_results: int = 3
    clear_over_chars: int = 120
    result_chars: int = 30_000
    turn_chars: int = 200_000
    preview_chars: int = 2_000
    margin_fraction: float = 0.10
    prefix_messages: int = 3
    summary_model: str | None = "claude-haiku-4-5"
    summary_mode: SummaryMode = "forced-tool"

    def build(self, ctx: StrategyContext) -> Strategy:
        return SeedPipeline(ctx, self)


class SeedPipeline(LedgerStrategy):
    """The first seed's pipeline (see the module docstring)."""

    def __init__(self, ctx: StrategyContext, cfg: SeedPipelineConfig | None = None) -> None:
        super().__init__(ctx)
        self.cfg = cfg or SeedPipelineConfig()
        self.limit = int(ctx.window_tokens * (1 - self.cfg.margin_fraction))
        self._seen = 0

    def _try(self, edit: SkipRange | ReplaceWithSummary, level: str) -> list[int]:
        try:
            return [self.draft.stage(edit, level=level).seq]
        except InvalidEditError:
            return []

    def before_request(self, now: float, model: str, max_tokens: int = 0,
                       params: dict[str, Any] | None = None) -> Plan:
        s, c = self.draft, self.cfg
        before = self._tokens()
        report = Plan(before, before)
        since, self._seen = self._seen, len(s)
        if s.prefix_end is None:
            return report
        # 1. tool_result_budget: per message 200 KB, results over 30,000 characters
        new = [r for r in results_since(s, since) if r.chars > c.result_chars]
        chars = {m: sum(r.chars for r in results_since(s, since) if r.message == m) for m in {r.message for r in new}}
        over = [r for r in new if chars[r.message] > c.turn_chars]
        seqs: list[int] = []
        if over:
            p = propose_entry_summary(over, False, s.counter, big_tokens=0, turn_tokens=10**12,
                                      preview_chars=c.preview_chars)
            seqs += [q for e in p.edits for q in self._try(e, "L2")]
        # 2. snip_compact: keep head 3 + tail 47 messages once there are more than 50
        n = len(s)
        if n > c.snip_over:
            span = widen_to_pairs(s.transcript, max(c.head, s.prefix_end or 0), n - c.tail - 1)
            if span and span[0] <= span[1]:
                seqs += self._try(SkipRange(span[0], span[1], "snip_compact: keep head 3 and tail 47"), "L5")
        # 3. micro_compact: keep the last 3 tool results, clear older ones over 120 chars
        view = build_view(s)
        visible = [r for r in view.results if r.visible]
        for r in visible[:-c.keep_results] if c.keep_results else visible:
            if not r.edited and r.chars > c.clear_over_chars:
                seqs += self._try(SkipRange(r.message, r.message, "micro_compact", tool_use_id=r.tool_use_id), "L1")
        # 4. compact_history: over the limit, summarise everything after the head
        if self._tokens() > self.limit:
            seqs += self._compact_history(keep_last=c.tail)
        after = self._tokens()
        if seqs:
            self._emit("compaction", level="seed", reason="seed pipeline layers", tokens_before=before,
                       tokens_after=after, entries=seqs)
        report.tokens_after = after
        return report

    def _compact_history(self, keep_last: int) -> list[int]:
        s = self.draft
        end = len(s) - keep_last - 1
        span = widen_to_pairs(s.transcript, s.prefix_end or 0, max(end, s.prefix_end or 0))
        if not span or span[1] >= len(s) - 1:
            return []
        return self._summarize(span[0], span[1], "L4", "compact_history")

    def reactive(self, reported_tokens: int, limit: int, now: float, model: str, max_tokens: int = 0) -> bool:
        return bool(self._compact_history(keep_last=5))
