"""What the proxy adds, measured side by side in one run: latency, stream TTFB, throughput, memory.

Three processes over loopback: the emulator (``cachecompact serve``), the proxy in observe mode
(``cachecompact proxy``) and this load generator (aiohttp, keep-alive). Every measurement
alternates direct (to the emulator) and proxied requests, so machine noise hits both alike.

* latency: sequential small JSON ``POST /v1/messages``; added p50/p99 = proxied - direct;
* TTFB: sequential streaming requests; time to the first body byte (the SSE ``message_start``);
* throughput: 100 concurrent streaming clients, 20 requests each, five rounds each way
  alternating; median requests/s proxied / direct, and every response checked (no errors);
* memory: the proxy's RSS after a warm-up and after 10,000 requests.

``--mode compact`` measures instead a proxy in each mode side by side with direct, in one run, on
growing conversations (``--sessions`` of ``--turns`` turns, each user turn ``--kib`` KiB of tool
output, the whole history sent each turn as agents do; ``--window`` small enough that the long
ones compact): for each number of concurrent streaming clients in ``--concurrency``, the three
paths in turn (the order rotating), each on conversations of its own, with throughput, p50/p99
per request, the proxies' CPU-seconds per request (from /proc) and their RSS. ``--digest``
sends the same conversations one at a time through an in-process compact proxy with a fixed
clock and prints a SHA-256 over every body it sent upstream: the A/B check that a change left
the requests byte for byte as they were (run it on both commits).

    python benchmarks/bench_proxy.py [--requests 2000] [--write docs/benchmarks.md]
    python benchmarks/bench_proxy.py --mode compact [--sessions 64 --turns 100 --concurrency 16,32,64]
    python benchmarks/bench_proxy.py --digest [--sessions 8 --turns 100]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cachecompact.adapters.httpserver import spawn_cli_server as _start  # noqa: E402
from cachecompact.tools.bench.bench_report import publish  # noqa: E402

BODY = {"model": "claude-haiku-4-5", "max_tokens": 16,
        "system": [{"type": "text", "text": "You are a terse assistant. " * 200,
                    "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": "Say ok."}]}


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * (len(s) - 1)))]


async def _one(http: aiohttp.ClientSession, url: str, body: bytes, stream: bool) -> tuple[float, float]:
    """(total seconds, seconds to the first body byte) of one request; raises on an error status."""
    t0 = time.perf_counter()
    async with http.post(url + "/v1/messages", data=body, headers={"content-type": "application/json",
                                                                    "anthropic-version": "2023-06-01",
                                                                    "x-api-key": "bench"}) as r:
        first = None
        async for _chunk in r.content.iter_any():
            if first is None:
                first = time.perf_counter()
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}")
    t1 = time.perf_counter()
    return t1 - t0, (first or t1) - t0


async def _latency(direct: str, proxy: str, n: int, stream: bool) -> dict[str, list[float]]:
    body = json.dumps({**BODY, "stream": stream}).encode()
    out: dict[str, list[float]] = {"direct": [], "proxy": [], "direct_ttfb": [], "proxy_ttfb": []}
    async with aiohttp.ClientSession() as http:
        for _ in range(100):  # warm-up: connections, caches, the emulator's memo
            await _one(http, direct, body, stream)
            await _one(http, proxy, body, stream)
        for k in range(n):
            order = [("direct", direct), ("proxy", proxy)] if k % 2 == 0 else [("proxy", proxy), ("direct", direct)]
            for name, url in order:
                total, ttfb = await _one(http, url, body, stream)
                out[name].append(total)
                out[name + "_ttfb"].append(ttfb)
    return out


async def _throughput(url: str, clients: int, per_client: int) -> tuple[float, int]:
    body = json.dumps({**BODY, "stream": True}).encode()
    errors = 0
    conn = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=conn) as http:
        async def worker() -> None:
            nonlocal errors
            for _ in range(per_client):
                try:
                    await _one(http, url, body, True)
                except Exception:
                    errors += 1
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        return clients * per_client / (time.perf_counter() - t0), errors


async def _flood(url: str, n: int, clients: int = 20) -> int:
    body = json.dumps(BODY).encode()
    errors = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients)) as http:
        async def worker(k: int) -> None:
            nonlocal errors
            for _ in range(k):
                try:
                    await _one(http, url, body, False)
                except Exception:
                    errors += 1
        await asyncio.gather(*(worker(n // clients) for _ in range(clients)))
    return errors


SYSTEM = [{"type": "text", "text": "You are a coding agent. Read files, run tools, answer tersely. " * 40,
           "cache_control": {"type": "ephemeral"}}]
FILLER = "line of tool output, as agents read it back: src/module.py:42: def handler(request):\n" * 12


def _turns(tag: str, turns: int, kib: int) -> list[bytes]:
    """The request bodies of one growing conversation, as a client sends them: the whole history
    each turn, a user turn of ``kib`` KiB of tool output after each assistant turn."""
    filler = FILLER * max(1, kib)
    msgs: list[dict[str, Any]] = [{"role": "user", "content": f"conversation {tag}: audit the repository"}]
    out = []
    for t in range(turns):
        out.append(json.dumps({"model": "claude-haiku-4-5", "max_tokens": 16, "stream": True, "system": SYSTEM,
                               "messages": msgs}).encode())
        msgs = [*msgs, {"role": "assistant", "content": f"reading part {t} of the repository"},
                {"role": "user", "content": f"{tag} turn {t}\n{filler}"}]
    return out


async def _conversations(url: str, tag: str, sessions: int, turns: int, kib: int, clients: int
                         ) -> tuple[float, list[float], int]:
    """``sessions`` conversations over ``clients`` concurrent streaming clients (each takes the
    next conversation when its own ends): requests/s, each request's seconds, errors."""
    todo = list(range(sessions))
    lat: list[float] = []
    errors = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients)) as http:
        async def worker() -> None:
            nonlocal errors
            while todo:
                k = todo.pop()
                for body in _turns(f"{tag}-{k}", turns, kib):
                    try:
                        total, _ = await _one(http, url, body, True)
                        lat.append(total)
                    except Exception:
                        errors += 1
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        return len(lat) / (time.perf_counter() - t0), lat, errors


def _cpu_s(pid: int) -> float:
    """User + system CPU-seconds a process has used so far."""
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def _settle(pids: list[int], quiet_s: float = 0.02, every: float = 0.5, at_most: float = 120.0) -> None:
    """Wait until none of ``pids`` used more than ``quiet_s`` CPU-seconds in ``every`` seconds: a
    proxy's analysis thread finishes the work queued by one path before the next path is timed."""
    t_end = time.perf_counter() + at_most
    last = sum(_cpu_s(p) for p in pids)
    while time.perf_counter() < t_end:
        time.sleep(every)
        now = sum(_cpu_s(p) for p in pids)
        if now - last < quiet_s:
            return
        last = now


def compact_main(args: argparse.Namespace) -> int:
    import tempfile

    levels = [int(x) for x in args.concurrency.split(",")]
    t_start = time.perf_counter()
    emu, emu_url = _start(["serve", "--port", "0"])
    with tempfile.TemporaryDirectory() as d:
        obs, obs_url = _start(["proxy", "--port", "0", "--upstream", emu_url, "--store", f"{d}/observe"])
        cmp_, cmp_url = _start(["proxy", "--port", "0", "--upstream", emu_url, "--mode", "compact",
                                "--store", f"{d}/compact", "--window", str(args.window)])
        paths = [("direct", emu_url, emu), ("observe", obs_url, obs), ("compact", cmp_url, cmp_)]
        rows = []
        errs = 0
        try:
            rss0 = {name: _rss_mb(p.pid) for name, _, p in paths}
            for i, clients in enumerate(levels):
                res: dict[str, dict[str, float]] = {}
                for j in range(3):  # the order rotates with each level
                    name, url, proc = paths[(i + j) % 3]
                    _settle([p.pid for _, _, p in paths])
                    cpu0 = _cpu_s(proc.pid)
                    rps, lat, e = asyncio.run(_conversations(url, f"{name}{clients}", args.sessions, args.turns,
                                                             args.kib, clients))
                    errs += e
                    _settle([proc.pid])  # its CPU includes the analysis its requests queued
                    res[name] = {"rps": rps, "p50": _pct(lat, 0.5) * 1000, "p99": _pct(lat, 0.99) * 1000,
                                 "cpu_ms": 1000 * (_cpu_s(proc.pid) - cpu0) / max(1, len(lat)), "n": len(lat)}
                    print(clients, name, {k: round(v, 2) for k, v in res[name].items()}, f"{e} errors", flush=True)
                rows.append((clients, res))
            time.sleep(2)  # the analysis threads finish
            rss1 = {name: _rss_mb(p.pid) for name, _, p in paths}
        finally:
            for _, _, p in reversed(paths):
                p.terminate()
                p.wait(10)
    lines = [
        f"Measured {time.strftime('%Y-%m-%d')} on {os.cpu_count()} cores, one run of "
        f"`python benchmarks/bench_proxy.py --mode compact --sessions {args.sessions} --turns {args.turns} "
        f"--kib {args.kib} --window {args.window} --concurrency {args.concurrency}` "
        f"({time.perf_counter() - t_start:.0f} s): at each level, {args.sessions} conversations of {args.turns} "
        f"turns ({args.kib} KiB of tool output a turn, the whole history sent each turn, streaming) to each "
        "path in turn, the order rotating, each once the processes are quiet; both proxies on a file store, the "
        "emulator upstream. CPU is the serving process's own per request (the emulator's for direct), the "
        "analysis its requests queued included; the load generator shares the 2 cores.", "",
        "| clients | direct req/s | observe req/s | compact req/s | observe / direct | compact / direct | "
        "p50 direct / observe / compact | p99 direct / observe / compact | CPU ms/req direct / observe / compact |",
        "|---:|---:|---:|---:|---:|---:|---|---|---|"]
    for clients, r in rows:
        d, o, c = r["direct"], r["observe"], r["compact"]
        lines.append(f"| {clients} | {d['rps']:.0f} | {o['rps']:.0f} | {c['rps']:.0f} | {o['rps'] / d['rps']:.2f}x | "
                     f"{c['rps'] / d['rps']:.2f}x | {d['p50']:.1f} / {o['p50']:.1f} / {c['p50']:.1f} ms | "
                     f"{d['p99']:.1f} / {o['p99']:.1f} / {c['p99']:.1f} ms | "
                     f"{d['cpu_ms']:.2f} / {o['cpu_ms']:.2f} / {c['cpu_ms']:.2f} |")
    lines += ["", f"{errs} errors. RSS before and after: observe {rss0['observe']:.0f} -> {rss1['observe']:.0f} MB, "
              f"compact {rss0['compact']:.0f} -> {rss1['compact']:.0f} MB "
              f"({len(levels) * args.sessions} sessions each)."]
    return publish("\n".join(lines), args.write, "bench_proxy_compact")


def digest_main(args: argparse.Namespace) -> int:
    """A SHA-256 over every body an in-process compact proxy sends upstream for the bench's
    conversations, sent one at a time with a fixed clock (`--digest`)."""
    import hashlib
    import tempfile

    import httpx2

    from cachecompact.adapters.proxy import Proxy, ProxyConfig
    from cachecompact.adapters.proxy._handlers import Handlers
    from cachecompact.base.headers import CLOCK_HEADER

    h = hashlib.sha256()
    sent = 0
    original = Handlers.send

    async def send(self: Handlers, request: Any, data: bytes, headers: list[tuple[str, str]]) -> Any:
        nonlocal sent
        if request.path == "/v1/messages":
            h.update(len(data).to_bytes(8, "big") + data)
            sent += 1
        return await original(self, request, data, headers)

    Handlers.send = send  # type: ignore[method-assign]
    emu, emu_url = _start(["serve", "--port", "0"])
    try:
        with tempfile.TemporaryDirectory() as d, \
                Proxy(ProxyConfig(upstream=emu_url, port=0, mode="compact", store=d,
                                  window_tokens=args.window)) as px, \
                httpx2.Client(base_url=px.url, timeout=120) as c:
            for k in range(args.sessions):
                for t, body in enumerate(_turns(f"digest-{k}", args.turns, args.kib)):
                    r = c.post("/v1/messages", content=body, headers={
                        "x-api-key": "k", "anthropic-version": "2023-06-01", "content-type": "application/json",
                        CLOCK_HEADER: str(1_800_000_000 + 86_400 * k + 20 * t)})
                    assert r.status_code == 200, r.text
                    px.wait_idle()
    finally:
        Handlers.send = original  # type: ignore[method-assign]
        emu.terminate()
        emu.wait(10)
    print(f"{sent} bodies sent upstream, sha256 {h.hexdigest()}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=2000, help="sequential requests per path for latency")
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--per-client", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5, help="throughput rounds each way, alternating; the median")
    ap.add_argument("--memory-requests", type=int, default=10_000)
    ap.add_argument("--write", metavar="MD", help="update the proxy section of this markdown file")
    ap.add_argument("--mode", choices=("observe", "compact"), default="observe",
                    help="compact: direct, observe and compact side by side on growing conversations")
    ap.add_argument("--digest", action="store_true", help="the SHA-256 of what compact mode sends upstream")
    ap.add_argument("--sessions", type=int, default=64, help="--mode compact: conversations per path and level")
    ap.add_argument("--turns", type=int, default=100, help="--mode compact: turns per conversation")
    ap.add_argument("--kib", type=int, default=1, help="--mode compact: KiB of tool output per user turn")
    ap.add_argument("--window", type=int, default=24_000, help="--mode compact: the compact proxy's --window")
    ap.add_argument("--concurrency", default="16,32,64", help="--mode compact: concurrent clients, comma-separated")
    args = ap.parse_args()
    if args.digest:
        return digest_main(args)
    if args.mode == "compact":
        return compact_main(args)
    emu, emu_url = _start(["serve", "--port", "0"])
    px, px_url = _start(["proxy", "--port", "0", "--upstream", emu_url])
    try:
        json_lat = asyncio.run(_latency(emu_url, px_url, args.requests, stream=False))
        sse_lat = asyncio.run(_latency(emu_url, px_url, args.requests // 2, stream=True))
        thr: dict[str, list[float]] = {"direct": [], "proxy": []}
        errs = 0
        for rnd in range(args.rounds):  # alternate which goes first
            for name, url in ([("direct", emu_url), ("proxy", px_url)] if rnd % 2 == 0 else
                              [("proxy", px_url), ("direct", emu_url)]):
                rps, e = asyncio.run(_throughput(url, args.clients, args.per_client))
                thr[name].append(rps)
                errs += e
        rss0 = _rss_mb(px.pid)
        flood_errors = asyncio.run(_flood(px_url, args.memory_requests))
        time.sleep(2)  # let the analysis thread finish
        rss1 = _rss_mb(px.pid)
    finally:
        for p in (px, emu):
            p.terminate()
            p.wait(10)
    ms = 1000.0
    res: dict[str, Any] = {
        "json_direct_p50": _pct(json_lat["direct"], 0.5) * ms, "json_proxy_p50": _pct(json_lat["proxy"], 0.5) * ms,
        "json_direct_p99": _pct(json_lat["direct"], 0.99) * ms, "json_proxy_p99": _pct(json_lat["proxy"], 0.99) * ms,
        "ttfb_direct_p50": _pct(sse_lat["direct_ttfb"], 0.5) * ms,
        "ttfb_proxy_p50": _pct(sse_lat["proxy_ttfb"], 0.5) * ms,
        "ttfb_direct_p99": _pct(sse_lat["direct_ttfb"], 0.99) * ms,
        "ttfb_proxy_p99": _pct(sse_lat["proxy_ttfb"], 0.99) * ms,
        "thr_direct": statistics.median(thr["direct"]), "thr_proxy": statistics.median(thr["proxy"]),
        "thr_errors": errs, "rss_before_mb": rss0, "rss_after_mb": rss1, "flood_errors": flood_errors,
    }
    res["added_p50"] = res["json_proxy_p50"] - res["json_direct_p50"]
    res["added_p99"] = res["json_proxy_p99"] - res["json_direct_p99"]
    res["added_ttfb_p50"] = res["ttfb_proxy_p50"] - res["ttfb_direct_p50"]
    res["thr_ratio"] = res["thr_proxy"] / res["thr_direct"]
    res["rss_growth_mb"] = rss1 - rss0
    text = "\n".join([
        f"Measured {time.strftime('%Y-%m-%d')} on {os.cpu_count()} cores, one run, direct and proxied alternating "
        f"(`python benchmarks/bench_proxy.py`). Observe mode; the emulator is the upstream.",
        "",
        "| measure | direct | through the proxy | added | target |",
        "|---|---|---|---|---|",
        f"| JSON latency p50 ({args.requests} sequential) | {res['json_direct_p50']:.2f} ms | "
        f"{res['json_proxy_p50']:.2f} ms | {res['added_p50']:+.2f} ms | <= 1 ms |",
        f"| JSON latency p99 | {res['json_direct_p99']:.2f} ms | {res['json_proxy_p99']:.2f} ms | "
        f"{res['added_p99']:+.2f} ms | <= 5 ms |",
        f"| stream time to first byte p50 ({args.requests // 2} sequential) | {res['ttfb_direct_p50']:.2f} ms | "
        f"{res['ttfb_proxy_p50']:.2f} ms | {res['added_ttfb_p50']:+.2f} ms | <= 1 ms |",
        f"| stream time to first byte p99 | {res['ttfb_direct_p99']:.2f} ms | {res['ttfb_proxy_p99']:.2f} ms | "
        f"{res['ttfb_proxy_p99'] - res['ttfb_direct_p99']:+.2f} ms | |",
        f"| throughput, {args.clients} concurrent streaming clients x {args.per_client} requests "
        f"(median of {args.rounds} rounds) | {res['thr_direct']:.0f} req/s | "
        f"{res['thr_proxy']:.0f} req/s | {res['thr_ratio']:.2f}x, {errs} errors | >= 0.80x, 0 errors |",
        f"| proxy RSS over {args.memory_requests:,} requests | {res['rss_before_mb']:.1f} MB | "
        f"{res['rss_after_mb']:.1f} MB | {res['rss_growth_mb']:+.1f} MB, {flood_errors} errors | <= 20 MB |",
    ])
    return publish(text, args.write, "bench_proxy")


if __name__ == "__main__":
    sys.exit(main())
