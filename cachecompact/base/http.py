"""The HTTP around the API's JSON, shared by both adapters and the emulator's clients: header
values (``anthropic-beta``, the clock), error bodies (prompt too long) and SSE streams (the
usage of a streamed answer). Plain functions over bytes and mappings, so an adapter reads a
response without importing the engine."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from .values import Answer

__all__ = ["SSEUsage", "clock_from", "json_or_none", "too_long", "too_long_message", "with_betas"]


def too_long(payload: Any) -> tuple[int, int, int] | None:
    """(prompt tokens, limit, max_tokens) from a prompt-too-long 400 body, else None."""
    try:
        msg = payload["error"]["message"]
    except (TypeError, KeyError):
        return None
    if not isinstance(msg, str):
        return None
    m = re.search(r"prompt is too long: (\d+) tokens > (\d+) maximum", msg)
    if m:
        return int(m.group(1)), int(m.group(2)), 0
    m = re.search(r"input length and `max_tokens` exceed context limit: (\d+) \+ (\d+) > (\d+)", msg)
    if m:
        return int(m.group(1)), int(m.group(3)), int(m.group(2))
    return None


def too_long_message(tokens: int, window: int, why: str) -> str:
    """A refusal of ours that the request does not fit, in the API's own words first ("prompt is
    too long: N tokens > M maximum", plain digits, docs/anthropic-cache-facts.md section 6), then
    ours in brackets. Clients act on the API's words: Claude Code compacts the conversation itself
    on any error whose message contains "prompt is too long" (2.1.332's error classifier), so a
    refusal worded otherwise ends its session where the API's own 400 would not. `too_long` reads
    it back. Only for ``tokens > window``: a prompt that fits goes to the API, which decides."""
    return f"prompt is too long: {tokens} tokens > {window} maximum (cachecompact: {why})"


def with_betas(value: str | None, betas: tuple[str, ...]) -> str | None:
    """An ``anthropic-beta`` header value with ``betas`` added (each once)."""
    have = [b.strip() for b in (value or "").split(",") if b.strip()]
    merged = have + [b for b in betas if b not in have]
    return ",".join(merged) if merged else value


def json_or_none(raw: bytes) -> Any:
    """The JSON value of ``raw``, or None for anything that is not JSON this process can hold
    (nesting deeper than the interpreter's stack, an integer of thousands of digits): the
    caller's bytes then go on unchanged and the upstream's own error handling applies."""
    try:
        return json.loads(raw or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError, ValueError):
        return None


def clock_from(headers: Mapping[str, Any], header: str, default: Callable[[], float]) -> float:
    """Request time from a clock header (finite unix seconds), else ``default()``."""
    v = headers.get(header)
    try:
        t = float(v) if isinstance(v, str) else default()
    except ValueError:
        return default()
    return t if t == t and abs(t) != float("inf") else default()


class SSEUsage:
    """Incremental SSE parser that keeps the usage, message id and diagnostics of a stream.

    `feed` and `finish` return the stream's `Answer` once, the first time it is complete (at
    ``message_stop``, or at the end of a stream that lost it), and None otherwise: the caller
    acts on it, so this parser never calls back up into the adapter that feeds it."""

    def __init__(self) -> None:
        self._pending: list[bytes] = []  # the start of a frame whose end has not arrived
        self._tail = b""  # its last 3 bytes: where a separator that ends in the next chunk may begin
        self.usage: dict[str, Any] = {}
        self.message_id: str | None = None
        self.diag: dict[str, Any] | None = None
        self.stop_reason: str | None = None
        self.answer: Answer | None = None  # set once the stream's usage is complete
        self._unread: Answer | None = None  # complete, not yet returned

    def _take(self) -> Answer | None:
        got, self._unread = self._unread, None
        return got

    def feed(self, chunk: bytes) -> Answer | None:
        """Parse the complete frames in ``chunk`` (plus what was left over); a frame that names no
        ``message_*`` event is skipped without being split into lines. Linear in the input however
        it is split: while no frame ends, chunks are only collected. Returns the `Answer` if this
        chunk completed it."""
        if self._pending:
            # does a frame end in this chunk? (its separator may begin in the bytes before it)
            probe = self._tail + chunk[:3]
            if b"\n\n" not in chunk and b"\r\n\r\n" not in chunk and b"\n\n" not in probe \
                    and b"\r\n\r\n" not in probe:
                self._pending.append(chunk)
                self._tail = probe[-3:] if len(chunk) < 3 else chunk[-3:]
                return None
            buf = b"".join(self._pending) + chunk
            self._pending = []
        else:
            buf = chunk
        pos = 0
        lf = buf.find(b"\n\n")
        crlf = buf.find(b"\r\n\r\n")
        while lf >= 0 or crlf >= 0:
            if crlf >= 0 and (lf < 0 or crlf < lf):
                cut, nxt = crlf, crlf + 4
            else:
                cut, nxt = lf, lf + 2
            self._frame(buf, pos, cut)
            pos = nxt
            if lf >= 0 and lf < pos:
                lf = buf.find(b"\n\n", pos)
            if crlf >= 0 and crlf < pos:
                crlf = buf.find(b"\r\n\r\n", pos)
        if pos < len(buf):
            self._pending = [buf[pos:]]
            self._tail = buf[-3:]
        return self._take()

    def _frame(self, buf: bytes, start: int, end: int) -> None:
        if buf.find(b'"message_', start, end) >= 0:
            for line in buf[start:end].splitlines():
                if line.startswith(b"data:"):
                    self._event(line[5:].strip())

    def _event(self, data: bytes) -> None:
        if b'"message_start"' not in data and b'"message_delta"' not in data and b'"message_stop"' not in data:
            return  # content deltas: most of the stream, nothing to keep
        try:
            d = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return
        if not isinstance(d, dict):
            return
        kind = d.get("type")
        if kind == "message_start":
            msg = d.get("message") or {}
            self.message_id = msg.get("id")
            self.usage.update({k: v for k, v in (msg.get("usage") or {}).items() if v is not None})
            reason = (msg.get("diagnostics") or {}).get("cache_miss_reason")
            self.diag = reason if isinstance(reason, dict) else None
        elif kind == "message_delta":
            self.usage.update({k: v for k, v in (d.get("usage") or {}).items() if v is not None})
            reason = (d.get("delta") or {}).get("stop_reason")
            self.stop_reason = reason if isinstance(reason, str) else self.stop_reason
        elif kind == "message_stop":
            self._complete()

    def _complete(self) -> None:
        if self.answer is None and self.usage:
            self.answer = self._unread = Answer(dict(self.usage), self.message_id, self.diag, stream=True,
                                                  stop_reason=self.stop_reason)

    def finish(self) -> Answer | None:
        """The stream ended: a last frame without its closing blank line counts too. Returns the
        `Answer` if it was not complete before."""
        if self._pending:
            tail = b"".join(self._pending)
            self._pending = []
            self._frame(tail, 0, len(tail))
        self._complete()
        return self._take()
