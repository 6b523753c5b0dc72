"""The ``cachecompact`` command line.

Every command checks its arguments before it starts work; every error is one line on stderr
(``cachecompact: error: ...``, exit 2) unless ``--debug`` asks for the traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

# Nothing heavy at import: `cachecompact --help` and argument errors answer before the SDK and
# the engine load; each command imports what it uses.
if TYPE_CHECKING:
    from ..engine.options import EngineOptions
    from ..history.session import Session

DEFAULT_STORE = ".cachecompact/sessions"  # wrap()'s default store
DEFAULT_MODEL = "claude-sonnet-4-6"  # the same as session.DEFAULT_MODEL (a test keeps them equal)
DEFAULT_MAX_TOKENS = 4096

__all__ = ["main"]


class UsageError(Exception):
    """A bad command line: reported in one line, exit 2."""


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    fmt = "  ".join(f"{{:{'>' if i < 2 else '<'}{w}}}" for i, w in enumerate(widths))
    lines = [fmt.format(*header), fmt.format(*("-" * w for w in widths))]
    lines += [fmt.format(*map(str, r)) for r in rows]
    return "\n".join(lines)


def ledger_table(sess: Session) -> str:
    from ._terminal import shorten

    rows = [[str(e.seq), e.level, e.kind, f"{e.start}..{e.end}", f"{e.tokens_before}->{e.tokens_after}",
             str(e.transcript_len), e.created_at[:19], shorten(e.reason or "", 60)] for e in sess.ledger.entries]
    return _table(rows, ["seq", "level", "kind", "range", "tokens", "at_len", "created", "reason"])


def _open(args: argparse.Namespace, *, readonly: bool = True, verify: bool = True) -> Session:
    """The session named on the command line: a directory, or an id in ``--store``; checked as
    `ledger verify` checks it unless ``verify`` is False (`Session.open`)."""
    from ..history.session import Session

    if getattr(args, "store", None):
        from ..store import open_store

        return Session.open(open_store(args.store), args.target, readonly=readonly, verify=verify)
    target = _session_dir(args)
    default = Path(DEFAULT_STORE) / args.target
    if not target.exists():
        from ..base.errors import SessionNotFoundError

        where = [f"{target.absolute()} (a session folder)"]
        if "/" not in args.target:
            where.append(f"{default.absolute()} (wrap()'s default store)")
        near = []
        if Path(DEFAULT_STORE).is_dir():
            import difflib

            near = difflib.get_close_matches(args.target, [p.name for p in Path(DEFAULT_STORE).iterdir()], n=3)
        raise SessionNotFoundError(f"no session {args.target!r}: looked in {' and '.join(where)}"
                                   + (f"; similar ids there: {', '.join(near)}" if near else "")
                                   + "; for another store give --store DIR_OR_URL")
    return Session.open(target, readonly=readonly, verify=verify)


def _session_dir(args: argparse.Namespace) -> Path:
    """The folder SESSION names: the path given, or a bare id in wrap()'s default store."""
    name = str(args.target)
    target, default = Path(name), Path(DEFAULT_STORE) / name
    return default if not target.exists() and "/" not in name and default.is_dir() else target


def _observed(args: argparse.Namespace) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
    """The named session's observation records when the proxy kept it in observe mode (no
    transcript or ledger: `observed_report`); None for any other session, or none found (then
    `_open` says what it looked for)."""
    from ..base.errors import CacheCompactError
    from ..store import open_store
    from .observed_report import observed_session

    if getattr(args, "store", None):
        root, sid = open_store(args.store), args.target
    else:
        target = _session_dir(args)
        if not (target / "session.json").is_file():
            return None
        root, sid = open_store(target.absolute().parent), target.name
    if not root.exists(sid):
        return None
    try:
        return observed_session(root.open(sid))
    except (CacheCompactError, OSError):  # unreadable as either kind: `_open` and its verdict say why
        return None


def cmd_ledger_show(args: argparse.Namespace) -> int:
    sess = _open(args)
    if not sess.ledger.entries:
        print(f"{args.target}: no ledger entries ({len(sess)} transcript messages)")
        return 0
    print(ledger_table(sess))
    return 0


def cmd_ledger_verify(args: argparse.Namespace) -> int:
    """Exit 0 when every chain, the prefix and the replay of every entry are valid; 1 when one is
    not; 3 (UNCONFIRMED, head still printed) when all are but a summary (ours or the API's) is one
    no request record commits to (`Session.unconfirmed`), which no process renders. Never writes,
    unless ``--repair`` sets a torn tail aside."""
    from ..base.errors import (
        ImmutablePrefixError,
        LedgerCorruptError,
        SessionLockedError,
        SessionNotFoundError,
        StoreError,
    )
    from .observed_report import observed_problems

    seen = _observed(args)
    if seen is not None:  # observe mode keeps no ledger: check its records, never call the absence tampering
        problems = observed_problems(*seen)
        for problem in problems:
            print(f"INVALID {args.target}: {problem}", file=sys.stderr)
        if not problems:
            print(f"ok: observe-mode session, {len(seen[1])} observation records (no transcript or ledger to "
                  "verify: the proxy forwarded every request untouched, and these records are not hash-chained)")
        return 1 if problems else 0
    try:
        sess = _open(args, readonly=True, verify=False)  # its problems are printed one by one below
    except (SessionNotFoundError, SessionLockedError):
        raise  # not a verdict on the session: exit 2 with the message
    except (LedgerCorruptError, ImmutablePrefixError, StoreError) as err:
        print(f"INVALID {err}", file=sys.stderr)
        if args.repair:
            print("--repair mends only a torn last line of a log (a crash mid-append), which it sets aside; it "
                  "cannot mend a changed, removed or reordered record, which is what this is", file=sys.stderr)
        return 1
    for torn in sess.torn:
        if args.repair and sess.store is not None:
            with sess.store.lock():
                sess.store.repair(torn.log)  # type: ignore[arg-type]
            print(f"repaired: {torn} (set aside)", file=sys.stderr)
        else:
            print(f"warning: {torn}; `--repair` sets it aside", file=sys.stderr)
    if sess.meta_torn is not None:
        if args.repair and sess.store is not None:
            with sess.store.lock():
                sess.repair_meta()
            print("repaired: the prefix fields of session.json were written from the transcript", file=sys.stderr)
        else:
            print(f"warning: {sess.meta_torn}; `--repair` writes them", file=sys.stderr)
    problems = sess.problems()  # the checks Session.open makes before anything is rendered (one function)
    if problems:
        for problem in problems:
            print(f"INVALID {problem}", file=sys.stderr)
        return 1
    if args.head and not sess.extends(args.head):
        print(f"INVALID {sess.store.location if sess.store else args.target}: the stored state does not extend "
              f"head {args.head} (entries it covered were changed, removed or rolled back)", file=sys.stderr)
        return 1
    covered = sess.confirmed_entries
    unconfirmed = sess.unconfirmed()
    if unconfirmed:  # a verdict of its own: not INVALID (it may be genuine), never ok (it may be forged)
        where = sess.store.where("ledger") if sess.store is not None else args.target
        for k in unconfirmed:
            kind = sess.ledger.entries[k].kind
            what = "an API-written summary" if kind == "compaction" else "cachecompact's summary"
            print(f"UNCONFIRMED {where}:{k + 1}: entry #{k} is {what} ({kind}) that no request record commits to "
                  f"(the records commit to {covered} entries): a forged append looks the same, so no process renders "
                  "it (docs/ledger-format.md, *Unconfirmed entries*)", file=sys.stderr)
        print(f"unconfirmed: {len(sess)} messages, {len(sess.ledger)} ledger entries, prefix {sess.prefix_hash}\n"
              f"head {sess.head}")
        return 3
    if not args.head and len(sess.ledger) > covered:
        print(f"note: ledger entries #{covered}..#{len(sess.ledger) - 1} were made after the newest request record "
              "and no record commits to them: the chains cannot tell them from entries appended by someone who can "
              "write the store; only --head HEAD can (docs/ledger-format.md, *What the chains prove*)",
              file=sys.stderr)
    print(f"ok: {len(sess)} messages, {len(sess.ledger)} ledger entries, prefix {sess.prefix_hash}\n"
          f"head {sess.head}")
    return 0


def cmd_render(args: argparse.Namespace) -> int:
    sess = _open(args)
    if args.at_entry is not None and not 0 <= args.at_entry < len(sess.ledger):
        raise UsageError(f"--at-entry {args.at_entry}: the session has ledger entries 0..{len(sess.ledger) - 1}"
                         if sess.ledger.entries else f"--at-entry {args.at_entry}: the session has no ledger entries")
    if args.at_entry is not None and args.uncompacted:
        raise UsageError("--at-entry and --uncompacted exclude each other")
    result = sess.render(model=args.model, max_tokens=args.max_tokens, at_entry=args.at_entry,
                         uncompacted=args.uncompacted)
    if args.pretty:
        print(json.dumps(result.body, indent=2, ensure_ascii=False))
    else:
        sys.stdout.buffer.write(result.to_json() + b"\n")
    print(f"# {result.tokens} estimated tokens, {result.n_blocks} blocks, breakpoints at {result.breakpoints}, "
          f"prefix {result.prefix_hash}", file=sys.stderr)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """Build a session from a real trace (or a synthetic one), add two edits, show the effect."""
    from ..history.ledger import ReplaceWithSummary, SkipRange, widen_to_pairs
    from ..history.session import Session
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
    after = sess.render(model=DEFAULT_MODEL, max_tokens=256)
    print(f"after {len(sess.ledger)} edit(s): ~{after.tokens} tokens "
          f"({100 * (1 - after.tokens / max(before.tokens, 1)):.0f}% smaller)")
    div = after.first_divergence(before)
    print(f"cache: {div}" if div else "cache: no divergence")
    # the compacted request goes to the local emulator, as a request would go to the API, and its
    # record commits the session to the edits it carried: a summary no request record commits to
    # is unconfirmed, and no other process renders it (docs/ledger-format.md, *Unconfirmed entries*)
    sent = _demo_send(after.body)
    sess.record_request(after, {"time": time.time(), "model": DEFAULT_MODEL, "usage": sent["usage"],
                                "message_id": sent["id"], "stream": False, "est_tokens": after.tokens,
                                "sent_to": "the local emulator (cachecompact demo)"})
    u = sent["usage"]
    print(f"sent to the local emulator: {u['input_tokens']} input, {u['cache_creation_input_tokens']} written to the "
          f"cache, {u['output_tokens']} output tokens")
    print(ledger_table(sess))
    print(f"\nsession stored in {out}\n  cachecompact ledger show {out}\n  cachecompact ledger verify {out}\n"
          f"  cachecompact render {out} --uncompacted --pretty    # the history as the caller sent it")
    return 0


def _demo_send(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` sent to an emulator started for it, through the SDK: the response as JSON."""
    import anthropic

    from .emulator import Emulator

    with Emulator() as emu:
        client = anthropic.Anthropic(base_url=emu.url, api_key="cachecompact-demo", max_retries=0)
        out: dict[str, Any] = client.messages.create(**body).model_dump(mode="json")
    return out


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the emulator until interrupted."""
    from .emulator import Emulator, FaultConfig, ReplayResponder, ScriptedResponder, SummarizingResponder
    from .traces import load_trace

    inner = ReplayResponder(load_trace(args.trace).messages) if args.trace else ScriptedResponder()
    faults = FaultConfig(rate=args.fault_rate, seed=args.seed, slow_rate=args.slow_rate)
    emu = Emulator(SummarizingResponder(inner), faults=faults, log=args.log, host=args.host, port=args.port,
                   gzip=args.gzip, foreign_signatures=args.foreign_signatures)

    def ready(url: str) -> None:
        print(f"cachecompact emulator listening on {url}  (anthropic.Anthropic(base_url={url!r}, "
              f"api_key='test')); Ctrl-C to stop", flush=True)

    try:
        emu.serve_forever(ready)
    except OSError as err:
        raise UsageError(f"cannot listen on {args.host}:{args.port}: {err.strerror or err}; pick another --port "
                         "(--port 0 takes a free one)") from None
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """Per-session cache report: hit rate over time, breaks and causes, cost, compactions."""
    from .observed_report import observed_report
    from .session_report import plot_session, session_data, session_report

    seen = _observed(args)
    if seen is not None:
        print(observed_report(*seen, detail=not args.summary), flush=True)
        if args.plot:
            print("cachecompact: error: --plot needs a session that keeps a transcript (observe mode keeps only "
                  "its records); the dashboard (cachecompact proxy) plots observe-mode sessions", file=sys.stderr)
            return 2
        return 0
    sess = _open(args)
    print(session_report(sess, detail=not args.summary), flush=True)  # the text first: a failing plot must not lose it
    if args.plot:
        try:
            plot_session(session_data(sess), Path(args.plot))
        except (OSError, RuntimeError, ValueError) as err:
            print(f"cachecompact: error: the plot was not written: {_one_line(err)}", file=sys.stderr)
            return 2
        print(f"plot written to {args.plot}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    """Replay traces and run the tasks under every strategy; print tables; write results, report, plots."""
    import shlex

    from .bench.bench_report import text_report, write_outputs
    from .bench.run import DEFAULT_WINDOWS, run_bench, window_label

    logging.getLogger("cachecompact").setLevel(logging.ERROR)  # per-request warnings would drown the table
    res = run_bench(args.paths, args.strategy, model=args.model, windows=args.window or DEFAULT_WINDOWS,
                    workers=args.workers, progress=not args.json, synthetic=args.synthetic,
                    tasks=not args.no_tasks, traces=not args.tasks, full=args.full, closed_loop=not args.open_loop)
    command = "cachecompact " + " ".join(shlex.quote(a) for a in (args.argv or []))
    files = write_outputs(res, Path(args.out), command)
    if args.json:
        print((Path(args.out) / "results.json").read_text())
        return 0
    print(f"\n{res.corpus}: {len(res.traces)} traces, {len(res.tasks)} task runs, priced as {res.model}, windows "
          f"{', '.join(window_label(w) for w in res.windows)}, {res.wall_s:.0f} s\n")
    for s in res.skipped:
        print(f"skipped {s['file']}: {s['reason']}")
    print(text_report(res))
    plots = sum(1 for f in files if f.suffix == ".png")
    print(f"wrote results.json, report.md and {plots} plots to {args.out}/")
    return 0




def _proxy_engine_options(args: argparse.Namespace) -> EngineOptions | None:
    """The engine settings among the proxy's flags, or None: without them nothing loads the
    compaction runtime, so observe mode stays light."""
    if args.recent_tokens is None and args.lookback_coverage is None and args.prefix_messages is None:
        return None
    from ..engine.options import EngineOptions

    return EngineOptions(recent_tokens=args.recent_tokens, lookback_coverage=args.lookback_coverage,
                         prefix_messages=args.prefix_messages)


def _auth_token(args: argparse.Namespace, say: bool = True) -> str | None:
    """The dashboard's token: ``--auth-token-file``, ``CACHECOMPACT_AUTH_TOKEN`` or ``--auth-token``
    (one of them). A token on the command line shows in ``ps`` to every user of the machine, so
    it is taken with a warning; the file must not be readable by others."""
    given = [n for n, v in (("--auth-token-file", args.auth_token_file), ("--auth-token", args.auth_token))
             if v is not None]
    if len(given) > 1:
        raise UsageError("give the token one way: --auth-token-file or --auth-token (or CACHECOMPACT_AUTH_TOKEN)")
    if args.auth_token_file is not None:
        path = Path(args.auth_token_file)
        try:
            mode = path.stat().st_mode
            token = path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as err:
            raise UsageError(f"--auth-token-file {path}: cannot be read ({err})") from None
        if not token or "\n" in token:
            raise UsageError(f"--auth-token-file {path}: must hold the token on one line")
        if mode & 0o077:
            raise UsageError(f"--auth-token-file {path}: readable by others (mode {mode & 0o777:o}); "
                             f"chmod 600 {path}")
        return token
    if args.auth_token is not None:
        if say:
            print("cachecompact: warning: --auth-token shows in `ps` to every user of this machine; use "
                  "--auth-token-file or CACHECOMPACT_AUTH_TOKEN", file=sys.stderr)
        return str(args.auth_token) or None
    return os.environ.get("CACHECOMPACT_AUTH_TOKEN") or None


def cmd_proxy(args: argparse.Namespace) -> int:
    """Run the proxy until interrupted."""
    from urllib.parse import urlsplit

    from ..adapters.proxy import Proxy, ProxyConfig

    token = _auth_token(args)
    cfg = ProxyConfig(upstream=args.upstream, host=args.host, port=args.port, mode=args.mode, store=args.store,
                      keep_bodies=args.keep_bodies, auth_token=token, strategy=args.strategy,
                      window_tokens=args.window, idle_compaction=args.idle_compaction,
                      summary_model=args.summary_model, max_memory_mb=args.max_memory,
                      engine_options=_proxy_engine_options(args))
    cfg.check()
    proxy = Proxy(cfg)

    def ready(url: str) -> None:
        shown = url.replace("0.0.0.0", "<this machine's address>").replace("[::]", "<this machine's address>")
        dropped = " (the trailing /v1 of --upstream dropped: clients send /v1/...)" \
            if urlsplit(args.upstream).path.rstrip("/").endswith("/v1") else ""
        print(f"cachecompact proxy ({cfg.mode}) listening on {url} -> {cfg.upstream}{dropped}\n"
              f"  clients: ANTHROPIC_BASE_URL={shown}\n  dashboard: {shown}/ui"
              + ("?token=..." if token else "")
              + ("" if cfg.store else "\n  (no --store: sessions are kept in memory only)"), flush=True)

    try:
        proxy.serve_forever(ready)
    except OSError as err:
        raise UsageError(f"cannot listen on {args.host}:{args.port}: {err.strerror or err}; pick another --port "
                         "(--port 0 takes a free one)") from None
    return 0


def cmd_forensics(args: argparse.Namespace) -> int:
    """Cache forensics of recorded Claude Code logs: misses per class and what they cost."""
    from ._logs import summarize_logs
    from .traces import discover_all

    files, unusable = discover_all(list(args.paths))
    if not files:
        missing = [s["file"] for s in unusable if s["reason"] == "no such file or folder"]
        if len(missing) == len(unusable) == len(args.paths):
            raise UsageError(f"no such file or folder: {', '.join(missing)}")
        _say_skipped(unusable)
        raise UsageError(f"no log files found in {' '.join(args.paths)}")
    done, skipped, totals = summarize_logs(files)
    skipped = unusable + skipped
    if not done and not args.json:  # one line per file and why, no report of nothing
        _say_skipped(skipped)
        raise UsageError(f"none of the {len(files)} file(s) is a Claude Code log with 3 or more calls recorded "
                         f"with usage (each is listed above with why)")
    if args.json:
        print(json.dumps({"logs": [{"name": r.name, "project": r.project, "day": r.day, "model": r.model,
                                    "resumes": r.resumes, "calls": r.calls, "cost_usd": r.cost_usd, "misses": r.misses,
                                    "wasted_usd": r.wasted,
                                    "findings": [f.to_dict() for f in r.findings
                                                 if f.cls != "read_as_expected"]} for r in done],
                          "skipped": skipped, "totals": totals}, indent=1))
        return 0 if done else 2
    shown = done if args.verbose or len(done) <= _MOST else \
        sorted(done, key=lambda r: -sum(r.wasted.values()))[:_MOST]
    for r in shown:
        waste = sum(r.wasted.values())
        share = f" ({waste / r.cost_usd:.0%})" if r.cost_usd else ""
        resumed = f" (resumes {', '.join(r.resumes)}: its copied calls are counted there)" if r.resumes else ""
        print(_wrapped(f"{r.name}{resumed}: {r.calls} calls, ${r.cost_usd:.2f}, wasted ${waste:.2f}{share}"
                       + "".join(f"; {k} {v} (${r.wasted[k]:.2f})" for k, v in sorted(r.misses.items()))))
        if args.verbose:
            missed = [f for f in r.findings if f.cls != "read_as_expected"]
            labelled, thread = any(f.thread for f in missed), ""
            for f in missed:
                if labelled and (f.thread or "main chain") != thread:
                    thread = f.thread or "main chain"  # a sub-agent has its own cache and clock: times start again
                    print(f"  {thread}:")
                when = (datetime.fromtimestamp(f.time, UTC).strftime("%Y-%m-%d %H:%M")
                        if f.time == f.time else "time unknown")
                said = f' after "{f.prompt}"' if f.prompt else ""
                print(_wrapped(f"    {when} call {f.request}: {f.cls} (${f.wasted_usd:.2f}): {f.detail}{said}",
                               "        "))
    if len(shown) < len(done):
        print(f"... and {len(done) - len(shown)} more logs (the {_MOST} that wasted most are shown; -v lists all)")
    for s in skipped:
        print(f"skipped {s['file']}: {_one_line_text(s['reason'])}")
    main = totals["cost_usd"] - totals["subagent_cost_usd"]
    print(_wrapped(f"\n{totals['logs']} logs, {totals['calls']} calls with usage "
                   f"({totals['subagent_calls']} of them by sub-agents, each sub-agent a thread of its own), "
                   f"${totals['cost_usd']:.2f} as billed = ${main:.2f} (main chains) + "
                   f"${totals['subagent_cost_usd']:.2f} (sub-agents); each response counted once, a resumed log's "
                   f"copies included. `cachecompact whatif` on the same files replays the main chains only, and "
                   f"splits the same total by which sessions it replayed" + (
                       f"; the {len(skipped)} skipped files are in neither" if skipped else "")))
    for title, groups in (("project", totals["by_project"]), ("day", totals["by_day"])):
        if len(groups) > 1:
            rows = [[k[:40], str(g["logs"]), str(g["calls"]), f"${g['cost_usd']:.2f}", f"${g['wasted_usd']:.2f}"]
                    for k, g in list(groups.items())[-_MOST:]]
            print(_table(rows, [title, "logs", "calls", "cost", "wasted"]))
            if len(groups) > _MOST:
                print(f"(the last {_MOST} of {len(groups)}; --json has all)")
    rows = [[k, str(v), f"${totals['wasted_usd'][k]:.2f}"] for k, v in totals["misses"].items()]
    print(_table(rows, ["class", "misses", "wasted"]))
    print(f"explained by a class: {totals['explained']}; unexplained (provider suspected): {totals['unexplained']}")
    for line in totals["advice"]:
        print(_wrapped(f"- {line}"))
    return 0


_MOST = 12  # logs (and days, projects) a terminal listing shows before it summarises


def _wrapped(line: str, indent: str = "  ") -> str:
    from ._terminal import fold

    return fold(line, indent)


def cmd_whatif(args: argparse.Namespace) -> int:
    """Replay the user's own sessions under each option and print what each would have cost."""
    from ._whatif import OPTIONS, table, what_if, write
    from .bench.run import OWN_WINDOW

    logging.getLogger("cachecompact").setLevel(logging.ERROR)  # per-request warnings would drown the table
    w = what_if(args.paths, args.option or OPTIONS, window=args.window or OWN_WINDOW, workers=args.workers,
                progress=not args.json, on_skip=None if args.json else lambda s: _say_skipped([s]))
    files = write(w, Path(args.out))
    if args.json:
        print((Path(args.out) / "whatif.json").read_text())
        return 0
    print(table(w))
    print(f"wrote {', '.join(map(str, files))} ({w.wall_s:.0f} s)")
    return 0


def cmd_store_migrate(args: argparse.Namespace) -> int:
    """Create or upgrade the PostgreSQL schema (never done implicitly)."""
    from ..store import is_database_url

    if not is_database_url(args.url):
        raise UsageError(f"store migrate takes a postgresql:// URL, got {args.url!r} (a folder needs no migration)")
    try:
        from ..store.postgres import migrate
    except ImportError as err:
        raise UsageError(str(err)) from None
    before, after = migrate(args.url)
    print(f"schema version {before} -> {after}" if before != after else f"schema is current (version {after})")
    return 0


def cmd_store_list(args: argparse.Namespace) -> int:
    from ..store import open_store

    if args.url and args.store_url and args.url != args.store_url:
        raise UsageError(f"two stores given: {args.url!r} and --store {args.store_url!r}")
    url = args.url or args.store_url or DEFAULT_STORE
    if "://" not in url and not Path(url).is_dir():
        raise UsageError(f"{url}: no such store folder (or give a postgresql:// URL)")
    store = open_store(url)
    found = store.list(args.prefix)
    for sid in found:
        print(sid)
    store.close()
    if not found:  # one line on stderr: stdout stays a list of ids for scripts (empty here)
        print(f"no sessions{f' with prefix {args.prefix!r}' if args.prefix else ''} in {url}", file=sys.stderr)
    return 0


def cmd_store_export(args: argparse.Namespace) -> int:
    """A session from any store as a session directory (verifiable with the stdlib verifier)."""
    from ..history.transfer import copy_session
    from ..store import FileSessionStore, open_store

    src_store = open_store(args.url)
    dst = FileSessionStore.create(args.dir, {})
    try:
        copy_session(src_store.open(args.session), dst=dst)
    except BaseException:
        import shutil

        shutil.rmtree(args.dir, ignore_errors=True)  # nothing half-written is left behind
        raise
    meta = src_store.open(args.session).read_meta()
    dst.write_meta({k: v for k, v in meta.items() if k not in ("format", "version")})
    src_store.close()
    print(f"exported {args.session} to {args.dir}")
    return 0


def cmd_store_import(args: argparse.Namespace) -> int:
    from ..history.transfer import copy_session
    from ..store import FileSessionStore, open_store

    src = FileSessionStore.open(args.dir)
    dst_store = open_store(args.url)
    made = copy_session(src, dst_store)
    dst_store.close()
    print(f"imported {args.dir} into {dst_store.url} as session {made.session_id}")
    return 0


# -- argument checks: each names the option and the rule ------------------------------------------


def _int_in(name: str, lo: int, hi: int | None = None) -> Any:
    def parse(v: str) -> int:
        try:
            n = int(v)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer, got {v!r}") from None
        if n < lo or (hi is not None and n > hi):
            rule = f"between {lo} and {hi}" if hi is not None else f"at least {lo}"
            raise argparse.ArgumentTypeError(f"{name} must be {rule}, got {n}")
        return n
    return parse


def _bench_window(v: str) -> int:
    """``own`` (each trace at its model's own window, 0) or a window of 8,000 to 10,000,000 tokens."""
    if v.strip().lower() == "own":
        return 0
    n: int = _int_in("--window", 8_000, 10_000_000)(v)
    return n


def _fraction(name: str, *, exclusive: bool = False) -> Any:
    """A share from 0 to 1; ``exclusive`` leaves out both ends (a coverage of 0 or 1 means nothing)."""
    def parse(v: str) -> float:
        try:
            x = float(v)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number, got {v!r}") from None
        if not (0.0 < x < 1.0 if exclusive else 0.0 <= x <= 1.0):
            raise argparse.ArgumentTypeError(f"{name} must be between 0 and 1{' (exclusive)' if exclusive else ''}, "
                                             f"got {v}")
        return x
    return parse


def _existing_file(name: str) -> Any:
    def parse(v: str) -> str:
        if not Path(v).is_file():
            raise argparse.ArgumentTypeError(f"{name} {v}: no such file")
        return v
    return parse


def _writable_dir(p: Path, what: str) -> None:
    """Create ``p`` (a folder for outputs) now, so a bad path fails before the work, not after."""
    try:
        p.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=p, prefix=".cachecompact-probe-"):
            pass
    except OSError as err:
        raise UsageError(f"{what} {p}: not a writable folder ({err.strerror or err})") from None


def _writable_file(p: Path, what: str) -> None:
    parent = p.parent
    if p.is_dir():
        raise UsageError(f"{what} {p}: is a folder")
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise UsageError(f"{what} {p}: the folder {parent} does not exist or is not writable")


def _one_line_text(text: str) -> str:
    return " ".join(str(text).split())[:300]


def _say_skipped(skipped: list[dict[str, str]]) -> None:
    """One line per file a command could not use, and why (to stderr, as it goes)."""
    for s in skipped:
        print(f"cachecompact: skipped {s['file']}: {_one_line_text(s['reason'])}", file=sys.stderr, flush=True)


def _existing_store(url: str) -> None:
    """A session command's ``--store`` folder exists (a missing one read as "no such session")."""
    if "://" not in url and not Path(url).is_dir():
        from ..base.errors import StoreError

        raise StoreError(f"--store {url}: no such store folder ({Path(url).absolute()} does not exist; "
                         "give a folder of sessions or a postgresql:// URL)")


def _must_exist(paths: list[str]) -> None:
    missing = [p for p in paths if not Path(p).exists()]
    if missing:
        raise UsageError(f"no such file or folder: {', '.join(missing)}")


def _load_model_prices(path: str) -> None:
    """Register the models a ``--model-prices`` file prices (`pricing.custom`)."""
    from ..base.pricing import custom, register_model

    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise UsageError(f"--model-prices {path}: {err}") from None
    if not isinstance(data, dict):
        raise UsageError(f"--model-prices {path}: expected an object mapping model ids to prices")
    for name, prices in data.items():
        register_model(custom(str(name), prices))


def _check(args: argparse.Namespace) -> None:
    """Checks that need the file system or the registries, run before any work."""
    if getattr(args, "model_prices", None):
        _load_model_prices(args.model_prices)
    if args.command == "render":
        from ..base.pricing import get_model

        get_model(args.model)  # an unlisted id: one line naming the nearest ones
    if args.command == "bench":
        from ..base.pricing import get_model
        from .bench.harness import check_strategy

        for name in args.strategy or []:
            check_strategy(name)
        if args.model is not None:
            get_model(args.model)
        if args.tasks and args.no_tasks:
            raise UsageError("--tasks and --no-tasks exclude each other")
        _must_exist(args.paths)
        _writable_dir(Path(args.out), "--out")
    if getattr(args, "target", None) is not None and getattr(args, "store", None):
        _existing_store(args.store)
    if getattr(args, "plot", None):
        _writable_file(Path(args.plot), "--plot")
    if getattr(args, "log", None):
        _writable_file(Path(args.log), "--log")
    if args.command == "proxy":
        from ..adapters.proxy import ProxyConfig
        from ..compaction.catalog import get_strategy

        get_strategy(args.strategy)
        if args.recent_tokens is not None and args.lookback_coverage is not None:
            raise UsageError("--lookback-coverage and --recent-tokens exclude each other: the first learns the "
                             "recent budget from the agent's look-backs, the second fixes it")
        ProxyConfig(upstream=args.upstream, host=args.host, mode=args.mode, store=args.store,
                    keep_bodies=args.keep_bodies, strategy=args.strategy,
                    auth_token=_auth_token(args, say=False)).check()
        if args.store:
            from ..store import open_writable_store

            st = open_writable_store(args.store)  # a bad store fails now, not on every request
            if st is not None:
                st.close()


class _Parser(argparse.ArgumentParser):
    """Usage errors as `UsageError`, so they print as one line like every other error."""

    def error(self, message: str) -> NoReturn:
        import re

        # "argument --port: --port must be ..." -> "--port must be ..."
        m = re.match(r"argument (\S+): (\1 .*)$", message)
        message = m.group(2) if m else message
        if re.match(r"the following arguments are required: .*\bSESSION\b", message):  # where to find one
            message += " (a session folder or id; `cachecompact store list [--store URL]` lists a store's sessions)"
        raise UsageError(message)


def _session_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", metavar="SESSION",
                   help="a session directory, or a session id (in --store, else in .cachecompact/sessions)")
    p.add_argument("--store", metavar="URL", help="the store holding SESSION: a folder or postgresql://...")


def build_parser() -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    common.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    # every command that prices a model takes the prices of one the table does not list
    priced = _Parser(add_help=False)
    priced.add_argument("--model-prices", metavar="JSON",
                        help="a file pricing models the price table does not list: {id: {input, output, ...}} "
                             "($ per MTok)")
    p = _Parser(prog="cachecompact", description=__doc__.splitlines()[0].replace("``", ""), parents=[common])
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    led = sub.add_parser("ledger", help="inspect a session's ledger", parents=[common])
    lsub = led.add_subparsers(dest="ledger_command", required=True, parser_class=_Parser)
    show = lsub.add_parser("show", help="print a table of the edits", parents=[common])
    _session_args(show)
    show.set_defaults(func=cmd_ledger_show)
    ver = lsub.add_parser("verify", parents=[common],
                          help="check every chain, the prefix and the replay; never writes; exit 1 when invalid, "
                               "3 when a summary (ours or the API's) is unconfirmed")
    _session_args(ver)
    ver.add_argument("--repair", action="store_true", help="set a torn last line aside (a crash mid-append; the only "
                                                           "write verify makes); a changed record cannot be mended")
    ver.add_argument("--head", metavar="HEAD", help="a head printed earlier: fail if the store no longer extends it")
    ver.set_defaults(func=cmd_ledger_verify)
    ren = sub.add_parser("render", help="print the request body (as it was after ledger entry K)",
                         parents=[common, priced])
    _session_args(ren)
    ren.add_argument("--at-entry", type=_int_in("--at-entry", 0), default=None, metavar="K")
    ren.add_argument("--uncompacted", action="store_true",
                     help="the whole transcript with no ledger entry applied: every original, as the caller sent it")
    ren.add_argument("--model", default=DEFAULT_MODEL, help="an id of the price table (or priced by --model-prices)")
    ren.add_argument("--max-tokens", type=_int_in("--max-tokens", 1), default=DEFAULT_MAX_TOKENS)
    ren.add_argument("--pretty", action="store_true", help="indent instead of the exact canonical bytes")
    ren.set_defaults(func=cmd_render)
    srv = sub.add_parser("serve", help="run the local Messages API emulator", parents=[common, priced])
    srv.add_argument("--host", default="127.0.0.1")
    srv.add_argument("--port", type=_int_in("--port", 0, 65535), default=8765)
    srv.add_argument("--trace", type=_existing_file("--trace"), help="replay the assistant messages of this trace")
    srv.add_argument("--fault-rate", type=_fraction("--fault-rate"), default=0.0,
                     help="share of requests answered 429/529/500")
    srv.add_argument("--slow-rate", type=_fraction("--slow-rate"), default=0.0, help="share of requests delayed")
    srv.add_argument("--seed", type=int, default=0)
    srv.add_argument("--log", help="append one JSON line per request here, refused ones included (created 0600)")
    srv.add_argument("--gzip", action="store_true", help="gzip responses for clients that accept it, as the API does")
    srv.add_argument("--foreign-signatures", choices=["api_format", "refuse", "bind"], default="api_format",
                     help="thinking signatures the emulator did not issue: api_format (default) takes those in the "
                          "API's format, as the API takes its own (a recorded session resumed), and refuses made-up "
                          "ones; refuse refuses them all; bind takes them all")
    srv.set_defaults(func=cmd_serve)
    bench = sub.add_parser("bench", help="replay traces and run tasks under each strategy; compare cost and recall",
                           parents=[common, priced])
    bench.add_argument("paths", nargs="*", help="trace files or folders (default: ../shared/traces, else synthetic)")
    bench.add_argument("--strategy", action="append", help="strategy to run (repeatable; default: all)")
    bench.add_argument("--as-model", "--model", dest="model", default=None, metavar="MODEL",
                       help="replay every trace as this model: its rules (preserved thinking, for the current "
                            "models), its prices and its own window (an id of the price table; default: each "
                            "trace's recorded model, claude-sonnet-4-6 for a non-Claude one)")
    bench.add_argument("--window", type=_bench_window, nargs="+", action="extend", metavar="N",
                       help="context windows in tokens, or 'own' for each trace's model's own window "
                            "(repeatable; default: own 200000 50000)")
    bench.add_argument("--full", action="store_true",
                       help="every trace of the shared corpus (default: a sample of each set, a few minutes)")
    bench.add_argument("--tasks", action="store_true", help="run only the closed-loop task suite")
    bench.add_argument("--no-tasks", action="store_true", help="skip the closed-loop task suite")
    bench.add_argument("--open-loop", action="store_true",
                       help="replay the recorded replies whatever each request shows, charging a notional re-read "
                            "turn for hidden evidence (default: closed loop: the agent re-runs the call that produced "
                            "what it needs and cannot see)")
    bench.add_argument("--out", default="bench-out", help="folder for results.json, report.md and plots")
    bench.add_argument("--workers", type=_int_in("--workers", 1, 64), default=None,
                       help="processes (default: up to 2)")
    bench.add_argument("--json", action="store_true", help="print results.json instead of the table")
    bench.add_argument("--synthetic", type=_int_in("--synthetic", 1, 10_000), metavar="N",
                       help="run N synthetic traces instead of files")
    bench.set_defaults(func=cmd_bench)
    rep = sub.add_parser("report", help="cache health report of a session", parents=[common, priced])
    _session_args(rep)
    rep.add_argument("--plot", metavar="PNG", help="also write a plot (needs the [plot] extra)")
    rep.add_argument("--summary", action="store_true",
                     help="only the header and the summary by cause and by level (no line per request)")
    rep.set_defaults(func=cmd_report)
    demo = sub.add_parser("demo", help="build a session from a trace and show a render and its ledger",
                          parents=[common])
    demo.add_argument("--trace", type=_existing_file("--trace"),
                      help="a trace file (default: the first shared Claude Code trace, else synthetic)")
    demo.add_argument("--out", help="session directory to create (default: a temporary one)")
    demo.set_defaults(func=cmd_demo)
    px = sub.add_parser("proxy", help="an Anthropic-compatible proxy with cache forensics, compaction and a dashboard",
                        parents=[common, priced])
    px.add_argument("--upstream", default="https://api.anthropic.com", metavar="URL",
                    help="where requests go: an http:// or https:// base URL (default: the API); a trailing /v1 "
                         "(an SDK-style base URL, e.g. http://localhost:8080/v1) is dropped, as clients send "
                         "/v1/messages themselves")
    px.add_argument("--host", default="127.0.0.1", help="beyond loopback needs --auth-token")
    px.add_argument("--port", type=_int_in("--port", 0, 65535), default=8787)
    px.add_argument("--mode", choices=["observe", "compact"], default="observe",
                    help="observe: never change a byte; compact: run the strategy on each session")
    px.add_argument("--store", metavar="DIR|URL", help="persist sessions and records (a folder or postgresql://...)")
    px.add_argument("--keep-bodies", action="store_true", help="also keep request bodies (needs --store)")
    px.add_argument("--max-memory", type=_int_in("--max-memory", 2), default=1024, metavar="MB",
                    help="session state kept in memory, estimated (default 1024); the least recently used "
                         "sessions go first and open again from --store when they come back")
    px.add_argument("--auth-token-file", metavar="FILE",
                    help="a file holding the token the dashboard and /api then require (or the environment variable "
                         "CACHECOMPACT_AUTH_TOKEN); needed only when listening beyond loopback")
    px.add_argument("--auth-token", help="the token itself (shows in `ps` to every user of the machine: prefer "
                                         "--auth-token-file or CACHECOMPACT_AUTH_TOKEN)")
    px.add_argument("--strategy", default="cachecompact", help="compact mode: the registered strategy")
    px.add_argument("--lookback-coverage", type=_fraction("--lookback-coverage", exclusive=True), default=None,
                    metavar="Q",
                    help="compact mode: the cost-versus-recall knob: the newest history kept verbatim covers this "
                         "share of the agent's own look-backs, learnt per session (default 0.93; docs/policy.md)")
    px.add_argument("--recent-tokens", type=_int_in("--recent-tokens", 0), default=None, metavar="N",
                    help="compact mode: fix the recent budget at N tokens instead of learning it")
    px.add_argument("--window", type=_int_in("--window", 8_000), default=None, metavar="N",
                    help="compact mode: the context window (default: the model's)")
    px.add_argument("--prefix-messages", type=_int_in("--prefix-messages", 0), default=None, metavar="N",
                    help="compact mode: the first N messages of a conversation are never compacted (default 3); "
                         "1 when a client's first tool output would otherwise fill a small window")
    px.add_argument("--idle-compaction", action="store_true",
                    help="compact mode: summarize a quiet session a minute before its cache expires when that pays; "
                         "holds each session's last credential in memory (never on disk or in logs) until then")
    px.add_argument("--summary-model", default=None, metavar="MODEL",
                    help="compact mode: the model summaries use (default: claude-haiku-5-5)")
    px.set_defaults(func=cmd_proxy)
    fo = sub.add_parser("forensics", help="why recorded Claude Code sessions missed the cache, and what it cost",
                        parents=[common, priced])
    fo.add_argument("paths", nargs="+", help="Claude Code JSONL logs or folders")
    fo.add_argument("--json", action="store_true", help="print every finding as JSON")
    fo.add_argument("-v", "--verbose", action="store_true", help="list every miss")
    fo.set_defaults(func=cmd_forensics)
    wi = sub.add_parser("whatif", help="what your own sessions would have cost with cachecompact, a peer or another "
                                       "TTL", parents=[common, priced])
    wi.add_argument("paths", nargs="+", help="Claude Code logs (~/.claude/projects/*/), folders, or any bench trace")
    wi.add_argument("--option", action="append", metavar="STRATEGY",
                    help="a strategy to replay (repeatable; name@5m or name@1h fixes its TTL); default: cachecompact "
                         "with each TTL, no compaction with each TTL, claude-code and openhands")
    wi.add_argument("--window", type=_int_in("--window", 8_000), default=None, metavar="N",
                    help="replay at this context window (default: each session's model's own)")
    wi.add_argument("--workers", type=_int_in("--workers", 1), default=None, metavar="N",
                    help="processes (default: 2, or 1 on a one-core machine)")
    wi.add_argument("--out", default="whatif-out", metavar="DIR", help="where whatif.json and whatif.png go")
    wi.add_argument("--json", action="store_true", help="print whatif.json instead of the table")
    wi.set_defaults(func=cmd_whatif)
    st = sub.add_parser("store", help="manage a session store (PostgreSQL schema, export, import)", parents=[common])
    ssub = st.add_subparsers(dest="store_command", required=True, parser_class=_Parser)
    mig = ssub.add_parser("migrate", help="create or upgrade the PostgreSQL schema", parents=[common])
    mig.add_argument("url", metavar="URL")
    mig.set_defaults(func=cmd_store_migrate)
    ls = ssub.add_parser("list", help="list the sessions of a store", parents=[common])
    ls.add_argument("url", metavar="URL", nargs="?",
                    help=f"a folder or postgresql://... (default: --store, else {DEFAULT_STORE})")
    ls.add_argument("--store", metavar="URL", dest="store_url", help="the same as URL, as the other commands take it")
    ls.add_argument("--prefix", default="")
    ls.set_defaults(func=cmd_store_list)
    ex = ssub.add_parser("export", help="write one session as a session directory", parents=[common])
    ex.add_argument("url", metavar="URL")
    ex.add_argument("session", metavar="SESSION")
    ex.add_argument("dir", metavar="DIR", help="the session directory to create")
    ex.set_defaults(func=cmd_store_export)
    im = ssub.add_parser("import", help="load a session directory into a store", parents=[common])
    im.add_argument("dir", metavar="DIR")
    im.add_argument("url", metavar="URL")
    im.set_defaults(func=cmd_store_import)
    for extra in _EXTRA_COMMANDS:
        extra(sub, common)
    return p


_EXTRA_COMMANDS: list[Any] = []  # (sub, common) -> None: commands defined in other modules (proxy, store)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(argv) if argv is not None else sys.argv[1:]
    for stream in (sys.stdout, sys.stderr):  # a file name that is not UTF-8 is printed escaped, never a crash
        if hasattr(stream, "reconfigure"):
            with contextlib.suppress(ValueError, OSError):
                stream.reconfigure(errors="backslashreplace")
    debug = "--debug" in argv
    if debug:
        logging.basicConfig(level=logging.DEBUG, format="%(levelname)s %(name)s: %(message)s")
    try:
        args = build_parser().parse_args(argv)
        args.argv = argv
        _check(args)
        return int(args.func(args))
    except BrokenPipeError:  # pragma: no cover - e.g. `| head`
        return 0
    except KeyboardInterrupt:
        return 130
    except Exception as err:
        if debug:
            raise
        from ..base.errors import CacheCompactError

        if isinstance(err, (UsageError, CacheCompactError, OSError)):
            print(f"cachecompact: error: {_one_line(err)}", file=sys.stderr)
            return 2
        # a bug: still one line, with how to see more
        print(f"cachecompact: error: internal error {type(err).__name__}: {_one_line(err)} (rerun with --debug "
              "for the traceback)", file=sys.stderr)
        return 2


def _one_line(err: BaseException) -> str:
    text = str(err) or type(err).__name__
    if isinstance(err, OSError) and err.filename and err.strerror:
        text = f"{err.filename}: {err.strerror}"
    return " ".join(text.split())[:500]


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
