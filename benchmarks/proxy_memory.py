"""Proxy memory against its byte cap: resident memory after many sessions, with and without
``--max-memory``, in both modes (issue 46: memory was capped by session count only, 135 -> 292 MB
for 64 sessions).

Each case runs in a fresh process: an emulator and a proxy on a file store, ``--sessions``
conversations of ``--turns`` turns whose user turns carry ``--kib`` KiB of output each, sent one
conversation after another. It reports the resident memory the run added, the estimate the proxy
keeps (`Live.nbytes`, `ObservedSession.nbytes`), and their ratio, which is what the estimates'
factors are checked against.

    python benchmarks/proxy_memory.py [--sessions 64 --turns 20 --kib 10] [--write docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

MARK = "proxy_memory"


def _peak_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM"):
            return int(line.split()[1]) / 1024
    return float("nan")


def one(mode: str, cap: int, sessions: int, turns: int, kib: int) -> dict[str, float]:
    """One case: the emulator in a process of its own, the proxy here, and Python's own count of
    the memory the proxy still holds after the run (tracemalloc), beside the process's peak."""
    import httpx2

    from cachecompact.adapters.httpserver import spawn_cli_server
    from cachecompact.adapters.proxy import Proxy, ProxyConfig

    filler = ("line of tool output, as agents read it back\n" * 24) * kib
    emu, emu_url = spawn_cli_server(["serve", "--port", "0"], quiet=True)
    try:
        with tempfile.TemporaryDirectory() as d, \
                Proxy(ProxyConfig(upstream=emu_url, port=0, mode=mode, store=d, max_memory_mb=cap)) as px, \
                httpx2.Client(base_url=px.url, timeout=60,
                              headers={"x-api-key": "k", "anthropic-version": "2023-06-01"}) as c:
            gc.collect()
            tracemalloc.start()
            history_bytes = 0
            for s in range(sessions):
                msgs: list[dict[str, object]] = [{"role": "user", "content": f"session {s}: audit the repository"}]
                for t in range(turns):
                    r = c.post("/v1/messages", json={"model": "claude-sonnet-4-6", "max_tokens": 10,
                                                     "messages": msgs})
                    assert r.status_code == 200, r.text
                    msgs = [*msgs, {"role": "assistant", "content": f"reading part {t}"},
                            {"role": "user", "content": f"session {s} turn {t}\n{filler}"}]
                history_bytes += len(json.dumps(msgs))
            px.wait_idle()
            del msgs
            gc.collect()
            held, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            st = px.state
            est = sum(x.nbytes for x in st.observer.sessions())
            if st.engine is not None:
                est += sum(x.nbytes for x in st.engine.registry.sessions())
            kept = len(st.engine.registry.sessions()) if st.engine is not None else len(st.observer.sessions())
    finally:
        emu.terminate()
        emu.wait(20)
    return {"held_mb": held / 2**20, "peak_mb": peak / 2**20, "rss_peak_mb": _peak_rss_mb(),
            "estimate_mb": est / 2**20, "history_mb": history_bytes / 2**20, "kept": kept}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--sessions", type=int, default=64)
    ap.add_argument("--turns", type=int, default=20)
    ap.add_argument("--kib", type=int, default=10)
    ap.add_argument("--write", metavar="MD")
    ap.add_argument("--one", nargs=2, metavar=("MODE", "CAP"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(one(a.one[0], int(a.one[1]), a.sessions, a.turns, a.kib)))
        return
    t0 = time.time()
    rows = []
    for mode in ("observe", "compact"):
        for cap in (4096, 32, 8):
            out = subprocess.run([sys.executable, __file__, "--one", mode, str(cap), "--sessions", str(a.sessions),
                                  "--turns", str(a.turns), "--kib", str(a.kib)], capture_output=True, text=True,
                                 check=True)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            rows.append((mode, cap, r))
            print(mode, cap, r, flush=True)
    lines = [f"`python benchmarks/proxy_memory.py --sessions {a.sessions} --turns {a.turns} --kib {a.kib}` "
             f"({time.strftime('%Y-%m-%d')}, {time.time() - t0:.0f} s): {a.sessions} conversations sent one after "
             "another to a proxy on a file store, the upstream in a process of its own, each case in a fresh "
             "process. *Held* is the memory Python counts as still allocated after the run (tracemalloc), *peak* "
             "its highest during the run, *estimate* what the byte cap counts (`Live.nbytes` + "
             "`ObservedSession.nbytes`).", "",
             "| mode | --max-memory | histories sent | held | peak | estimate | sessions kept | held / estimate |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for mode, cap, r in rows:
        lines.append(f"| {mode} | {cap} MB | {r['history_mb']:.1f} MB | {r['held_mb']:.1f} MB | "
                     f"{r['peak_mb']:.1f} MB | {r['estimate_mb']:.1f} MB | {r['kept']:.0f} | "
                     f"{r['held_mb'] / max(r['estimate_mb'], 1e-9):.2f}x |")
    text = "\n".join(lines)
    print(text)
    if a.write:
        p = Path(a.write)
        doc = p.read_text()
        start, end = f"<!-- {MARK}:start -->", f"<!-- {MARK}:end -->"
        if start in doc:
            doc = doc[:doc.index(start) + len(start)] + "\n" + text + "\n" + doc[doc.index(end):]
        else:
            doc += f"\n## Proxy memory under its byte cap\n\n```bash\npython benchmarks/proxy_memory.py --write " \
                   f"docs/benchmarks.md\n```\n\n{start}\n{text}\n{end}\n"
        p.write_text(doc)


if __name__ == "__main__":
    main()
