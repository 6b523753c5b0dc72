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
    from .adapters.middleware import CompactionMiddleware, scratchpad_handler, wrap, wrapped_sessions
    from .base.errors import (
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
    from .base.events import Event
    from .base.tokens import TokenCounter
    from .cache.forensics import Finding, Forensics
    from .compaction.cache_aware import Compactor
    from .compaction.catalog import get_strategy, register, strategy_names
    from .compaction.policy import Economics, LevelSettings, PolicyConfig, Safety, Triggers
    from .compaction.quality import RegressionReport, compaction_regression_suite
    from .compaction.scratchpad import READ_SCRATCHPAD_TOOL, Scratchpad
    from .compaction.strategy import Strategy, StrategyConfig, StrategyContext, TurnReport
    from .compaction.summarize.llm import ExtractiveSummarizer, LLMSummarizer, Summarizer
    from .history.ledger import LedgerEntry, ReplaceWithSummary, SkipRange
    from .history.render import BlockInfo, BlockLocation, Divergence, RenderResult
    from .history.session import Session
    from .store import FileStore, SessionStore, Store, open_store

_EXPORTS = {
    "Compactor": "compaction.cache_aware",
    "CacheCompactError": "base.errors",
    "ConfigError": "base.errors",
    "ContextFullError": "base.errors",
    "EditOverlapError": "base.errors",
    "EditSplitsToolPairError": "base.errors",
    "EditTouchesPrefixError": "base.errors",
    "HistoryRewrittenError": "base.errors",
    "ImmutablePrefixError": "base.errors",
    "InvalidEditError": "base.errors",
    "InvalidSessionIdError": "base.errors",
    "LedgerCorruptError": "base.errors",
    "MalformedMessageError": "base.errors",
    "PolicyConfigError": "base.errors",
    "ScratchpadRefError": "base.errors",
    "SessionExistsError": "base.errors",
    "SessionLockedError": "base.errors",
    "SessionNotFoundError": "base.errors",
    "StoreConflictError": "base.errors",
    "StoreError": "base.errors",
    "SummaryRejected": "base.errors",
    "TokenizerError": "base.errors",
    "TraceFormatError": "base.errors",
    "UnknownModelError": "base.errors",
    "UnknownStrategyError": "base.errors",
    "Event": "base.events",
    "Finding": "cache.forensics",
    "Forensics": "cache.forensics",
    "LedgerEntry": "history.ledger",
    "ReplaceWithSummary": "history.ledger",
    "SkipRange": "history.ledger",
    "CompactionMiddleware": "adapters.middleware",
    "scratchpad_handler": "adapters.middleware",
    "wrap": "adapters.middleware",
    "wrapped_sessions": "adapters.middleware",
    "Economics": "compaction.policy",
    "LevelSettings": "compaction.policy",
    "PolicyConfig": "compaction.policy",
    "Safety": "compaction.policy",
    "Triggers": "compaction.policy",
    "RegressionReport": "compaction.quality",
    "compaction_regression_suite": "compaction.quality",
    "BlockInfo": "history.render",
    "BlockLocation": "history.render",
    "Divergence": "history.render",
    "RenderResult": "history.render",
    "READ_SCRATCHPAD_TOOL": "compaction.scratchpad",
    "Scratchpad": "compaction.scratchpad",
    "Session": "history.session",
    "FileStore": "store",
    "SessionStore": "store",
    "Store": "store",
    "open_store": "store",
    "get_strategy": "compaction.catalog",
    "register": "compaction.catalog",
    "strategy_names": "compaction.catalog",
    "Strategy": "compaction.strategy",
    "StrategyConfig": "compaction.strategy",
    "StrategyContext": "compaction.strategy",
    "TurnReport": "compaction.strategy",
    "ExtractiveSummarizer": "compaction.summarize.llm",
    "LLMSummarizer": "compaction.summarize.llm",
    "Summarizer": "compaction.summarize.llm",
    "TokenCounter": "base.tokens",
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
