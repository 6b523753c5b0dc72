"""The emulator (and the proxy in front of it) never answers 5xx and never hangs: a corpus of
hostile bodies in tests/hostile/, more than 1,000 generated requests, protocol-level garbage,
an oversized body, and 300 stalled connections."""

from __future__ import annotations

import json
import logging
import socket
import string
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from cachecompact.adapters.httpserver import MAX_BODY
from cachecompact.tools.emulator import Emulator
from cachecompact.tools.emulator._binding import ThinkingRules

from .conftest import API_VERSION
from .hostile_corpus import BASES

HOSTILE = Path(__file__).parent / "hostile"
MODEL = "claude-sonnet-4-6"


@pytest.fixture(scope="module")
def emu() -> Iterator[Emulator]:
    with Emulator() as e:
        yield e


@pytest.fixture(scope="module")
def http(emu: Emulator) -> Iterator[httpx2.Client]:
    with httpx2.Client(base_url=emu.url, timeout=10, headers=API_VERSION) as c:
        yield c


def _alive(http: httpx2.Client) -> None:
    r = http.post("/v1/messages", json={"model": MODEL, "max_tokens": 5,
                                        "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 200


def _api_shaped(r: httpx2.Response) -> None:
    assert r.status_code < 500, (r.status_code, r.text[:300])
    if r.status_code >= 400:
        body = r.json()
        assert body["type"] == "error" and body["error"]["type"] and body["error"]["message"]


@pytest.mark.parametrize("name", sorted(p.name for p in HOSTILE.iterdir()))
def test_hostile_corpus(http: httpx2.Client, name: str) -> None:
    raw = (HOSTILE / name).read_bytes()
    r = http.post("/v1/messages", content=raw, headers={"content-type": "application/json"})
    _api_shaped(r)
    if name not in ("control_chars.json",):
        assert r.status_code == 400, (name, r.text[:200])
    _alive(http)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20)
blocks = st.fixed_dictionaries({"type": st.sampled_from(["text", "image", "tool_use", "tool_result", "thinking",
                                                         "document", "x"])},
                                optional={"text": json_values, "id": json_values, "name": json_values,
                                          "input": json_values, "content": json_values, "source": json_values,
                                          "tool_use_id": json_values, "cache_control": json_values,
                                          "signature": json_values, "thinking": json_values})
messages = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "x"])},
                                          optional={"content": st.text(max_size=10) | st.lists(blocks, max_size=3)
                                                    | json_values}), max_size=4)
bodies = st.fixed_dictionaries({}, optional={
    "model": st.sampled_from([MODEL, "claude-haiku-4-5", "", "nope"]) | json_values,
    "max_tokens": st.integers(-5, 10**9) | json_values, "messages": messages | json_values,
    "system": st.text(max_size=10) | st.lists(blocks, max_size=2) | json_values,
    "tools": st.lists(st.fixed_dictionaries({"name": st.text(string.ascii_letters, max_size=6)},
                                            optional={"input_schema": json_values}), max_size=3) | json_values,
    "tool_choice": json_values, "thinking": json_values, "stream": st.booleans() | json_values,
    "cache_control": json_values, "temperature": json_values, "metadata": json_values,
    "context_management": json_values, "diagnostics": json_values})


@pytest.mark.slow
@settings(max_examples=1100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(body=bodies, path=st.sampled_from(["/v1/messages", "/v1/messages", "/v1/messages/count_tokens"]))
def test_generated_requests_never_get_a_5xx(http: httpx2.Client, body: dict[str, Any], path: str) -> None:
    r = http.post(path, content=json.dumps(body), headers={"content-type": "application/json"})
    _api_shaped(r)


def test_the_server_still_answers_after_the_fuzzing(http: httpx2.Client) -> None:
    _alive(http)


def _raw(url: str, data: bytes, timeout: float = 5.0) -> bytes:
    host, port = url.split("//")[1].split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(data)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
                if b"\r\n\r\n" in out and len(out) > 200:
                    break
        except TimeoutError:
            pass
        return out


@pytest.mark.parametrize("request_bytes", [
    b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
    b"FOO /v1/messages HTTP/1.1\r\nHost: x\r\n\r\n",
    b"POST /v1/messages HTTP/9.9\r\nHost: x\r\n\r\n",
    b"POST /v1/messages HTTP/1.1\r\nHost: x\r\n" + b"X-A: b\r\n" * 200 + b"\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 40,
])
def test_protocol_garbage_gets_a_4xx_in_the_apis_shape(emu: Emulator, http: httpx2.Client,
                                                         request_bytes: bytes) -> None:
    out = _raw(emu.url, request_bytes)
    status = int(out.split(b" ", 2)[1]) if out.startswith(b"HTTP/") else 0
    assert 400 <= status < 500, out[:200]
    assert b'"type": "error"' in out or b'"type":"error"' in out
    _alive(http)


def test_an_oversized_body_is_a_413_before_it_is_read(emu: Emulator, http: httpx2.Client) -> None:
    head = (f"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {MAX_BODY + 1}\r\n\r\n").encode()
    out = _raw(emu.url, head)
    assert out.startswith(b"HTTP/1.1 413") and b"request_too_large" in out
    _alive(http)


def test_300_stalled_connections_do_not_block_anyone(emu: Emulator, http: httpx2.Client) -> None:
    host, port = emu.url.split("//")[1].split(":")
    stalled = []
    try:
        for _ in range(300):
            s = socket.create_connection((host, int(port)), timeout=5)
            s.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n")  # headers never end
            stalled.append(s)
        t0 = time.perf_counter()
        for _ in range(5):
            _alive(http)  # served at once: no thread is tied to a stalled connection
        assert time.perf_counter() - t0 < 5
    finally:
        for s in stalled:
            s.close()


def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth


def _new_hostile() -> dict[str, bytes]:
    """Bodies the servers once answered with a 500 (RecursionError, ValueError): nesting 5,000
    deep in the system prompt, a message and a tool input, and a 5,000-digit integer."""
    user = '{"role":"user","content":"x"}'
    base = f'"model":"{MODEL}","max_tokens":5'
    return {
        "deep_system": f'{{{base},"system":{_deep(5000)},"messages":[{user}]}}'.encode(),
        "deep_message": f'{{{base},"messages":[{{"role":"user","content":{_deep(5000)}}}]}}'.encode(),
        "deep_tool_input": (f'{{{base},"messages":[{user},{{"role":"assistant","content":[{{"type":"tool_use",'
                            f'"id":"toolu_1","name":"t","input":{{"a":{_deep(5000)}}}}}]}}]}}').encode(),
        "int_5000_digits": f'{{"model":"{MODEL}","max_tokens":1{"0" * 5000},"messages":[{user}]}}'.encode(),
    }


def _scalar_content() -> dict[str, bytes]:
    """Message content that is a number or a boolean (issue 56: the proxies' background analysis
    raised `TypeError` on them), in the first user message and in a later one."""
    out = {}
    for label, v in (("int", "5"), ("float", "1.5"), ("bool", "true"), ("false", "false")):
        out[f"content_{label}"] = (f'{{"model":"{MODEL}","max_tokens":5,'
                                   f'"messages":[{{"role":"user","content":{v}}}]}}').encode()
        out[f"content_{label}_later"] = (
            f'{{"model":"{MODEL}","max_tokens":5,"messages":[{{"role":"user","content":"hi"}},'
            f'{{"role":"assistant","content":{v}}},{{"role":"user","content":[{{"type":"text","text":"x"}}]}}]}}').encode()
    return out


@pytest.mark.parametrize("server", ["emulator", "observe", "compact"])
def test_hostile_bodies_get_4xx_on_every_server(server: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
                                                ) -> None:
    """The hostile corpus, the bodies above, scalar message content and Content-Encodings over
    bytes that are not so encoded, on the emulator and on both proxy modes in front of it: a JSON
    4xx each, never a 5xx (compact mode forwards what it cannot parse unchanged, so the upstream's
    400 comes back), and no traceback logged anywhere, the proxies' background analysis included
    (issue 56: a `TypeError` on scalar content, an aiohttp traceback on a broken encoding)."""
    from contextlib import ExitStack

    from cachecompact.adapters.proxy import Proxy, ProxyConfig

    caplog.set_level(logging.WARNING)
    with ExitStack() as stack:
        emu = stack.enter_context(Emulator(thinking=BIND))
        url = emu.url
        px = None
        if server != "emulator":
            px = stack.enter_context(Proxy(ProxyConfig(upstream=emu.url, port=0, mode=server,
                                                       store=str(tmp_path / "store"))))
            url = px.url
        with httpx2.Client(base_url=url, timeout=30, headers={**API_VERSION, "x-api-key": "k"}) as c:
            bodies = {p.name: p.read_bytes() for p in sorted(HOSTILE.iterdir())} | _new_hostile() | _scalar_content()
            for name, raw in bodies.items():
                r = c.post("/v1/messages", content=raw, headers={"content-type": "application/json"})
                _api_shaped(r)
                assert r.status_code < 500 and (r.status_code >= 400 or name == "control_chars.json"), name
            for enc in ("gzip", "deflate", "br", "zstd", "x-made-up"):
                for raw in (b'{"model": "x"}' * 50, json.dumps(BASES["simple"]).encode()):
                    r = c.post("/v1/messages", content=raw,
                               headers={"content-type": "application/json", "content-encoding": enc})
                    _api_shaped(r)
                    assert r.status_code < 500 and (r.status_code == 400 or enc not in ("gzip", "deflate")), \
                        (enc, r.status_code, r.text[:200])
            r = c.post("/v1/messages", content=b'{"model": "x"}' * 50,
                       headers={"content-type": "application/json", "content-encoding": "gzip"})
            assert r.status_code == 400 and "gzip" in r.json()["error"]["message"], r.text[:200]
            _alive(c)
        if px is not None:
            px.wait_idle()  # the background analysis of every exchange has run
    # a lone surrogate (hostile/lone_surrogate.json) passes through with one warning, no traceback
    tracebacks = [f"{r.name}: {r.getMessage()[:200]}" for r in caplog.records
                  if r.exc_info or "Traceback" in r.getMessage()]
    assert tracebacks == [], tracebacks


# -- every field of the request schema, with every wrong type, on all three servers ------------------------

# A request that uses every field the Messages API documents and the servers read (valid as a
# whole on the emulator): each of its paths is replaced, one at a time, by values of every JSON
# type, and removed. A wrong type anywhere is the client's mistake: a 4xx, never a 5xx.
RICH: dict[str, Any] = {
    "model": MODEL, "max_tokens": 2048, "stream": False, "temperature": 0.5, "top_p": 0.9, "top_k": 5,
    "stop_sequences": ["STOP"], "metadata": {"user_id": "u-1"}, "service_tier": "auto",
    "system": [{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
    "tools": [{"name": "bash", "description": "Run a command.", "cache_control": {"type": "ephemeral", "ttl": "1h"},
               "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}],
    "tool_choice": {"type": "auto", "disable_parallel_tool_use": False},
    "thinking": {"type": "enabled", "budget_tokens": 1024},
    "output_config": {"effort": "high"},
    "diagnostics": {"previous_message_id": None},
    "context_management": {"edits": [{
        "type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens", "value": 100_000},
        "keep": {"type": "tool_uses", "value": 1}, "clear_at_least": {"type": "input_tokens", "value": 0},
        "exclude_tools": ["bash"], "clear_tool_inputs": False}]},
    "messages": [
        {"role": "user", "content": [
            {"type": "text", "text": "Look at this.", "citations": None},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
            {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "a document"},
             "title": "notes"}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "I will list files.", "signature": "c2lnbmF0dXJl"},
            {"type": "text", "text": "Listing."},
            {"type": "tool_use", "id": "toolu_01", "name": "bash", "input": {"command": "ls"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_01", "is_error": False,
             "cache_control": {"type": "ephemeral", "ttl": "5m"},
             "content": [{"type": "text", "text": "a.py"}, {"type": "tool_reference", "tool_name": "bash"}]},
            {"type": "text", "text": "Go on."}]},
    ],
}
WRONG: tuple[Any, ...] = (None, 0, -1, 2.5, True, "", "x", [], [1], {}, {"a": 1})


def _paths(value: Any, at: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield at
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*at, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, (*at, i))


def _replaced(path: tuple[Any, ...], new: Any, delete: bool = False) -> dict[str, Any]:
    body = json.loads(json.dumps(RICH))
    parent = body
    for key in path[:-1]:
        parent = parent[key]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = new
    return body  # type: ignore[no-any-return]


def _walk_bodies() -> Iterator[tuple[str, dict[str, Any]]]:
    for path in _paths(RICH):
        if not path:
            continue
        name = ".".join(str(p) for p in path)
        for new in WRONG:
            yield f"{name}={json.dumps(new)}", _replaced(path, new)
        if isinstance(path[-1], str):
            yield f"{name} removed", _replaced(path, None, delete=True)


# RICH's thinking block carries a made-up signature, which the API (and the emulator by default)
# refuses; the schema walk is about the fields, so its emulators bind such a signature instead
BIND = ThinkingRules(foreign_signatures="bind")


def test_the_rich_request_is_valid() -> None:
    """The walk starts from a request the emulator accepts, so every 4xx it sees is the mutation's."""
    with Emulator(thinking=BIND) as emu, httpx2.Client(base_url=emu.url, timeout=10, headers=API_VERSION) as c:
        r = c.post("/v1/messages", json=RICH)
        assert r.status_code == 200, r.text[:300]


@pytest.mark.parametrize("server", ["emulator", pytest.param("observe", marks=pytest.mark.slow),
                                    pytest.param("compact", marks=pytest.mark.slow)])
def test_every_field_with_every_wrong_type_is_a_4xx(server: str, tmp_path: Path) -> None:
    from contextlib import ExitStack

    from cachecompact.adapters.proxy import Proxy, ProxyConfig

    with ExitStack() as stack:
        emu = stack.enter_context(Emulator(thinking=BIND))
        url = emu.url
        if server != "emulator":
            url = stack.enter_context(Proxy(ProxyConfig(upstream=emu.url, port=0, mode=server,
                                                        store=str(tmp_path / "store")))).url
        bad = []
        n = 0
        with httpx2.Client(base_url=url, timeout=30, headers={**API_VERSION, "x-api-key": "k"}) as c:
            for name, body in _walk_bodies():
                for path in ("/v1/messages", "/v1/messages/count_tokens"):
                    r = c.post(path, content=json.dumps(body), headers={"content-type": "application/json"})
                    n += 1
                    if r.status_code >= 500 or (r.status_code >= 400 and r.json().get("type") != "error"):
                        bad.append(f"{path} {name}: {r.status_code} {r.text[:160]}")
            _alive(c)
        assert n > 1000
        assert not bad, "\n".join(bad[:40])
