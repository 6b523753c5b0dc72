"""The file store against PostgreSQL, side by side in one run.

* appends per second: one session appending 1-message records, and 50 sessions appending
  concurrently (50 threads), for each store;
* per-turn engine overhead (what `wrap()` and the proxy add per request, HTTP aside: sync,
  compaction policy, render, and recording the request) at turns 90-110 and 990-1010 of one
  long session, for each store; the ratio PostgreSQL / files at both points, and turn 1,000 /
  turn 100 for each store (reads are incremental, so it must not grow with the session).

    python benchmarks/bench_store.py [--db postgresql://...] [--write docs/benchmarks.md]

Without ``--db`` (or CACHECOMPACT_TEST_DATABASE_URL) a throwaway server is started (root,
Debian's postgresql).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cachecompact.base.values import Answer  # noqa: E402
from cachecompact.engine.request_cycle import CompactionEngine  # noqa: E402
from cachecompact.store import FileStore, Store, open_store  # noqa: E402
from cachecompact.store.postgres import migrate  # noqa: E402
from cachecompact.tools.bench.bench_report import publish  # noqa: E402

USAGE = {"input_tokens": 10, "cache_read_input_tokens": 5000, "cache_creation_input_tokens": 300,
         "output_tokens": 50}


def _appends(store: Store, sessions: int, per_session: int) -> float:
    """Appends per second with ``sessions`` threads, one session each."""
    ids = [f"bench-{uuid.uuid4().hex[:8]}-{k}" for k in range(sessions)]
    handles = [store.create(i, {"session_id": i}) for i in ids]
    for h in handles:
        h.read_new("transcript")
    barrier = threading.Barrier(sessions + 1)

    def run(h: Any) -> None:
        barrier.wait()
        for n in range(per_session):
            h.append("transcript", [{"i": n, "m": {"role": "user", "content": f"message {n} " * 20}}], n)

    threads = [threading.Thread(target=run, args=(h,)) for h in handles]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return sessions * per_session / (time.perf_counter() - t0)


def _turn(k: int) -> list[dict[str, Any]]:
    return [{"role": "assistant", "content": [{"type": "text", "text": f"Reading file {k}."},
                                              {"type": "tool_use", "id": f"toolu_{k:05d}", "name": "read",
                                               "input": {"path": f"src/mod_{k}.py"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{k:05d}",
                                          "content": f"# module {k}\n" + "\n".join(f"line {j} of {k}" for j in
                                                                                    range(30))}]}]


def _per_turn(store: Store, turns: int, windows: list[tuple[int, int]]) -> dict[tuple[int, int], float]:
    """Median engine time per turn (ms) inside each window of turns."""
    eng = CompactionEngine(store, session_id=f"turns-{uuid.uuid4().hex[:8]}", summarizer=None,
                           window_tokens=1_000_000)  # a big window: measure the bookkeeping, not summaries
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "Read every module."}]
    times: dict[int, float] = {}
    for k in range(turns):
        msgs = [*msgs, *_turn(k)]
        body = {"model": "claude-sonnet-4-6", "max_tokens": 1000, "system": "You audit code.", "messages": msgs}
        t0 = time.perf_counter()
        p = eng.prepare(body, explicit=None, now=1_800_000_000 + 10.0 * k)
        eng.record(p, Answer({**USAGE, "cache_read_input_tokens": p.render.tokens}, f"msg_{k}"))
        times[k] = time.perf_counter() - t0
    return {w: 1000 * statistics.median(times[k] for k in range(w[0], w[1])) for w in windows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", default=os.environ.get("CACHECOMPACT_TEST_DATABASE_URL"))
    ap.add_argument("--turns", type=int, default=1010)
    ap.add_argument("--write", metavar="MD")
    args = ap.parse_args()
    stop = None
    if not args.db:
        sys.path.insert(0, str(ROOT / "tests"))
        from pgserver import start_postgres

        tmp = Path(tempfile.mkdtemp(prefix="cachecompact-pgbench-"))
        args.db, stop = start_postgres(tmp)
    files_dir = tempfile.mkdtemp(prefix="cachecompact-storebench-")
    try:
        migrate(args.db)
        pg = open_store(args.db)
        files = FileStore(files_dir)
        res: dict[str, Any] = {}
        for name, st in (("files", files), ("postgres", pg)):
            res[(name, "one")] = _appends(st, 1, 2000)
            res[(name, "fifty")] = _appends(st, 50, 100)
        windows = [(90, 110), (args.turns - 20, args.turns)]
        for name, st in (("files", files), ("postgres", pg)):
            res[(name, "turns")] = _per_turn(st, args.turns, windows)
        pg.close()
    finally:
        shutil.rmtree(files_dir, ignore_errors=True)
        if stop is not None:
            stop()  # removes the server's folder too
    w0, w1 = windows
    f, p = res[("files", "turns")], res[("postgres", "turns")]
    text = "\n".join([
        f"Measured {time.strftime('%Y-%m-%d')} on {os.cpu_count()} cores, one run "
        "(`python benchmarks/bench_store.py`); PostgreSQL 15 on loopback with Debian's defaults except fsync off "
        "(a throwaway server); the file store fsyncs every append.",
        "",
        "| | file store | PostgreSQL | PostgreSQL / files |",
        "|---|---|---|---|",
        f"| appends/s, one session | {res[('files', 'one')]:.0f} | {res[('postgres', 'one')]:.0f} | "
        f"{res[('postgres', 'one')] / res[('files', 'one')]:.2f}x |",
        f"| appends/s, 50 sessions at once | {res[('files', 'fifty')]:.0f} | {res[('postgres', 'fifty')]:.0f} | "
        f"{res[('postgres', 'fifty')] / res[('files', 'fifty')]:.2f}x |",
        f"| engine time per turn, turns {w0[0]}-{w0[1]} (median) | {f[w0]:.2f} ms | {p[w0]:.2f} ms | "
        f"{p[w0] / f[w0]:.2f}x (target <= 2x) |",
        f"| engine time per turn, turns {w1[0]}-{w1[1]} (median) | {f[w1]:.2f} ms | {p[w1]:.2f} ms | "
        f"{p[w1] / f[w1]:.2f}x (target <= 2x) |",
        f"| turn {w1[0]}+ / turn {w0[0]}+ | {f[w1] / f[w0]:.2f}x | {p[w1] / p[w0]:.2f}x | |",
    ])
    return publish(text, args.write, "bench_store")


if __name__ == "__main__":
    sys.exit(main())
