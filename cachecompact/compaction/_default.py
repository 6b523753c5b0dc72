"""The ``cachecompact`` strategy: the cache-aware `CacheAwareCompactor` with a `PolicyConfig`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from ..base.pricing import DEFAULT_SUMMARY_MODEL
from ..base.values import SummaryMode
from .cache_aware import CacheAwareCompactor
from .policy import PolicyConfig
from .strategy import Strategy, StrategyContext

__all__ = ["CachecompactConfig"]


@dataclass(frozen=True)
class CachecompactConfig:
    """Settings of the default strategy; ``policy`` holds every threshold (docs/policy.md)."""

    name: ClassVar[str] = "cachecompact"
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    prefix_messages: int = 3
    summary_model: str | None = DEFAULT_SUMMARY_MODEL
    summary_mode: SummaryMode = "auto"

    def build(self, ctx: StrategyContext) -> Strategy:
        c = CacheAwareCompactor(ctx, self.policy)
        c.resume()
        return c
