"""Named strategies: ``default`` (the cache-aware `Compactor`) and ``seed-pipeline``.

``seed-pipeline`` is the first design note's 4-layer pipeline, reproduced faithfully as
ledger edits so users of that design get it by name and the benchmark can compare:

1. tool_result_budget: when a message's tool results exceed 200 KB, the largest ones over
   30,000 characters go to the scratchpad (2,000-character preview) until under budget;
2. snip_compact: past 50 messages, keep the first 3 and the last 47, drop the middle;
3. micro_compact: keep the 3 most recent tool results, clear older ones over 120 characters;
4. compact_history: above the token limit, summarise everything after the first messages
   (the transcript is the backup: it is never edited);
5. reactive: on prompt-too-long, summarise and keep only the last few messages.

It runs every layer on every turn and ignores cache economics, which is the point of the
comparison: snip and micro edits move each turn, so the cached prefix breaks often.
"""

from __future__ import annotations

from typing import Any

from .compactor import Compactor, TurnReport
from .errors import InvalidEditError
from .events import Event, EventBus
from .ledger import ReplaceWithSummary, SkipRange, widen_to_pairs
from .levels import build_view, propose_tool_summary
from .policy import PolicyConfig
from .scratchpad import Scratchpad
from .session import Session
from .summarize import ExtractiveSummarizer, Summarizer, SummaryRequest, format_summary

__all__ = ["SeedPipeline", "preset"]


class SeedPipeline:
    """The first seed's pipeline (see the module docstring); same interface as `Compactor`."""

    def __init__(self, session: Session, *, limit_tokens: int = 180_000, summarizer: Summarizer | None = None,
                 scratchpad: Scratchpad | None = None, events: EventBus | None = None,
                 snip_over: int = 50, head: int = 3, tail: int = 47, keep_results: int = 3,
                 clear_over_chars: int = 120) -> None:
        self.session = session
        self.limit = limit_tokens
        self.summarizer = summarizer or ExtractiveSummarizer()
        self.scratchpad = scratchpad or Scratchpad.for_session(session.path)
        self.events = events or EventBus()
        self.snip_over, self.head, self.tail = snip_over, head, tail
        self.keep_results, self.clear_over = keep_results, clear_over_chars
        self.summary_cost = 0.0

    def _emit(self, level: str, reason: str, before: int, after: int, seqs: list[int]) -> Event:
        return self.events.emit(Event("compaction", self.session.session_id, level, reason, before, after,
                                      entries=seqs))

    def _tokens(self) -> int:
        return self.session.counter.calibrated(self.session.render(breakpoints=False).raw_tokens)

    def _try(self, edit: SkipRange | ReplaceWithSummary, level: str) -> list[int]:
        try:
            return [self.session.edit(edit, level=level).seq]
        except InvalidEditError:
            return []

    def before_request(self, now: float, model: str, max_tokens: int = 0,
                       params: dict[str, Any] | None = None) -> TurnReport:
        s = self.session
        before = self._tokens()
        report = TurnReport(before, before)
        if s.prefix_end is None:
            return report
        view = build_view(s)
        # 1. tool_result_budget (only the per-turn budget: 200 KB, results over 30,000 chars)
        p = propose_tool_summary(view, self.scratchpad, s.counter, since=view.prefix_end, big_tokens=10**9,
                                 result_chars=10**9, turn_chars=200_000, preview_chars=2_000)
        seqs = [q for e in p.edits for q in self._try(e, "L2")]
        # 2. snip_compact: keep head 3 + tail 47 messages once there are more than 50
        n = len(s)
        if n > self.snip_over:
            span = widen_to_pairs(s.transcript, max(self.head, s.prefix_end or 0), n - self.tail - 1)
            if span and span[0] <= span[1]:
                seqs += self._try(SkipRange(span[0], span[1], "snip_compact: keep head 3 and tail 47"), "L5")
        # 3. micro_compact: keep the last 3 tool results, clear older ones over 120 chars
        view = build_view(s)
        visible = [r for r in view.results if r.visible and r.message >= view.prefix_end]
        for r in visible[:-self.keep_results] if self.keep_results else visible:
            if not r.edited and r.chars > self.clear_over:
                seqs += self._try(SkipRange(r.message, r.message, "micro_compact", tool_use_id=r.tool_use_id), "L1")
        # 4. compact_history: over the limit, summarise everything after the head
        if self._tokens() > self.limit:
            seqs += self._compact_history(keep_last=self.tail)
        after = self._tokens()
        if seqs:
            self._emit("seed", "seed pipeline layers", before, after, seqs)
        report.tokens_after = after
        return report

    def _compact_history(self, keep_last: int) -> list[int]:
        s = self.session
        end = len(s) - keep_last - 1
        span = widen_to_pairs(s.transcript, s.prefix_end or 0, max(end, s.prefix_end or 0))
        if not span or span[1] >= len(s) - 1:
            return []
        msgs = [m for m in s.messages()[span[0]: span[1] + 1]]
        goal = s.messages()[0]["content"] if isinstance(s.messages()[0]["content"], str) else ""
        try:
            res = self.summarizer.summarize(SummaryRequest(msgs, goal, [], span))
        except Exception:  # the seed design has no breaker: the next turn simply tries again
            return []
        self.summary_cost += res.cost_usd
        return self._try(ReplaceWithSummary(span[0], span[1], format_summary(res.summary), "compact_history"), "L4")

    def after_response(self, now: float, usage: dict[str, Any] | None = None) -> None:
        return None

    def reactive(self, reported_tokens: int, limit: int, now: float, model: str, max_tokens: int = 0) -> bool:
        return bool(self._compact_history(keep_last=5))


def preset(name: str, session: Session, **kw: Any) -> Compactor | SeedPipeline:
    """A strategy by name: ``default`` / ``cachecompact`` or ``seed-pipeline``."""
    if name in ("default", "cachecompact"):
        cfg = kw.pop("config", None) or PolicyConfig()
        return Compactor(session, cfg, **kw)
    if name == "seed-pipeline":
        return SeedPipeline(session, **kw)
    raise ValueError(f"unknown preset {name!r}; known: default, seed-pipeline")
