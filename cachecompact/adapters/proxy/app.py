"""``cachecompact proxy``: an Anthropic-compatible reverse proxy with cache forensics, optional
compaction and a live dashboard, on the same aiohttp server stack as the emulator; upstream
calls go through the pooled keep-alive client of `.upstream`.

Every path is forwarded to the upstream with the caller's method, query, headers (hop-by-hop
ones dropped) and body; the response's status, headers and body come back unchanged, streamed
chunk by chunk as they arrive, compressed or not (neither side decompresses).
Credentials are forwarded and never stored or logged.

``POST /v1/messages`` is also recorded. In ``observe`` mode the request bytes are forwarded
untouched and analysed after the response, off the request path, in one worker thread. In
``compact`` mode the body is first run through `CompactionEngine` (the same code as `wrap()`),
and a prompt-too-long 400 triggers reactive compaction and one retry.

``/ui`` serves the dashboard (static files shipped in the package) and ``/api/...`` its JSON.
Bound beyond loopback, both require the ``--auth-token`` (``Authorization: Bearer``, or a
cookie set by opening ``/ui?token=...`` once).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import logging
import queue
import threading
import time
import zlib
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from aiohttp import web

from ...base.errors import ConfigError, ContextFullError, InvalidSessionIdError
from ...base.headers import CLOCK_HEADER, INTERNAL_HEADER
from ...base.http import SSEUsage, clock_from, json_or_none, too_long, with_betas
from ...base.pricing import DEFAULT_SUMMARY_MODEL
from ...base.wire import bytes_as_is
from ...store import Store, open_writable_store
from ..httpserver import ServerThread, api_error, api_errors, read_body, serve_forever
from .observe import Observer, session_hint
from .upstream import RequestRefused, UpstreamError, UpstreamPool, UpstreamResponse

if TYPE_CHECKING:  # observe mode never loads the compaction runtime: compact mode imports it when built
    from ...compaction.summarize.llm import SummaryRequest, SummaryResult
    from ...engine.core import CompactionEngine, Prepared, Retry

__all__ = ["Proxy", "ProxyConfig", "make_app"]

log = logging.getLogger("cachecompact")

HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization",
                        "te", "trailer", "transfer-encoding", "upgrade"})
CREDENTIALS = ("x-api-key", "authorization")
# the proxy sets Host and Content-Length itself; it holds the whole body, so an Expect was answered here
_REQUEST_DROP = ("host", "content-length", "expect")
WHOLE = 1 << 20  # JSON bodies up to this size are relayed in one write (streams always chunk by chunk)
_COOKIE = "cachecompact_token"
UPSTREAM: web.AppKey[UpstreamPool] = web.AppKey("upstream", UpstreamPool)
STATE: web.AppKey[ProxyState] = web.AppKey("state")


@dataclass
class ProxyConfig:
    upstream: str = "https://api.anthropic.com"
    host: str = "127.0.0.1"
    port: int = 8787
    mode: str = "observe"  # or "compact"
    store: str | Store | None = None
    keep_bodies: bool = False
    auth_token: str | None = None
    strategy: str = "cachecompact"
    window_tokens: int | None = None
    max_connections: int = 200
    engine_options: dict[str, Any] = field(default_factory=dict)

    def check(self) -> None:
        """Refuse a configuration that would run unsafely or not at all."""
        if self.mode not in ("observe", "compact"):
            raise ConfigError(f"--mode must be 'observe' or 'compact', got {self.mode!r}")
        if not self.upstream.startswith(("http://", "https://")):
            raise ConfigError(f"--upstream must be an http:// or https:// URL, got {self.upstream!r}")
        u = urlsplit(self.upstream)
        if u.username is not None or u.password is not None:
            raise ConfigError("--upstream must not carry a user name or password (it would be logged and shown in "
                              "errors); the proxy forwards each caller's own credentials")
        if not is_loopback(self.host) and not self.auth_token:
            raise ConfigError(f"binding to {self.host} (beyond loopback) needs --auth-token: the dashboard and its API "
                              "show request contents")
        if self.keep_bodies and self.store is None:
            raise ConfigError("--keep-bodies needs --store (bodies are kept in the store)")
        if self.mode == "observe" and self.strategy != "cachecompact":
            raise ConfigError(f"--strategy {self.strategy} applies only with --mode compact")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _filter(headers: Any, drop: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """Headers without hop-by-hop ones (and those named in ``Connection``) and ``drop``, in order."""
    gone = HOP_BY_HOP.union(drop)
    conn = headers.getall("Connection", ()) if "Connection" in headers else ()
    for v in conn:
        gone |= {t.strip().lower() for t in v.split(",") if t.strip()}
    return [(k, v) for k, v in headers.items() if k.lower() not in gone]


class _Tap:
    """Reads usage from a response while its raw bytes are forwarded.

    In observe mode nothing is parsed on the request path: the bytes are kept (up to `CAP`) and
    `finish` parses them in the analysis thread, after the response. Compact mode must know a
    stream's usage before its last bytes reach the client (``record_first``), so there, and for a
    stream longer than `SSE_DEFER`, SSE events are parsed as they pass. A compressed response is read
    from a decompressed copy."""

    CAP = 8 * 1024 * 1024
    SSE_DEFER = 1024 * 1024  # a longer stream is parsed as it passes: the catch-up stays short, memory small
    Usage = tuple[dict[str, Any], str | None, dict[str, Any] | None]

    def __init__(self, content_type: str, encoding: str, *, live: bool = False) -> None:
        self.sse = "text/event-stream" in content_type
        self.json = "json" in content_type
        self.encoding = encoding
        self.unreadable = encoding not in ("", "identity", "gzip", "deflate") or not (self.sse or self.json)
        self.parts: list[bytes] = []
        self.size = 0
        self.result: _Tap.Usage | None = None
        self.parser: SSEUsage | None = None
        self.z: Any = None
        self.first_byte: float | None = None
        self._finished = False
        if live and self.sse and not self.unreadable:
            self._go_live()

    def _done(self, usage: dict[str, Any], mid: str | None, diag: dict[str, Any] | None) -> None:
        self.result = (usage, mid, diag)

    def _go_live(self) -> None:
        """From now on, parse SSE as it passes (what was kept so far first)."""
        self.parser = SSEUsage(self._done)
        self.z = _decompressor(self.encoding)
        kept, self.parts, self.size = self.parts, [], 0
        for chunk in kept:
            self._parse(chunk)

    def _parse(self, chunk: bytes) -> None:
        if self.z is not None:
            try:
                chunk = self.z.decompress(chunk)
            except zlib.error:
                self.unreadable = True
                return
        assert self.parser is not None
        self.parser.feed(chunk)

    def feed(self, chunk: bytes) -> None:
        if self.first_byte is None:
            self.first_byte = time.perf_counter()
        if self.unreadable:
            return
        if self.parser is not None:
            self._parse(chunk)
            return
        self.parts.append(chunk)
        self.size += len(chunk)
        if self.sse and self.size > self.SSE_DEFER:
            self._go_live()
        elif self.size > self.CAP:  # a JSON body this large carries no usage worth the memory
            self.unreadable = True
            self.parts = []

    def finish(self) -> _Tap.Usage | None:
        """The usage, message id and diagnostics, once the response is complete (idempotent)."""
        if self._finished or self.unreadable:
            return self.result
        if self.sse:
            if self.parser is None:
                self._go_live()
            assert self.parser is not None
            self.parser.finish()
            self._finished = self.result is not None
            return self.result
        self._finished = True
        d = json_or_none(_decoded(b"".join(self.parts), self.encoding, self.CAP))
        if isinstance(d, dict) and isinstance(d.get("usage"), dict):
            reason = (d.get("diagnostics") or {}).get("cache_miss_reason")
            self.result = d["usage"], d.get("id"), reason if isinstance(reason, dict) else None
        return self.result


class _UpstreamSummarizer:
    """Summaries through the upstream with the credentials of the request being compacted
    (held for the duration of that request only, in a thread-local)."""

    def __init__(self, upstream: str, model: str, mode: str, creds: threading.local) -> None:
        self.upstream, self.model, self.mode, self.creds = upstream, model, mode, creds

    def summarize(self, req: SummaryRequest) -> SummaryResult:
        import anthropic

        from ...compaction.summarize.llm import ExtractiveSummarizer, LLMSummarizer

        h: dict[str, str] = getattr(self.creds, "headers", {})
        key = h.get("x-api-key")
        bearer = h.get("authorization", "")
        token = bearer[7:] if bearer.lower().startswith("bearer ") else None
        if not key and not token:
            # no credential of the caller's: an SDK client would fall back to the operator's own
            # (environment, profile), so a stranger's request could spend the operator's money
            log.info("cachecompact proxy: a request without credentials; its summary is extractive")
            return ExtractiveSummarizer().summarize(req)
        # the caller's own credential, in the form it came (the SDK takes one or the other;
        # an explicit one means it reads no environment credential)
        client = (anthropic.Anthropic(base_url=self.upstream, api_key=key, max_retries=2) if key or not token
                  else anthropic.Anthropic(base_url=self.upstream, auth_token=token, api_key=None, max_retries=2))
        extra = {INTERNAL_HEADER: "1", **({"anthropic-beta": h["anthropic-beta"]} if "anthropic-beta" in h else {})}
        return LLMSummarizer(client, model=self.model, mode=self.mode, extra_headers=extra).summarize(req)


class ProxyState:
    """Everything one proxy app holds: config, observer, engine, workers."""

    def __init__(self, cfg: ProxyConfig) -> None:
        cfg.check()
        self.cfg = cfg
        self.store: Store | None = open_writable_store(cfg.store)  # a bad path fails now, not per request
        self.observer = Observer(store=self.store, keep_bodies=cfg.keep_bodies)
        self.creds = threading.local()
        self.engine: CompactionEngine | None = None
        if cfg.mode == "compact":
            from ...engine.core import CompactionEngine

            creds = self.creds
            upstream = cfg.upstream

            def summarizer(model: str | None, mode: str) -> Any:
                return _UpstreamSummarizer(upstream, model or DEFAULT_SUMMARY_MODEL, mode, creds)

            self.engine = CompactionEngine(self.store, strategy=cfg.strategy, window_tokens=cfg.window_tokens,
                                           summarizer=summarizer, **cfg.engine_options)
        # analysis after the response: one thread fed by a queue (cheaper per request than an
        # executor's futures), so the records of a session stay in order
        self.queue: queue.SimpleQueue[tuple[int, tuple[Any, ...]] | None] = queue.SimpleQueue()
        # observe mode under overload: forwarding never waits for analysis, and the bodies waiting
        # for it are bounded; past the bound a request is forwarded but not analysed (counted)
        self.max_pending_bytes = 256 << 20
        self._pending_bytes = 0
        self.dropped = 0
        self.compute = ThreadPoolExecutor(max_workers=4, thread_name_prefix="cachecompact-proxy-compact")
        self._pending = 0
        self._plock = threading.Lock()
        self.worker = threading.Thread(target=self._analyse, name="cachecompact-proxy-analysis", daemon=True)
        self.worker.start()

    @property
    def pending(self) -> int:
        """Requests whose records are not written yet."""
        return self._pending

    def begin(self) -> None:
        with self._plock:
            self._pending += 1

    def submit(self, job: tuple[Any, ...]) -> None:
        """Queue one response's analysis (``job[0]`` is the request body; ``job[2]`` the engine's
        prepared request, which compact mode must always record; ``job[4]`` the response's tap,
        holding its bytes until the analysis reads them: both count toward the bound)."""
        size = len(job[0]) + job[4].size
        with self._plock:
            if job[2] is None and self._pending_bytes + size > self.max_pending_bytes:
                self._pending -= 1
                self.dropped += 1
                if self.dropped == 1 or self.dropped % 1000 == 0:
                    log.warning("cachecompact proxy: analysis is behind; %d requests forwarded without analysis",
                                self.dropped)
                return
            self._pending_bytes += size
        self.queue.put((size, job))

    def _analyse(self) -> None:
        while True:
            item = self.queue.get()
            if item is None:
                return
            size, job = item
            try:
                _record(self, *job)
            finally:
                with self._plock:
                    self._pending -= 1
                    self._pending_bytes -= size

    def close(self) -> None:
        self.queue.put(None)
        self.worker.join(30)
        self.compute.shutdown(wait=False, cancel_futures=True)


def make_app(cfg: ProxyConfig) -> web.Application:
    """The proxy as an aiohttp application."""
    state = ProxyState(cfg)
    app = web.Application(middlewares=[api_errors, _auth(cfg) if cfg.auth_token else _loopback_host_only],
                          client_max_size=1 << 30)
    app[STATE] = state

    async def upstream_ctx(a: web.Application) -> Any:
        # one client for every caller: it keeps connections, never cookies or credentials
        a[UPSTREAM] = UpstreamPool(cfg.upstream, limit=cfg.max_connections, connect_timeout=30,
                                   read_timeout=600)
        yield
        await a[UPSTREAM].close()
        state.close()

    app.cleanup_ctx.append(upstream_ctx)

    async def send(request: web.Request, data: bytes, headers: list[tuple[str, str]]) -> UpstreamResponse:
        return await app[UPSTREAM].request(request.method, _origin_form(request.raw_path), headers, data)

    async def relay(request: web.Request, up: UpstreamResponse, tap: _Tap | None,
                    head: bytes = b"", before_send: Callable[[], Awaitable[None]] | None = None
                    ) -> web.StreamResponse:
        length = up.content_length
        if length is not None and length <= WHOLE and "text/event-stream" not in up.headers.get("content-type", ""):
            # a small complete (non-stream) body: one write with the headers instead of three
            body = head or await up.read()
            if tap is not None:
                tap.feed(body)
            if before_send is not None:
                await before_send()
            return web.Response(status=up.status, reason=up.reason or None,
                                headers=_filter(up.headers, ("content-length",)),
                                body=body if request.method != "HEAD" else None)
        resp = web.StreamResponse(status=up.status, reason=up.reason or None,
                                  headers=_filter(up.headers, ("content-length",)))
        if up.content_length is not None and request.method != "HEAD":
            resp.content_length = up.content_length
        await resp.prepare(request)
        if head:
            if tap is not None:
                tap.feed(head)
            await resp.write(head)
        async for chunk in up.iter_chunks():
            if tap is not None:
                tap.feed(chunk)
                if before_send is not None and tap.result is not None:
                    await before_send()  # the stream's usage is complete: record before its last bytes
                    before_send = None
            await resp.write(chunk)
        await resp.write_eof()
        return resp

    async def forward(request: web.Request) -> web.StreamResponse:
        raw = await read_body(request)
        try:
            up = await send(request, raw, _filter(request.headers, _REQUEST_DROP))
        except UpstreamError as err:
            return _unavailable(cfg, err)
        async with up:
            return await relay(request, up, None)

    async def messages(request: web.Request) -> web.StreamResponse:
        if request.method != "POST":
            return await forward(request)
        raw = await read_body(request)
        t0 = time.perf_counter()
        headers = _filter(request.headers, _REQUEST_DROP)
        lower = {k.lower(): v for k, v in request.headers.items()}
        now = clock_from(lower, CLOCK_HEADER, time.time)  # replays and tests set the clock
        if INTERNAL_HEADER in lower:
            return await _plain(request, raw, headers)
        prepared: Prepared | None = None
        data = raw
        if state.engine is not None and not request.headers.get("content-encoding"):
            got_p = await asyncio.get_running_loop().run_in_executor(state.compute, _prepare, state, raw, lower, now)
            if isinstance(got_p, web.Response):
                return got_p
            prepared = got_p
            if prepared is not None:
                data = bytes_as_is(prepared.body)  # straight to UTF-8 bytes: no str copy of a large body
                if prepared.betas:  # the strategy's body needs these (a server-side peer)
                    beta = with_betas(lower.get("anthropic-beta"), prepared.betas) or ""
                    headers = [(k, v) for k, v in headers if k.lower() != "anthropic-beta"] + [("anthropic-beta", beta)]
        try:
            up = await send(request, data, headers)
        except UpstreamError as err:
            return _unavailable(cfg, err)
        head = b""
        if prepared is not None and up.status == 400:
            try:  # until the response is relayed, every way out gives its connection back
                head = await up.read()
                payload = json_or_none(_decoded(head, up.headers.get("content-encoding", "")))
                retry = (await asyncio.get_running_loop().run_in_executor(state.compute, _after_too_long, state,
                                                                          prepared, payload, lower)
                         if too_long(payload) is not None else None)
            except UpstreamError as err:
                up.release()
                return _unavailable(cfg, err)
            except BaseException:
                up.release()
                raise
            if retry is not None:
                up.release()
                if retry.body is None:
                    return api_error(400, retry.message, kind="invalid_request_error")
                data = bytes_as_is(retry.body)
                head = b""
                try:
                    up = await send(request, data, headers)
                except UpstreamError as err:
                    return _unavailable(cfg, err)
        tap = _Tap(up.headers.get("content-type", ""), up.headers.get("content-encoding", "").lower(),
                   live=prepared is not None)
        t_up = time.perf_counter()
        state.begin()  # before the client can see the response: `Proxy.wait_idle` waits for the record
        recorded: list[Any] = []

        async def record_first() -> None:
            """Compact mode: the session records the answer (a whole JSON body, or a stream once
            its usage is complete) before the client has all of it, so the client's next turn
            finds it, on this replica or another."""
            if prepared is None or up.status != 200:
                return
            got = tap.finish()
            if got is not None:
                finding = await asyncio.get_running_loop().run_in_executor(
                    state.compute, state.engine.record, prepared, got[0], got[1], got[2], False)  # type: ignore[union-attr]
                recorded.append(finding)

        try:
            async with up:
                return await relay(request, up, tap, head, record_first)
        finally:
            timing = {"upstream_ms": round(1000 * (t_up - t0), 3),
                      "ttfb_ms": round(1000 * ((tap.first_byte or t_up) - t0), 3),
                      "total_ms": round(1000 * (time.perf_counter() - t0), 3)}
            state.submit((raw, lower, prepared, up.status, tap, now, timing, tap.sse, recorded))

    async def _plain(request: web.Request, raw: bytes, headers: list[tuple[str, str]]) -> web.StreamResponse:
        try:
            up = await send(request, raw, headers)
        except UpstreamError as err:
            return _unavailable(cfg, err)
        async with up:
            return await relay(request, up, None)

    from .dashboard import add_routes

    add_routes(app, state)
    app.router.add_route("*", "/v1/messages", messages)
    app.router.add_route("*", "/{tail:.*}", forward)
    return app


def _unavailable(cfg: ProxyConfig, err: UpstreamError) -> web.Response:
    """A 400 for a request that cannot be forwarded as given, else a 502 (and a log line)."""
    if isinstance(err, RequestRefused):
        return api_error(400, str(err))
    log.warning("cachecompact proxy: upstream %s: %s", cfg.upstream, err)
    return api_error(502, f"upstream {cfg.upstream} unavailable: {err}")


def _origin_form(target: str) -> str:
    """The request target as a path and query: an absolute-form target (``GET http://host/p``,
    which RFC 9112 3.2.2 says a server must accept) is reduced to its path; the upstream is
    always the configured one."""
    if target.startswith(("http://", "https://")):
        u = urlsplit(target)
        return (u.path or "/") + (f"?{u.query}" if u.query else "")
    return target


def _decoded(raw: bytes, encoding: str, limit: int = 1 << 22) -> bytes:
    """A response body as its sender meant it (the proxy forwards the compressed bytes, but
    reads an error body itself); an unknown or broken encoding reads as empty."""
    enc = encoding.strip().lower()
    if enc in ("", "identity"):
        return raw
    z = _decompressor(enc)
    if z is None:
        return b""
    try:
        out: bytes = z.decompress(raw, limit)
    except zlib.error:
        return b""
    return out


def _decompressor(encoding: str) -> Any:
    """A zlib decompressor for a gzip or deflate ``Content-Encoding``, else None."""
    if encoding == "gzip":
        return zlib.decompressobj(16 + zlib.MAX_WBITS)
    return zlib.decompressobj() if encoding == "deflate" else None


def _prepare(state: ProxyState, raw: bytes, headers: dict[str, str], now: float) -> Prepared | web.Response | None:
    """Compact mode, in a worker thread: the engine's body, None (forward unchanged), or an error."""
    assert state.engine is not None
    body = json_or_none(raw)
    if not isinstance(body, dict):
        return None
    try:
        hint = session_hint(headers, body)
    except InvalidSessionIdError as err:
        return api_error(400, str(err))
    state.creds.headers = {k: v for k, v in headers.items() if k in (*CREDENTIALS, "anthropic-beta")}
    try:
        return state.engine.prepare_or_fail_open(body, explicit=hint, now=now, raw=raw)
    except ContextFullError as err:
        return api_error(400, str(err))
    finally:
        state.creds.headers = {}


def _after_too_long(state: ProxyState, p: Prepared, payload: Any, headers: dict[str, str]) -> Retry | None:
    """The engine's reactive path, with the caller's credentials for its summaries."""
    assert state.engine is not None
    state.creds.headers = {k: v for k, v in headers.items() if k in (*CREDENTIALS, "anthropic-beta")}
    try:
        return state.engine.after_too_long(p, payload)
    finally:
        state.creds.headers = {}


def _record(state: ProxyState, raw: bytes, headers: dict[str, str], p: Prepared | None, status: int,
            tap: _Tap, now: float,
            timing: dict[str, float], stream: bool, recorded: list[Any]) -> None:
    """After the response, in the analysis thread: forensics and the session record (compact
    mode: unless the engine recorded it already, see ``record_first``)."""
    try:
        got = tap.finish()  # here, not on the request path
        usage, mid, diag = got if got is not None else (None, None, None)
        if p is None or state.engine is None:
            state.observer.observe(raw, headers, status=status, usage=usage, message_id=mid, cache_miss_reason=diag,
                                   now=now, timing=timing, stream=stream)
            return
        finding = recorded[0] if recorded else (state.engine.record(p, usage, mid, diag, stream) if usage else None)
        sess = p.live.session
        comps = [{"seq": e.seq, "level": e.level, "kind": e.kind, "start": e.start, "end": e.end,
                  "tokens_before": e.tokens_before, "tokens_after": e.tokens_after, "reason": (e.reason or "")[:200]}
                 for e in sess.ledger.entries]
        state.observer.note(sess.session_id, usage=usage, finding=finding, model=p.model, now=now, status=status,
                            timing=timing, stream=stream, compactions=comps, link=sess.link, raw=raw)
    except Exception:  # never let analysis take the proxy down
        log.exception("cachecompact proxy: could not record a request")


def _dashboard_path(path: str) -> bool:
    return path == "/ui" or path.startswith(("/ui/", "/api/"))


@web.middleware
async def _loopback_host_only(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                              ) -> web.StreamResponse:
    """Without a token the dashboard is for this machine only, and so is the name it is asked
    by: a page whose own host name was re-pointed at 127.0.0.1 (DNS rebinding) sends that name
    in ``Host`` and is refused."""
    if _dashboard_path(request.path):
        given = request.host or ""
        host = given.split("]", 1)[0] + "]" if given.startswith("[") else given.rsplit(":", 1)[0]
        if not is_loopback(host):
            return api_error(403, f"the dashboard without --auth-token answers only to a loopback host name, not "
                                  f"{host[:100]!r}", kind="permission_error")
    return await handler(request)


def _auth(cfg: ProxyConfig) -> Callable[..., Awaitable[web.StreamResponse]]:
    token = cfg.auth_token

    @web.middleware
    async def check(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                    ) -> web.StreamResponse:
        path = request.path
        if token is None or not _dashboard_path(path):
            return await handler(request)
        given = request.headers.get("authorization", "")
        given = given[7:] if given.lower().startswith("bearer ") else request.cookies.get(_COOKIE, "")
        query = request.query.get("token")
        if query is not None and hmac.compare_digest(query.encode(), token.encode()):
            resp = web.HTTPFound(path)  # the token leaves the address bar; a cookie carries it from now on
            resp.set_cookie(_COOKIE, token, httponly=True, samesite="Strict", path="/")
            raise resp
        if not given or not hmac.compare_digest(given.encode(), token.encode()):
            return api_error(401, "this proxy's dashboard and API need the auth token: an 'Authorization: Bearer' "
                                  "header, or open /ui?token=... once", kind="authentication_error")
        return await handler(request)
    return check


class Proxy:
    """The proxy on a free loopback port in a background thread (tests, benchmarks, embedding)."""

    def __init__(self, cfg: ProxyConfig) -> None:
        self.cfg = cfg
        self._server = ServerThread(lambda: make_app(cfg), cfg.host, cfg.port, auto_decompress=False)

    @property
    def url(self) -> str:
        return self._server.url

    @property
    def state(self) -> ProxyState:
        assert self._server.app is not None, "the proxy is not running"
        return self._server.app[STATE]

    def wait_idle(self, timeout: float = 30.0) -> None:
        """Until every response so far has been analysed."""
        deadline = time.time() + timeout
        while self.state.pending > 0 and time.time() < deadline:
            time.sleep(0.01)

    def start(self) -> Proxy:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()

    def serve_forever(self, ready: Callable[[str], None] | None = None) -> None:
        serve_forever(lambda: make_app(self.cfg), self.cfg.host, self.cfg.port, ready, auto_decompress=False)

    def __enter__(self) -> Proxy:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        with contextlib.suppress(Exception):
            self.wait_idle(5)
        self.stop()
