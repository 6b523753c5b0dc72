"""The store contract: what a session needs from storage, whatever the backend.

A **store** holds many sessions by id (a directory of session directories, or a database).
A **session store** is one session's storage: metadata, three hash-chained append-only logs
(``transcript``, ``ledger``, ``requests``), an unchained event log, content-addressed
scratchpad blobs, and a lock. Every append is a **compare-and-append**: the writer says how
many records it has seen (``at``); if the log holds more, nothing is written and
`StoreConflictError` is raised, so two writers can never both write record N.

Record formats and chain rules are in `records` and docs/ledger-format.md; they are the same
for every backend, so a session verifies with the same verdict in any store.
"""

from __future__ import annotations

import re
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

import xxhash

from ..base.errors import InvalidSessionIdError, StoreError
from ..base.refs import REF_PATTERN, REF_RE, blob_ref, check_ref

__all__ = [
    "BLOB_REF_RE",
    "BODY_REF_RE",
    "LOGS",
    "REF_PATTERN",
    "REF_RE",
    "AtomicAppends",
    "BatchReads",
    "BlobOwners",
    "DeferredSync",
    "LogName",
    "SessionStore",
    "SharedReadLock",
    "Store",
    "TornTail",
    "blob_matches",
    "blob_ref",
    "check_blob_ref",
    "check_ref",
    "check_session_id",
]

LogName = Literal["transcript", "ledger", "requests"]
LOGS: tuple[LogName, ...] = ("transcript", "ledger", "requests")

SESSION_ID_RE = re.compile(r"\A[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}\Z")


BODY_REF_RE = re.compile(r"^body_[0-9a-f]{32}$")  # a request body the proxy kept (--keep-bodies)
BLOB_REF_RE = re.compile(rf"\A(?:{REF_PATTERN}|body_[0-9a-f]{{32}})\Z")  # every name a stored blob may have


def check_blob_ref(ref: object, where: str) -> str:
    """Return ``ref`` if it is a name a stored blob may have (a scratchpad reference or a kept
    body's), else raise `StoreError` naming ``where``: a blob's name becomes a file name and a
    row key, so a name like ``../../x`` or ``/etc/x`` must never reach a path (issue 46)."""
    if not isinstance(ref, str) or not BLOB_REF_RE.match(ref):
        raise StoreError(f"{where}: blob {str(ref)[:80]!r} is not a blob reference (sp_ or body_ + 32 hex "
                         "digits); refusing it")
    return ref


def blob_matches(ref: str, data: bytes) -> bool:
    """Whether stored content is what its name says: a scratchpad reference is ``sp_`` and the first
    32 hex digits of the content's sha256 (`blob_ref`); a kept request body is ``body_`` and the
    content's xxh3-128 (docs/ledger-format.md, *scratchpad*)."""
    if ref.startswith("body_"):
        return bool(BODY_REF_RE.match(ref)) and xxhash.xxh3_128_hexdigest(data) == ref[5:]
    return blob_ref(data) == ref


def check_session_id(sid: object, where: str = "session id") -> str:
    """Return ``sid`` if it is a safe session id, else raise `InvalidSessionIdError`.

    Ids name directories and rows: 1-128 characters of letters, digits, ``_ . -``, not
    starting with ``.`` or ``-``, and never ``.``/``..`` or containing a path separator.
    """
    if not isinstance(sid, str) or not SESSION_ID_RE.match(sid) or sid in (".", ".."):
        shown = repr(sid)[:80]
        raise InvalidSessionIdError(f"{where} {shown} is not a valid session id: use 1-128 characters of "
                                    "letters, digits, '_', '.', '-', starting with a letter, digit or '_'")
    return sid


@dataclass(frozen=True, slots=True)
class TornTail:
    """A partial last record found on read (a crash during an append)."""

    path: str
    line: int
    size: int
    log: str = ""  # which log ("transcript", "ledger", "requests"), for `SessionStore.repair`

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: torn last line ({self.size} bytes) ignored; earlier records kept"


@runtime_checkable
class SessionStore(Protocol):
    """One session's storage. Reads are incremental: `read_new` returns what was appended since
    the previous call (by anyone), so a turn never reloads the whole session."""

    @property
    def session_id(self) -> str: ...

    @property
    def location(self) -> str:
        """Where the session lives, for messages (a directory, or ``url#session``)."""
        ...

    def where(self, log: LogName) -> str:
        """Name of one log for error messages (a file path, or ``url#session/log``)."""
        ...

    def read_meta(self) -> dict[str, Any]: ...

    def write_meta(self, meta: dict[str, Any]) -> None:
        """Replace the metadata atomically (only the prefix fields ever change after creation)."""
        ...

    def read_new(self, log: LogName) -> tuple[list[tuple[int, Any]], TornTail | None]:
        """Records appended since the last call, as (1-based record number, decoded value)."""
        ...

    def read_all(self, log: LogName) -> list[tuple[int, Any]]:
        """Every complete record from the start, without moving `read_new`'s position."""
        ...

    def append(self, log: LogName, records: list[dict[str, Any]], at: int) -> None:
        """Append after exactly ``at`` records, atomically; `StoreConflictError` if the log is longer."""
        ...

    def repair(self, log: LogName) -> TornTail | None:
        """Set a torn last record aside (before the next append); returns what was moved."""
        ...

    def append_event(self, event: dict[str, Any]) -> None: ...

    def read_events(self) -> list[dict[str, Any]]: ...

    def put_blob(self, ref: str, data: bytes) -> None:
        """Store scratchpad content under its content address (idempotent). Stored content that no
        longer matches its name is replaced when ``data`` does (`blob_matches`), so storing the same
        output again mends a damaged copy; content that matches is never rewritten."""
        ...

    def get_blob(self, ref: str) -> bytes | None: ...

    def blob_refs(self) -> list[str]:
        """Every stored content address, sorted (for export)."""
        ...

    def lock(self) -> AbstractContextManager[None]:
        """Exclusive access for read-then-append sequences."""
        ...


# -- optional capabilities: a store written without them still qualifies; the session and the
# engine use them where a store has them (isinstance, so a type checker sees the contract)

@runtime_checkable
class SharedReadLock(Protocol):
    """A session store with a shared lock that never creates the lock file: read-only opens
    (``cachecompact report``, ``ledger verify``) take it instead of the exclusive `lock`."""

    def read_lock(self) -> AbstractContextManager[None]: ...


@runtime_checkable
class BatchReads(Protocol):
    """A session store that reads the new records of several logs in one round trip."""

    def read_new_logs(self, logs: tuple[LogName, ...]) -> dict[LogName, list[tuple[int, Any]]]: ...


@runtime_checkable
class DeferredSync(Protocol):
    """A session store that can append without waiting for the disk (`append_deferred`) and make
    such appends durable later (`flush`); every plain `append` first makes the deferred ones
    durable, so a record made durable never names one that is not (a request record or a ledger
    entry and the transcript it was made on)."""

    def append_deferred(self, log: LogName, records: list[dict[str, Any]], at: int) -> None: ...

    def append_event_deferred(self, event: dict[str, Any]) -> None: ...

    def flush(self) -> None: ...


@runtime_checkable
class AtomicAppends(Protocol):
    """A session store whose `append` of one record is a compare-and-append by itself
    (PostgreSQL's unique key), so a request record needs no lock unless another writer won."""

    atomic_append: bool


@runtime_checkable
class BlobOwners(Protocol):
    """A store that finds the sessions holding scratchpad content ``ref`` (content-addressed, so
    any copy serves), for tools that inspect a store. ``read_scratchpad`` does not use it: it
    reads the caller's own conversation only, never whichever session holds a reference (issue 56)."""

    def blob_owners(self, ref: str) -> list[str]: ...


@runtime_checkable
class Store(Protocol):
    """Many sessions by id. Optional beside it: `BlobOwners`."""

    @property
    def url(self) -> str: ...

    def create(self, session_id: str, meta: dict[str, Any]) -> SessionStore:
        """Create a session atomically: it appears complete or not at all. `SessionExistsError` if taken."""
        ...

    def open(self, session_id: str) -> SessionStore:
        """`SessionNotFoundError` if there is no such (complete) session."""
        ...

    def exists(self, session_id: str) -> bool: ...

    def list(self, prefix: str = "") -> list[str]:
        """Ids of complete sessions starting with ``prefix``, sorted."""
        ...

    def delete(self, session_id: str) -> None:
        """Remove a session and everything in it, atomically as far as readers can tell (what an
        import that failed halfway leaves); `SessionNotFoundError` if there is none."""
        ...

    def close(self) -> None: ...
