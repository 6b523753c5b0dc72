"""The append-only transcript: what the agent said and saw, with indices that never move."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

import msgspec
import xxhash

from .errors import HistoryRewrittenError, MalformedMessageError
from .wire import (
    Message,
    ToolResultBlock,
    ToolUseBlock,
    canonical_bytes,
    content_blocks,
    message_from_dict,
    message_to_dict,
    plain,
    tool_result_ids,
    tool_use_ids,
)

__all__ = ["PROBES_PER_CALL", "MessageRecord", "Transcript", "immutable_prefix_end", "message_hash"]

GENESIS = "0" * 64
PROBES_PER_CALL = 2  # earlier messages compared per sync besides the first and the last recorded one


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


def message_hash(raw: Any) -> bytes:
    """xxh3-128 of the caller's message in canonical encoding (key order and markers never matter)."""
    return xxhash.xxh3_128_digest(canonical_bytes(unmarked(raw if isinstance(raw, dict) else plain(raw))))


class MessageRecord(msgspec.Struct, frozen=True):
    """One parsed, validated message ready to be appended, with its xxh3 hash and sha256 chain value."""

    index: int
    message: Message
    raw: dict[str, Any]
    hash: bytes
    chain: str


class Transcript:
    """Messages in the order they happened. Never edited; compaction lives in the ledger."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self._hashes: list[bytes] = []
        self._tool_ids: set[str] = set()
        self._has_use: list[bool] = []
        self._has_result: list[bool] = []
        self._probe = 0

    def __len__(self) -> int:
        return len(self.messages)

    def __getitem__(self, i: int) -> Message:
        return self.messages[i]

    def hash_of(self, i: int) -> bytes:
        return self._hashes[i]

    def has_tool_use(self, i: int) -> bool:
        return self._has_use[i]

    def is_tool_result_message(self, i: int) -> bool:
        """A user message carrying at least one tool_result (it answers message i-1)."""
        return self._has_result[i]

    def to_dicts(self) -> list[dict[str, Any]]:
        return [message_to_dict(m) for m in self.messages]

    # -- appending -------------------------------------------------------------------------

    def prepare(self, history: Sequence[Any], *, verify_all: bool = False, prev: str = GENESIS) -> list[MessageRecord]:
        """Validate ``history`` (the agent's full list) against what is recorded.

        Returns the new tail as records without changing anything, so a caller can persist
        them first and then `commit`. Raises `HistoryRewrittenError` or `MalformedMessageError`.

        The check of what is already recorded costs constant time, not time proportional to
        the history: the length, the first message, the last recorded message and
        `PROBES_PER_CALL` messages chosen by a rotating probe are compared by hash. A rewrite
        that changes the length, the first or the last recorded message is always caught; a
        rewrite of only messages in between is caught when the probe reaches one of them
        (every message is probed within ``n / PROBES_PER_CALL`` calls), and until then the
        recorded original is what renders. ``verify_all`` compares every message.
        """
        if not isinstance(history, Sequence) or isinstance(history, (str, bytes)):
            raise MalformedMessageError("messages", "must be a list of messages")
        n_old = len(self.messages)
        if len(history) < n_old:
            raise HistoryRewrittenError(len(history), f"history has {len(history)} messages, "
                                                      f"the transcript already has {n_old}")
        if verify_all:
            check: Iterable[int] = range(n_old)
        else:
            check = {0, n_old - 1} if n_old else set()
            if n_old > 2:
                for _ in range(PROBES_PER_CALL):
                    self._probe = (self._probe + 1) % (n_old - 2)
                    check.add(1 + self._probe)
        for i in sorted(check):  # encoding handles SDK models directly: no plain() copy needed
            if message_hash(history[i]) != self._hashes[i]:
                raise HistoryRewrittenError(i)
        return self.prepare_new(history[n_old:], prev=prev)

    def prepare_new(self, new: Sequence[Any], *, prev: str = GENESIS) -> list[MessageRecord]:
        """Validate messages that would be appended after the current end; ``prev`` is the
        transcript chain value so far."""
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
            records.append(MessageRecord(index=i, message=msg, raw=raw, hash=xxhash.xxh3_128_digest(data),
                                         chain=prev))
            prev_msg = msg
        return records

    def commit(self, records: Sequence[MessageRecord]) -> None:
        """Append records produced by `prepare` (after they were persisted)."""
        for rec in records:
            if rec.index != len(self.messages):
                raise ValueError(f"record {rec.index} does not extend a transcript of {len(self.messages)}")
            m = rec.message
            self.messages.append(m)
            self._hashes.append(rec.hash)
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
