"""Compaction as data: an append-only, sha256-chained ledger of edits over the transcript.

Three edit kinds act on inclusive message ranges: `SkipRange` and `ReplaceWithSummary`, which
cachecompact writes, and `ApiCompaction`, a summary the API wrote (on-demand compaction: a signed
``compaction`` block). Rules (checked by `check_edit`):

* the range lies inside the transcript and after the immutable prefix;
* a `SkipRange` whose messages are all tool-result messages clears those results in place
  (the tool_use/tool_result pairs stay, with a placeholder); any other edit must hold whole
  tool pairs: it may not start on a tool-result message nor end on a message with a
  tool_use. Such edits are **rejected** (not widened), and the error suggests the widened
  range; `widen_to_pairs` computes it for callers that want widening;
* an edit that overlaps an earlier one must contain it completely, so the later edit
  subsumes the earlier one and the effective edits are always disjoint;
* an edit with a ``tool_use_id`` targets one block of one message: on the user message
  holding that tool result, the result's content; on the assistant message holding that
  tool_use, the call's ``input`` (big inputs such as the content of a file write). The pair
  stays and only that content changes (a ``SkipRange`` clears it, a ``ReplaceWithSummary``
  shows the summary in its place).
  Edits on different results of one message do not overlap; a whole-message edit over the
  message contains them.
* an `ApiCompaction` starts at message 0 and covers the immutable prefix's messages: the API
  requires its block first in ``messages`` (build-with-claude/compaction-on-demand: "Send it
  first in `messages`, in place of the messages it summarizes"; summarized messages left in
  front of it are ``compaction_block_misplaced``). It is the one edit that may stand for the
  first turns; ``system`` and ``tools`` stay byte-identical (docs/ledger-format.md, *API-written
  summaries*). It ends on a user message and, when messages follow, the first of them is an
  assistant message: "the first kept message differs in role from the last summarized one and
  is not a mid-conversation system message" (build-with-claude/compaction-thinking-blocks), the
  condition under which the kept turns' thinking stays valid. Every other edit starts after it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Final, Literal, Protocol

import msgspec

from ..base.errors import EditOverlapError, EditSplitsToolPairError, EditTouchesPrefixError, InvalidEditError
from ..base.wire import canonical_bytes, tool_result_ids, tool_use_ids
from .transcript import Transcript, TranscriptReader

__all__ = [
    "GENESIS_HASH",
    "GIVEN_BACK_LEVEL",
    "LEVELS",
    "ApiCompaction",
    "Edit",
    "Ledger",
    "LedgerEntry",
    "LedgerReader",
    "ReplaceWithSummary",
    "SkipRange",
    "check_edit",
    "compaction_end",
    "entry_hash",
    "overlaps",
    "split_effective",
    "widen_to_pairs",
]

GENESIS_HASH = "0" * 64
GIVEN_BACK_LEVEL: Final = "restore"  # an edit that adds hidden lines back to a new result (`compaction.restore`)
LEVELS = ("L1", "L2", "L3", "L4", "L5", GIVEN_BACK_LEVEL, "manual")
Kind = Literal["skip", "summary", "compaction"]


class SkipRange(msgspec.Struct, frozen=True):
    """Drop messages start..end (inclusive), or clear them in place if they are all tool results.

    With ``tool_use_id``, clear only that tool result (``start == end`` is its message).
    """

    start: int
    end: int
    reason: str = ""
    tool_use_id: str | None = None


class ReplaceWithSummary(msgspec.Struct, frozen=True):
    """Show one marked summary message in place of messages start..end (inclusive).

    With ``tool_use_id``, the summary becomes that one tool result's content instead.
    """

    start: int
    end: int
    summary: str
    reason: str = ""
    tool_use_id: str | None = None


class ApiCompaction(msgspec.Struct, frozen=True):
    """Show the API's signed ``compaction`` block, as an assistant message of its own, in place
    of messages 0..end (inclusive). ``content`` and ``signature`` are the block as the API
    returned it, byte for byte: a changed signature or content is a 400."""

    start: int
    end: int
    content: str
    signature: str
    reason: str = ""
    tool_use_id: None = None


Edit = SkipRange | ReplaceWithSummary | ApiCompaction


class LedgerEntry(msgspec.Struct, frozen=True, omit_defaults=True):
    """One line of ``ledger.jsonl``. ``hash`` = sha256 over the entry without ``hash``."""

    seq: int
    kind: Kind
    start: int
    end: int
    level: str
    reason: str
    created_at: str
    transcript_len: int
    tokens_before: int
    tokens_after: int
    prev_hash: str
    transcript_head: str = ""  # transcript chain value at transcript_len: the entry commits to it
    hash: str = ""
    summary: str | None = None
    tool_use_id: str | None = None
    signature: str | None = None  # an API-written summary's signature (kind "compaction"; summary: its content)

    @property
    def puts_text(self) -> bool:
        """Whether this entry puts text of its own, taken from the stored line, before the model:
        such an entry is trusted only once a request record commits to it (docs/ledger-format.md,
        *Unconfirmed entries*), because the chains are unkeyed and one appended at the tail with
        every hash recomputed looks exactly like a genuine one whose request was never answered.

        * ``summary`` (`ReplaceWithSummary`): yes. Its ``summary`` is rendered as a user message
          under cachecompact's header, or as a tool result's content or a tool call's ``input``.
        * ``compaction`` (`ApiCompaction`): yes. Its ``summary`` is the API's block, rendered as
          the request's first message.
        * ``skip`` (`SkipRange`): no. It only hides messages; a cleared result or input shows a
          placeholder of fixed words around the entry's seq, its ``level`` (one of `LEVELS`, which
          loading checks) and a token count the renderer computes, nothing the line can choose.

        A match without a default, so a new kind does not type-check until it is decided here."""
        match self.kind:
            case "summary" | "compaction":
                return True
            case "skip":
                return False

    @property
    def edit(self) -> Edit:
        if self.kind == "compaction":
            return ApiCompaction(self.start, self.end, self.summary or "", self.signature or "", self.reason)
        if self.kind == "summary":
            return ReplaceWithSummary(self.start, self.end, self.summary or "", self.reason, self.tool_use_id)
        return SkipRange(self.start, self.end, self.reason, self.tool_use_id)

    def contains(self, other: LedgerEntry | Edit) -> bool:
        return (self.start <= other.start and other.end <= self.end
                and (self.tool_use_id is None or self.tool_use_id == other.tool_use_id))


def overlaps(a: LedgerEntry | Edit, b: LedgerEntry | Edit) -> bool:
    """Ranges intersect and, when both target single results, they target the same one."""
    if a.end < b.start or b.end < a.start:
        return False
    return a.tool_use_id is None or b.tool_use_id is None or a.tool_use_id == b.tool_use_id


def _contains(a: Edit, b: LedgerEntry) -> bool:
    return (a.start <= b.start and b.end <= a.end
            and (a.tool_use_id is None or a.tool_use_id == b.tool_use_id))


def entry_hash(entry: LedgerEntry | dict[str, Any]) -> str:
    """sha256 hex of the canonical JSON of the entry with its ``hash`` key removed."""
    d = msgspec.to_builtins(entry) if isinstance(entry, LedgerEntry) else dict(entry)
    d.pop("hash", None)
    return hashlib.sha256(canonical_bytes(d)).hexdigest()


def _is_clear_in_place(edit: Edit, t: Transcript) -> bool:
    return edit.tool_use_id is not None or (isinstance(edit, SkipRange) and all(
        t.is_tool_result_message(i) for i in range(edit.start, edit.end + 1)
    ))


def widen_to_pairs(t: TranscriptReader, start: int, end: int) -> tuple[int, int] | None:
    """Smallest range ⊇ start..end holding whole tool pairs, or None if it runs off the end."""
    while start > 0 and t.is_tool_result_message(start):
        start -= 1
    while t.has_tool_use(end):
        end += 1
        if end >= len(t):
            return None
    return start, end


def check_edit(
    edit: Edit,
    t: Transcript,
    prefix_end: int | None,
    earlier: Sequence[LedgerEntry],
    transcript_len: int | None = None,
) -> None:
    """Raise a typed `InvalidEditError` if ``edit`` may not be appended after ``earlier``."""
    n = len(t) if transcript_len is None else transcript_len
    s, e = edit.start, edit.end
    if not isinstance(s, int) or not isinstance(e, int) or isinstance(s, bool) or isinstance(e, bool):
        raise InvalidEditError("edit start and end must be integers")
    if s < 0 or e < s:
        raise InvalidEditError(f"edit range {s}..{e} is empty or negative")
    if e >= n:
        raise InvalidEditError(f"edit range {s}..{e} ends past the transcript (length {n})")
    if prefix_end is None:
        raise EditTouchesPrefixError("the immutable prefix is not complete yet; nothing can be edited")
    if isinstance(edit, ApiCompaction):
        _check_api_compaction(edit, t, prefix_end, n)
    elif s < prefix_end:
        raise EditTouchesPrefixError(
            f"edit range {s}..{e} touches the immutable prefix (messages 0..{prefix_end - 1})")
    if isinstance(edit, ReplaceWithSummary) and not edit.summary.strip():
        raise InvalidEditError("a summary edit needs a non-empty summary")
    floor = compaction_end(earlier)
    if not isinstance(edit, ApiCompaction) and floor is not None and s <= floor:
        raise EditTouchesPrefixError(f"edit range {s}..{e} starts inside the API-written summary of messages "
                                     f"0..{floor} (ledger); start after message {floor}")
    if edit.tool_use_id is not None:
        if s != e:
            raise InvalidEditError(f"an edit of tool call {str(edit.tool_use_id)[:80]!r} must cover exactly one "
                                   "message")
        holds = (edit.tool_use_id in tool_result_ids(t[s]) if t.is_tool_result_message(s)
                 else t[s].role == "assistant" and edit.tool_use_id in tool_use_ids(t[s]))
        if not holds:
            raise InvalidEditError(f"message {s} holds no tool result or tool call {str(edit.tool_use_id)[:80]!r}")
    if not _is_clear_in_place(edit, t):
        split_start = t.is_tool_result_message(s)
        split_end = t.has_tool_use(e)
        if split_start or split_end:
            where = (f"message {s} holds tool results for message {s - 1}" if split_start
                     else f"message {e} calls tools answered in message {e + 1}")
            raise EditSplitsToolPairError(f"edit range {s}..{e} splits a tool pair: {where}",
                                          widen_to_pairs(t, s, e) if n == len(t) else None)
    for prior in earlier:
        if overlaps(edit, prior) and not _contains(edit, prior):
            raise EditOverlapError(
                f"edit range {s}..{e} overlaps ledger entry #{prior.seq} ({prior.start}..{prior.end}"
                f"{', result ' + prior.tool_use_id if prior.tool_use_id else ''}) without containing it")
    if isinstance(edit, SkipRange) and not _is_clear_in_place(edit, t) and _first_shown(edit, t, n, earlier) != "user":
        # with the skips already in force, not only this one: two skips that are each fine
        # alone can together leave an assistant message first, or nothing at all
        raise InvalidEditError("skipping the start of the conversation must leave a user message first")


def _check_api_compaction(edit: ApiCompaction, t: Transcript, prefix_end: int, n: int) -> None:
    """An API-written summary's own rules (see the module docstring)."""
    s, e = edit.start, edit.end
    if s != 0:
        raise InvalidEditError(f"an API-written summary must start at message 0 (the API wants its block first), "
                               f"not {s}")
    if e < prefix_end - 1:
        raise InvalidEditError(f"an API-written summary of messages 0..{e} must cover the immutable prefix's "
                               f"messages (0..{prefix_end - 1})")
    if not isinstance(edit.content, str) or not edit.content.strip() or not isinstance(edit.signature, str) \
            or not edit.signature:
        raise InvalidEditError("an API-written summary needs the block's content and signature as returned")
    if t[e].role != "user":
        raise InvalidEditError(f"an API-written summary must end on a user message; message {e} is "
                               f"{t[e].role!r}")
    if e + 1 < n and t[e + 1].role != "assistant":
        raise InvalidEditError(f"the message kept after an API-written summary must be an assistant turn (a change "
                               f"of role keeps its thinking valid); message {e + 1} is {t[e + 1].role!r}")


def compaction_end(entries: Sequence[LedgerEntry]) -> int | None:
    """The last message the newest API-written summary stands for (None without one): every
    later edit starts after it, and the next API-written summary contains it."""
    ends = [x.end for x in entries if x.kind == "compaction"]
    return max(ends) if ends else None


def _first_shown(edit: SkipRange, t: Transcript, n: int, earlier: Sequence[LedgerEntry]) -> str | None:
    """The role of the first message the request shows once ``edit`` is in force after
    ``earlier`` ("user" for a summary, which renders as a user message); None when nothing is
    left of the first ``n`` messages."""
    eff: list[LedgerEntry | Edit] = []
    applied: list[LedgerEntry | Edit] = [*earlier, edit]
    for x in applied:
        eff = [y for y in eff if not (x.start <= y.start and y.end <= x.end
                                      and (x.tool_use_id is None or x.tool_use_id == y.tool_use_id))]
        eff.append(x)
    whole = sorted((x for x in eff if x.tool_use_id is None), key=lambda x: x.start)
    i = 0
    for x in whole:
        if x.start > i:
            break
        if isinstance(x, (ReplaceWithSummary, ApiCompaction)) or (
                isinstance(x, LedgerEntry) and x.kind in ("summary", "compaction")):
            return "user"  # a summary renders as a user message; the API's block may open the messages
        if not _is_clear_in_place(x.edit if isinstance(x, LedgerEntry) else x, t):
            i = x.end + 1
        else:
            break
    return t[i].role if i < n else None


def split_effective(entries: Sequence[LedgerEntry]) -> tuple[list[LedgerEntry], dict[int, dict[str, LedgerEntry]]]:
    """Effective entries -> whole-message entries (sorted by start) and, per message, the
    entries that target one of its tool results by id."""
    whole = [e for e in entries if e.tool_use_id is None]
    targeted: dict[int, dict[str, LedgerEntry]] = {}
    for e in entries:
        if e.tool_use_id is not None:
            targeted.setdefault(e.start, {})[e.tool_use_id] = e
    return whole, targeted


class LedgerReader(Protocol):
    """What a strategy may read of a ledger: its entries and the edits in force."""

    @property
    def entries(self) -> Sequence[LedgerEntry]: ...

    def __len__(self) -> int: ...

    def effective(self, upto: int | None = None) -> list[LedgerEntry]: ...

    def compaction_end(self, upto: int | None = None) -> int | None: ...


class Ledger:
    """The entries in memory, and the effective (maximal, disjoint) edits derived from them."""

    def __init__(self, entries: Sequence[LedgerEntry] = ()) -> None:
        self.entries: list[LedgerEntry] = []
        self._effective: list[LedgerEntry] = []
        self._compaction_end: int | None = None  # `compaction_end` of every entry, kept as they are pushed
        for e in entries:
            self._push(e)

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def head_hash(self) -> str:
        return self.entries[-1].hash if self.entries else GENESIS_HASH

    def effective(self, upto: int | None = None) -> list[LedgerEntry]:
        """Disjoint edits in force after the first ``upto`` entries, sorted by start."""
        if upto is None or upto >= len(self.entries):
            return list(self._effective)
        eff: list[LedgerEntry] = []
        for entry in self.entries[:upto]:
            eff = [x for x in eff if not entry.contains(x)]
            eff.append(entry)
        return sorted(eff, key=lambda x: x.start)

    def compaction_end(self, upto: int | None = None) -> int | None:
        """`compaction_end` of the first ``upto`` entries (all by default, without a scan): where
        the newest API-written summary in force ends, None without one."""
        if upto is None or upto >= len(self.entries):
            return self._compaction_end
        return compaction_end(self.entries[:upto])

    def make_entry(
        self,
        edit: Edit,
        *,
        level: str,
        transcript_len: int,
        tokens_before: int,
        tokens_after: int,
        transcript_head: str = GENESIS_HASH,
        created_at: str | None = None,
    ) -> LedgerEntry:
        """Build the next hash-chained entry for ``edit`` (not yet appended)."""
        if level not in LEVELS:
            raise InvalidEditError(f"level must be one of {', '.join(LEVELS)}, got {level!r}")
        body = LedgerEntry(
            seq=len(self.entries),
            kind=("summary" if isinstance(edit, ReplaceWithSummary) else
                  "compaction" if isinstance(edit, ApiCompaction) else "skip"),
            start=edit.start,
            end=edit.end,
            level=level,
            reason=edit.reason,
            created_at=created_at or datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            transcript_len=transcript_len,
            tokens_before=tokens_before,
            tokens_after=tokens_after,
            prev_hash=self.head_hash,
            transcript_head=transcript_head,
            summary=(edit.summary if isinstance(edit, ReplaceWithSummary) else
                     edit.content if isinstance(edit, ApiCompaction) else None),
            tool_use_id=edit.tool_use_id,
            signature=edit.signature if isinstance(edit, ApiCompaction) else None,
        )
        return msgspec.structs.replace(body, hash=entry_hash(body))

    def append(self, entry: LedgerEntry) -> None:
        if entry.seq != len(self.entries) or entry.prev_hash != self.head_hash:
            raise InvalidEditError(f"entry #{entry.seq} does not extend the ledger head #{len(self.entries) - 1}")
        self._push(entry)

    def _push(self, entry: LedgerEntry) -> None:
        self.entries.append(entry)
        if entry.kind == "compaction":
            self._compaction_end = max(entry.end, self._compaction_end or 0)
        self._effective = [x for x in self._effective if not entry.contains(x)]
        self._effective.append(entry)
        self._effective.sort(key=lambda x: x.start)
