"""How long a request waits for a summary call, before and after issue 62's item 9, in one run.

An agent reads a file a turn through ``wrap()`` and the real SDK; its requests go to one
emulator, and its summary calls (ours, or the API's on-demand compaction) to a second that
answers each ``--delay`` seconds late (the emulator's own injected delay), the range the issue
measured through the compact proxy (150-560 ms). Each of the agent's requests takes
``--response-seconds`` upstream (the model answering), and between turns it "runs its tools" for
``--tool-seconds``. Each configuration runs twice, alternating: ``before``
(``LevelSettings(background_summaries=False)``: our summaries in the foreground, the API's
swapped in by the next request, which waits) and ``after`` (the default). For each request: its wall time
in ``messages.create``, and the part of it cachecompact spent before and after the call
(`CompactionEngine.overhead_s`: preparing the request, where it waits for a summary call, and
recording it); a request *carries a compaction* when it decided an L3/L4 summary or applied one.

    python benchmarks/summary_wait.py [--delay 0.3] [--response-seconds 0.3] [--tool-seconds 0.1]
        [--write docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import anthropic

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import cachecompact  # noqa: E402
from cachecompact.adapters.middleware import _middleware_of  # noqa: E402
from cachecompact.compaction.policy import LevelSettings, PolicyConfig  # noqa: E402
from cachecompact.compaction.summarize.llm import LLMSummarizer  # noqa: E402
from cachecompact.tools.bench.bench_report import publish  # noqa: E402
from cachecompact.tools.emulator import Emulator, FaultConfig, ScriptedResponder, SummarizingResponder  # noqa: E402
from cachecompact.tools.emulator.responders import Reply  # noqa: E402

TOOLS = [{"name": "read", "description": "Read a file.",
          "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}]
WRITERS = {"ours": "claude-haiku-4-5", "API": "claude-sonnet-4-6"}  # off / on the on-demand list
# (window, lines of each tool result): a small window, where a collapse comes one turn before
# critical, and the default one, where it comes long before
SETTINGS = [(40_000, 120), (200_000, 400)]


def _reader() -> ScriptedResponder:
    n = itertools.count(1)

    def answer(body: dict[str, Any]) -> Reply:
        k = next(n)
        return Reply([{"type": "tool_use", "id": f"toolu_{k:05d}", "name": "read", "input": {"path": f"m{k}.py"}}],
                     "tool_use")
    return ScriptedResponder(answer)


def run(model: str, window: int, lines: int, turns: int, delay: float, tool_s: float, response_s: float,
        background: bool) -> dict[str, Any]:
    """One agent run; every request's wall time, and which carried a compaction."""
    turn = [0]
    carried: set[int] = set()
    waits: list[float] = []  # each request's wait for a summary call, where one waited

    def on_event(e: Any) -> None:
        if e.level in ("L3", "L4") and e.kind in ("compaction", "compaction_requested"):
            carried.add(turn[0])
        if e.level in ("L3", "L4") and e.kind == "compaction":
            # a summary made in the foreground: the call is its duration; one landed: its own count
            d = e.detail or {}
            w = d.get("waited_s", e.duration_s if d.get("writer") != "api" else 0.0)
            if w >= 0.001:
                waits.append(w)

    slow_agent = FaultConfig(slow_rate=1.0, slow_seconds=response_s) if response_s > 0 else None
    with Emulator(SummarizingResponder(_reader()), faults=slow_agent) as emu, \
            Emulator(SummarizingResponder(), faults=FaultConfig(slow_rate=1.0, slow_seconds=delay)) as slow:
        slow.core._secret = emu.core._secret  # one API behind both: the agent's reads the blocks the slow one signs
        summarizer = LLMSummarizer(anthropic.Anthropic(base_url=slow.url, api_key="t", max_retries=0),
                                   model=WRITERS["ours"], mode="forced-tool")
        client: Any = cachecompact.wrap(anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0), store=None,
                                   window_tokens=window, summarizer=summarizer, on_event=on_event,
                                   config=PolicyConfig(levels=LevelSettings(background_summaries=background)))
        engine = _middleware_of(client).engine
        msgs: list[dict[str, Any]] = [{"role": "user", "content": "Audit the project."}]
        seconds: list[float] = []
        ours: list[float] = []
        for k in range(turns):
            turn[0] = k
            t0, o0 = time.perf_counter(), engine.overhead_s
            r = client.messages.create(model=model, max_tokens=2000, system="You audit code. " * 100, tools=TOOLS,
                                       messages=msgs)
            seconds.append(time.perf_counter() - t0)
            ours.append(engine.overhead_s - o0)
            content = [b.model_dump(exclude_none=True) for b in r.content]
            use = next(b for b in content if b["type"] == "tool_use")
            body = f"# {use['input']['path']}\n" + "".join(f"v{k}_{i} = f({i})\n" for i in range(lines))
            msgs += [{"role": "assistant", "content": content},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"], "content": body}]}]
            time.sleep(tool_s)
        refused = len(emu.core.refusals)
    return {"seconds": seconds, "ours": ours, "carried": sorted(carried), "refused": refused, "waits": waits}


def _ms(x: float) -> str:
    return f"{x * 1000:.0f} ms"


def _row(label: str, res: dict[str, Any]) -> str:
    o, s = res["ours"], res["seconds"]
    c = [o[k] for k in res["carried"]]
    rest = [o[k] for k in range(len(o)) if k not in res["carried"]]
    w = res["waits"]
    return (f"| {label} | {len(c)} | {len(w)}, {_ms(sum(w))} | {_ms(statistics.median(c)) if c else '-'} | "
            f"{_ms(max(c)) if c else '-'} | {_ms(statistics.median(rest))} | {_ms(sum(o))} | {_ms(sum(s))} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--delay", type=float, default=0.3, help="seconds each summary call takes")
    ap.add_argument("--tool-seconds", type=float, default=0.1, help="seconds the agent's tools take each turn")
    ap.add_argument("--response-seconds", type=float, default=0.3, help="seconds each of the agent's requests takes")
    ap.add_argument("--turns", type=int, default=80)
    ap.add_argument("--write", help="put the table in this markdown file's summary_wait section")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    lines = [f"Measured {time.strftime('%Y-%m-%d')} on {len(__import__('os').sched_getaffinity(0))} cores, one run, "
             f"before and after alternating (`python benchmarks/summary_wait.py --delay {args.delay} "
             f"--tool-seconds {args.tool_seconds} --response-seconds {args.response_seconds} --turns {args.turns}`): "
             f"each summary call takes {_ms(args.delay)}, each of the agent's requests {_ms(args.response_seconds)} "
             f"upstream, its tools {_ms(args.tool_seconds)} a turn.", "",
             "Times are cachecompact's own part of each request (preparing and recording it, a wait for a "
             "summary call included); the last column is the whole of every request (the emulator's answer too).",
             "",
             "| writer, window, code | requests carrying a compaction | of them waited for a call: how many, "
             "how long | their time: median | max | other requests: median | cachecompact, all requests | "
             "wall, all requests |",
             "|---|---|---|---|---|---|---|---|"]
    refused = 0
    for writer, model in WRITERS.items():
        for window, n in SETTINGS:
            for background in (False, True):
                res = run(model, window, n, args.turns, args.delay, args.tool_seconds, args.response_seconds,
                          background)
                refused += res["refused"]
                lines.append(_row(f"{writer}, {window // 1000}k, {'after' if background else 'before'}", res))
    lines += ["", f"Thinking refusals by the emulator: {refused}. ({time.perf_counter() - t0:.0f} s.)"]
    return publish("\n".join(lines), args.write, "summary_wait")


if __name__ == "__main__":
    raise SystemExit(main())
