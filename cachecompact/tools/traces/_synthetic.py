"""Deterministic synthetic coding-agent sessions: the embedded default when no traces exist.

The shape follows the shared corpus (43 sessions, measured by ``benchmarks/trace_stats.py``):
one task message, then turns of (assistant text + tool call, tool result). Fitted values:

* turns per session: log-normal around the corpus median of 78 (corpus range 10-248);
* tool-result size: log-normal, median 361 characters, log standard deviation 1.65 (p90 2.2k,
  p99 10.6k characters);
* gaps between messages: median 2 s; 0.43% of gaps are idle periods over 5 minutes (median
  idle 30 minutes), so caches expire now and then as they do in real sessions.

Identifiers (paths, symbols, line numbers) recur across turns, so reference-recall metrics
have something to find.
"""

from __future__ import annotations

import math
import random
from typing import Any

from ._mini_swe import BASH_TOOL
from .trace_model import Trace

__all__ = ["SyntheticSpec", "synthetic_trace"]

_WORDS = ("config", "parser", "handler", "session", "cache", "render", "ledger", "token", "policy", "store",
          "client", "request", "stream", "window", "summary", "budget", "record", "index", "buffer", "plan")
_TOOLS = [
    BASH_TOOL,
    {"name": "read_file", "description": "Read a file from the repository.",
     "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}},
    {"name": "grep", "description": "Search the repository with a regular expression.",
     "input_schema": {"type": "object", "properties": {"pattern": {"type": "string"}, "path": {"type": "string"}},
                      "required": ["pattern"]}},
    {"name": "edit_file", "description": "Replace text in a file.",
     "input_schema": {"type": "object", "properties": {"path": {"type": "string"}, "old": {"type": "string"},
                                                        "new": {"type": "string"}},
                      "required": ["path", "old", "new"]}},
]


class SyntheticSpec:
    """Knobs of the generator; defaults are fitted to the shared corpus (see docs/benchmarks.md)."""

    def __init__(self, turns: int | None = None, median_result_chars: int = 361, sigma: float = 1.65,
                 idle_prob: float = 0.0086, idle_minutes: tuple[float, float] = (10.0, 50.0),
                 median_turns: int = 78) -> None:
        self.turns = turns
        self.median_turns = median_turns
        self.median_result_chars = median_result_chars
        self.sigma = sigma
        self.idle_prob = idle_prob
        self.idle_minutes = idle_minutes


def _code(rng: random.Random, path: str, chars: int, symbols: list[str]) -> str:
    lines: list[str] = []
    total = 0
    n = 1
    while total < chars:
        sym = rng.choice(symbols)
        kind = rng.random()
        if kind < 0.15:
            line = f"def {sym}_{rng.choice(_WORDS)}(self, {rng.choice(_WORDS)}_id: int) -> dict:"
        elif kind < 0.3:
            line = f"    # {path}:{n} handles {rng.choice(_WORDS)} for {sym}"
        else:
            line = (f"    {rng.choice(_WORDS)} = self.{sym}.{rng.choice(_WORDS)}"
                    f"({rng.choice(_WORDS)}={rng.randint(0, 9999)})")
        lines.append(f"{n:5d}  {line}")
        total += len(line) + 7
        n += 1
    return "\n".join(lines)


def synthetic_trace(seed: int = 0, spec: SyntheticSpec | None = None, start_time: float = 1_767_225_600.0) -> Trace:
    """One reproducible session: the same seed and spec always give the same trace."""
    spec = spec or SyntheticSpec()
    rng = random.Random(seed)
    files = [f"src/{rng.choice(_WORDS)}/{rng.choice(_WORDS)}_{i}.py" for i in range(24)]
    symbols = [f"{rng.choice(_WORDS)}_{rng.choice(_WORDS)}" for _ in range(40)]
    target = rng.choice(files)
    task = (f"Fix the failing test tests/test_{rng.choice(_WORDS)}.py::test_{symbols[0]}: "
            f"`{symbols[0]}` in {target} returns stale data after a reload. Keep the public API unchanged "
            "and do not edit the tests.")
    messages: list[dict[str, Any]] = [{"role": "user", "content": task}]
    t = start_time
    times: list[float | None] = [t]
    n_turns = spec.turns if spec.turns is not None else int(
        min(250, max(10, spec.median_turns * math.exp(rng.gauss(0.0, 0.6)))))
    for k in range(n_turns):
        t += rng.expovariate(1 / 3.0)
        if rng.random() < spec.idle_prob:
            t += 60.0 * rng.uniform(*spec.idle_minutes)
        path = rng.choice(files[:8]) if rng.random() < 0.6 else rng.choice(files)
        tool = rng.choices(["bash", "read_file", "grep", "edit_file"], weights=[4, 4, 2, 1])[0]
        if tool == "read_file":
            args: dict[str, Any] = {"path": path}
        elif tool == "grep":
            args = {"pattern": rng.choice(symbols), "path": "src/"}
        elif tool == "edit_file":
            args = {"path": path, "old": f"{rng.choice(symbols)}(", "new": f"{rng.choice(symbols)}_v2("}
        else:
            args = {"command": rng.choice([f"python -m pytest -x -q tests/ -k {rng.choice(symbols)}",
                                           f"git diff {path}", f"sed -n '{rng.randint(1, 400)},+40p' {path}",
                                           f"ls -la {path.rsplit('/', 1)[0]}"])}
        tid = f"toolu_{seed:04d}_{k:05d}"
        messages.append({"role": "assistant", "content": [
            {"type": "text", "text": f"Step {k + 1}: checking {path} for `{rng.choice(symbols)}`."},
            {"type": "tool_use", "id": tid, "name": tool, "input": args}]})
        times.append(t)
        size = int(spec.median_result_chars * math.exp(rng.gauss(0.0, spec.sigma)))
        size = max(40, min(size, 120_000))
        body = ("File written." if tool == "edit_file" else _code(rng, path, size, symbols))
        t += rng.expovariate(1 / 2.0)
        messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": tid, "content": body}]})
        times.append(t)
    return Trace(name=f"synthetic-{seed:04d}", source=f"synthetic:{seed}", format="synthetic",
                 system="You are a careful software engineer working in a git repository. Use the tools to "
                        "inspect and change code; run the tests before you finish.",
                 tools=_TOOLS, messages=messages, timestamps=times, usage=[None] * len(messages),
                 model="claude-sonnet-4-6")
