"""Peers that rewrite the caller's request body instead of keeping a ledger (``renders = False``).

* ``none``: the full history every turn with automatic caching (one top-level
  ``cache_control``), what most agents do today;
* ``window-20``: the naive sliding window of the last N messages; a cut that lands on tool
  results moves to the next assistant message and a marker user message goes first (the
  request must start with a user message), as Claude Code's prompt-too-long head trim does;
* ``anthropic-clear``: the API's own server-side ``clear_tool_uses_20250919`` edit, its
  trigger and ``clear_at_least`` set at the same fraction of the window as the documented
  defaults are of 200k (trigger 100k = 0.5; ``clear_at_least`` 25k = 0.125 in the ``-atleast``
  variant).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from ..strategy import Strategy, StrategyContext, TurnReport

__all__ = ["AUTO_CACHE", "AnthropicClearConfig", "BodyStrategy", "NoneConfig", "WindowConfig"]

AUTO_CACHE = {"type": "ephemeral"}
OMITTED = {"role": "user", "content": "[earlier messages omitted]"}


class BodyStrategy:
    """Rewrites the body with a function; no ledger, nothing to do before or after."""

    renders = False

    def __init__(self, ctx: StrategyContext, fn: Any) -> None:
        self.ctx = ctx
        self.fn = fn
        self.summary_cost = 0.0

    def before_request(self, now: float, model: str, max_tokens: int = 0,
                       params: dict[str, Any] | None = None) -> TurnReport:
        return TurnReport(0, 0)

    def after_response(self, now: float, usage: dict[str, Any] | None = None) -> None:
        return None

    def reactive(self, reported_tokens: int, limit: int, now: float, model: str, max_tokens: int = 0) -> bool:
        return False  # these peers have no reaction to a full window: the request fails

    def shape(self, body: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = self.fn(body)
        return out


@dataclass(frozen=True)
class NoneConfig:
    name: ClassVar[str] = "none"
    prefix_messages: int = 3
    summary_model: str | None = None
    summary_mode: str = "forced-tool"

    def build(self, ctx: StrategyContext) -> Strategy:
        return BodyStrategy(ctx, lambda body: {**body, "cache_control": AUTO_CACHE})


def _has_results(m: dict[str, Any]) -> bool:
    c = m.get("content")
    return isinstance(c, list) and any(isinstance(b, dict) and b.get("type") == "tool_result" for b in c)


@dataclass(frozen=True)
class WindowConfig:
    name: ClassVar[str] = "window"
    messages: int = 20
    prefix_messages: int = 3
    summary_model: str | None = None
    summary_mode: str = "forced-tool"

    def build(self, ctx: StrategyContext) -> Strategy:
        n = self.messages

        def transform(body: dict[str, Any]) -> dict[str, Any]:
            msgs = body["messages"]
            if len(msgs) <= n:
                return {**body, "cache_control": AUTO_CACHE}
            start = len(msgs) - n
            if msgs[start]["role"] == "user" and _has_results(msgs[start]):
                start += 1
            kept = msgs[start:]
            if kept and kept[0]["role"] == "assistant":
                kept = [OMITTED, *kept]
            return {**body, "messages": kept, "cache_control": AUTO_CACHE}
        return BodyStrategy(ctx, transform)


@dataclass(frozen=True)
class AnthropicClearConfig:
    name: ClassVar[str] = "anthropic-clear"
    trigger_fraction: float = 0.5  # 100k of a 200k window, the documented default
    keep: int = 3
    clear_at_least_fraction: float | None = None  # e.g. 0.125: 25k of a 200k window
    prefix_messages: int = 3
    summary_model: str | None = None
    summary_mode: str = "forced-tool"

    def build(self, ctx: StrategyContext) -> Strategy:
        w = ctx.window_tokens
        edit: dict[str, Any] = {"type": "clear_tool_uses_20250919",
                                "trigger": {"type": "input_tokens", "value": int(self.trigger_fraction * w)},
                                "keep": {"type": "tool_uses", "value": self.keep}}
        if self.clear_at_least_fraction:
            edit["clear_at_least"] = {"type": "input_tokens", "value": int(self.clear_at_least_fraction * w)}
        return BodyStrategy(ctx, lambda body: {**body, "context_management": {"edits": [edit]},
                                               "cache_control": AUTO_CACHE})
