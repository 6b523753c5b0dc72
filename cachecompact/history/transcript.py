"""The append-only transcript: what the agent said and saw, with indices that never move."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, Protocol

import msgspec
import xxhash

from ..base.errors import HistoryRewrittenError, MalformedMessageError
from ..base.wire import (
    Message,
    ToolResultBlock,
    ToolUseBlock,
    bytes_as_is,
    canonical_bytes,
    content_blocks,
    message_from_dict,
    message_to_dict,
    plain,
    tool_result_ids,
    tool_use_ids,
)

__all__ = ["MessageRecord", "Transcript", "TranscriptReader", "canonical_message", "identity_of_bytes",
           "immutable_prefix_end", "message_hash"]

GENESIS = "0" * 64


def unmarked(raw: Any) -> Any:
    """The message without ``cache_control`` markers on its blocks. Markers say where the caller
    wanted a cache breakpoint, not what was said; clients move them every turn (Claude Code
    takes the marker off the previous last block), so they are not part of the history. The
    renderer places its own."""
    content = raw.get("content") if isinstance(raw, dict) else None
    if not isinstance(content, list) or not any(isinstance(b, dict) and "cache_control" in b for b in content):
        return raw
    return {**raw, "content": [{k: v for k, v in b.items() if k != "cache_control"}
                               if isinstance(b, dict) and "cache_control" in b else b for b in content]}


def _text_blocks(text: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": text}]


def _canonical_block(b: Any) -> Any:
    """One content block in canonical form; the same object when it already is."""
    if not isinstance(b, dict):
        return b
    out = b
    if "cache_control" in out:
        out = {k: v for k, v in out.items() if k != "cache_control"}
    if out.get("type") == "tool_result":
        inner = out.get("content")
        if isinstance(inner, str) and inner:
            out = {**out, "content": _text_blocks(inner)}
        elif isinstance(inner, list):
            blocks = [_canonical_block(x) for x in inner]
            if any(x is not y for x, y in zip(blocks, inner, strict=True)):
                out = {**out, "content": blocks}
    return out


def canonical_message(raw: Any) -> Any:
    """The message in the one form that stands for every form the API bills and caches as the
    same message (docs/ledger-format.md, "Message identity"): a non-empty string content is one
    text block, a tool_result's non-empty string content is one text block, and no block (nor
    a block inside a tool_result) carries ``cache_control``. Returns ``raw`` itself when it is
    already canonical, so the common case copies nothing."""
    content = raw.get("content") if isinstance(raw, dict) else None
    if isinstance(content, str):
        return {**raw, "content": _text_blocks(content)} if content else raw
    if isinstance(content, list):
        blocks = [_canonical_block(b) for b in content]
        if any(x is not y for x, y in zip(blocks, content, strict=True)):
            return {**raw, "content": blocks}
    return raw


def message_hash(raw: Any) -> bytes:
    """The message's identity: xxh3-128 of its `canonical_message` form in canonical encoding.
    Two messages have one identity exactly when the API treats them as the same message (key
    order, markers and the string-or-one-text-block choice never matter).

    Computed for every message of every request, so the common case stays in C: the message
    is encoded as it is (no key sorting) and its identity found by the hash of those bytes (an
    agent resends the same messages every turn; equal bytes are an equal message). Only bytes
    not seen before are put in canonical form."""
    return identity_of_bytes(bytes_as_is(raw), raw)


def _canonical_identity(raw: Any) -> bytes:
    """The identity computed from scratch: canonical bytes, and the canonical form built only
    when they hold a marker or a string ``content`` (the only things `canonical_message`
    changes; inside a JSON string every quote is escaped, so text cannot look like either)."""
    data = canonical_bytes(raw)
    if b'"cache_control"' not in data and b'"content":"' not in data:
        return xxhash.xxh3_128_digest(data)
    return xxhash.xxh3_128_digest(canonical_bytes(canonical_message(raw if isinstance(raw, dict) else plain(raw))))


# identities by the xxh3 of some JSON encoding of the message (the encoder's own, or a
# client's bytes): equal bytes are an equal message, so its identity is computed once
_IDENTITY_OF: dict[bytes, bytes] = {}
_IDENTITY_MEMO = 500_000


def identity_of_bytes(data: bytes | memoryview, decoded: Any) -> bytes:
    """The identity of a message the client sent as ``data`` (its own JSON bytes; ``decoded``
    is the same message parsed): hashing the bytes finds an identity already computed for the
    same bytes, so a proxy re-encodes only messages it has not seen."""
    key = xxhash.xxh3_128_digest(data)
    ident = _IDENTITY_OF.get(key)
    if ident is None:
        ident = _canonical_identity(decoded)
        if len(_IDENTITY_OF) >= _IDENTITY_MEMO:
            _IDENTITY_OF.clear()
        _IDENTITY_OF[key] = ident
    return ident


class MessageRecord(msgspec.Struct, frozen=True):
    """One parsed, validated message ready to be appended: its stored form's xxh3 hash (field
    ``h``) and sha256 chain value, and its identity (`message_hash`; the same bytes as ``hash``
    when the stored form is already canonical)."""

    index: int
    message: Message
    raw: dict[str, Any]
    hash: bytes
    chain: str
    ident: bytes
    size: int = 0  # bytes of its canonical JSON (what `Transcript.nbytes` adds up)


class TranscriptReader(Protocol):
    """What a strategy may read of a transcript: its messages and their identities."""

    def __len__(self) -> int: ...

    def __getitem__(self, i: int) -> Message: ...

    def hash_of(self, i: int) -> bytes: ...

    @property
    def identities(self) -> list[bytes]: ...

    def has_tool_use(self, i: int) -> bool: ...

    def is_tool_result_message(self, i: int) -> bool: ...


class Transcript:
    """Messages in the order they happened. Never edited; compaction lives in the ledger."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self._ids: list[bytes] = []  # identity of every message (`message_hash`)
        self.nbytes = 0  # canonical JSON bytes of the messages: what a byte cap on memory counts
        self._tool_ids: set[str] = set()
        self._has_use: list[bool] = []
        self._has_result: list[bool] = []

    def __len__(self) -> int:
        return len(self.messages)

    def __getitem__(self, i: int) -> Message:
        return self.messages[i]

    def hash_of(self, i: int) -> bytes:
        """Message ``i``'s identity (`message_hash`)."""
        return self._ids[i]

    @property
    def identities(self) -> list[bytes]:
        """Every message's identity, in order (the transcript's own list: read, never change)."""
        return self._ids

    def has_tool_use(self, i: int) -> bool:
        return self._has_use[i]

    def is_tool_result_message(self, i: int) -> bool:
        """A user message carrying at least one tool_result (it answers message i-1)."""
        return self._has_result[i]

    def to_dicts(self) -> list[dict[str, Any]]:
        return [message_to_dict(m) for m in self.messages]

    # -- appending -------------------------------------------------------------------------

    def prepare(self, history: Sequence[Any], *, identities: Sequence[bytes] | None = None,
                prev: str = GENESIS) -> list[MessageRecord]:
        """Validate ``history`` (the agent's full list) against what is recorded.

        Returns the new tail as records without changing anything, so a caller can persist
        them first and then `commit`. Raises `HistoryRewrittenError` (naming the first message
        that differs) or `MalformedMessageError`.

        Every recorded message is compared, by identity (`message_hash`): a rewrite anywhere is
        caught on the request that makes it. ``identities`` are the history's identities when
        the caller has them already (the session resolution computes them once per request).
        """
        if not isinstance(history, Sequence) or isinstance(history, (str, bytes)):
            raise MalformedMessageError("messages", "must be a list of messages")
        n_old = len(self.messages)
        if len(history) < n_old:
            raise HistoryRewrittenError(len(history), f"history has {len(history)} messages, "
                                                      f"the transcript already has {n_old}")
        if identities is None:
            ids: Sequence[bytes] = [message_hash(m) for m in history]
        else:  # the resolution's own list: not copied again
            ids = identities if isinstance(identities, list) else list(identities)
        if len(ids) != len(history):
            raise ValueError(f"{len(ids)} identities for {len(history)} messages")
        if ids[:n_old] != self._ids:
            first = next(i for i in range(n_old) if ids[i] != self._ids[i])
            raise HistoryRewrittenError(first)
        return self.prepare_new(history[n_old:], prev=prev, identities=ids[n_old:])

    def prepare_new(self, new: Sequence[Any], *, prev: str = GENESIS,
                    identities: Sequence[bytes] | None = None) -> list[MessageRecord]:
        """Validate messages that would be appended after the current end; ``prev`` is the
        transcript chain value so far, ``identities`` the messages' identities if known."""
        records: list[MessageRecord] = []
        new_ids: set[str] = set()  # tool_use ids in ``new``; with self._tool_ids, no copy of the old set
        prev_msg = self.messages[-1] if self.messages else None
        start = len(self.messages)
        for k, raw_in in enumerate(new):
            i = start + k
            raw = unmarked(plain(raw_in))
            msg = message_from_dict(raw, i)
            self._check_pairing(msg, prev_msg, i, self._tool_ids, new_ids)
            data = canonical_bytes(raw)
            prev = hashlib.sha256(bytes.fromhex(prev) + data).hexdigest()
            digest = xxhash.xxh3_128_digest(data)
            if identities is not None:
                ident = identities[k]
            else:
                canon = canonical_message(raw)
                ident = digest if canon is raw else xxhash.xxh3_128_digest(canonical_bytes(canon))
            records.append(MessageRecord(index=i, message=msg, raw=raw, hash=digest, chain=prev, ident=ident,
                                         size=len(data)))
            prev_msg = msg
        return records

    def commit(self, records: Sequence[MessageRecord]) -> None:
        """Append records produced by `prepare` (after they were persisted)."""
        for rec in records:
            if rec.index != len(self.messages):
                raise ValueError(f"record {rec.index} does not extend a transcript of {len(self.messages)}")
            m = rec.message
            self.messages.append(m)
            self._ids.append(rec.ident)
            self.nbytes += rec.size
            uses = tool_use_ids(m)
            self._tool_ids.update(uses)
            self._has_use.append(bool(uses))
            self._has_result.append(m.role == "user" and bool(tool_result_ids(m)))

    @staticmethod
    def _check_pairing(msg: Message, prev: Message | None, i: int, old_ids: set[str], new_ids: set[str]) -> None:
        where = f"messages[{i}]"
        if prev is None and msg.role != "user":
            raise MalformedMessageError(f"{where}.role", "the first message must be from the user")
        blocks = content_blocks(msg)
        pending = set(tool_use_ids(prev)) if prev is not None and prev.role == "assistant" else set()
        answered: set[str] = set()
        for j, b in enumerate(blocks):
            if isinstance(b, ToolResultBlock):
                if msg.role != "user":
                    raise MalformedMessageError(f"{where}.content[{j}]", "tool_result blocks belong in user messages")
                if b.tool_use_id not in pending:
                    raise MalformedMessageError(
                        f"{where}.content[{j}].tool_use_id",
                        f"tool_result for {b.tool_use_id!r} has no matching tool_use in messages[{i - 1}]",
                    )
                if b.tool_use_id in answered:
                    raise MalformedMessageError(f"{where}.content[{j}].tool_use_id",
                                                f"second tool_result for {b.tool_use_id!r}")
                answered.add(b.tool_use_id)
            elif isinstance(b, ToolUseBlock):
                if msg.role != "assistant":
                    raise MalformedMessageError(f"{where}.content[{j}]", "tool_use blocks belong in assistant messages")
                if b.id in old_ids or b.id in new_ids:
                    raise MalformedMessageError(f"{where}.content[{j}].id", f"duplicate tool_use id {b.id!r}")
                new_ids.add(b.id)
        missing = pending - answered
        if missing:
            raise MalformedMessageError(
                f"{where}.content",
                f"messages[{i - 1}] called tools {sorted(missing)} but this message does not answer them",
            )


def immutable_prefix_end(transcript: Transcript, n: int) -> int | None:
    """First message index after the immutable prefix, or None while it is still forming.

    The prefix is the first ``n`` messages, extended forward while its last message holds a
    tool_use (its results must stay with it).
    """
    end = n
    while True:
        if end == 0:
            return 0
        if end > len(transcript):
            return None
        if not transcript.has_tool_use(end - 1):
            return end
        end += 1
