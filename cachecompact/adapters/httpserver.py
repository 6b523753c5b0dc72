"""The one HTTP server stack of the emulator and the proxy: aiohttp, hardened.

Why aiohttp (docs/architecture.md has the comparison): one well-kept package gives an async
server *and* a pooled keep-alive client (the proxy needs both), streams responses chunk by
chunk, and its C parser rejects malformed HTTP (bad ``Content-Length``, unknown methods,
oversized headers) before any handler runs. What it does not do by default is added here:

* every error, protocol-level ones included, is answered in the Messages API's JSON error
  shape (``{"type": "error", "error": {"type": ..., "message": ...}}``);
* request bodies are capped (`MAX_BODY`, 413) and read with a timeout (408);
* a connection must deliver its request headers within ``header_timeout`` seconds (slow
  or stalled clients are closed; no thread is ever tied to a connection);
* `ServerThread` runs an app on its own event loop in a background thread for tests,
  benchmarks and embedding, and shuts down within a bounded time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import subprocess
import sys
import threading
import zlib
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import ContentEncodingError, HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError

__all__ = [
    "BODY_TIMEOUT_S",
    "HEADER_TIMEOUT_S",
    "MAX_BODY",
    "ServerThread",
    "api_error",
    "error_type",
    "read_body",
    "serve_forever",
    "spawn_cli_server",
]

log = logging.getLogger("cachecompact")


class _UndecodableBodies(logging.Filter):
    """aiohttp logs a traceback ("Error handling request", "Unhandled exception") when a request
    body cannot be decoded as its Content-Encoding says, although `read_body` answers it with the
    right 400 (issue 56: 17 tracebacks in 882 x 3 hostile bodies). Such a record becomes one line,
    naming the error's type, with no traceback; every other record passes as it is."""

    def filter(self, record: logging.LogRecord) -> bool:
        err = record.exc_info[1] if record.exc_info else None
        seen = 0
        while err is not None and seen < 8:
            if isinstance(err, (RequestPayloadError, ContentEncodingError, zlib.error)):
                why = str(err).replace("\n", " ").strip()[:160]
                record.msg, record.args = "cachecompact: a request body could not be decoded (%s: %s); answered 400", (
                    type(err).__name__, why)
                record.exc_info, record.exc_text, record.levelno, record.levelname = None, None, logging.WARNING, \
                    "WARNING"
                return True
            err, seen = err.__cause__ or err.__context__, seen + 1
        return True


logging.getLogger("aiohttp.server").addFilter(_UndecodableBodies())

MAX_BODY = 32 * 1024 * 1024  # the API's documented request size limit
BODY_TIMEOUT_S = 30.0  # a body must arrive within this
HEADER_TIMEOUT_S = 15.0  # a connection must send its request (headers) within this, after connect or a response
_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 405: "invalid_request_error", 408: "timeout_error", 413: "request_too_large",
          429: "rate_limit_error", 500: "api_error", 502: "api_error", 504: "timeout_error", 529: "overloaded_error"}


def error_type(status: int) -> str:
    return _TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


def api_error(status: int, message: str, *, request_id: str | None = None, kind: str | None = None,
              headers: dict[str, str] | None = None) -> web.Response:
    """A response in the API's error shape."""
    body: dict[str, Any] = {"type": "error", "error": {"type": kind or error_type(status), "message": message}}
    if request_id:
        body["request_id"] = request_id
    return web.Response(status=status, text=json.dumps(body), content_type="application/json",
                        headers={**({"request-id": request_id} if request_id else {}), **(headers or {})})


async def read_body(request: web.Request, *, cap: int = MAX_BODY, timeout: float = BODY_TIMEOUT_S) -> bytes:
    """The request body, at most ``cap`` bytes, within ``timeout`` seconds (raises an API-shaped
    413 or 408 as an `web.HTTPException`)."""
    declared = request.content_length
    if declared is not None and declared > cap:
        raise _http(413, f"request body of {declared} bytes exceeds the limit of {cap} bytes")
    try:
        if declared is not None and request.content.is_eof():
            return await request.read()  # already here (the usual small request): no timer, no loop
        return await _read_capped(request, cap, timeout)
    except (RequestPayloadError, HttpProcessingError) as err:  # e.g. Content-Encoding: gzip over bytes that are not
        enc = request.headers.get("Content-Encoding", "")
        raise _http(400, f"the request body could not be read{f' as {enc}' if enc else ''}: "
                         f"{str(err.__cause__ or err)[:120]}") from None


async def _read_capped(request: web.Request, cap: int, timeout: float) -> bytes:
    try:
        async with asyncio.timeout(timeout):
            chunks: list[bytes] = []
            size = 0
            async for chunk in request.content.iter_any():
                size += len(chunk)
                if size > cap:
                    raise _http(413, f"request body exceeds the limit of {cap} bytes")
                chunks.append(chunk)
            return b"".join(chunks)
    except TimeoutError:
        raise _http(408, f"the request body did not arrive within {timeout:.0f} s") from None


def _http(status: int, message: str) -> web.HTTPException:
    exc = web.HTTPException(text=json.dumps({"type": "error", "error": {"type": error_type(status),
                                                                         "message": message}}),
                            content_type="application/json")
    exc.set_status(status)
    exc.force_close()
    return exc


@web.middleware
async def api_errors(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                     ) -> web.StreamResponse:
    """Router errors (404, 405) and body errors in the API's JSON shape; a bug becomes a JSON 500."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400 or (exc.content_type == "application/json" and exc.text):
            raise
        resp = api_error(exc.status, exc.reason or "error")
        if exc.status == 405 and "Allow" in exc.headers:
            resp.headers["Allow"] = exc.headers["Allow"]
        return resp
    except ConnectionError:
        raise
    except Exception as err:  # never a bare traceback page: the API's shape, and a log line
        log.exception("cachecompact: unhandled error in an HTTP handler")
        return api_error(500, f"internal error: {type(err).__name__}")


class _JsonErrorHandler(web.RequestHandler):
    """Protocol-level errors (the parser rejects the request before any handler) in the API's shape.

    aiohttp has no public hook for these (aio-libs/aiohttp#3287); `RequestHandler.handle_error`
    is the one place they pass, so the subclass answers there. A test sends a non-numeric
    ``Content-Length`` to keep this honest across aiohttp upgrades.
    """

    def handle_error(self, request: Any, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        super().handle_error(request, status, exc, message)
        if isinstance(exc, HttpProcessingError):
            text = (exc.message or "bad request").splitlines()[0].rstrip(":")
        else:
            text = message or ("internal error" if status >= 500 else "bad request")
        resp = api_error(status, text)
        resp.force_close()
        return resp


class ServerThread:
    """An aiohttp application on its own event loop in a background thread.

    >>> with ServerThread(make_app) as s:
    ...     print(s.url)
    """

    def __init__(self, app_factory: Callable[[], web.Application], host: str = "127.0.0.1", port: int = 0, *,
                 header_timeout: float = HEADER_TIMEOUT_S, shutdown_timeout: float = 1.0,
                 auto_decompress: bool = True) -> None:
        self._factory = app_factory
        self._auto_decompress = auto_decompress  # a proxy forwards compressed bodies as they came
        self.host, self.port = host, port
        self._header_timeout = header_timeout
        self._shutdown_timeout = shutdown_timeout
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self.app: web.Application | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None, "the server is not running"
        return self._loop

    async def serve(self, stop: asyncio.Event | None = None) -> None:
        """Run until ``stop`` is set (or forever); used by both the thread and `serve_forever`."""
        self._loop = asyncio.get_running_loop()
        self._stop = stop or asyncio.Event()
        runner: web.AppRunner | None = None
        server: asyncio.AbstractServer | None = None
        try:
            self.app = self._factory()
            runner = web.AppRunner(self.app, handle_signals=False, shutdown_timeout=self._shutdown_timeout,
                                   access_log=None)
            await runner.setup()
            manager = runner.server
            assert manager is not None
            loop = self._loop
            timeout = self._header_timeout
            decompress = self._auto_decompress
            server = await loop.create_server(
                lambda: _JsonErrorHandler(manager, loop=loop, keepalive_timeout=timeout, lingering_time=2.0,
                                          auto_decompress=decompress),
                self.host, self.port, backlog=1024)
            self.port = server.sockets[0].getsockname()[1]
        except BaseException as err:  # surfaced in the caller's thread by start()
            self._error = err
            self._ready.set()
            if runner is not None:
                await runner.cleanup()
            return
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            server.close()
            await server.wait_closed()
            await runner.cleanup()

    def start(self) -> ServerThread:
        if self._thread is not None:
            return self
        self._thread = threading.Thread(target=lambda: _run(self.serve()), name="cachecompact-http",
                                        daemon=True)
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the HTTP server did not start within 30 s")
        if self._error is not None:
            err, self._error = self._error, None
            self._thread.join(5)
            self._thread = None
            raise err
        return self

    def stop(self) -> None:
        if self._thread is None:
            return
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)
        self._thread = None

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


def serve_forever(app_factory: Callable[[], web.Application], host: str, port: int,
                  ready: Callable[[str], None] | None = None, *, auto_decompress: bool = True) -> None:
    """Run in the calling thread until interrupted (the CLI); ``ready(url)`` once listening."""
    st = ServerThread(app_factory, host, port, auto_decompress=auto_decompress)

    async def main() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(st.serve(stop))
        while not st._ready.is_set():  # the same object: waiting for our own startup
            await asyncio.sleep(0.01)
        if st._error is not None:
            raise st._error
        if ready is not None:
            ready(st.url)
        try:
            await task
        except asyncio.CancelledError:
            stop.set()

    with contextlib.suppress(KeyboardInterrupt):
        _run(main())


def _run(coro: Any) -> None:
    """``asyncio.run``, on uvloop when it is installed (the ``[fast]`` extra): the same
    server, with about half the per-request overhead of the default loop."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(coro)
        return
    uvloop.run(coro)


def spawn_cli_server(args: list[str], *, env: dict[str, str] | None = None, quiet: bool = False
                     ) -> tuple[subprocess.Popen[str], str]:
    """Start ``cachecompact serve|proxy ...`` (with ``--port 0``) as a child process and return
    it with its URL, read from the "listening on" line it prints once ready: for tests and
    benchmarks that need a real separate server process."""
    p = subprocess.Popen([sys.executable, "-m", "cachecompact.tools.cli", *args], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL if quiet else None, text=True, env=env)
    assert p.stdout is not None
    line = p.stdout.readline()
    m = re.search(r"listening on (http://[\d.]+:\d+)", line)
    if not m:
        p.kill()
        p.wait(10)
        raise RuntimeError(f"cachecompact {' '.join(args)} did not start: {line.strip()!r}")
    return p, m.group(1)
