"""The one model of what the prompt cache sees: blocks, their keys, positions and cacheability.

The renderer (which places breakpoints for the client) and the billing simulator (which
plays the server) both build on these definitions, so they cannot drift apart:

* a **block** is a tool definition, a system text block, or a content block of a message;
  its **key** is xxh3-128 of its canonical JSON without ``cache_control`` and without
  top-level null fields (an SDK model dump's ``citations: null`` renders no tokens);
* a **position** is what the 20-block lookback counts: a run of consecutive ``tool_use``
  blocks, or of ``tool_result`` blocks, is one position; every other block is one;
* thinking blocks and empty text blocks cannot carry ``cache_control``;
* a prefix shorter than the model's minimum cacheable length is not cached (no error);
* the **chain** value at block k is ``xxh3_128(chain[k-1] || key[k])``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import xxhash

from ..base.errors import MalformedMessageError
from ..base.pricing import PRESERVED_THINKING, canonical_id
from ..base.wire import canonical_bytes

__all__ = [
    "LOOKBACK",
    "MAX_BREAKPOINTS",
    "NOT_CACHEABLE",
    "RUN_KINDS",
    "TTL_SECONDS",
    "block_key",
    "chain_step",
    "check_marker",
    "check_marker_order",
    "first_mismatch",
    "is_cacheable",
    "next_position",
    "positions",
    "strip_for_key",
    "thinking_key",
    "tool_key",
]

LOOKBACK = 20  # positions a breakpoint's read checks, itself included
MAX_BREAKPOINTS = 4
TTL_SECONDS = {"5m": 300.0, "1h": 3600.0}
RUN_KINDS = frozenset({"tool_use", "tool_result"})
NOT_CACHEABLE = frozenset({"thinking", "redacted_thinking"})


_TTL_ORDER = {"1h": 0, "5m": 1}


def check_marker(cc: Any, where: str) -> str | None:
    """A ``cache_control`` marker as the API takes it: its TTL, None when absent (``null`` is
    absent: the SDK types the field Optional); else `MalformedMessageError` naming ``where``.
    [PC §1-hour cache duration]: ``{"type": "ephemeral", "ttl": "5m" | "1h"}``."""
    if cc is None:
        return None
    if not isinstance(cc, dict) or cc.get("type") != "ephemeral":
        raise MalformedMessageError(f"{where}.cache_control", "must be {'type': 'ephemeral', 'ttl'?: '5m' | '1h'}")
    ttl = cc.get("ttl", "5m")
    if not isinstance(ttl, str) or ttl not in _TTL_ORDER:
        raise MalformedMessageError(f"{where}.cache_control.ttl", f"must be '5m' or '1h', got {str(ttl)[:20]!r}")
    return ttl


def check_marker_order(ttls: Sequence[str], top: str | None = None) -> None:
    """The request-wide marker rules, markers in prefix order (``top``: the top-level automatic
    marker's TTL): at most `MAX_BREAKPOINTS` [PC FAQ], and no 1-hour marker after a 5-minute one
    [PC §Mixing different TTLs]; else `MalformedMessageError`."""
    n = len(ttls) + (top is not None)
    if n > MAX_BREAKPOINTS:
        raise MalformedMessageError("cache_control", f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control "
                                                     f"may be provided. Found {n}.")
    last = -1
    for ttl in ttls:
        if _TTL_ORDER[ttl] < last:
            raise MalformedMessageError("cache_control.ttl", "a ttl='1h' cache_control block must not come after a "
                                                             "ttl='5m' cache_control block")
        last = _TTL_ORDER[ttl]


def strip_for_key(d: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a block dict the cache keys on: no marker, no top-level nulls."""
    return {k: v for k, v in d.items() if k != "cache_control" and v is not None}


def block_key(d: Mapping[str, Any], raw: bytes | None = None) -> bytes:
    """Key of a content block given as a dict already stripped of markers (``raw``: its canonical bytes)."""
    return xxhash.xxh3_128_digest(raw if raw is not None else canonical_bytes(strip_for_key(d)))


def tool_key(tool: Mapping[str, Any]) -> tuple[dict[str, Any], bytes, bytes]:
    """A tool definition without its marker, its canonical bytes, and its key."""
    d = {k: v for k, v in tool.items() if k != "cache_control"}
    raw = canonical_bytes(d)
    return d, raw, xxhash.xxh3_128_digest(raw)


def chain_step(prev: bytes, key: bytes) -> bytes:
    return xxhash.xxh3_128_digest(prev + key)


def is_cacheable(kind: str, d: Mapping[str, Any]) -> bool:
    """Whether a block of this kind may carry ``cache_control``."""
    return kind not in NOT_CACHEABLE and not (kind == "text" and not d.get("text"))


def next_position(prev_pos: int, prev_kind: str, kind: str) -> int:
    """Lookback position of a block given the previous block's position and kind."""
    return prev_pos if (kind in RUN_KINDS and kind == prev_kind) else prev_pos + 1


def positions(kinds: Iterable[str]) -> list[int]:
    """Lookback position per block."""
    out: list[int] = []
    p, prev = -1, ""
    for k in kinds:
        p = next_position(p, prev, k)
        prev = k
        out.append(p)
    return out


def first_mismatch(a: Sequence[bytes], b: Sequence[bytes], n: int) -> int | None:
    """First index below ``n`` where two chains differ, by bisection (chains are monotone)."""
    if n == 0 or a[n - 1] == b[n - 1]:
        return None  # chained: equal at n-1 means equal everywhere before
    lo, hi = 0, n - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if a[mid] == b[mid]:
            lo = mid + 1
        else:
            hi = mid
    return lo


def thinking_key(thinking: Any, model: str = "") -> Any:
    """The part of a request's ``thinking`` parameter the message cache is keyed on: "Changes to
    thinking parameters (enabled/disabled or budget allocation) invalidate message cache
    breakpoints" (prompt caching, *What invalidates the cache*). ``block_binding`` says what the API
    does with blocks that fail the prefix check, and ``display`` how blocks come back: neither is
    among them (our reading; the docs list only the mode and the budget), so a request that asks
    ``drop_block`` once reads the cache its neighbours wrote. A model with preserved thinking
    thinks adaptively when the parameter is absent, so absent and ``adaptive`` are one mode there."""
    if thinking is None and canonical_id(model) in PRESERVED_THINKING:
        return {"type": "adaptive"}
    if not isinstance(thinking, dict):
        return thinking
    return {k: v for k, v in thinking.items() if k in ("type", "budget_tokens")}
