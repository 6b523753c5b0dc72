"""The ``cachecompact`` command line."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .errors import CacheCompactError, LedgerCorruptError, MalformedMessageError, StoreError
from .ledger import ReplaceWithSummary, SkipRange, widen_to_pairs
from .session import DEFAULT_MAX_TOKENS, DEFAULT_MODEL, Session
from .validate import validate_request

__all__ = ["main"]


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    fmt = "  ".join(f"{{:{'>' if i < 2 else '<'}{w}}}" for i, w in enumerate(widths))
    lines = [fmt.format(*header), fmt.format(*("-" * w for w in widths))]
    lines += [fmt.format(*map(str, r)) for r in rows]
    return "\n".join(lines)


def ledger_table(sess: Session) -> str:
    rows = [[str(e.seq), e.level, e.kind, f"{e.start}..{e.end}", f"{e.tokens_before}->{e.tokens_after}",
             str(e.transcript_len), e.created_at[:19], (e.reason or "")[:60]] for e in sess.ledger.entries]
    return _table(rows, ["seq", "level", "kind", "range", "tokens", "at_len", "created", "reason"])


def cmd_ledger_show(args: argparse.Namespace) -> int:
    sess = Session.open(args.dir)
    if not sess.ledger.entries:
        print(f"{args.dir}: no ledger entries ({len(sess)} transcript messages)")
        return 0
    print(ledger_table(sess))
    return 0


def cmd_ledger_verify(args: argparse.Namespace) -> int:
    """Exit 0 when hashes, the chain and the replay of every entry are valid."""
    try:
        sess = Session.open(args.dir)
    except LedgerCorruptError as err:
        print(f"INVALID {err}", file=sys.stderr)
        return 1
    for torn in sess.torn:
        print(f"warning: {torn}", file=sys.stderr)
    ledger_path = Path(args.dir) / "ledger.jsonl"
    for e in sess.ledger.entries:
        try:
            validate_request(sess.render(at_entry=e.seq).body)
        except MalformedMessageError as err:
            print(f"INVALID {ledger_path}:{e.seq + 1}: entry #{e.seq} renders an invalid request: {err}",
                  file=sys.stderr)
            return 1
    print(f"ok: {len(sess)} messages, {len(sess.ledger)} ledger entries, chain head {sess.ledger.head_hash[:16]}, "
          f"prefix {sess.prefix_hash}")
    return 0


def cmd_render(args: argparse.Namespace) -> int:
    sess = Session.open(args.dir)
    result = sess.render(model=args.model, max_tokens=args.max_tokens, at_entry=args.at_entry)
    if args.pretty:
        print(json.dumps(result.body, indent=2, ensure_ascii=False))
    else:
        sys.stdout.buffer.write(result.to_json() + b"\n")
    print(f"# {result.tokens} estimated tokens, {result.n_blocks} blocks, breakpoints at {result.breakpoints}, "
          f"prefix {result.prefix_hash}", file=sys.stderr)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """Build a session from a real trace (or a synthetic one), add two edits, show the effect."""
    from .traces import default_trace_dir, discover, load_trace, synthetic_trace

    if args.trace:
        trace = load_trace(args.trace)
    else:
        tdir = default_trace_dir()
        files = discover([tdir / "claude-code"]) if tdir and (tdir / "claude-code").is_dir() else []
        trace = load_trace(files[0]) if files else synthetic_trace(0)
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="cachecompact-demo-")) / "session"
    sess = Session.create(out, system=trace.system, tools=trace.tools)
    sess.sync(trace.messages)
    before = sess.render()
    print(f"trace {trace.name} ({trace.format}): {len(sess)} messages, ~{before.tokens} tokens, "
          f"prefix ends at message {sess.prefix_end}, prefix hash {sess.prefix_hash}")
    pe = sess.prefix_end or 0
    results = [i for i in range(pe, len(sess)) if sess.transcript.is_tool_result_message(i)]
    if len(results) > 6:
        # clear one old tool result in place, then summarise an older stretch that contains it
        sess.edit(SkipRange(results[2], results[2], "demo: old tool output"), level="L1")
        span = widen_to_pairs(sess.transcript, pe, results[len(results) // 3])
        if span:
            sess.edit(ReplaceWithSummary(span[0], span[1], f"Demo summary of messages {span[0]}-{span[1]}.",
                                         "demo: collapse early exploration"), level="L3")
    after = sess.render()
    print(f"after {len(sess.ledger)} edit(s): ~{after.tokens} tokens "
          f"({100 * (1 - after.tokens / max(before.tokens, 1)):.0f}% smaller)")
    div = after.first_divergence(before)
    print(f"cache: {div}" if div else "cache: no divergence")
    print(ledger_table(sess))
    print(f"\nsession stored in {out}\n  cachecompact ledger verify {out}\n  cachecompact render {out} --pretty")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the emulator until interrupted."""
    from .emulator import Emulator, FaultConfig, ReplayResponder, ScriptedResponder, SummarizingResponder
    from .traces import load_trace

    inner = ReplayResponder(load_trace(args.trace).messages) if args.trace else ScriptedResponder()
    faults = FaultConfig(rate=args.fault_rate, seed=args.seed, slow_rate=args.slow_rate)
    emu = Emulator(SummarizingResponder(inner), faults=faults, log=args.log, host=args.host, port=args.port)
    print(f"cachecompact emulator listening on {emu.url}  (anthropic.Anthropic(base_url={emu.url!r}, "
          f"api_key='test'); Ctrl-C to stop", flush=True)
    try:
        emu.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        emu.stop()
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """Per-session cache report: hit rate over time, breaks and causes, cost, compactions."""
    from .monitor import session_report

    print(session_report(args.dir, plot=args.plot))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    """Replay traces under every strategy; print a table; write results, report and plots."""
    import logging
    import shlex

    from .bench.report import LONG_TURNS, text_table, write_outputs
    from .bench.run import run_bench

    logging.getLogger("cachecompact").setLevel(logging.ERROR)  # per-request warnings would drown the table
    res = run_bench(args.paths, args.strategy, model=args.model, window=args.window, workers=args.workers,
                    progress=not args.json, synthetic=args.synthetic)
    command = "cachecompact " + " ".join(shlex.quote(a) for a in (args.argv or []))
    files = write_outputs(res, Path(args.out), command)
    if args.json:
        print((Path(args.out) / "results.json").read_text())
        return 0
    print(f"\n{res.corpus}: {len(res.traces)} traces, model {res.model}, window {res.window:,}, "
          f"{res.wall_s:.0f} s")
    for s in res.skipped:
        print(f"skipped {s['file']}: {s['reason']}")
    print(f"\nlong traces (>= {LONG_TURNS} turns):\n{text_table(res, long_only=True)}")
    print(f"\nall traces:\n{text_table(res)}")
    print("\nwrote " + ", ".join(str(f) for f in files))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cachecompact", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    led = sub.add_parser("ledger", help="inspect a session's ledger")
    lsub = led.add_subparsers(dest="ledger_command", required=True)
    show = lsub.add_parser("show", help="print a table of the edits")
    show.add_argument("dir")
    show.set_defaults(func=cmd_ledger_show)
    ver = lsub.add_parser("verify", help="check hashes, the chain and the replay; exit 1 on the first bad line")
    ver.add_argument("dir")
    ver.set_defaults(func=cmd_ledger_verify)
    ren = sub.add_parser("render", help="print the request body (as it was after ledger entry K)")
    ren.add_argument("dir")
    ren.add_argument("--at-entry", type=int, default=None, metavar="K")
    ren.add_argument("--model", default=DEFAULT_MODEL)
    ren.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS)
    ren.add_argument("--pretty", action="store_true", help="indent instead of the exact canonical bytes")
    ren.set_defaults(func=cmd_render)
    srv = sub.add_parser("serve", help="run the local Messages API emulator")
    srv.add_argument("--host", default="127.0.0.1")
    srv.add_argument("--port", type=int, default=8765)
    srv.add_argument("--trace", help="replay the assistant messages of this trace file")
    srv.add_argument("--fault-rate", type=float, default=0.0, help="share of requests answered 429/529/500")
    srv.add_argument("--slow-rate", type=float, default=0.0, help="share of requests delayed")
    srv.add_argument("--seed", type=int, default=0)
    srv.add_argument("--log", help="append one JSON line per request here")
    srv.set_defaults(func=cmd_serve)
    bench = sub.add_parser("bench", help="replay traces under each strategy and compare cost, hits and recall")
    bench.add_argument("paths", nargs="*", help="trace files or folders (default: ../shared/traces, else synthetic)")
    bench.add_argument("--strategy", action="append", help="strategy to run (repeatable; default: all)")
    bench.add_argument("--model", default="claude-sonnet-4-6", help="prices of this model")
    bench.add_argument("--window", type=int, default=200_000, help="context window in tokens")
    bench.add_argument("--out", default="bench-out", help="folder for results.json, report.md and plots")
    bench.add_argument("--workers", type=int, default=None, help="processes (default: up to 2)")
    bench.add_argument("--json", action="store_true", help="print results.json instead of the table")
    bench.add_argument("--synthetic", type=int, metavar="N", help="run N synthetic traces instead of files")
    bench.set_defaults(func=cmd_bench)
    rep = sub.add_parser("report", help="cache health report of a session directory")
    rep.add_argument("dir")
    rep.add_argument("--plot", metavar="PNG", help="also write a plot (needs the [plot] extra)")
    rep.set_defaults(func=cmd_report)
    demo = sub.add_parser("demo", help="build a session from a trace and show a render and its ledger")
    demo.add_argument("--trace", help="a trace file (default: the first shared Claude Code trace, else synthetic)")
    demo.add_argument("--out", help="session directory to create (default: a temporary one)")
    demo.set_defaults(func=cmd_demo)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(argv) if argv is not None else sys.argv[1:]
    try:
        rc: Any = args.func(args)
    except (StoreError, CacheCompactError, IndexError, RuntimeError, KeyError) as err:
        print(f"cachecompact: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # pragma: no cover - e.g. `| head`
        return 0
    return int(rc)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
