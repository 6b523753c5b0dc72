"""`RenderResult`: one rendered request, its canonical bytes, and a read API over its blocks.

Levels, the compactor, the benchmark and forensics read renders only through the public
methods here (`blocks`, `messages_in`, `location`, `first_divergence`, ...), never through
the arrays behind them.
"""

from __future__ import annotations

import bisect
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ...base.values import TTL
from ...base.wire import canonical_bytes
from ...cache.cache_keys import first_mismatch
from ..ledger import LedgerEntry
from ..thinking import BINDING_BETA, COMPACTION_BETA, ThinkingPlan
from ._blocks import RenderedBlock
from ._chain import ChainArrays

__all__ = ["BlockInfo", "BlockLocation", "Divergence", "RenderResult"]


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

    @property
    def path(self) -> str:
        """The block's place in the request body, e.g. ``messages[12].content[1]``."""
        if self.section != "messages":
            return f"{self.section}[{self.index}]"
        return f"messages[{self.index}].content[{self.block}]"


@dataclass(frozen=True, slots=True)
class BlockInfo:
    """A rendered block as the cache sees it."""

    index: int  # flat index: tools, then system, then message blocks
    location: BlockLocation
    kind: str  # "tool", "text", "tool_use", "tool_result", "thinking", ...
    tokens: int  # raw (uncalibrated) estimate
    cumulative_tokens: int  # raw tokens up to and including this block
    key: bytes  # xxh3-128 of the block without cache_control
    chain: bytes  # chained hash up to and including this block
    position: int  # lookback position
    cacheable: bool


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
class RenderResult:
    """One rendered request: the body, its canonical bytes and its hash chain."""

    body: dict[str, Any]
    prefix_hash: str | None
    tokens: int  # calibrated estimate of the request's input tokens
    raw_tokens: int
    breakpoints: list[int]
    n_entries: int  # ledger entries applied (entries 0 .. n_entries-1)
    transcript_len: int  # transcript messages the render was made from
    _arr: ChainArrays = field(repr=False)
    prefix_tokens: int = 0  # raw tokens of the immutable prefix (tools, system, first messages)
    breakpoint_ttls: list[TTL] = field(default_factory=list)  # TTL of each breakpoint
    _nb: int = 0
    _nm: int = 0
    _n_tools: int = 0
    _n_system: int = 0
    _patched: dict[int, dict[str, Any]] = field(default_factory=dict, repr=False)
    _ledger: Sequence[LedgerEntry] = field(default=(), repr=False)
    _json: bytes | None = field(default=None, repr=False)
    # the thinking blocks left out and whether the request asks the API to drop the latest turn's
    # (`history.thinking`); betas names the header that needs
    thinking: ThinkingPlan = field(default_factory=lambda: ThinkingPlan({}))

    left_out_tokens: int = 0  # estimated tokens of the thinking blocks left out (`thinking`)
    compacted: bool = False  # an API-written summary opens the messages (its block needs a beta)

    @property
    def betas(self) -> tuple[str, ...]:
        """The ``anthropic-beta`` values the body needs: ``block_binding``'s, and on-demand
        compaction's while an API-written summary opens the messages (without it "a validation
        error that says `compaction` is not one of the expected content block types")."""
        th = self.body.get("thinking")
        out = (BINDING_BETA,) if isinstance(th, dict) and "block_binding" in th else ()
        if self.compacted:
            out = (*out, COMPACTION_BETA)
        return out

    # -- bytes -----------------------------------------------------------------------------------

    def to_json(self) -> bytes:
        """Canonical request bytes: identical for identical state, in any process."""
        if self._json is None:
            parts = [canonical_bytes(self._patched[mi]) if mi in self._patched else self._arr.msgs[mi].canonical()
                     for mi in range(self._nm)]
            messages = b"[" + b",".join(parts) + b"]"
            self._json = b"{" + b",".join(
                canonical_bytes(k) + b":" + (messages if k == "messages" else canonical_bytes(self.body[k]))
                for k in sorted(self.body)) + b"}"
        return self._json

    # -- read API ------------------------------------------------------------------------------

    @property
    def has_image(self) -> bool:
        """Whether an image is anywhere in the request, a tool result's included: the message cache
        is keyed on it ("Images: adding or removing images anywhere in the prompt" invalidates it,
        prompt caching, *What invalidates the cache*), so forensics must know when it flips."""
        for b in self._arr.flat[:self._nb]:
            if b.kind == "image":
                return True
            if b.kind == "tool_result":
                c = b.d.get("content")
                if isinstance(c, list) and any(isinstance(x, dict) and x.get("type") == "image" for x in c):
                    return True
        return False

    @property
    def applied(self) -> range:
        """Sequence numbers of the ledger entries this render reflects."""
        return range(self.n_entries)

    @property
    def n_blocks(self) -> int:
        return self._nb

    @property
    def n_messages(self) -> int:
        return self._nm

    @property
    def n_tools(self) -> int:
        return self._n_tools

    @property
    def n_system(self) -> int:
        return self._n_system

    def cache_arrays(self) -> tuple[list[bytes], list[int], list[int]]:
        """Copies of the chained hashes, cumulative raw tokens and lookback positions of this
        render's blocks: plain lists for the cache layer (forensics), which keeps them. Copies,
        not the copy-free views of `block_hashes` and the like: those views are this layer's
        type, and forensics reading them would call up a floor (tests/test_request_route.py);
        three slices per request cost less than its loops over a view would."""
        nb, arr = self._nb, self._arr
        return arr.chain[:nb], arr.cum[:nb], arr.pos[:nb]

    @property
    def flat_blocks(self) -> Sequence[RenderedBlock]:
        """Every block as rendered (tools, system, message blocks), shared with later renders that
        extend it: read-only, and only the first `n_blocks` are this render's."""
        return self._arr.flat

    @property
    def message_starts(self) -> Sequence[int]:
        """The flat index of each rendered message's first block (shared like `flat_blocks`; the
        first `n_messages` are this render's)."""
        return self._arr.starts

    @property
    def edit_starts(self) -> list[int]:
        """The first transcript message of each ledger entry this render applied, by sequence."""
        return [e.start for e in self._ledger[:self.n_entries]]

    @property
    def preamble_blocks(self) -> int:
        """Blocks before the first message (the preamble): tool definitions, then system blocks."""
        return self._n_tools + self._n_system

    @property
    def head_blocks(self) -> int:
        """The 0.2 name of `preamble_blocks` (read until 0.4, with a `DeprecationWarning`)."""
        warnings.warn("RenderResult.head_blocks is now preamble_blocks ('head' is a hash chain's tip); the old "
                      "name goes in 0.4", DeprecationWarning, stacklevel=2)
        return self.preamble_blocks

    @property
    def block_hashes(self) -> Sequence[bytes]:
        """Chained xxh3-128 per block (tools, system, message blocks), cache_control excluded.

        Like `positions` and `cumulative_tokens`, a read-only view (no copy per call)."""
        return _View(self._arr.chain, self._nb)

    @property
    def positions(self) -> Sequence[int]:
        """Lookback position of each block (a run of tool_use or tool_result blocks is one)."""
        return _View(self._arr.pos, self._nb)

    @property
    def cumulative_tokens(self) -> Sequence[int]:
        """Raw estimated tokens up to and including each block."""
        return _View(self._arr.cum, self._nb)

    @property
    def kinds(self) -> Sequence[str]:
        return _KindView(self._arr.flat, self._nb)

    @property
    def tool_tokens(self) -> int:
        """Raw estimated tokens of the tool_use and tool_result blocks in this request."""
        return self._arr.tool_cum[self._nb - 1] if self._nb else 0

    @property
    def breakpoint_chain(self) -> list[tuple[int, bytes]]:
        """(block index, chain value) of each breakpoint: what this request writes; the session
        persists it so the next render can find these entries again."""
        return [(k, self._arr.chain[k]) for k in self.breakpoints]

    def location(self, k: int) -> BlockLocation:
        """Locate flat block ``k`` (tools first, then system, then message blocks)."""
        if k < self._n_tools:
            return BlockLocation("tools", k, 0)
        if k < self._n_tools + self._n_system:
            return BlockLocation("system", k - self._n_tools, 0)
        mi = bisect.bisect_right(self._arr.starts, k, 0, self._nm) - 1
        b = self._arr.flat[k]
        return BlockLocation("messages", mi, k - self._arr.starts[mi], b.transcript_index, b.entry_seq)

    def block(self, k: int) -> BlockInfo:
        if not 0 <= k < self._nb:
            raise IndexError(f"block {k} out of range (render has {self._nb} blocks)")
        b, a = self._arr.flat[k], self._arr
        return BlockInfo(k, self.location(k), b.kind, b.tokens, a.cum[k], b.key, a.chain[k], a.pos[k], b.cacheable)

    def blocks(self) -> list[BlockInfo]:
        """Every block of the request in order: `block` of each, with the messages walked in
        order instead of one search per block (the policy reads them every turn)."""
        a, nb, nm, nt = self._arr, self._nb, self._nm, self._n_tools
        head = min(nb, nt + self._n_system)
        out = [self.block(k) for k in range(head)]
        flat, cum, chain, pos, starts = a.flat, a.cum, a.chain, a.pos, a.starts
        for mi in range(nm):  # message mi's blocks run to the next start (`location`'s bisect_right)
            first = starts[mi]
            for k in range(max(first, head), min(starts[mi + 1] if mi + 1 < nm else nb, nb)):
                b = flat[k]
                out.append(BlockInfo(k, BlockLocation("messages", mi, k - first, b.transcript_index, b.entry_seq),
                                     b.kind, b.tokens, cum[k], b.key, chain[k], pos[k], b.cacheable))
        return out

    def block_text(self, k: int) -> str:
        """A block's text for excerpts: text, a string tool result, else its canonical JSON."""
        d = self._arr.flat[k].d
        if d.get("type") == "text":
            return str(d.get("text", ""))
        if d.get("type") == "tool_result" and isinstance(d.get("content"), str):
            return str(d["content"])
        return self._arr.flat[k].raw.decode()

    def message_source(self, mi: int) -> int | None:
        """Transcript index rendered message ``mi`` stands for (a summary: the start of its range)."""
        m = self._arr.msgs[mi]
        if not m.blocks:
            return None
        b = m.blocks[0]
        if b.transcript_index is not None:
            return b.transcript_index
        if b.entry_seq is not None and b.entry_seq < len(self._ledger):
            return self._ledger[b.entry_seq].start
        return None

    def messages_in(self, start: int, end: int) -> list[dict[str, Any]]:
        """The rendered messages (plain dicts, no markers) standing for transcript ``start..end``."""
        out = []
        for mi in range(self._nm):
            src = self.message_source(mi)
            if src is not None and start <= src <= end:
                out.append(self._arr.msgs[mi].d)
        return out

    # -- divergence ---------------------------------------------------------------------------

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
        k = first_mismatch(a, b, n)
        if k is None and self._nb >= previous._nb:
            return None
        if k is None:  # content after the end of this render vanished
            loc = previous.location(n)
            return Divergence(n, loc, self.explain(loc, previous.n_entries))
        loc = self.location(k)
        return Divergence(k, loc, self.explain(loc, previous.n_entries))

    def explain(self, loc: BlockLocation, since: int) -> LedgerEntry | None:
        """The earliest ledger entry made after the first ``since`` entries that starts at or
        before ``loc``'s source message: the edit that moved the bytes there, if any.

        Everything before the divergence is unchanged, so a new edit that starts at or before
        it is what moved the bytes (messages between its end and ``loc`` may be hidden by
        older edits). A divergence in tools/system, or with no new edit before it, is unexplained.
        """
        new_seqs = range(since, self.n_entries)
        if loc.section != "messages" or not new_seqs:
            return None
        if loc.entry_seq is not None and loc.entry_seq in new_seqs:
            return self._ledger[loc.entry_seq]
        ti = loc.transcript_index
        if ti is None and loc.entry_seq is not None:
            ti = self._ledger[loc.entry_seq].start
        best: LedgerEntry | None = None
        for seq in new_seqs:
            e = self._ledger[seq]
            if ti is not None and e.start <= ti and (best is None or e.start < best.start):
                best = e
        return best


class _View(Sequence[Any]):
    """The first ``n`` items of a list that later renders may extend: a stable, copy-free view."""

    __slots__ = ("_items", "_n")

    def __init__(self, items: list[Any], n: int) -> None:
        self._items, self._n = items, n

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, k: Any) -> Any:
        if isinstance(k, slice):
            return self._items[: self._n][k]
        if k < 0:
            k += self._n
        if not 0 <= k < self._n:
            raise IndexError(k)
        return self._items[k]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and len(other) == self._n and all(a == b for a, b in zip(self, other,
                                                                                                      strict=True))

    __hash__ = None  # type: ignore[assignment]


class _KindView(_View):
    def __getitem__(self, k: Any) -> Any:
        if isinstance(k, slice):
            return [b.kind for b in self._items[: self._n][k]]
        return super().__getitem__(k).kind
