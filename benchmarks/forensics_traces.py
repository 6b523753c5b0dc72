"""`cachecompact forensics` on the shared Claude Code logs (the 2025 and the 2026 set, each its own
table), written to docs/cache-model.md.

    python benchmarks/forensics_traces.py [--write docs/cache-model.md]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cachecompact.tools._logs import summarize_logs  # noqa: E402
from cachecompact.tools.bench.bench_report import publish  # noqa: E402
from cachecompact.tools.traces import default_trace_dir, discover  # noqa: E402


def _shown(path: str) -> str:
    """A path as the docs show it: under the shared folder, relative to the checkout."""
    p = Path(path).resolve()
    shared = (ROOT.parent / "shared").resolve()
    return f"../shared/{p.relative_to(shared)}" if p.is_relative_to(shared) else str(path)


def _section(title: str, paths: list[str]) -> list[str]:
    done, _skipped, tot = summarize_logs(discover(paths))
    misses = sum(tot["misses"].values())
    share = tot["unexplained"] / misses if misses else 0.0
    waste = sum(tot["wasted_usd"].values())
    rows = ["| class | misses | dollars wasted |", "|---|---:|---:|"]
    for cls, n in tot["misses"].items():
        rows.append(f"| {cls} | {n} | ${tot['wasted_usd'][cls]:.2f} |")
    per = ["| log | calls | cost | wasted | misses (class: count) |", "|---|---:|---:|---:|---|"]
    for r in done:
        per.append(f"| {r.name} | {r.calls} | ${r.cost_usd:.2f} | ${sum(r.wasted.values()):.2f} | "
                   + (", ".join(f"{k}: {v}" for k, v in sorted(r.misses.items())) or "none") + " |")
    return [
        f"**{title}** (`cachecompact forensics {' '.join(_shown(p) for p in paths)}`): {tot['logs']} logs, "
        f"{tot['calls']} calls with recorded usage ({tot['subagent_calls']} by sub-agents), "
        f"${tot['cost_usd']:.2f} as billed, "
        f"${waste:.2f} wasted; **{misses} misses**: {tot['explained']} explained by a class, "
        f"**{tot['unexplained']} unexplained** ({share:.0%}, `provider_suspected`).", "", *rows, "", *per, "",
        "Advice it printed:", "", *[f"- {line}" for line in tot["advice"]], ""]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="*")
    ap.add_argument("--write", metavar="MD")
    args = ap.parse_args()
    tdir = default_trace_dir()
    if args.paths:
        sets = [("the logs given", list(args.paths))]
    elif tdir:
        sets = [(f"{name}", [str(tdir / name)]) for name in ("claude-code", "claude-code-2026")
                if (tdir / name).is_dir()]
    else:
        print("no traces: ../shared/traces is absent", file=sys.stderr)
        return 1
    text = "\n".join(line for title, paths in sets for line in _section(title, paths)).rstrip()
    return publish(text, args.write, "forensics")


if __name__ == "__main__":
    sys.exit(main())
