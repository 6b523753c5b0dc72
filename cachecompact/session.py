"""Session: one agent conversation = transcript + ledger + renderer, optionally persisted.

Every mutation (``sync``, ``edit``) runs under the store lock as: read what other processes
appended, validate, append to disk with fsync, then update memory. A failed validation
writes nothing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from .errors import ImmutablePrefixError, InvalidEditError, LedgerCorruptError, MalformedMessageError
from .ledger import Edit, Ledger, LedgerEntry, ReplaceWithSummary, SkipRange, check_edit, entry_hash
from .render import Renderer, RenderResult
from .store import LEDGER, TRANSCRIPT, SessionStore, TornTail
from .tokens import TokenCounter
from .transcript import MessageRecord, Transcript, immutable_prefix_end, message_hash
from .wire import ToolDef, message_to_dict, plain, system_from_param, tool_from_dict

__all__ = ["DEFAULT_MAX_TOKENS", "DEFAULT_MODEL", "Session"]

log = logging.getLogger("cachecompact")

DEFAULT_MODEL = "claude-sonnet-4-6"
DEFAULT_MAX_TOKENS = 4096


class Session:
    """An append-only conversation whose compaction is recorded as ledger edits.

    Create with `Session.create(path, ...)` (persisted) or `Session.create(None, ...)`
    (in memory), reopen with `Session.open(path)`.
    """

    def __init__(
        self,
        *,
        system: Any,
        tools: Sequence[Any] | None,
        prefix_messages: int,
        session_id: str,
        store: SessionStore | None,
        tokenizer: str = "cl100k_base",
        prefix_hash: str | None = None,
    ) -> None:
        if not isinstance(prefix_messages, int) or prefix_messages < 0:
            raise ValueError(f"prefix_messages must be a non-negative integer, got {prefix_messages!r}")
        self.session_id = session_id
        self.prefix_messages = prefix_messages
        self.store = store
        self.system_param = plain(system) if system is not None else None
        self.tools_param = [plain(t) for t in tools] if tools else []
        self._system = system_from_param(self.system_param)
        self._tools: list[ToolDef] = [tool_from_dict(t, i) for i, t in enumerate(self.tools_param)]
        self.transcript = Transcript()
        self.ledger = Ledger()
        self.counter = TokenCounter(tokenizer)
        self._prefix_hash = prefix_hash
        self.torn: list[TornTail] = []
        # breakpoints of the previous request sent (block index, chain value): an input of the
        # breakpoint planner, persisted with the request log so a reopened session plans the same
        self.previous_breakpoints: list[tuple[int, bytes]] = []
        self.renderer = Renderer(
            self.transcript, self.ledger, self._tools, self._system, self.counter,
            prefix_end=lambda: self.prefix_end, expected_prefix_hash=lambda: self._prefix_hash,
        )

    # -- construction ------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        path: str | os.PathLike[str] | None,
        *,
        system: Any = None,
        tools: Sequence[Any] | None = None,
        prefix_messages: int = 3,
        session_id: str | None = None,
        tokenizer: str = "cl100k_base",
        lock_timeout: float = 10.0,
    ) -> Session:
        """Start a session; with a ``path`` it is persisted there (the directory must be new or empty)."""
        sid = session_id or uuid.uuid4().hex
        sess = cls(system=system, tools=tools, prefix_messages=prefix_messages, session_id=sid, store=None,
                   tokenizer=tokenizer)
        if path is not None:
            sess.store = SessionStore.create(path, sess._meta(), lock_timeout)
        return sess

    @classmethod
    def open(cls, path: str | os.PathLike[str], lock_timeout: float = 10.0) -> Session:
        """Load a persisted session, verifying transcript hashes, the ledger chain and the prefix."""
        store = SessionStore.open(path, lock_timeout)
        meta = store.read_meta()
        sess = cls(
            system=meta.get("system"), tools=meta.get("tools") or [], prefix_messages=int(meta["prefix_messages"]),
            session_id=str(meta["session_id"]), store=store, tokenizer=str(meta.get("tokenizer", "cl100k_base")),
            prefix_hash=meta.get("prefix_hash"),
        )
        with store.lock():
            sess._refresh()
            sess._record_prefix_if_complete()
        for torn in sess.torn:
            log.warning("%s", torn)
        return sess

    def _meta(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "system": self.system_param,
            "tools": self.tools_param,
            "prefix_messages": self.prefix_messages,
            "prefix_end": self.prefix_end,
            "prefix_hash": self._prefix_hash,
            "tokenizer": self.counter.encoding_name,
        }

    # -- properties ----------------------------------------------------------------------------

    @property
    def path(self) -> Path | None:
        return self.store.path if self.store else None

    @property
    def prefix_end(self) -> int | None:
        """Index of the first editable message, or None while the prefix is still forming."""
        return immutable_prefix_end(self.transcript, self.prefix_messages)

    @property
    def prefix_hash(self) -> str | None:
        return self._prefix_hash

    def __len__(self) -> int:
        return len(self.transcript)

    # -- reading what is on disk ---------------------------------------------------------------

    def _refresh(self) -> None:
        """Apply records other processes appended since we last looked. Caller holds the lock."""
        if self.store is None:
            return
        self.torn = []
        lines, torn = self.store.read_new(TRANSCRIPT)
        if torn:
            self.torn.append(torn)
        path = str(self.store.path / TRANSCRIPT)
        for line_no, rec in lines:
            self._load_transcript_line(path, line_no, rec)
        lines, torn = self.store.read_new(LEDGER)
        if torn:
            self.torn.append(torn)
        path = str(self.store.path / LEDGER)
        for line_no, rec in lines:
            self._load_ledger_line(path, line_no, rec)

    def _load_transcript_line(self, path: str, line_no: int, rec: Any) -> None:
        if not isinstance(rec, dict) or set(rec) != {"h", "i", "m"}:
            raise LedgerCorruptError(path, line_no, "expected an object with keys h, i, m")
        if rec["i"] != len(self.transcript):
            raise LedgerCorruptError(path, line_no, f"index {rec['i']!r}, expected {len(self.transcript)}")
        if not isinstance(rec["m"], dict) or message_hash(rec["m"]).hex() != rec["h"]:
            raise LedgerCorruptError(path, line_no, "message does not match its hash")
        try:
            records = self.transcript.prepare_new([rec["m"]])
        except MalformedMessageError as err:
            raise LedgerCorruptError(path, line_no, str(err)) from None
        self.transcript.commit(records)

    def _load_ledger_line(self, path: str, line_no: int, rec: Any) -> None:
        try:
            entry = msgspec.convert(rec, LedgerEntry)
        except msgspec.ValidationError as err:
            raise LedgerCorruptError(path, line_no, f"not a ledger entry: {err}") from None
        if entry_hash(rec) != entry.hash:
            raise LedgerCorruptError(path, line_no, f"entry #{entry.seq} does not match its hash")
        if entry.seq != len(self.ledger):
            raise LedgerCorruptError(path, line_no, f"seq {entry.seq}, expected {len(self.ledger)}")
        if entry.prev_hash != self.ledger.head_hash:
            raise LedgerCorruptError(path, line_no, f"entry #{entry.seq} prev_hash breaks the chain")
        if entry.transcript_len > len(self.transcript):
            raise LedgerCorruptError(path, line_no, f"entry #{entry.seq} refers to transcript length "
                                                    f"{entry.transcript_len}, only {len(self.transcript)} stored")
        try:
            check_edit(entry.edit, self.transcript, self.prefix_end, self.ledger.entries, entry.transcript_len)
        except InvalidEditError as err:
            raise LedgerCorruptError(path, line_no, f"entry #{entry.seq} does not replay: {err}") from None
        self.ledger.append(entry)

    def _record_prefix_if_complete(self) -> None:
        """Compute and store the prefix hash the first time the prefix is complete."""
        if self._prefix_hash is not None or self.prefix_end is None:
            if self._prefix_hash is not None and self.prefix_end is not None:
                actual = self.renderer.prefix_hash()
                if actual != self._prefix_hash:
                    raise ImmutablePrefixError(
                        f"{self.path or 'session'}: immutable prefix hash {actual} != stored {self._prefix_hash}")
            return
        self._prefix_hash = self.renderer.prefix_hash()
        if self.store is not None:
            self.store.write_meta(self._meta())

    # -- mutation ----------------------------------------------------------------------------

    def sync(self, messages: Sequence[Any]) -> list[int]:
        """Record the agent's full history; append only the new tail. Returns the new indices.

        Raises `HistoryRewrittenError` if an earlier message differs, and `MalformedMessageError`
        for invalid input; in both cases nothing is written.
        """
        with self._locked():
            records = self.transcript.prepare(messages)
            self._append(records)
        return [r.index for r in records]

    def append(self, messages: Sequence[Any]) -> list[int]:
        """Append messages after the current end (no comparison with earlier history)."""
        with self._locked():
            records = self.transcript.prepare_new(list(messages))
            self._append(records)
        return [r.index for r in records]

    def _append(self, records: list[MessageRecord]) -> None:
        if not records:
            return
        if self.store is not None:
            self.store.append_lines(TRANSCRIPT, [{"h": r.hash.hex(), "i": r.index, "m": r.raw} for r in records])
        self.transcript.commit(records)
        self._record_prefix_if_complete()

    def edit(self, edit: Edit, *, level: str = "manual", created_at: str | None = None) -> LedgerEntry:
        """Validate and append one ledger edit. Raises a typed `InvalidEditError`; writes nothing then."""
        if not isinstance(edit, (SkipRange, ReplaceWithSummary)):
            raise InvalidEditError(f"expected SkipRange or ReplaceWithSummary, got {type(edit).__name__}")
        with self._locked():
            check_edit(edit, self.transcript, self.prefix_end, self.ledger.entries)
            draft = self.ledger.make_entry(edit, level=level, transcript_len=len(self.transcript),
                                           tokens_before=0, tokens_after=0, created_at=created_at)
            before, after = self.renderer.edit_tokens(draft)
            entry = self.ledger.make_entry(edit, level=level, transcript_len=len(self.transcript),
                                           tokens_before=before, tokens_after=after, created_at=draft.created_at)
            if self.store is not None:
                self.store.append_lines(LEDGER, [entry])
            self.ledger.append(entry)
        return entry

    @contextlib.contextmanager
    def _locked(self) -> Any:
        """Hold the store lock and catch up with other processes first (no-op in memory)."""
        if self.store is None:
            yield
            return
        with self.store.lock():
            self._refresh()
            yield

    # -- rendering -----------------------------------------------------------------------------

    def render(
        self,
        model: str = DEFAULT_MODEL,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        *,
        at_entry: int | None = None,
        transcript_len: int | None = None,
        breakpoints: bool = True,
        ttl: str | None = None,
        prefix_ttl: str | None = None,
        **params: Any,
    ) -> RenderResult:
        """The request body for ``POST /v1/messages``; extra ``params`` pass through unchanged.

        ``at_entry=K`` replays the request as it was right after ledger entry K was made.
        """
        upto = None
        if at_entry is not None:
            if not 0 <= at_entry < len(self.ledger):
                raise IndexError(f"ledger has {len(self.ledger)} entries; no entry {at_entry}")
            upto = at_entry + 1
            if transcript_len is None:
                transcript_len = self.ledger.entries[at_entry].transcript_len
        if transcript_len is not None and not 0 <= transcript_len <= len(self.transcript):
            raise IndexError(f"transcript has {len(self.transcript)} messages; cannot render {transcript_len}")
        previous = self.previous_breakpoints if upto is None and transcript_len is None else ()
        return self.renderer.render(upto_entry=upto, transcript_len=transcript_len, breakpoints=breakpoints,
                                    previous=previous, ttl=ttl, prefix_ttl=prefix_ttl, model=model,
                                    max_tokens=max_tokens, **params)

    def note_sent(self, render: RenderResult) -> None:
        """Record that ``render`` was sent and answered: its breakpoints guide the next plan."""
        self.previous_breakpoints = render.breakpoint_chain

    def messages(self) -> list[dict[str, Any]]:
        """The full, uncompacted history as plain dicts."""
        return [message_to_dict(m) for m in self.transcript.messages]
