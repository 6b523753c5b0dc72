"""cachecompact: cache-aware context compaction for agents on the Anthropic Messages API.

Public names only; everything else lives in private-by-convention modules.
"""

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
from .ledger import LedgerEntry, ReplaceWithSummary, SkipRange
from .render import BlockLocation, Divergence, RenderResult
from .session import Session
from .tokens import TokenCounter

__all__ = [
    "BlockLocation",
    "CacheCompactError",
    "Divergence",
    "EditOverlapError",
    "EditSplitsToolPairError",
    "EditTouchesPrefixError",
    "HistoryRewrittenError",
    "ImmutablePrefixError",
    "InvalidEditError",
    "LedgerCorruptError",
    "LedgerEntry",
    "MalformedMessageError",
    "RenderResult",
    "ReplaceWithSummary",
    "Session",
    "SessionLockedError",
    "SkipRange",
    "StoreError",
    "TokenCounter",
    "TokenizerError",
]

__version__ = "0.1.0"
