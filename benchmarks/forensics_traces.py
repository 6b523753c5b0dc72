"""`cachecompact forensics` on the shared Claude Code logs, written to docs/cache-model.md.

    python benchmarks/forensics_traces.py [--write docs/cache-model.md]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cachecompact.tools.bench.report import publish  # noqa: E402
from cachecompact.tools.logs import summarize_logs  # noqa: E402
from cachecompact.tools.traces import default_trace_dir, discover  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="*")
    ap.add_argument("--write", metavar="MD")
    args = ap.parse_args()
    tdir = default_trace_dir()
    paths = args.paths or ([str(tdir / "claude-code")] if tdir else [])
    if not paths:
        print("no traces: ../shared/traces is absent", file=sys.stderr)
        return 1
    done, _skipped, tot = summarize_logs(discover(paths))
    misses = sum(tot["misses"].values())
    rows = ["| class | misses | dollars wasted |", "|---|---:|---:|"]
    for cls, n in tot["misses"].items():
        rows.append(f"| {cls} | {n} | ${tot['wasted_usd'][cls]:.2f} |")
    per = ["| log | calls | misses (class: count) |", "|---|---:|---|"]
    for r in done:
        per.append(f"| {r.name} | {r.calls} | " + (", ".join(f"{k}: {v}" for k, v in sorted(r.misses.items()))
                                                    or "none") + " |")
    text = "\n".join([
        f"`cachecompact forensics ../shared/traces/claude-code`: {tot['logs']} logs, {tot['calls']} calls with "
        f"recorded usage, **{misses} misses**: {tot['explained']} explained by a class, **{tot['unexplained']} "
        "unexplained** (`provider_suspected`: nothing changed, the entry was within the TTL and the lookback, "
        "and still less was read).", "", *rows, "", *per])
    return publish(text, args.write, "forensics")


if __name__ == "__main__":
    sys.exit(main())
