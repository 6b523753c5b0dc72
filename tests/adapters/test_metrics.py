"""``GET /metrics``: the proxy's totals in the Prometheus text format, read back with the
Prometheus client's own parser, and the same auth rule as ``/api``."""

from __future__ import annotations

from typing import Any

import anthropic
import httpx2
from prometheus_client.parser import text_string_to_metric_families

from cachecompact.adapters.proxy import Proxy, ProxyConfig
from cachecompact.base.headers import CLOCK_HEADER
from cachecompact.tools.emulator import Emulator

from ..conftest import API_VERSION

MODEL = "claude-sonnet-4-6"
CC = {"type": "ephemeral"}
SYSTEM = [{"type": "text", "text": "You are a careful agent. " * 300, "cache_control": CC}]


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _send(c: anthropic.Anthropic, t: float, text: str, session: str = "m") -> None:
    c.messages.create(model=MODEL, max_tokens=30, system=SYSTEM,
                      messages=[{"role": "user", "content": [{"type": "text", "text": text, "cache_control": CC}]}],
                      extra_headers={CLOCK_HEADER: str(t), "x-cachecompact-session": session})


def test_metrics_parse_and_add_up_to_the_dashboards_numbers() -> None:
    with Emulator() as emu, Proxy(ProxyConfig(upstream=emu.url, port=0)) as px, \
            httpx2.Client(base_url=px.url, headers=API_VERSION) as http:
        c = anthropic.Anthropic(base_url=px.url, api_key="k", max_retries=0)
        _send(c, 1000, "read the repository and fix the bug " * 40)
        _send(c, 1010, "read the repository and fix the bug " * 40)  # the cache is warm
        _send(c, 2000, "read the repository and fix the bug " * 40)  # idle past the 5-minute TTL
        px.wait_idle()
        r = http.get("/metrics")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=0.0.4")
        got = _samples(r.text)
        sessions = http.get("/api/sessions").json()["sessions"]
    mode = (("mode", "observe"),)
    # the parser reports a counter's samples under its name with the _total suffix
    assert got[("cachecompact_requests_total", mode)] == 3
    assert got[("cachecompact_request_errors_total", mode)] == 0
    assert got[("cachecompact_sessions", mode)] == 1
    s = sessions[0]
    assert abs(got[("cachecompact_cost_usd_total", mode)] - s["cost_usd"]) < 1e-6
    assert abs(got[("cachecompact_cache_wasted_usd_total", mode)] - s["wasted_usd"]) < 1e-6
    assert got[("cachecompact_cache_misses_total", (("class", "ttl_expiry"), *mode))] == s["misses"]["ttl_expiry"] == 1
    kinds = {dict(k[1])["kind"]: v for k, v in got.items() if k[0] == "cachecompact_tokens_total"}
    assert set(kinds) == {"input", "cache_read", "cache_write", "output"}
    assert kinds["cache_read"] > 0 and kinds["cache_write"] > 0 and kinds["output"] > 0


def test_metrics_take_the_dashboards_token() -> None:
    with Emulator() as emu, Proxy(ProxyConfig(upstream=emu.url, port=0, auth_token="t0ken")) as px, \
            httpx2.Client(base_url=px.url, headers=API_VERSION) as http:
        assert http.get("/metrics").status_code == 401
        ok: Any = http.get("/metrics", headers={"authorization": "Bearer t0ken"})
        assert ok.status_code == 200 and "cachecompact_requests_total" in ok.text
