"""Transcript + ledger -> the exact request body, its block hash chain and cache breakpoints.

Three parts: `blocks` (every rendered block built once and shared by identity), `chain`
(chained hashes, positions and token totals carried from render to render) and
`breakpoints` (the planner, a pure function). `Renderer` ties them together and
`RenderResult` is what callers read. Hashes are xxh3-128 over each block's canonical JSON
without ``cache_control`` (see `cachemodel`).
"""

from ...cache.cache_keys import first_mismatch
from ._blocks import RenderedBlock, RenderedMessage, cleared_placeholder, summary_text
from ._breakpoints import plan_breakpoints
from ._renderer import EMPTY_PREFIX_HASH, Renderer
from ._result import BlockInfo, BlockLocation, Divergence, RenderResult

__all__ = [
    "EMPTY_PREFIX_HASH",
    "BlockInfo",
    "BlockLocation",
    "Divergence",
    "RenderResult",
    "RenderedBlock",
    "RenderedMessage",
    "Renderer",
    "cleared_placeholder",
    "first_mismatch",
    "plan_breakpoints",
    "summary_text",
]
