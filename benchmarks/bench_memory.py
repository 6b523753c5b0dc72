"""Peak memory of the emulator and both proxy modes for the largest bodies they accept.

Each server runs as its own process (``cachecompact serve`` / ``cachecompact proxy``), a fresh
one for every body, so no body's leftovers count against the next. After a small warm-up
request its resident memory is the idle figure; then the body is sent and the process's peak
resident memory (``VmHWM``) is read. Reported: the peak above idle per body, and the status
the server answered. The goal (issue 25): under 300 MB above idle for any body up to the
32 MB cap, decompressed or not.

Bodies: one 30 MB user message; 30 MB as 20,000 messages; a body just under the cap; a 40 MB
body (over the cap: 413); and a gzip bomb (about 1 GB of JSON compressed to about 1 MB).

    python benchmarks/bench_memory.py [--write docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx2

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cachecompact.adapters.httpserver import MAX_BODY  # noqa: E402
from cachecompact.tools.bench.bench_report import publish  # noqa: E402

MODEL = "claude-sonnet-4-6"
MB = 1 << 20


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _status(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def _wait(url: str) -> None:
    for _ in range(200):
        try:
            httpx2.get(url + "/v1/models", timeout=1)
            return
        except httpx2.HTTPError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not start")


def _bodies() -> dict[str, tuple[bytes, dict[str, str]]]:
    json_ct = {"content-type": "application/json"}
    one = json.dumps({"model": MODEL, "max_tokens": 5, "messages": [
        {"role": "user", "content": "word " * (30 * MB // 5)}]}).encode()
    many_msgs = []
    for k in range(20_000):
        many_msgs.append({"role": "user" if k % 2 == 0 else "assistant", "content": f"m{k} " + "x" * 1500})
    many_msgs.append({"role": "user", "content": "go"})
    many = json.dumps({"model": MODEL, "max_tokens": 5, "messages": many_msgs}).encode()
    head = {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": ""}]}
    base = len(json.dumps(head).encode())
    near = json.dumps({**head, "messages": [{"role": "user", "content": "y" * (MAX_BODY - base - 1024)}]}).encode()
    over = json.dumps({**head, "messages": [{"role": "user", "content": "z" * (40 * MB)}]}).encode()
    bomb_src = b'{"model":"' + MODEL.encode() + b'","max_tokens":5,"messages":[{"role":"user","content":"' \
        + b"0" * (1024 * MB) + b'"}]}'
    bomb = gzip.compress(bomb_src, compresslevel=9)
    del bomb_src
    return {"30 MB, one message": (one, json_ct), "30 MB, 20,000 messages": (many, json_ct),
            f"{len(near) / MB:.1f} MB, at the cap": (near, json_ct), "40 MB, over the cap": (over, json_ct),
            f"gzip bomb ({len(bomb) / MB:.1f} MB to 1 GB)": (bomb, {**json_ct, "content-encoding": "gzip"})}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--write", help="update the bench_memory section of this markdown file")
    args = ap.parse_args()
    bodies = _bodies()
    exe = [sys.executable, "-m", "cachecompact.tools.cli"]
    rows = []

    def start(args: list[str]) -> tuple[subprocess.Popen[bytes], str]:
        port = _port()
        p = subprocess.Popen([*exe, *args, "--port", str(port)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        _wait(url)
        return p, url

    with tempfile.TemporaryDirectory(prefix="cachecompact-mem-") as tmp, \
            httpx2.Client(timeout=120, headers={"x-api-key": "k", "anthropic-version": "2023-06-01"}) as c:
        for body, (raw, headers) in bodies.items():
            for name in ("emulator", "proxy observe", "proxy compact"):
                procs = []
                try:
                    emu, emu_url = start(["serve"])
                    procs.append(emu)
                    p, url = emu, emu_url
                    if name != "emulator":
                        mode = name.split()[1]
                        p, url = start(["proxy", "--mode", mode, "--upstream", emu_url, "--store",
                                        os.path.join(tmp, f"{mode}-{len(rows)}")])
                        procs.append(p)
                    c.post(url + "/v1/messages", json={"model": MODEL, "max_tokens": 5, "messages": [
                        {"role": "user", "content": "warm up"}]})
                    time.sleep(0.5)
                    idle = _status(p.pid, "VmRSS")
                    t0 = time.perf_counter()
                    r = c.post(url + "/v1/messages", content=raw, headers=headers)
                    took = time.perf_counter() - t0
                    time.sleep(1.0)  # a proxy analyses after the response
                    peak = _status(p.pid, "VmHWM")
                    rows.append((name, body, r.status_code, (peak - idle) / MB, idle / MB, took))
                finally:
                    for q in procs:
                        q.terminate()
                    for q in procs:
                        q.wait(10)
    worst = max(r[3] for r in rows)
    lines = ["Each server in a fresh process per body; peak resident memory (VmHWM) above the idle resident "
             "memory after a warm-up request.", "",
             "| server | body | status | peak above idle | idle | time |", "|---|---|---:|---:|---:|---:|"]
    lines += [f"| {s} | {b} | {st} | {d:.0f} MB | {i:.0f} MB | {t:.1f} s |" for s, b, st, d, i, t in rows]
    lines += ["", f"- Largest peak above idle: **{worst:.0f} MB** (goal < 300 MB)."]
    return publish("\n".join(lines), args.write, "bench_memory")


if __name__ == "__main__":
    sys.exit(main())
