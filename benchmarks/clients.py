"""Real clients at their defaults, direct and through compact mode (issue 62's measure).

Claude Code (the model it picks, with its own ``max_tokens``) and opencode (its defaults), as
installed by `.ci/run` into .ci/node, hold multi-prompt conversations (``claude -c``, ``opencode
run -c``) into the emulator: once direct, once through ``cachecompact proxy`` in compact mode at
the same window. The scripted model is the suite's (`tests/adapters/test_client_defaults.py`,
`PromptModel`): it answers the newest prompt of the person it can see with S shell calls of L
lines each and then "done K", and says "LOST" when none is in sight; with ``--think`` it thinks
that many tokens before each answer where the client turns thinking on.

The scenarios are drawn from seeds (prompts 3-5, calls per prompt 2-5, 300-1,000 lines a call,
and for Claude Code a pasted first prompt of 0-1,200 log lines), so nothing here is fitted to
one conversation. For each cell it reports, per path: whether every prompt ended without an
error, how many were answered as their own, and the emulator's bill (the client's requests and
the proxy's own summary calls); for compact mode also the compactions by level, L5's drops by
why no summary stood in for them (``no_summary`` in its event; issue 62's target is none where
"a summary does not fit" is not the reason), the proxy's own refusals and the summary calls
that failed with "Streaming is required".

    python benchmarks/clients.py                         # Claude Code, 40k and 80k, seeds 0-2
    python benchmarks/clients.py --client opencode --window 80000 --window 200000
    python benchmarks/clients.py --think 2000 --seed 3 --json runs.jsonl
    python benchmarks/clients.py --heavy --window 200000  # long tool loops at Claude Code's window

Nothing in cachecompact reads this file. Each conversation takes 20-120 s on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cachecompact.adapters.proxy import Proxy, ProxyConfig  # noqa: E402
from cachecompact.tools.emulator import Emulator, ScriptedResponder, SummarizingResponder  # noqa: E402
from tests.adapters.test_client_defaults import BIN, PromptModel, _claude_code, _opencode  # noqa: E402


@dataclass(frozen=True)
class Scenario:
    seed: int
    prompts: int
    steps: int
    lines: int
    paste: int  # lines of log pasted into Claude Code's first prompt

    @classmethod
    def draw(cls, seed: int, client: str, heavy: bool = False) -> Scenario:
        rng = random.Random(seed)
        if heavy:  # long tool loops: 30-60 calls of 700-1,000 lines in all, filling most of a 200k window
            return cls(seed, 3, rng.randint(10, 20), rng.choice([700, 1_000]), 0)
        return cls(seed, rng.randint(3, 5), rng.randint(2, 5), rng.choice([300, 500, 700, 1_000]),
                   rng.choice([0, 0, 400, 800, 1_200]) if client == "claude-code" else 0)


@dataclass
class Path_:
    completed: bool = False  # every prompt ended without an error
    right: int = 0  # prompts answered "done K", K their own
    prompts: int = 0
    usd: float = 0.0  # the emulator's bill: the client's requests and the proxy's summary calls
    summary_usd: float = 0.0  # of which the proxy's own calls
    requests: int = 0
    levels: dict[str, int] = field(default_factory=dict)  # compactions by level (compact mode)
    l5_why: dict[str, int] = field(default_factory=dict)  # L5 drops by why no summary stood in
    refused: int = 0  # the proxy's own refusals
    streaming_failures: int = 0  # summary calls refused with "Streaming is required"
    seconds: float = 0.0
    error: str = ""  # the first prompt's error the client printed, if any


def _answer(client: str, url: str, tmp: Path, k: int, sc: Scenario) -> tuple[str, str]:
    if client == "claude-code":
        return _claude_code(url, tmp, k, model=None, paste=sc.paste)
    return _opencode(url, tmp, k)


def _why(detail: dict[str, Any]) -> str:
    text = str(detail.get("no_summary") or "not said")
    return re.sub(r" \(messages\[\d+\]\)", "", text.split(":")[0])


def converse(client: str, sc: Scenario, window: int, mode: str, think: int) -> Path_:
    """One conversation; it stops at the first prompt the client could not answer."""
    out = Path_(prompts=sc.prompts)
    model = PromptModel(sc.steps, sc.lines, think=think)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        (tmp / "work").mkdir()
        store = tmp / "store"
        with Emulator(SummarizingResponder(ScriptedResponder(model)), context_window=window) as emu:
            px = Proxy(ProxyConfig(upstream=emu.url, port=0, mode="compact", window_tokens=window, store=str(store))) \
                if mode == "compact" else None
            try:
                if px is not None:
                    px.__enter__()
                url = px.url if px is not None else emu.url
                answers, errors = [], []
                for k in range(sc.prompts):
                    a, e = _answer(client, url, tmp, k, sc)
                    answers.append(a)
                    errors.append(e)
                    if e:
                        break
                if px is not None:
                    px.wait_idle()
                    out.refused = px.state.observer.totals.refused
            finally:
                if px is not None:
                    px.__exit__(None, None, None)
            served = [r for r in emu.requests if r.get("status") == 200]
        out.completed = not any(errors) and len(answers) == sc.prompts
        out.error = next((e[:300] for e in errors if e), "")
        out.right = sum(a == f"done {k}" for k, a in enumerate(answers))
        out.usd = round(sum(float(r.get("cost_usd") or 0) for r in served), 4)
        out.summary_usd = round(sum(float(r.get("cost_usd") or 0) for r in served if r.get("internal")), 4)
        out.requests = sum(1 for r in served if not r.get("internal"))
        levels: Counter[str] = Counter()
        why: Counter[str] = Counter()
        for f in store.glob("*/events.jsonl"):
            for line in f.read_text().splitlines():
                ev = json.loads(line)
                if ev.get("kind") == "compaction":
                    levels[str(ev.get("level"))] += 1
                    if ev.get("level") == "L5":
                        why[_why(ev.get("detail") or {})] += 1
                elif ev.get("kind") == "failure" and "Streaming is required" in str(ev.get("reason")):
                    out.streaming_failures += 1
        out.levels, out.l5_why = dict(levels), dict(why)
    out.seconds = round(time.monotonic() - t0, 1)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--client", action="append", choices=["claude-code", "opencode"])
    ap.add_argument("--window", action="append", type=int)
    ap.add_argument("--seed", action="append", type=int)
    ap.add_argument("--think", type=int, default=0, help="thinking tokens before each answer (Claude Code)")
    ap.add_argument("--mode", action="append", choices=["direct", "compact"])
    ap.add_argument("--heavy", action="store_true", help="long tool loops (3 prompts of 10-20 calls each)")
    ap.add_argument("--json", type=Path, help="append one line per conversation here")
    a = ap.parse_args(argv)
    clients = a.client or ["claude-code"]
    windows = a.window or [40_000, 80_000]
    seeds = a.seed if a.seed is not None else [0, 1, 2]
    modes = a.mode or ["direct", "compact"]
    for c in clients:
        if not BIN[c].exists():
            print(f"{c} is not installed at {BIN[c]} (.ci/run installs it into .ci/node)", file=sys.stderr)
            return 2
    print("| client | seed: prompts x calls x lines, paste | window | path | completed | right | $ | summary $ | "
          "edits L1-L4 | L5 (why no summary) | refused |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    runs: dict[tuple[str, int, int, str], Path_] = {}
    for c in clients:
        for seed in seeds:
            sc = Scenario.draw(seed, c, a.heavy)
            for w in windows:
                for m in modes:
                    r = runs[c, seed, w, m] = converse(c, sc, w, m, a.think)
                    l5 = ", ".join(f"{n} {k}" for k, n in sorted(r.l5_why.items())) or "0"
                    edits = ", ".join(f"{k} {n}" for k, n in sorted(r.levels.items()) if k != "L5") or "0"
                    print(f"| {c}{' thinking' if a.think else ''} | {seed}: {sc.prompts}x{sc.steps}x{sc.lines}, "
                          f"{sc.paste} | {w:,} | {m} | {'yes' if r.completed else 'no'} | {r.right}/{r.prompts} | "
                          f"{r.usd:.3f} | {r.summary_usd:.3f} | {edits} | {l5} | {r.refused} |",
                          flush=True)
                    if r.error:
                        print(f"  ^ {r.error}", flush=True)
                    if r.streaming_failures:
                        print(f"  ^ {r.streaming_failures} summary call(s) failed: Streaming is required", flush=True)
                    if a.json:
                        with a.json.open("a") as fh:
                            fh.write(json.dumps({"client": c, "scenario": asdict(sc), "window": w, "mode": m,
                                                 "think": a.think, **asdict(r)}) + "\n")
    print()
    for m in modes:
        mine = [r for k, r in runs.items() if k[3] == m]
        fits = sum(n for r in mine for why, n in r.l5_why.items() if why not in NO_ROOM)
        print(f"{m}: {sum(r.completed for r in mine)}/{len(mine)} conversations completed, "
              f"{sum(r.right for r in mine)}/{sum(r.prompts for r in mine)} prompts right, "
              f"${sum(r.usd for r in mine):.3f}"
              + (f"; L4 {sum(r.levels.get('L4', 0) for r in mine)}, L5 {sum(r.levels.get('L5', 0) for r in mine)} "
                 f"(while a summary fits: {fits}), refused {sum(r.refused for r in mine)}, "
                 f"streaming failures {sum(r.streaming_failures for r in mine)}" if m == "compact" else ""))
    if "direct" in modes and "compact" in modes:
        lost = [k[:3] for k, r in runs.items() if k[3] == "direct" and r.completed
                and not (runs[(*k[:3], "compact")].completed and runs[(*k[:3], "compact")].right >= r.right)]
        print(f"cells that complete direct but not as well through compact: {lost or 'none'}")
        pairs = [(r.usd, runs[(*k[:3], "compact")].usd) for k, r in runs.items() if k[3] == "direct" and r.completed]
        if pairs:
            ratio = sum(c for _, c in pairs) / sum(d for d, _ in pairs)
            print(f"compact/direct cost where direct completes: {ratio:.2f}x "
                  f"(cells {min(c / d for d, c in pairs):.2f}-{max(c / d for d, c in pairs):.2f}x)")
    return 0


# why an L5 drop had no summary in its place, where none could stand in (`_summary_for_drop`'s reasons)
NO_ROOM = {"a summary does not fit", "the rounds are no bigger than a summary",
           "nothing after the immutable prefix to summarize", "summaries are stopped (the breaker is open)",
           "it would cover the person's long newest request, which L5 keeps whole",
           "drops the leading summary"}


if __name__ == "__main__":
    raise SystemExit(main())
