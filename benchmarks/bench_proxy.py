"""What the proxy adds, measured side by side in one run: latency, stream TTFB, throughput, memory.

Three processes over loopback: the emulator (``cachecompact serve``), the proxy in observe mode
(``cachecompact proxy``) and this load generator (aiohttp, keep-alive). Every measurement
alternates direct (to the emulator) and proxied requests, so machine noise hits both alike.

* latency: sequential small JSON ``POST /v1/messages``; added p50/p99 = proxied - direct;
* TTFB: sequential streaming requests; time to the first body byte (the SSE ``message_start``);
* throughput: 100 concurrent streaming clients, 20 requests each, five rounds each way
  alternating; median requests/s proxied / direct, and every response checked (no errors);
* memory: the proxy's RSS after a warm-up and after 10,000 requests.

    python benchmarks/bench_proxy.py [--requests 2000] [--write docs/benchmarks.md]
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=2000, help="sequential requests per path for latency")
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--per-client", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5, help="throughput rounds each way, alternating; the median")
    ap.add_argument("--memory-requests", type=int, default=10_000)
    ap.add_argument("--write", metavar="MD", help="update the proxy section of this markdown file")
    args = ap.parse_args()
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
