"""Statistics of the trace corpus that the synthetic generator is fitted to.

    python benchmarks/trace_stats.py [PATHS...]
"""

from __future__ import annotations

import itertools
import math
import statistics
import sys

from cachecompact.tools.traces import default_trace_dir, discover, load_trace


def main() -> int:
    paths = sys.argv[1:] or ([default_trace_dir()] if default_trace_dir() else [])
    if not paths:
        print("no traces found")
        return 0
    sizes: list[int] = []
    turns: list[int] = []
    gaps: list[float] = []
    for f in discover(paths):
        t = load_trace(f)
        turns.append(t.turns)
        for m in t.messages:
            for b in m["content"] if isinstance(m["content"], list) else []:
                if b.get("type") == "tool_result":
                    c = b.get("content")
                    n = len(c) if isinstance(c, str) else sum(len(x.get("text", "")) for x in c or []
                                                              if isinstance(x, dict))
                    sizes.append(max(n, 1))
        ts = [x for x in t.timestamps if x]
        gaps += [b - a for a, b in itertools.pairwise(ts) if b >= a]
    sizes.sort()
    idle = [g for g in gaps if g > 300]
    print(f"sessions {len(turns)}; turns median {statistics.median(turns)}, range {min(turns)}-{max(turns)}")
    print(f"tool results {len(sizes)}; chars median {statistics.median(sizes)}, p90 {sizes[int(0.9 * len(sizes))]}, "
          f"p99 {sizes[int(0.99 * len(sizes))]}, log sd {statistics.pstdev([math.log(s) for s in sizes]):.2f}")
    print(f"gaps {len(gaps)}; median {statistics.median(gaps):.1f}s; over 5 min {len(idle) / len(gaps):.2%}, "
          f"median idle {statistics.median(idle) / 60 if idle else 0:.0f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
