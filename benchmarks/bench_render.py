"""Per-turn middleware cost at turns 100, 1,000 and 10,000 and where the history first holds 1M
tokens, against json.dumps of the same body.

Builds a 10,000+ turn session by chaining the turns of the shared traces (synthetic turns
when ../shared/traces is absent) and drives it through `CompactionEngine` turn by turn, as
the middleware does: the agent's full history each turn (a new list), sync, the policy,
render (hashing and token-counting only the new blocks), then recording the answer. The same
21 "probe" turns (tool ids renamed, so nothing is memoised) are replayed around turns 100,
1,000 and 10,000, so every checkpoint does the same new-block work and differs only in
history length. Before each timed turn the CPU caches are flushed (a 64 MiB buffer is
copied): between two real turns the model call and the tools run and the caches are cold.
Medians per window, side by side in one run. Every turn the session resolution compares the
whole history by identity (one canonical encoding and one xxh3 per message: `engine/identity`),
so this is also the cost of that check.

    python benchmarks/bench_render.py [--turns 10010] [--write docs/benchmarks.md]
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

from cachecompact.base.tokens import TokenCounter
from cachecompact.base.values import Answer
from cachecompact.compaction.summarize.extractive import block_texts
from cachecompact.engine.request_cycle import CompactionEngine
from cachecompact.tools.bench.bench_report import publish
from cachecompact.tools.traces import default_trace_dir, discover, load_trace, synthetic_trace


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
    ap.add_argument("--turns", type=int, default=10_010)
    ap.add_argument("--write", help="update the bench_render section of this markdown file")
    args = ap.parse_args()
    first, turns, source = build_turns(args.turns)
    counter, total, million = TokenCounter(), 0, None  # the first turn whose history holds 1M tokens
    for t, pair in enumerate(turns, 1):
        total += sum(counter.count_text(text) for m in pair for _, text in block_texts(m))
        if total >= 1_000_000:
            million = t
            break
    marks = sorted({100, 1000, 10_000, *([million] if million is not None else [])})
    checkpoints = {cp: range(cp - 10, cp + 11) for cp in marks if cp + 10 <= args.turns}
    probe = turns[200:221]
    for cp, window in checkpoints.items():
        for j, t in enumerate(window):
            turns[t - 1] = _retag(probe[j], f"p{cp}")
    # the whole middleware path minus HTTP: sync, the policy, render, and recording the answer;
    # a window so large that nothing is compacted, so every checkpoint does the same work
    eng = CompactionEngine(None, session_id="bench", summarizer=None, window_tokens=10**9)
    history = list(first)
    rows: dict[int, dict[str, list[float]]] = {}
    gc.disable()
    in_window = {t: cp for cp, window in checkpoints.items() for t in window}
    flush_src = bytearray(64 << 20)
    usage = {"input_tokens": 10, "cache_read_input_tokens": 1000, "cache_creation_input_tokens": 100,
             "output_tokens": 50}
    for t, pair in enumerate(turns, 1):
        history = [*history, *pair]  # a new list each turn, as an agent builds its request
        body = {"model": "claude-sonnet-4-6", "max_tokens": 4096, "system": "You are a coding agent.",
                "messages": history}
        cp = in_window.get(t)
        if cp is not None:
            bytes(flush_src)  # evict the caches, as a real turn's model call and tool run would
        t0 = time.perf_counter()
        p = eng.prepare(body, explicit=None, now=1_800_000_000.0 + 10 * t)
        t_prepare = time.perf_counter() - t0
        eng.record(p, Answer({**usage, "cache_read_input_tokens": p.render.raw_tokens}, f"msg_{t}"))
        t_turn = time.perf_counter() - t0
        if t % 100 == 0:
            gc.collect()
        if cp is None:
            continue
        t_dumps = time.perf_counter()
        dumped = json.dumps(p.body)
        t_dumps = time.perf_counter() - t_dumps
        rec = rows.setdefault(cp, {k: [] for k in ("prepare", "turn", "dumps", "bytes", "blocks", "tokens")})
        for k, v in (("prepare", t_prepare), ("turn", t_turn), ("dumps", t_dumps), ("bytes", len(dumped)),
                     ("blocks", p.render.n_blocks), ("tokens", p.render.raw_tokens)):
            rec[k].append(v)
    gc.enable()
    med = {cp: {k: statistics.median(v) for k, v in rec.items()} for cp, rec in rows.items()}
    lines = [
        f"Session: {len(turns):,} turns chained from {source}; the same 21 probe turns replayed around turns "
        f"{', '.join(f'{cp:,}' for cp in sorted(med))} (caches flushed before each); medians per window. *Per turn* "
        "is the whole middleware path minus HTTP (`CompactionEngine.prepare`: sync, the policy, render; then "
        "`record`), against `json.dumps` of the same body.",
        "",
        "| turn | blocks | body bytes | est. tokens | prepare (sync + policy + render) | per turn (+ record) | "
        "json.dumps | per turn / json.dumps |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for cp in sorted(med):
        m = med[cp]
        lines.append(f"| {cp:,} | {int(m['blocks']):,} | {int(m['bytes']):,} | {int(m['tokens']):,} | "
                     f"{m['prepare'] * 1e3:.3f} ms | {m['turn'] * 1e3:.3f} ms | {m['dumps'] * 1e3:.3f} ms | "
                     f"{m['turn'] / m['dumps']:.3f}x |")
    lines.append("")
    last = max(med)
    growth = med[last]["turn"] / med[100]["turn"]
    lines.append(f"- Growth, turn {last:,} / turn 100 (the same new turn): **{growth:.2f}x**: linear in the history by "
                 "design, since every message is compared on every turn.")
    if million is not None and million in med:
        lines.append(f"- The history first holds 1M tokens (tiktoken cl100k count of its texts, tool inputs and "
                     f"results) at turn {million:,}.")
    worst = max(med, key=lambda cp: med[cp]["turn"] / med[cp]["dumps"])
    lines.append(f"- Per turn / json.dumps of the body, worst checkpoint (turn {worst:,}): "
                 f"**{med[worst]['turn'] / med[worst]['dumps']:.3f}x** (goal <= 0.5x at every checkpoint).")
    text = "\n".join(lines)
    return publish(text, args.write, "bench_render")


if __name__ == "__main__":
    sys.exit(main())
