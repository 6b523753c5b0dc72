"""Typed errors. Every error names the place it is about, so a user can fix the input."""

from __future__ import annotations


class CacheCompactError(Exception):
    """Base class of every error this package raises on purpose."""


class MalformedMessageError(CacheCompactError, ValueError):
    """A message or block does not have the shape the Messages API requires.

    `where` is a path such as ``messages[3].content[1].tool_use_id``.
    """

    def __init__(self, where: str, problem: str) -> None:
        self.where = where
        self.problem = problem
        super().__init__(f"{where}: {problem}")


class HistoryRewrittenError(CacheCompactError):
    """`sync` got a history whose earlier messages differ from the recorded ones."""

    def __init__(self, index: int, detail: str = "") -> None:
        self.index = index
        msg = f"history rewritten: message {index} differs from the recorded transcript"
        super().__init__(msg + (f" ({detail})" if detail else ""))


class ImmutablePrefixError(CacheCompactError):
    """The tools, system prompt or first messages no longer hash to the stored prefix hash."""


class InvalidEditError(CacheCompactError, ValueError):
    """A ledger edit breaks a rule (range, prefix, pairing, containment); nothing was written."""


class EditTouchesPrefixError(InvalidEditError):
    """The edit's range starts inside the immutable prefix."""


class EditSplitsToolPairError(InvalidEditError):
    """The edit would separate a tool_use from its tool_result.

    `suggested` is the smallest widened range that keeps whole pairs, when one exists.
    """

    def __init__(self, message: str, suggested: tuple[int, int] | None = None) -> None:
        self.suggested = suggested
        super().__init__(message + (f"; widen it to {suggested[0]}..{suggested[1]}" if suggested else ""))


class EditOverlapError(InvalidEditError):
    """The edit overlaps an earlier edit without containing it completely."""


class LedgerCorruptError(CacheCompactError):
    """A stored record fails its hash, chain or replay check. `path` and `line` name it (1-based)."""

    def __init__(self, path: str, line: int, problem: str) -> None:
        self.path = path
        self.line = line
        self.problem = problem
        super().__init__(f"{path}:{line}: {problem}")


class StoreError(CacheCompactError):
    """The session directory is missing, unreadable or not a cachecompact session."""


class SessionLockedError(StoreError):
    """Another process holds the session lock and did not release it within the timeout."""


class TokenizerError(CacheCompactError):
    """The offline BPE tables are missing or do not match tiktoken's expected sha256."""
