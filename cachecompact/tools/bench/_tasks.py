"""A closed-loop task suite: agents that must quote what compaction may have hidden.

Replayed traces cannot show what an agent does when a fact it needs is gone; these tasks can.
Each task is a deterministic synthetic project of source files. Every file holds a few
*facts* (a module constant ``NAME = "value"``, or a function signature) among ordinary code.
The agent reads the files one by one and, several steps after reading one, must *quote* a
fact from it.

The model is scripted and acts only on what the request shows it: at a quote step, if the
fact's line is visible verbatim anywhere in the request (the original output, a preview, a
placeholder's key lines, a summary), it records the value and moves on; if not, it re-reads
the file, which costs a real turn, and tries again. A step may take at most
`STEP_ATTEMPTS` turns; a task passes when every step completes within that budget.

Reported per strategy and window: pass rate, re-reads (per quote step), turns, cost and cost
per passed task, the offline form of a pass@1 quality signal.
"""

from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import anthropic

from ...adapters.middleware import CompactionMiddleware, summarizer_factory
from ...adapters.sdk_errors import ContextFullError
from ...base.headers import CLOCK_HEADER
from ..emulator import Emulator, Reply, SummarizingResponder
from .harness import MAX_REASON, api_message, check_strategy

__all__ = ["STEP_ATTEMPTS", "Fact", "Task", "TaskResult", "TaskScript", "make_task", "run_task"]

STEP_ATTEMPTS = 3  # the step itself and up to two re-reads
MAX_TOKENS = 1024
SYSTEM = ("You audit a code base. Read the files you are asked to read with read_file, and when asked for a value, "
          "record it exactly as it appears in the file with record. Answer 'done' when finished.")
TOOLS = [
    {"name": "read_file", "description": "Read a file of the project.",
     "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}},
    {"name": "record", "description": "Record a value found in the code, exactly as written.",
     "input_schema": {"type": "object", "properties": {"fact": {"type": "string"}, "value": {"type": "string"}},
                      "required": ["fact", "value"]}},
]
_NOUNS = ("cache", "ledger", "parser", "session", "window", "budget", "render", "token", "policy", "stream", "queue",
          "shard", "index", "lease", "quota", "record", "vector", "schema", "buffer", "replica")
_VERBS = ("load", "apply", "merge", "split", "check", "build", "flush", "route", "score", "trim", "emit", "store")


@dataclass(frozen=True, slots=True)
class Fact:
    key: str  # what the agent is asked for
    value: str  # what it must record
    line: str  # the line that shows it, verbatim
    path: str


@dataclass(frozen=True)
class Task:
    name: str
    files: dict[str, str]
    steps: list[tuple[str, str]]  # ("read", path) | ("quote", fact key)
    facts: dict[str, Fact]

    @property
    def quotes(self) -> int:
        return sum(1 for kind, _ in self.steps if kind == "quote")


def _function(rng: random.Random, name: str) -> list[str]:
    args = ", ".join(rng.sample(["items", "limit", "key", "path", "timeout", "retries", "state", "cfg"],
                                rng.randint(1, 3)))
    body = [f"def {name}({args}):", f'    """{rng.choice(_VERBS).capitalize()} the {rng.choice(_NOUNS)}."""']
    for _ in range(rng.randint(6, 18)):
        a, b = rng.choice(_NOUNS), rng.choice(_NOUNS)
        body.append(rng.choice([
            f"    {a}_{rng.randint(0, 99)} = {b}.get({rng.randint(0, 999)!r}, {rng.choice(['None', '0', '[]'])})",
            f"    if {a} and len({b}) > {rng.randint(1, 64)}:",
            f"        return {rng.choice(_VERBS)}_{a}({b}, limit={rng.randint(1, 9)})",
            f"    for {a} in {b}s:",
            f"        {b}.append({rng.choice(_VERBS)}({a}))",
            f"    # {rng.choice(_VERBS)} the {a} before the {b} is {rng.choice(_VERBS)}ed",
        ]))
    body.append(f"    return {rng.choice(_NOUNS)}")
    return [*body, ""]


def _file(rng: random.Random, path: str, n_facts: int, target_chars: int) -> tuple[str, list[Fact]]:
    lines = [f'"""{path}: {rng.choice(_VERBS)} and {rng.choice(_VERBS)} {rng.choice(_NOUNS)}s."""', "",
             "import os", "import json", ""]
    facts: list[Fact] = []
    chunks: list[list[str]] = []
    used: set[str] = set()
    while sum(len(x) + 1 for c in chunks for x in c) < target_chars:
        name = f"{rng.choice(_VERBS)}_{rng.choice(_NOUNS)}"
        if name not in used:
            used.add(name)
            chunks.append(_function(rng, name))
    for _ in range(n_facts):
        if rng.random() < 0.5:
            key = f"{rng.choice(_NOUNS).upper()}_{rng.choice(_NOUNS).upper()}_{rng.randint(10, 99)}"
            value = f"{rng.getrandbits(40):010x}"
            line = f'{key} = "{value}"'
        else:
            key = f"{rng.choice(_VERBS)}_{rng.choice(_NOUNS)}_{rng.randint(10, 99)}"
            params = ", ".join(f"{rng.choice(_NOUNS)}_{i}: int = {rng.randint(1, 500)}"
                               for i in range(rng.randint(2, 3)))
            line = f"def {key}({params}) -> str:"
            value = line
        facts.append(Fact(key, value, line, path))
        at = rng.randint(0, len(chunks))  # anywhere in the file, not just the top
        chunks.insert(at, [line, "    return '" + key + "'", ""] if line.startswith("def ") else [line, ""])
    return "\n".join(lines + [x for c in chunks for x in c]), facts


def make_task(seed: int, *, files: int = 30, file_chars: tuple[int, int] = (6_000, 14_000),
              facts_per_file: int = 2, quote_gap: tuple[int, int] = (2, 12), quote_share: float = 0.5) -> Task:
    """A deterministic task: ``files`` files of ``file_chars`` characters; after each read, with
    probability ``quote_share`` a fact of a file read 2-12 steps earlier must be quoted."""
    rng = random.Random(seed)
    contents: dict[str, str] = {}
    facts: dict[str, Fact] = {}
    for k in range(files):
        path = f"src/{rng.choice(_NOUNS)}/{rng.choice(_VERBS)}_{k:02d}.py"
        text, fs = _file(rng, path, facts_per_file, rng.randint(*file_chars))
        contents[path] = text
        facts.update({f.key: f for f in fs})
    paths = list(contents)
    steps: list[tuple[str, str]] = []
    pending: list[tuple[int, str]] = []  # (due step, fact key)
    for k, path in enumerate(paths):
        steps.append(("read", path))
        for f in (x for x in facts.values() if x.path == path):
            if rng.random() < quote_share:
                pending.append((k + rng.randint(*quote_gap), f.key))
        for due, key in sorted(x for x in pending if x[0] <= k):
            steps.append(("quote", key))
            pending.remove((due, key))
    steps += [("quote", key) for _, key in sorted(pending)]
    return Task(f"task-{seed:03d}", contents, steps, facts)


@dataclass
class TaskScript:
    """The scripted model of one task (an emulator responder): it acts on what the request shows."""

    task: Task
    step: int = 0
    attempts: int = 0
    rereads: int = 0
    calls: int = 0
    failed: str | None = None

    def respond(self, body: dict[str, Any]) -> Reply:
        if self.failed or self.step >= len(self.task.steps):
            return Reply([{"type": "text", "text": f"FAILED: {self.failed}" if self.failed else "done"}])
        kind, arg = self.task.steps[self.step]
        self.attempts += 1
        self.calls += 1
        n = self.calls
        if kind == "read":
            self._next()
            return _call(n, "read_file", {"path": arg})
        fact = self.task.facts[arg]
        if fact.line in _text(body):
            self._next()
            return _call(n, "record", {"fact": fact.key, "value": fact.value})
        if self.attempts >= STEP_ATTEMPTS:
            self.failed = f"{fact.key} not found after {STEP_ATTEMPTS - 1} re-reads"
            return Reply([{"type": "text", "text": f"FAILED: {self.failed}"}])
        self.rereads += 1
        return _call(n, "read_file", {"path": fact.path})

    def _next(self) -> None:
        self.step += 1
        self.attempts = 0


def _call(n: int, name: str, args: dict[str, Any]) -> Reply:
    return Reply([{"type": "text", "text": f"Next: {name}."},
                  {"type": "tool_use", "id": f"toolu_task_{n:05d}", "name": name, "input": args}], "tool_use")


def _text(body: dict[str, Any]) -> str:
    from ._recall import request_text

    return request_text(body)


@dataclass
class TaskResult:
    task: str
    strategy: str
    window: int
    passed: bool
    turns: int
    quotes: int
    rereads: int
    cost_usd: float
    summary_cost_usd: float
    failure: str | None = None
    compactions: dict[str, int] = field(default_factory=dict)
    wall_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_task(task: Task, strategy: str, *, model: str = "claude-sonnet-4-6", window: int = 50_000) -> TaskResult:
    """Run one task under one strategy through the SDK and the emulator (a task has no pause, so
    ``name+idle`` runs as ``name``)."""
    name, strategy = strategy, check_strategy(strategy)
    t0 = time.perf_counter()
    script = TaskScript(task)
    res = TaskResult(task.name, name, window, False, 0, task.quotes, 0, 0.0, 0.0)
    with Emulator(SummarizingResponder(script), context_window=window) as emu:
        raw = anthropic.Anthropic(base_url=emu.url, api_key="bench", max_retries=0)
        mw = CompactionMiddleware(None, strategy=strategy, window_tokens=window,
                                  summarizer=summarizer_factory(raw, None))
        client = raw.with_middleware(mw)
        history: list[dict[str, Any]] = [{"role": "user", "content": f"{task.name}: audit the project as instructed, "
                                                                     "file by file."}]
        clock = 1_700_000_000.0
        cap = len(task.steps) * STEP_ATTEMPTS + 2
        try:
            while res.turns < cap:
                res.turns += 1
                clock += 20.0
                kw: dict[str, Any] = {"model": model, "max_tokens": MAX_TOKENS, "system": SYSTEM, "tools": TOOLS,
                                      "messages": history, "extra_headers": {CLOCK_HEADER: repr(clock)}}
                reply = client.messages.create(**kw)
                content = [b.model_dump(exclude_none=True) for b in reply.content]
                history.append({"role": "assistant", "content": content})
                calls = [b for b in content if b.get("type") == "tool_use"]
                if not calls:
                    break
                history.append({"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": c["id"],
                     "content": task.files.get(c["input"].get("path", ""), "no such file")
                     if c["name"] == "read_file" else "recorded"} for c in calls]})
        except anthropic.BadRequestError as err:
            res.failure = f"turn {res.turns}: API 400: {api_message(err)}"
        except ContextFullError as err:
            res.failure = f"turn {res.turns}: context full: {err}"[:MAX_REASON]
        log = list(emu.requests)
    res.passed = res.failure is None and script.failed is None and script.step >= len(task.steps)
    if res.failure is None and script.failed is not None:
        res.failure = script.failed
    res.rereads = script.rereads
    ok = [r for r in log if r.get("status") == 200]
    res.summary_cost_usd = sum(r["cost_usd"] for r in ok if r.get("internal"))
    res.cost_usd = sum(r["cost_usd"] for r in ok)
    for ev in mw.events.history:
        if ev.kind in ("compaction", "externalized") and ev.level:
            res.compactions[ev.level] = res.compactions.get(ev.level, 0) + 1
    res.wall_s = time.perf_counter() - t0
    return res
