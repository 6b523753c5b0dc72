"""One registry of compaction strategies, ours and the peers', used by `wrap`, the proxy, the
benchmark and the CLI alike.

A strategy is registered by name with its config: ``register("my-strategy", MyConfig())``.
The config is a frozen dataclass with ``prefix_messages``, ``summary_model``,
``summary_mode`` and ``build(ctx) -> Strategy``; the `Strategy` protocol is the extension
point (see `base`).
"""

from __future__ import annotations

import importlib
import threading
from dataclasses import replace
from typing import Any

from ..errors import UnknownStrategyError
from ..policy import Economics, PolicyConfig
from ..strategy import LedgerStrategy, Strategy, StrategyConfig, StrategyContext, TurnReport, summarize_range, task_goal
from .cachecompact import CachecompactConfig

__all__ = [
    "AnthropicClearConfig",
    "AnthropicCompactConfig",
    "CachecompactConfig",
    "ClaudeCodeConfig",
    "LedgerStrategy",
    "MaskingConfig",
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

# The peers' config classes, by module: imported when a peer is first asked for (the runtime of
# a wrapped agent never needs them), or when one of these names is read from this package.
_PEER_CLASSES = {"NoneConfig": "body", "WindowConfig": "body", "AnthropicClearConfig": "body",
                 "AnthropicCompactConfig": "body", "MaskingConfig": "body", "SeedPipelineConfig": "seed",
                 "OpenHandsConfig": "openhands", "ClaudeCodeConfig": "claude_code"}
# name -> (config class, keyword arguments), in the order strategy_names() lists them
_PEERS: dict[str, tuple[str, dict[str, Any]]] = {
    "none": ("NoneConfig", {}),
    "window-20": ("WindowConfig", {"messages": 20}),
    "seed-pipeline": ("SeedPipelineConfig", {}),
    "anthropic-clear": ("AnthropicClearConfig", {}),
    "anthropic-clear-atleast": ("AnthropicClearConfig", {"clear_at_least_fraction": 0.125}),
    "anthropic-compact": ("AnthropicCompactConfig", {}),
    "masking": ("MaskingConfig", {}),
    "openhands": ("OpenHandsConfig", {}),
    "claude-code": ("ClaudeCodeConfig", {}),
}


def __getattr__(name: str) -> Any:
    module = _PEER_CLASSES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


_LOCK = threading.Lock()
_REGISTRY: dict[str, Any] = {
    "cachecompact": CachecompactConfig(),
    "cachecompact-no-econ": CachecompactConfig(policy=PolicyConfig(economics=Economics(cache_aware=False))),
    **dict.fromkeys(_PEERS),  # None until first asked for
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
    key = _ALIASES.get(name, name)
    if key not in _REGISTRY:
        raise UnknownStrategyError(f"unknown strategy {name!r}; known: {', '.join(strategy_names())}")
    cfg = _REGISTRY[key]
    if cfg is None:  # a peer not built yet
        cls, kwargs = _PEERS[key]
        cfg = __getattr__(cls)(**kwargs)
        with _LOCK:
            _REGISTRY[key] = cfg
    out: StrategyConfig = cfg
    return out


def strategy_names() -> list[str]:
    return list(_REGISTRY)


def with_policy(config: StrategyConfig, policy: PolicyConfig | None) -> StrategyConfig:
    """``config`` with its policy replaced, when it has one (the cachecompact strategies)."""
    if policy is not None and isinstance(config, CachecompactConfig):
        return replace(config, policy=policy)
    return config
