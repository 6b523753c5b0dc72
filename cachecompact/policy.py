"""When to compact, how far, and whether it pays: triggers and cache economics (pure).

Utilization is the rendered request's tokens over the limit (window minus margin, default
200k - 20k = 180k). Triggers set the highest level allowed this turn; the compactor then
tries levels from L1 upwards and takes the first whose estimated result is under the soft
threshold (or the one that removes most, if none is). Every edit that changes bytes already
sent must pay for the cache re-write it causes (see `economics`), unless the window forces it
or the cache is cold anyway. docs/policy.md states the model and its parameters.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .errors import ContextFullError, PolicyConfigError
from .levels.micro import DEFAULT_WRITE_TOOLS
from .pricing import ModelInfo

__all__ = ["ContextFullError", "Economics", "PolicyConfig", "PolicyConfigError", "Trigger", "economics", "evaluate"]

LEVEL_ORDER = ("L1", "L2", "L3", "L4", "L5")


@dataclass(frozen=True)
class PolicyConfig:
    """Every threshold of the default policy. Fractions are of ``window - margin``."""

    window_tokens: int = 200_000
    margin_tokens: int = 20_000
    soft: float = 0.70  # L1 (with enough steps since the last compaction); also the target after compaction
    hard: float = 0.85  # L3
    critical: float = 0.95  # L4; the window forces edits from here on
    full_after: float = 0.90  # still above this after compacting: ContextFullError
    min_steps_l1: int = 5
    tool_share: float = 0.60  # tool output share of the context that triggers L2/L1 ...
    tool_share_min_steps: int = 8  # ... after this many steps
    tool_share_min_utilization: float = 0.0  # ... and at least this utilization
    big_result_tokens: int = 10_000  # a single result this big is externalized on entry (L2)
    result_chars_budget: int = 30_000  # per-result character budget (the first seed's tool_result_budget)
    turn_chars_budget: int = 200_000  # per-turn budget for all results of one message
    preview_chars: int = 2_000
    old_result_min_tokens: int = 2_000  # L2 on old results (tool-share trigger): only results this big
    keep_recent_results: int = 3  # L1 keeps this many most recent results verbatim
    min_clear_tokens: int = 300  # L1 clears only results well above their placeholder (recall vs saving)
    keep_rounds_l3: int = 8
    keep_rounds_l4: int = 4
    summary_tokens: int = 1_500  # planning estimate of a summary's size
    write_tools: frozenset[str] = DEFAULT_WRITE_TOOLS
    exempt_tools: frozenset[str] = frozenset()
    is_write: Callable[[str, dict[str, Any]], bool] | None = None
    cache_ttl_s: float = 300.0
    min_remaining_turns: int = 5  # expected remaining turns = steps so far, clamped to these bounds
    max_remaining_turns: int = 50
    min_batch_tokens: int = 8_000  # an edit that breaks a warm cache must remove at least this much
    cache_aware: bool = True  # False: apply whatever the triggers ask, ignoring cache economics
    failure_limit: int = 3
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        def bad(msg: str) -> None:
            raise PolicyConfigError(f"invalid PolicyConfig: {msg}")

        if self.window_tokens <= 0 or self.margin_tokens < 0 or self.margin_tokens >= self.window_tokens:
            bad(f"need window_tokens > margin_tokens >= 0 (got {self.window_tokens}, {self.margin_tokens})")
        if not 0 < self.soft < self.hard < self.critical <= 1:
            bad(f"need 0 < soft < hard < critical <= 1 (got {self.soft}, {self.hard}, {self.critical})")
        if not self.soft <= self.full_after <= 1:
            bad(f"need soft <= full_after <= 1 (got {self.full_after})")
        if not 0 < self.tool_share <= 1:
            bad(f"tool_share must be in (0, 1], got {self.tool_share}")
        if not 0 <= self.tool_share_min_utilization <= self.soft:
            bad(f"tool_share_min_utilization must be in [0, soft], got {self.tool_share_min_utilization}")
        for name in ("min_steps_l1", "tool_share_min_steps", "big_result_tokens", "result_chars_budget",
                     "turn_chars_budget", "preview_chars", "old_result_min_tokens", "keep_recent_results",
                     "min_clear_tokens", "keep_rounds_l3", "keep_rounds_l4", "summary_tokens", "min_remaining_turns",
                     "max_remaining_turns", "min_batch_tokens", "failure_limit"):
            if getattr(self, name) < 0:
                bad(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.failure_limit < 1:
            bad("failure_limit must be at least 1")
        if self.min_remaining_turns > self.max_remaining_turns:
            bad("min_remaining_turns > max_remaining_turns")
        if self.cache_ttl_s <= 0:
            bad("cache_ttl_s must be positive")
        if self.preview_chars > self.result_chars_budget:
            bad("preview_chars must not exceed result_chars_budget")

    @property
    def limit(self) -> int:
        return self.window_tokens - self.margin_tokens


@dataclass(frozen=True, slots=True)
class Trigger:
    """Why compaction runs this turn, and the highest level it may use."""

    max_level: str | None
    reason: str
    forced: bool = False  # the window forces it: cache economics do not apply


def evaluate(cfg: PolicyConfig, *, tokens: int, steps_since: int, steps: int, tool_share: float,
             new_user_message: bool, max_tokens: int = 0) -> Trigger:
    """The multi-signal triggers; ``tokens`` are API-calibrated estimates of the next request."""
    u = tokens / cfg.limit
    if u >= cfg.critical or tokens + max_tokens > cfg.window_tokens:
        return Trigger("L4", f"utilization {u:.2f} >= {cfg.critical} (critical)", forced=True)
    if u >= cfg.hard:
        return Trigger("L3", f"utilization {u:.2f} >= {cfg.hard} (hard)")
    if u >= cfg.soft and new_user_message:
        return Trigger("L1", f"new user message at utilization {u:.2f}")
    if u >= cfg.soft and steps_since >= cfg.min_steps_l1:
        return Trigger("L1", f"utilization {u:.2f} >= {cfg.soft} with {steps_since} steps since the last compaction")
    if tool_share > cfg.tool_share and steps >= cfg.tool_share_min_steps and u >= cfg.tool_share_min_utilization:
        return Trigger("L2", f"tool output is {tool_share:.0%} of the context after {steps} steps")
    return Trigger(None, f"utilization {u:.2f}: nothing to do")


@dataclass(frozen=True, slots=True)
class Economics:
    """Dollars: what an edit costs now (cache re-write, summary call) and saves later."""

    rewrite_cost: float
    saving_per_turn: float
    remaining_turns: int
    summary_cost: float = 0.0

    @property
    def net(self) -> float:
        return self.saving_per_turn * self.remaining_turns - self.rewrite_cost - self.summary_cost

    @property
    def pays(self) -> bool:
        return self.net > 0


def economics(cfg: PolicyConfig, price: ModelInfo, *, removed: int, suffix: int, steps: int, cold: bool,
              summary_cost: float = 0.0, ttl: str = "5m") -> Economics:
    """The cache model of docs/policy.md.

    Without the edit the next request reads the ``suffix`` (tokens from the edit point to the
    end) from cache; with it, ``suffix - removed`` is written instead. From then on every turn
    reads ``removed`` fewer tokens. A cold cache is re-written anyway, so the edit is free.
    """
    write = price.write_1h if ttl == "1h" else price.write_5m
    rewrite = 0.0 if cold else max(0.0, ((suffix - removed) * write - suffix * price.read) / 1e6)
    remaining = max(cfg.min_remaining_turns, min(cfg.max_remaining_turns, steps))
    return Economics(rewrite, removed * price.read / 1e6, remaining, summary_cost)
