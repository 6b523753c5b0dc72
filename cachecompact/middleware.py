"""One line around the client you already use: ``client = cachecompact.wrap(anthropic.Anthropic())``.

The SDK runs middleware inside its retry loop, once per HTTP attempt. For each
``POST /v1/messages`` this middleware:

1. finds the session (`SessionRegistry`): an explicit id (``session_id=`` or the
   ``x-cachecompact-session`` header), else the opening of the conversation and the longest
   stored transcript its history extends; sessions persist in the store (a directory by
   default, or ``postgresql://...``);
2. syncs the transcript with the agent's full history and runs the strategy;
3. renders and sends the compacted request (a shallow copy of the SDK's request options
   with the new body: the caller's request is never mutated and never deep-copied);
4. records usage from the decoded response (parsed, or teed from the SSE stream without
   consuming it) and runs the cache forensics on it.

Retried attempts of one request reuse the first attempt's prepared body (same request
fingerprint), so nothing is appended twice. A 400 "prompt is too long" triggers reactive
compaction and one retry; if it still cannot fit, `ContextFullError` (an `anthropic.APIError`).
Any internal error, a store failure included, fails open: the original request is sent and
a ``failure`` event is recorded. Misconfiguration is refused when the middleware is built.
Only the SDK's public names are used.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import anthropic
import httpx2
import xxhash
from anthropic import APIRequest, APIResponse, AsyncAPIResponse, AsyncCallNext, CallNext, Middleware

from .cache_sim import request_from_body
from .errors import (
    CacheCompactError,
    ConfigError,
    ContextFullError,
    InvalidSessionIdError,
    MalformedMessageError,
    PolicyConfigError,
    UnknownModelError,
)
from .events import Event, EventBus
from .forensics import Finding, Forensics, Snapshot, params_key, snapshot_from_render, snapshot_from_sim
from .policy import MIN_WINDOW_TOKENS, PolicyConfig
from .pricing import ModelInfo, model_prices
from .protocol import CLOCK_HEADER, INTERNAL_HEADER, SESSION_HEADER
from .registry import Live, SessionRegistry
from .render import RenderResult
from .scratchpad import READ_SCRATCHPAD_TOOL, Scratchpad
from .session import Session
from .store import Store, check_session_id, open_store
from .store.safefs import ensure_dir
from .strategies import get_strategy, with_policy
from .strategy import Strategy, StrategyConfig, StrategyContext
from .summarize import ExtractiveSummarizer, LLMSummarizer, Summarizer
from .wire import canonical_bytes

__all__ = ["SESSION_HEADER", "CompactionMiddleware", "scratchpad_handler", "summarizer_factory", "wrap",
           "wrapped_sessions"]

log = logging.getLogger("cachecompact")

_PTL = "prompt is too long: "
_STILL_TOO_LONG = "context is full: still too long after reactive compaction; start a new session"
ClientT = TypeVar("ClientT", anthropic.Anthropic, anthropic.AsyncAnthropic)
SummarizerFactory = Callable[[str | None, str], Summarizer]  # (model or None: the agent's, mode) -> summarizer


@dataclass(slots=True)
class _Prepared:
    live: Live
    body: dict[str, Any]
    render: RenderResult
    snapshot: Callable[[], Snapshot]
    now: float
    model: str
    max_tokens: int
    params: dict[str, Any]
    fingerprint: bytes


def _too_long(payload: Any) -> tuple[int, int, int] | None:
    """(prompt tokens, limit, max_tokens) from a prompt-too-long 400 body, else None."""
    import re

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


def _json_or_none(raw: bytes) -> Any:
    try:
        return json.loads(raw or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None  # not JSON: the SDK turns it into its own typed error for the caller


def _with_body(request: APIRequest, body: dict[str, Any]) -> APIRequest:
    """``request`` with a new body: a shallow copy of its options (``request.copy`` would deep-copy
    the caller's whole history first, only to throw it away)."""
    opts = request.options.model_copy()
    opts.json_data = body
    if isinstance(opts.headers, dict):
        opts.headers = dict(opts.headers)
    return APIRequest(options=opts, cast_to=request.cast_to, stream=request.stream, stream_cls=request.stream_cls,
                      retries_taken=request.retries_taken)


class CompactionMiddleware(Middleware):
    """Cache-aware compaction for every ``messages.create`` / ``messages.stream`` call."""

    def __init__(
        self,
        store: str | os.PathLike[str] | Store | None = ".cachecompact/sessions",
        *,
        session_id: str | None = None,
        strategy: str | StrategyConfig = "cachecompact",
        config: PolicyConfig | None = None,
        window_tokens: int | None = None,
        summarizer: Summarizer | SummarizerFactory | None = None,
        prefix_messages: int | None = None,
        scratchpad_tool: bool = False,
        diagnostics: bool = False,
        ttl: Literal["5m", "1h"] | None = None,
        prefix_ttl: Literal["5m", "1h"] | None = None,
        on_event: Callable[[Event], None] | list[Callable[[Event], None]] | None = None,
        clock: Callable[[], float] = time.time,
        store_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        if store_dir is not None:  # the 0.1 name of ``store``
            store = store_dir
        if session_id is not None:
            check_session_id(session_id, "session_id")
        for name, v in (("ttl", ttl), ("prefix_ttl", prefix_ttl)):
            if v not in (None, "5m", "1h"):
                raise ConfigError(f"{name} must be '5m', '1h' or None, got {v!r}")
        if ttl == "5m" and prefix_ttl is None:
            prefix_ttl = None
        if window_tokens is not None and (not isinstance(window_tokens, int) or window_tokens < MIN_WINDOW_TOKENS):
            raise PolicyConfigError(f"window_tokens must be an integer of at least {MIN_WINDOW_TOKENS}, "
                                    f"got {window_tokens!r}")
        if prefix_messages is not None and (not isinstance(prefix_messages, int) or prefix_messages < 0):
            raise ConfigError(f"prefix_messages must be a non-negative integer, got {prefix_messages!r}")
        cfg = get_strategy(strategy) if isinstance(strategy, str) else strategy
        if not callable(getattr(cfg, "build", None)):
            raise ConfigError(f"strategy must be a registered name or a strategy config, got {strategy!r}")
        self.strategy_config: StrategyConfig = with_policy(cfg, config)
        self.config = config or PolicyConfig()
        self.window_tokens = window_tokens or self.config.window_tokens
        self.store: Store | None = self._open_store(store)
        self.session_id = session_id
        self._summarizer = summarizer
        self.prefix_messages = prefix_messages
        self.scratchpad_tool = scratchpad_tool
        self.diagnostics = diagnostics
        self.ttl, self.prefix_ttl = ttl, prefix_ttl
        callbacks = on_event if isinstance(on_event, list) else ([on_event] if on_event else [])
        self.events = EventBus(callbacks)
        self.events.subscribe(self._persist_event)
        self.clock = clock
        self.overhead_s = 0.0  # time spent preparing requests and recording usage
        self.registry = SessionRegistry(self.store, create=self._create, open_=self._open)
        self._last_prepared: dict[bytes, _Prepared] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _open_store(store: str | os.PathLike[str] | Store | None) -> Store | None:
        """Open the store now, so a misconfiguration fails when the middleware is built."""
        if store is None:
            return None
        s = open_store(store)
        root = getattr(s, "root", None)
        if isinstance(root, Path):
            try:
                ensure_dir(root)
                probe = root / f".probe-{os.getpid()}-{threading.get_ident()}"
                fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                os.close(fd)
                os.unlink(probe)
            except (OSError, CacheCompactError) as err:
                raise ConfigError(f"store {root} is not a writable directory: {err}") from None
        return s

    # -- sessions ----------------------------------------------------------------------------

    def sessions(self) -> list[Session]:
        """The sessions this middleware has in memory."""
        return [x.session for x in self.registry.sessions()]

    def strategies(self) -> list[Strategy]:
        return [x.strategy for x in self.registry.sessions()]

    def _summarizer_for(self, model: str | None) -> Summarizer:
        s = self._summarizer
        if s is None:
            return ExtractiveSummarizer()
        if isinstance(s, Summarizer):
            return s
        cfg = self.strategy_config
        return s(cfg.summary_model or model, cfg.summary_mode)

    def _live(self, session: Session, body: dict[str, Any], caller_head: bytes) -> Live:
        model = str(body.get("model") or "")
        try:
            info: ModelInfo | None = model_prices(model) if model else None
        except UnknownModelError:
            info = None
        window = self.window_tokens or (info.context_window if info is not None else 200_000)
        ctx = StrategyContext(session=session, summarizer=self._summarizer_for(model or None), events=self.events,
                              window_tokens=window, scratchpad=Scratchpad.for_session(session),
                              scratchpad_tool=self.scratchpad_tool)
        live = Live(session=session, strategy=self.strategy_config.build(ctx), head=caller_head)
        live.extra["forensics"] = Forensics(model_prices)
        return live

    def _create(self, sid: str, body: dict[str, Any]) -> Live:
        from .registry import _head_key

        tools = list(body.get("tools") or [])
        if self.scratchpad_tool:
            tools.append(READ_SCRATCHPAD_TOOL)
        model = str(body.get("model") or "")
        try:
            ratio = model_prices(model).token_ratio if model else 1.0
        except UnknownModelError:
            ratio = 1.0
        prefix = self.prefix_messages if self.prefix_messages is not None else self.strategy_config.prefix_messages
        session = Session.create(self.store, session_id=sid, system=body.get("system"), tools=tools,
                                 prefix_messages=prefix, token_ratio=ratio) if self.store is not None else \
            Session.create(None, session_id=sid, system=body.get("system"), tools=tools, prefix_messages=prefix,
                           token_ratio=ratio)
        return self._live(session, body, _head_key(body.get("tools"), body.get("system")))

    def _open(self, sid: str) -> Live:
        from .registry import _head_key

        assert self.store is not None
        session = Session.open(self.store, sid)
        tools = session.tools_param
        if self.scratchpad_tool and tools and tools[-1].get("name") == READ_SCRATCHPAD_TOOL["name"]:
            tools = tools[:-1]
        body = {"model": (session.last_request or {}).get("model", ""), "tools": tools or None,
                "system": session.system_param}
        return self._live(session, body, _head_key(tools or None, session.system_param))

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
            t = float(v) if isinstance(v, str) else self.clock()
        except ValueError:
            return self.clock()
        return t if t == t and abs(t) != float("inf") else self.clock()

    def _prepare(self, request: APIRequest) -> _Prepared:
        body = request.json
        assert isinstance(body, dict)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise MalformedMessageError("messages", "must be a non-empty list")
        headers = request.headers if isinstance(request.headers, dict) else {}
        explicit = headers.get(SESSION_HEADER)
        if isinstance(explicit, str):
            check_session_id(explicit, SESSION_HEADER)
        else:
            explicit = self.session_id
        params = {k: v for k, v in body.items() if k not in ("messages", "system", "tools")}
        fp = xxhash.xxh3_128_digest(canonical_bytes([explicit, len(messages), messages[0], messages[-1], params]))
        with self._lock:
            again = self._last_prepared.get(fp) if request.retries_taken else None
        if again is not None:
            return again  # a retried attempt: nothing new to record
        live, _ = self.registry.resolve(body, explicit)
        now = self._now(request)
        with live.lock:
            model = str(params.pop("model", ""))
            max_tokens = int(params.pop("max_tokens", 0) or 0)
            if self.diagnostics:
                params["diagnostics"] = {"previous_message_id": live.extra.get("last_message_id")}
            live.strategy.before_request(now, model, max_tokens, params=params)
            r = live.session.render(model=model, max_tokens=max_tokens, ttl=self.ttl, prefix_ttl=self.prefix_ttl,
                                    **params)
            if live.strategy.renders:
                out = r.body

                def snap() -> Snapshot:
                    return snapshot_from_render(r, time=now, model=model, params=params_key(out, False))
            else:
                out = live.strategy.shape({**params, "model": model, "max_tokens": max_tokens,
                                           **{k: body[k] for k in ("system", "tools") if k in body},
                                           "messages": messages})

                memo = live.extra.setdefault("sim_memo", {})

                t = live.session.transcript
                same = out.get("messages") is messages and len(messages) == len(t)

                def snap() -> Snapshot:
                    if len(memo) > 50_000:
                        memo.clear()
                    keys = [t.hash_of(i) for i in range(len(t))] if same else None  # the transcript's own hashes
                    sim = request_from_body(out, now, live.session.counter, memo, keys=keys)
                    return snapshot_from_sim(sim, out, keep_text=False)
        p = _Prepared(live, out, r, snap, now, model, max_tokens, params, fp)
        with self._lock:
            self._last_prepared = {fp: p}
        return p

    def _prepare_or_fail_open(self, request: APIRequest) -> _Prepared | None:
        t0 = time.perf_counter()
        try:
            return self._prepare(request)
        except ContextFullError:
            raise  # cannot fit at all, even after L5: say so clearly
        except (MalformedMessageError, InvalidSessionIdError) as err:
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
                cache_miss_reason: dict[str, Any] | None, stream: bool) -> None:
        t0 = time.perf_counter()
        try:
            live = p.live
            with live.lock:
                live.strategy.after_response(p.now, usage)
                live.extra["last_message_id"] = message_id or live.extra.get("last_message_id")
                try:
                    cost = model_prices(p.model).cost(usage)
                except UnknownModelError:
                    cost = 0.0
                snap = p.snapshot()
                finding = live.extra["forensics"].observe(snap, usage, cache_miss_reason)
                self._report(live, finding)
                rec = {"time": p.now, "model": p.model, "usage": usage, "cost_usd": round(cost, 8),
                       "est_tokens": p.render.tokens, "message_id": message_id, "stream": stream,
                       "sent_tokens": snap.total, "finding": finding.to_dict()}
                if live.strategy.renders:
                    live.session.record_request(p.render, rec)
        except Exception:  # recording must never break the caller's response
            log.exception("cachecompact: could not record usage")
        finally:
            self.overhead_s += time.perf_counter() - t0

    def _report(self, live: Live, f: Finding) -> None:
        if f.cls == "read_as_expected":
            return
        level = (logging.DEBUG if f.explained_by is not None or f.cls == "below_minimum" else
                 logging.INFO if f.cls == "ttl_expiry" else logging.WARNING)
        self.events.emit(Event("cache_miss", live.session.session_id, reason=f"{f.cls}: {f.detail}",
                               cost_usd=f.wasted_usd, detail=f.to_dict()), level=level)

    def _persist_event(self, ev: Event) -> None:
        live = self.registry.get(ev.session_id)
        if live is not None and live.session.store is not None:
            try:
                live.session.log_event(ev.to_dict())
            except (OSError, CacheCompactError):
                log.exception("cachecompact: could not persist an event")

    def _reactive(self, p: _Prepared, info: tuple[int, int, int], request: httpx2.Request) -> dict[str, Any]:
        """Compact after a prompt-too-long error; the new body, or `ContextFullError`."""
        n, limit, out = info
        live = p.live
        with live.lock:
            ok = live.strategy.reactive(n, limit, p.now, p.model, out or p.max_tokens)
            if not ok:
                raise ContextFullError(f"context is full: the prompt has {n} tokens, the limit is {limit}, and "
                                       "compaction cannot remove enough; start a new session", request)
            r = live.session.render(model=p.model, max_tokens=p.max_tokens, ttl=self.ttl,
                                    prefix_ttl=self.prefix_ttl, **p.params)
            p.render = r
            p.body = r.body if live.strategy.renders else live.strategy.shape(p.body)
            return p.body

    # -- sync client --------------------------------------------------------------------------------

    def handle(self, request: APIRequest, call_next: CallNext) -> APIResponse[Any]:
        if not self._applies(request):
            return call_next(request)
        p = self._prepare_or_fail_open(request)
        if p is None:
            return call_next(request)
        resp = call_next(_with_body(request, p.body))
        if resp.status_code == 400:
            info = _too_long(_json_or_none(resp.read()))
            if info is not None:
                body = self._reactive(p, info, resp.http_response.request)
                resp.close()
                resp = call_next(_with_body(request, body))
                if resp.status_code == 400 and _too_long(_json_or_none(resp.read())):
                    raise ContextFullError(_STILL_TOO_LONG, resp.http_response.request)
        if resp.status_code == 200:
            if request.stream:
                resp.http_response = _tapped(resp.http_response, _UsageTap(
                    resp.http_response, lambda u, i, d: self._record(p, u, i, d, True)))
            else:
                msg = resp.parse()
                self._record(p, _usage_dict(msg.usage), getattr(msg, "id", None), _diag(msg), False)
        return resp

    # -- async client ---------------------------------------------------------------------------------

    async def handle_async(self, request: APIRequest, call_next: AsyncCallNext) -> AsyncAPIResponse[Any]:
        if not self._applies(request):
            return await call_next(request)
        p = await asyncio.to_thread(self._prepare_or_fail_open, request)
        if p is None:
            return await call_next(request)
        resp = await call_next(_with_body(request, p.body))
        if resp.status_code == 400:
            info = _too_long(_json_or_none(await resp.read()))
            if info is not None:
                body = await asyncio.to_thread(self._reactive, p, info, resp.http_response.request)
                await resp.close()
                resp = await call_next(_with_body(request, body))
                if resp.status_code == 400 and _too_long(_json_or_none(await resp.read())):
                    raise ContextFullError(_STILL_TOO_LONG, resp.http_response.request)
        if resp.status_code == 200:
            if request.stream:
                resp.http_response = _tapped(resp.http_response, _AsyncUsageTap(
                    resp.http_response, lambda u, i, d: self._record(p, u, i, d, True)))
            else:
                msg = await resp.parse()
                await asyncio.to_thread(self._record, p, _usage_dict(msg.usage), getattr(msg, "id", None),
                                        _diag(msg), False)
        return resp

    # -- the read_scratchpad tool ---------------------------------------------------------------------

    def read_scratchpad(self, tool_input: dict[str, Any]) -> tuple[str, bool]:
        """Answer a ``read_scratchpad`` tool call: (tool_result content, is_error)."""
        ref = tool_input.get("ref") if isinstance(tool_input, dict) else None
        for live in self.registry.sessions():
            sp = Scratchpad.for_session(live.session)
            text, is_error = sp.handle_tool_call(tool_input)
            if not is_error or not str(ref).startswith("sp_"):
                return text, is_error
        return Scratchpad(None).handle_tool_call(tool_input)


def _usage_dict(usage: Any) -> dict[str, Any]:
    if usage is None:
        return {}
    out: dict[str, Any] = usage.model_dump(exclude_none=True) if hasattr(usage, "model_dump") else dict(usage)
    return out


def _diag(msg: Any) -> dict[str, Any] | None:
    d = getattr(msg, "diagnostics", None)
    reason = getattr(d, "cache_miss_reason", None) if d is not None else None
    return reason.model_dump() if reason is not None and hasattr(reason, "model_dump") else None


# -- streaming usage, read from the decoded body --------------------------------------------------------

def _tapped(original: httpx2.Response, stream: httpx2.SyncByteStream | httpx2.AsyncByteStream) -> httpx2.Response:
    """A response standing in for ``original`` whose body is ``stream`` (already decoded), the
    way the SDK's own middlewares splice streams: the encoding headers no longer apply."""
    headers = original.headers.copy()
    for h in ("content-encoding", "content-length"):
        if h in headers:
            del headers[h]
    return httpx2.Response(status_code=original.status_code, headers=headers, stream=stream,
                           request=original.request)


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
        while True:
            cut = min((i for i in (self.buf.find(b"\n\n"), self.buf.find(b"\r\n\r\n")) if i >= 0), default=-1)
            if cut < 0:
                return
            sep = 4 if self.buf[cut:cut + 4] == b"\r\n\r\n" else 2
            frame, self.buf = self.buf[:cut], self.buf[cut + sep:]
            for line in frame.splitlines():
                if line.startswith(b"data:"):
                    self._event(line[5:].strip())

    def _event(self, data: bytes) -> None:
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
        elif kind == "message_stop":
            self.finish()

    def finish(self) -> None:
        if not self.reported and self.usage:
            self.reported = True
            self.done(dict(self.usage), self.message_id, self.diag)


class _UsageTap(httpx2.SyncByteStream):
    """The caller's stream, decoded, passed through unchanged while usage is read from it."""

    def __init__(self, original: httpx2.Response, done: Callable[..., None]) -> None:
        self.original = original
        self.parser = _SSEUsage(done)

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self.original.iter_bytes():
            self.parser.feed(chunk)
            yield chunk
        self.parser.finish()

    def close(self) -> None:
        self.parser.finish()
        self.original.close()


class _AsyncUsageTap(httpx2.AsyncByteStream):
    def __init__(self, original: httpx2.Response, done: Callable[..., None]) -> None:
        self.original = original
        self.parser = _SSEUsage(done)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.original.aiter_bytes():
            self.parser.feed(chunk)
            yield chunk
        self.parser.finish()

    async def aclose(self) -> None:
        self.parser.finish()
        await self.original.aclose()


# -- wrap ------------------------------------------------------------------------------------------------

def summarizer_factory(client: anthropic.Anthropic | anthropic.AsyncAnthropic,
                        model: str | None) -> SummarizerFactory:
    """Summaries through a plain client like the caller's (without this middleware)."""
    if isinstance(client, anthropic.AsyncAnthropic):
        sync = anthropic.Anthropic(api_key=client.api_key, auth_token=client.auth_token, base_url=str(client.base_url),
                                   timeout=client.timeout, max_retries=client.max_retries)
    else:
        sync = client

    def make(strategy_model: str | None, mode: str) -> Summarizer:
        chosen = model or strategy_model or "claude-haiku-4-5"
        return LLMSummarizer(sync, model=chosen, mode=mode, extra_headers={INTERNAL_HEADER: "1"})
    return make


def wrap(
    client: ClientT,
    *,
    store: str | os.PathLike[str] | Store | None = ".cachecompact/sessions",
    session_id: str | None = None,
    strategy: str | StrategyConfig = "cachecompact",
    config: PolicyConfig | None = None,
    window_tokens: int | None = None,
    summarizer: Summarizer | Literal["auto"] | None = "auto",
    summarizer_model: str | None = None,
    scratchpad_tool: bool = False,
    prefix_messages: int | None = None,
    diagnostics: bool = False,
    ttl: Literal["5m", "1h"] | None = None,
    prefix_ttl: Literal["5m", "1h"] | None = None,
    on_event: Callable[[Event], None] | list[Callable[[Event], None]] | None = None,
    clock: Callable[[], float] = time.time,
    store_dir: str | os.PathLike[str] | None = None,
) -> ClientT:
    """``client.with_middleware(CompactionMiddleware(...))``, validated now.

    ``summarizer="auto"`` summarises through a client like this one (without the middleware),
    with the strategy's summary model (``claude-haiku-4-5`` for ``cachecompact``) unless
    ``summarizer_model`` is given; ``None`` uses the offline extractive summarizer.
    ``scratchpad_tool=True`` adds the ``read_scratchpad`` tool to new sessions: shortened tool
    output then stays readable (answer its calls with `scratchpad_handler`).
    """
    if not isinstance(client, (anthropic.Anthropic, anthropic.AsyncAnthropic)):
        raise ConfigError(f"wrap() takes an anthropic.Anthropic or AsyncAnthropic client, got {type(client).__name__}")
    summ: Summarizer | SummarizerFactory | None
    if summarizer == "auto":
        summ = summarizer_factory(client, summarizer_model)
    elif summarizer is None or isinstance(summarizer, Summarizer):
        summ = summarizer
    else:
        raise ConfigError(f"summarizer must be 'auto', None or a Summarizer, got {summarizer!r}")
    mw = CompactionMiddleware(store, session_id=session_id, strategy=strategy, config=config,
                              window_tokens=window_tokens, summarizer=summ, prefix_messages=prefix_messages,
                              scratchpad_tool=scratchpad_tool, diagnostics=diagnostics, ttl=ttl, prefix_ttl=prefix_ttl,
                              on_event=on_event, clock=clock, store_dir=store_dir)
    return client.with_middleware(mw)


def _middleware_of(client: anthropic.Anthropic | anthropic.AsyncAnthropic) -> CompactionMiddleware:
    for m in client.middleware:
        if isinstance(m, CompactionMiddleware):
            return m
    raise ConfigError("this client is not wrapped with cachecompact.wrap()")


def wrapped_sessions(client: anthropic.Anthropic | anthropic.AsyncAnthropic) -> list[Session]:
    """The sessions a wrapped client has in memory (for reports, verification and tests)."""
    return _middleware_of(client).sessions()


def scratchpad_handler(client: anthropic.Anthropic | anthropic.AsyncAnthropic
                       ) -> Callable[[dict[str, Any]], tuple[str, bool]]:
    """For the agent loop: answers ``read_scratchpad`` tool calls of a wrapped client's sessions."""
    return _middleware_of(client).read_scratchpad
