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
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any, Literal, TypeVar

import anthropic
import httpx2
from anthropic import APIRequest, APIResponse, AsyncAPIResponse, AsyncCallNext, CallNext, Middleware

from ..base.errors import ConfigError
from ..base.events import Event
from ..base.headers import CLOCK_HEADER, INTERNAL_HEADER, SESSION_HEADER
from ..base.http import SSEUsage, clock_from, json_or_none, with_betas
from ..base.pricing import DEFAULT_SUMMARY_MODEL, OwnPrices
from ..base.values import Answer, IdleDecision, Refuse, SummaryMode
from ..compaction.policy import PolicyConfig
from ..compaction.strategy import Strategy, StrategyConfig
from ..compaction.summarize.llm import LLMSummarizer, Summarizer
from ..engine.options import EngineOptions
from ..engine.request_cycle import CompactionEngine, RequestExchange, SummarizerFactory
from ..history.session import Session
from ..store import Store
from .idle_scheduler import IdleScheduler, clock_of
from .sdk_errors import ContextFullError

__all__ = ["SESSION_HEADER", "CompactionMiddleware", "compact_idle", "scratchpad_handler", "summarizer_factory",
           "wrap", "wrapped_sessions"]

DEFAULT_STORE = ".cachecompact/sessions"  # where wrap() keeps sessions unless told otherwise

log = logging.getLogger("cachecompact")

ClientT = TypeVar("ClientT", anthropic.Anthropic, anthropic.AsyncAnthropic)


def _with_body(request: APIRequest, body: dict[str, Any], betas: tuple[str, ...] = ()) -> APIRequest:
    """``request`` with a new body (and the strategy's beta headers): a shallow copy of its
    options (``request.copy`` would deep-copy the caller's whole history first, only to throw
    it away)."""
    opts = request.options.model_copy()
    opts.json_data = body
    if isinstance(opts.headers, dict):
        opts.headers = dict(opts.headers)
    if betas:
        hdrs = dict(opts.headers) if isinstance(opts.headers, dict) else {}
        hdrs["anthropic-beta"] = with_betas(hdrs.get("anthropic-beta"), betas)
        opts.headers = hdrs
    return APIRequest(options=opts, cast_to=request.cast_to, stream=request.stream, stream_cls=request.stream_cls,
                      retries_taken=request.retries_taken)


class CompactionMiddleware(Middleware):
    """Cache-aware compaction for every ``messages.create`` / ``messages.stream`` call: the SDK
    adapter of `CompactionEngine`. Its settings are an `EngineOptions` (``options=``), or that
    object's fields as keywords; `wrap()` builds it and validates the client too."""

    def __init__(self, store: str | os.PathLike[str] | Store | None = DEFAULT_STORE, *,
                 options: EngineOptions | None = None, summarizer: Summarizer | SummarizerFactory | None = None,
                 store_dir: str | os.PathLike[str] | None = None, idle_compaction: bool = False,
                 **settings: Any) -> None:
        """``options`` (an `EngineOptions`), or its settings as keywords (``strategy=``, ``ttl=``, ...).
        ``idle_compaction`` runs an `IdleScheduler` on the engine's clock."""
        if store_dir is not None and store != DEFAULT_STORE:
            raise ConfigError("give store= or store_dir= (its older name), not both")
        self.engine = CompactionEngine(store_dir if store_dir is not None else store,
                                       EngineOptions.of(options, settings), summarizer=summarizer)
        self.events = self.engine.events
        self.window_tokens = self.engine.window_tokens
        self.idle = IdleScheduler(self.engine, clock_of(self.engine.clock)) if idle_compaction else None

    @property
    def overhead_s(self) -> float:
        return self.engine.overhead_s

    def sessions(self) -> list[Session]:
        """The sessions this middleware has in memory."""
        return self.engine.sessions()

    def strategies(self) -> list[Strategy]:
        return self.engine.strategies()

    def read_scratchpad(self, tool_input: dict[str, Any], messages: list[Any] | None = None) -> tuple[str, bool]:
        """`CompactionEngine.read_scratchpad`: from the caller's own conversation only."""
        return self.engine.read_scratchpad(tool_input, messages)

    @staticmethod
    def _applies(request: APIRequest) -> bool:
        url = request.url.split("?", 1)[0]
        headers = request.headers if isinstance(request.headers, dict) else {}
        return (request.method.lower() == "post" and url == "/v1/messages" and isinstance(request.json, dict)
                and INTERNAL_HEADER not in headers)

    def _exchange(self, request: APIRequest) -> RequestExchange:
        """The engine's exchange for this request (`RequestExchange`): its steps are this
        adapter's sequence, whose I/O the two ``handle`` methods do."""
        headers = request.headers if isinstance(request.headers, dict) else {}
        explicit = headers.get(SESSION_HEADER)
        body = request.json
        assert isinstance(body, dict)
        return self.engine.exchange(body, explicit=explicit if isinstance(explicit, str) else None,
                                    now=clock_from(headers, CLOCK_HEADER, self.engine.clock),
                                    retry=bool(request.retries_taken))

    def _record(self, ex: RequestExchange, answer: Answer) -> None:
        ex.answered(answer)
        if self.idle is not None:
            self.idle.poke()  # the session's cache now expires later: the scheduler looks again

    # -- sync client --------------------------------------------------------------------------------

    def handle(self, request: APIRequest, call_next: CallNext) -> APIResponse[Any]:
        if not self._applies(request):
            return call_next(request)
        ex = self._exchange(request)
        step = ex.start()
        if step is None:
            return call_next(request)
        sent: httpx2.Request | None = None
        while not isinstance(step, Refuse):
            resp = call_next(_with_body(request, step.body, step.betas))
            sent = resp.http_response.request
            try:
                step = ex.received(resp.status_code, json_or_none(resp.read()) if ex.reads(resp.status_code) else None)
            except BaseException:
                resp.close()  # the caller never sees it: give its connection back
                raise
            if step is None:
                break
            resp.close()
        if isinstance(step, Refuse):
            raise ContextFullError(step.message, sent)
        if resp.status_code == 200:
            if request.stream:
                resp.http_response = _tapped(resp.http_response, _UsageTap(
                    resp.http_response, lambda answer: self._record(ex, answer)))
            else:
                msg = resp.parse()
                self._record(ex, _answer(msg))
        return resp

    # -- async client ---------------------------------------------------------------------------------

    async def handle_async(self, request: APIRequest, call_next: AsyncCallNext) -> AsyncAPIResponse[Any]:
        if not self._applies(request):
            return await call_next(request)
        ex = self._exchange(request)
        step = await asyncio.to_thread(ex.start)
        if step is None:
            return await call_next(request)
        sent: httpx2.Request | None = None
        while not isinstance(step, Refuse):
            resp = await call_next(_with_body(request, step.body, step.betas))
            sent = resp.http_response.request
            try:
                payload = json_or_none(await resp.read()) if ex.reads(resp.status_code) else None
                step = await asyncio.to_thread(ex.received, resp.status_code, payload)
            except BaseException:
                await resp.close()  # the caller never sees it: give its connection back
                raise
            if step is None:
                break
            await resp.close()
        if isinstance(step, Refuse):
            raise ContextFullError(step.message, sent)
        if resp.status_code == 200:
            if request.stream:
                resp.http_response = _tapped(resp.http_response, _AsyncUsageTap(
                    resp.http_response, lambda answer: self._record(ex, answer)))
            else:
                msg = await resp.parse()
                await asyncio.to_thread(self._record, ex, _answer(msg))
        return resp


def _answer(msg: Any) -> Answer:
    """A parsed (not streamed) message as the engine records it."""
    return Answer(_usage_dict(msg.usage), getattr(msg, "id", None), _diag(msg), stream=False,
                  stop_reason=getattr(msg, "stop_reason", None))


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


class _Reading:
    """What both taps share: the parser, and the middleware's ``done``, called once with the
    answer when the parser returns it complete."""

    def __init__(self, original: httpx2.Response, done: Callable[[Answer], None]) -> None:
        self.original = original
        self.parser = SSEUsage()
        self.done = done

    def _fed(self, got: Answer | None) -> None:
        if got is not None:
            self.done(got)


class _UsageTap(_Reading, httpx2.SyncByteStream):
    """The caller's stream, decoded, passed through unchanged while usage is read from it."""

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self.original.iter_bytes():
            self._fed(self.parser.feed(chunk))
            yield chunk
        self._fed(self.parser.finish())

    def close(self) -> None:
        self._fed(self.parser.finish())
        self.original.close()


class _AsyncUsageTap(_Reading, httpx2.AsyncByteStream):

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.original.aiter_bytes():
            self._fed(self.parser.feed(chunk))
            yield chunk
        self._fed(self.parser.finish())

    async def aclose(self) -> None:
        self._fed(self.parser.finish())
        await self.original.aclose()


# -- wrap ------------------------------------------------------------------------------------------------

def summarizer_factory(client: anthropic.Anthropic | anthropic.AsyncAnthropic,
                        model: str | None, prices: OwnPrices | None = None, *,
                        clock: Callable[[], float] | None = None) -> SummarizerFactory:
    """Summaries through a plain client like the caller's (without this middleware), priced with
    the client's own entries first (``prices``); ``clock``: a session clock that is not the wall's
    (simulated time, a replay), whose time they carry (`LLMSummarizer.clock`)."""
    if isinstance(client, anthropic.AsyncAnthropic):
        sync = anthropic.Anthropic(api_key=client.api_key, auth_token=client.auth_token, base_url=str(client.base_url),
                                   timeout=client.timeout, max_retries=client.max_retries)
    else:
        sync = client

    def make(strategy_model: str | None, mode: SummaryMode) -> Summarizer:
        chosen = model or strategy_model or DEFAULT_SUMMARY_MODEL
        return LLMSummarizer(sync, model=chosen, mode=mode, extra_headers={INTERNAL_HEADER: "1"}, prices=prices,
                             clock=clock)
    return make


def wrap(
    client: ClientT,
    *,
    store: str | os.PathLike[str] | Store | None = DEFAULT_STORE,
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
    pricing: Mapping[str, Mapping[str, Any]] | None = None,
    recent_tokens: int | None = None,
    lookback_coverage: float | None = None,
    idle_compaction: bool = False,
) -> ClientT:
    """``client.with_middleware(CompactionMiddleware(...))``, validated now.

    Every request's model must be an id of the price table (or a dated id of one): another name
    (``claude-sonnet-4.6``) raises `UnknownModelError` naming the nearest ids, before anything
    is sent. ``lookback_coverage`` is the one knob for cost against recall: the newest history kept
    verbatim is learnt, per session, to cover that share of the agent's own look-backs (default
    0.93; less is cheaper and forgets sooner, docs/policy.md); ``recent_tokens`` fixes it in
    tokens instead.
    ``pricing={"my-model": {"input": 3, "output": 15}}`` prices an unlisted model on
    purpose ($ per MTok; `pricing.custom` says what else may be given).

    ``summarizer="auto"`` summarises through a client like this one (without the middleware),
    with the strategy's summary model (``claude-haiku-5-5`` for ``cachecompact``) unless
    ``summarizer_model`` is given; ``None`` uses the offline extractive summarizer.
    ``scratchpad_tool=True`` adds the ``read_scratchpad`` tool to new sessions: shortened tool
    output then stays readable (answer its calls with `scratchpad_handler`).
    """
    if not isinstance(client, (anthropic.Anthropic, anthropic.AsyncAnthropic)):
        raise ConfigError(f"wrap() takes an anthropic.Anthropic or AsyncAnthropic client, got {type(client).__name__}")
    if any(isinstance(m, CompactionMiddleware) for m in client.middleware):
        raise ConfigError("this client is already wrapped with cachecompact.wrap(); wrap the original client once")
    from ..base.pricing import get_model, own_prices

    prices = own_prices(pricing)  # this client's alone: the process-wide table is left as it is
    if summarizer_model is not None:
        if summarizer != "auto":
            raise ConfigError("summarizer_model= applies only to summarizer='auto' (the default)")

        # checked now, not at the first summary: an id of no known family, or a bare family name
        # ("haiku") that prices fine but that the API would refuse
        if not isinstance(summarizer_model, str) or "claude-" not in summarizer_model.lower():
            raise ConfigError(f"summarizer_model={summarizer_model!r} is not a Claude model id (for example "
                              "'claude-haiku-5-5')")
        get_model(summarizer_model, prices)
    summ: Summarizer | SummarizerFactory | None
    if summarizer == "auto":
        summ = summarizer_factory(client, summarizer_model, prices, clock=None if clock is time.time else clock)
    elif summarizer is None or isinstance(summarizer, Summarizer):
        summ = summarizer
    else:
        raise ConfigError(f"summarizer must be 'auto', None or a Summarizer, got {summarizer!r}")
    options = EngineOptions(session_id=session_id, strategy=strategy, config=config, window_tokens=window_tokens,
                            prefix_messages=prefix_messages, scratchpad_tool=scratchpad_tool, diagnostics=diagnostics,
                            ttl=ttl, prefix_ttl=prefix_ttl, on_event=on_event, clock=clock, strict_models=True,
                            recent_tokens=recent_tokens, lookback_coverage=lookback_coverage, prices=prices or None)
    mw = CompactionMiddleware(store, options=options, summarizer=summ, store_dir=store_dir,
                              idle_compaction=idle_compaction)
    wrapped = client.with_middleware(mw)
    if mw.idle is not None:
        mw.idle.owned_by(wrapped)  # stops with the client
    return wrapped


def _middleware_of(client: anthropic.Anthropic | anthropic.AsyncAnthropic) -> CompactionMiddleware:
    if not isinstance(client, (anthropic.Anthropic, anthropic.AsyncAnthropic)):
        raise ConfigError(f"expected a client returned by cachecompact.wrap(), got {type(client).__name__}")
    for m in client.middleware:
        if isinstance(m, CompactionMiddleware):
            return m
    raise ConfigError("this client is not wrapped with cachecompact.wrap()")


def wrapped_sessions(client: anthropic.Anthropic | anthropic.AsyncAnthropic) -> list[Session]:
    """The sessions a wrapped client has in memory (for reports, verification and tests)."""
    return _middleware_of(client).sessions()


def compact_idle(client: anthropic.Anthropic | anthropic.AsyncAnthropic, session_id: str | None = None, *,
                 away_s: float | None = None) -> list[IdleDecision]:
    """For an agent about to wait for a person: summarize its quiet sessions now, on the warm
    cache, where that pays (docs/policy.md, *While the session is quiet*). ``away_s``: how long it
    expects to wait, in seconds, if it knows (else the session's own gaps tell). The edits take
    effect with the next request. Blocks for the summary call; returns one decision per session."""
    if away_s is not None and (isinstance(away_s, bool) or not isinstance(away_s, (int, float)) or not away_s >= 0):
        raise ConfigError(f"compact_idle: away_s must be a number of seconds >= 0, got {away_s!r}")
    return _middleware_of(client).engine.compact_idle(session_id, away_s=away_s)


def scratchpad_handler(client: anthropic.Anthropic | anthropic.AsyncAnthropic
                       ) -> Callable[..., tuple[str, bool]]:
    """For the agent loop: answers ``read_scratchpad`` tool calls, ``handler(call.input, messages)``,
    from the caller's own conversation only: the session whose whole history ``messages`` (the
    agent's, as it sends them) starts with, its segments and sub-agents. Without ``messages``,
    the sessions the wrapped client has served in this process (and its ``session_id``'s, if it
    names one); a reference of any other session answers as a missing one."""
    return _middleware_of(client).read_scratchpad
