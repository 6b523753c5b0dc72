"""Per-turn engine cost at turn 100 vs turn 1000, against json.dumps of the same body.

Builds a 1,000+ turn session by chaining the turns of the shared traces (synthetic turns
when ../shared/traces is absent), then replays it turn by turn: sync the new messages,
render (which hashes and token-counts only the new blocks). The same 21 "probe" turns
(tool ids renamed, so nothing is memoised) are replayed at turns 90-110 and 990-1010, so
both checkpoints do the same new-block work and differ only in history length. Before each
timed step (sync, render) the CPU caches are flushed (a 64 MiB buffer is copied), because between
two real agent turns the model call and the tools run and the caches are cold anyway; in a
tight loop a 100-turn session would otherwise fit in cache and a 1000-turn one would not.
Reported times are medians over each window, measured side by side in one run.

    python benchmarks/bench_render.py [--turns 1010] [--write docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from typing import Any

from cachecompact import Session
from cachecompact.bench.report import replace_section
from cachecompact.traces import default_trace_dir, discover, load_trace, synthetic_trace


def _retag(pair: list[dict[str, Any]], tag: str) -> list[dict[str, Any]]:
    text = json.dumps(pair)
    out: list[dict[str, Any]] = json.loads(text.replace('"toolu_', f'"toolu_{tag}_').replace('"call_', f'"call_{tag}_'))
    return out


def _turns_of(messages: list[dict[str, Any]], tag: str) -> list[list[dict[str, Any]]]:
    """Split a conversation after its first message into (assistant, user) pairs, renaming tool ids."""
    out = []
    body = messages[1:]
    for i in range(0, len(body) - 1, 2):
        a, u = body[i], body[i + 1]
        if a["role"] != "assistant" or u["role"] != "user":
            continue
        out.append(_retag([a, u], tag))
    return out


def build_turns(n: int) -> tuple[list[dict[str, Any]], list[list[dict[str, Any]]], str]:
    tdir = default_trace_dir()
    turns: list[list[dict[str, Any]]] = []
    first: list[dict[str, Any]] = []
    source = "synthetic"
    if tdir is not None:
        source = f"the shared traces ({os.path.relpath(tdir)})"
        for k, f in enumerate(discover([tdir])):
            tr = load_trace(f)
            first = first or tr.messages[:1]
            turns += _turns_of(tr.messages, f"t{k}")
            if len(turns) >= n:
                break
    seed = 0
    while len(turns) < n:
        tr = synthetic_trace(seed)
        first = first or tr.messages[:1]
        turns += _turns_of(tr.messages, f"s{seed}")
        seed += 1
    return first, turns[:n], source


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--turns", type=int, default=1010)
    ap.add_argument("--write", help="update the bench_render section of this markdown file")
    args = ap.parse_args()
    first, turns, source = build_turns(args.turns)
    checkpoints = {100: range(90, 111), 1000: range(990, 1011)}
    probe = turns[200:221]
    for cp, window in checkpoints.items():
        for j, t in enumerate(window):
            turns[t - 1] = _retag(probe[j], f"p{cp}")
    sess = Session.create(None, system="You are a coding agent.", prefix_messages=3)
    history = list(first)
    sess.sync(history)
    rows: dict[int, dict[str, list[float]]] = {}
    gc.disable()
    in_window = {t: cp for cp, window in checkpoints.items() for t in window}
    flush_src = bytearray(64 << 20)
    for t, pair in enumerate(turns, 1):
        history += pair
        cp = in_window.get(t)
        if cp is not None:
            bytes(flush_src)  # evict the caches, as a real turn's model call and tool run would
        t_sync = time.perf_counter()
        if cp is None:
            sess.append(pair)  # validates only the new messages (keeps the run short)
        else:
            sess.sync(history)  # what the middleware does each turn: re-verify the whole history
        t_sync = time.perf_counter() - t_sync
        if cp is not None:
            bytes(flush_src)  # each step is timed from cold caches, not from the previous step's
        t_render = time.perf_counter()
        r = sess.render(model="claude-sonnet-4-6", max_tokens=4096)
        t_render = time.perf_counter() - t_render
        if t % 100 == 0:
            gc.collect()
        if cp is None:
            continue
        t_noop = time.perf_counter()
        sess.render(model="claude-sonnet-4-6", max_tokens=4096)  # nothing new: the fixed per-turn overhead
        t_noop = time.perf_counter() - t_noop
        t_json = time.perf_counter()
        assert r.to_json()
        t_json = time.perf_counter() - t_json
        t_dumps = time.perf_counter()
        dumped = json.dumps(r.body)
        t_dumps = time.perf_counter() - t_dumps
        rec = rows.setdefault(cp, {k: [] for k in ("sync", "render", "noop", "to_json", "dumps", "bytes",
                                                   "blocks", "tokens")})
        for k, v in (("sync", t_sync), ("render", t_render), ("noop", t_noop), ("to_json", t_json),
                     ("dumps", t_dumps), ("bytes", len(dumped)), ("blocks", r.n_blocks), ("tokens", r.tokens)):
            rec[k].append(v)
    gc.enable()
    med = {cp: {k: statistics.median(v) for k, v in rec.items()} for cp, rec in rows.items()}
    lines = [
        f"Session: {len(turns)} turns chained from {source}; the same 21 probe turns replayed at turns "
        "90-110 and 990-1010 (sync, then render, as the middleware does; caches flushed before each turn); "
        "medians per window.",
        "",
        "| turn | blocks | body bytes | est. tokens | sync (verify all) | render+hash+count | render, nothing new | "
        "to_json | json.dumps | render / json.dumps |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for cp in sorted(med):
        m = med[cp]
        lines.append(f"| {cp} | {int(m['blocks'])} | {int(m['bytes']):,} | {int(m['tokens']):,} | "
                     f"{m['sync'] * 1e3:.3f} ms | {m['render'] * 1e3:.3f} ms | {m['noop'] * 1e6:.1f} us | "
                     f"{m['to_json'] * 1e3:.3f} ms | {m['dumps'] * 1e3:.3f} ms | {m['render'] / m['dumps']:.3f}x |")
    growth = med[1000]["render"] / med[100]["render"]
    ratio = med[1000]["render"] / med[1000]["dumps"]
    lines += [
        "",
        f"- Growth, turn 1000 / turn 100 (render+hash+count of the same new turn): **{growth:.2f}x** "
        "(goal <= 1.5x).",
        f"- Fixed per-render overhead (nothing new), turn 1000 / turn 100: "
        f"**{med[1000]['noop'] / med[100]['noop']:.2f}x** ({med[100]['noop'] * 1e6:.1f} us -> "
        f"{med[1000]['noop'] * 1e6:.1f} us).",
        f"- Engine / json.dumps of the full body at turn 1000: **{ratio:.3f}x** (goal <= 0.25x).",
        f"- `sync` re-verifies the whole history (O(history) by design) at turn 1000: "
        f"{med[1000]['sync'] * 1e3:.2f} ms, {med[1000]['sync'] / med[1000]['dumps']:.2f}x json.dumps.",
    ]
    text = "\n".join(lines)
    print(text)
    if args.write and not replace_section(args.write, "bench_render", text):
        print(f"markers <!-- bench_render:start/end --> not found in {args.write}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
