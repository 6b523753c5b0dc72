"""Peers that rewrite the caller's request body instead of keeping a ledger (`BodyShaper`).

* ``none``: the full history every turn with automatic caching (one top-level
  ``cache_control``), what most agents do today;
* ``window-20``: the naive sliding window of the last N messages; a cut that lands on tool
  results moves to the next assistant message and a marker user message goes first (the
  request must start with a user message), as Claude Code's prompt-too-long head trim does;
* ``anthropic-clear``: the API's own server-side ``clear_tool_uses_20250919`` edit as its docs
  configure it: the documented default trigger, 100,000 input tokens, whatever the window, and
  ``keep`` 3 tool uses; ``clear_at_least`` has no default (anthropic-cache-facts.md §2). Named
  variants sweep the trigger (``anthropic-clear-50k``, ``-200k``), set ``clear_at_least`` to
  25k (``-atleast``), or scale the trigger to the window as the bench once did (``-scaled``:
  half of it, the share 100k is of 200k);
* ``anthropic-compact``: the API's own server compaction, ``compact_20260112`` under its beta
  header (anthropic-cache-facts.md §3): the documented default trigger, 150,000 input tokens,
  whatever the window (the documented minimum is 50,000), with the breakpoint the docs
  recommend at the end of the system prompt. The response's ``compaction`` block goes back with
  the history, as the docs tell a client, and the API drops everything before it. Named variants
  sweep the trigger (``anthropic-compact-50k``, ``-100k``, ``-300k``, ``-500k``: its knob
  frontier) or scale it (``-scaled``: 75% of the window, at least 50k). A trigger that leaves
  no room below the window (50k at a 50k window) fails its run, and the bench counts it;
* ``masking``: observation masking as in "The Complexity Trap" (Lindenbauer et al.,
  DL4C@NeurIPS 2025, arXiv 2508.21433; peers.md §7): the tool results of the last M = 10
  turns stay verbatim, older ones become the placeholder of SWE-agent's
  ``LastNObservations`` processor, on which the paper builds (``Old environment output: (K
  lines omitted)``); the agent's reasoning and actions stay, the first message is never
  masked. It does not look at the window (the paper's rule is a turn count).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from ...base.values import SummaryMode
from ..strategy import Plan, Strategy, StrategyContext

__all__ = ["AUTO_CACHE", "CLEAR_DEFAULT_TRIGGER", "COMPACT_DEFAULT_TRIGGER", "AnthropicClearConfig",
           "AnthropicCompactConfig", "BodyStrategy", "MaskingConfig",
           "NoneConfig", "WindowConfig"]

AUTO_CACHE = {"type": "ephemeral"}
OMITTED = {"role": "user", "content": "[earlier messages omitted]"}


class BodyStrategy:
    """Rewrites the body with a function; no ledger, nothing to do before or after. ``betas``
    are beta headers the rewritten request needs: each plan carries them (the adapters add them
    to ``anthropic-beta``)."""

    def __init__(self, ctx: StrategyContext, fn: Any, betas: tuple[str, ...] = ()) -> None:
        self.ctx = ctx
        self.fn = fn
        self.betas = betas
        self.summary_cost = 0.0

    def before_request(self, now: float, model: str, max_tokens: int = 0,
                       params: dict[str, Any] | None = None) -> Plan:
        return Plan(0, 0, betas=self.betas)

    def after_response(self, now: float, usage: dict[str, Any] | None = None) -> None:
        return None

    def reactive(self, reported_tokens: int, limit: int, now: float, model: str, max_tokens: int = 0) -> bool:
        return False  # these peers have no reaction to a full window: the request fails

    def shape(self, body: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = self.fn(body)
        return out


@dataclass(frozen=True)
class NoneConfig:
    """No compaction: the whole history each turn, cached by the top-level breakpoint."""

    name: ClassVar[str] = "none"
    prefix_messages: int = 3
    summary_model: str | None = None
    summary_mode: SummaryMode = "forced-tool"
    ttl: str = "5m"  # the breakpoint's TTL ("none@1h": the same history, cached for an hour)

    def build(self, ctx: StrategyContext) -> Strategy:
        marker = AUTO_CACHE if self.ttl == "5m" else {**AUTO_CACHE, "ttl": self.ttl}
        return BodyStrategy(ctx, lambda body: {**body, "cache_control": marker})


def _has_results(m: dict[str, Any]) -> bool:
    c = m.get("content")
    return isinstance(c, list) and any(isinstance(b, dict) and b.get("type") == "tool_result" for b in c)


@dataclass(frozen=True)
class WindowConfig:
    name: ClassVar[str] = "window"
    messages: int = 20
    prefix_messages: int = 3
    summary_model: str | None = None
    summary_mode: SummaryMode = "forced-tool"

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


CLEAR_DEFAULT_TRIGGER = 100_000  # clear_tool_uses_20250919's documented default: anthropic-cache-facts.md §2


@dataclass(frozen=True)
class AnthropicClearConfig:
    """Server-side tool-result clearing. ``trigger_tokens`` is absolute, as the API takes it (the
    documented default, 100k); ``trigger_fraction``, when set, replaces it with that share of
    the window (the ``-scaled`` extra). ``clear_at_least_tokens`` likewise (no documented default)."""

    name: ClassVar[str] = "anthropic-clear"
    trigger_tokens: int = CLEAR_DEFAULT_TRIGGER
    trigger_fraction: float | None = None
    keep: int = 3
    clear_at_least_tokens: int | None = None
    prefix_messages: int = 3
    summary_model: str | None = None
    summary_mode: SummaryMode = "forced-tool"

    def trigger(self, window: int) -> int:
        return round(self.trigger_fraction * window) if self.trigger_fraction is not None else self.trigger_tokens

    def build(self, ctx: StrategyContext) -> Strategy:
        w = ctx.window_tokens
        edit: dict[str, Any] = {"type": "clear_tool_uses_20250919",
                                "trigger": {"type": "input_tokens", "value": self.trigger(w)},
                                "keep": {"type": "tool_uses", "value": self.keep}}
        if self.clear_at_least_tokens:
            at_least = (self.clear_at_least_tokens if self.trigger_fraction is None else
                        round(self.clear_at_least_tokens * w / 200_000))
            edit["clear_at_least"] = {"type": "input_tokens", "value": at_least}
        return BodyStrategy(ctx, lambda body: {**body, "context_management": {"edits": [edit]},
                                               "cache_control": AUTO_CACHE})


COMPACT_BETA = "compact-2026-01-12"
COMPACT_DEFAULT_TRIGGER = 150_000  # compact_20260112's documented default: anthropic-cache-facts.md §3.1
COMPACT_MIN_TRIGGER = 50_000


def _system_marked(system: Any) -> Any:
    """The system prompt with a breakpoint on its last block (what the compaction docs advise)."""
    if isinstance(system, str) and system:
        return [{"type": "text", "text": system, "cache_control": AUTO_CACHE}]
    if isinstance(system, list) and system and isinstance(system[-1], dict):
        return [*system[:-1], {**system[-1], "cache_control": AUTO_CACHE}]
    return system


@dataclass(frozen=True)
class AnthropicCompactConfig:
    """Server-side threshold compaction. ``trigger_tokens`` is absolute, as the API takes it (the
    documented default, 150k); ``trigger_fraction``, when set, replaces it with that share of the
    window (the ``-scaled`` extra); never under the documented minimum, 50k."""

    name: ClassVar[str] = "anthropic-compact"
    trigger_tokens: int = COMPACT_DEFAULT_TRIGGER
    trigger_fraction: float | None = None
    prefix_messages: int = 3
    summary_model: str | None = None
    summary_mode: SummaryMode = "forced-tool"

    def trigger(self, window: int) -> int:
        want = round(self.trigger_fraction * window) if self.trigger_fraction is not None else self.trigger_tokens
        return max(COMPACT_MIN_TRIGGER, want)

    def build(self, ctx: StrategyContext) -> Strategy:
        trigger = {"type": "input_tokens", "value": self.trigger(ctx.window_tokens)}
        edit = {"type": "compact_20260112", "trigger": trigger}

        def transform(body: dict[str, Any]) -> dict[str, Any]:
            out = {**body, "context_management": {"edits": [edit]}, "cache_control": AUTO_CACHE}
            if "system" in body:
                out["system"] = _system_marked(body["system"])
            return out
        return BodyStrategy(ctx, transform, betas=(COMPACT_BETA,))


MASKED = "Old environment output: ({n} lines omitted)"  # SWE-agent's LastNObservations text


def _masked(block: dict[str, Any]) -> dict[str, Any]:
    c = block.get("content")
    texts = [c] if isinstance(c, str) else [x.get("text", "") for x in c or [] if isinstance(x, dict)]
    images = sum(1 for x in (c if isinstance(c, list) else []) if isinstance(x, dict) and x.get("type") == "image")
    text = MASKED.format(n=sum(len(t.splitlines()) for t in texts if isinstance(t, str)))
    if images:
        text += f" ({images} images omitted)"
    return {k: v for k, v in block.items() if k != "cache_control"} | {"content": text}


@dataclass(frozen=True)
class MaskingConfig:
    name: ClassVar[str] = "masking"
    turns: int = 10  # M: the turns whose observations stay verbatim
    prefix_messages: int = 3
    summary_model: str | None = None
    summary_mode: SummaryMode = "forced-tool"

    def build(self, ctx: StrategyContext) -> Strategy:
        m = self.turns

        def transform(body: dict[str, Any]) -> dict[str, Any]:
            msgs = body["messages"]
            observed = [i for i, x in enumerate(msgs) if i > 0 and x.get("role") == "user" and _has_results(x)]
            old = set(observed[:-m]) if m else set(observed)
            if not old:
                return {**body, "cache_control": AUTO_CACHE}
            out = [{**x, "content": [_masked(b) if isinstance(b, dict) and b.get("type") == "tool_result" else b
                                     for b in x["content"]]} if i in old else x for i, x in enumerate(msgs)]
            return {**body, "messages": out, "cache_control": AUTO_CACHE}
        return BodyStrategy(ctx, transform)
