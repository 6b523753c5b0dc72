"""Per-turn engine cost at turn 100 vs turn 1000, against json.dumps of the same body.

Builds a 1,000+ turn session by chaining the turns of the shared traces (synthetic turns
when ../shared/traces is absent), then replays it turn by turn: sync the new messages,
render (which hashes and token-counts only the new blocks). The same 21 "probe" turns
(tool ids renamed, so nothing is memoised) are replayed at turns 90-110 and 990-1010, so
both checkpoints do the same new-block work and differ only in history length. Reported
times are medians over each window, measured side by side in one run.

    python benchmarks/bench_render.py [--turns 1010] [--write docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from cachecompact import Session
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
        source = f"shared traces ({tdir})"
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
    for t, pair in enumerate(turns, 1):
        history += pair
        t0 = time.perf_counter()
        sess.sync(history)
        t1 = time.perf_counter()
        r = sess.render(model="claude-sonnet-4-5", max_tokens=4096)
        t2 = time.perf_counter()
        for cp, window in checkpoints.items():
            if t in window:
                raw = r.to_json()
                t3 = time.perf_counter()
                dumped = json.dumps(r.body)
                t4 = time.perf_counter()
                rec = rows.setdefault(cp, {"sync": [], "render": [], "to_json": [], "dumps": [], "bytes": [],
                                           "blocks": [], "tokens": []})
                rec["sync"].append(t1 - t0)
                rec["render"].append(t2 - t1)
                rec["to_json"].append(t3 - t2)
                rec["dumps"].append(t4 - t3)
                rec["bytes"].append(len(dumped))
                rec["blocks"].append(r.n_blocks)
                rec["tokens"].append(r.tokens)
                assert len(raw) > 0
        if t % 100 == 0:
            gc.collect()
    gc.enable()
    med = {cp: {k: statistics.median(v) for k, v in rec.items()} for cp, rec in rows.items()}
    lines = [
        f"Session: {len(turns)} turns chained from {source}; the same 21 probe turns replayed at turns "
        "90-110 and 990-1010; medians per window.",
        "",
        "| turn | blocks | body bytes | est. tokens | render+hash+count | sync | to_json | json.dumps | "
        "render / json.dumps |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for cp in sorted(med):
        m = med[cp]
        lines.append(f"| {cp} | {int(m['blocks'])} | {int(m['bytes']):,} | {int(m['tokens']):,} | "
                     f"{m['render'] * 1e3:.3f} ms | {m['sync'] * 1e3:.3f} ms | {m['to_json'] * 1e3:.3f} ms | "
                     f"{m['dumps'] * 1e3:.3f} ms | {m['render'] / m['dumps']:.3f}x |")
    growth = med[1000]["render"] / med[100]["render"]
    ratio = med[1000]["render"] / med[1000]["dumps"]
    lines += [
        "",
        f"- Growth, turn 1000 / turn 100 (render+hash+count): **{growth:.2f}x** (goal <= 1.5x).",
        f"- Engine / json.dumps of the full body at turn 1000: **{ratio:.3f}x** (goal <= 0.25x).",
        f"- `sync` (verifies the whole history against stored hashes) at turn 1000: "
        f"{med[1000]['sync'] * 1e3:.2f} ms, {med[1000]['sync'] / med[1000]['dumps']:.2f}x json.dumps.",
    ]
    text = "\n".join(lines)
    print(text)
    if args.write:
        p = Path(args.write)
        doc = p.read_text()
        start, end = "<!-- bench_render:start -->", "<!-- bench_render:end -->"
        if start in doc and end in doc:
            doc = doc[: doc.index(start) + len(start)] + "\n" + text + "\n" + doc[doc.index(end):]
            p.write_text(doc)
        else:
            print(f"markers {start} / {end} not found in {p}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
