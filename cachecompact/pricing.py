"""Per-model prices, cache minimums and windows, from the prompt-caching docs (late 2026).

Prices are dollars per million tokens. Every value can be overridden: `register` a
`ModelInfo` (or `replace` one) and every cost computed afterwards uses it. Model ids with a
date suffix (``claude-sonnet-4-20250514``) and the older ``claude-3-5-haiku`` spelling
resolve to the same entry.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, replace
from typing import Any

from .errors import UnknownModelError

__all__ = ["ModelInfo", "UnknownModelError", "cost_of", "get_model", "known_models", "register"]


@dataclass(frozen=True, slots=True)
class ModelInfo:
    name: str
    input: float  # $ / MTok
    write_5m: float
    write_1h: float
    read: float
    output: float
    min_cacheable: int  # tokens; shorter prefixes are not cached and no error is returned
    context_window: int
    max_output: int

    def __post_init__(self) -> None:
        for f in ("input", "write_5m", "write_1h", "read", "output"):
            if getattr(self, f) < 0:
                raise ValueError(f"{self.name}: {f} price must be >= 0")
        if self.min_cacheable < 0 or self.context_window <= 0 or self.max_output <= 0:
            raise ValueError(f"{self.name}: token limits must be positive")

    def cost(self, usage: dict[str, Any]) -> float:
        """Dollars for one response's usage (cache_creation split used when present)."""
        cc = usage.get("cache_creation") or {}
        w1h = int(cc.get("ephemeral_1h_input_tokens") or 0)
        w5m = int(cc.get("ephemeral_5m_input_tokens") or 0)
        total_w = int(usage.get("cache_creation_input_tokens") or 0)
        if not cc:
            w5m = total_w
        return (int(usage.get("input_tokens") or 0) * self.input
                + w5m * self.write_5m + w1h * self.write_1h
                + int(usage.get("cache_read_input_tokens") or 0) * self.read
                + int(usage.get("output_tokens") or 0) * self.output) / 1e6


def _m(name: str, price: tuple[float, float, float, float, float], minimum: int, window: int, out: int) -> ModelInfo:
    return ModelInfo(name, *price, min_cacheable=minimum, context_window=window, max_output=out)


_OPUS = (5.0, 6.25, 10.0, 0.50, 25.0)
_OPUS_OLD = (15.0, 18.75, 30.0, 1.50, 75.0)
_SONNET = (3.0, 3.75, 6.0, 0.30, 15.0)
_SONNET5 = (2.0, 2.50, 4.0, 0.20, 10.0)
_HAIKU45 = (1.0, 1.25, 2.0, 0.10, 5.0)
_HAIKU35 = (0.80, 1.0, 1.60, 0.08, 4.0)
_FABLE51 = (10.0, 12.50, 20.0, 0.25, 50.0)
_FABLE5 = (10.0, 12.50, 20.0, 1.0, 50.0)
M, K = 1_000_000, 1000

# Windows and max output: model overview pages where the fact sheet has them; Opus 4.6 max
# output and Opus 4.1/4 values are not in the sheet (UNCONFIRMED, set from the model family).
_TABLE: dict[str, ModelInfo] = {m.name: m for m in [
    _m("claude-opus-5", _OPUS, 512, M, 128 * K),
    _m("claude-opus-4-8", _OPUS, 1024, M, 128 * K),
    _m("claude-opus-4-7", _OPUS, 2048, M, 128 * K),
    _m("claude-opus-4-6", _OPUS, 4096, M, 128 * K),
    _m("claude-opus-4-5", _OPUS, 4096, 200 * K, 64 * K),
    _m("claude-opus-4-1", _OPUS_OLD, 1024, 200 * K, 32 * K),
    _m("claude-opus-4", _OPUS_OLD, 1024, 200 * K, 32 * K),
    _m("claude-sonnet-5", _SONNET5, 1024, M, 128 * K),
    _m("claude-sonnet-4-6", _SONNET, 1024, M, 64 * K),
    _m("claude-sonnet-4-5", _SONNET, 1024, 200 * K, 64 * K),
    _m("claude-sonnet-4", _SONNET, 1024, 200 * K, 64 * K),
    _m("claude-haiku-4-5", _HAIKU45, 4096, 200 * K, 64 * K),
    _m("claude-haiku-3-5", _HAIKU35, 2048, 200 * K, 8192),
    _m("claude-fable-5-1", _FABLE51, 512, M, 128 * K),
    _m("claude-mythos-5-1", _FABLE51, 512, M, 128 * K),
    _m("claude-fable-5", _FABLE5, 512, M, 128 * K),
    _m("claude-mythos-5", _FABLE5, 512, M, 128 * K),
]}
_ALIASES = {"claude-3-5-haiku": "claude-haiku-3-5", "claude-opus-4-0": "claude-opus-4",
            "claude-sonnet-4-0": "claude-sonnet-4"}
_LOCK = threading.Lock()
_DATE = re.compile(r"-(\d{8}|latest)$")


def _canonical(model: str) -> str:
    name = _DATE.sub("", model.strip().lower())
    return _ALIASES.get(name, name)


def get_model(model: str) -> ModelInfo:
    """The entry for a model id, alias or dated id; raises `UnknownModelError`."""
    info = _TABLE.get(_canonical(model))
    if info is None:
        raise UnknownModelError(f"unknown model {model!r}; known: {', '.join(sorted(_TABLE))} "
                                "(add one with cachecompact.pricing.register)")
    return info


def register(info: ModelInfo, *aliases: str) -> None:
    """Add or replace a model entry (user overrides take effect everywhere)."""
    with _LOCK:
        _TABLE[_canonical(info.name)] = info
        for a in aliases:
            _ALIASES[_canonical(a)] = _canonical(info.name)


def override(model: str, **changes: Any) -> ModelInfo:
    """Change some fields of an existing entry, e.g. ``override("claude-sonnet-4-6", read=0.25)``."""
    info = replace(get_model(model), **changes)
    register(info)
    return info


def known_models() -> list[str]:
    return sorted(_TABLE)


def cost_of(model: str, usage: dict[str, Any]) -> float:
    return get_model(model).cost(usage)
