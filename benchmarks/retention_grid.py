"""A grid of closed-loop agents (issues 55, 63): does what the agent needs stay in view?

Each agent reads files, does one-word actions between the reads (sometimes two reads in one
turn), and after each read submits a value it read ``N`` reads earlier. It quotes the value only
if the exact line is still in the request it was given; otherwise it reads the file again (a
**re-read**). The line it needs is an ordinary line in the middle of the output, written like
every line around it, so no key-line heuristic can find it: only a model of what the agent
comes back to can keep it.

A cell of the grid is (window, look-back N, result size). The look-back in tokens is about
``N x size``; a cell is run where that working set is at most 70% of the window. Mode (sync,
stream, async) and thinking (on, off) rotate over the cells. The grid is split as a
checkerboard over (N, size): half ``fit`` is where anything may be tuned, half ``held`` is
what is reported and asserted. Nothing in cachecompact reads this file.

For each cell it runs cachecompact (defaults), ``none`` (where the session fits), and fixed
budgets (``recent_tokens`` at 20%, 35% and 50% of the window, the look-back meter off), and
reports re-reads per submission, compactions per 100 turns and cost.

    python benchmarks/retention_grid.py            # the held-out half, all configurations
    python benchmarks/retention_grid.py --half fit --only ours
    python benchmarks/retention_grid.py --quick    # one cell per window (the test's selection)
    python benchmarks/retention_grid.py --report runs.jsonl   # heat maps from --json output
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import anthropic

import cachecompact
from cachecompact.base.events import summary_cost
from cachecompact.base.headers import CLOCK_HEADER
from cachecompact.base.pricing import get_model
from cachecompact.base.tokens import TokenCounter
from cachecompact.tools.bench._recall import request_text
from cachecompact.tools.emulator import Emulator, Reply, ScriptedResponder, SummarizingResponder

WINDOWS = [40_000, 80_000, 200_000, 1_000_000]
LOOKBACKS = [1, 2, 4, 6, 8, 12, 16]
SIZES = [500, 2_000, 5_000, 10_000, 20_000]
MODES = ["sync", "stream", "async"]
WORKING_SET_MAX = 0.70  # cells whose working set is above this share of the window are not run
MAX_TURNS = 150
MAX_TOKENS = 4096  # each request's max_tokens
PREFIX_TOKENS = 600  # the system prompt, tools and task, cl100k tokens (about); the prefix also holds the first read
SUMMARY_TOKENS = 1_500  # the planning size of one summary

TOOLS = [{"name": "read_file", "description": "Read a file.",
          "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}},
         {"name": "act", "description": "Do a short action, or submit a value.",
          "input_schema": {"type": "object", "properties": {"key": {"type": "string"}, "value": {"type": "string"}},
                           "required": ["key"]}}]
SYSTEM = "You are a careful coding agent. Read files and act on the exact values you read. " * 15
WORDS = ["cache", "ledger", "parser", "session", "window", "budget", "render", "token", "policy", "stream", "queue",
         "shard", "index", "lease", "delta", "frame", "route", "probe"]
COUNTER = TokenCounter()


@dataclass(frozen=True)
class Cell:
    window: int
    lookback: int
    size: int
    mode: str
    thinking: bool

    @property
    def half(self) -> str:
        return "fit" if (LOOKBACKS.index(self.lookback) + SIZES.index(self.size)) % 2 == 0 else "held"

    @property
    def working_set(self) -> float:
        """The look-back in tokens as a share of the window."""
        return self.lookback * self.size / self.window

    @property
    def model(self) -> str:
        return "claude-opus-5-5" if self.thinking else "claude-sonnet-4-6"

    @property
    def need(self) -> int:
        """What the window must hold for the agent to never re-read, in the model's own tokens
        (Opus 5.5 counts about 1.3x the tokens of the files' cl100k size): the prefix, the reach
        (the needed result and the ``N`` reads after it, at their largest, 1.3x the mean size), a
        summary, and one more turn (a parallel read of two), beside the reply and the 5% margin.
        The immutable prefix holds the first read too (``prefix_messages=3``)."""
        ratio = get_model(self.model).token_ratio
        reach = (self.lookback + 1) * self.size * 1.3 * ratio
        turn = 2 * self.size * 1.3 * ratio
        prefix = (PREFIX_TOKENS + self.size * 1.3) * ratio
        return int(prefix + reach + SUMMARY_TOKENS + turn + MAX_TOKENS + 0.05 * self.window)

    @property
    def fits(self) -> bool:
        """Whether issue 63's re-read bar applies: prefix + reach + a summary + one turn fit the
        window. Elsewhere the engine must say the window is too small, and not loop."""
        return self.need <= self.window


def cells() -> list[Cell]:
    out = []
    k = 0
    for w in WINDOWS:
        for n in LOOKBACKS:
            for s in SIZES:
                if n * s > WORKING_SET_MAX * w:
                    continue
                out.append(Cell(w, n, s, MODES[k % 3], k % 2 == 0))
                k += 1
    return out


def _line(rng: random.Random, n: int) -> str:
    return f"    {rng.choice(WORDS)}_{n} = {rng.choice(WORDS)}.get({rng.randint(0, 99_999)})  # {rng.choice(WORDS)}"


def _file(rng: random.Random, path: str, tokens: int) -> tuple[str, str]:
    """A file of about ``tokens`` tokens, and its needed line: one from the middle, like the rest."""
    lines = [f'"""{path}"""']
    per = COUNTER.count_text("\n".join(_line(rng, 10_000 + i) for i in range(40))) / 40
    base = rng.randint(0, 10**6)
    lines += [_line(rng, base + i) for i in range(max(4, int(tokens / per)))]
    needed = lines[len(lines) // 2 + rng.randint(-len(lines) // 8, len(lines) // 8)]
    return "\n".join(lines), needed


@dataclass
class Agent:
    """The model: reads, acts, and before a submission looks for its line in the request."""

    cell: Cell
    rng: random.Random
    files: dict[str, tuple[str, str]] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)  # paths in the order first read
    queue: list[tuple[str, Any]] = field(default_factory=list)
    n: int = 0
    k: int = 0
    tries: int = 0
    rereads: int = 0
    all_rereads: int = 0
    uses: int = 0

    def _reply(self, calls: list[tuple[str, dict[str, Any]]], think: bool) -> Reply:
        blocks: list[dict[str, Any]] = [{"type": "text", "text": "Next."}]
        for name, inp in calls:
            self.n += 1
            blocks.append({"type": "tool_use", "id": f"toolu_{self.n:05d}", "name": name, "input": inp})
        return Reply(blocks, "tool_use")

    def _new_file(self) -> str:
        path = f"src/mod_{self.k:03d}.py"
        size = int(self.cell.size * self.rng.uniform(0.7, 1.3))
        self.files[path] = _file(self.rng, path, size)
        self.k += 1
        return path

    def _plan(self) -> None:
        width = 2 if self.rng.random() < 0.2 else 1  # calls in parallel
        group = [self._new_file() for _ in range(width)]
        self.queue.append(("read", group))
        for _ in range(self.rng.randint(0, 2)):
            self.queue.append(("act", None))
        self.order += group
        if len(self.order) > self.cell.lookback:
            self.queue.append(("use", self.order[-1 - self.cell.lookback]))

    def __call__(self, body: dict[str, Any]) -> Reply:
        think = self.cell.thinking
        if not self.queue:
            self._plan()
        kind, arg = self.queue[0]
        if kind == "read":
            self.queue.pop(0)
            return self._reply([("read_file", {"path": p}) for p in arg], think)
        if kind == "act":
            self.queue.pop(0)
            return self._reply([("act", {"key": "step"})], think)
        path = arg
        line = self.files[path][1]
        seen = line in request_text(body)
        if self.tries == 0:
            self.uses += 1
            self.rereads += not seen
        if seen or self.tries >= 2:
            self.queue.pop(0)
            self.tries = 0
            name, value = line.strip().split(" = ")
            return self._reply([("act", {"key": name, "value": value.split("  #")[0]})], think)
        self.tries += 1
        self.all_rereads += 1
        return self._reply([("read_file", {"path": path})], think)


@dataclass
class Result:
    cell: Cell
    config: str
    turns: int
    uses: int  # submissions (first tries)
    rereads: int  # submissions whose line was not in view
    all_rereads: int
    compactions: int
    levels: dict[str, int]
    cost: float  # the agent's requests and cachecompact's own summary calls (ours and the API's)
    too_small: int
    seconds: float
    summary_usd: float = 0.0  # of ``cost``, the summary calls

    @property
    def reread_share(self) -> float:
        return self.rereads / self.uses if self.uses else 0.0

    @property
    def per_100(self) -> float:
        return 100 * self.compactions / max(1, self.turns)


CONFIGS = ["ours", "none", "fixed20", "fixed35", "fixed50"]


POLICY: Any = None  # "ours" with this PolicyConfig instead of the default's (benchmarks/ablate.py)


def _wrap_kwargs(config: str, cell: Cell) -> dict[str, Any] | None:
    if config == "ours":
        return {} if POLICY is None else {"config": POLICY}
    if config == "none":
        return {"strategy": "none"}
    share = int(config.removeprefix("fixed")) / 100
    return {"recent_tokens": int(share * cell.window)}  # a fixed budget: the look-back meter is off


def _turn_budget(cell: Cell) -> int:
    """Enough turns to pass the compaction point about twice, at most MAX_TURNS."""
    per_turn = cell.size * 0.6 + 200  # a read on about half the turns, acts and uses between
    return int(min(MAX_TURNS, max(60, 2.2 * cell.window / per_turn)))


SUMMARIZER: Any = None  # wrap()'s summarizer: None, the offline extractive one; "auto", the product's default


def run(cell: Cell, config: str, seed: int = 0) -> Result:
    t0 = time.perf_counter()
    rng = random.Random(hash((cell.window, cell.lookback, cell.size, seed)) & 0xFFFFFFFF)
    agent = Agent(cell, rng)
    events: list[Any] = []
    model = get_model(cell.model)
    kw = _wrap_kwargs(config, cell)
    assert kw is not None
    window = None if cell.window == model.context_window else cell.window
    turns = _turn_budget(cell)
    thinking: dict[str, Any] = {"thinking": {"type": "adaptive"}} if cell.thinking else {}
    cost = 0.0
    with Emulator(SummarizingResponder(ScriptedResponder(agent))) as emu:
        if cell.mode == "async":
            client: Any = cachecompact.wrap(anthropic.AsyncAnthropic(base_url=emu.url, api_key="k", max_retries=0),
                                            store=None, summarizer=SUMMARIZER, window_tokens=window,
                                            on_event=events.append, **kw)
        else:
            client = cachecompact.wrap(anthropic.Anthropic(base_url=emu.url, api_key="k", max_retries=0),
                                       store=None, summarizer=SUMMARIZER, window_tokens=window, on_event=events.append,
                                       **kw)
        hist: list[dict[str, Any]] = [{"role": "user", "content": "Audit the project and act on its settings."}]
        clock = 1_800_000_000.0
        loop = asyncio.new_event_loop() if cell.mode == "async" else None
        for _ in range(turns):
            clock += 15.0
            args: dict[str, Any] = dict(model=cell.model, max_tokens=MAX_TOKENS, system=SYSTEM, tools=TOOLS,
                                        messages=hist,
                                        extra_headers={CLOCK_HEADER: repr(clock)}, **thinking)
            if cell.mode == "sync":
                r = client.messages.create(**args)
            elif cell.mode == "stream":
                with client.messages.stream(**args) as s:
                    r = s.get_final_message()
            else:
                assert loop is not None
                r = loop.run_until_complete(client.messages.create(**args))
            cost += model.cost(r.usage.model_dump())
            content = [b.model_dump(exclude_none=True) for b in r.content]
            calls = [b for b in content if b.get("type") == "tool_use"]
            hist.append({"role": "assistant", "content": content})
            results = []
            for c in calls:
                path = c["input"].get("path")
                text = agent.files[path][0] if c["name"] == "read_file" else "ok"
                results.append({"type": "tool_result", "tool_use_id": c["id"], "content": text})
            hist.append({"role": "user", "content": results})
        if loop is not None:
            loop.run_until_complete(client.close())
            loop.close()
        else:
            client.close()
    comp = [e for e in events if e.kind == "compaction"]
    levels: dict[str, int] = {}
    for e in comp:
        levels[str(e.level)] = levels.get(str(e.level), 0) + 1
    small = sum(1 for e in events if e.kind == "window_too_small")
    # what the summary calls cost is the session's too (`base.events.summary_cost`, the rule `report`
    # adds them by): left out, a writer that reads the whole context for each summary looked free
    summaries = sum(summary_cost(e) for e in events)
    return Result(cell, config, turns, agent.uses, agent.rereads, agent.all_rereads, len(comp), levels,
                  cost + summaries, small, time.perf_counter() - t0, summaries)


def _fits_none(cell: Cell) -> bool:
    return _turn_budget(cell) * (cell.size * 0.6 + 200) < 0.9 * cell.window


def quick_cells(half: str = "held") -> list[Cell]:
    """One cell per window from ``half``: the largest working set at or under 60% of the window."""
    out = []
    for w in WINDOWS:
        mine = [c for c in cells() if c.window == w and c.half == half and c.working_set <= 0.6]
        if mine:
            out.append(max(mine, key=lambda c: (c.working_set, c.size)))
    return out


def _bar(window: int) -> float:
    """Issue 63's re-read bar where the working set fits: 5%, and 2% at 200k and 1M."""
    return 0.02 if window >= 200_000 else 0.05


def report(rows: list[dict[str, Any]], label: str = "ours") -> str:
    """Markdown heat maps from ``--json`` lines: per window, look-back N down and result size
    across. Three maps: ``label``'s re-reads per submission (``-`` where the cell does not fit
    the window: the bar does not apply), its compactions per 100 turns, and its cost per
    submitted value over that of the cheapest fixed budget that met the same re-read bar on the
    cell (``n/a`` where none did)."""
    by: dict[tuple[int, int, int], dict[str, dict[str, Any]]] = {}
    for r in rows:
        c = r["cell"]
        by.setdefault((c["window"], c["lookback"], c["size"]), {})[r["config"]] = r

    def per_value(r: dict[str, Any]) -> float:
        return float(r["cost"]) / max(1, int(r["uses"]))

    def share(r: dict[str, Any]) -> float:
        return int(r["rereads"]) / max(1, int(r["uses"]))

    def cell_text(kind: str, key: tuple[int, int, int]) -> str:
        runs = by.get(key, {})
        r = runs.get(label)
        if r is None:
            return ""
        fits = bool(r.get("fits"))
        if kind == "rereads":
            mark = "" if fits else " (too small)"
            flag = " **over**" if fits and share(r) > _bar(key[0]) else ""
            return f"{share(r):.0%}{flag}{mark}"
        if kind == "compactions":
            return f"{100 * int(r['compactions']) / max(1, int(r['turns'])):.0f}"
        ok = [x for name, x in runs.items() if name.startswith("fixed") and share(x) <= _bar(key[0])]
        if not ok:
            return "n/a"
        return f"{per_value(r) / min(per_value(x) for x in ok):.2f}x"

    out: list[str] = []
    for kind, title in (("rereads", f"re-reads per submission ({label})"),
                        ("compactions", f"compactions per 100 turns ({label})"),
                        ("cost", f"cost per value, {label} over the cheapest fixed budget meeting the bar")):
        out += [f"**{title}**", ""]
        for w in sorted({k[0] for k in by}):
            ns = sorted({k[1] for k in by if k[0] == w})
            sizes = sorted({k[2] for k in by if k[0] == w})
            out += [f"{w // 1000}k | " + " | ".join(f"{s:,}" for s in sizes), "|".join(["---"] * (len(sizes) + 1))]
            out += [f"N={n} | " + " | ".join(cell_text(kind, (w, n, s)) for s in sizes) for n in ns]
            out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--half", choices=["fit", "held", "both"], default="held")
    ap.add_argument("--only", action="append", choices=CONFIGS, help="configurations to run (default: all)")
    ap.add_argument("--quick", action="store_true", help="one cell per window")
    ap.add_argument("--window", type=int, action="append")
    ap.add_argument("--json", help="append each run's result here, one JSON object a line")
    ap.add_argument("--report", nargs="+", metavar="JSONL", help="print heat maps from these --json files; run nothing")
    ap.add_argument("--label", default="ours", help="with --report: the configuration mapped (default: ours)")
    ap.add_argument("--summarizer", choices=["extractive", "auto"], default="extractive",
                    help="auto: wrap()'s default (summaries by a small model through the emulator, and the "
                         "API's where the policy chooses them); extractive (default): offline, no summary calls")
    a = ap.parse_args(argv)
    global SUMMARIZER
    SUMMARIZER = "auto" if a.summarizer == "auto" else None
    if a.report:
        lines = [json.loads(x) for p in a.report for x in Path(p).read_text(encoding="utf-8").splitlines() if x.strip()]
        print(report(lines, a.label))
        return 0
    todo = quick_cells(a.half if a.half != "both" else "held") if a.quick else \
        [c for c in cells() if a.half == "both" or c.half == a.half]
    if a.window:
        todo = [c for c in todo if c.window in a.window]
    configs = a.only or CONFIGS
    rows: list[Result] = []
    print(f"{len(todo)} cells x {len(configs)} configurations", file=sys.stderr)
    for i, c in enumerate(todo):
        for cfg in configs:
            if cfg == "none" and not _fits_none(c):
                continue
            r = run(c, cfg)
            rows.append(r)
            if a.json:  # each run as it ends (JSON lines): a long grid stopped part way keeps what it ran
                with open(a.json, "a", encoding="utf-8") as f:
                    f.write(json.dumps({**asdict(r), "cell": asdict(r.cell), "half": r.cell.half, "fits": r.cell.fits,
                                        "need": r.cell.need}) + "\n")
            print(f"[{i + 1}/{len(todo)}] {c.window // 1000}k N={c.lookback} size={c.size} {c.mode} "
                  f"think={int(c.thinking)} ws={c.working_set:.0%} fits={int(c.fits)} {cfg}: "
                  f"re-reads {r.rereads}/{r.uses} "
                  f"(all {r.all_rereads}) compactions {r.compactions} {r.levels} "
                  f"${r.cost:.2f} small={r.too_small} {r.seconds:.1f}s", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
