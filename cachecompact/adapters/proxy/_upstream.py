"""The proxy's upstream client: a pooled keep-alive HTTP/1.1 client on asyncio protocols, with
``httptools`` (llhttp, the parser of Node.js) reading the responses.

Why not aiohttp's client, which the proxy used first: over loopback it cost about 0.4 ms of CPU
per request (request and response objects, cookie and redirect machinery, header
normalisation), most of what the proxy added to a request. A proxy needs none of that: it sends
bytes it was given and relays bytes it gets back. This client writes each request with one
``write`` and hands the response's body chunks over as llhttp delivers them; the side-by-side
numbers are in docs/benchmarks.md.

What it does, because a relay must:

* **keep-alive pool**, bounded (``limit`` connections in use at once, the rest wait); an idle
  connection is dropped after ``keepalive_s`` or when the upstream closes it;
* **a reused connection that the upstream had closed** (the request met a dead socket and no
  response byte came back) is retried once on a fresh connection for an idempotent method
  (RFC 9110 9.2.2); a ``POST`` is not re-sent behind the caller's back: it gets a 502, and its
  SDK's own retry policy decides. A pooled connection the upstream closed while idle is noticed
  before reuse, so this race is rare;
* **every framing the server may choose**: ``Content-Length``, chunked, read-until-close, no
  body (``HEAD``, 204, 304), interim 1xx responses skipped; nothing is decompressed;
* **backpressure**: reading from the upstream pauses while more than `HIGH_WATER` bytes wait
  for a slow client;
* **timeouts**: connect, and between two reads (a stalled upstream is an error, not a hang; one
  sweep timer for the whole pool checks it);
* **TLS** with the system's trust store for ``https://`` upstreams.

Errors are `UpstreamError` (the proxy answers 502). A response not read to its end closes its
connection instead of returning it to the pool.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import time
from collections.abc import AsyncIterator, Iterable
from types import TracebackType
from typing import cast
from urllib.parse import urlsplit

import httptools
from multidict import CIMultiDict

from ...base.errors import ConfigError

__all__ = ["HIGH_WATER", "RequestRefused", "UpstreamError", "UpstreamPool", "UpstreamResponse", "upstream_base"]

HIGH_WATER = 1 << 20  # bytes buffered for a slow client before reading from the upstream pauses
_NO_BODY_STATUS = frozenset({204, 304})
# RFC 9110 9.2.2: only these are re-sent on their own; a POST the upstream may have acted on is not
IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})


class UpstreamError(Exception):
    """The upstream could not be reached, or broke off a response."""


class RequestRefused(UpstreamError):
    """The request cannot be forwarded as given (a line break in a header, a bad target); nothing
    was sent. The caller's error (a 400), not the upstream's."""


def _text(raw: bytes) -> str:
    """A response header as text: UTF-8 (the server re-encodes it as UTF-8, so the bytes reach
    the client unchanged), else Latin-1 (every byte kept as a character, none dropped)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


class UpstreamResponse:
    """One response: status and headers once they arrived, then its body chunk by chunk.

    Use it as an async context manager (or call `release`): a response read to its end gives its
    connection back to the pool; one abandoned early closes it.
    """

    def __init__(self, conn: _Connection, method: str) -> None:
        self._conn = conn
        self.method = method
        self.status = 0
        self.reason = ""
        self.headers: CIMultiDict[str] = CIMultiDict()
        self._raw_headers: list[tuple[bytes, bytes]] = []
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._wake: asyncio.Future[None] | None = None
        self._head: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.complete = False
        self.keep_alive = False
        self._error: BaseException | None = None
        self._released = False
        self.bytes_seen = 0

    @property
    def content_length(self) -> int | None:
        v = self.headers.get("content-length")
        return int(v) if v is not None and v.isdigit() else None

    # ---- fed by the connection -------------------------------------------------------------
    def _headers_done(self, status: int) -> None:
        self.status = status
        self.headers = CIMultiDict((_text(k), _text(v)) for k, v in self._raw_headers)
        if not self._head.done():
            self._head.set_result(None)

    def _feed(self, chunk: bytes) -> None:
        self._chunks.append(chunk)
        self._buffered += len(chunk)
        if self._buffered > HIGH_WATER:
            self._conn.pause()
        self._notify()

    def _finish(self, keep_alive: bool) -> None:
        self.complete = True
        self.keep_alive = keep_alive
        self._notify()

    def _fail(self, err: BaseException) -> None:
        if self.complete:
            return
        self._error = err
        if not self._head.done():
            self._head.set_exception(err)
            self._head.exception()  # retrieved here: the waiter re-raises it
        self._notify()

    def _notify(self) -> None:
        w = self._wake
        if w is not None and not w.done():
            w.set_result(None)

    # ---- read by the proxy -----------------------------------------------------------------
    async def _wait_head(self) -> None:
        await self._head  # a stalled upstream is failed by the pool's sweep, not by a timer per request

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        """The body's chunks as they arrive (raises `UpstreamError` if the upstream breaks off)."""
        while True:
            if self._chunks:
                # what has arrived, in one piece: one write to the client instead of one per read
                chunk = self._chunks.popleft() if len(self._chunks) == 1 else b"".join(self._chunks)
                self._chunks.clear()
                self._buffered = 0
                self._conn.resume()
                yield chunk
                continue
            if self._error is not None:
                raise UpstreamError(f"the upstream broke off the response: {self._error}") from self._error
            if self.complete:
                return
            self._wake = asyncio.get_running_loop().create_future()
            try:
                await self._wake
            finally:
                self._wake = None

    async def read(self) -> bytes:
        """The whole body."""
        return b"".join([c async for c in self.iter_chunks()])

    def release(self) -> None:
        """Give the connection back (response complete and reusable) or close it."""
        if self._released:
            return
        self._released = True
        self._conn.done(self)

    async def __aenter__(self) -> UpstreamResponse:
        return self

    async def __aexit__(self, et: type[BaseException] | None, ev: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.release()


class _Connection(asyncio.Protocol):
    """One upstream connection: llhttp parses what arrives into the current response."""

    def __init__(self, pool: UpstreamPool) -> None:
        self.pool = pool
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.response: UpstreamResponse | None = None
        self.closed = False
        self.idle_since = self.last_io = time.monotonic()
        self._paused = False
        self._reason = b""
        self._until_close = False
        self._ended = False  # the current response's message is complete: any further byte is a protocol error
        self._spoiled = False  # bytes came after the end of a response: never reuse this connection

    # asyncio protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self.last_io = time.monotonic()
        r = self.response
        if r is None or self._ended:  # bytes nobody asked for: the connection cannot be trusted again
            self._spoiled = True
            self.close()
            return
        r.bytes_seen += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            r._fail(UpstreamError("the upstream switched protocols, which the proxy does not relay"))
            self.close()
        except httptools.HttpParserError as err:
            r._fail(UpstreamError(f"the upstream sent malformed HTTP: {err}"))
            self.close()
        if self._spoiled:
            self.close()

    def eof_received(self) -> bool:
        return False  # close the transport: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        r = self.response
        if r is not None and not r.complete:
            if self._until_close and r._head.done() and exc is None and r._error is None:
                r._finish(False)  # a body delimited by the end of the connection ends here (not at a reset)
            else:
                r._fail(exc or ConnectionResetError("the upstream closed the connection"))
        self.pool._forget(self)

    # llhttp callbacks
    def on_message_begin(self) -> None:
        if self._ended:  # a second response where one was asked for
            self._spoiled = True
            return
        if self.response is not None:
            self.response._raw_headers = []
        self._reason = b""

    def on_status(self, status: bytes) -> None:
        if not self._ended:
            self._reason += status

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.response is not None and not self._ended:
            self.response._raw_headers.append((name, value))

    def on_headers_complete(self) -> None:
        r = self.response
        if r is None or self._ended:
            return
        status = self.parser.get_status_code()
        if 100 <= status < 200:
            return  # an interim response (100 Continue, 103 Early Hints): the real one follows
        r.reason = self._reason.decode("latin-1", "replace")
        r._headers_done(status)
        codings = ",".join(r.headers.getall("transfer-encoding", ())).split(",")
        chunked = codings[-1].strip().lower() == "chunked"  # only a final "chunked" frames the body
        self._until_close = "content-length" not in r.headers and not chunked and status not in _NO_BODY_STATUS
        if r.method == "HEAD":  # no body follows, whatever the headers say; not reused (llhttp would wait)
            self._until_close = False
            self._ended = True
            r._finish(False)

    def on_body(self, body: bytes) -> None:
        r = self.response
        if r is not None and not r.complete and not self._ended:
            r._feed(body)

    def on_message_complete(self) -> None:
        r = self.response
        if r is None or self._ended or r.complete or not r._head.done():
            return  # the end of a 1xx, of a HEAD response already finished, or of bytes after the end
        self._ended = True
        r._finish(self.parser.should_keep_alive() and not self._until_close)

    # pool side
    def send(self, response: UpstreamResponse, data: bytes) -> None:
        assert self.transport is not None
        self.response = response
        self._ended = False
        self.last_io = time.monotonic()
        self.transport.write(data)

    def done(self, response: UpstreamResponse) -> None:
        self.response = None
        if response.complete and response.keep_alive and not (self.closed or self._paused or self._spoiled):
            self.idle_since = time.monotonic()
            self.pool._put_back(self)
        else:
            self.close()
        self.pool._slots.release()

    def pause(self) -> None:
        if not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self._paused and self.transport is not None and not self.closed:
            self._paused = False
            self.transport.resume_reading()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


_EXAMPLE = "for example https://api.anthropic.com or http://localhost:8080"


def upstream_base(url: str) -> str:
    """The upstream base URL ``url`` names, checked once for every place that takes one (the
    proxy's ``--upstream``, `ProxyConfig.check`, the pool, compact mode's summaries): ``http://``
    or ``https://``, a host, a port that is a number, no user name or password, no query or
    fragment, no space or control character. A trailing ``/`` and then one trailing ``/v1`` are
    dropped: clients send their own ``/v1/messages`` and the proxy keeps that path, so an SDK-style
    base URL (opencode's ``baseURL``, ``http://host:8080/v1``) does not become ``/v1/v1/messages``.
    A path before it stays (a gateway at ``https://gw.example/anthropic``). Anything else is a
    `ConfigError` of one line naming ``--upstream`` and the fix."""

    def bad(why: str) -> ConfigError:
        return ConfigError(f"--upstream {url!r} {why}")

    if not isinstance(url, str):
        raise ConfigError(f"--upstream must be a URL, got {type(url).__name__}; {_EXAMPLE}")
    if any(c.isspace() or not c.isprintable() for c in url):
        raise bad("contains a space or control character; remove it (quote the URL in the shell)")
    try:
        u = urlsplit(url)
    except ValueError as err:  # an unclosed "[" of an IPv6 address
        raise bad(f"is not a URL ({err}); an IPv6 address goes in brackets: http://[::1]:8080") from None
    if u.scheme not in ("http", "https") or not url.lower().startswith(("http://", "https://")):
        raise bad(f"must be an http:// or https:// URL; {_EXAMPLE}")
    if not u.hostname:
        raise bad(f"names no host; {_EXAMPLE}")
    try:
        port = u.port
    except ValueError:
        port = 0
    if port == 0:
        given = u.netloc.rpartition("]")[2].rpartition(":")[2]
        raise bad(f"has port {given!r}, not a number from 1 to 65535; {_EXAMPLE}")
    if u.username is not None or u.password is not None:
        raise ConfigError("--upstream must not carry a user name or password (it would be logged and shown in "
                          "errors); the proxy forwards each caller's own credentials")
    if u.query or u.fragment or "?" in url or "#" in url:
        raise bad("carries a query or fragment, which the proxy would drop; give the base URL alone")
    path = u.path.rstrip("/")
    if path.endswith("/v1/messages"):
        raise bad(f"ends in /v1/messages; give the base URL ({url[:url.rindex('/v1/messages')]}): clients send "
                  "their own /v1/messages")
    path = path.removesuffix("/v1").rstrip("/")
    return f"{u.scheme}://{u.netloc}{path}"


IDLE_KEEPALIVE_S = 4.0
"""How long an idle pooled connection may be reused: shorter than servers' own idle timeouts
(this package's servers close idle connections after 15 s, Node's after 5 s), so a connection
is not reused just as the upstream closes it; that race resets a POST, which is not retried.
undici uses the same 4 s for the same reason."""


class UpstreamPool:
    """Keep-alive connections to one upstream base URL (``http://`` or ``https://``)."""

    def __init__(self, base_url: str, *, limit: int = 200, keepalive_s: float = IDLE_KEEPALIVE_S,
                 connect_timeout: float = 30.0, read_timeout: float = 600.0) -> None:
        u = urlsplit(upstream_base(base_url))
        assert u.hostname is not None  # upstream_base refuses a URL without one
        self.host = u.hostname
        self.tls = u.scheme == "https"
        self.port = u.port or (443 if self.tls else 80)
        self.prefix = u.path.rstrip("/")
        default_port = self.port == (443 if self.tls else 80)
        try:
            name = self.host.encode("ascii")
        except UnicodeEncodeError:
            name = self.host.encode("idna")  # an internationalised name, in its ASCII form
        if b":" in name:
            name = b"[" + name + b"]"  # an IPv6 address
        self._host_line = b"Host: " + name + (b"" if default_port else b":%d" % self.port) + b"\r\n"
        self._ssl = ssl.create_default_context() if self.tls else None
        self.keepalive_s = keepalive_s
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self._idle: collections.deque[_Connection] = collections.deque()
        self._all: set[_Connection] = set()
        self.limit = limit
        self._slots = asyncio.Semaphore(limit)
        self._sweeper: asyncio.TimerHandle | None = None

    def _sweep(self) -> None:
        """Fail every response whose upstream has sent nothing for ``read_timeout`` seconds (one
        timer for the pool: a timer per request and per chunk cost more than the rest of a read)."""
        now = time.monotonic()
        for conn in list(self._all):
            r = conn.response
            if r is not None and not r.complete and not conn._paused and now - conn.last_io > self.read_timeout:
                r._fail(UpstreamError(f"the upstream sent nothing for {self.read_timeout:g} s"))
                conn.close()
        for conn in list(self._idle):  # idle past keep-alive: closed, not only skipped when next popped
            if now - conn.idle_since >= self.keepalive_s:
                conn.close()
        self._sweeper = asyncio.get_running_loop().call_later(self._sweep_every, self._sweep)

    @property
    def _sweep_every(self) -> float:
        return min(5.0, self.read_timeout / 4, self.keepalive_s / 2)

    async def request(self, method: str, target: str, headers: Iterable[tuple[str, str]], body: bytes
                      ) -> UpstreamResponse:
        """Send one request (``target`` is the path and query) and wait for the response's head."""
        data = self._encode(method, target, headers, body)
        try:
            async with asyncio.timeout(self.connect_timeout):
                await self._slots.acquire()
        except TimeoutError:
            raise UpstreamError(f"no upstream connection became free within {self.connect_timeout:g} s "
                                f"(all {self.limit} in use)") from None
        try:
            for attempt in (0, 1):
                conn, reused = await self._connection()
                r = UpstreamResponse(conn, method)
                conn.send(r, data)
                try:
                    await r._wait_head()
                    return r
                except UpstreamError:
                    conn.response = None
                    conn.close()
                    raise
                except OSError as err:
                    conn.response = None
                    conn.close()
                    if reused and r.bytes_seen == 0 and attempt == 0 and method in IDEMPOTENT:
                        continue  # a keep-alive connection the upstream had closed: safe to send again
                    raise UpstreamError(f"the upstream closed the connection: {err}") from err
                except BaseException:
                    conn.response = None
                    conn.close()
                    raise
            raise AssertionError("unreachable")
        except BaseException:
            self._slots.release()
            raise

    def _encode(self, method: str, target: str, headers: Iterable[tuple[str, str]], body: bytes) -> bytes:
        if not method.isalpha() or not target.startswith("/") or any(c in target for c in " \r\n"):
            raise RequestRefused(f"refusing to forward a malformed request line: {method!r} {target[:100]!r}")
        out = [f"{method} {self.prefix}{target} HTTP/1.1\r\n".encode("latin-1"), self._host_line]
        for k, v in headers:
            if "\r" in k or "\n" in k or "\r" in v or "\n" in v or ":" in k:
                raise RequestRefused(f"refusing to forward a header with a line break: {k[:60]!r}")
            # the inverse of how aiohttp's server decoded them: the caller's bytes, unchanged
            out.append(f"{k}: {v}\r\n".encode("utf-8", "surrogateescape"))
        if body or method in ("POST", "PUT", "PATCH"):
            out.append(b"Content-Length: %d\r\n" % len(body))
        out.append(b"\r\n")
        out.append(body)
        return b"".join(out)

    async def _connection(self) -> tuple[_Connection, bool]:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()  # the most recently used: the least likely to have been closed
            if not conn.closed and now - conn.idle_since < self.keepalive_s:
                return conn, True
            conn.close()
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, proto = await loop.create_connection(
                    lambda: _Connection(self), self.host, self.port, ssl=self._ssl,
                    server_hostname=self.host if self.tls else None)
        except TimeoutError:
            raise UpstreamError(f"connecting to {self.host}:{self.port} timed out") from None
        except OSError as err:
            raise UpstreamError(f"cannot connect to {self.host}:{self.port}: {err}") from err
        self._all.add(proto)
        if self._sweeper is None:
            self._sweeper = loop.call_later(self._sweep_every, self._sweep)
        return proto, False

    def _put_back(self, conn: _Connection) -> None:
        self._idle.append(conn)

    def _forget(self, conn: _Connection) -> None:
        self._all.discard(conn)
        if conn in self._idle:
            self._idle.remove(conn)

    async def close(self) -> None:
        """Close every connection (those in use included)."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for conn in list(self._all):
            conn.close()
        self._idle.clear()
        await asyncio.sleep(0)
