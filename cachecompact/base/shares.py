"""Shares measured over few trials: the two ends of the Wilson score interval.

The policy decides on shares a session has shown only a few times (how many gaps outlived five
minutes, how many look-backs reached past a budget). A point estimate from a handful would
swing the decision on noise, so each rule takes the end of the interval that is safe for it,
one standard error out (z = 1): the TTL rule the lower end of a gap share, the lookback meter
the upper end of a far share.
"""

from __future__ import annotations

import math

__all__ = ["wilson_lower", "wilson_upper"]


def _ends(share: float, n: int, z: float) -> tuple[float, float]:
    centre = share + z * z / (2 * n)
    spread = z * math.sqrt(max(0.0, share * (1 - share)) / n + z * z / (4 * n * n))
    scale = 1 + z * z / n
    return max(0.0, (centre - spread) / scale), min(1.0, (centre + spread) / scale)


def wilson_lower(share: float, n: int, z: float = 1.0) -> float:
    """The lower end of the interval of a share measured over ``n`` trials (0 for none)."""
    return _ends(share, n, z)[0] if n > 0 else 0.0


def wilson_upper(share: float, n: int, z: float = 1.0) -> float:
    """The upper end of the interval of a share measured over ``n`` trials (1 for none)."""
    return _ends(share, n, z)[1] if n > 0 else 1.0
