"""One registry of compaction strategies, ours and the peers', used by `wrap`, the proxy, the
benchmark and the CLI alike.

A strategy is registered by name with its config: ``register("my-strategy", MyConfig())``.
The config is a frozen dataclass with ``prefix_messages``, ``summary_model``,
``summary_mode`` and ``build(ctx) -> Strategy``; the `Strategy` protocol is the extension
point (see `base`).
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

from ..errors import UnknownStrategyError
from ..policy import Economics, PolicyConfig
from ..strategy import LedgerStrategy, Strategy, StrategyConfig, StrategyContext, TurnReport, summarize_range, task_goal
from .body import AnthropicClearConfig, AnthropicCompactConfig, MaskingConfig, NoneConfig, WindowConfig
from .cachecompact import CachecompactConfig
from .claude_code import ClaudeCodeConfig
from .openhands import OpenHandsConfig
from .seed import SeedPipelineConfig

__all__ = [
    "AnthropicClearConfig",
    "CachecompactConfig",
    "ClaudeCodeConfig",
    "LedgerStrategy",
    "NoneConfig",
    "OpenHandsConfig",
    "SeedPipelineConfig",
    "Strategy",
    "StrategyConfig",
    "StrategyContext",
    "TurnReport",
    "WindowConfig",
    "get_strategy",
    "register",
    "strategy_names",
    "summarize_range",
    "task_goal",
    "with_policy",
]

_LOCK = threading.Lock()
_REGISTRY: dict[str, Any] = {
    "cachecompact": CachecompactConfig(),
    "cachecompact-no-econ": CachecompactConfig(policy=PolicyConfig(economics=Economics(cache_aware=False))),
    "none": NoneConfig(),
    "window-20": WindowConfig(messages=20),
    "seed-pipeline": SeedPipelineConfig(),
    "anthropic-clear": AnthropicClearConfig(),
    "anthropic-clear-atleast": AnthropicClearConfig(clear_at_least_fraction=0.125),
    "anthropic-compact": AnthropicCompactConfig(),
    "masking": MaskingConfig(),
    "openhands": OpenHandsConfig(),
    "claude-code": ClaudeCodeConfig(),
}
_ALIASES = {"default": "cachecompact"}


def register(name: str, config: StrategyConfig) -> None:
    """Add or replace a strategy under ``name``."""
    if not callable(getattr(config, "build", None)):
        raise TypeError(f"strategy {name!r}: the config needs a build(ctx) method")
    with _LOCK:
        _REGISTRY[name] = config


def get_strategy(name: str) -> StrategyConfig:
    """The registered config for ``name``; `UnknownStrategyError` lists the known names."""
    cfg = _REGISTRY.get(_ALIASES.get(name, name))
    if cfg is None:
        raise UnknownStrategyError(f"unknown strategy {name!r}; known: {', '.join(strategy_names())}")
    out: StrategyConfig = cfg
    return out


def strategy_names() -> list[str]:
    return list(_REGISTRY)


def with_policy(config: StrategyConfig, policy: PolicyConfig | None) -> StrategyConfig:
    """``config`` with its policy replaced, when it has one (the cachecompact strategies)."""
    if policy is not None and isinstance(config, CachecompactConfig):
        return replace(config, policy=policy)
    return config
