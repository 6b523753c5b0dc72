"""Whether two `cachecompact bench` runs gave the same results: the check a refactor passes.

    python benchmarks/same_results.py BEFORE/results.json AFTER/results.json

Run the bench twice with the same arguments, once on each commit (a clone of the old one, in a
venv of its own), and compare. Every run is matched by trace, strategy and window; every field
of every run and of the aggregate tables must be equal, except the ones that time the machine
(``wall_s``, ``overhead_ms_per_turn``). Prints one line per difference and a verdict; exit 0
when the results are the same, 1 when they are not, 2 on a bad file.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

TIMING = frozenset({"wall_s", "overhead_ms_per_turn"})


def differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Every place ``a`` and ``b`` differ, timing fields left out."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b), key=str):
            if k in TIMING:
                continue
            if k not in a or k not in b:
                out.append(f"{path}/{k}: only in {'after' if k in b else 'before'}")
                continue
            out += differences(a[k], b[k], f"{path}/{k}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} items before, {len(b)} after"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r} before, {b!r} after"]


def by_run(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {f"{r['trace']} {r['strategy']} {r['window_key']}": r for r in results}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    args = ap.parse_args(argv)
    try:
        before, after = (json.loads(p.read_text()) for p in (args.before, args.after))
        runs_a, runs_b = by_run(before["results"]), by_run(after["results"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        print(f"same_results: cannot read a results.json ({type(err).__name__}: {err})", file=sys.stderr)
        return 2
    found = differences(runs_a, runs_b, "results") + differences(before.get("aggregate"), after.get("aggregate"),
                                                                  "aggregate")
    for line in found[:200]:
        print(line)
    strategies = sorted({r["strategy"] for r in before["results"]})
    print(f"{len(runs_a)} runs ({', '.join(strategies)}): "
          + ("the same, field for field (timings aside)" if not found else f"{len(found)} difference(s)"))
    return 0 if not found else 1


if __name__ == "__main__":
    sys.exit(main())
