"""``openhands``: OpenHands' LLMSummarizingCondenser (max_size 120 events, keep_first 4).

Once the view has more than ``max_size`` events, keep the first ``keep_first`` and the last
``max_size / 2 - keep_first - 1`` and summarise the rest together with the previous summary
(rolling). Its summarizer runs with prompt caching disabled (a forced-tool call that reads
nothing from cache). On a context-window error it condenses at once.

``window_tokens`` is not one of its settings, as in OpenHands: it condenses at ``max_size``
events, or when the API refuses a request as too long for the model's own window. So
``wrap(strategy="openhands", window_tokens=40_000)`` sends requests far over 40k tokens when
the model's window is larger; pick it for its event-count rule, not to hold a window.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from ...base.values import SummaryMode
from ..strategy import LedgerStrategy, Plan, Strategy, StrategyContext

__all__ = ["OpenHandsCondenser", "OpenHandsConfig"]


@dataclass(frozen=True)
class OpenHandsConfig:
    name: ClassVar[str] = "openhands"
    max_size: int = 120
    keep_first: int = 4
    prefix_messages: int = 4
    summary_model: str | None = None
    summary_mode: SummaryMode = "forced-tool"

    def build(self, ctx: StrategyContext) -> Strategy:
        return OpenHandsCondenser(ctx, self)


class OpenHandsCondenser(LedgerStrategy):
    def __init__(self, ctx: StrategyContext, cfg: OpenHandsConfig | None = None) -> None:
        super().__init__(ctx)
        self.cfg = cfg or OpenHandsConfig()

    def before_request(self, now: float, model: str, max_tokens: int = 0,
                       params: dict[str, Any] | None = None) -> Plan:
        s = self.draft
        before = self._tokens()
        report = Plan(before, before)
        if s.prefix_end is not None and s.render(breakpoints=False).n_messages > self.cfg.max_size:
            tail = self.cfg.max_size // 2 - self.cfg.keep_first - 1
            self._summarize(s.prefix_end, len(s) - tail - 1, "L4", "openhands: condense forgotten events")
        report.tokens_after = self._tokens()
        return report

    def reactive(self, reported_tokens: int, limit: int, now: float, model: str, max_tokens: int = 0) -> bool:
        s = self.draft
        pe = s.prefix_end or 0
        tail = self.cfg.max_size // 2 - self.cfg.keep_first - 1
        end = max(pe, min(len(s) - tail - 1, len(s) - 2))
        return bool(self._summarize(pe, end, "L4", "openhands: context window exceeded"))
