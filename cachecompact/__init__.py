"""cachecompact: cache-aware context compaction for agents on the Anthropic Messages API.

Public names only; everything else lives in modules behind them.
"""

# Every public name is loaded from its module when first used (PEP 562): ``import cachecompact``
# and ``cachecompact --help`` load no more than this file, and an adapter pays only for what it
# touches. Type checkers read the imports below.
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .compactor import Compactor
    from .errors import (
        CacheCompactError,
        ConfigError,
        ContextFullError,
        EditOverlapError,
        EditSplitsToolPairError,
        EditTouchesPrefixError,
        HistoryRewrittenError,
        ImmutablePrefixError,
        InvalidEditError,
        InvalidSessionIdError,
        LedgerCorruptError,
        MalformedMessageError,
        PolicyConfigError,
        ScratchpadRefError,
        SessionExistsError,
        SessionLockedError,
        SessionNotFoundError,
        StoreConflictError,
        StoreError,
        SummaryRejected,
        TokenizerError,
        TraceFormatError,
        UnknownModelError,
        UnknownStrategyError,
    )
    from .events import Event
    from .forensics import Finding, Forensics
    from .ledger import LedgerEntry, ReplaceWithSummary, SkipRange
    from .middleware import CompactionMiddleware, scratchpad_handler, wrap, wrapped_sessions
    from .policy import Economics, LevelSettings, PolicyConfig, Safety, Triggers
    from .quality import RegressionReport, compaction_regression_suite
    from .render import BlockInfo, BlockLocation, Divergence, RenderResult
    from .scratchpad import READ_SCRATCHPAD_TOOL, Scratchpad
    from .session import Session
    from .store import FileStore, SessionStore, Store, open_store
    from .strategies import get_strategy, register, strategy_names
    from .strategy import Strategy, StrategyConfig, StrategyContext, TurnReport
    from .summarize import ExtractiveSummarizer, LLMSummarizer, Summarizer
    from .tokens import TokenCounter

_EXPORTS = {
    "Compactor": "compactor",
    "CacheCompactError": "errors",
    "ConfigError": "errors",
    "ContextFullError": "errors",
    "EditOverlapError": "errors",
    "EditSplitsToolPairError": "errors",
    "EditTouchesPrefixError": "errors",
    "HistoryRewrittenError": "errors",
    "ImmutablePrefixError": "errors",
    "InvalidEditError": "errors",
    "InvalidSessionIdError": "errors",
    "LedgerCorruptError": "errors",
    "MalformedMessageError": "errors",
    "PolicyConfigError": "errors",
    "ScratchpadRefError": "errors",
    "SessionExistsError": "errors",
    "SessionLockedError": "errors",
    "SessionNotFoundError": "errors",
    "StoreConflictError": "errors",
    "StoreError": "errors",
    "SummaryRejected": "errors",
    "TokenizerError": "errors",
    "TraceFormatError": "errors",
    "UnknownModelError": "errors",
    "UnknownStrategyError": "errors",
    "Event": "events",
    "Finding": "forensics",
    "Forensics": "forensics",
    "LedgerEntry": "ledger",
    "ReplaceWithSummary": "ledger",
    "SkipRange": "ledger",
    "CompactionMiddleware": "middleware",
    "scratchpad_handler": "middleware",
    "wrap": "middleware",
    "wrapped_sessions": "middleware",
    "Economics": "policy",
    "LevelSettings": "policy",
    "PolicyConfig": "policy",
    "Safety": "policy",
    "Triggers": "policy",
    "RegressionReport": "quality",
    "compaction_regression_suite": "quality",
    "BlockInfo": "render",
    "BlockLocation": "render",
    "Divergence": "render",
    "RenderResult": "render",
    "READ_SCRATCHPAD_TOOL": "scratchpad",
    "Scratchpad": "scratchpad",
    "Session": "session",
    "FileStore": "store",
    "SessionStore": "store",
    "Store": "store",
    "open_store": "store",
    "get_strategy": "strategies",
    "register": "strategies",
    "strategy_names": "strategies",
    "Strategy": "strategy",
    "StrategyConfig": "strategy",
    "StrategyContext": "strategy",
    "TurnReport": "strategy",
    "ExtractiveSummarizer": "summarize",
    "LLMSummarizer": "summarize",
    "Summarizer": "summarize",
    "TokenCounter": "tokens",
}


def __getattr__(name: str) -> Any:
    """A public name from its module, or a submodule (``cachecompact.store``), loaded on first use."""
    module = _EXPORTS.get(name)
    if module is not None:
        value = getattr(importlib.import_module(f".{module}", __name__), name)
        globals()[name] = value
        return value
    if name.startswith("_"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        return importlib.import_module(f".{name}", __name__)
    except ModuleNotFoundError as err:
        if err.name != f"{__name__}.{name}":
            raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


__all__ = [
    "READ_SCRATCHPAD_TOOL",
    "BlockInfo",
    "BlockLocation",
    "CacheCompactError",
    "CompactionMiddleware",
    "Compactor",
    "ConfigError",
    "ContextFullError",
    "Divergence",
    "Economics",
    "EditOverlapError",
    "EditSplitsToolPairError",
    "EditTouchesPrefixError",
    "Event",
    "ExtractiveSummarizer",
    "FileStore",
    "Finding",
    "Forensics",
    "HistoryRewrittenError",
    "ImmutablePrefixError",
    "InvalidEditError",
    "InvalidSessionIdError",
    "LLMSummarizer",
    "LedgerCorruptError",
    "LedgerEntry",
    "LevelSettings",
    "MalformedMessageError",
    "PolicyConfig",
    "PolicyConfigError",
    "RegressionReport",
    "RenderResult",
    "ReplaceWithSummary",
    "Safety",
    "Scratchpad",
    "ScratchpadRefError",
    "Session",
    "SessionExistsError",
    "SessionLockedError",
    "SessionNotFoundError",
    "SessionStore",
    "SkipRange",
    "Store",
    "StoreConflictError",
    "StoreError",
    "Strategy",
    "StrategyConfig",
    "StrategyContext",
    "Summarizer",
    "SummaryRejected",
    "TokenCounter",
    "TokenizerError",
    "TraceFormatError",
    "Triggers",
    "TurnReport",
    "UnknownModelError",
    "UnknownStrategyError",
    "compaction_regression_suite",
    "get_strategy",
    "open_store",
    "register",
    "scratchpad_handler",
    "strategy_names",
    "wrap",
    "wrapped_sessions",
]

__version__ = "0.3.0"
