"""The peers' strategies, as the benchmark replays them: what Claude Code, OpenHands, the
Anthropic API's own context editing and others do. Each config class loads with its module the
first time it is read (PEP 562), so a wrapped agent that runs only cachecompact never imports
them. `catalog.get_strategy` builds them by name."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .body import AnthropicClearConfig, AnthropicCompactConfig, MaskingConfig, NoneConfig, WindowConfig
    from .claude_code import ClaudeCodeConfig
    from .ondemand import OnDemandConfig
    from .openhands import OpenHandsConfig
    from .seed import SeedPipelineConfig

_MODULES = {"NoneConfig": "body", "WindowConfig": "body", "AnthropicClearConfig": "body",
            "AnthropicCompactConfig": "body", "MaskingConfig": "body", "SeedPipelineConfig": "seed",
            "OpenHandsConfig": "openhands", "ClaudeCodeConfig": "claude_code", "OnDemandConfig": "ondemand"}

__all__ = [
    "AnthropicClearConfig",
    "AnthropicCompactConfig",
    "ClaudeCodeConfig",
    "MaskingConfig",
    "NoneConfig",
    "OnDemandConfig",
    "OpenHandsConfig",
    "SeedPipelineConfig",
    "WindowConfig",
]


def __getattr__(name: str) -> Any:
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
