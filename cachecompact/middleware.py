"""One line around the client you already use: ``client = cachecompact.wrap(anthropic.Anthropic())``.

The SDK runs middleware inside its retry loop, once per HTTP attempt. For each
``POST /v1/messages`` this middleware:

1. finds the session: an explicit id (config or the ``x-cachecompact-session`` header), else
   the hash of tools + system + first message; sessions persist under ``store_dir``;
2. syncs the transcript with the agent's full history (a history that rewrites earlier
   messages starts a new *branch* session and logs a warning; the old one is untouched);
3. runs the compaction strategy, renders, and sends the compacted request
   (``request.copy(body=...)``; ``request.json`` is never mutated);
4. records usage: parsed from the response, or teed from the SSE stream without consuming
   it; feeds the cache monitor and the strategy's calibration.

Retried attempts of one request reuse the first attempt's prepared body (same request
fingerprint), so nothing is appended twice. A 400 "prompt is too long" triggers reactive
compaction and one retry; if it still cannot fit, `ContextFullError`. Any other internal
error fails open: the original request is sent, the failure is recorded and counted by the
circuit breaker. Other endpoints pass through untouched.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import xxhash
from anthropic import AsyncAnthropic, Middleware
from anthropic._middleware import AsyncCallNext, CallNext
from anthropic._request import APIRequest
from anthropic._response import APIResponse, AsyncAPIResponse

from .compactor import Compactor, Strategy
from .emulator.core import CLOCK_HEADER, INTERNAL_HEADER
from .errors import (
    CacheCompactError,
    HistoryRewrittenError,
    LedgerCorruptError,
    MalformedMessageError,
    StoreError,
)
from .events import Event, EventBus
from .monitor import CacheMonitor
from .policy import ContextFullError, PolicyConfig
from .presets import preset
from .pricing import UnknownModelError, get_model
from .render import RenderResult
from .session import Session
from .store import EVENTS, REQUESTS
from .summarize import ExtractiveSummarizer, LLMSummarizer, Summarizer
from .wire import canonical_bytes, plain

__all__ = ["INTERNAL_HEADER", "SESSION_HEADER", "CompactionMiddleware", "wrap"]

log = logging.getLogger("cachecompact")

SESSION_HEADER = "x-cachecompact-session"
_SID_RE = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
_PTL = re.compile(r"prompt is too long: (\d+) tokens > (\d+) maximum")
_STILL_TOO_LONG = "context is full: still too long after reactive compaction; start a new session"
_CTX = re.compile(r"input length and `max_tokens` exceed context limit: (\d+) \+ (\d+) > (\d+)")


@dataclass(slots=True)
class _Live:
    session: Session
    strategy: Strategy
    lock: threading.Lock
    last_message_id: str | None = None
    last_fingerprint: bytes | None = None
    last_prepared: _Prepared | None = None


@dataclass(slots=True)
class _Prepared:
    live: _Live
    body: dict[str, Any]
    render: RenderResult
    now: float
    model: str
    max_tokens: int
    conversation: bytes
    params: dict[str, Any]


def _too_long(payload: Any) -> tuple[int, int, int] | None:
    """(prompt tokens, limit, max_tokens) from a prompt-too-long 400 body, else None."""
    try:
        msg = payload["error"]["message"]
    except (TypeError, KeyError):
        return None
    if not isinstance(msg, str):
        return None
    m = _PTL.search(msg)
    if m:
        return int(m.group(1)), int(m.group(2)), 0
    m = _CTX.search(msg)
    if m:
        return int(m.group(1)), int(m.group(3)), int(m.group(2))
    return None


class CompactionMiddleware(Middleware):
    """Cache-aware compaction for every ``messages.create`` / ``messages.stream`` call."""

    def __init__(
        self,
        store_dir: str | Path | None = ".cachecompact/sessions",
        *,
        session_id: str | None = None,
        config: PolicyConfig | None = None,
        strategy: str | Callable[[Session, Summarizer, EventBus], Strategy] = "default",
        summarizer: Summarizer | None = None,
        prefix_messages: int = 3,
        diagnostics: bool = False,
        ttl: str | None = None,
        prefix_ttl: str | None = None,
        on_event: Callable[[Event], None] | list[Callable[[Event], None]] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if session_id is not None and not _SID_RE.match(session_id):
            raise ValueError(f"session_id {session_id[:80]!r} must match {_SID_RE.pattern}")
        self.store_dir = Path(store_dir) if store_dir is not None else None
        self.session_id = session_id
        self.config = config or PolicyConfig()
        self.strategy_name = strategy
        self.summarizer = summarizer or ExtractiveSummarizer()
        self.prefix_messages = prefix_messages
        self.diagnostics = diagnostics
        self.ttl, self.prefix_ttl = ttl, prefix_ttl
        callbacks = on_event if isinstance(on_event, list) else ([on_event] if on_event else [])
        self.events = EventBus(callbacks)
        self.events.subscribe(self._persist_event)
        self.monitor = CacheMonitor(self.events, ttl_s=self.config.cache_ttl_s)
        self.clock = clock
        self.overhead_s = 0.0  # time spent preparing requests and recording usage
        self._live: dict[str, _Live] = {}
        self._current: dict[str, str] = {}  # conversation key -> current branch name
        self._lock = threading.Lock()

    # -- sessions ----------------------------------------------------------------------------

    def sessions(self) -> list[Session]:
        """The sessions this middleware has in memory."""
        return [x.session for x in self._live.values()]

    def _key(self, request: APIRequest, body: dict[str, Any]) -> str:
        sid = request.headers.get(SESSION_HEADER) if isinstance(request.headers, dict) else None
        sid = sid if isinstance(sid, str) else self.session_id
        if sid is not None:
            if not _SID_RE.match(sid):
                raise MalformedMessageError(SESSION_HEADER, f"session id {sid[:80]!r} must match {_SID_RE.pattern}")
            return sid
        msgs = body.get("messages") or []
        first = msgs[0] if msgs else None
        digest = xxhash.xxh3_128_hexdigest(canonical_bytes([body.get("tools"), body.get("system"), first]))
        return f"s_{digest}"

    def _open_or_create(self, name: str, body: dict[str, Any]) -> _Live:
        live = self._live.get(name)
        if live is not None:
            return live
        path = self.store_dir / name if self.store_dir is not None else None
        if path is not None and (path / "session.json").exists():
            session = Session.open(path)
        else:
            session = Session.create(path, system=body.get("system"), tools=body.get("tools"),
                                     prefix_messages=self.prefix_messages, session_id=name)
        strategy: Strategy
        if callable(self.strategy_name):
            strategy = self.strategy_name(session, self.summarizer, self.events)
        elif self.strategy_name in ("default", "cachecompact"):
            strategy = preset(self.strategy_name, session, config=self.config, summarizer=self.summarizer,
                              events=self.events)
        else:
            strategy = preset(self.strategy_name, session, summarizer=self.summarizer, events=self.events,
                              limit_tokens=self.config.limit)
        if isinstance(strategy, Compactor):
            strategy.resume()
        live = self._live[name] = _Live(session, strategy, threading.Lock())
        return live

    def _branch_name(self, key: str) -> str:
        if key in self._current:
            return self._current[key]
        name = key
        if self.store_dir is not None and self.store_dir.is_dir():
            branches = [p.name for p in self.store_dir.glob(f"{key}.b*") if p.name[len(key) + 2:].isdigit()]
            if branches:
                name = max(branches, key=lambda n: int(n[len(key) + 2:]))
        self._current[key] = name
        return name

    def _new_branch(self, key: str, body: dict[str, Any], why: HistoryRewrittenError) -> _Live:
        cur = self._current.get(key, key)
        n = int(cur[len(key) + 2:]) + 1 if cur != key else 1
        name = f"{key}.b{n}"
        log.warning("cachecompact: %s; starting branch session %s (the old session %s is kept unchanged)",
                    why, name, cur)
        self._current[key] = name
        return self._open_or_create(name, body)

    # -- preparing a request ---------------------------------------------------------------------

    @staticmethod
    def _applies(request: APIRequest) -> bool:
        url = request.url.split("?", 1)[0]
        headers = request.headers if isinstance(request.headers, dict) else {}
        return (request.method.lower() == "post" and url == "/v1/messages" and isinstance(request.json, dict)
                and INTERNAL_HEADER not in headers)

    def _now(self, request: APIRequest) -> float:
        headers = request.headers if isinstance(request.headers, dict) else {}
        v = headers.get(CLOCK_HEADER)
        try:
            return float(v) if isinstance(v, str) else self.clock()
        except ValueError:
            return self.clock()

    def _prepare(self, request: APIRequest) -> _Prepared:
        body = plain(request.json)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise MalformedMessageError("messages", "must be a non-empty list")
        key = self._key(request, body)
        now = self._now(request)
        with self._lock:
            live = self._open_or_create(self._branch_name(key), body)
        fp = xxhash.xxh3_128_digest(canonical_bytes(body) + key.encode())
        with live.lock:
            if live.last_fingerprint == fp and live.last_prepared is not None:
                return live.last_prepared  # a retried attempt: nothing new to record
            try:
                live.session.sync(messages)
                return self._finish_prepare(live, body, now, fp)
            except HistoryRewrittenError as err:
                rewritten = err
        with self._lock:
            live = self._new_branch(key, body, rewritten)
        with live.lock:
            live.session.sync(messages)
            return self._finish_prepare(live, body, now, fp)

    def _finish_prepare(self, live: _Live, body: dict[str, Any], now: float, fp: bytes) -> _Prepared:
        params = {k: v for k, v in body.items() if k not in ("messages", "system", "tools")}
        model = str(params.pop("model", ""))
        max_tokens = int(params.pop("max_tokens", 0) or 0)
        if self.diagnostics:
            params["diagnostics"] = {"previous_message_id": live.last_message_id}
        live.strategy.before_request(now, model, max_tokens, params=params)
        r = live.session.render(model=model, max_tokens=max_tokens, ttl=self.ttl, prefix_ttl=self.prefix_ttl,
                                **params)
        first = body["messages"][0]
        prepared = _Prepared(live, r.body, r, now, model, max_tokens,
                             xxhash.xxh3_128_digest(canonical_bytes(first)), params)
        live.last_fingerprint, live.last_prepared = fp, prepared
        return prepared

    def _prepare_or_fail_open(self, request: APIRequest) -> _Prepared | None:
        t0 = time.perf_counter()
        try:
            return self._prepare(request)
        except (ContextFullError, StoreError, LedgerCorruptError):
            raise  # cannot fit at all / the audit trail is broken: say so clearly
        except MalformedMessageError as err:
            log.warning("cachecompact: request passed through unchanged: %s", err)
            return None
        except Exception as err:  # fail open: the user's request still goes out
            log.exception("cachecompact: compaction failed; sending the original request")
            self.events.emit(Event("failure", self.session_id or "-", reason=f"middleware: {type(err).__name__}: "
                                                                           f"{err}"))
            return None
        finally:
            self.overhead_s += time.perf_counter() - t0

    # -- after the response --------------------------------------------------------------------

    def _record(self, p: _Prepared, usage: dict[str, Any], message_id: str | None,
                cache_miss_reason: dict[str, Any] | None) -> None:
        t0 = time.perf_counter()
        try:
            live = p.live
            with live.lock:
                live.strategy.after_response(p.now, usage)
                live.last_message_id = message_id or live.last_message_id
                try:
                    cost = get_model(p.model).cost(usage)
                except UnknownModelError:
                    cost = 0.0
                rec = self.monitor.record(conversation=p.conversation, session_id=live.session.session_id,
                                          render=p.render, usage=usage, now=p.now, model=p.model, cost_usd=cost,
                                          ledger_entries=len(live.session.ledger),
                                          cache_miss_reason=cache_miss_reason, message_id=message_id)
                if live.session.store is not None:
                    live.session.store.append_log(REQUESTS, [rec])
        except Exception:  # recording must never break the caller's response
            log.exception("cachecompact: could not record usage")
        finally:
            self.overhead_s += time.perf_counter() - t0

    def _persist_event(self, ev: Event) -> None:
        live = self._live.get(ev.session_id)
        if live is not None and live.session.store is not None:
            try:
                live.session.store.append_log(EVENTS, [ev.to_dict()])
            except OSError:
                log.exception("cachecompact: could not persist an event")

    def _reactive(self, p: _Prepared, info: tuple[int, int, int]) -> dict[str, Any]:
        """Compact after a prompt-too-long error; the new body, or `ContextFullError`."""
        n, limit, out = info
        live = p.live
        with live.lock:
            ok = live.strategy.reactive(n, limit, p.now, p.model, out or p.max_tokens)
            if not ok:
                raise ContextFullError(f"context is full: the prompt has {n} tokens, the limit is {limit}, and "
                                       "compaction cannot remove enough; start a new session")
            r = live.session.render(model=p.model, max_tokens=p.max_tokens, ttl=self.ttl,
                                    prefix_ttl=self.prefix_ttl, **p.params)
            p.render, p.body = r, r.body
            live.last_prepared = p
            return r.body

    # -- sync client --------------------------------------------------------------------------------

    def handle(self, request: APIRequest, call_next: CallNext) -> APIResponse[Any]:
        if not self._applies(request):
            return call_next(request)
        p = self._prepare_or_fail_open(request)
        if p is None:
            return call_next(request)
        resp = call_next(request.copy(body=p.body))
        if resp.status_code == 400:
            info = _too_long(json.loads(resp.http_response.read() or b"null"))
            if info is not None:
                body = self._reactive(p, info)
                resp.close()
                resp = call_next(request.copy(body=body))
                if resp.status_code == 400 and _too_long(json.loads(resp.http_response.read() or b"null")):
                    raise ContextFullError(_STILL_TOO_LONG)
        if resp.status_code == 200:
            if request.stream:
                resp.http_response.stream = _UsageTap(resp.http_response.stream,  # type: ignore[arg-type]
                                                      lambda u, i, d: self._record(p, u, i, d))
            else:
                msg = resp.parse()
                self._record(p, _usage_dict(msg.usage), getattr(msg, "id", None), _diag(msg))
        return resp

    # -- async client ---------------------------------------------------------------------------------

    async def handle_async(self, request: APIRequest, call_next: AsyncCallNext) -> AsyncAPIResponse[Any]:
        if not self._applies(request):
            return await call_next(request)
        p = await asyncio.to_thread(self._prepare_or_fail_open, request)
        if p is None:
            return await call_next(request)
        resp = await call_next(request.copy(body=p.body))
        if resp.status_code == 400:
            info = _too_long(json.loads(await resp.http_response.aread() or b"null"))
            if info is not None:
                body = await asyncio.to_thread(self._reactive, p, info)
                await resp.close()
                resp = await call_next(request.copy(body=body))
                if resp.status_code == 400 and _too_long(json.loads(await resp.http_response.aread() or b"null")):
                    raise ContextFullError(_STILL_TOO_LONG)
        if resp.status_code == 200:
            if request.stream:
                resp.http_response.stream = _AsyncUsageTap(resp.http_response.stream,  # type: ignore[arg-type]
                                                           lambda u, i, d: self._record(p, u, i, d))
            else:
                msg = await resp.parse()
                await asyncio.to_thread(self._record, p, _usage_dict(msg.usage), getattr(msg, "id", None),
                                        _diag(msg))
        return resp


def _usage_dict(usage: Any) -> dict[str, Any]:
    if usage is None:
        return {}
    return usage.model_dump(exclude_none=True) if hasattr(usage, "model_dump") else dict(usage)


def _diag(msg: Any) -> dict[str, Any] | None:
    d = getattr(msg, "diagnostics", None)
    reason = getattr(d, "cache_miss_reason", None) if d is not None else None
    return reason.model_dump() if reason is not None and hasattr(reason, "model_dump") else None


class _SSEUsage:
    """Incremental SSE parser that keeps the usage, message id and diagnostics."""

    def __init__(self, done: Callable[[dict[str, Any], str | None, dict[str, Any] | None], None]) -> None:
        self.buf = b""
        self.usage: dict[str, Any] = {}
        self.message_id: str | None = None
        self.diag: dict[str, Any] | None = None
        self.done = done
        self.reported = False

    def feed(self, chunk: bytes) -> None:
        self.buf += chunk
        while b"\n\n" in self.buf:
            frame, self.buf = self.buf.split(b"\n\n", 1)
            for line in frame.split(b"\n"):
                if not line.startswith(b"data:"):
                    continue
                try:
                    d = json.loads(line[5:].strip())
                except json.JSONDecodeError:
                    continue
                kind = d.get("type")
                if kind == "message_start":
                    msg = d.get("message") or {}
                    self.message_id = msg.get("id")
                    self.usage.update({k: v for k, v in (msg.get("usage") or {}).items() if v is not None})
                    reason = (msg.get("diagnostics") or {}).get("cache_miss_reason")
                    self.diag = reason if isinstance(reason, dict) else None
                elif kind == "message_delta":
                    self.usage.update({k: v for k, v in (d.get("usage") or {}).items() if v is not None})
                elif kind == "message_stop":
                    self.finish()

    def finish(self) -> None:
        if not self.reported and self.usage:
            self.reported = True
            self.done(dict(self.usage), self.message_id, self.diag)


class _UsageTap(httpx2.SyncByteStream):
    """Passes the caller's stream through unchanged while reading usage from it."""

    def __init__(self, inner: httpx2.SyncByteStream, done: Callable[..., None]) -> None:
        self.inner = inner
        self.parser = _SSEUsage(done)

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self.inner:
            self.parser.feed(chunk)
            yield chunk
        self.parser.finish()

    def close(self) -> None:
        self.parser.finish()
        self.inner.close()


class _AsyncUsageTap(httpx2.AsyncByteStream):
    def __init__(self, inner: httpx2.AsyncByteStream, done: Callable[..., None]) -> None:
        self.inner = inner
        self.parser = _SSEUsage(done)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.inner:
            self.parser.feed(chunk)
            yield chunk
        self.parser.finish()

    async def aclose(self) -> None:
        self.parser.finish()
        await self.inner.aclose()


def wrap(client: Any, *, summarizer: Summarizer | str | None = "auto", **config: Any) -> Any:
    """``client.with_middleware(CompactionMiddleware(...))``; ``summarizer="auto"`` summarises with
    ``claude-haiku-4-5`` through a client like this one (without the middleware)."""
    if summarizer == "auto":
        sync = client
        if isinstance(client, AsyncAnthropic):
            import anthropic

            sync = anthropic.Anthropic(api_key=client.api_key, base_url=str(client.base_url),
                                       timeout=client.timeout, max_retries=client.max_retries)
        summarizer = LLMSummarizer(sync, extra_headers={INTERNAL_HEADER: "1"})
    elif isinstance(summarizer, str):
        raise CacheCompactError(f"summarizer must be 'auto', None or a Summarizer, got {summarizer!r}")
    return client.with_middleware(CompactionMiddleware(summarizer=summarizer, **config))
