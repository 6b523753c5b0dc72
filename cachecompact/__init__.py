"""cachecompact: cache-aware context compaction for agents on the Anthropic Messages API.

`__all__` is the public surface: the names a user of `wrap()`, the proxy or the ledger needs.
Everything else lives in its folder's modules and their `__all__` (docs/api.md). The other
names below still resolve here for one release (the 0.3 surface, `Compactor` and `register`
among them), so code written against 0.3 keeps working.
"""

# Every public name is loaded from its module when first used (PEP 562): ``import cachecompact``
# and ``cachecompact --help`` load no more than this file, and an adapter pays only for what it
# touches. Type checkers read the imports below.
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # the names of __all__, and (``X as X``) the 0.3 names that still resolve here
    from .adapters.idle_scheduler import SimulatedClock
    from .adapters.middleware import CompactionMiddleware, compact_idle, scratchpad_handler, wrap, wrapped_sessions
    from .adapters.sdk_errors import ContextFullError
    from .base.errors import (
        CacheCompactError,
        ConfigError,
        EditOverlapError as EditOverlapError,
        EditSplitsToolPairError as EditSplitsToolPairError,
        EditTouchesPrefixError as EditTouchesPrefixError,
        HistoryRewrittenError,
        ImmutablePrefixError as ImmutablePrefixError,
        InvalidEditError as InvalidEditError,
        InvalidSessionIdError as InvalidSessionIdError,
        LedgerCorruptError as LedgerCorruptError,
        MalformedMessageError as MalformedMessageError,
        PolicyConfigError as PolicyConfigError,
        ScratchpadRefError as ScratchpadRefError,
        SessionExistsError as SessionExistsError,
        SessionLockedError,
        SessionNotFoundError as SessionNotFoundError,
        StoreConflictError as StoreConflictError,
        StoreError as StoreError,
        SummaryRejected as SummaryRejected,
        TokenizerError as TokenizerError,
        TraceFormatError as TraceFormatError,
        UnknownModelError as UnknownModelError,
        UnknownStrategyError as UnknownStrategyError,
    )
    from .base.events import Event
    from .base.tokens import TokenCounter as TokenCounter
    from .base.values import IdleDecision as IdleDecision
    from .cache.forensics import Finding, Forensics
    from .compaction.cache_aware import CacheAwareCompactor, Compactor as Compactor
    from .compaction.catalog import get_strategy, register as register, register_strategy, strategy_names
    from .compaction.policy import Economics, LevelSettings, PolicyConfig, Safety, Triggers
    from .compaction.quality import (
        RegressionReport as RegressionReport,
        compaction_regression_suite as compaction_regression_suite,
    )
    from .compaction.strategy import Plan, Strategy, StrategyConfig, StrategyContext
    from .compaction.summarize.llm import ExtractiveSummarizer, LLMSummarizer, Summarizer
    from .engine.options import EngineOptions
    from .history.ledger import LedgerEntry, ReplaceWithSummary, SkipRange
    from .history.render import (
        BlockInfo as BlockInfo,
        BlockLocation as BlockLocation,
        Divergence as Divergence,
        RenderResult,
    )
    from .history.scratchpad import READ_SCRATCHPAD_TOOL as READ_SCRATCHPAD_TOOL, Scratchpad as Scratchpad
    from .history.session import Session
    from .store import FileStore, SessionStore, Store, open_store

_EXPORTS = {
    "CacheAwareCompactor": "compaction.cache_aware",
    "Compactor": "compaction.cache_aware",
    "CacheCompactError": "base.errors",
    "ConfigError": "base.errors",
    "ContextFullError": "adapters.sdk_errors",
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
    "compact_idle": "adapters.middleware",
    "SimulatedClock": "adapters.idle_scheduler",
    "IdleDecision": "base.values",
    "wrap": "adapters.middleware",
    "wrapped_sessions": "adapters.middleware",
    "Economics": "compaction.policy",
    "EngineOptions": "engine.options",
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
    "READ_SCRATCHPAD_TOOL": "history.scratchpad",
    "Scratchpad": "history.scratchpad",
    "Session": "history.session",
    "FileStore": "store",
    "SessionStore": "store",
    "Store": "store",
    "open_store": "store",
    "get_strategy": "compaction.catalog",
    "register": "compaction.catalog",
    "register_strategy": "compaction.catalog",
    "strategy_names": "compaction.catalog",
    "Strategy": "compaction.strategy",
    "StrategyConfig": "compaction.strategy",
    "StrategyContext": "compaction.strategy",
    "Plan": "compaction.strategy",
    "TurnReport": "compaction.strategy",  # the 0.2 name of Plan, until 0.4
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
    "CacheAwareCompactor",
    "CacheCompactError",
    "CompactionMiddleware",
    "ConfigError",
    "ContextFullError",
    "Economics",
    "EngineOptions",
    "Event",
    "ExtractiveSummarizer",
    "FileStore",
    "Finding",
    "Forensics",
    "HistoryRewrittenError",
    "LLMSummarizer",
    "LedgerEntry",
    "LevelSettings",
    "Plan",
    "PolicyConfig",
    "RenderResult",
    "ReplaceWithSummary",
    "Safety",
    "Session",
    "SessionLockedError",
    "SessionStore",
    "SimulatedClock",
    "SkipRange",
    "Store",
    "Strategy",
    "StrategyConfig",
    "StrategyContext",
    "Summarizer",
    "Triggers",
    "compact_idle",
    "get_strategy",
    "open_store",
    "register_strategy",
    "scratchpad_handler",
    "strategy_names",
    "wrap",
    "wrapped_sessions",
]

__version__ = "0.3.0"
