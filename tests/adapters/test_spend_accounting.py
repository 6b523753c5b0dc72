"""Every dollar and every refusal is shown (issue 62, item 5).

Measured on the compact proxy with Claude Code: the dashboard and ``/metrics`` left out the
proxy's own summary calls ($0.8384 against `report`'s $0.8814), and the requests the proxy
refused itself were counted in ``/metrics`` alone: no session had them, and a conversation whose
every request was refused was listed nowhere. Here the dashboard's API, ``/metrics`` and
`report` read the same store and agree to the cent."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import pytest

from cachecompact.adapters.proxy import Proxy, ProxyConfig
from cachecompact.base.headers import CLOCK_HEADER, SESSION_HEADER
from cachecompact.store import FileStore
from cachecompact.tools.emulator import Emulator, ScriptedResponder, SummarizingResponder
from cachecompact.tools.emulator.responders import Reply
from cachecompact.tools.session_report import conversation_data, conversation_segments, session_report

MODEL = "claude-sonnet-4-6"
API = {"anthropic-version": "2023-06-01", "x-api-key": "k"}
TOOLS = [{"name": "read", "description": "read a file", "input_schema": {"type": "object"}}]


def _metric(text: str, name: str) -> float:
    m = re.search(rf"^{name}{{mode=\"compact\"}} (\S+)$", text, re.M)
    assert m is not None, (name, text)
    return float(m.group(1))


def _reader() -> ScriptedResponder:
    calls = iter(range(1, 10_000))

    def read(body: dict[str, Any]) -> Reply:
        n = next(calls)
        return Reply([{"type": "tool_use", "id": f"toolu_{n:04d}", "name": "read", "input": {"path": f"f{n}.py"}}],
                     "tool_use")

    return ScriptedResponder(read)


def test_the_dashboard_metrics_and_report_count_the_summary_calls_alike(tmp_path: Path) -> None:
    """The compact proxy's own summaries (internal calls, billed by the emulator) are in the
    session's cost on the dashboard's API and in ``/metrics``, as `report` counts them."""
    store = tmp_path / "store"
    with Emulator(SummarizingResponder(_reader())) as emu, \
            Proxy(ProxyConfig(upstream=emu.url, port=0, mode="compact", store=str(store),
                              window_tokens=30_000)) as px, \
            httpx2.Client(base_url=px.url, headers=API) as http:
        client = anthropic.Anthropic(base_url=px.url, api_key="k", max_retries=0)
        msgs: list[dict[str, Any]] = [{"role": "user", "content": "Read all files."}]
        for k in range(30):
            r = client.messages.create(model=MODEL, max_tokens=500, system="sys", tools=TOOLS, messages=msgs,
                                       extra_headers={SESSION_HEADER: "job", CLOCK_HEADER: str(1000 + k)})
            call = r.content[-1]
            msgs += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                                   "content": f"contents of {call.input}\n" + "code line\n" * 800}]}]
        px.wait_idle()
        listed = http.get("/api/sessions").json()["sessions"]
        metrics = http.get("/metrics").text
        billed = sum(float(r["cost_usd"]) for r in emu.requests if r.get("status") == 200)
        internal = sum(float(r["cost_usd"]) for r in emu.requests if r.get("status") == 200 and r.get("internal"))
    (conv,) = listed
    fs = FileStore(store)
    report = conversation_data(conversation_segments(fs, "job"))
    assert internal > 0  # the proxy's own summaries were made, and billed
    assert report["cost"]["summaries_usd"] == pytest.approx(internal, abs=1e-6)
    total = report["cost"]["total_usd"]
    assert total == pytest.approx(billed, abs=1e-6)  # everything the upstream billed, once
    # the dashboard's conversation and /metrics say the same, to the cent and below
    assert conv["conversation"]["cost_usd"] == pytest.approx(total, abs=1e-5)
    assert conv["conversation"]["summaries_usd"] == pytest.approx(internal, abs=1e-5)
    assert _metric(metrics, "cachecompact_cost_usd_total") == pytest.approx(total, abs=1e-6)
    assert _metric(metrics, "cachecompact_summary_cost_usd_total") == pytest.approx(internal, abs=1e-6)
    assert f"${total:.4f} (requests" in session_report(fs, "job", detail=False)
    # a restarted proxy lists the same figures from the store
    with Proxy(ProxyConfig(upstream="http://127.0.0.1:9", port=0, mode="compact", store=str(store))) as again, \
            httpx2.Client(base_url=again.url, headers=API) as http:
        (after,) = http.get("/api/sessions").json()["sessions"]
    assert after["conversation"]["cost_usd"] == pytest.approx(total, abs=1e-5)
