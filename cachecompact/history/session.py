"""Session: one agent conversation = transcript + ledger + renderer, optionally persisted.

Every mutation (``sync``, ``edit``, ``record_request``) runs under the store's lock as: read
what other writers appended, validate, compare-and-append, then update memory. A failed
validation writes nothing. A strategy's edits are the one exception: ``stage`` validates and
updates memory only, and ``commit`` stores them later, under the lock, after checking that no
other writer appended ledger entries since; a commit that fails leaves the session ``stale``
(its memory holds what the store does not), and every later mutation refuses it.
Loading verifies every chain (transcript content, ledger entries, request records) and the
immutable prefix, and raises `LedgerCorruptError` naming the record; then it runs every other
check `ledger verify` makes (`Session.problems`: the recorded breakpoints, the scratchpad, each
entry's rendering) and raises `SessionDamagedError` on a finding, so nothing that fails the
verifier is ever rendered and sent (issue 56). An entry that puts text before the model (a
summary, ours or the API's: `LedgerEntry.puts_text`) that no request record commits to, and that
this object did not make, is *unconfirmed* (`unconfirmed`): `render` refuses to apply it
(`UnconfirmedEntryError`), because an entry appended at the tail with its chain recomputed looks
exactly like one whose request failed before it was recorded.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import msgspec

from ..base.errors import (
    ImmutablePrefixError,
    InvalidEditError,
    LedgerCorruptError,
    MalformedMessageError,
    SessionDamagedError,
    SessionIdMismatchError,
    StagedEditsConflictError,
    StoreConflictError,
    StoreError,
    UnconfirmedEntryError,
)
from ..base.tokens import TokenCounter
from ..base.values import TTL, RequestRecord, StoredRequest
from ..base.wire import ToolDef, canonical_bytes, message_to_dict, plain, system_from_param, tool_from_dict
from ..cache.request_validation import validate_request
from ..store import (
    AtomicAppends,
    BatchReads,
    DeferredSync,
    FileSessionStore,
    LogName,
    SessionStore,
    SharedReadLock,
    Store,
    TornTail,
)
from ..store.contract import BODY_REF_RE, REF_PATTERN, REF_RE, blob_matches, blob_ref
from ..store.records import GENESIS, record_hash, seal
from .ledger import (
    GENESIS_HASH,
    LEVELS,
    ApiCompaction,
    Edit,
    Ledger,
    LedgerEntry,
    ReplaceWithSummary,
    SkipRange,
    check_edit,
    entry_hash,
)
from .render import Renderer, RenderResult
from .transcript import MessageRecord, Transcript, immutable_prefix_end

__all__ = ["DEFAULT_MAX_TOKENS", "DEFAULT_MODEL", "Session"]

_NAMED_REF = re.compile(rf"\b{REF_PATTERN}\b")  # a scratchpad reference in a ledger entry's text
log = logging.getLogger("cachecompact")

_HEX32 = re.compile(r"[0-9a-f]{32}")

DEFAULT_MODEL = "claude-sonnet-4-6"
DEFAULT_MAX_TOKENS = 4096
_CONFLICT_RETRIES = 5

Target = str | os.PathLike[str] | SessionStore | None


META_KEYS = frozenset({"session_id", "system", "tools", "prefix_messages", "prefix_end", "prefix_hash", "tokenizer",
                       "token_ratio"})
OPTIONAL_META_KEYS = frozenset({"link"})  # the session this one continues (docs/ledger-format.md)


def _link(value: Any) -> dict[str, Any] | None:
    """The stored ``link`` field, checked: an object naming a session, or absent."""
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("session"), str):
        raise TypeError(f"link must be an object with a session id, got {value!r}"[:200])
    return value


class Session:
    """An append-only conversation whose compaction is recorded as ledger edits.

    Create with `Session.create(path, ...)` (a session directory), `Session.create(None, ...)`
    (in memory) or `Session.create(store, session_id=...)` (any `Store`); reopen with
    `Session.open(path)` or `Session.open(store, session_id)`.
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
        token_ratio: float = 1.0,
        link: dict[str, Any] | None = None,
    ) -> None:
        if not isinstance(prefix_messages, int) or isinstance(prefix_messages, bool) or prefix_messages < 0:
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
        self.counter = TokenCounter(tokenizer, calibration=token_ratio)
        self.token_ratio = token_ratio
        # the session this one continues: {"session", "reason", "at"} (a segment after a rewrite or
        # a changed system prompt, another agent under the same name), fixed at creation
        self.link = link
        self._prefix_hash = prefix_hash
        self.torn: list[TornTail] = []
        # ledger edits a strategy staged this turn: rendered and counted, stored by `commit`
        self._staged: list[LedgerEntry] = []
        # scratchpad content a strategy kept this turn (`stage_blob`), stored with the staged edits;
        # and an in-memory session's stored content (a persisted session's is in its store)
        self._staged_blobs: dict[str, bytes] = {}
        self._blobs: dict[str, bytes] = {}
        self.stale = False  # staged edits lost a race with another writer: reopen from the store
        self._chain: list[str] = [GENESIS]  # transcript chain value after 0, 1, ..., n messages
        self._requests = 0
        self._requests_head = GENESIS
        self._request_hashes: list[str] = [GENESIS]  # request chain value after 0, 1, ... records
        # the largest ledger_len a stored request record commits to: entries below it went out in a
        # request that was answered; a summary entry at or past it is unconfirmed (`unconfirmed`)
        self._confirmed = 0
        # seqs of the ledger entries this object made (`edit`, `stage`): its own unconfirmed
        # summary entries are genuine, whatever the store says
        self._own: set[int] = set()
        self.last_request: dict[str, Any] | None = None
        # set by a read-only open that found the prefix fields not yet written (`_check_meta`)
        self.meta_torn: str | None = None
        # breakpoints of the previous request sent (block index, chain value): an input of the
        # breakpoint planner, persisted in the request log so a reopened session plans the same
        self.previous_breakpoints: list[tuple[int, bytes]] = []
        # transcript messages before this index will not be edited next (set by the policy, kept
        # in each request record): the planner marks their end, so the next edit re-writes only
        # what follows
        self.stable_before: int | None = None
        self.renderer = Renderer(
            self.transcript, self.ledger, self._tools, self._system, self.counter,
            prefix_end=lambda: self.prefix_end, expected_prefix_hash=lambda: self._prefix_hash,
        )
        # what the store object offers (`BatchReads`, `AtomicAppends`), checked once per store object:
        # a runtime protocol check costs more than the rest of a refresh that finds nothing new
        self._caps: tuple[SessionStore | None, bool, bool, bool] | None = None
        # transcript and request records are written at once and made durable later (`flush`), where
        # the store can (`DeferredSync`); a ledger entry, the metadata and the next plain append wait
        # for them. Off by default: whoever turns it on calls `flush` once a request is answered
        self.defer_fsync = False

    # -- construction ------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        target: Target | Store,
        *,
        system: Any = None,
        tools: Sequence[Any] | None = None,
        prefix_messages: int = 3,
        session_id: str | None = None,
        tokenizer: str = "cl100k_base",
        token_ratio: float = 1.0,
        lock_timeout: float = 10.0,
        link: dict[str, Any] | None = None,
    ) -> Session:
        """Start a session: ``None`` keeps it in memory, a path makes a new session directory
        there, a `Store` creates ``session_id`` in it. Creation is atomic. ``link`` names the
        session this one continues (`Session.link`)."""
        sid = session_id or uuid.uuid4().hex
        sess = cls(system=system, tools=tools, prefix_messages=prefix_messages, session_id=sid, store=None,
                   tokenizer=tokenizer, token_ratio=token_ratio, link=link)
        if sess.prefix_end is not None:  # prefix_messages=0: the prefix is complete before any message
            sess._prefix_hash = sess.renderer.prefix_hash()
        if target is None:
            return sess
        if isinstance(target, Store):
            sess.store = target.create(sid, sess._meta())
        elif isinstance(target, SessionStore):
            raise TypeError("Session.create takes a path or a Store; open an existing SessionStore with Session.open")
        else:
            sess.store = FileSessionStore.create(target, sess._meta(), lock_timeout)
        return sess

    @classmethod
    def open(cls, target: str | os.PathLike[str] | SessionStore | Store, session_id: str | None = None, *,
             readonly: bool = False, lock_timeout: float = 10.0, verify: bool = True) -> Session:
        """Load a persisted session, verifying every chain and the immutable prefix, then every
        other check `ledger verify` makes (`problems`): `SessionDamagedError` lists what fails.

        ``readonly`` never writes (not even the prefix hash of a session whose prefix just
        completed); a missing prefix hash is then an error. ``verify=False`` skips `problems`
        (for `ledger verify` itself, which reports them one by one, and tools that show a damaged
        session without rendering it).
        """
        if isinstance(target, Store):
            if session_id is None:
                raise TypeError("Session.open(store, session_id): the session id is required")
            store: SessionStore = target.open(session_id)
        elif isinstance(target, SessionStore):
            store = target
        else:
            store = FileSessionStore.open(target, lock_timeout)
        meta = store.read_meta()
        where = f"{store.location} (session metadata)"
        keys = set(meta) - {"format", "version"} - (OPTIONAL_META_KEYS & set(meta))
        if keys != META_KEYS:
            odd = sorted(keys ^ META_KEYS)
            raise StoreError(f"{where}: fields {', '.join(odd)} are unknown or missing (expected exactly "
                             f"{', '.join(sorted(META_KEYS))})")
        try:
            sess = cls(
                system=meta.get("system"), tools=meta.get("tools") or [],
                prefix_messages=meta["prefix_messages"], session_id=str(meta["session_id"]), store=store,
                tokenizer=str(meta.get("tokenizer", "cl100k_base")), prefix_hash=meta.get("prefix_hash"),
                token_ratio=float(meta.get("token_ratio", 1.0)), link=_link(meta.get("link")),
            )
        except (KeyError, TypeError, ValueError, MalformedMessageError) as err:
            raise StoreError(f"{where}: invalid field: {err}") from None
        if isinstance(target, Store) and session_id is not None and sess.session_id != session_id:
            raise SessionIdMismatchError(store.location, session_id, sess.session_id)
        # a read-only open writes nothing, not even a lock file: stores that can lock for reading
        # alone (the file store) offer `read_lock`, an optional extra to the contract
        lock = store.read_lock if readonly and isinstance(store, SharedReadLock) else store.lock
        with lock():
            sess._refresh()
            sess._check_meta(meta, readonly)
        for torn in sess.torn:
            log.warning("%s", torn)
        if verify:
            found = sess.problems()
            if found:
                raise SessionDamagedError(sess.session_id, found)
        return sess

    def _meta(self) -> dict[str, Any]:
        meta = {
            "session_id": self.session_id,
            "system": self.system_param,
            "tools": self.tools_param,
            "prefix_messages": self.prefix_messages,
            "prefix_end": self.prefix_end,
            "prefix_hash": self._prefix_hash,
            "tokenizer": self.counter.encoding_name,
            "token_ratio": self.token_ratio,
        }
        if self.link is not None:
            meta["link"] = self.link
        return meta

    def meta_digest(self) -> str:
        """sha256 of the metadata that never changes after creation (id, system, tools, prefix
        size, tokenizer). Every request record commits to it, so an edited ``session.json`` is
        detected like an edited log line."""
        fixed = {k: v for k, v in self._meta().items() if k not in ("prefix_end", "prefix_hash")}
        return hashlib.sha256(canonical_bytes(fixed)).hexdigest()

    def _check_meta(self, meta: dict[str, Any], readonly: bool) -> None:
        """The stored prefix fields must match what the transcript gives; fill them in once."""
        assert self.store is not None
        where = f"{self.store.location} (session metadata)"
        pe = self.prefix_end
        stored_pe = meta.get("prefix_end")
        if pe is not None:
            if stored_pe is not None and stored_pe != pe:
                raise StoreError(f"{where}: field prefix_end is {stored_pe!r}, but the transcript puts the end of the "
                                 f"immutable prefix at {pe}")
            actual = self.renderer.prefix_hash()
            if self._prefix_hash is None and stored_pe is None:
                # A benign torn state: the message that completed the prefix was appended, and the
                # process died before the prefix fields were written (they are derived from the
                # transcript, which its chain covers, so nothing is lost). A writer fills them in; a
                # read-only open reports it for `ledger verify --repair`.
                self._prefix_hash = actual
                if readonly:
                    self.meta_torn = (f"{where}: the prefix fields were not yet written when the writer stopped "
                                      f"(prefix_end {stored_pe!r}, prefix_hash null, while the transcript completes "
                                      f"the prefix at {pe}): a torn first request, not a change")
                else:
                    self.store.write_meta(self._meta())
            elif self._prefix_hash is None:
                raise StoreError(f"{where}: field prefix_hash is null, but prefix_end is {stored_pe} (the store writes "
                                 "both at once, so this is a changed file, not a torn write)")
            elif actual != self._prefix_hash:
                raise ImmutablePrefixError(f"{where}: field prefix_hash {self._prefix_hash} does not match the "
                                           f"tools, system and first {pe} messages ({actual})")
        elif stored_pe is not None or self._prefix_hash is not None:
            raise StoreError(f"{where}: fields prefix_end/prefix_hash are set ({stored_pe!r}), but the transcript "
                             f"has only {len(self)} messages")

    # -- properties ----------------------------------------------------------------------------

    @property
    def path(self) -> Path | None:
        """The session directory for a file-backed session, else None."""
        return self.store.path if isinstance(self.store, FileSessionStore) else None

    @property
    def prefix_end(self) -> int | None:
        """Index of the first editable message, or None while the prefix is still forming."""
        return immutable_prefix_end(self.transcript, self.prefix_messages)

    @property
    def edit_floor(self) -> int | None:
        """The first message an edit other than an API-written summary may start at: after the
        immutable prefix, and after the messages the newest API-written summary stands for (its
        block opens the request; history/ledger.py). None while the prefix is still forming."""
        pe = self.prefix_end
        if pe is None:
            return None
        end = self.ledger.compaction_end()
        return pe if end is None else max(pe, end + 1)

    @property
    def prefix_hash(self) -> str | None:
        return self._prefix_hash

    @property
    def transcript_head(self) -> str:
        """sha256 chain value over every message so far (64 zeros when empty)."""
        return self._chain[-1]

    def chain_at(self, n: int) -> str:
        """Transcript chain value after the first ``n`` messages."""
        return self._chain[n]

    @property
    def head(self) -> str:
        """``T:L:R:sha256``: lengths of transcript, ledger and request log, and a hash over the prefix
        hash and the three chain heads. An earlier head can be checked with `extends`."""
        return self._head_at(len(self.transcript), len(self.ledger), self._requests)

    def _head_at(self, t: int, e: int, r: int) -> str:
        """docs/ledger-format.md, *The head*: the prefix hash takes part once the first ``t``
        messages complete the prefix (else the word None), as computed from the transcript (which
        the open checked session.json's field against), so a head taken while the prefix formed
        is checked as it was made, and a torn first request has the same head in every verifier."""
        lh = self.ledger.entries[e - 1].hash if e else GENESIS_HASH
        pe = self.prefix_end
        ph = self._prefix_hash if pe is not None and t >= pe else None
        digest = hashlib.sha256(f"{ph}|{self._chain[t]}|{lh}|{self._request_hashes[r]}".encode())
        return f"{t}:{e}:{r}:{digest.hexdigest()}"

    def extends(self, head: str) -> bool:
        """Whether the stored state is ``head`` (an earlier `head`) plus appends: nothing it
        covered was changed, removed or rolled back."""
        try:
            t, e, r, _ = head.split(":")
            ti, ei, ri = int(t), int(e), int(r)
        except ValueError:
            return False
        if not (0 <= ti <= len(self.transcript) and 0 <= ei <= len(self.ledger) and 0 <= ri <= self._requests):
            return False
        return self._head_at(ti, ei, ri) == head

    def __len__(self) -> int:
        return len(self.transcript)

    @property
    def requests_recorded(self) -> int:
        """Request records stored so far (by any writer, as of the last refresh)."""
        return self._requests

    @property
    def confirmed_entries(self) -> int:
        """How many ledger entries a stored request record commits to: the largest ``ledger_len``
        of the request records (0 without any). Entries from this seq on were made after every
        answered request, so nothing stored vouches that a request carried them."""
        return self._confirmed

    def unconfirmed(self) -> list[int]:
        """Seqs of the entries that put text before the model (`LedgerEntry.puts_text`: our
        summaries and the API's) that no request record commits to (seq at or past
        `confirmed_entries`) and that this object did not make (docs/ledger-format.md,
        *Unconfirmed entries*). The chains are unkeyed: such an entry, appended at the tail with
        every hash recomputed, is indistinguishable from a genuine one whose request failed or
        whose process stopped before the record was written, and its text would reach the model;
        so `render` refuses to apply it, and `ledger verify` reports it as UNCONFIRMED. The
        process that made it (this object) still uses it. A `skip` is not listed: it can hide
        messages, never add words (what only a kept head catches: *What the chains prove*)."""
        return [e.seq for e in self.ledger.entries[self._confirmed:]
                if e.puts_text and e.seq not in self._own]

    def _refuse_unconfirmed(self, applied: int) -> None:
        """Raise `UnconfirmedEntryError` when a render of the first ``applied`` entries would
        apply an unconfirmed entry (`unconfirmed`)."""
        if applied > self._confirmed:
            bad = [k for k in self.unconfirmed() if k < applied]
            if bad:
                raise UnconfirmedEntryError(self.session_id, bad)

    # -- reading what is stored -------------------------------------------------------------------

    def _refresh(self) -> None:
        """Apply records other writers appended since we last looked. Caller holds the lock."""
        if self.store is None:
            return
        self.torn = []
        loaders: tuple[tuple[LogName, Callable[[str, int, Any], None]], ...] = (
            ("transcript", self._load_transcript_line), ("ledger", self._load_ledger_line),
            ("requests", self._load_request_line))
        # one round trip for every log, where the store offers it
        got = cast(BatchReads, self.store).read_new_logs(tuple(n for n, _ in loaders)) if self._offers()[0] else None
        for name, loader in loaders:
            if got is not None:
                lines = got[name]
            else:
                lines, torn = self.store.read_new(name)
                if torn:
                    self.torn.append(torn)
            where = self.store.where(name)
            for line_no, rec in lines:
                loader(where, line_no, rec)

    def _load_transcript_line(self, path: str, line_no: int, rec: Any) -> None:
        if not isinstance(rec, dict) or set(rec) != {"c", "h", "i", "m"}:
            raise LedgerCorruptError(path, line_no, "expected an object with keys c, h, i, m")
        if rec["i"] != len(self.transcript):
            raise LedgerCorruptError(path, line_no, f"index {rec['i']!r}, expected {len(self.transcript)}")
        if not isinstance(rec["m"], dict):
            raise LedgerCorruptError(path, line_no, "field m is not a message object")
        try:
            records = self.transcript.prepare_new([rec["m"]], prev=self._chain[-1])
        except MalformedMessageError as err:
            raise LedgerCorruptError(path, line_no, str(err)) from None
        r = records[0]
        if r.hash.hex() != rec["h"]:
            raise LedgerCorruptError(path, line_no, "message does not match its hash (field h)")
        if r.chain != rec["c"]:
            raise LedgerCorruptError(path, line_no, "message does not match its chain value c (content changed, or "
                                                    "an earlier line was removed or reordered)")
        self.transcript.commit(records)
        self._chain.append(r.chain)

    def _load_ledger_line(self, path: str, line_no: int, rec: Any) -> None:
        try:
            entry = msgspec.convert(rec, LedgerEntry)
        except msgspec.ValidationError as err:
            raise LedgerCorruptError(path, line_no, f"not a ledger entry: {err}") from None
        unknown = sorted(set(rec) - set(LedgerEntry.__struct_fields__))
        if unknown:  # a closed record (docs/ledger-format.md, ledger.jsonl), as the spec verifier reads it: a
            # field no reader looks at would pass the hashes of an entry past the last request record unseen
            raise LedgerCorruptError(path, line_no, f"entry #{entry.seq} has an unknown field {unknown[0]!r}")
        if entry_hash(rec) != entry.hash:
            raise LedgerCorruptError(path, line_no, f"entry #{entry.seq} does not match its hash")
        if entry.level not in LEVELS:  # rendered in placeholders: a level the line chose would put its words upstream
            raise LedgerCorruptError(path, line_no, f"entry #{entry.seq} level {entry.level[:80]!r} is not one of "
                                                    f"{', '.join(LEVELS)}")
        if entry.seq != len(self.ledger):
            raise LedgerCorruptError(path, line_no, f"seq {entry.seq}, expected {len(self.ledger)}")
        if entry.prev_hash != self.ledger.head_hash:
            raise LedgerCorruptError(path, line_no, f"entry #{entry.seq} prev_hash breaks the chain")
        if entry.transcript_len > len(self.transcript):
            raise LedgerCorruptError(path, line_no, f"entry #{entry.seq} refers to transcript length "
                                                    f"{entry.transcript_len}, only {len(self.transcript)} stored")
        if entry.transcript_head != self._chain[entry.transcript_len]:
            raise LedgerCorruptError(path, line_no, f"entry #{entry.seq} was made on a different transcript "
                                                    f"(transcript_head does not match message {entry.transcript_len})")
        try:
            check_edit(entry.edit, self.transcript, self.prefix_end, self.ledger.entries, entry.transcript_len)
        except InvalidEditError as err:
            raise LedgerCorruptError(path, line_no, f"entry #{entry.seq} does not replay: {err}") from None
        self.ledger.append(entry)

    def _load_request_line(self, path: str, line_no: int, rec: Any) -> None:
        if not isinstance(rec, dict):
            raise LedgerCorruptError(path, line_no, "not a request record object")
        if record_hash(rec) != rec.get("hash"):
            raise LedgerCorruptError(path, line_no, "request record does not match its hash")
        if rec.get("seq") != self._requests or rec.get("prev_hash") != self._requests_head:
            raise LedgerCorruptError(path, line_no, f"request record seq {rec.get('seq')!r} breaks the chain "
                                                    f"(expected #{self._requests})")
        if rec.get("meta") != self.meta_digest():
            raise LedgerCorruptError(path, line_no, f"request #{self._requests} was made for other session metadata "
                                                    "(session.json was changed: id, system, tools, prefix size or "
                                                    "tokenizer)")
        tl, el = rec.get("transcript_len"), rec.get("ledger_len")
        if not isinstance(tl, int) or not 0 <= tl <= len(self.transcript) or \
                rec.get("transcript_head") != self._chain[tl]:
            raise LedgerCorruptError(path, line_no, f"request #{self._requests} was sent with transcript length "
                                                    f"{tl!r}; the stored transcript is shorter or differs there")
        if not isinstance(el, int) or not 0 <= el <= len(self.ledger) or \
                rec.get("ledger_head") != (self.ledger.entries[el - 1].hash if el else GENESIS_HASH):
            raise LedgerCorruptError(path, line_no, f"request #{self._requests} was sent with {el!r} ledger entries; "
                                                    "the stored ledger is shorter or differs there")
        bps = rec.get("breakpoints")
        if not (isinstance(bps, list) and all(isinstance(b, list) and len(b) == 2 and isinstance(b[0], int)
                                              and not isinstance(b[0], bool) and b[0] >= 0 and isinstance(b[1], str)
                                              and _HEX32.fullmatch(b[1]) for b in bps)):
            raise LedgerCorruptError(path, line_no, f"request #{self._requests} has no list of [block index, 32 hex "
                                                    "digits] breakpoints")
        self._requests += 1
        self._requests_head = rec["hash"]
        self._request_hashes.append(rec["hash"])
        self._confirmed = max(self._confirmed, el)
        self.last_request = rec
        self.previous_breakpoints = [(int(k), bytes.fromhex(h)) for k, h in bps]
        mark = rec.get("stable_before")
        self.stable_before = mark if isinstance(mark, int) and not isinstance(mark, bool) and mark >= 0 else None

    def _offers(self) -> tuple[bool, bool, bool]:
        """Whether the store object batches reads (`BatchReads`), appends atomically
        (`AtomicAppends`) and defers syncs (`DeferredSync`), found once per store object (the
        protocol checks are slow)."""
        caps = self._caps
        if caps is None or caps[0] is not self.store:
            st = self.store
            caps = self._caps = (st, isinstance(st, BatchReads), isinstance(st, AtomicAppends),
                                 isinstance(st, DeferredSync))
        return caps[1], caps[2], caps[3]

    def flush(self) -> None:
        """Make the transcript and request records written with `defer_fsync` durable (a no-op
        for a store that syncs every append)."""
        if self._offers()[2]:
            cast(DeferredSync, self.store).flush()

    # -- mutation ----------------------------------------------------------------------------

    def sync(self, messages: Sequence[Any], *, identities: Sequence[bytes] | None = None) -> list[int]:
        """Record the agent's full history; append only the new tail. Returns the new indices.

        Every stored message is compared with the caller's by identity (`Transcript.prepare`):
        `HistoryRewrittenError` names the first that differs, `MalformedMessageError` reports
        invalid input, and in both cases nothing is written. ``identities`` are the messages'
        identities when the caller computed them already.
        """
        return self._append_with(lambda: self.transcript.prepare(messages, identities=identities,
                                                                 prev=self._chain[-1]))

    def append(self, messages: Sequence[Any]) -> list[int]:
        """Append messages after the current end (no comparison with earlier history)."""
        items = list(messages)
        return self._append_with(lambda: self.transcript.prepare_new(items, prev=self._chain[-1]))

    def _append_with(self, prepare: Any) -> list[int]:
        for _ in range(_CONFLICT_RETRIES):
            with self._locked():
                records: list[MessageRecord] = prepare()
                if not records:
                    return []
                try:
                    self._persist("transcript", [{"c": r.chain, "h": r.hash.hex(), "i": r.index, "m": r.raw}
                                                 for r in records], records[0].index)
                except StoreConflictError:
                    continue  # another writer appended first: catch up and validate again
                self.transcript.commit(records)
                self._chain.extend(r.chain for r in records)
                self._record_prefix_if_complete()
                return [r.index for r in records]
        raise StoreError(f"{self.store.location if self.store else 'session'}: could not append after "
                         f"{_CONFLICT_RETRIES} conflicting writes")

    def _persist(self, log_name: LogName, records: list[dict[str, Any]], at: int) -> None:
        if self.store is None:
            return
        if self.defer_fsync and log_name != "ledger" and self._offers()[2]:
            cast(DeferredSync, self.store).append_deferred(log_name, records, at)
        else:
            self.store.append(log_name, records, at)

    def _record_prefix_if_complete(self) -> None:
        """Compute and store the prefix hash the first time the prefix is complete."""
        if self._prefix_hash is not None or self.prefix_end is None:
            return
        self._prefix_hash = self.renderer.prefix_hash()
        if self.store is not None:
            self.store.write_meta(self._meta())

    def edit(self, edit: Edit, *, level: str = "manual", created_at: str | None = None) -> LedgerEntry:
        """Validate and append one ledger edit, stored at once (edits staged before it are stored
        first). Raises a typed `InvalidEditError`; nothing of this edit is written then."""
        self._check_edit_type(edit)
        for _ in range(_CONFLICT_RETRIES):
            with self._locked():
                entry = self._entry(edit, level, created_at)
                try:
                    self._persist("ledger", [msgspec.to_builtins(entry)], entry.seq)
                except StoreConflictError:
                    continue
                self.ledger.append(entry)
                self._own.add(entry.seq)
                return entry
        raise StoreError(f"{self.store.location if self.store else 'session'}: could not append an edit after "
                         f"{_CONFLICT_RETRIES} conflicting writes")

    def stage(self, edit: Edit, *, level: str = "manual", created_at: str | None = None) -> LedgerEntry:
        """Validate and append one ledger edit in memory only: renders and counts see it at once,
        and `commit` stores it. A strategy plans this way and returns its staged entries in its
        `Plan`; the engine commits them after the strategy returns, so no strategy writes to the
        store. Raises a typed `InvalidEditError`; stages nothing then."""
        self._check_edit_type(edit)
        self._refuse_stale()
        entry = self._entry(edit, level, created_at)
        self.ledger.append(entry)
        self._own.add(entry.seq)
        self._staged.append(entry)
        return entry

    @property
    def staged(self) -> list[LedgerEntry]:
        """The edits staged and not yet stored, in order."""
        return list(self._staged)

    def stage_blob(self, data: bytes) -> str:
        """Keep ``data`` as scratchpad content, stored with the staged edits by `commit` (a ledger
        entry may name it at once); its reference, the hash of the bytes (`store.contract.blob_ref`)."""
        self._refuse_stale()
        ref = blob_ref(data)
        self._staged_blobs.setdefault(ref, data)
        return ref

    @property
    def staged_blobs(self) -> dict[str, bytes]:
        """The scratchpad content staged and not yet stored, by reference."""
        return dict(self._staged_blobs)

    def put_blob(self, data: bytes) -> str:
        """Store scratchpad content now, outside a plan (`Scratchpad.put`); its reference."""
        ref = blob_ref(data)
        if self.store is not None:
            self.store.put_blob(ref, data)
        else:
            self._blobs.setdefault(ref, data)
        return ref

    def blob(self, ref: str) -> bytes | None:
        """Stored scratchpad content by reference: the store's, or an in-memory session's; None
        when it is not held. The bytes are returned as stored (callers check their hash)."""
        if self.store is not None:
            return self.store.get_blob(ref)
        return self._blobs.get(ref)

    def commit(self) -> list[LedgerEntry]:
        """Store the staged scratchpad content and edits together; the edits stored.

        The entries were made at the ledger's length as this process knew it. Under the store's
        lock, ledger entries another writer appended since are looked for first (a torn tail
        is repaired only then, so no other writer's entry is ever cut away). When there are any,
        or a write fails, no entry of the plan is stored, the session is marked `stale` and
        `StagedEditsConflictError` (for a lost race) or the write's own error is raised: its
        memory holds entries the store does not, so it must be opened again from the store
        (the engine does). The content goes first, each blob written atomically, so a stored
        entry never names content the store lacks; content of a plan that failed after it is
        unnamed and harmless (content-addressed: the same bytes, the same name)."""
        staged, self._staged = self._staged, []
        blobs, self._staged_blobs = self._staged_blobs, {}
        if self.store is None:
            self._blobs.update(blobs)
            return staged
        if not staged and not blobs:
            return staged
        try:
            with self.store.lock():
                if staged:  # content alone names nothing and cannot conflict: it is written as it is
                    theirs, _torn = self.store.read_new("ledger")
                    if theirs:
                        raise StoreConflictError(self.store.where("ledger"), staged[0].seq,
                                                 staged[0].seq + len(theirs))
                for ref, data in blobs.items():
                    self.store.put_blob(ref, data)
                if staged:
                    self._persist("ledger", [msgspec.to_builtins(e) for e in staged], staged[0].seq)
        except StoreConflictError as err:
            self.stale = True
            raise StagedEditsConflictError(self.session_id, f"{self.store.location}: {len(staged)} staged ledger "
                                           f"edit(s) not stored: another writer appended first ({err})") from None
        except BaseException:
            self.stale = True
            raise
        return staged

    def _settle(self) -> None:
        """Before anything reads or writes the store: refuse a stale session, store staged edits
        (a strategy driven by hand, without the engine, that did not commit)."""
        self._refuse_stale()
        if self._staged or self._staged_blobs:
            self.commit()

    def _refuse_stale(self) -> None:
        if self.stale:
            raise StagedEditsConflictError(self.session_id, f"session {self.session_id}: its memory holds ledger "
                                           "edits that were never stored; open it again from the store")

    @staticmethod
    def _check_edit_type(edit: Edit) -> None:
        if not isinstance(edit, (SkipRange, ReplaceWithSummary, ApiCompaction)):
            raise InvalidEditError(f"expected SkipRange, ReplaceWithSummary or ApiCompaction, got "
                                   f"{type(edit).__name__}")

    def _entry(self, edit: Edit, level: str, created_at: str | None) -> LedgerEntry:
        """The ledger entry ``edit`` makes now, checked against the history and the ledger,
        with the tokens its range holds before and after."""
        check_edit(edit, self.transcript, self.prefix_end, self.ledger.entries)
        n = len(self.transcript)
        draft = self.ledger.make_entry(edit, level=level, transcript_len=n, transcript_head=self._chain[n],
                                       tokens_before=0, tokens_after=0, created_at=created_at)
        before, after = self.renderer.edit_tokens(draft)
        return self.ledger.make_entry(edit, level=level, transcript_len=n, transcript_head=self._chain[n],
                                      tokens_before=before, tokens_after=after, created_at=draft.created_at)

    def edit_effect(self, edit: Edit) -> tuple[int, int]:
        """Estimated tokens ``edit``'s range occupies now and would after it (nothing is written)."""
        check_edit(edit, self.transcript, self.prefix_end, self.ledger.entries)
        n = len(self.transcript)
        draft = self.ledger.make_entry(edit, level="manual", transcript_len=n, transcript_head=self._chain[n],
                                       tokens_before=0, tokens_after=0)
        return self.renderer.edit_tokens(draft)

    def record_request(self, render: RenderResult, fields: RequestRecord | Mapping[str, Any]) -> dict[str, Any]:
        """Append a sealed record of a request that was sent from ``render`` and answered.

        It commits to the transcript and ledger state the request was rendered from, and
        carries the request's breakpoints and compacted-part mark, which guide the next
        render's breakpoint plan. ``fields`` is the engine's `RequestRecord`, or the fields of
        a tool that keeps its own records in a session.
        """
        self._settle()  # the record commits to a ledger state: the staged edits first, never a lost one
        t_len = self._render_transcript_len(render)
        own = fields.fields() if isinstance(fields, RequestRecord) else dict(fields)
        base = {**own, "meta": self.meta_digest(), "transcript_len": t_len, "transcript_head": self._chain[t_len],
                "ledger_len": render.n_entries,
                "ledger_head": self.ledger.entries[render.n_entries - 1].hash if render.n_entries else GENESIS_HASH,
                "breakpoints": [[k, h.hex()] for k, h in render.breakpoint_chain]}
        if self.stable_before is not None:
            base["stable_before"] = self.stable_before
        if self._offers()[1] and cast(AtomicAppends, self.store).atomic_append:
            # a store whose append is an atomic compare-and-append by itself (PostgreSQL's unique
            # key) needs no lock for one record: try at the known position; only when another
            # writer got there first, catch up under the lock (below)
            rec = seal(base, self._requests, self._requests_head)
            with contextlib.suppress(StoreConflictError):
                self._persist("requests", [rec], self._requests)
                return self._recorded(rec, render)
        for _ in range(_CONFLICT_RETRIES):
            with self._locked():
                rec = seal(base, self._requests, self._requests_head)
                try:
                    self._persist("requests", [rec], self._requests)
                except StoreConflictError:
                    continue
                return self._recorded(rec, render)
        raise StoreError(f"{self.store.location if self.store else 'session'}: could not record a request after "
                         f"{_CONFLICT_RETRIES} conflicting writes")

    def _recorded(self, rec: dict[str, Any], render: RenderResult) -> dict[str, Any]:
        self._requests += 1
        self._requests_head = rec["hash"]
        self._request_hashes.append(rec["hash"])
        self._confirmed = max(self._confirmed, int(rec["ledger_len"]))
        self.last_request = rec
        self.previous_breakpoints = render.breakpoint_chain
        mark = rec.get("stable_before")  # ours, even if catching up on another writer replaced it
        self.stable_before = mark if isinstance(mark, int) else None
        return rec

    def _render_transcript_len(self, render: RenderResult) -> int:
        """How many transcript messages ``render`` was made from (its last rendered source + 1)."""
        n = render.transcript_len
        return n if n is not None and 0 <= n <= len(self.transcript) else len(self.transcript)

    def note_sent(self, render: RenderResult) -> None:
        """Use ``render``'s breakpoints for the next plan without recording a request (in-memory use)."""
        self.previous_breakpoints = render.breakpoint_chain

    def log_event(self, event: dict[str, Any]) -> None:
        """Append to the informational event log (not chained); no-op in memory."""
        if self.store is not None:
            self.store.append_event(event)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold the store lock and catch up with other writers first (no-op in memory)."""
        self._settle()  # catching up would read other writers' entries over staged or lost ones
        if self.store is None:
            yield
            return
        with self.store.lock():
            self._refresh()
            yield

    def refresh(self) -> None:
        """Catch up with records other processes or replicas appended."""
        with self._locked():
            pass

    # -- rendering -----------------------------------------------------------------------------

    def render(
        self,
        model: str = DEFAULT_MODEL,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        *,
        at_entry: int | None = None,
        transcript_len: int | None = None,
        breakpoints: bool = True,
        ttl: TTL | None = None,
        prefix_ttl: TTL | None = None,
        uncompacted: bool = False,
        warm: bool = False,
        **params: Any,
    ) -> RenderResult:
        """The request body for ``POST /v1/messages``; extra ``params`` pass through unchanged.

        ``at_entry=K`` replays the request as it was right after ledger entry K was made;
        ``uncompacted=True`` renders the whole transcript with no ledger entry applied (what the
        caller sent, every original back). ``warm=True`` with ``transcript_len`` (a request over
        the start of the conversation: the API's compaction request) also marks the previous
        request's writes and the compacted part's end that it still shares, so it reads the
        longest of them that is warm before it writes the rest. A render that would apply an
        unconfirmed summary, ours or the API's (`unconfirmed`), raises `UnconfirmedEntryError`
        instead: what no process vouches for is never sent.
        """
        upto = None
        if uncompacted:
            if at_entry is not None:
                raise ValueError("give at_entry or uncompacted, not both")
            upto = 0
            transcript_len = len(self.transcript) if transcript_len is None else transcript_len
        if at_entry is not None:
            if not 0 <= at_entry < len(self.ledger):
                raise IndexError(f"ledger has {len(self.ledger)} entries; no entry {at_entry}")
            upto = at_entry + 1
            if transcript_len is None:
                transcript_len = self.ledger.entries[at_entry].transcript_len
        if transcript_len is not None and not 0 <= transcript_len <= len(self.transcript):
            raise IndexError(f"transcript has {len(self.transcript)} messages; cannot render {transcript_len}")
        self._refuse_unconfirmed(len(self.ledger) if upto is None else upto)
        live = upto is None and transcript_len is None
        return self.renderer.render(upto_entry=upto, transcript_len=transcript_len, breakpoints=breakpoints,
                                    previous=self.previous_breakpoints if live or warm else (),
                                    stable_before=self.stable_before if live or warm else None, ttl=ttl,
                                    prefix_ttl=prefix_ttl, model=model, max_tokens=max_tokens, **params)

    def repair_meta(self) -> None:
        """Write the prefix fields a torn first request left unwritten (`meta_torn`)."""
        if self.meta_torn is not None and self.store is not None:
            self.store.write_meta(self._meta())
            self.meta_torn = None

    def problems(self) -> list[str]:
        """Every finding of the checks `cachecompact ledger verify` makes beyond the chains, the
        commitments and the immutable prefix (which loading checks): the scratchpad
        (`blob_problems`), each request record's breakpoints against the request its state renders
        (`request_problems`), and each ledger entry's rendering validated as the API would
        (`entry_problems`). Empty when all is well. `Session.open` runs it, and `ledger verify`
        prints it: one function, so a session a process renders is one the verifier passes."""
        return self.blob_problems() + self.request_problems() + self.entry_problems()

    def entry_problems(self) -> list[str]:
        """The first ledger entry whose request, rendered right after it (`render(at_entry=K)`),
        is not one the API accepts (`cache.request_validation.validate_request`); empty when
        every one is. Unconfirmed entries are checked too (rendered here, never sent), so a
        forged one that would render an invalid request is INVALID, not merely UNCONFIRMED."""
        where = self.store.where("ledger") if self.store is not None else "ledger"
        for e in self.ledger.entries:
            try:
                validate_request(self.renderer.render(
                    upto_entry=e.seq + 1, transcript_len=e.transcript_len, breakpoints=True, previous=(),
                    stable_before=None, ttl=None, prefix_ttl=None, model=DEFAULT_MODEL,
                    max_tokens=DEFAULT_MAX_TOKENS).body)
            except MalformedMessageError as err:
                return [f"{where}:{e.seq + 1}: entry #{e.seq} renders an invalid request: {err}"]
        return []

    def blob_problems(self) -> list[str]:
        """What is wrong with the session's scratchpad content (docs/ledger-format.md, *scratchpad*):
        stored content whose reference is not the hash of its bytes (edited or damaged), and
        references that a ledger entry's text names but the store does not hold (deleted). Empty
        when all is well, and for a session without a store."""
        if self.store is None:
            return []
        out = []
        for ref in self.store.blob_refs():
            if not (REF_RE.match(ref) or BODY_REF_RE.match(ref)):
                out.append(f"{self.store.location}: scratchpad {ref!r}: not a scratchpad reference or a kept body")
                continue
            data = self.store.get_blob(ref)
            if data is not None and not blob_matches(ref, data):
                out.append(f"{self.store.location}: scratchpad {ref}: its content does not hash to its reference "
                           "(changed or damaged after it was stored)")
        held = set(self.store.blob_refs())
        for e in self.ledger.entries:
            for ref in _NAMED_REF.findall(e.summary or ""):
                if ref not in held:
                    out.append(f"{self.store.where('ledger')}:{e.seq + 1}: entry #{e.seq} names scratchpad {ref}, "
                               "which the store does not hold (deleted)")
                    held.add(ref)  # said once
        return out

    def request_problems(self) -> list[str]:
        """Request records whose breakpoints are not what the request they commit to renders
        (docs/ledger-format.md, *Verifying a session*): each record's breakpoint chain values are
        compared with the request rendered again from its ``transcript_len`` and ``ledger_len``.
        The chains alone pass a forger who rewrites a message or an entry and recomputes every
        hash after it; the breakpoints commit to the rendered bytes, so that forgery is caught
        up to the last breakpoint (issue 46: the spec verifier checked this, `ledger verify` did
        not). A record's ``stable_before`` must lie within the transcript it commits to, as the
        spec verifier checks too. Empty for a session without a store."""
        if self.store is None:
            return []
        where = self.store.where("requests")
        out: list[str] = []
        renders: dict[tuple[int, int], Sequence[bytes]] = {}
        try:
            records = self.request_records()
        except LedgerCorruptError as err:  # a record that does not fit its type is a finding, not a crash
            return [str(err)]
        for rec in records:
            t_len, e_len, points = rec.transcript_len, rec.ledger_len, rec.breakpoints
            if rec.stable_before is not None and not 0 <= rec.stable_before <= t_len:
                out.append(f"{where}:{rec.seq + 1}: request #{rec.seq}'s stable_before {rec.stable_before} is not "
                           f"within the {t_len} messages it was rendered from")
            if not points:
                continue
            chain = renders.get((t_len, e_len))
            if chain is None:
                chain = renders[(t_len, e_len)] = self.renderer.render(
                    upto_entry=e_len, transcript_len=t_len, breakpoints=False).block_hashes
                if len(renders) > 64:
                    renders.pop(next(iter(renders)))
            for k, h in points:
                if k >= len(chain) or chain[k].hex() != h:
                    out.append(f"{where}:{rec.seq + 1}: request #{rec.seq}'s breakpoint at block {k} is not in the "
                               f"request rendered from {t_len} messages and {e_len} ledger entries (a message, an "
                               "entry or the record was changed and every hash after it recomputed)")
                    break
        return out

    def request_records(self) -> list[StoredRequest]:
        """The stored request records, decoded (`StoredRequest`: its usage typed, unknown usage
        fields kept); empty for a session without a store. A record that does not fit its type is
        a `LedgerCorruptError` naming its line."""
        if self.store is None:
            return []
        where = self.store.where("requests")
        out: list[StoredRequest] = []
        for line, rec in self.store.read_all("requests"):
            try:
                out.append(StoredRequest.of(rec if isinstance(rec, dict) else {}))
            except ValueError as err:
                raise LedgerCorruptError(where, line, str(err)) from None
        return out

    def messages(self) -> list[dict[str, Any]]:
        """The full, uncompacted history as plain dicts."""
        return [message_to_dict(m) for m in self.transcript.messages]
