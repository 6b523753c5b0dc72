"""HTTP front of the emulator on the shared async stack (`cachecompact.adapters.httpserver`), and `Emulator`.

Billing is CPU work under one lock (`EmulatorCore`), so it runs on a small bounded pool of
worker threads; reading requests and writing streams are asynchronous, so stalled clients
hold no thread. With ``gzip=True`` the emulator compresses like the API does for a client
that sends ``Accept-Encoding: gzip``: whole JSON bodies, and SSE streams frame by frame
(a sync flush per event, so events still arrive as they are written).
"""

from __future__ import annotations

import asyncio
import dataclasses
import gzip
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Any

from aiohttp import web

from ...adapters.httpserver import ServerThread, api_errors, read_body, serve_forever
from ._binding import ForeignSignatures, ThinkingRules
from ._request_handling import EmulatorCore, FaultConfig, HttpReply
from .responders import Responder, ResponderFn

__all__ = ["Emulator", "make_app"]

WORKERS = 2  # billing threads; the core serialises on one lock anyway


def _accepts_gzip(request: web.Request) -> bool:
    return any(p.strip().split(";")[0] == "gzip" for p in request.headers.get("accept-encoding", "").split(","))


def make_app(core: EmulatorCore, *, gzip_responses: bool = False, workers: int = WORKERS) -> web.Application:
    """The emulator as an aiohttp application: every method and path goes to `EmulatorCore`."""
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="cachecompact-emulator")
    app = web.Application(middlewares=[api_errors], client_max_size=1 << 30)  # read_body enforces the real cap

    async def handle(request: web.Request) -> web.StreamResponse:
        raw = await read_body(request)
        headers = {k.lower(): v for k, v in request.headers.items()}
        loop = asyncio.get_running_loop()
        reply: HttpReply = await loop.run_in_executor(pool, core.handle, request.method, request.path_qs, headers,
                                                      raw)
        compress = gzip_responses and _accepts_gzip(request)
        if reply.events is None:
            body = reply.body
            hdrs = dict(reply.headers)
            if compress and body:
                body = gzip.compress(body, compresslevel=5)
                hdrs["content-encoding"] = "gzip"
            return web.Response(status=reply.status, body=body, headers=hdrs)
        resp = web.StreamResponse(status=reply.status, headers=reply.headers)
        z = None
        if compress:
            resp.headers["content-encoding"] = "gzip"
            z = zlib.compressobj(5, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        await resp.prepare(request)
        for chunk in reply.sse():
            await resp.write(z.compress(chunk) + z.flush(zlib.Z_SYNC_FLUSH) if z is not None else chunk)
        if z is not None:
            await resp.write(z.flush())
        await resp.write_eof()
        return resp

    async def close_pool(_: web.Application) -> None:
        pool.shutdown(wait=False, cancel_futures=True)

    app.router.add_route("*", "/{tail:.*}", handle)
    app.on_cleanup.append(close_pool)
    return app


class Emulator:
    """A local Messages API on a free loopback port, for tests, demos and benchmarks.

    >>> with Emulator() as emu:
    ...     client = anthropic.Anthropic(base_url=emu.url, api_key="test")

    ``thinking`` sets what the docs leave open about preserved thinking (`ThinkingRules`);
    ``foreign_signatures`` overrides its setting of that name: what the emulator does with a
    thinking signature it did not issue. ``"api_format"`` (the default) takes one in the API's
    format, as the API takes those it issued (a session recorded against the API, resumed), and
    refuses a made-up one; ``"refuse"`` refuses every one; ``"bind"`` takes every one
    (docs/cache-model.md, *Signatures the emulator did not issue*).
    """

    def __init__(
        self,
        responder: Responder | ResponderFn | None = None,
        *,
        faults: FaultConfig | None = None,
        log: str | Path | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        context_window: int | None = None,
        gzip: bool = False,
        thinking: ThinkingRules | None = None,
        foreign_signatures: ForeignSignatures | None = None,
    ) -> None:
        if foreign_signatures is not None:
            thinking = dataclasses.replace(thinking or ThinkingRules(), foreign_signatures=foreign_signatures)
        self.core = EmulatorCore(responder, faults=faults, log_path=log, context_window=context_window,
                                 thinking=thinking)
        self._gzip = gzip
        self._server = ServerThread(lambda: make_app(self.core, gzip_responses=gzip), host, port)

    @property
    def url(self) -> str:
        return self._server.url

    @property
    def requests(self) -> list[dict[str, Any]]:
        """The request log: one dict per request (usage, cost, prefix hashes, ...)."""
        return self.core.log

    def start(self) -> Emulator:
        self._server.start()
        return self

    def serve_forever(self, ready: Any = None) -> None:
        """Serve in the calling thread until interrupted (``cachecompact serve``)."""
        serve_forever(lambda: make_app(self.core, gzip_responses=self._gzip), self._server.host, self._server.port,
                      ready)

    def stop(self) -> None:
        self._server.stop()

    def __enter__(self) -> Emulator:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
