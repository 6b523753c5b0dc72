"""The proxy's upstream client against scripted raw HTTP servers: every framing, keep-alive reuse,
a stale pooled connection, breaks, stalls, backpressure and the pool's bound.

The servers here are plain asyncio sockets that write exact bytes, so each case is the wire
behaviour it names (the emulator-backed proxy tests cover the client with a real server).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

import pytest

from cachecompact.adapters.httpserver import HEADER_TIMEOUT_S
from cachecompact.adapters.proxy._upstream import (
    HIGH_WATER,
    IDLE_KEEPALIVE_S,
    UpstreamError,
    UpstreamPool,
    upstream_base,
)
from cachecompact.base.errors import ConfigError

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, dict[str, Any]], Awaitable[None]]


async def _read_request(r: asyncio.StreamReader) -> tuple[bytes, bytes] | None:
    """One request's head and body (Content-Length framed), or None at EOF."""
    try:
        head = await r.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return head, await r.readexactly(length) if length else b""


def _run(handler: Handler, test: Callable[[UpstreamPool, dict[str, Any]], Awaitable[None]],
         **pool_kw: Any) -> dict[str, Any]:
    """Serve ``handler`` on a free port and run ``test`` with a pool pointed at it."""
    state: dict[str, Any] = {"connections": 0, "requests": []}

    async def main() -> None:
        async def on_conn(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            state["connections"] += 1
            try:
                await handler(r, w, state)
            except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
                pass  # the test ended first
            finally:
                w.close()

        server = await asyncio.start_server(on_conn, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        pool = UpstreamPool(f"http://127.0.0.1:{port}", **pool_kw)
        try:
            await asyncio.wait_for(test(pool, state), 20)
        finally:
            await pool.close()
            server.close()

    asyncio.run(main())
    return state


def _keepalive(body: bytes, extra: bytes = b"") -> Handler:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter, state: dict[str, Any]) -> None:
        while (req := await _read_request(r)) is not None:
            state["requests"].append(req)
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nX-Up: yes\r\n%s\r\n" % (len(body), extra) + body)
            await w.drain()
    return handler


def test_content_length_body_and_keep_alive_reuse() -> None:
    async def test(pool: UpstreamPool, state: dict[str, Any]) -> None:
        for k in range(3):
            async with await pool.request("POST", f"/v1/messages?beta=true&k={k}",
                                          [("x-api-key", "sk"), ("anthropic-version", "2023-06-01")], b'{"a":1}') as r:
                assert (r.status, r.reason, r.headers["x-up"], r.content_length) == (200, "OK", "yes", 5)
                assert await r.read() == b"hello"

    state = _run(_keepalive(b"hello"), test)
    assert state["connections"] == 1  # one connection, reused
    head, body = state["requests"][0]
    assert head.startswith(b"POST /v1/messages?beta=true&k=0 HTTP/1.1\r\nHost: 127.0.0.1:")
    assert b"x-api-key: sk\r\n" in head and b"Content-Length: 7\r\n" in head and body == b'{"a":1}'


def test_a_base_path_prefixes_every_target() -> None:
    async def main() -> None:
        seen: list[bytes] = []

        async def on_conn(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            req = await _read_request(r)
            assert req is not None
            seen.append(req[0].split(b"\r\n")[0])
            w.write(b"HTTP/1.1 204 No Content\r\n\r\n")
            await w.drain()
            w.close()

        server = await asyncio.start_server(on_conn, "127.0.0.1", 0)
        pool = UpstreamPool(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/anthropic/")
        async with await pool.request("GET", "/v1/models", [], b"") as r:
            assert r.status == 204 and await r.read() == b""
        await pool.close()
        server.close()
        assert seen == [b"GET /anthropic/v1/models HTTP/1.1"]

    asyncio.run(main())


def test_chunked_body_arrives_chunk_by_chunk() -> None:
    """The second chunk is sent only after the client has the first: nothing waits for the end."""
    got_first = asyncio.Event()

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter, state: dict[str, Any]) -> None:
        await _read_request(r)
        w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                b"6\r\nevent1\r\n")
        await w.drain()
        await asyncio.wait_for(got_first.wait(), 5)
        w.write(b"6\r\nevent2\r\n0\r\n\r\n")
        await w.drain()
        await _read_request(r)

    async def test(pool: UpstreamPool, state: dict[str, Any]) -> None:
        async with await pool.request("POST", "/v1/messages", [], b"{}") as r:
            chunks = []
            async for c in r.iter_chunks():
                chunks.append(c)
                got_first.set()
            assert chunks == [b"event1", b"event2"]
            assert r.content_length is None

    _run(handler, test)


def test_body_until_close_interim_responses_and_head() -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter, state: dict[str, Any]) -> None:
        req = await _read_request(r)
        assert req is not None
        if req[0].startswith(b"HEAD"):
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n")  # and no body, as HEAD says
        else:
            w.write(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n"
                    b'{"until": "close"}')
        await w.drain()
        w.close()

    async def test(pool: UpstreamPool, state: dict[str, Any]) -> None:
        async with await pool.request("POST", "/x", [], b"1") as r:
            assert r.status == 200 and await r.read() == b'{"until": "close"}'
        async with await pool.request("HEAD", "/x", [], b"") as r:
            assert r.status == 200 and r.content_length == 10 and await r.read() == b""

    state = _run(handler, test)
    assert state["connections"] == 2  # neither response leaves a reusable connection


def test_a_pooled_connection_the_upstream_closed_is_retried_once() -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter, state: dict[str, Any]) -> None:
        req = await _read_request(r)
        if req is None:
            return
        state["requests"].append(req)
        w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")  # says keep-alive, then closes
        await w.drain()

    async def test(pool: UpstreamPool, state: dict[str, Any]) -> None:
        for _ in range(3):
            async with await pool.request("POST", "/v1/messages", [], b"{}") as r:
                assert await r.read() == b"ok"
            await asyncio.sleep(0.05)  # the close reaches the pooled connection (or not: both paths work)

    state = _run(handler, test)
    assert len(state["requests"]) == 3  # each request reached the upstream exactly once


def test_a_reused_connection_dropped_without_an_answer_is_retried_on_a_fresh_one() -> None:
    """The race a pool cannot avoid: the upstream closes an idle keep-alive connection just as a
    request is written on it. No response byte came back: an idempotent request is sent again,
    once; a POST is not (RFC 9110 9.2.2), it fails as a 502 would."""
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter, state: dict[str, Any]) -> None:
        served = 0
        while (req := await _read_request(r)) is not None:
            state["requests"].append(req)
            if served == 1:
                return  # the second request on this connection: closed unanswered
            served += 1
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await w.drain()

    async def test(pool: UpstreamPool, state: dict[str, Any]) -> None:
        for _ in range(2):
            async with await pool.request("GET", "/v1/models", [], b"") as r:
                assert await r.read() == b"ok"

    state = _run(handler, test)
    assert state["connections"] == 2 and len(state["requests"]) == 3

    async def post(pool: UpstreamPool, state: dict[str, Any]) -> None:
        async with await pool.request("POST", "/v1/messages", [], b"{}") as r:
            assert await r.read() == b"ok"
        with pytest.raises(UpstreamError, match="closed the connection"):  # the upstream may have acted on it
            await pool.request("POST", "/v1/messages", [], b"{}")

    state = _run(handler, post)
    assert state["connections"] == 1 and len(state["requests"]) == 2


def test_a_response_broken_off_midway_is_an_error_and_not_reused() -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter, state: dict[str, Any]) -> None:
        await _read_request(r)
        w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly ten b")
        await w.drain()

    async def test(pool: UpstreamPool, state: dict[str, Any]) -> None:
        async with await pool.request("POST", "/x", [], b"{}") as r:
            with pytest.raises(UpstreamError, match="broke off"):
                await r.read()

    _run(handler, test)


def test_a_stalled_upstream_times_out() -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter, state: dict[str, Any]) -> None:
        await _read_request(r)
        w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
        await w.drain()
        await asyncio.sleep(10)

    async def test(pool: UpstreamPool, state: dict[str, Any]) -> None:
        async with await pool.request("POST", "/x", [], b"{}") as r:
            with pytest.raises(UpstreamError, match="sent nothing"):
                async for _ in r.iter_chunks():
                    pass

    _run(handler, test, read_timeout=0.4)


def test_no_response_at_all_times_out() -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter, state: dict[str, Any]) -> None:
        await _read_request(r)
        await asyncio.sleep(10)

    async def test(pool: UpstreamPool, state: dict[str, Any]) -> None:
        with pytest.raises(UpstreamError, match="sent nothing"):
            await pool.request("POST", "/x", [], b"{}")

    _run(handler, test, read_timeout=0.4)


def test_malformed_http_and_refused_connections_are_upstream_errors() -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter, state: dict[str, Any]) -> None:
        await _read_request(r)
        w.write(b"SMTP ready\r\n\r\n")
        await w.drain()

    async def test(pool: UpstreamPool, state: dict[str, Any]) -> None:
        with pytest.raises(UpstreamError, match="malformed HTTP"):
            await pool.request("POST", "/x", [], b"{}")

    _run(handler, test)

    async def refused() -> None:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        pool = UpstreamPool(f"http://127.0.0.1:{port}")
        with pytest.raises(UpstreamError, match=f"cannot connect to 127.0.0.1:{port}"):
            await pool.request("GET", "/", [], b"")
        await pool.close()

    asyncio.run(refused())


def test_header_injection_and_bad_request_lines_are_refused_before_sending() -> None:
    async def test(pool: UpstreamPool, state: dict[str, Any]) -> None:
        with pytest.raises(UpstreamError, match="line break"):
            await pool.request("POST", "/x", [("x-a", "1\r\nHost: evil")], b"")
        with pytest.raises(UpstreamError, match="malformed request line"):
            await pool.request("POST", "/x HTTP/1.1\r\nX: y", [], b"")
        with pytest.raises(UpstreamError, match="malformed request line"):
            await pool.request("GET", "http://elsewhere/", [], b"")

    state = _run(_keepalive(b"ok"), test)
    assert state["connections"] == 0 and state["requests"] == []


def test_a_slow_reader_pauses_the_upstream_and_gets_every_byte() -> None:
    body = bytes(range(256)) * (5 * HIGH_WATER // 256)
    paused: list[bool] = []

    async def test(pool: UpstreamPool, state: dict[str, Any]) -> None:
        async with await pool.request("GET", "/big", [], b"") as r:
            parts = []
            async for c in r.iter_chunks():
                parts.append(c)
                await asyncio.sleep(0.01)  # a client slower than loopback
                paused.append(r._conn._paused)
            assert b"".join(parts) == body
            assert max(map(len, parts)) <= 2 * HIGH_WATER  # what waits for the client stays bounded

    _run(_keepalive(body), test)
    assert any(paused)


def test_the_pool_bound_queues_requests_and_an_abandoned_response_closes_its_connection() -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter, state: dict[str, Any]) -> None:
        while (req := await _read_request(r)) is not None:
            if req[0].startswith(b"GET /1 "):  # a stream that is still going when the client leaves
                w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n")
            else:
                w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await w.drain()

    async def test(pool: UpstreamPool, state: dict[str, Any]) -> None:
        first = await pool.request("GET", "/1", [], b"")
        second = asyncio.ensure_future(pool.request("GET", "/2", [], b""))
        await asyncio.sleep(0.2)
        assert not second.done()  # limit=1: waits for the first to be released
        first.release()  # abandoned before its body ended
        r2 = await second
        assert await r2.read() == b"ok"
        r2.release()
        async with await pool.request("GET", "/3", [], b"") as r3:  # a complete response's connection is reused
            assert await r3.read() == b"ok"

    state = _run(handler, test, limit=1)
    assert state["connections"] == 2  # the abandoned connection was not reused; the complete one was


def _scripted(*replies: bytes, close_after: bool = False) -> Handler:
    """Answer the k-th request on a connection with ``replies[k]`` (exact bytes)."""
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter, state: dict[str, Any]) -> None:
        for reply in replies:
            req = await _read_request(r)
            if req is None:
                return
            state["requests"].append(req)
            w.write(reply)
            await w.drain()
        if close_after:
            return
        await _read_request(r)
    return handler


def test_bytes_after_a_complete_response_never_reach_it_or_the_next_one() -> None:
    """An upstream (or middlebox) that sends more than one response: the first stays as it was,
    the connection is closed, and the next request gets a fresh one."""
    extra = (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Which: first\r\n\r\nok"
             b"HTTP/1.1 500 Injected\r\nContent-Length: 5\r\nX-Which: second\r\n\r\nST")

    async def test(pool: UpstreamPool, state: dict[str, Any]) -> None:
        async with await pool.request("GET", "/a", [], b"") as r:
            assert (r.status, r.headers.getall("x-which"), await r.read()) == (200, ["first"], b"ok")
        async with await pool.request("GET", "/b", [], b"") as r:
            assert (r.status, await r.read()) == (200, b"ok")

    state = _run(_scripted(extra, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"), test)
    assert state["connections"] == 2


def test_a_body_until_close_cut_by_a_reset_is_an_error_not_a_short_body() -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter, state: dict[str, Any]) -> None:
        await _read_request(r)
        w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\nevent: partial\n")
        await w.drain()
        sock = w.get_extra_info("socket")
        import socket
        import struct
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST
        w.transport.abort()

    async def test(pool: UpstreamPool, state: dict[str, Any]) -> None:
        async with await pool.request("POST", "/x", [], b"{}") as r:
            with pytest.raises(UpstreamError, match="broke off"):
                await r.read()

    _run(handler, test)


def test_only_a_final_chunked_coding_frames_the_body() -> None:
    """``Transfer-Encoding: chunked, gzip`` (or a second TE header) is read until close, and a
    clean close ends it."""
    reply = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: gzip\r\n\r\nabcdef"

    async def test(pool: UpstreamPool, state: dict[str, Any]) -> None:
        async with await pool.request("GET", "/x", [], b"") as r:
            assert await r.read() == b"abcdef"

    _run(_scripted(reply, close_after=True), test)


def test_idle_connections_past_keep_alive_are_closed_and_a_full_pool_wait_is_bounded() -> None:
    async def idle(pool: UpstreamPool, state: dict[str, Any]) -> None:
        held = [await pool.request("GET", f"/{k}", [], b"") for k in range(3)]
        for r in held:
            await r.read()
            r.release()
        await asyncio.sleep(1.0)  # several sweeps at keepalive_s / 2
        assert not pool._idle and not pool._all  # all closed and forgotten

    _run(_keepalive(b"ok"), idle, keepalive_s=0.3)

    async def full(pool: UpstreamPool, state: dict[str, Any]) -> None:
        first = await pool.request("GET", "/a", [], b"")
        with pytest.raises(UpstreamError, match=r"no upstream connection became free within 0\.3 s"):
            await pool.request("GET", "/b", [], b"")
        first.release()

    _run(_keepalive(b"ok"), full, limit=1, connect_timeout=0.3)


def test_header_bytes_pass_unchanged_both_ways_and_userinfo_is_refused() -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter, state: dict[str, Any]) -> None:
        req = await _read_request(r)
        state["requests"].append(req)
        w.write("HTTP/1.1 200 OK\r\nX-Up: café €\r\nContent-Length: 0\r\n\r\n".encode())
        await w.drain()

    async def test(pool: UpstreamPool, state: dict[str, Any]) -> None:
        async with await pool.request("GET", "/h", [("X-Title", "café €")], b"") as r:
            assert r.headers["x-up"] == "café €"

    state = _run(handler, test)
    assert "X-Title: café €".encode() in state["requests"][0][0]
    with pytest.raises(ValueError, match="user name or password"):
        UpstreamPool("http://svc:secret@127.0.0.1:1")


def test_idle_connections_are_given_up_before_an_upstream_closes_them() -> None:
    """Reusing a connection the upstream is closing resets a POST, which is not re-sent: the
    pool's idle limit stays under this package's own server idle timeout and Node's 5 s."""
    assert min(HEADER_TIMEOUT_S, 5.0) > IDLE_KEEPALIVE_S
    assert UpstreamPool("http://127.0.0.1:1").keepalive_s == IDLE_KEEPALIVE_S


@pytest.mark.parametrize(("given", "base"), [
    ("https://api.anthropic.com", "https://api.anthropic.com"),
    ("https://api.anthropic.com/", "https://api.anthropic.com"),
    ("http://localhost:8080/v1", "http://localhost:8080"),
    ("http://localhost:8080/v1/", "http://localhost:8080"),
    ("HTTP://localhost:8080/v1", "http://localhost:8080"),
    ("https://gw.example/anthropic/v1", "https://gw.example/anthropic"),
    ("https://gw.example/anthropic/", "https://gw.example/anthropic"),
    ("http://[::1]:8080/v1", "http://[::1]:8080"),
    ("http://v1.example", "http://v1.example"),
    ("http://h/api/v10", "http://h/api/v10"),
])
def test_an_upstream_is_its_base_url_without_a_trailing_v1(given: str, base: str) -> None:
    """Clients send /v1/messages themselves, so an SDK-style base URL ending in /v1 would double
    it (issue 62); once checked, a base URL stays as it is."""
    assert upstream_base(given) == base == upstream_base(base)
    assert UpstreamPool(given).prefix == urlsplit(base).path  # what goes before each request's own path


@pytest.mark.parametrize(("given", "says"), [
    ("http://", "names no host"),
    ("http://:8080", "names no host"),
    ("localhost:8080", "must be an http:// or https:// URL"),
    ("ftp://h", "must be an http:// or https:// URL"),
    ("", "must be an http:// or https:// URL"),
    ("http://localhost:abc", "has port 'abc'"),
    ("http://localhost:0", "has port '0'"),
    ("http://localhost:70000", "has port '70000'"),
    ("http://[::1]:x", "has port 'x'"),
    ("http://localhost:8080 ", "contains a space"),
    (" http://localhost:8080", "contains a space"),
    ("http://local\thost", "contains a space"),
    ("http://[::1", "an IPv6 address goes in brackets"),
    ("http://h/v1/messages", "give the base URL (http://h)"),
    ("http://h?key=1", "carries a query or fragment"),
    ("http://h#x", "carries a query or fragment"),
    ("http://svc:secret@h", "user name or password"),
])
def test_a_bad_upstream_is_a_config_error_naming_the_flag(given: str, says: str) -> None:
    for check in (upstream_base, UpstreamPool):
        with pytest.raises(ConfigError, match=r"^--upstream ") as err:
            check(given)
        assert says in str(err.value) and "\n" not in str(err.value)
