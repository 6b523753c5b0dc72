"""Every error cachecompact raises on purpose, in one tree under `CacheCompactError`.

Each error names the place it is about (a message path, a file and line, a session id), so
a user can fix the input. Mixins (`ValueError`, `KeyError`) are kept where callers reasonably
catch the builtin kind. Nothing here imports the SDK: "the context is full" is a decision the
compactor returns as data (`Plan.context_full`), and each adapter turns it into its
transport's error (`wrap()`: `adapters.sdk_errors.ContextFullError`, an `anthropic.APIError`; the
proxy: a 400).
"""

from __future__ import annotations

__all__ = [
    "CacheCompactError",
    "ConfigError",
    "EditOverlapError",
    "EditSplitsToolPairError",
    "EditTouchesPrefixError",
    "ForeignHistoryError",
    "HistoryRewrittenError",
    "ImmutablePrefixError",
    "InvalidEditError",
    "InvalidSessionIdError",
    "LedgerCorruptError",
    "MalformedMessageError",
    "PolicyConfigError",
    "ScratchpadRefError",
    "SessionExistsError",
    "SessionIdMismatchError",
    "SessionLockedError",
    "SessionNotFoundError",
    "StagedEditsConflictError",
    "StoreConflictError",
    "StoreError",
    "SummaryRejected",
    "TokenizerError",
    "TraceFormatError",
    "UnconfirmedEntryError",
    "UnknownModelError",
    "UnknownStrategyError",
]


class CacheCompactError(Exception):
    """Base class of every error this package raises on purpose."""


# -- input ---------------------------------------------------------------------------------------

class MalformedMessageError(CacheCompactError, ValueError):
    """A message or block does not have the shape the Messages API requires.

    `where` is a path such as ``messages[3].content[1].tool_use_id``.
    """

    def __init__(self, where: str, problem: str) -> None:
        self.where = where
        self.problem = problem
        super().__init__(f"{where}: {problem}")

    def __reduce__(self) -> tuple[type, tuple[str, str]]:  # crosses a process pool intact
        return type(self), (self.where, self.problem)


class HistoryRewrittenError(CacheCompactError):
    """`sync` got a history whose earlier messages differ from the recorded ones."""

    def __init__(self, index: int, detail: str = "") -> None:
        self.index, self.detail = index, detail
        msg = f"history rewritten: message {index} differs from the recorded transcript"
        super().__init__(msg + (f" ({detail})" if detail else ""))

    def __reduce__(self) -> tuple[type, tuple[int, str]]:
        return type(self), (self.index, self.detail)


class ImmutablePrefixError(CacheCompactError):
    """The tools, system prompt or first messages no longer hash to the stored prefix hash."""


class InvalidSessionIdError(CacheCompactError, ValueError):
    """A session id that could name a path outside the store (``..``, ``/``, control characters)."""


class TraceFormatError(CacheCompactError, ValueError):
    """A trace file is malformed, truncated or of an unknown format. Names the file and reason."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}")

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        return type(self), (self.path, self.reason)


# -- edits ---------------------------------------------------------------------------------------

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


# -- storage -------------------------------------------------------------------------------------

class StoreError(CacheCompactError):
    """The session store is missing, unreadable, or not a cachecompact store."""


class ForeignHistoryError(CacheCompactError):
    """A rendered request was not made from the caller's own history alone (issue 46): it was
    about to carry messages, or edits of messages, that the request did not send. Such a request
    is never sent: the engine decides the session again, and if that fails too it sends the
    caller's original request (fail open) with a ``failure`` event. ``session_id`` names the
    session, ``why`` the first difference found."""

    def __init__(self, session_id: str, why: str) -> None:
        self.session_id, self.why = session_id, why
        super().__init__(f"session {session_id}: the rendered request is not the caller's own history ({why})")

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        return type(self), (self.session_id, self.why)


class StagedEditsConflictError(StoreError):
    """Edits a strategy staged were not stored (another writer appended ledger entries first, or
    the write failed), or a session that lost them is used again.

    The session's memory then holds entries the store does not, so it is `stale`; the engine
    lets it go and opens it again from the store (`SessionRegistry.forget`) before deciding anew.
    ``session_id`` names it.
    """

    def __init__(self, session_id: str, message: str) -> None:
        self.session_id, self.message = session_id, message
        super().__init__(message)

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        return type(self), (self.session_id, self.message)


class SessionNotFoundError(StoreError, KeyError):
    """No session with this id in the store."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "session not found"


class SessionIdMismatchError(StoreError):
    """A stored session's own id (its ``session.json`` ``session_id``) is not the id it is stored
    under: a copied or renamed session folder. Not this id's session: the engine passes it over
    with one warning. ``stored_as`` is the id (folder) it was opened by, ``own`` its own."""

    def __init__(self, where: str, stored_as: str, own: str) -> None:
        self.where, self.stored_as, self.own = where, stored_as, own
        super().__init__(f"{where}: holds session {own!r}, not {stored_as!r} (a copied or renamed session folder); "
                         f"rename it back to {own!r}, or move it out of the store")

    def __reduce__(self) -> tuple[type, tuple[str, str, str]]:
        return type(self), (self.where, self.stored_as, self.own)


class SessionExistsError(StoreError):
    """A session with this id already exists (creation never overwrites)."""


class SessionLockedError(StoreError):
    """Another writer holds the session lock and did not release it within the timeout."""


class StoreConflictError(StoreError):
    """A compare-and-append lost: another writer appended at the same position first.

    `expected` is the length this writer appended at; `actual` what the store holds now.
    """

    def __init__(self, what: str, expected: int, actual: int) -> None:
        self.what, self.expected, self.actual = what, expected, actual
        super().__init__(f"{what}: another writer appended first (expected length {expected}, found {actual})")

    def __reduce__(self) -> tuple[type, tuple[str, int, int]]:
        return type(self), (self.what, self.expected, self.actual)


class LedgerCorruptError(StoreError):
    """A stored record fails its hash, chain or replay check. `path` and `line` name it (1-based)."""

    def __init__(self, path: str, line: int, problem: str) -> None:
        self.path = path
        self.line = line
        self.problem = problem
        super().__init__(f"{path}:{line}: {problem}")

    def __reduce__(self) -> tuple[type, tuple[str, int, str]]:
        return type(self), (self.path, self.line, self.problem)


class SessionDamagedError(StoreError):
    """A stored session whose chains hold but which fails a check `ledger verify` makes on top of
    them (`Session.problems`: a recorded request's breakpoints that its state no longer renders, a
    scratchpad blob that does not hash to its name or is gone, an entry that renders an invalid
    request). `session_id` names it; `problems` lists each finding, as `ledger verify` prints it."""

    def __init__(self, session_id: str, problems: list[str]) -> None:
        self.session_id = session_id
        self.problems = list(problems)
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        super().__init__(f"session {session_id} fails verification: {problems[0] if problems else '?'}{more}")

    def __reduce__(self) -> tuple[type, tuple[str, list[str]]]:
        return type(self), (self.session_id, self.problems)


class UnconfirmedEntryError(StoreError):
    """A render would apply a summary, ours or the API's (a `summary` or `compaction` ledger
    entry), that no request record commits to and that this session object did not make
    (docs/ledger-format.md, *Unconfirmed entries*). The chains are unkeyed, so such an entry may
    have been appended by anyone who can write the store; its text would reach the model, so it is
    never sent upstream. `session_id` names the session, `entries` the entries' seqs."""

    def __init__(self, session_id: str, entries: list[int]) -> None:
        self.session_id = session_id
        self.entries = list(entries)
        names = ", ".join(f"#{k}" for k in self.entries)
        many = len(self.entries) > 1
        super().__init__(f"session {session_id}: ledger entr{'ies' if many else 'y'} {names} (summar"
                         f"{'ies' if many else 'y'}, ours or the API's) unconfirmed: no request record commits to "
                         f"{'them' if many else 'it'}, so {'they are' if many else 'it is'} not rendered (a forged "
                         "append looks the same; docs/ledger-format.md, *Unconfirmed entries*)")

    def __reduce__(self) -> tuple[type, tuple[str, list[int]]]:
        return type(self), (self.session_id, self.entries)


class ScratchpadRefError(CacheCompactError, ValueError):
    """A scratchpad reference is malformed, would escape its folder, or is unknown."""


# -- configuration -------------------------------------------------------------------------------

class ConfigError(CacheCompactError, ValueError):
    """A setting that cannot work (an unwritable store, a bad TTL, ...), refused before any request."""


class PolicyConfigError(ConfigError):
    """Absurd policy settings (soft > hard, negative numbers, a window under 8k, ...)."""


class UnknownStrategyError(ConfigError, KeyError):
    """No strategy of this name is registered."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown strategy"


class UnknownModelError(CacheCompactError, KeyError):
    """No pricing entry for this model id and no family to fall back on; `register_model` one."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown model"


class TokenizerError(CacheCompactError):
    """The offline BPE tables are missing or do not match tiktoken's expected sha256."""


# -- compaction ----------------------------------------------------------------------------------

class SummaryRejected(CacheCompactError):
    """A summarizer's output is not a usable summary (garbage, lost goal, lost open issue).

    ``cost_usd`` is what the rejected attempt cost, so failures are still accounted for.
    """

    def __init__(self, message: str, cost_usd: float = 0.0) -> None:
        super().__init__(message)
        self.cost_usd = cost_usd
