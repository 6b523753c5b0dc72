"""The breakpoint planner: where to put at most 4 ``cache_control`` markers.

A pure function of the render (chain, positions, cacheability, the prefix's last block) and
of the previous request's breakpoints, which the session persists with its request log.
So the same transcript, ledger and previous request give the same markers in any process,
and the first request after a restart finds the cache exactly as an uninterrupted run would.

Rules: the last cacheable block (the new write), the end of the immutable prefix (it never
changes, so it stays readable after any edit), the end of the part the policy has already
compacted (``stable``: its next edit starts after it, so that edit re-writes only what follows;
marked even within reach of the last breakpoint, since only a marked block is ever written;
read on every request, the entry stays alive at no cost), and then the newest of the previous
request's writes that is still a prefix of this render, when it lies more than ``LOOKBACK``
positions behind every chosen breakpoint (a read only walks back that far); while the newest
is unreachable, older ones fill spare slots as insurance (a write that never landed).
"""

from __future__ import annotations

from collections.abc import Sequence

from ...cache.cache_keys import LOOKBACK, MAX_BREAKPOINTS

__all__ = ["plan_breakpoints"]


def plan_breakpoints(cacheable: Sequence[bool], chain: Sequence[bytes], pos: Sequence[int], prefix_last: int,
                     previous: Sequence[tuple[int, bytes]] = (), stable: int = -1) -> list[int]:
    """Flat block indices to mark, ascending. ``previous``: (block index, chain value) of the
    previous request's breakpoints; ``stable``: the last block the next edit will not change
    (-1: none)."""
    n = len(chain)

    def eligible(k: int) -> int:
        while k >= 0 and not cacheable[k]:
            k -= 1
        return k

    chosen: list[int] = []
    for k in (eligible(n - 1), eligible(prefix_last)):
        if k >= 0 and k not in chosen:
            chosen.append(k)

    def covered(c: int) -> bool:
        return any(b >= c and pos[b] - pos[c] < LOOKBACK for b in chosen)

    s = eligible(min(stable, n - 1))
    if s > max(prefix_last, -1) and s not in chosen:
        chosen.append(s)
    candidates = sorted({k for k, h in previous if 0 <= k < n and chain[k] == h and cacheable[k]}, reverse=True)
    for c in candidates:  # newest first: once one is reachable, older ones never win a read
        if len(chosen) >= MAX_BREAKPOINTS or covered(c):
            break
        chosen.append(c)
    return sorted(chosen)
