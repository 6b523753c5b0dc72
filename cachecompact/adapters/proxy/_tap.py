"""Reading a response's usage while its bytes pass through unchanged, and reading an error body
the proxy must understand itself (compressed or not)."""

from __future__ import annotations

import time
import zlib
from typing import Any

from ...base.http import SSEUsage, json_or_none
from ...base.values import Answer

__all__ = ["ResponseTap", "decoded"]


class ResponseTap:
    """Reads usage from a response while its raw bytes are forwarded.

    In observe mode nothing is parsed on the request path: the bytes are kept (up to `CAP`) and
    `finish` parses them in the analysis thread, after the response. Compact mode must know a
    stream's usage before its last bytes reach the client (``record_first``), so there, and for a
    stream longer than `SSE_DEFER`, SSE events are parsed as they pass. A compressed response is read
    from a decompressed copy."""

    CAP = 8 * 1024 * 1024
    SSE_DEFER = 1024 * 1024  # a longer stream is parsed as it passes: the catch-up stays short, memory small

    def __init__(self, content_type: str, encoding: str, *, live: bool = False) -> None:
        self.sse = "text/event-stream" in content_type
        self.json = "json" in content_type
        self.encoding = encoding
        self.unreadable = encoding not in ("", "identity", "gzip", "deflate") or not (self.sse or self.json)
        self.parts: list[bytes] = []
        self.size = 0
        self.result: Answer | None = None
        self.parser: SSEUsage | None = None
        self.z: Any = None
        self.first_byte: float | None = None
        self._finished = False
        if live and self.sse and not self.unreadable:
            self._go_live()

    def _go_live(self) -> None:
        """From now on, parse SSE as it passes (what was kept so far first)."""
        self.parser = SSEUsage()
        self.z = decompressor(self.encoding)
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
        got = self.parser.feed(chunk)
        if got is not None:
            self.result = got

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

    def finish(self) -> Answer | None:
        """The usage, message id and diagnostics, once the response is complete (idempotent)."""
        if self._finished or self.unreadable:
            return self.result
        if self.sse:
            if self.parser is None:
                self._go_live()
            assert self.parser is not None
            got = self.parser.finish()
            if got is not None:
                self.result = got
            self._finished = self.result is not None
            return self.result
        self._finished = True
        d = json_or_none(decoded(b"".join(self.parts), self.encoding, self.CAP))
        if isinstance(d, dict) and isinstance(d.get("usage"), dict):
            reason = (d.get("diagnostics") or {}).get("cache_miss_reason")
            stop = d.get("stop_reason")
            self.result = Answer(d["usage"], d.get("id"), reason if isinstance(reason, dict) else None,
                                 stop_reason=stop if isinstance(stop, str) else None)
        return self.result


def decoded(raw: bytes, encoding: str, limit: int = 1 << 22) -> bytes:
    """A response body as its sender meant it (the proxy forwards the compressed bytes, but
    reads an error body itself); an unknown or broken encoding reads as empty."""
    enc = encoding.strip().lower()
    if enc in ("", "identity"):
        return raw
    z = decompressor(enc)
    if z is None:
        return b""
    try:
        out: bytes = z.decompress(raw, limit)
    except zlib.error:
        return b""
    return out


def decompressor(encoding: str) -> Any:
    """A zlib decompressor for a gzip or deflate ``Content-Encoding``, else None."""
    if encoding == "gzip":
        return zlib.decompressobj(16 + zlib.MAX_WBITS)
    return zlib.decompressobj() if encoding == "deflate" else None
