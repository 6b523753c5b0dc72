"""The proxy as an aiohttp application (`make_app`), and the proxy on a free port in a
background thread (`Proxy`: tests, benchmarks, embedding)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable
from types import TracebackType

from aiohttp import web

from ..httpserver import ServerThread, api_errors, serve_forever
from ._auth import loopback_host_only, token_auth
from ._config import ProxyConfig
from ._dashboard import add_routes
from ._handlers import UPSTREAM, Handlers
from ._state import STATE, ProxyState
from ._upstream import UpstreamPool

__all__ = ["Proxy", "make_app"]


def make_app(cfg: ProxyConfig) -> web.Application:
    """The proxy as an aiohttp application: its state, the auth middleware, the upstream pool
    for the app's lifetime, the dashboard's routes and the proxy's."""
    state = ProxyState(cfg)
    app = web.Application(middlewares=[api_errors, token_auth(cfg) if cfg.auth_token else loopback_host_only],
                          client_max_size=1 << 30)
    app[STATE] = state

    async def upstream_ctx(a: web.Application) -> AsyncIterator[None]:
        # one client for every caller: it keeps connections, never cookies or credentials
        a[UPSTREAM] = UpstreamPool(cfg.upstream, limit=cfg.max_connections, connect_timeout=30,
                                   read_timeout=600)
        yield
        await a[UPSTREAM].close()
        state.close()

    app.cleanup_ctx.append(upstream_ctx)
    routes = Handlers(app, state)
    add_routes(app, state)
    app.router.add_route("*", "/v1/messages", routes.messages)
    app.router.add_route("*", "/{tail:.*}", routes.forward)
    return app


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
