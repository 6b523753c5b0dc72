"""`Renderer`: transcript + ledger (+ the previous request's breakpoints) -> the request body.

It ties the three parts together: the `BlockCache` builds blocks once, the `ChainArrays`
carry the chain, positions and token totals from one render to the next, and
`plan_breakpoints` places the markers. Rendering is a pure function of its inputs; the only
state kept between calls is caching.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import xxhash

from ...base.errors import ImmutablePrefixError
from ...base.tokens import TokenCounter
from ...base.values import TTL
from ...base.wire import TextBlock, ToolDef
from ...cache.cache_keys import chain_step
from ..ledger import Ledger, LedgerEntry, split_effective
from ..thinking import DROP_BLOCK, ThinkingPlan, plan_thinking
from ..transcript import Transcript
from ._blocks import BlockCache, RenderedMessage
from ._breakpoints import plan_breakpoints
from ._chain import ChainArrays
from ._result import RenderResult

__all__ = ["EMPTY_PREFIX_HASH", "Renderer"]

EMPTY_PREFIX_HASH = xxhash.xxh3_128_hexdigest(b"")  # no tools, no system, prefix of 0 messages


class Renderer:
    """Builds request bodies for one session."""

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
        self.cache = BlockCache(transcript, counter)
        self._prefix_end = prefix_end
        self._expected_prefix_hash = expected_prefix_hash
        self._preamble = [self.cache.tool(tool) for tool in tools]
        self._n_tools = len(self._preamble)
        self._preamble += [self.cache.block(blk, None, None, first=False) for blk in system]
        self._n_system = len(self._preamble) - self._n_tools
        # the latest (non-historical) render, extended in place while no edit lands
        self._arr = self._fresh()
        self._arr.extend(0)
        self._arr_entries = 0  # ledger entries the arrays reflect
        self._arr_src = 0  # transcript messages the arrays reflect
        self._arr_plan = ThinkingPlan({})  # the thinking plan the arrays reflect
        # the last plain render (no breakpoints, scalar parameters) and the state it was made from: the
        # policy asks for one several times a turn, and each would copy the O(history) message list
        self._plain: tuple[tuple[Any, ...], RenderResult] | None = None

    def _fresh(self) -> ChainArrays:
        return ChainArrays(preamble=len(self._preamble), flat=list(self._preamble))

    # -- token estimates -------------------------------------------------------------------------

    def plain_message(self, i: int) -> RenderedMessage:
        """Transcript message ``i`` rendered as sent, before any edit (its blocks carry token counts)."""
        return self.cache.plain(i)

    def _view_tokens(self, start: int, end: int, whole: list[LedgerEntry],
                     targeted: dict[int, dict[str, LedgerEntry]]) -> int:
        """Raw tokens messages start..end occupy in the view given by these effective edits."""
        by_start = {e.start: e for e in whole if start <= e.start and e.end <= end}
        total, i = 0, start
        while i <= end:
            e = by_start.get(i)
            if e is not None:
                total += sum(b.tokens for m in self.cache.entry_messages(e) for b in m.blocks)
                i = e.end + 1
                continue
            m = self.cache.targeted(i, targeted[i]) if i in targeted else self.cache.plain(i)
            total += sum(b.tokens for b in m.blocks)
            i += 1
        return total

    def edit_tokens(self, draft: LedgerEntry) -> tuple[int, int]:
        """Estimated tokens the draft's range occupies now, and after the draft is applied."""
        whole, targeted = split_effective(self.ledger.effective())
        before = self._view_tokens(draft.start, draft.end, whole, targeted)
        if draft.tool_use_id is not None:
            by_id = {**targeted.get(draft.start, {}), draft.tool_use_id: draft}
            after = sum(b.tokens for b in self.cache.targeted(draft.start, by_id, cache=False).blocks)
        else:
            after = sum(b.tokens for m in self.cache.entry_messages(draft, cache=False) for b in m.blocks)
        return self.counter.calibrated(before), self.counter.calibrated(after)

    def prefix_hash(self) -> str | None:
        """Chained hash at the end of the immutable prefix (tools, system, first messages)."""
        pe = self._prefix_end()
        if pe is None:
            return None
        blocks = list(self._preamble)
        for i in range(pe):
            blocks.extend(self.cache.plain(i).blocks)
        if not blocks:
            return EMPTY_PREFIX_HASH
        h = b""
        for b in blocks:
            h = chain_step(h, b.key)
        return h.hex()

    # -- rendering -------------------------------------------------------------------------------

    def _messages(self, entries: list[LedgerEntry], n: int, plan: ThinkingPlan) -> Iterator[RenderedMessage]:
        whole, targeted = split_effective(entries)
        idx, k = 0, 0
        while idx < n:
            if k < len(whole) and whole[k].start == idx:
                e = whole[k]
                k += 1
                yield from self.cache.entry_messages(e)
                idx = e.end + 1
            else:
                m = self.cache.targeted(idx, targeted[idx]) if idx in targeted else self.cache.plain(idx)
                strip = plan.strip.get(idx)
                kept = self.cache.without_thinking(idx, m, strip) if strip else m
                if kept is not None:
                    yield kept
                idx += 1

    def _arrays(self, n_entries: int, n: int, historical: bool) -> tuple[ChainArrays, int, ThinkingPlan]:
        """Arrays for the requested state, how many leading blocks are already hashed, and the
        thinking plan they were rendered with (`history.thinking`)."""
        arr = self._arr
        if not historical and n_entries == self._arr_entries and n >= self._arr_src and (
                self._arr_plan.kept_invalid is None or n == self._arr_src):
            # fast path: append the new messages in place (no entry was made, so none of them loses its
            # thinking; after a request that sent a tool-loop turn's invalidated thinking, the slow path
            # leaves it out now that the turn is no longer the latest)
            common = len(arr.chain)
            for i in range(self._arr_src, n):
                arr.add_message(self.cache.plain(i))
            self._arr_src = n
            return arr, common, self._arr_plan
        entries = self.ledger.entries[:n_entries]
        plan = plan_thinking(self.t, entries, n)
        new = self._fresh()
        for m in self._messages(self.ledger.effective(n_entries), n, plan):
            new.add_message(m)
        common = arr.common_prefix(new)
        new.adopt_prefix(arr, common)
        if not historical:
            self._arr, self._arr_entries, self._arr_src, self._arr_plan = new, n_entries, n, plan
        return new, common, plan

    def render(
        self,
        *,
        upto_entry: int | None = None,
        transcript_len: int | None = None,
        breakpoints: bool = True,
        previous: Sequence[tuple[int, bytes]] = (),
        stable_before: int | None = None,
        ttl: TTL | None = None,
        prefix_ttl: TTL | None = None,
        **params: Any,
    ) -> RenderResult:
        """Render the request. ``upto_entry``/``transcript_len`` replay an earlier state;
        ``previous`` is the previous request's breakpoints (block index, chain value);
        ``stable_before``: transcript messages before this index will not be edited next (a
        breakpoint goes after the last of them)."""
        n = len(self.t) if transcript_len is None else transcript_len
        historical = upto_entry is not None or transcript_len is not None
        n_entries = len(self.ledger) if upto_entry is None else upto_entry
        plain = not (historical or breakpoints or ttl or prefix_ttl) and all(
            v is None or isinstance(v, (str, int, float)) for v in params.values())
        if plain:
            state = (n_entries, n, self._prefix_end(), self._expected_prefix_hash(), self.counter.calibration,
                     tuple(sorted(params.items())))
            if self._plain is not None and self._plain[0] == state:
                return self._plain[1]  # the state is append-only: same lengths, same render
        arr, common, thinking = self._arrays(n_entries, n, historical)
        arr.extend(common)
        nb, nm = len(arr.flat), len(arr.msgs)

        # immutable prefix: its hash is the chain value at its last block
        pe = self._prefix_end()
        if pe is not None and n < pe:
            pe = None  # an earlier state (``transcript_len``) from before the prefix was complete
        compacted = pe is not None and self.ledger.compaction_end(n_entries) is not None
        prefix_last = self._prefix_last_block(arr, None if compacted else pe)
        prefix_hash = None
        if compacted:
            # the API's block opens the messages (history/ledger.py): what is sent unchanged is tools and
            # system; the first messages stay in the transcript, and their hash is checked there
            prefix_hash = self.prefix_hash()
        elif pe is not None:
            prefix_hash = arr.chain[prefix_last].hex() if prefix_last >= 0 else EMPTY_PREFIX_HASH
        expected = self._expected_prefix_hash()
        if expected is not None and prefix_hash is not None and prefix_hash != expected:
            raise ImmutablePrefixError(
                f"immutable prefix hash {prefix_hash} != stored {expected}: tools, system or the first "
                f"{pe} messages changed")

        stable = self._last_block_before(arr, stable_before) if stable_before is not None else -1
        bps = plan_breakpoints(_Cacheable(arr), arr.chain, arr.pos, prefix_last, previous,
                               stable) if breakpoints and nb else []
        msg_dicts = arr.mdicts[:nm]
        body: dict[str, Any] = {k: v for k, v in params.items() if v is not None}
        if breakpoints:
            body.pop("cache_control", None)
        if thinking.drop_block:
            # the latest tool-loop turn's invalidated thinking may not be removed: the API drops it
            # (history.thinking); a caller's own block_binding stands
            th = body.get("thinking")
            th = dict(th) if isinstance(th, dict) else {"type": "adaptive"}
            th.setdefault("block_binding", dict(DROP_BLOCK))
            body["thinking"] = th
        tool_dicts = [b.d for b in arr.flat[: self._n_tools]]
        sys_dicts = [b.d for b in arr.flat[self._n_tools: self._n_tools + self._n_system]]
        cc_main = {"type": "ephemeral", **({"ttl": ttl} if ttl else {})}
        cc_prefix = {"type": "ephemeral", "ttl": prefix_ttl} if prefix_ttl else cc_main
        patched: dict[int, dict[str, Any]] = {}
        bp_ttls: list[TTL] = []
        for k in bps:
            cc = cc_prefix if k == prefix_last else cc_main
            bp_ttls.append("1h" if cc.get("ttl") == "1h" else "5m")
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
        result = RenderResult(body=body, prefix_hash=prefix_hash, tokens=self.counter.calibrated(raw_tokens),
                            raw_tokens=raw_tokens, breakpoints=bps, n_entries=n_entries, transcript_len=n,
                            breakpoint_ttls=bp_ttls, prefix_tokens=arr.cum[prefix_last] if prefix_last >= 0 else 0,
                            _arr=arr, _nb=nb, _nm=nm,
                            _n_tools=self._n_tools, _n_system=self._n_system, _patched=patched,
                            _ledger=self.ledger.entries, thinking=thinking,
                            left_out_tokens=self._left_out_tokens(thinking), compacted=compacted)
        if plain:
            self._plain = (state, result)
        return result

    def _left_out_tokens(self, plan: ThinkingPlan) -> int:
        """Estimated tokens of the thinking blocks the plan leaves out (their text as sent; a block
        whose text was omitted is billed for more, as the tokens its model thought)."""
        if not plan.strip:
            return 0
        return self.counter.calibrated(sum(self.cache.plain(i).blocks[j].tokens
                                           for i, js in plan.strip.items() for j in js))

    def _last_block_before(self, arr: ChainArrays, index: int) -> int:
        """Flat index of the last block rendered from transcript messages before ``index`` (a
        summary counts from its last message), -1 if none. Rendered messages keep transcript
        order, so a binary search: the per-turn cost does not grow with the session."""
        entries = self.ledger.entries

        def source(mi: int) -> int:
            b = arr.msgs[mi].blocks[-1]
            if b.transcript_index is not None:
                return b.transcript_index
            if b.entry_seq is not None and b.entry_seq < len(entries):
                return entries[b.entry_seq].end
            return -1

        mi = bisect.bisect_left(range(len(arr.msgs)), index, key=source) - 1
        return arr.starts[mi] + len(arr.msgs[mi].blocks) - 1 if mi >= 0 else -1

    def _prefix_last_block(self, arr: ChainArrays, pe: int | None) -> int:
        """Flat index of the prefix's last block (tools/system only while messages are pending)."""
        preamble = self._n_tools + self._n_system
        if pe is None or pe == 0 or pe > len(arr.msgs):
            return preamble - 1
        # the prefix messages are never edited, so rendered message pe-1 is transcript message pe-1
        return arr.starts[pe - 1] + len(arr.msgs[pe - 1].blocks) - 1


class _Cacheable(Sequence[bool]):
    """A read-only view of the arrays' per-block cacheability (no per-render copy)."""

    def __init__(self, arr: ChainArrays) -> None:
        self._flat = arr.flat

    def __len__(self) -> int:
        return len(self._flat)

    def __getitem__(self, k: Any) -> Any:
        if isinstance(k, slice):
            return [b.cacheable for b in self._flat[k]]
        return self._flat[k].cacheable
