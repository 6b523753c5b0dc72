"""cachecompact: cache-aware context compaction for agents on the Anthropic Messages API.

Public names only; everything else lives in modules behind them.
"""

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
