"""The proxy with the Python SDK and raw HTTP against the emulator: forwarding byte for byte,
streams chunk by chunk, sessions, the forensics classes, compact mode, auth and the API."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import pytest
from aiohttp import web

from cachecompact import Session
from cachecompact.adapters.httpserver import ServerThread
from cachecompact.adapters.proxy import Proxy, ProxyConfig, session_hint
from cachecompact.adapters.proxy._observe import ObservedSession
from cachecompact.base.errors import ConfigError
from cachecompact.base.headers import INTERNAL_HEADER
from cachecompact.tools.emulator import CLOCK_HEADER, Emulator, ScriptedResponder, SummarizingResponder

from ..conftest import API_VERSION

MODEL = "claude-sonnet-4-6"
CC = {"type": "ephemeral"}
SYSTEM = [{"type": "text", "text": "You are a careful agent. " * 300, "cache_control": CC}]


@pytest.fixture
def emu() -> Iterator[Emulator]:
    with Emulator() as e:
        yield e


def _proxy(upstream: str, **kw: Any) -> Proxy:
    return Proxy(ProxyConfig(upstream=upstream, port=0, **kw))


def _only(px: Proxy) -> ObservedSession:
    px.wait_idle()
    (s,) = px.state.observer.sessions()
    return s


def _turns(client: Any, n: int, *, system: Any = None, t0: float = 1000.0, gap: float = 10.0,
           extra: dict[str, Any] | None = None, stream: bool = False) -> list[dict[str, Any]]:
    def text(t: str) -> dict[str, Any]:
        return {"role": "user", "content": [{"type": "text", "text": t}]}

    msgs: list[dict[str, Any]] = [text("Read the project and fix the bug. " * 50)]
    for k in range(n):
        content = msgs[-1]["content"]  # the marker moves to the newest block, as Claude Code does
        marked = [*msgs[:-1], {"role": "user", "content": [*content[:-1], {**content[-1], "cache_control": CC}]}]
        kw = dict(model=MODEL, max_tokens=50, system=system or SYSTEM, messages=marked,
                  extra_headers={CLOCK_HEADER: str(t0 + k * gap), **(extra or {})})
        if stream:
            with client.messages.stream(**kw) as s:
                reply = s.get_final_message()
        else:
            reply = client.messages.create(**kw)
        msgs += [{"role": "assistant", "content": reply.content[0].text}, text(f"step {k}: " + "output line\n" * 200)]
    return msgs


# -- forwarding ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_sdk_through_the_proxy_records_every_request(emu: Emulator, stream: bool) -> None:
    with _proxy(emu.url) as px:
        client = anthropic.Anthropic(base_url=px.url, api_key="sk-test-secret", max_retries=0)
        _turns(client, 5, stream=stream)
        s = _only(px)
    assert s.requests == 5 and s.mode == "observe"
    billed = [r for r in emu.requests if r.get("status") == 200]
    recs = list(s.records)
    assert [r["usage"]["cache_read_input_tokens"] for r in recs] == [b["usage"]["cache_read_input_tokens"]
                                                                     for b in billed]
    assert s.cost_usd == pytest.approx(sum(b["cost_usd"] for b in billed), rel=1e-6)
    assert all(r["finding"]["cls"] == "read_as_expected" for r in recs)
    assert recs[-1]["breakpoints"] and recs[-1]["chain_head"] and recs[-1]["ttfb_ms"] >= 0


def test_async_client_and_other_paths_pass_through(emu: Emulator) -> None:
    with _proxy(emu.url) as px:
        async def go() -> None:
            c = anthropic.AsyncAnthropic(base_url=px.url, api_key="k", max_retries=0)
            await c.messages.create(model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "hi"}])
            async with c.messages.stream(model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "x"}]) as s:
                await s.get_final_message()
            n = await c.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": "hi"}])
            assert n.input_tokens > 0
            assert [m.id async for m in c.models.list()]
        asyncio.run(go())
        px.wait_idle()
        assert sum(s.requests for s in px.state.observer.sessions()) == 2  # count_tokens and models: not recorded


def test_status_headers_and_error_bodies_are_unchanged(emu: Emulator) -> None:
    bad = [b'{"model":"claude-sonnet-4-6","max_tokens":5,"messages":[]}', b"{not json",
           b'{"model":"gpt-4","max_tokens":5,"messages":[{"role":"user","content":"x"}]}']
    with _proxy(emu.url) as px, httpx2.Client(headers=API_VERSION) as http:
        for raw in bad:
            direct = http.post(emu.url + "/v1/messages", content=raw, headers={"content-type": "application/json"})
            via = http.post(px.url + "/v1/messages", content=raw, headers={"content-type": "application/json"})
            assert via.status_code == direct.status_code >= 400
            assert {**json.loads(via.content), "request_id": None} == {**json.loads(direct.content), "request_id": None}
            assert via.headers["content-type"] == direct.headers["content-type"]
        r = http.get(px.url + "/v1/models/claude-sonnet-4-6", headers=API_VERSION)
        assert r.status_code == 200 and r.json()["id"] == "claude-sonnet-4-6"


class _Recorder:
    """An upstream that records the exact bytes and headers it got, and streams slowly on demand."""

    def __init__(self) -> None:
        self.got: list[tuple[dict[str, str], bytes]] = []

    def app(self) -> web.Application:
        async def handle(request: web.Request) -> web.StreamResponse:
            raw = await request.read()
            self.got.append(({k.lower(): v for k, v in request.headers.items()}, raw))
            if request.path.endswith("/slow"):
                resp = web.StreamResponse(headers={"content-type": "text/event-stream", "x-upstream": "yes"})
                await resp.prepare(request)
                for k in range(5):
                    await resp.write(f"event: ping\ndata: {{\"type\": \"ping\", \"k\": {k}}}\n\n".encode())
                    await asyncio.sleep(0.2)
                await resp.write_eof()
                return resp
            if request.path.endswith("/cookie"):
                resp = web.json_response({"ok": True})
                resp.set_cookie("upstream_session", "secret-of-the-first-client")
                return resp
            return web.json_response({"ok": True}, status=418, headers={"x-upstream": "yes", "retry-after": "7"})

        a = web.Application()
        a.router.add_route("*", "/{tail:.*}", handle)
        return a


def test_observe_mode_never_changes_a_byte_and_never_keeps_credentials(tmp_path: Path,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    rec = _Recorder()
    body = json.dumps({"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "héllo  {}"}],
                       "metadata": {"user_id": "u"}}, indent=3).encode()  # odd spacing on purpose
    with ServerThread(rec.app) as up, _proxy(up.url, store=str(tmp_path), keep_bodies=True) as px, \
            caplog.at_level(logging.DEBUG):
        r = httpx2.post(px.url + "/v1/messages?beta=true", content=body,
                        headers={**API_VERSION, "x-api-key": "sk-SECRET-1", "authorization": "Bearer sk-SECRET-2",
                                 "anthropic-beta": "b1,b2", "anthropic-version": "2023-06-01",
                                 "content-type": "application/json", "connection": "keep-alive, x-hop",
                                 "x-hop": "drop me"})
        px.wait_idle()
    assert r.status_code == 418 and r.headers["x-upstream"] == "yes" and r.headers["retry-after"] == "7"
    headers, got = rec.got[0]
    assert got == body
    assert headers["x-api-key"] == "sk-SECRET-1" and headers["authorization"] == "Bearer sk-SECRET-2"
    assert headers["anthropic-beta"] == "b1,b2" and headers["anthropic-version"] == "2023-06-01"
    assert "x-hop" not in headers
    stored = b"".join(p.read_bytes() for p in tmp_path.rglob("*") if p.is_file())
    assert b"SECRET" not in stored and "SECRET" not in caplog.text
    # --keep-bodies keeps the body, the first one of a session too
    from cachecompact.store import open_store

    st = open_store(str(tmp_path))
    (sid,) = st.list()
    (ev,) = [e for e in st.open(sid).read_events() if e.get("kind") == "observation"]
    assert st.open(sid).get_blob(ev["body_ref"]) == body


def test_expect_100_continue_is_answered_by_the_proxy_and_not_forwarded() -> None:
    """curl sends ``Expect: 100-continue`` for large bodies; the proxy answers it, reads the whole
    body, and sends the upstream a complete request without the header."""
    import http.client
    from urllib.parse import urlsplit

    rec = _Recorder()
    body = b'{"pad": "' + b"x" * 200_000 + b'"}'
    with ServerThread(rec.app) as up, _proxy(up.url) as px:
        u = urlsplit(px.url)
        conn = http.client.HTTPConnection(u.hostname or "", u.port, timeout=10)
        conn.request("POST", "/v1/other", body=body, headers={"Expect": "100-continue",
                                                              "content-type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        conn.close()
    headers, got = rec.got[0]
    assert got == body and "expect" not in {k.lower() for k in headers}


def test_upstream_cookies_reach_the_client_and_never_another_request() -> None:
    """The proxy's own HTTP client keeps no cookie jar: a Set-Cookie meant for one client is
    relayed to it, and never sent upstream on behalf of the next."""
    rec = _Recorder()
    with ServerThread(rec.app) as up, _proxy(up.url.replace("127.0.0.1", "localhost")) as px:  # a name, not an IP
        first = httpx2.post(px.url + "/v1/cookie", content=b"{}")
        httpx2.post(px.url + "/v1/other", content=b"{}")  # a new client, no cookies of its own
    assert "upstream_session=secret-of-the-first-client" in first.headers["set-cookie"]
    assert "cookie" not in rec.got[1][0]


def test_streams_are_forwarded_as_they_arrive() -> None:
    rec = _Recorder()
    with ServerThread(rec.app) as up, _proxy(up.url) as px, httpx2.Client(headers=API_VERSION) as http:
        t0 = time.perf_counter()
        arrivals = []
        with http.stream("POST", px.url + "/v1/slow", content=b"{}") as r:
            for line in r.iter_lines():
                if line.startswith("data:"):
                    arrivals.append(time.perf_counter() - t0)
    assert len(arrivals) == 5
    # the first event long before the stream ended (relative: a loaded machine delays the start, not the gaps)
    assert arrivals[-1] - arrivals[0] > 0.5


def test_gzip_passes_through_and_usage_is_read(tmp_path: Path) -> None:
    with Emulator(gzip=True) as emu, _proxy(emu.url) as px, httpx2.Client(headers=API_VERSION) as http:
        body = json.dumps({"model": MODEL, "max_tokens": 5, "system": SYSTEM,
                           "messages": [{"role": "user", "content": "hi " * 2000}]}).encode()
        r = http.post(px.url + "/v1/messages", content=body,
                      headers={"accept-encoding": "gzip", "content-type": "application/json"})
        assert r.status_code == 200 and r.json()["usage"]["cache_creation_input_tokens"] > 0
        s = _only(px)
    assert s.records[0]["usage"]["cache_creation_input_tokens"] == r.json()["usage"]["cache_creation_input_tokens"]


# -- sessions and forensics ---------------------------------------------------------------------------


def test_sessions_by_header_metadata_and_extension(emu: Emulator) -> None:
    uid = json.dumps({"device_id": "d", "account_uuid": "", "session_id": "925edbf4-bfe4-4a3b-b956-d5fb3b6b35ea"})
    assert session_hint({}, {"metadata": {"user_id": uid}}) == "cc-925edbf4-bfe4-4a3b-b956-d5fb3b6b35ea"
    assert session_hint({"x-cachecompact-session": "job-1"}, {}) == "job-1"
    with _proxy(emu.url) as px:
        c = anthropic.Anthropic(base_url=px.url, api_key="k", max_retries=0)
        _turns(c, 3, extra={"x-cachecompact-session": "job-1"})
        _turns(c, 2)  # no name: by opening and extension
        _turns(c, 2)  # the same opening again: extends nothing longer, so a second session
        c.messages.create(model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "a"}],
                          metadata={"user_id": uid})
        c.messages.create(model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "rewritten"}],
                          metadata={"user_id": uid})  # a rewrite (Claude Code's own compaction): a new segment
        px.wait_idle()
        ids = sorted(s.sid for s in px.state.observer.sessions())
    assert "job-1" in ids and "cc-925edbf4-bfe4-4a3b-b956-d5fb3b6b35ea" in ids
    assert "cc-925edbf4-bfe4-4a3b-b956-d5fb3b6b35ea.s2" in ids
    assert len([i for i in ids if i.startswith("s_")]) == 2
    with _proxy(emu.url) as px:
        r = httpx2.post(px.url + "/v1/messages", content=b'{"model":"x","max_tokens":1,"messages":[]}',
                        headers={**API_VERSION, "x-cachecompact-session": "../etc"})
        assert r.status_code == 400  # the emulator's own answer: the proxy forwards, never stores


def test_forensics_classes_through_the_proxy(emu: Emulator) -> None:
    with _proxy(emu.url) as px:
        c = anthropic.Anthropic(base_url=px.url, api_key="k", max_retries=0)
        msgs = _turns(c, 3, extra={"x-cachecompact-session": "f"})

        def send(t: float, system: Any = None, model: str = MODEL, messages: Any = None) -> None:
            m = messages or [*msgs[:-1], {"role": "user", "content": [{"type": "text", "text": "next",
                                                                       "cache_control": CC}]}]
            c.messages.create(model=model, max_tokens=50, system=system or SYSTEM, messages=m,
                              extra_headers={CLOCK_HEADER: str(t), "x-cachecompact-session": "f"})

        send(1040)  # read as expected
        send(1050, system=[{"type": "text", "text": "Date: 2026-11-30. " + SYSTEM[0]["text"], "cache_control": CC}])
        send(1060)  # back to the cached system prompt: ...
        send(2000)  # idle beyond the 5-minute TTL
        send(2010, model="claude-opus-4-8")  # another model
        px.wait_idle()
        s = px.state.observer.get("f")
    assert s is not None
    cls = [r["finding"]["cls"] for r in s.records]
    assert cls[3] == "read_as_expected"
    churn = s.records[4]["finding"]
    assert churn["cls"] == "prefix_churn" and churn["location"] == "system[0]" and churn["offset"] == 0
    assert churn["wasted_usd"] > 0 and "Date: 2026" in churn["after"] and len(churn["after"]) <= 200
    assert cls[6] == "ttl_expiry" and cls[7] == "invalidation"
    assert s.misses["prefix_churn"] >= 1 and s.wasted_usd > 0


# -- compact mode ---------------------------------------------------------------------------------------


def test_compact_mode_runs_the_strategy_and_keeps_unknown_fields(tmp_path: Path) -> None:
    calls = iter(range(1, 10_000))

    def reader(body: dict[str, Any]) -> Any:
        # numbered by its own count: a compaction shortens what it is shown
        from cachecompact.tools.emulator.responders import Reply
        n = next(calls)
        return Reply([{"type": "tool_use", "id": f"toolu_{n:04d}", "name": "read", "input": {"path": f"f{n}.py"}}],
                     "tool_use")

    with Emulator(SummarizingResponder(ScriptedResponder(reader))) as emu, \
            _proxy(emu.url, mode="compact", store=str(tmp_path), window_tokens=30_000) as px:
        c = anthropic.Anthropic(base_url=px.url, api_key="k", max_retries=0)
        msgs: list[dict[str, Any]] = [{"role": "user", "content": "Read all files."}]
        tools = [{"name": "read", "description": "read a file", "input_schema": {"type": "object"}}]
        for _ in range(40):
            r = c.messages.create(model=MODEL, max_tokens=500, system="sys", tools=tools, messages=msgs,
                                  metadata={"user_id": "someone"}, extra_body={"context_management": {"edits": []}})
            call = r.content[-1]
            msgs += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                                   "content": f"contents of {call.input}\n" + "code line\n" * 800}]}]
        px.wait_idle()
        sent = [r for r in emu.requests if r.get("status") == 200 and not r.get("internal")]
        (s,) = px.state.observer.sessions()
    assert max(r["total_input_tokens"] for r in sent) <= 30_000
    assert s.mode == "compact" and s.compactions and s.requests == 40
    engine = px.state.engine
    assert engine is not None
    (sess,) = engine.sessions()
    assert sess.last_request is not None


# -- the dashboard's API and auth ------------------------------------------------------------------------------


def test_api_and_auth_token(emu: Emulator) -> None:
    with pytest.raises(ConfigError, match="auth-token"):
        ProxyConfig(upstream=emu.url, host="0.0.0.0").check()
    with _proxy(emu.url, auth_token="t0ken") as px, httpx2.Client(base_url=px.url, headers=API_VERSION) as http:
        c = anthropic.Anthropic(base_url=px.url, api_key="k", max_retries=0)
        _turns(c, 2, extra={"x-cachecompact-session": "a"})  # /v1 needs no token: the client's key is checked upstream
        px.wait_idle()
        assert http.get("/api/sessions").status_code == 401
        assert http.get("/ui").status_code == 401
        auth = {"authorization": "Bearer t0ken"}
        data = http.get("/api/sessions", headers=auth).json()
        assert [s["id"] for s in data["sessions"]] == ["a"] and data["sessions"][0]["requests"] == 2
        one = http.get("/api/sessions/a", headers=auth).json()
        assert len(one["requests"]) == 2 and one["requests"][1]["read"] > 0
        r = http.get("/ui?token=t0ken", follow_redirects=False)
        set_cookie = r.headers["set-cookie"]
        assert r.status_code == 302 and "cachecompact_token" in set_cookie
        # the cookie holds a value derived from the token, never the token; HttpOnly and SameSite
        # always, Secure when the browser came over TLS (here through a terminating proxy)
        assert "t0ken" not in set_cookie and "HttpOnly" in set_cookie and "SameSite=Strict" in set_cookie
        assert "Secure" not in set_cookie
        tls = http.get("/ui?token=t0ken", headers={"x-forwarded-proto": "https"}, follow_redirects=False)
        assert "Secure" in tls.headers["set-cookie"]
        http.cookies.set("cachecompact_token", "t0ken")  # the token itself is not a valid cookie
        assert http.get("/ui").status_code == 401
        http.cookies.set("cachecompact_token", r.cookies["cachecompact_token"])
        page = http.get("/ui")
        assert page.status_code == 200 and "Content-Security-Policy" in page.headers
        assert http.get("/api/sessions/nope", headers=auth).status_code == 404
    # without a token, the dashboard answers only to loopback names (no DNS rebinding)
    with _proxy(emu.url) as px, httpx2.Client(base_url=px.url, headers=API_VERSION) as http:
        port = px.url.rsplit(":", 1)[1]
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost", f"[::1]:{port}"):
            assert http.get("/api/sessions", headers={"host": host}).status_code == 200, host
        for host in (f"evil.example:{port}", "evil.example", f"127.0.0.1.evil.example:{port}", "[2001:db8::1]"):
            r = http.get("/api/sessions", headers={"host": host})
            assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error", host
            assert http.get("/ui", headers={"host": host}).status_code == 403


def test_gzip_request_bodies_are_forwarded_compressed(emu: Emulator) -> None:
    body = json.dumps({"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}).encode()
    rec = _Recorder()
    with ServerThread(rec.app, auto_decompress=False) as up, _proxy(up.url) as px:
        httpx2.post(px.url + "/v1/messages", content=gzip.compress(body),
                    headers={**API_VERSION, "content-encoding": "gzip", "content-type": "application/json"})
    assert gzip.decompress(rec.got[0][1]) == body and rec.got[0][0]["content-encoding"] == "gzip"


def test_a_request_without_credentials_never_summarises_on_the_operators_key(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An SDK client built without a credential reads the operator's environment; the proxy's
    summarizer must not, so a caller without a key gets an offline summary and no upstream call."""
    import threading

    from cachecompact.compaction.summarize.caller_key import CallerKeySummarizer as _UpstreamSummarizer
    from cachecompact.compaction.summarize.llm import SummaryRequest

    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-OPERATOR")
    rec = _Recorder()
    creds = threading.local()
    req = SummaryRequest(messages=[{"role": "user", "content": "Fix the bug in app.py"},
                                   {"role": "assistant", "content": "I read app.py and found the bug."}],
                         goal="Fix the bug in app.py")
    with ServerThread(rec.app) as up:
        summ = _UpstreamSummarizer(up.url, "claude-haiku-4-5", "forced-tool", creds)
        creds.headers = {}
        res = summ.summarize(req)
        assert res.mode == "extractive" and rec.got == []
        creds.headers = {"x-api-key": "sk-CALLER"}  # with the caller's own key: an upstream call, with it
        with contextlib.suppress(Exception):  # the recorder is no model: the call fails, that is fine
            summ.summarize(req)
    assert rec.got and all("sk-OPERATOR" not in json.dumps(h) for h, _ in rec.got)
    assert any("sk-CALLER" in json.dumps(h) for h, _ in rec.got)


def test_compact_mode_records_streams_its_window_and_its_compactions_apart_from_misses(tmp_path: Path) -> None:
    """Issue 37: the compact proxy recorded ``stream: false`` for streamed requests; the dashboard
    drew a 1M window for a proxy started with ``--window``; our own compactions' re-writes were
    counted as misses of class ``prefix_churn`` in the dashboard's API and ``/metrics``."""
    calls = iter(range(1, 10_000))

    def reader(body: dict[str, Any]) -> Any:
        from cachecompact.tools.emulator.responders import Reply
        n = next(calls)
        return Reply([{"type": "tool_use", "id": f"toolu_{n:04d}", "name": "read", "input": {"path": f"f{n}.py"}}],
                     "tool_use")

    with Emulator(SummarizingResponder(ScriptedResponder(reader))) as emu, \
            _proxy(emu.url, mode="compact", store=str(tmp_path), window_tokens=30_000,
                   strategy="cachecompact-api-summaries") as px, \
            httpx2.Client(base_url=px.url, headers=API_VERSION) as http:
        c = anthropic.Anthropic(base_url=px.url, api_key="k", max_retries=0)
        msgs: list[dict[str, Any]] = [{"role": "user", "content": "Read all files."}]
        tools = [{"name": "read", "description": "read a file", "input_schema": {"type": "object"}}]
        for k in range(30):
            with c.messages.stream(model=MODEL, max_tokens=500, system="sys", tools=tools, messages=msgs,
                                   extra_headers={"x-cachecompact-session": "job", CLOCK_HEADER: str(1000 + k)}) as st:
                r = st.get_final_message()
            call = r.content[-1]
            msgs += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                                   "content": f"contents of {call.input}\n" + "code line\n" * 800}]}]
        px.wait_idle()
        one = http.get("/api/sessions/job").json()
        metrics = http.get("/metrics").text
    engine = px.state.engine
    assert engine is not None
    (sess,) = engine.sessions()
    recs = [r for _, r in sess.store.read_all("requests")] if sess.store is not None else []
    assert len(recs) == 30 and all(r["stream"] is True for r in recs)
    assert all(r["stream"] is True for r in one["requests"])
    assert one["window"] == 30_000 and one["window_source"] == "--window"
    ours = [r for r in one["requests"] if r["ours"]]
    assert ours and all(r["cls"] == "compaction_rewrite" for r in ours)
    assert "prefix_churn" not in one["session"]["misses"]
    assert one["session"]["compaction_rewrites"] == len(ours)
    assert f'cachecompact_compaction_rewrites_total{{mode="compact"}} {len(ours)}' in metrics
    assert 'class="prefix_churn"' not in metrics and 'class="compaction_rewrite"' not in metrics
    # issue 62: a long reason is cut at a word boundary with " ...", never mid-word
    whole = {e.seq: " ".join(e.reason.split()) for e in sess.ledger.entries}
    long = [c for c in one["compactions"] if len(whole[c["seq"]]) > 200]
    assert long, [len(r) for r in whole.values()]
    for c in long:
        kept = c["reason"].removesuffix(" ...")
        assert c["reason"].endswith(" ...") and len(c["reason"]) <= 200, c["reason"]
        assert whole[c["seq"]].startswith(kept + " "), (kept, whole[c["seq"]])  # ends where a word ends


@pytest.mark.parametrize("compressed", [False, True], ids=["plain", "gzip"])
def test_compact_mode_retries_after_prompt_too_long_even_when_the_error_is_compressed(compressed: bool) -> None:
    """The upstream's window is smaller than the one the proxy plans for: its 400 (gzipped when
    the client accepts gzip, as the SDK does) triggers reactive compaction and one retry."""
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "Read all files."}]
    for k in range(12):
        msgs += [{"role": "assistant", "content": [{"type": "tool_use", "id": f"toolu_{k:04d}", "name": "read",
                                                    "input": {"path": f"f{k}.py"}}]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{k:04d}",
                                               "content": f"contents of f{k}.py\n" + "code line\n" * 800}]}]
    tools = [{"name": "read", "description": "read a file", "input_schema": {"type": "object"}}]
    with Emulator(SummarizingResponder(), context_window=20_000, gzip=compressed) as emu, \
            _proxy(emu.url, mode="compact", window_tokens=200_000) as px:
        c = anthropic.Anthropic(base_url=px.url, api_key="k", max_retries=0)
        r = c.messages.create(model=MODEL, max_tokens=500, system="sys", tools=tools, messages=msgs)
        px.wait_idle()
        (s,) = px.state.observer.sessions()
        sent = [x["total_input_tokens"] for x in emu.requests if x.get("status") == 200 and not x.get("internal")]
    assert r.content  # the client got an answer, not the 400
    assert [c["level"] for c in s.compactions][:1] in (["L4"], ["L5"])  # reactive: the plan saw a 200k window
    assert sent and max(sent) <= 20_000


def test_an_evicted_sessions_id_is_never_given_to_another_conversation() -> None:
    from cachecompact.adapters.proxy._observe import Observer

    obs = Observer(max_sessions=3)
    usage = {"input_tokens": 10, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0, "output_tokens": 1}

    clock = iter(range(1000, 2000))

    def send(second: str, hint: str | None = None) -> str:
        body = {"model": MODEL, "max_tokens": 5, "messages": [
            {"role": "user", "content": "the same opening"}, {"role": "assistant", "content": "ok"},
            {"role": "user", "content": second}]}
        headers = {"x-cachecompact-session": hint} if hint else {}
        obs.observe(json.dumps(body).encode(), headers, status=200, usage=usage, message_id=None,
                    cache_miss_reason=None, now=float(next(clock)), timing={}, stream=False)
        return max(obs.sessions(), key=lambda s: s.last_time).sid  # the one this request went to

    ids = [send(x) for x in ("a", "b", "c", "d", "e")]  # five conversations, room for three
    assert len(set(ids)) == 5, ids
    named = [send(x, "agent") for x in ("a", "b", "c", "d")]  # each rewrites the named history
    assert len(set(named)) == 4, named


@pytest.mark.parametrize("mode", ["observe", "compact"])
def test_two_agents_under_one_name_keep_one_segment_each(emu: Emulator, tmp_path: Path, mode: str) -> None:
    """Claude Code's sub-agents send the main agent's session id: alternating requests continue
    their own session (linked to the first) instead of starting a new one every turn."""
    with _proxy(emu.url, mode=mode, store=str(tmp_path) if mode == "compact" else None) as px:
        c = anthropic.Anthropic(base_url=px.url, api_key="k", max_retries=0)
        hist: dict[str, list[dict[str, Any]]] = {"main": [], "sub": []}
        for turn in range(5):
            for agent in ("main", "sub"):
                h = hist[agent]
                h.append({"role": "user", "content": f"{agent} turn {turn}: go on"})
                r = c.messages.create(model=MODEL, max_tokens=5, system=f"You are the {agent} agent.", messages=h,
                                      extra_headers={"x-cachecompact-session": "agent"})
                h.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]})
        px.wait_idle()
        ids = sorted(s.sid for s in px.state.observer.sessions())
        assert ids == ["agent", "agent.a2"], ids
        if mode == "compact":
            assert px.state.engine is not None
            assert sorted(s.session_id for s in px.state.engine.sessions()) == ["agent", "agent.a2"]
        else:
            for s in px.state.observer.sessions():  # each compared with its own previous request
                assert s.requests == 5 and s.misses.get("prefix_churn", 0) == 0, (s.sid, s.misses)
    if mode == "compact":  # a restarted proxy finds both segments in the store, and starts none
        with _proxy(emu.url, mode=mode, store=str(tmp_path)) as px:
            c = anthropic.Anthropic(base_url=px.url, api_key="k", max_retries=0)
            for agent in ("sub", "main"):
                h = [*hist[agent], {"role": "user", "content": f"{agent}: once more"}]
                c.messages.create(model=MODEL, max_tokens=5, system=f"You are the {agent} agent.", messages=h,
                                  extra_headers={"x-cachecompact-session": "agent"})
            px.wait_idle()
            assert px.state.engine is not None
            assert sorted(s.session_id for s in px.state.engine.sessions()) == ["agent", "agent.a2"]


def test_compact_mode_records_a_stream_before_the_client_has_it_all(tmp_path: Path) -> None:
    """The next turn of a streaming client may arrive the moment its stream ends (on another
    replica too): the session's request record must already be there."""
    with Emulator() as emu, _proxy(emu.url, mode="compact", store=str(tmp_path)) as px:
        c = anthropic.Anthropic(base_url=px.url, api_key="k", max_retries=0)
        msgs = [{"role": "user", "content": "Say something."}]
        for k in range(3):
            with c.messages.stream(model=MODEL, max_tokens=20, messages=msgs,
                                   extra_headers={"x-cachecompact-session": "streamer"}) as st:
                final = st.get_final_message()
            assert px.state.engine is not None
            (sess,) = px.state.engine.sessions()
            assert sess.last_request is not None and len(sess.store.read_all("requests")) == k + 1  # type: ignore[union-attr]
            msgs = [*msgs, {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in final.content]},
                    {"role": "user", "content": f"again {k}"}]


def test_observe_mode_under_overload_forwards_everything_and_counts_what_it_did_not_analyse(emu: Emulator) -> None:
    with _proxy(emu.url) as px, httpx2.Client(base_url=px.url, headers=API_VERSION) as http:
        px.state.max_pending_bytes = 0  # analysis "behind" from the start
        c = anthropic.Anthropic(base_url=px.url, api_key="k", max_retries=0)
        _turns(c, 3)
        px.wait_idle(5)
        assert px.state.pending == 0 and px.state.dropped == 3
        assert px.state.observer.sessions() == []
        assert http.get("/api/version").json()["unanalysed"] == 3


def test_the_waiting_response_counts_toward_the_analysis_bound(emu: Emulator) -> None:
    """A response kept for the analysis thread holds memory like its request: both are counted."""
    body = json.dumps({"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}).encode()
    with _proxy(emu.url) as px, httpx2.Client(base_url=px.url, headers=API_VERSION) as http:
        px.state.max_pending_bytes = len(body) + 10  # room for the request, not for its response too
        r = http.post("/v1/messages", content=body, headers={"x-api-key": "k", "content-type": "application/json"})
        assert r.status_code == 200 and len(r.content) > 10
        px.wait_idle(5)
        assert px.state.dropped == 1


def test_a_broken_error_body_in_compact_mode_is_a_502_and_gives_its_connection_back(tmp_path: Path) -> None:
    """The 400 a compact-mode request reads itself (to look for prompt-too-long) breaks off: the
    client gets a 502, and with two upstream connections allowed, later requests still go."""
    calls: list[int] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        await request.read()
        calls.append(1)
        resp = web.StreamResponse(status=400, headers={"content-type": "application/json"})
        resp.content_length = 500
        await resp.prepare(request)
        await resp.write(b'{"type": "error", "err')
        assert request.transport is not None
        request.transport.close()  # cut off mid-body
        return resp

    def app() -> web.Application:
        a = web.Application()
        a.router.add_route("*", "/{tail:.*}", handle)
        return a

    body = {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    with ServerThread(app) as up, _proxy(up.url, mode="compact", store=str(tmp_path), max_connections=2) as px, \
            httpx2.Client(base_url=px.url, timeout=10, headers=API_VERSION) as http:
        for _ in range(4):
            r = http.post("/v1/messages", json=body, headers={"x-api-key": "k"})
            assert r.status_code == 502 and "broke off" in r.json()["error"]["message"]
    assert len(calls) == 4


def test_absolute_form_targets_go_to_the_configured_upstream_and_userinfo_is_refused() -> None:
    import http.client
    from urllib.parse import urlsplit

    rec = _Recorder()
    with ServerThread(rec.app) as up, _proxy(up.url) as px:
        u = urlsplit(px.url)
        conn = http.client.HTTPConnection(u.hostname or "", u.port, timeout=10)
        conn.request("POST", "http://elsewhere.example/v1/other?x=1", body=b"{}")
        assert conn.getresponse().status == 418  # the recorder's answer: it reached the upstream
        conn.close()
    assert len(rec.got) == 1
    with pytest.raises(ConfigError, match="user name or password"):
        ProxyConfig(upstream="http://svc:secret@127.0.0.1:1").check()


def test_an_upstream_ending_in_v1_reaches_the_api_once(emu: Emulator) -> None:
    """An SDK-style base URL (``.../v1``) as the upstream: requests went to /v1/v1/messages (a 404,
    issue 62). The pool takes the base URL even when `check` was not called; `check` shows it."""
    cfg = ProxyConfig(upstream=emu.url + "/v1", port=0, mode="compact")
    with Proxy(cfg) as px:
        client = anthropic.Anthropic(base_url=px.url, api_key="k", max_retries=0)
        out = client.messages.create(model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "hi"}])
        assert out.content[0].type == "text"
    assert [r["status"] for r in emu.requests] == [200]
    cfg.check()
    assert cfg.upstream == emu.url


def test_keep_bodies_keeps_what_the_client_sent_in_compact_mode(tmp_path: Path) -> None:
    """--keep-bodies was accepted in compact mode and kept nothing."""
    from cachecompact.store import open_store

    body = json.dumps({"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "keep me"}]},
                      indent=2).encode()
    with Emulator() as emu, _proxy(emu.url, mode="compact", store=str(tmp_path), keep_bodies=True) as px:
        r = httpx2.post(px.url + "/v1/messages", content=body,
                        headers={**API_VERSION, "x-api-key": "k", "content-type": "application/json"})
        px.wait_idle()
    assert r.status_code == 200
    st = open_store(str(tmp_path))
    (sid,) = st.list()
    refs = [e["body_ref"] for e in st.open(sid).read_events() if e.get("body_ref")]
    assert [st.open(sid).get_blob(x) for x in refs] == [body]


def test_the_auth_token_help_says_when_it_is_needed(capsys: pytest.CaptureFixture[str]) -> None:
    from cachecompact.tools.cli import main

    with pytest.raises(SystemExit):
        main(["proxy", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "needed only when listening beyond loopback" in out and "required for the dashboard" not in out


def test_compact_mode_passes_todays_request_fields_through(tmp_path: Path) -> None:
    """Issue 38: what the SDKs and Claude Code send in December 2026 reaches the API as sent:
    ``Authorization: Bearer`` (anthropic 2.x and the TypeScript SDK 1.x), API version 2026-10-21,
    ``?beta=true``, the callers' betas, ``thinking.block_binding``, ``fallbacks``,
    ``output_config``, ``context_management`` and a mid-conversation ``role: "system"`` message."""
    got: list[tuple[str, dict[str, str], dict[str, Any]]] = []
    with Emulator() as emu, _proxy(emu.url, mode="compact", store=str(tmp_path)) as px:
        real = emu.core.handle

        def spy(method: str, path: str, headers: Any, raw: bytes) -> Any:
            got.append((path, dict(headers), json.loads(raw) if raw else {}))
            return real(method, path, headers, raw)

        emu.core.handle = spy  # type: ignore[method-assign]
        betas = "thinking-binding-controls-2026-08-01,server-side-fallback-2026-07-01,context-management-2025-06-27"
        body = {
            "model": "claude-opus-5-5", "max_tokens": 2000, "system": [{"type": "text", "text": "Be exact. " * 300}],
            "thinking": {"type": "adaptive", "display": "omitted",
                         "block_binding": {"prefix_mismatch_behavior": "drop_block"}},
            "fallbacks": [{"model": "claude-sonnet-5-5"}], "output_config": {"effort": "high"},
            "context_management": {"edits": [{"type": "clear_tool_uses_20250919", "keep": {"type": "tool_uses",
                                                                                            "value": 3}}]},
            "messages": [{"role": "user", "content": "Start the review."},
                         {"role": "system", "content": "From now on, answer in French."}]}
        r = httpx2.post(px.url + "/v1/messages?beta=true", json=body, timeout=30,
                        headers={"authorization": "Bearer sk-ant-test", "anthropic-version": "2026-10-21",
                                 "anthropic-beta": betas})
        assert r.status_code == 200, r.text[:300]
        px.wait_idle()
    ((path, headers, sent),) = [g for g in got if g[0].startswith("/v1/messages")]
    assert path == "/v1/messages?beta=true"
    assert headers["authorization"] == "Bearer sk-ant-test" and headers["anthropic-version"] == "2026-10-21"
    assert set(betas.split(",")) <= {b.strip() for b in headers["anthropic-beta"].split(",")}
    for key in ("thinking", "fallbacks", "output_config", "context_management"):
        assert sent[key] == body[key], key
    assert [m["role"] for m in sent["messages"]] == ["user", "system"]
    # where the caller put it, its text as sent; as the newest block it carries the cache marker, as
    # Claude Code's own system message does (the SDK's SystemMessageParam: text blocks, which take one)
    assert sent["messages"][1]["content"] == [{"type": "text", "text": "From now on, answer in French.",
                                               "cache_control": {"type": "ephemeral"}}], sent["messages"][1]


def test_compact_mode_keeps_passed_through_requests_out_of_the_engines_names(emu: Emulator, tmp_path: Path,
                                                                              caplog: pytest.LogCaptureFixture
                                                                              ) -> None:
    """A request compact mode forwards unchanged (here it fails open on a bad ``max_tokens``) is
    recorded under ``passthrough-<name>``: before, the observer stored it under the next id of the
    engine's own family, and the engine, opening that id as one of its sessions, failed with
    "session metadata: fields mode, name, observed ... are unknown or missing" and failed open
    for the whole family from then on (issue 46)."""
    hello = {"role": "user", "content": "Hello there."}

    def body(*more: dict[str, Any], max_tokens: Any = 64) -> dict[str, Any]:
        return {"model": MODEL, "max_tokens": max_tokens, "messages": [hello, *more]}

    with _proxy(emu.url, mode="compact", store=str(tmp_path)) as px, \
            httpx2.Client(base_url=px.url, timeout=30, headers={**API_VERSION, "x-api-key": "k"}) as c:
        for b in (body(), body(max_tokens="64"), body({"role": "assistant", "content": "A"}, {"role": "user",
                                                                                              "content": "B"}),
                  body({"role": "assistant", "content": "C"}, {"role": "user", "content": "D"})):
            c.post("/v1/messages", json=b)
            px.wait_idle()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert [n for n in names if n.startswith("passthrough-")] and len(names) == 3, names
    assert not [r for r in caplog.records if "unknown or missing" in r.getMessage()
                or "compaction failed" in r.getMessage()]
    engine = [n for n in names if not n.startswith("passthrough-")]
    assert all(Session.open(tmp_path / n).requests_recorded >= 1 for n in engine)  # compacted, not failed open


@pytest.mark.parametrize("mode", ["observe", "compact"])
def test_memory_is_capped_by_bytes_and_a_session_let_go_comes_back(emu: Emulator, tmp_path: Path, mode: str) -> None:
    """Memory was capped by session count only (issue 46: 135 -> 292 MB for 64 sessions). With
    ``max_memory_mb`` the sessions held, by their estimated size, stay under the cap, the least
    recently used going first; a conversation let go continues from the store on its next request
    (benchmarks/proxy_memory.py measures what stays held against the estimate)."""
    filler = "line of tool output\n" * 600
    with _proxy(emu.url, mode=mode, store=str(tmp_path), max_memory_mb=2) as px, \
            httpx2.Client(base_url=px.url, timeout=30, headers={**API_VERSION, "x-api-key": "k"}) as c:
        histories = []
        for s in range(12):
            msgs: list[dict[str, Any]] = [{"role": "user", "content": f"session {s}"}]
            for t in range(6):
                r = c.post("/v1/messages", json={"model": MODEL, "max_tokens": 5, "messages": msgs})
                assert r.status_code == 200
                msgs = [*msgs, {"role": "assistant", "content": f"ok {t}"},
                        {"role": "user", "content": filler + str(t)}]
            histories.append(msgs)
        px.wait_idle()
        st = px.state
        held = sum(x.nbytes for x in st.observer.sessions())
        assert held <= (1 << 20 if mode == "compact" else 2 << 20)
        if st.engine is None:
            assert len(st.observer.sessions()) < 12  # observe mode keeps each newest body: some went
        else:
            lives = st.engine.registry.sessions()
            assert sum(x.nbytes for x in lives) <= 1 << 20 and len(lives) < 12
            assert histories[0][0]["content"] not in {x.session.messages()[0]["content"] for x in lives}
            first = histories[0]  # let go long ago: continues from the store, not as a new session
            assert c.post("/v1/messages", json={"model": MODEL, "max_tokens": 5, "messages": first}).status_code == 200
            px.wait_idle()
            assert len(list(tmp_path.iterdir())) == 12


def test_a_second_too_long_answer_is_refused_as_still_too_long_and_counted(tmp_path: Path) -> None:
    """The proxy's one exchange (issue 49): after a prompt-too-long 400 it compacts and sends once
    more; an upstream that says too long again gets the caller the same refusal wrap() raises
    (`STILL_TOO_LONG`, after the API's own words and numbers), once, and the refusal is a request
    and an error in ``/metrics`` (the review found it counted nowhere)."""
    calls: list[int] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        await request.read()
        if INTERNAL_HEADER not in request.headers:  # a summary call of the compaction is the proxy's own
            calls.append(1)
        return web.json_response({"type": "error", "error": {
            "type": "invalid_request_error", "message": "prompt is too long: 250000 tokens > 200000 maximum"}},
            status=400)

    def app() -> web.Application:
        a = web.Application()
        a.router.add_route("*", "/{tail:.*}", handle)
        return a

    msgs: list[dict[str, Any]] = [{"role": "user", "content": "fix the parser"}]
    for k in range(12):
        msgs += [{"role": "assistant", "content": [{"type": "tool_use", "id": f"t{k}", "name": "read",
                                                    "input": {"path": f"f{k}.py"}}]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{k}",
                                               "content": f"line {k}\n" * 800}]}]
    body = {"model": MODEL, "max_tokens": 100, "messages": msgs,
            "tools": [{"name": "read", "description": "Read a file.", "input_schema": {"type": "object"}}]}
    from cachecompact.engine.request_cycle import STILL_TOO_LONG

    with ServerThread(app) as up, _proxy(up.url, mode="compact", store=str(tmp_path)) as px, \
            httpx2.Client(base_url=px.url, timeout=30, headers=API_VERSION) as http:
        r = http.post("/v1/messages", json=body, headers={"x-api-key": "k"})
        px.wait_idle()
        metrics = http.get("/metrics").text
    said = r.json()["error"]["message"]
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    # the API's words first: Claude Code compacts by itself on any error saying "prompt is too long"
    assert said == f"prompt is too long: 250000 tokens > 200000 maximum (cachecompact: {STILL_TOO_LONG})", said
    assert len(calls) == 2  # the request, and the one retry
    assert 'cachecompact_request_errors_total{mode="compact"} 1' in metrics, metrics


def test_the_dashboard_draws_the_window_the_engine_plans_with(emu: Emulator, tmp_path: Path) -> None:
    """A window given as the policy's (engine_options) is the one compaction works to: the session
    page draws it, not the model's 200k (an adversarial pass of issue 49 found the two apart)."""
    from cachecompact import EngineOptions, PolicyConfig

    opts = EngineOptions(config=PolicyConfig(window_tokens=50_000))
    with _proxy(emu.url, mode="compact", store=str(tmp_path), engine_options=opts) as px, \
            httpx2.Client(base_url=px.url, headers=API_VERSION) as http:
        c = anthropic.Anthropic(base_url=px.url, api_key="k", max_retries=0)
        c.messages.create(model=MODEL, max_tokens=50, messages=[{"role": "user", "content": "hello"}],
                          extra_headers={"x-cachecompact-session": "win"})
        px.wait_idle()
        page = http.get("/api/sessions/win").json()
    assert px.state.engine is not None and px.state.engine.window_tokens == 50_000
    assert page["window"] == 50_000 and page["window_source"] == "the policy's window_tokens"


@pytest.mark.parametrize("mode", ["observe", "compact"])
def test_a_conversation_compact_mode_leaves_unedited_is_billed_as_direct(tmp_path: Path, mode: str) -> None:
    """Issue 62's trial: at 1M, where it edited nothing, compact mode cost 0.4-2.3% more than
    direct with Claude Code, whose first request ends in a mid-conversation ``role: "system"``
    message (its context, ~2,800 tokens) that it marks itself. The renderer left system messages
    unmarked, so that first request wrote none of them to the cache and the next paid them again.
    The conversation here is shaped like Claude Code's; both modes are billed alike, request by
    request."""
    cc = {"type": "ephemeral"}
    system = [{"type": "text", "text": "You are a coding agent. " * 200, "cache_control": cc}]
    context = {"role": "system", "content": [{"type": "text", "text": "Repository notes: " + "fact " * 2500,
                                              "cache_control": cc}]}
    first = [{"role": "user", "content": [{"type": "text", "text": "<system-reminder>be brief</system-reminder>"},
                                          {"type": "text", "text": "fix the parser"}]}, context]
    reply = {"role": "assistant", "content": [{"type": "text", "text": "Which file?"}]}
    second = [*first, reply, {"role": "user", "content": [{"type": "text", "text": "parser.py", "cache_control": cc}]}]
    with Emulator() as emu, _proxy(emu.url, mode=mode, store=str(tmp_path)) as px, \
            httpx2.Client(base_url=px.url, timeout=30, headers=API_VERSION) as http:
        for msgs in (first, second):
            r = http.post("/v1/messages", json={"model": "claude-opus-5-5", "max_tokens": 500, "system": system,
                                                "messages": msgs}, headers={"x-api-key": "k"})
            assert r.status_code == 200, r.text[:300]
        px.wait_idle()
        usage = [(r["usage"]["input_tokens"], r["usage"]["cache_creation_input_tokens"],
                  r["usage"]["cache_read_input_tokens"]) for r in emu.requests if r.get("status") == 200]
    # the system message is written on the first request and read on the second, as direct
    assert usage[0][0] < 50 and usage[1][2] >= usage[0][1] > 2_500, usage
