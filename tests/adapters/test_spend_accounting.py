"""Every dollar and every refusal is shown (issue 62, item 5).

Measured on the compact proxy with Claude Code: the dashboard and ``/metrics`` left out the
proxy's own summary calls ($0.8384 against `report`'s $0.8814), and the requests the proxy
refused itself were counted in ``/metrics`` alone: no session had them, and a conversation whose
every request was refused was listed nowhere. Here the dashboard's API, ``/metrics`` and
`report` read the same store and agree to the cent, and a refusal is its conversation's."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import pytest

from cachecompact.adapters.proxy import Proxy, ProxyConfig
from cachecompact.base.headers import CLOCK_HEADER, SESSION_HEADER
from cachecompact.history.session import Session
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


def _too_big() -> list[dict[str, Any]]:
    """A history no compaction can fit in a 30,000-token window: its first tool output, in the
    immutable prefix, is bigger than the window."""
    big = " ".join(f"r{j}" for j in range(40_000))
    return [{"role": "user", "content": "read the file"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "read",
                                               "input": {"path": "big"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": big}]}]


def test_refused_requests_are_their_conversations_and_an_all_refused_one_is_listed(tmp_path: Path) -> None:
    """The proxy's own refusals (the context is full) are requests and errors of the session the
    engine resolved them to, on the dashboard's API and in `report`, as upstream errors are; a
    conversation whose every request the proxy refused is a row of the list, not hidden."""
    store = tmp_path / "store"
    with Emulator(_reader(), context_window=30_000) as emu, \
            Proxy(ProxyConfig(upstream=emu.url, port=0, mode="compact", store=str(store),
                              window_tokens=30_000)) as px, \
            httpx2.Client(base_url=px.url, headers=API) as http:
        client = anthropic.Anthropic(base_url=px.url, api_key="k", max_retries=0)
        for k in range(3):  # a client that tries again, at another max_tokens: the same session
            with pytest.raises(anthropic.BadRequestError, match="context is full"):
                client.messages.create(model=MODEL, max_tokens=100 * (k + 1), tools=TOOLS, messages=_too_big(),
                                       extra_headers={SESSION_HEADER: "full"})
        # another conversation: answered, then an upstream error (temperature out of range), then refused
        msgs: list[dict[str, Any]] = [{"role": "user", "content": "Read all files."}]
        r = client.messages.create(model=MODEL, max_tokens=100, tools=TOOLS, messages=msgs,
                                   extra_headers={SESSION_HEADER: "mixed"})
        call = next(b for b in r.content if b.type == "tool_use")
        msgs += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "short"}]}]
        with pytest.raises(anthropic.BadRequestError):
            client.messages.create(model=MODEL, max_tokens=100, tools=TOOLS, messages=msgs,
                                   extra_body={"temperature": 7}, extra_headers={SESSION_HEADER: "mixed"})
        px.wait_idle()
        listed = {c["id"]: c for c in http.get("/api/sessions").json()["sessions"]}
        metrics = http.get("/metrics").text
        assert not [x for x in emu.requests if x["total_input_tokens"] > 30_000]
    assert set(listed) == {"full", "mixed"}, listed
    full, mixed = listed["full"], listed["mixed"]
    assert (full["requests"], full["errors"], full["refused"], full["cost_usd"]) == (3, 3, 3, 0.0)
    assert "segments" not in full and full["link"] is None
    assert (mixed["requests"], mixed["errors"], mixed["refused"]) == (2, 1, 0)
    assert _metric(metrics, "cachecompact_requests_total") == 5
    assert _metric(metrics, "cachecompact_request_errors_total") == 4
    assert _metric(metrics, "cachecompact_requests_refused_total") == 3
    fs = FileStore(store)
    assert conversation_data(conversation_segments(fs, "full"))["not_answered"] == {"refused": 3, "upstream": 0}
    assert conversation_data(conversation_segments(fs, "mixed"))["not_answered"] == {"refused": 0, "upstream": 1}
    text = session_report(fs, "full", detail=False)
    assert "requests: 0 answered, 3 not (3 refused by the proxy: the context was full)" in text, text
    assert Session.open(fs, "full", readonly=True).requests_recorded == 0
