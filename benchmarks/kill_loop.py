"""Kill a writer with SIGKILL at random points, over and over, and check what survives.

Each round runs a child process (started ahead of time) that creates sessions (``Session.create``) and appends to
them (transcript syncs, ledger edits, request records), printing one line per acknowledged
write (after the call returned, so after fsync). The parent kills it after a random delay
(a few milliseconds to ~0.3 s, so many kills land inside ``create`` or an append), then opens
every session the child touched and checks:

* every acknowledged write is there (transcript length, ledger entries, request records);
* every session opens and verifies, or was never completely created (no half-made session
  that would block a later ``create`` or ``open``);
* a torn tail is reported and repaired by the next writer.

    python benchmarks/kill_loop.py [--rounds 300] [--write docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CHILD = r"""
import json, sys
sys.path.insert(0, sys.argv[2])
from pathlib import Path
from cachecompact import Session
from cachecompact.base.errors import CacheCompactError
from cachecompact.history.ledger import SkipRange
from tests.conftest import history
root, seed = Path(sys.argv[1]), int(sys.argv[3])
Session.create(None).sync(history(1))  # warm the tokenizer before saying ready
print("ready", flush=True)
sys.stdin.readline()  # wait for "go": children are started ahead, so a round costs no start-up
for k in range(1000):
    sid = f"s{seed}-{k}"
    s = Session.create(root / sid, system="sys", prefix_messages=1)
    print(json.dumps({"sid": sid, "t": 0, "e": 0, "r": 0}), flush=True)
    for n in range(1, 9):
        s.sync(history(n))
        print(json.dumps({"sid": sid, "t": len(s), "e": len(s.ledger), "r": s.requests_recorded}), flush=True)
        if n % 3 == 0:
            try:
                s.edit(SkipRange(2 * n - 2, 2 * n - 2, "old"), level="L1")
            except CacheCompactError:
                pass
            print(json.dumps({"sid": sid, "t": len(s), "e": len(s.ledger), "r": s.requests_recorded}), flush=True)
        s.record_request(s.render(), {"n": n})
        print(json.dumps({"sid": sid, "t": len(s), "e": len(s.ledger), "r": s.requests_recorded}), flush=True)
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--write", metavar="MD")
    args = ap.parse_args()
    from cachecompact import Session
    from cachecompact.base.errors import SessionNotFoundError
    from cachecompact.store import half_made
    from cachecompact.tools.bench.bench_report import publish

    rng = random.Random(args.seed)
    root = Path(tempfile.mkdtemp(prefix="cachecompact-kill-"))
    stats = {"rounds": 0, "acked_writes": 0, "lost": 0, "unusable": 0, "half_made_rebuilt": 0, "torn_seen": 0,
             "sessions": 0, "killed_in_create": 0}
    t0 = time.time()
    def spawn(rnd: int) -> subprocess.Popen[str]:
        rdir = root / f"r{rnd}"
        rdir.mkdir()
        return subprocess.Popen([sys.executable, "-c", CHILD, str(rdir), str(ROOT), str(rnd)],
                                stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True, cwd=ROOT)

    ahead = [spawn(k) for k in range(min(2, args.rounds))]
    for rnd in range(args.rounds):
        rdir = root / f"r{rnd}"
        p = ahead.pop(0)
        if rnd + 2 < args.rounds:
            ahead.append(spawn(rnd + 2))
        assert p.stdout is not None and p.stdin is not None
        ready = p.stdout.readline()
        assert ready.strip() == "ready", ready
        p.stdin.write("go\n")
        p.stdin.flush()
        time.sleep(rng.random() * 0.3)  # then kill anywhere: in create, in an append, between
        p.send_signal(signal.SIGKILL)
        out, _ = p.communicate()
        stats["rounds"] += 1
        acked: dict[str, dict[str, int]] = {}
        for line in out.splitlines():
            rec = json.loads(line)
            acked[rec["sid"]] = rec
            stats["acked_writes"] += 1
        for d in rdir.iterdir():
            name = d.name
            if name.startswith("."):  # a creation that was killed before its rename: invisible by design
                stats["killed_in_create"] += 1
                continue
            stats["sessions"] += 1
            if half_made(d):
                stats["half_made_rebuilt"] += 1
            try:
                s = Session.open(d)
            except SessionNotFoundError:
                if name in acked:
                    stats["lost"] += 1
                continue
            except Exception as err:
                print(f"round {rnd}: {name} cannot be opened: {err}", file=sys.stderr)
                stats["unusable"] += 1
                continue
            stats["torn_seen"] += len(s.torn)
            a = acked.get(name)
            if a is not None and (len(s) < a["t"] or len(s.ledger) < a["e"] or s.requests_recorded < a["r"]):
                print(f"round {rnd}: {name} lost acknowledged writes: stored {len(s)}/{len(s.ledger)}/"
                      f"{s.requests_recorded}, acknowledged {a}", file=sys.stderr)
                stats["lost"] += 1
            # the next writer repairs a torn tail and goes on
            s.sync([*s.messages(), *([{"role": "assistant", "content": "resumed"}]
                                     if s.messages() and s.messages()[-1]["role"] == "user" else [])])
        # a creation killed half-way never blocks creating the same session again
        for name in [n for n in acked if not (rdir / n).is_dir()]:
            Session.create(rdir / name, system="sys")
    wall = time.time() - t0
    text = (f"`python benchmarks/kill_loop.py --rounds {args.rounds}` ({time.strftime('%Y-%m-%d')}, {wall:.0f} s): "
            f"{stats['rounds']} SIGKILLs of a writer at random points; {stats['acked_writes']} acknowledged writes "
            f"in {stats['sessions']} sessions; **{stats['lost']} lost**, **{stats['unusable']} unusable "
            f"sessions**; {stats['killed_in_create']} kills left a hidden half-built directory (invisible, and "
            f"creation works again); {stats['torn_seen']} torn tails reported and repaired by the next writer.")
    if stats["lost"] or stats["unusable"]:
        print(f"sessions kept for inspection in {root}", file=sys.stderr)
    else:
        shutil.rmtree(root, ignore_errors=True)
    if publish(text, args.write, "kill_loop"):
        return 1
    return 0 if stats["lost"] == 0 and stats["unusable"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
