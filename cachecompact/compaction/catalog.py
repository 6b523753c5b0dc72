"""One registry of compaction strategies, ours and the peers', used by `wrap`, the proxy, the
benchmark and the CLI alike.

A strategy is registered by name with its config: ``register_strategy("my-strategy", MyConfig())``.
A name with ``@5m`` or ``@1h`` after it is that strategy with its cache TTL fixed (``none@1h``,
``cachecompact@5m``): `with_ttl`, for the strategies that have a TTL to choose.
The config is a frozen dataclass with ``prefix_messages``, ``summary_model``,
``summary_mode`` and ``build(ctx) -> Strategy``; the `Strategy` protocol is the extension
point (see `base`).
"""

from __future__ import annotations

import importlib
import threading
from dataclasses import fields, replace
from typing import Any

from ..base.errors import UnknownStrategyError
from ._default import CachecompactConfig
from .policy import Economics, LevelSettings, PolicyConfig
from .strategy import (
    LedgerStrategy,
    Plan,
    Strategy,
    StrategyConfig,
    StrategyContext,
    TurnReport,
    summarize_range,
    task_goal,
)

__all__ = [
    "CachecompactConfig",
    "LedgerStrategy",
    "Plan",
    "Strategy",
    "StrategyConfig",
    "StrategyContext",
    "TurnReport",
    "get_strategy",
    "register_strategy",
    "strategy_names",
    "summarize_range",
    "task_goal",
    "with_policy",
    "with_ttl",
]

# name -> (config class, keyword arguments), in the order strategy_names() lists them
_PEERS: dict[str, tuple[str, dict[str, Any]]] = {
    "none": ("NoneConfig", {}),
    "window-20": ("WindowConfig", {"messages": 20}),
    "seed-pipeline": ("SeedPipelineConfig", {}),
    "anthropic-clear": ("AnthropicClearConfig", {}),  # the documented default: 100k, keep 3
    "anthropic-clear-atleast": ("AnthropicClearConfig", {"clear_at_least_tokens": 25_000}),
    "anthropic-compact": ("AnthropicCompactConfig", {}),  # the documented default: 150k
    "anthropic-ondemand": ("OnDemandConfig", {}),  # the recipes, with the trigger derived from prices
    "masking": ("MaskingConfig", {}),
    "openhands": ("OpenHandsConfig", {}),
    "claude-code": ("ClaudeCodeConfig", {}),
}

# Named extras, run when asked for by name (``--strategy anthropic-compact-300k``) and listed by
# ``strategy_names(extras=True)``: the Anthropic peers' trigger sweeps (their knob frontier), and
# the triggers scaled to the window that the bench used before issue 48 (at 1M they never fire).
_EXTRAS: dict[str, tuple[str, dict[str, Any]]] = {
    **{f"anthropic-compact-{k}k": ("AnthropicCompactConfig", {"trigger_tokens": k * 1000})
       for k in (50, 100, 300, 500)},
    **{f"anthropic-clear-{k}k": ("AnthropicClearConfig", {"trigger_tokens": k * 1000}) for k in (50, 200)},
    "anthropic-compact-scaled": ("AnthropicCompactConfig", {"trigger_fraction": 0.75}),
    "anthropic-clear-scaled": ("AnthropicClearConfig", {"trigger_fraction": 0.5}),
    "anthropic-ondemand-scaled": ("OnDemandConfig", {"trigger_fraction": 0.75}),
}


_LOCK = threading.Lock()
_REGISTRY: dict[str, Any] = {
    "cachecompact": CachecompactConfig(),
    "cachecompact-no-econ": CachecompactConfig(policy=PolicyConfig(economics=Economics(cache_aware=False))),
    **dict.fromkeys(_PEERS),  # None until first asked for
    **dict.fromkeys(_EXTRAS),
    # an extra: our own summaries everywhere, the thinking after them removed (the trade API-written
    # summaries make: docs/policy.md, *API-written summaries*)
    "cachecompact-own-summaries": CachecompactConfig(policy=PolicyConfig(levels=LevelSettings(api_summaries=False))),
    # an extra: the API writes every summary it may, whatever it costs beside ours (the default before
    # the writer was chosen by price: docs/policy.md, *API-written summaries*)
    "cachecompact-api-summaries": CachecompactConfig(policy=PolicyConfig(levels=LevelSettings(api_summaries=True))),
}
_EXTRA_NAMES = frozenset({*_EXTRAS, "cachecompact-own-summaries", "cachecompact-api-summaries"})
_ALIASES = {"default": "cachecompact"}


def register_strategy(name: str, config: StrategyConfig) -> None:
    """Add or replace a strategy under ``name``."""
    if not callable(getattr(config, "build", None)):
        raise TypeError(f"strategy {name!r}: the config needs a build(ctx) method")
    with _LOCK:
        _REGISTRY[name] = config


def get_strategy(name: str) -> StrategyConfig:
    """The registered config for ``name`` (``name@ttl``: with that TTL, `with_ttl`);
    `UnknownStrategyError` lists the known names."""
    base, at, ttl = name.partition("@")
    if at:
        return with_ttl(get_strategy(base), ttl, name)
    key = _ALIASES.get(name, name)
    if key not in _REGISTRY:
        raise UnknownStrategyError(f"unknown strategy {name!r}; known: {', '.join(strategy_names(extras=True))}")
    cfg = _REGISTRY[key]
    if cfg is None:  # a peer not built yet
        cls, kwargs = _PEERS[key] if key in _PEERS else _EXTRAS[key]
        cfg = getattr(importlib.import_module(f"{__package__}.peers"), cls)(**kwargs)
        with _LOCK:
            _REGISTRY[key] = cfg
    out: StrategyConfig = cfg
    return out


def strategy_names(extras: bool = False) -> list[str]:
    """The registered names a default run uses; with ``extras``, the named sweep variants too."""
    return [n for n in _REGISTRY if extras or n not in _EXTRA_NAMES]


def with_ttl(config: StrategyConfig, ttl: str, name: str = "") -> StrategyConfig:
    """``config`` with its cache TTL fixed to ``ttl`` ("5m" or "1h"): the policy's TTL for the
    cachecompact strategies, the ``ttl`` field of a peer that has one."""
    if ttl not in ("5m", "1h"):
        raise UnknownStrategyError(f"strategy {name or ttl!r}: the TTL after '@' must be 5m or 1h, got {ttl!r}")
    if isinstance(config, CachecompactConfig):
        return replace(config, policy=replace(config.policy, economics=replace(config.policy.economics, ttl=ttl)))
    if any(f.name == "ttl" for f in fields(config)):  # type: ignore[arg-type]
        return replace(config, ttl=ttl)  # type: ignore[type-var]
    raise UnknownStrategyError(f"strategy {name!r}: {type(config).__name__} has no cache TTL to choose")


def with_policy(config: StrategyConfig, policy: PolicyConfig | None) -> StrategyConfig:
    """``config`` with its policy replaced, when it has one (the cachecompact strategies)."""
    if policy is not None and isinstance(config, CachecompactConfig):
        return replace(config, policy=policy)
    return config


#: The 0.3 name of `register_strategy`, kept for one release.
register = register_strategy
