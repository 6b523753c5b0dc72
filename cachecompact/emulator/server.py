"""HTTP front of the emulator (stdlib ThreadingHTTPServer on loopback) and `Emulator`."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any

from .core import EmulatorCore, FaultConfig
from .responders import Responder

__all__ = ["Emulator"]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are separate writes: avoid the 40 ms delayed-ACK stall
    core: EmulatorCore  # set on the subclass made per server

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the request log is the emulator's own JSONL."""

    def _serve(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length > 0 else b""
        headers = {k.lower(): v for k, v in self.headers.items()}
        try:
            reply = self.core.handle(self.command, self.path, headers, raw)
        except Exception as err:  # a bug must never kill the server thread; report it as the API would
            reply = self.core._error(500, f"emulator internal error: {type(err).__name__}: {err}", "req_emu_error")
        self.send_response(reply.status)
        for k, v in reply.headers.items():
            self.send_header(k, v)
        if reply.events is not None:
            self.send_header("connection", "close")
            self.end_headers()
            for chunk in reply.sse():
                self.wfile.write(chunk)
                self.wfile.flush()
            self.close_connection = True
            return
        self.send_header("content-length", str(len(reply.body)))
        self.end_headers()
        self.wfile.write(reply.body)

    do_POST = _serve
    do_GET = _serve
    do_PUT = _serve
    do_DELETE = _serve


class Emulator:
    """A local Messages API on a free loopback port, for tests, demos and benchmarks.

    >>> with Emulator() as emu:
    ...     client = anthropic.Anthropic(base_url=emu.url, api_key="test")
    """

    def __init__(
        self,
        responder: Responder | None = None,
        *,
        faults: FaultConfig | None = None,
        log: str | Path | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.core = EmulatorCore(responder, faults=faults, log_path=log)
        handler = type("Handler", (_Handler,), {"core": self.core})
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def requests(self) -> list[dict[str, Any]]:
        """The request log: one dict per request (usage, cost, prefix hashes, ...)."""
        return self.core.log

    def start(self) -> Emulator:
        if self._thread is None:
            self._thread = threading.Thread(target=self._server.serve_forever, name="cachecompact-emulator",
                                            daemon=True)
            self._thread.start()
        return self

    def serve_forever(self) -> None:
        self._server.serve_forever()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None

    def __enter__(self) -> Emulator:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
