"""The chain and positions: per-block arrays shared by successive renders.

Renders without new edits only *append* to the arrays, and each result sees its first
``n`` entries, so the per-turn work is proportional to the new blocks. A render after an
edit gets fresh arrays that copy the unchanged leading part, so earlier results never change.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...cache.cache_keys import RUN_KINDS, chain_step
from ._blocks import RenderedBlock, RenderedMessage

__all__ = ["ChainArrays"]


@dataclass(slots=True, eq=False)
class ChainArrays:
    """Messages and blocks of a render, with the chained hash, cumulative tokens, lookback
    position and cumulative tool tokens (calls and results) of every block."""

    preamble: int  # blocks before the first message (tools + system)
    msgs: list[RenderedMessage] = field(default_factory=list)
    mdicts: list[dict[str, Any]] = field(default_factory=list)  # each message's dict, sliced into bodies
    starts: list[int] = field(default_factory=list)  # flat index of each message's first block
    flat: list[RenderedBlock] = field(default_factory=list)
    chain: list[bytes] = field(default_factory=list)
    cum: list[int] = field(default_factory=list)
    pos: list[int] = field(default_factory=list)
    tool_cum: list[int] = field(default_factory=list)

    def add_message(self, m: RenderedMessage) -> None:
        self.starts.append(len(self.flat))
        self.msgs.append(m)
        self.mdicts.append(m.d)
        self.flat.extend(m.blocks)

    def extend(self, start: int) -> None:
        """Fill chain, cumulative tokens and positions for blocks ``start..`` of ``flat``."""
        flat, chain, cum, pos, tcum = self.flat, self.chain, self.cum, self.pos, self.tool_cum
        del chain[start:], cum[start:], pos[start:], tcum[start:]
        h = chain[start - 1] if start else b""
        c = cum[start - 1] if start else 0
        p = pos[start - 1] if start else -1
        tc = tcum[start - 1] if start else 0
        prev_kind = flat[start - 1].kind if start else ""
        for k in range(start, len(flat)):
            b = flat[k]
            h = chain_step(h, b.key)
            c += b.tokens
            if b.kind in RUN_KINDS:  # tool calls and tool results
                tc += b.tokens
            if not (b.kind in RUN_KINDS and b.kind == prev_kind):
                p += 1
            prev_kind = b.kind
            chain.append(h)
            cum.append(c)
            pos.append(p)
            tcum.append(tc)

    def common_prefix(self, other: ChainArrays) -> int:
        """How many leading blocks the two arrays share by identity."""
        k, lim = 0, min(len(self.flat), len(other.flat))
        while k < lim and self.flat[k] is other.flat[k]:
            k += 1
        return k

    def adopt_prefix(self, other: ChainArrays, k: int) -> None:
        """Take ``other``'s computed values for the first ``k`` (shared) blocks."""
        self.chain, self.cum, self.pos = other.chain[:k], other.cum[:k], other.pos[:k]
        self.tool_cum = other.tool_cum[:k]
