"""The proxy's routes: ``POST /v1/messages`` (observed, or compacted first) and every other
path forwarded byte for byte. Each response streams back chunk by chunk as it arrives; its
analysis is queued (`state.Exchange`) and runs after it."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from aiohttp import web

from ...base.errors import InvalidSessionIdError
from ...base.headers import CLOCK_HEADER, INTERNAL_HEADER, SESSION_HEADER
from ...base.http import clock_from, json_or_none, with_betas
from ...base.values import PREFIX_SETTING, Refuse
from ...store import check_session_id
from ..httpserver import api_error, read_body
from ._config import ProxyConfig
from ._state import Exchange, ProxyState, analyse, spent
from ._tap import ResponseTap, decoded
from ._upstream import RequestRefused, UpstreamError, UpstreamPool, UpstreamResponse

if TYPE_CHECKING:
    from ...cache.forensics import Finding
    from ...engine.request_cycle import Prepared, RequestExchange

__all__ = ["UPSTREAM", "Handlers"]

log = logging.getLogger("cachecompact")

HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization",
                        "te", "trailer", "transfer-encoding", "upgrade"})
# the proxy sets Host and Content-Length itself; it holds the whole body, so an Expect was answered here
_REQUEST_DROP = ("host", "content-length", "expect")
WHOLE = 1 << 20  # JSON bodies up to this size are relayed in one write (streams always chunk by chunk)
UPSTREAM: web.AppKey[UpstreamPool] = web.AppKey("upstream", UpstreamPool)


class Handlers:
    """The routes of one app, over its `ProxyState` and the upstream pool the app owns (``UPSTREAM``)."""

    def __init__(self, app: web.Application, state: ProxyState) -> None:
        self.app, self.state = app, state

    async def send(self, request: web.Request, data: bytes, headers: list[tuple[str, str]]) -> UpstreamResponse:
        return await self.app[UPSTREAM].request(request.method, _origin_form(request.raw_path), headers, data)

    async def relay(self, request: web.Request, up: UpstreamResponse, tap: ResponseTap | None,
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

    async def forward(self, request: web.Request) -> web.StreamResponse:
        raw = await read_body(request)
        try:
            up = await self.send(request, raw, _filter(request.headers, _REQUEST_DROP))
        except UpstreamError as err:
            return _unavailable(self.state.cfg, err)
        async with up:
            return await self.relay(request, up, None)

    async def messages(self, request: web.Request) -> web.StreamResponse:
        if request.method != "POST":
            return await self.forward(request)
        state = self.state
        raw = await read_body(request)
        t0 = time.perf_counter()
        headers = _filter(request.headers, _REQUEST_DROP)
        lower = {k.lower(): v for k, v in request.headers.items()}
        now = clock_from(lower, CLOCK_HEADER, state.clock)  # replays and tests set the clock
        if INTERNAL_HEADER in lower:
            return await self.plain(request, raw, headers)
        if state.engine is None and SESSION_HEADER in lower:
            # the same answer as compact mode (issue 50: observe mode forwarded it unanalysed): a header that
            # could name a path is the caller's mistake, said before anything goes upstream
            try:
                check_session_id(lower[SESSION_HEADER], SESSION_HEADER)
            except InvalidSessionIdError as err:
                return api_error(400, str(err))
        exchange: RequestExchange | None = None  # compact mode: the engine's steps (`RequestExchange`)
        prepared: Prepared | None = None
        data = raw
        if state.engine is not None and not request.headers.get("content-encoding"):
            got = await asyncio.get_running_loop().run_in_executor(state.compute, state.start, raw, lower, now)
            if isinstance(got, web.Response):
                return got
            if got is not None:
                exchange, step, sent = got
                if isinstance(step, Refuse):
                    return await self.refuse(step, exchange, now)
                if step is not None:
                    prepared = exchange.prepared
                    data, headers = sent, _with_betas(headers, lower, step.betas)
        try:
            up = await self.send(request, data, headers)
        except UpstreamError as err:
            return _unavailable(self.state.cfg, err)
        head = b""
        # the exchange says what a response means: relayed (None), or sent again after a too-long 400 (at most once)
        while exchange is not None and prepared is not None and exchange.reads(up.status):
            try:  # until the response is relayed, every way out gives its connection back
                head = await up.read()
                payload = json_or_none(decoded(head, up.headers.get("content-encoding", "")))
                step, sent = await asyncio.get_running_loop().run_in_executor(state.compute, state.received,
                                                                              exchange, up.status, payload, lower)
            except UpstreamError as err:
                up.release()
                return _unavailable(self.state.cfg, err)
            except BaseException:
                up.release()
                raise
            if step is None:
                break
            up.release()
            if isinstance(step, Refuse):
                return await self.refuse(step, exchange, now)
            # the compacted body may need other betas than the first (reactive compaction can bind thinking)
            data, head = sent, b""
            headers = _with_betas(_filter(request.headers, _REQUEST_DROP), lower, step.betas)
            try:
                up = await self.send(request, data, headers)
            except UpstreamError as err:
                return _unavailable(self.state.cfg, err)
        if exchange is not None and prepared is not None and up.status != 200:
            # before the client has the error: its next attempt at this turn finds the session
            # waiting for nothing, and takes it over rather than starting another (issue 62)
            exchange.unanswered()
        hint = (state.engine.unknown_model(exchange.body.get("model"))
                if exchange is not None and up.status == 404 and state.engine is not None else None)
        if hint is not None or (prepared is not None and up.status != 200 and prepared.live.failed):
            # an error read whole and recorded here, then answered: a model id the price table does not
            # list gets the table's nearest ids (issue 56), and a session no request of which was ever
            # answered has its record stored before the client has the error, because the client's retry
            # of the turn takes that session over and keeps the records stored by then (issue 62: left to
            # the analysis thread, a quick retry raced the record and it was lost)
            try:
                body = head or await up.read()
            except UpstreamError as err:
                up.release()
                return _unavailable(self.state.cfg, err)
            up.release()
            encoding = up.headers.get("content-encoding", "").lower()
            answer = (_with_hint(body, encoding, hint) if hint is not None else
                      web.Response(status=up.status, reason=up.reason or None,
                                   headers=_filter(up.headers, ("content-length",)), body=body))
            tap = ResponseTap("application/json", "", live=False)  # recorded as the error it is
            tap.feed(answer.body if hint is not None and isinstance(answer.body, bytes) else decoded(body, encoding))
            t_end = round(1000 * (time.perf_counter() - t0), 3)
            ex = Exchange(raw, lower, prepared, up.status, tap, now,
                          {"upstream_ms": t_end, "ttfb_ms": t_end, "total_ms": t_end}, False, [], exchange,
                          data if prepared is not None else b"")
            await asyncio.get_running_loop().run_in_executor(state.compute, analyse, state, ex)
            return answer
        tap = ResponseTap(up.headers.get("content-type", ""), up.headers.get("content-encoding", "").lower(),
                   live=prepared is not None)
        t_up = time.perf_counter()
        state.begin()  # before the client can see the response: `Proxy.wait_idle` waits for the record
        recorded: list[Finding | None] = []

        async def record_first() -> None:
            """Compact mode: the session records the answer (a whole JSON body, or a stream once
            its usage is complete) before the client has all of it, so the client's next turn
            finds it, on this replica or another."""
            if exchange is None or prepared is None or up.status != 200:
                return
            got = tap.finish()
            if got is not None:
                finding = await asyncio.get_running_loop().run_in_executor(
                    state.compute, state.record, exchange, got, lower)
                recorded.append(finding)

        try:
            async with up:
                return await self.relay(request, up, tap, head, record_first)
        finally:
            timing = {"upstream_ms": round(1000 * (t_up - t0), 3),
                      "ttfb_ms": round(1000 * ((tap.first_byte or t_up) - t0), 3),
                      "total_ms": round(1000 * (time.perf_counter() - t0), 3)}
            state.submit(Exchange(raw, lower, prepared, up.status, tap, now, timing, tap.sse, recorded, exchange,
                                  data if prepared is not None else b""))

    async def refuse(self, step: Refuse, exchange: RequestExchange, now: float) -> web.Response:
        """The proxy's own answer that the context is full, counted in ``/metrics`` as an error and
        recorded in the session the engine resolved the request to (the dashboard's conversation,
        `report`), before the client has it; the setting it names is the proxy's flag, not
        ``wrap()``'s keyword."""
        message = step.message.replace(PREFIX_SETTING, "--prefix-messages 1")
        state = self.state
        sid = step.session_id
        live = state.engine.registry.get(sid) if state.engine is not None and sid is not None else None
        model = exchange.body.get("model")
        exchange.unanswered()

        def record() -> None:
            state.observer.refused(sid, message=message, now=now, model=model if isinstance(model, str) else "",
                                   link=live.session.link if live is not None else None)
            spent(state)  # what the refused request's step spent on summaries before it gave up

        await asyncio.get_running_loop().run_in_executor(state.compute, record)
        return api_error(400, message, kind="invalid_request_error")

    async def plain(self, request: web.Request, raw: bytes, headers: list[tuple[str, str]]) -> web.StreamResponse:
        try:
            up = await self.send(request, raw, headers)
        except UpstreamError as err:
            return _unavailable(self.state.cfg, err)
        async with up:
            return await self.relay(request, up, None)


def _with_hint(body: bytes, encoding: str, hint: str) -> web.Response:
    """The upstream's 404 for a model id the price table does not list, its message followed by
    the table's nearest ids; a body that is not the API's error JSON goes back as it came."""
    payload = json_or_none(decoded(body, encoding))
    err = payload.get("error") if isinstance(payload, dict) else None
    if not isinstance(err, dict) or err.get("type") != "not_found_error":
        return web.Response(status=404, body=body, headers={"content-encoding": encoding} if encoding else None,
                            content_type="application/json")
    err["message"] = f"{err.get('message') or 'not found'} (cachecompact: {hint})"
    return web.json_response(payload, status=404)


def _with_betas(headers: list[tuple[str, str]], lower: dict[str, str], betas: tuple[str, ...]
                ) -> list[tuple[str, str]]:
    """The headers with the strategy's betas added to ``anthropic-beta`` (a server-side peer's
    body needs them)."""
    if not betas:
        return headers
    beta = with_betas(lower.get("anthropic-beta"), betas) or ""
    return [(k, v) for k, v in headers if k.lower() != "anthropic-beta"] + [("anthropic-beta", beta)]


def _filter(headers: Any, drop: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """Headers without hop-by-hop ones (and those named in ``Connection``) and ``drop``, in order."""
    gone = HOP_BY_HOP.union(drop)
    conn = headers.getall("Connection", ()) if "Connection" in headers else ()
    for v in conn:
        gone |= {t.strip().lower() for t in v.split(",") if t.strip()}
    return [(k, v) for k, v in headers.items() if k.lower() not in gone]


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
