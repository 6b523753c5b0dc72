"""An ordinary agent loop, wrapped with cachecompact in one line, replaying a real session.

The "model" is the local emulator answering with the recorded assistant messages of a trace
(the first Claude Code session in ../shared/traces, or a synthetic one), and the "tools" are
the recorded tool results. The loop itself is what an agent does against the real API: send
the full history, append the reply, run the tools, repeat.

    python examples/replay_agent.py [TRACE_FILE] [--window 60000]

It prints the cache report of the session at the end.
"""

from __future__ import annotations

import argparse
import sys
import tempfile

import anthropic

import cachecompact
from cachecompact.tools.emulator import CLOCK_HEADER, Emulator, ReplayResponder, SummarizingResponder
from cachecompact.tools.session_report import session_report
from cachecompact.tools.traces import default_trace_dir, discover, load_trace, synthetic_trace


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", nargs="?", help="trace file (default: first shared Claude Code session)")
    ap.add_argument("--window", type=int, default=200_000, help="context window the policy assumes")
    ap.add_argument("--model", default="claude-sonnet-4-6")
    args = ap.parse_args()
    if args.trace:
        trace = load_trace(args.trace)
    else:
        tdir = default_trace_dir()
        files = discover([tdir / "claude-code"]) if tdir else []
        trace = load_trace(files[0]) if files else synthetic_trace(0)
    emulator = Emulator(SummarizingResponder(ReplayResponder(trace.messages)))
    with tempfile.TemporaryDirectory(prefix="cachecompact-example-") as store, emulator as emu:
        raw = anthropic.Anthropic(base_url=emu.url, api_key="not-needed-for-the-emulator")
        client = cachecompact.wrap(raw, store=store, window_tokens=args.window)  # <- the one line

        history = [trace.messages[0]]
        i = 1
        while i < len(trace.messages):
            reply = client.messages.create(
                model=args.model, max_tokens=4096, system=trace.system or anthropic.omit,
                tools=trace.tools or anthropic.omit, messages=history,
                extra_headers={CLOCK_HEADER: str(trace.timestamps[i - 1] or i)},  # the recorded time
            )
            history.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]})
            i += 1
            if i < len(trace.messages):  # "run the tools": the recorded results
                history.append(trace.messages[i])
                i += 1
        (session,) = cachecompact.wrapped_sessions(client)
        print(f"replayed {trace.name}: {trace.turns} model calls through a wrapped client\n")
        print(session_report(session))
    return 0


if __name__ == "__main__":
    sys.exit(main())
