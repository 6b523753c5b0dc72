"""Transcript + ledger -> the exact request body, its block hash chain and cache breakpoints.

Every rendered block is built once and reused by identity across renders, so the work per
turn is proportional to the new blocks: the chain, token totals and positions of an
unchanged prefix are carried over from the previous render. Hashes are xxh3-128 over each
block's canonical JSON without ``cache_control``; block k's chained hash is
``xxh3_128(chain[k-1] + hash_k)`` with ``chain[-1]`` = empty bytes.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import xxhash

from .errors import ImmutablePrefixError
from .ledger import Ledger, LedgerEntry
from .tokens import BLOCK_OVERHEAD, TokenCounter, block_tokens
from .transcript import Transcript
from .validate import LOOKBACK, MAX_CACHE_BREAKPOINTS
from .wire import (
    Block,
    TextBlock,
    ToolDef,
    ToolResultBlock,
    block_to_dict,
    canonical_bytes,
    content_blocks,
)

__all__ = [
    "EMPTY_PREFIX_HASH",
    "BlockLocation",
    "Divergence",
    "RenderResult",
    "Renderer",
]

EMPTY_PREFIX_HASH = xxhash.xxh3_128_hexdigest(b"")  # no tools, no system, prefix of 0 messages
_NOT_CACHEABLE = frozenset({"thinking", "redacted_thinking"})
_RUN_KINDS = frozenset({"tool_use", "tool_result"})


@dataclass(frozen=True, slots=True)
class BlockLocation:
    """Where a rendered block sits and where it came from."""

    section: str  # "tools" | "system" | "messages"
    index: int  # tool index, system block index, or rendered message index
    block: int  # block index within the rendered message (0 for tools/system)
    transcript_index: int | None = None  # source message in the transcript
    entry_seq: int | None = None  # ledger entry that produced this block, if any

    def __str__(self) -> str:
        if self.section != "messages":
            return f"{self.section}[{self.index}]"
        src = f" (transcript message {self.transcript_index})" if self.transcript_index is not None else ""
        made = f" (ledger entry #{self.entry_seq})" if self.entry_seq is not None else ""
        return f"message {self.index} block {self.block}{src}{made}"


@dataclass(slots=True, eq=False)
class _RBlock:
    """A rendered block: built once, then shared by every render that contains it."""

    d: dict[str, Any]
    raw: bytes
    h: bytes
    tokens: int
    kind: str
    cacheable: bool
    transcript_index: int | None
    entry_seq: int | None


@dataclass(slots=True, eq=False)
class _RMessage:
    role: str
    blocks: list[_RBlock]
    d: dict[str, Any]
    raw: bytes | None = None  # canonical bytes, filled on first `to_json`


@dataclass(frozen=True, slots=True)
class Divergence:
    """The first block whose chained hash differs between two renders."""

    index: int
    location: BlockLocation
    explained_by: LedgerEntry | None

    def __str__(self) -> str:
        why = (f"explained by ledger entry #{self.explained_by.seq} ({self.explained_by.kind} "
               f"{self.explained_by.start}..{self.explained_by.end}, {self.explained_by.level})"
               if self.explained_by else "NOT explained by any ledger edit")
        return f"first divergent block #{self.index} at {self.location}: {why}"


@dataclass(slots=True, eq=False)
class _Arrays:
    """Per-block and per-message arrays, shared by successive renders.

    Renders without new edits only *append* to them, and each result sees its first
    ``n`` entries, so the per-turn work is proportional to the new blocks. A render after
    an edit gets fresh arrays, so earlier results never change.
    """

    msgs: list[_RMessage]
    mdicts: list[dict[str, Any]]
    starts: list[int]
    flat: list[_RBlock]
    chain: list[bytes]
    cum: list[int]
    pos: list[int]


@dataclass(slots=True, eq=False)
class RenderResult:
    """One rendered request: the body, its canonical bytes and its hash chain."""

    body: dict[str, Any]
    prefix_hash: str | None
    tokens: int
    raw_tokens: int
    breakpoints: list[int]
    applied: tuple[int, ...]
    _arr: _Arrays = field(repr=False)
    _nb: int = 0
    _nm: int = 0
    _n_tools: int = 0
    _n_system: int = 0
    _patched: dict[int, dict[str, Any]] = field(default_factory=dict, repr=False)
    _entries: dict[int, LedgerEntry] = field(default_factory=dict, repr=False)
    _json: bytes | None = field(default=None, repr=False)

    def to_json(self) -> bytes:
        """Canonical request bytes: identical for identical transcript + ledger, in any process."""
        if self._json is None:
            parts = [canonical_bytes(self._patched[mi]) if mi in self._patched else _msg_bytes(self._arr.msgs[mi])
                     for mi in range(self._nm)]
            messages = b"[" + b",".join(parts) + b"]"
            self._json = b"{" + b",".join(
                canonical_bytes(k) + b":" + (messages if k == "messages" else canonical_bytes(self.body[k]))
                for k in sorted(self.body)) + b"}"
        return self._json

    @property
    def block_hashes(self) -> list[bytes]:
        """Chained xxh3-128 per block (tools, system, message blocks), cache_control excluded."""
        return self._arr.chain[: self._nb]

    @property
    def positions(self) -> list[int]:
        """Lookback position of each block (a run of tool_use or tool_result blocks is one)."""
        return self._arr.pos[: self._nb]

    @property
    def cumulative_tokens(self) -> list[int]:
        """Raw estimated tokens up to and including each block."""
        return self._arr.cum[: self._nb]

    @property
    def n_blocks(self) -> int:
        return self._nb

    def location(self, k: int) -> BlockLocation:
        """Locate flat block ``k`` (tools first, then system, then message blocks)."""
        if k < self._n_tools:
            return BlockLocation("tools", k, 0)
        if k < self._n_tools + self._n_system:
            return BlockLocation("system", k - self._n_tools, 0)
        mi = bisect.bisect_right(self._arr.starts, k, 0, self._nm) - 1
        b = self._arr.flat[k]
        return BlockLocation("messages", mi, k - self._arr.starts[mi], b.transcript_index, b.entry_seq)

    def first_divergence(self, previous: RenderResult | None) -> Divergence | None:
        """First block whose chained hash differs from ``previous``, with the edit that explains it.

        Pure growth (the previous chain is a prefix of this one) is not a divergence. When this
        render is a strict prefix of the previous one (trailing messages were skipped), the
        divergence is the first vanished block, located in ``previous``.
        """
        if previous is None:
            return None
        a, b = previous._arr.chain, self._arr.chain
        n = min(previous._nb, self._nb)
        k = _first_mismatch(a, b, n)
        if k is None and self._nb >= previous._nb:
            return None
        new_seqs = set(self.applied) - set(previous.applied)
        if k is None:  # content after the end of this render vanished
            loc = previous.location(n)
            return Divergence(n, loc, self._explain(loc, new_seqs))
        loc = self.location(k)
        return Divergence(k, loc, self._explain(loc, new_seqs))

    def _explain(self, loc: BlockLocation, new_seqs: set[int]) -> LedgerEntry | None:
        """The earliest new ledger entry starting at or before ``loc``'s source message.

        Everything before the divergence is unchanged, so a new edit that starts at or before
        it is what moved the bytes (messages between its end and ``loc`` may be hidden by
        older edits). A divergence in tools/system, or with no new edit before it, is unexplained.
        """
        if loc.section != "messages" or not new_seqs:
            return None
        if loc.entry_seq in new_seqs:
            return self._entries[loc.entry_seq]
        ti = loc.transcript_index
        if ti is None and loc.entry_seq is not None:
            ti = self._entries[loc.entry_seq].start
        best: LedgerEntry | None = None
        for seq in new_seqs:
            e = self._entries[seq]
            if ti is not None and e.start <= ti and (best is None or e.start < best.start):
                best = e
        return best


def _first_mismatch(a: Sequence[bytes], b: Sequence[bytes], n: int) -> int | None:
    if n and a[n - 1] == b[n - 1]:
        return None  # chained: equal at n-1 means equal everywhere before
    lo, hi = 0, n - 1
    if n == 0:
        return None
    while lo < hi:  # chained hashes are monotone: equal, equal, ..., different, different
        mid = (lo + hi) // 2
        if a[mid] == b[mid]:
            lo = mid + 1
        else:
            hi = mid
    return lo


def _msg_bytes(m: _RMessage) -> bytes:
    """A rendered message's canonical bytes, spliced from its blocks' cached bytes."""
    if m.raw is None:
        if len(m.d) == 2:  # only role and content
            inner = b",".join(b.raw for b in m.blocks)
            m.raw = b'{"content":[' + inner + b'],"role":' + canonical_bytes(m.role) + b"}"
        else:
            m.raw = canonical_bytes(m.d)
    return m.raw


class Renderer:
    """Builds request bodies for one session and remembers where it put cache breakpoints."""

    def __init__(
        self,
        transcript: Transcript,
        ledger: Ledger,
        tools: Sequence[ToolDef],
        system: Sequence[TextBlock],
        counter: TokenCounter,
        prefix_end: Callable[[], int | None],
        expected_prefix_hash: Callable[[], str | None],
    ) -> None:
        self.t = transcript
        self.ledger = ledger
        self.counter = counter
        self._prefix_end = prefix_end
        self._expected_prefix_hash = expected_prefix_hash
        self._head: list[_RBlock] = [self._make_tool(tool) for tool in tools]
        self._n_tools = len(self._head)
        self._head += [self._make(blk, None, None, first=False) for blk in system]
        self._n_system = len(self._head) - self._n_tools
        self._plain: dict[int, _RMessage] = {}
        self._edited: dict[tuple[int, int | tuple[int, ...]], _RMessage] = {}
        # state of the latest (non-historical) render, extended in place while no edit lands
        self._arr = _Arrays([], [], [], list(self._head), [], [], [])
        self._extend_chain(self._arr, 0)
        self._arr_entries = 0  # ledger entries the arrays reflect
        self._arr_src = 0  # transcript messages the arrays reflect
        self.written: deque[tuple[int, bytes]] = deque(maxlen=8)

    # -- block construction ------------------------------------------------------------------

    def _make(self, b: Block, ti: int | None, seq: int | None, first: bool) -> _RBlock:
        d = block_to_dict(b, strip_cache_control=True)
        raw = canonical_bytes(d)
        h = xxhash.xxh3_128_digest(raw)
        tokens = block_tokens(self.counter, h, b, first)
        kind = d["type"]
        cacheable = kind not in _NOT_CACHEABLE and not (kind == "text" and not d.get("text"))
        return _RBlock(d, raw, h, tokens, kind, cacheable, ti, seq)

    def _make_tool(self, tool: ToolDef) -> _RBlock:
        d = {k: v for k, v in tool.raw.items() if k != "cache_control"}
        raw = canonical_bytes(d)
        h = xxhash.xxh3_128_digest(raw)
        tokens = self.counter.count_cached(h, raw.decode(), BLOCK_OVERHEAD)
        return _RBlock(d, raw, h, tokens, "tool", True, None, None)

    def _message(self, role: str, blocks: list[_RBlock], extra: dict[str, Any] | None = None) -> _RMessage:
        return _RMessage(role, blocks, {"role": role, "content": [b.d for b in blocks], **(extra or {})})

    def _plain_msg(self, i: int) -> _RMessage:
        m = self._plain.get(i)
        if m is None:
            msg = self.t[i]
            blocks = [self._make(b, i, None, j == 0) for j, b in enumerate(content_blocks(msg))]
            m = self._plain[i] = self._message(msg.role, blocks, msg.extra)
        return m

    def _results_msg(self, i: int, by_id: dict[str, LedgerEntry], whole: LedgerEntry | None,
                     cache: bool = True) -> _RMessage:
        """Message i with edited tool results; every tool_use/tool_result pair stays.

        ``whole`` clears every result of the message; otherwise ``by_id`` maps a tool_use_id
        to the entry that clears it or replaces its content with a summary.
        """
        key = (i, (whole.seq,) if whole is not None else tuple(sorted(e.seq for e in by_id.values())))
        m = self._edited.get(key) if cache else None
        if m is None:
            src = self._plain_msg(i)
            blocks = []
            for j, b in enumerate(content_blocks(self.t[i])):
                e = (whole or by_id.get(b.tool_use_id)) if isinstance(b, ToolResultBlock) else None
                if e is None or not isinstance(b, ToolResultBlock):
                    blocks.append(src.blocks[j])
                    continue
                if e.kind == "summary":
                    text = e.summary or ""
                else:
                    text = (f"[cachecompact: this tool result was cleared to save context (ledger entry "
                            f"#{e.seq}, {e.level}, ~{src.blocks[j].tokens} tokens). The original is kept in "
                            f"the session transcript as message {i}; run the tool again if you need it.]")
                edited = ToolResultBlock(tool_use_id=b.tool_use_id, content=text, is_error=b.is_error)
                blocks.append(self._make(edited, i, e.seq, j == 0))
            m = self._message("user", blocks)
            if cache:
                self._edited[key] = m
        return m

    def _summary_msg(self, e: LedgerEntry, cache: bool = True) -> _RMessage:
        """One user message, clearly marked, standing for messages e.start..e.end."""
        key = (-1, e.seq)
        m = self._edited.get(key) if cache else None
        if m is None:
            text = (f"[cachecompact summary of messages {e.start}-{e.end} (ledger entry #{e.seq}, {e.level}). "
                    f"The full messages are kept in the session transcript.]\n{e.summary}")
            m = self._message("user", [self._make(TextBlock(text=text), None, e.seq, True)])
            if cache:
                self._edited[key] = m
        return m

    def _entry_messages(self, e: LedgerEntry, cache: bool = True) -> list[_RMessage]:
        """What a whole-message entry renders as."""
        if e.kind == "summary":
            return [self._summary_msg(e, cache)]
        if all(self.t.is_tool_result_message(i) for i in range(e.start, e.end + 1)):
            return [self._results_msg(i, {}, e, cache) for i in range(e.start, e.end + 1)]
        return []

    @staticmethod
    def _split(entries: list[LedgerEntry]) -> tuple[list[LedgerEntry], dict[int, dict[str, LedgerEntry]]]:
        """Effective entries -> whole-message entries (sorted) and per-message targeted ones."""
        whole = [e for e in entries if e.tool_use_id is None]
        targeted: dict[int, dict[str, LedgerEntry]] = {}
        for e in entries:
            if e.tool_use_id is not None:
                targeted.setdefault(e.start, {})[e.tool_use_id] = e
        return whole, targeted

    def _view_tokens(self, start: int, end: int, whole: list[LedgerEntry],
                     targeted: dict[int, dict[str, LedgerEntry]]) -> int:
        """Raw tokens messages start..end occupy in the view given by these effective edits."""
        by_start = {e.start: e for e in whole if start <= e.start and e.end <= end}
        total, i = 0, start
        while i <= end:
            e = by_start.get(i)
            if e is not None:
                total += sum(b.tokens for m in self._entry_messages(e) for b in m.blocks)
                i = e.end + 1
                continue
            m = self._results_msg(i, targeted[i], None) if i in targeted else self._plain_msg(i)
            total += sum(b.tokens for b in m.blocks)
            i += 1
        return total

    def edit_tokens(self, draft: LedgerEntry) -> tuple[int, int]:
        """Estimated tokens the draft's range occupies now, and after the draft is applied."""
        whole, targeted = self._split(self.ledger.effective())
        before = self._view_tokens(draft.start, draft.end, whole, targeted)
        if draft.tool_use_id is not None:
            by_id = {**targeted.get(draft.start, {}), draft.tool_use_id: draft}
            after = sum(b.tokens for b in self._results_msg(draft.start, by_id, None, cache=False).blocks)
        else:
            after = sum(b.tokens for m in self._entry_messages(draft, cache=False) for b in m.blocks)
        return self.counter.calibrated(before), self.counter.calibrated(after)

    def prefix_hash(self) -> str | None:
        """Chained hash at the end of the immutable prefix (tools, system, first messages)."""
        pe = self._prefix_end()
        if pe is None:
            return None
        h = b""
        blocks = list(self._head)
        for i in range(pe):
            blocks.extend(self._plain_msg(i).blocks)
        if not blocks:
            return EMPTY_PREFIX_HASH
        for b in blocks:
            h = xxhash.xxh3_128_digest(h + b.h)
        return h.hex()

    # -- rendering ---------------------------------------------------------------------------

    def _messages(self, entries: list[LedgerEntry], n: int) -> Iterator[_RMessage]:
        whole, targeted = self._split(entries)
        idx, k = 0, 0
        while idx < n:
            if k < len(whole) and whole[k].start == idx:
                e = whole[k]
                k += 1
                yield from self._entry_messages(e)
                idx = e.end + 1
            else:
                yield self._results_msg(idx, targeted[idx], None) if idx in targeted else self._plain_msg(idx)
                idx += 1

    @staticmethod
    def _extend_chain(arr: _Arrays, start: int) -> None:
        """Fill chain, cumulative tokens and positions for blocks ``start..`` of ``arr.flat``."""
        flat, chain, cum, pos = arr.flat, arr.chain, arr.cum, arr.pos
        del chain[start:], cum[start:], pos[start:]
        h = chain[start - 1] if start else b""
        c = cum[start - 1] if start else 0
        p = pos[start - 1] if start else -1
        prev_kind = flat[start - 1].kind if start else ""
        digest = xxhash.xxh3_128_digest
        for k in range(start, len(flat)):
            b = flat[k]
            h = digest(h + b.h)
            c += b.tokens
            if not (b.kind in _RUN_KINDS and b.kind == prev_kind):
                p += 1
            prev_kind = b.kind
            chain.append(h)
            cum.append(c)
            pos.append(p)

    def _arrays(self, n_entries: int, n: int, historical: bool) -> tuple[_Arrays, int]:
        """Arrays for the requested state, and how many leading blocks are already hashed."""
        arr = self._arr
        if not historical and n_entries == self._arr_entries and n >= self._arr_src:
            common = len(arr.flat)
            for i in range(self._arr_src, n):  # fast path: append the new messages in place
                m = self._plain_msg(i)
                arr.starts.append(len(arr.flat))
                arr.msgs.append(m)
                arr.mdicts.append(m.d)
                arr.flat.extend(m.blocks)
            self._arr_src = n
            return arr, common
        msgs = list(self._messages(self.ledger.effective(n_entries), n))
        new = _Arrays(msgs, [m.d for m in msgs], [], list(self._head), [], [], [])
        for m in msgs:
            new.starts.append(len(new.flat))
            new.flat.extend(m.blocks)
        common, lim = 0, min(len(arr.flat), len(new.flat))
        while common < lim and arr.flat[common] is new.flat[common]:
            common += 1
        new.chain, new.cum, new.pos = arr.chain[:common], arr.cum[:common], arr.pos[:common]
        if not historical:
            self._arr, self._arr_entries, self._arr_src = new, n_entries, n
        return new, common

    def render(
        self,
        *,
        upto_entry: int | None = None,
        transcript_len: int | None = None,
        breakpoints: bool = True,
        ttl: str | None = None,
        prefix_ttl: str | None = None,
        remember: bool = True,
        **params: Any,
    ) -> RenderResult:
        """Render the request. ``upto_entry``/``transcript_len`` replay an earlier state."""
        n = len(self.t) if transcript_len is None else transcript_len
        historical = upto_entry is not None or transcript_len is not None
        n_entries = len(self.ledger) if upto_entry is None else upto_entry
        arr, common = self._arrays(n_entries, n, historical)
        self._extend_chain(arr, common)
        nb, nm = len(arr.flat), len(arr.msgs)

        # immutable prefix: its hash is the chain value at its last block
        pe = self._prefix_end()
        prefix_last = self._prefix_last_block(arr, pe)
        prefix_hash = None
        if pe is not None:
            prefix_hash = arr.chain[prefix_last].hex() if prefix_last >= 0 else EMPTY_PREFIX_HASH
        expected = self._expected_prefix_hash()
        if expected is not None and prefix_hash is not None and prefix_hash != expected:
            raise ImmutablePrefixError(
                f"immutable prefix hash {prefix_hash} != stored {expected}: tools, system or the first "
                f"{pe} messages changed")

        bps = self._place_breakpoints(arr, prefix_last) if breakpoints and nb else []
        msg_dicts = arr.mdicts[:nm]
        body: dict[str, Any] = {k: v for k, v in params.items() if v is not None}
        if breakpoints:
            body.pop("cache_control", None)
        tool_dicts = [b.d for b in arr.flat[: self._n_tools]]
        sys_dicts = [b.d for b in arr.flat[self._n_tools: self._n_tools + self._n_system]]
        cc_main = {"type": "ephemeral", **({"ttl": ttl} if ttl else {})}
        cc_prefix = {"type": "ephemeral", "ttl": prefix_ttl} if prefix_ttl else cc_main
        patched: dict[int, dict[str, Any]] = {}
        for k in bps:
            cc = cc_prefix if k == prefix_last else cc_main
            if k < self._n_tools:
                tool_dicts[k] = {**tool_dicts[k], "cache_control": cc}
            elif k < self._n_tools + self._n_system:
                j = k - self._n_tools
                sys_dicts[j] = {**sys_dicts[j], "cache_control": cc}
            else:
                mi = bisect.bisect_right(arr.starts, k, 0, nm) - 1
                md = patched.get(mi)
                if md is None:
                    md = patched[mi] = msg_dicts[mi] = {**msg_dicts[mi], "content": list(msg_dicts[mi]["content"])}
                j = k - arr.starts[mi]
                md["content"][j] = {**md["content"][j], "cache_control": cc}
        if tool_dicts:
            body["tools"] = tool_dicts
        if sys_dicts:
            body["system"] = sys_dicts
        body["messages"] = msg_dicts

        raw_tokens = arr.cum[nb - 1] if nb else 0
        applied = self.ledger.entries[:n_entries]
        if not historical and remember:
            for k in bps:
                self.written.append((k, arr.chain[k]))
        return RenderResult(
            body=body,
            prefix_hash=prefix_hash,
            tokens=self.counter.calibrated(raw_tokens),
            raw_tokens=raw_tokens,
            breakpoints=bps,
            applied=tuple(e.seq for e in applied),
            _arr=arr,
            _nb=nb,
            _nm=nm,
            _n_tools=self._n_tools,
            _n_system=self._n_system,
            _patched=patched,
            _entries={e.seq: e for e in applied},
        )

    def _prefix_last_block(self, arr: _Arrays, pe: int | None) -> int:
        """Flat index of the prefix's last block (tools/system only while messages are pending)."""
        head = self._n_tools + self._n_system
        if pe is None or pe == 0 or pe > len(arr.msgs):
            return head - 1
        # the prefix messages are never edited, so rendered message pe-1 is transcript message pe-1
        return arr.starts[pe - 1] + len(arr.msgs[pe - 1].blocks) - 1

    def _place_breakpoints(self, arr: _Arrays, prefix_last: int) -> list[int]:
        """Prefix end, last block, then earlier cached ends the lookback would miss."""
        flat, chain, pos = arr.flat, arr.chain, arr.pos

        def eligible(k: int) -> int:
            while k >= 0 and not flat[k].cacheable:
                k -= 1
            return k

        chosen: list[int] = []
        for k in (eligible(len(flat) - 1), eligible(prefix_last)):
            if k >= 0 and k not in chosen:
                chosen.append(k)
        candidates = sorted(
            {k for k, h in self.written if k < len(chain) and chain[k] == h and flat[k].cacheable}, reverse=True)

        def covered(c: int) -> bool:
            return any(b >= c and pos[b] - pos[c] < LOOKBACK for b in chosen)

        # Reads hit the latest entry the lookback reaches, so only the newest earlier write
        # matters; older ones only fill spare slots as insurance (a write that never landed).
        for c in candidates:
            if len(chosen) >= MAX_CACHE_BREAKPOINTS or covered(c):
                break
            chosen.append(c)
        return sorted(chosen)
