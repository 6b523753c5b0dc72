"""Tamper with a stored session in every way we can think of, and count what `verify` catches.

A session with transcript, ledger edits and request records is built once. Each trial copies
it and changes one thing: a flipped byte anywhere in a file, a deleted, swapped, duplicated
or truncated line, a forged message with its hashes recomputed, a forged ledger entry or
request record with its own hash recomputed, or an edited ``session.json`` field. Then
``cachecompact ledger verify`` runs read-only. A change counts as

* **detected** when verify exits 1 naming the file (and line, for log files);
* **torn** when it is a torn last line (no newline at the end): verify reports it, exit 0, and
  ``--repair`` sets it aside (checked);
* **undetected** otherwise.

Truncating a log by whole lines at its end leaves a consistent shorter session; it is caught
by ``--head`` (the head an auditor, or the request log of a later request, recorded). The
table counts verify alone and verify with ``--head`` separately.

    python benchmarks/tamper.py [--trials 2000] [--write docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cachecompact import Session  # noqa: E402
from cachecompact.history.ledger import ReplaceWithSummary, SkipRange  # noqa: E402
from cachecompact.tools.bench.bench_report import publish  # noqa: E402
from cachecompact.tools.cli import main as cli  # noqa: E402
from tests.conftest import SYSTEM, TOOLS, history  # noqa: E402

LOGS = ("transcript.jsonl", "ledger.jsonl", "requests.jsonl")


def canon(o: Any) -> bytes:
    return json.dumps(o, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def build(d: Path) -> str:
    s = Session.create(d, system=SYSTEM, tools=TOOLS)
    for n in range(3, 16):
        s.sync(history(n, n_calls=2))
        if n == 7:
            s.edit(SkipRange(4, 4, "old"), level="L1")
        if n == 12:
            s.edit(ReplaceWithSummary(5, 14, "explored f3..f7"), level="L3")
        s.record_request(s.render(), {"n": n, "cost_usd": 0.001 * n})
    return s.head


def lines(p: Path) -> list[bytes]:
    return p.read_bytes().split(b"\n")[:-1]


def put(p: Path, ls: list[bytes]) -> None:
    p.write_bytes(b"".join(x + b"\n" for x in ls))


def mutate(d: Path, rng: random.Random) -> str:
    """Apply one random change to the session in ``d``; return its name."""
    kind = rng.choice(["flip", "flip", "delete", "swap", "duplicate", "truncate_lines", "truncate_mid",
                       "forge_message", "forge_entry", "forge_request", "meta", "space", "crlf"])
    name = rng.choice(LOGS)
    p = d / name
    ls = lines(p)
    if kind == "space":  # a change re-encoding would not see: a space between two tokens of a record
        i = rng.randrange(len(ls))
        at = [k for k in range(len(ls[i])) if ls[i][k:k + 2] in (b'":', b',"')]
        if at:
            k = rng.choice(at) + 2
            ls[i] = ls[i][:k] + b" " + ls[i][k:]
            put(p, ls)
            return f"add a space inside a record of {name}"
    if kind == "crlf":  # a CR before a line's newline
        i = rng.randrange(len(ls))
        ls[i] += b"\r"
        put(p, ls)
        return f"add a CR before a newline of {name}"
    if kind == "flip":
        target = rng.choice([*LOGS, "session.json"])
        q = d / target
        data = bytearray(q.read_bytes())
        i = rng.randrange(len(data))
        data[i] ^= 1 << rng.randrange(8)
        q.write_bytes(bytes(data))
        return f"flip a bit in {target}"
    if kind == "delete" and len(ls) > 1:
        del ls[rng.randrange(len(ls) - 1)]  # not the last: that is a truncation
        put(p, ls)
        return f"delete a line of {name}"
    if kind == "swap" and len(ls) > 1:
        i = rng.randrange(len(ls) - 1)
        ls[i], ls[i + 1] = ls[i + 1], ls[i]
        put(p, ls)
        return f"swap two lines of {name}"
    if kind == "duplicate":
        i = rng.randrange(len(ls))
        ls.insert(i, ls[i])
        put(p, ls)
        return f"duplicate a line of {name}"
    if kind == "truncate_lines":
        put(p, ls[: rng.randrange(len(ls))])
        return f"truncate {name} by whole lines"
    if kind == "truncate_mid":
        data = p.read_bytes()
        p.write_bytes(data[: rng.randrange(1, len(data) - 1)])
        return f"truncate {name} mid-line"
    if kind == "forge_message":
        t = d / "transcript.jsonl"
        tl = lines(t)
        i = rng.randrange(len(tl))
        rec = json.loads(tl[i])
        rec["m"] = {"role": rec["m"]["role"], "content": "forged " + json.dumps(rec["m"])[:40]}
        import xxhash

        rec["h"] = xxhash.xxh3_128_hexdigest(canon(rec["m"]))
        prev = json.loads(tl[i - 1])["c"] if i else "0" * 64
        rec["c"] = hashlib.sha256(bytes.fromhex(prev) + canon(rec["m"])).hexdigest()  # and the chain value too
        tl[i] = canon(rec)
        put(t, tl)
        return "forge a message with h and c recomputed"
    if kind in ("forge_entry", "forge_request"):
        q = d / ("ledger.jsonl" if kind == "forge_entry" else "requests.jsonl")
        ql = lines(q)
        i = rng.randrange(len(ql))
        rec = json.loads(ql[i])
        key = "reason" if kind == "forge_entry" else "n"
        rec[key] = "forged" if key == "reason" else 999
        body = {k: v for k, v in rec.items() if k != "hash"}
        rec["hash"] = hashlib.sha256(canon(body)).hexdigest()
        ql[i] = canon(rec)
        put(q, ql)
        return f"forge a {'ledger entry' if kind == 'forge_entry' else 'request record'} with its hash recomputed"
    meta = json.loads((d / "session.json").read_bytes())
    field, value = rng.choice([("prefix_hash", None), ("prefix_end", 99), ("prefix_hash", "0" * 32),
                               ("prefix_messages", 1), ("system", "another system prompt"), ("tools", [])])
    meta[field] = value
    (d / "session.json").write_bytes(canon(meta) + b"\n")
    return f"edit session.json {field}"


def verify(d: Path, head: str | None) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = cli(["ledger", "verify", str(d), *(["--head", head] if head else [])])
    return rc, err.getvalue()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--write", metavar="MD")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="cachecompact-tamper-"))
    base = work / "base"
    head = build(base)
    counts: dict[str, dict[str, int]] = {}
    undetected: list[str] = []
    t0 = time.time()
    for k in range(args.trials):
        d = work / f"t{k}"
        shutil.copytree(base, d)
        what = mutate(d, rng)
        c = counts.setdefault(what, {"trials": 0, "detected": 0, "torn": 0, "head_only": 0, "undetected": 0})
        c["trials"] += 1
        rc, err = verify(d, None)
        if rc == 1 and ("INVALID" in err or "error" in err):
            c["detected"] += 1
        elif rc == 2:
            c["detected"] += 1  # refused to open, naming the file and field
        elif "torn" in err:
            with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
                repaired = cli(["ledger", "verify", str(d), "--repair"])
            rc_after, err_after = verify(d, None)
            if repaired == 0 and rc_after == 0 and "torn" not in err_after:
                c["torn"] += 1
            else:
                c["undetected"] += 1
                undetected.append(what + " (repair failed)")
        else:
            rc3, _ = verify(d, head)
            if rc3 == 1:
                c["head_only"] += 1
            else:
                c["undetected"] += 1
                undetected.append(what)
        shutil.rmtree(d)
    wall = time.time() - t0
    rows = ["| change | trials | detected by verify | torn tail (reported, repaired) | only with --head | "
            "undetected |", "|---|---|---|---|---|---|"]
    tot = {"trials": 0, "detected": 0, "torn": 0, "head_only": 0, "undetected": 0}
    for what in sorted(counts):
        c = counts[what]
        rows.append(f"| {what} | {c['trials']} | {c['detected']} | {c['torn']} | {c['head_only']} | "
                    f"{c['undetected']} |")
        for key in tot:
            tot[key] += c[key]
    rows.append(f"| **all** | {tot['trials']} | {tot['detected']} | {tot['torn']} | {tot['head_only']} | "
                f"**{tot['undetected']}** |")
    text = (f"`python benchmarks/tamper.py --trials {args.trials}` ({time.strftime('%Y-%m-%d')}, {wall:.0f} s): "
            "one random change per trial to a copy of a session with 29 messages, 2 ledger edits and 13 request "
            "records.\n\n" + "\n".join(rows))
    shutil.rmtree(work, ignore_errors=True)
    if undetected:
        print("undetected:", sorted(set(undetected)), file=sys.stderr)
    if publish(text, args.write, "tamper"):
        return 1
    return 0 if tot["undetected"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
