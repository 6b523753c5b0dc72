"""cachecompact: cache-aware context compaction for agents on the Anthropic Messages API.

Public names only; everything else lives in private-by-convention modules.
"""

from .compactor import Compactor
from .errors import (
    CacheCompactError,
    EditOverlapError,
    EditSplitsToolPairError,
    EditTouchesPrefixError,
    HistoryRewrittenError,
    ImmutablePrefixError,
    InvalidEditError,
    LedgerCorruptError,
    MalformedMessageError,
    SessionLockedError,
    StoreError,
    TokenizerError,
)
from .events import Event
from .ledger import LedgerEntry, ReplaceWithSummary, SkipRange
from .middleware import CompactionMiddleware, wrap
from .policy import ContextFullError, PolicyConfig, PolicyConfigError
from .render import BlockLocation, Divergence, RenderResult
from .scratchpad import READ_SCRATCHPAD_TOOL, Scratchpad, ScratchpadRefError
from .session import Session
from .summarize import ExtractiveSummarizer, LLMSummarizer, SummaryRejected
from .tokens import TokenCounter

__all__ = [
    "READ_SCRATCHPAD_TOOL",
    "BlockLocation",
    "CacheCompactError",
    "CompactionMiddleware",
    "Compactor",
    "ContextFullError",
    "Divergence",
    "EditOverlapError",
    "EditSplitsToolPairError",
    "EditTouchesPrefixError",
    "Event",
    "ExtractiveSummarizer",
    "HistoryRewrittenError",
    "ImmutablePrefixError",
    "InvalidEditError",
    "LLMSummarizer",
    "LedgerCorruptError",
    "LedgerEntry",
    "MalformedMessageError",
    "PolicyConfig",
    "PolicyConfigError",
    "RenderResult",
    "ReplaceWithSummary",
    "Scratchpad",
    "ScratchpadRefError",
    "Session",
    "SessionLockedError",
    "SkipRange",
    "StoreError",
    "SummaryRejected",
    "TokenCounter",
    "TokenizerError",
    "wrap",
]

__version__ = "0.1.0"
