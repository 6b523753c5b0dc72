"""What one proxy app holds (config, observer, engine, workers); compact mode's engine calls,
made with the caller's credentials held for its summaries; and the analysis of each exchange
after its response, on one queue-fed thread so a session's records stay in order."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import queue
import textwrap
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec
import xxhash
from aiohttp import web

from ...base.errors import ConfigError, InvalidSessionIdError
from ...base.headers import CREDENTIALS
from ...base.http import json_or_none
from ...base.pricing import DEFAULT_SUMMARY_MODEL
from ...base.values import Answer, Refuse, Send, SummaryMode
from ...base.wire import bytes_as_is
from ...engine.identity import session_hint
from ...store import Store, open_writable_store
from ..httpserver import api_error
from ._clients import lowers_reserve
from ._config import ProxyConfig
from ._observe import Observer
from ._tap import ResponseTap
from ._upstream import upstream_base

if TYPE_CHECKING:  # observe mode never loads the compaction runtime: compact mode imports it when built
    from ...cache.forensics import Finding
    from ...engine.request_cycle import CompactionEngine, Prepared, RequestExchange
    from ...history.session import Session
    from ..idle_scheduler import IdleScheduler
    from ._held_credentials import HeldCredentials

__all__ = ["STATE", "Exchange", "ProxyState", "analyse", "spent"]

log = logging.getLogger("cachecompact")

ANALYSIS_BATCH = 64  # exchanges the analysis thread takes at once from its queue (`ProxyState._analyse`)

# compact mode: what was forwarded unchanged (failed open, or not a request the engine edits) is
# recorded under ``passthrough-<name>``, never in a family of the engine's sessions
PASSTHROUGH_PREFIX = "passthrough-"


@dataclass(slots=True)
class Exchange:
    """One ``POST /v1/messages`` and its response, queued for analysis (`analyse`)."""

    raw: bytes  # the request body as the client sent it
    headers: dict[str, str]  # its headers, lower-cased
    prepared: Prepared | None  # compact mode: what the engine sent instead
    status: int  # the upstream's status
    tap: ResponseTap  # the response's bytes, or the usage read from them
    now: float  # the request's time (its clock header, or the wall clock)
    timing: dict[str, float]  # upstream, first-byte and total milliseconds
    stream: bool  # the response was a stream
    recorded: list[Finding | None] = field(default_factory=list)  # the engine recorded it before the client's last byte
    exchange: RequestExchange | None = None  # compact mode: the engine's steps, which record the answer
    sent: bytes = b""  # compact mode: the bytes of ``prepared.body`` as they went upstream


class ProxyState:
    """Everything one proxy app holds: config, observer, engine, workers."""

    def __init__(self, cfg: ProxyConfig) -> None:
        cfg.check()
        self.cfg = cfg
        self.store: Store | None = open_writable_store(cfg.store)  # a bad path fails now, not per request
        share = cfg.max_memory_mb // 2 if cfg.mode == "compact" else cfg.max_memory_mb
        self.observer = Observer(store=self.store, keep_bodies=cfg.keep_bodies, max_bytes=share << 20,
                                 id_prefix=PASSTHROUGH_PREFIX if cfg.mode == "compact" else "")
        self.creds = threading.local()
        self.clock: Callable[[], float] = cfg.clock or time.time
        self.engine: CompactionEngine | None = None
        self.idle: IdleScheduler | None = None
        self.held: HeldCredentials | None = None
        if cfg.mode == "compact":
            from ...compaction.summarize.caller_key import CallerKeySummarizer
            from ...engine.options import EngineOptions
            from ...engine.request_cycle import CompactionEngine

            creds = self.creds
            # the pool's base URL: a trailing /v1 is not doubled by the SDK's own /v1/messages
            upstream, chosen, simulated = upstream_base(cfg.upstream), cfg.summary_model, cfg.clock

            def summarizer(model: str | None, mode: SummaryMode) -> Any:
                return CallerKeySummarizer(upstream, chosen or model or DEFAULT_SUMMARY_MODEL, mode, creds,
                                           clock=simulated)

            clash = sorted({"strategy", "window_tokens", "clock", "max_memory_mb"} & set(cfg.engine_settings()))
            if clash:
                raise ConfigError(f"engine_options must not set {', '.join(clash)}: the proxy's strategy, "
                                  "window_tokens, clock and max_memory_mb (--strategy, --window, --max-memory) "
                                  "set them")
            given = cfg.engine_options
            if isinstance(given, EngineOptions):  # checked again with the proxy's own fields: fails before listening
                options = dataclasses.replace(given, strategy=cfg.strategy, window_tokens=cfg.window_tokens,
                                              clock=self.clock, max_memory_mb=share)
            else:
                options = EngineOptions.of(None, {"strategy": cfg.strategy, "window_tokens": cfg.window_tokens,
                                                  "clock": self.clock, "max_memory_mb": share, **(given or {})})
            self.engine = CompactionEngine(self.store, options, summarizer=summarizer)
            # what its summary calls cost reaches the dashboard and /metrics as `report` reads it from the store
            observer = self.observer
            observer.prices = options.prices
            self.engine.step_events = deque(maxlen=100_000)  # drained by `spent` after each exchange
            # a request's transcript records are made durable while it is upstream, its answer's record
            # after the client has it (`flush`), not before each of them goes on (issue 57)
            self.engine.defer_fsync = True
            if cfg.idle_compaction:
                from ..idle_scheduler import IdleScheduler, clock_of
                from ._held_credentials import HeldCredentials

                self.held = HeldCredentials(self.creds)
                self.idle = IdleScheduler(self.engine, clock_of(self.clock), keeper=self.held)
        # analysis after the response: one thread fed by a queue (cheaper per request than an
        # executor's futures), so the records of a session stay in order
        self.queue: queue.SimpleQueue[tuple[int, Exchange] | None] = queue.SimpleQueue()
        # observe mode under overload: forwarding never waits for analysis, and the bodies waiting
        # for it are bounded; past the bound a request is forwarded but not analysed (counted)
        self.max_pending_bytes = 256 << 20
        self._pending_bytes = 0
        self.dropped = 0
        # compact mode's steps and their syncs (`flush`). More threads let more of them wait on the disk
        # at once (16: +30% requests/s on the bench), but the proxy then held 3x the memory (887 MB
        # against 269 MB after the bench's 64 sessions; a pool of 8 for the syncs alone, 871 MB): 4
        self.compute = ThreadPoolExecutor(max_workers=4, thread_name_prefix="cachecompact-proxy-compact")
        self._pending = 0
        self._plock = threading.Lock()
        self.worker = threading.Thread(target=self._analyse, name="cachecompact-proxy-analysis", daemon=True)
        self.worker.start()

    @contextlib.contextmanager
    def holding(self, headers: Mapping[str, str]) -> Iterator[None]:
        """The request's credentials (and its ``anthropic-beta``) in ``self.creds`` for the
        duration of the block, on this thread only, for the summaries made in it
        (`compaction.summarize.caller_key`); empty before and after, and never stored."""
        self.creds.headers = {k: v for k, v in headers.items() if k in (*CREDENTIALS, "anthropic-beta")}
        try:
            yield
        finally:
            self.creds.headers = {}

    def start(self, raw: bytes, headers: dict[str, str], now: float
              ) -> tuple[RequestExchange, Send | Refuse | None, bytes] | web.Response | None:
        """Compact mode, in a worker thread: the engine's exchange for this request, its first
        step (`RequestExchange.start`) and, for a `Send`, its body's bytes (`encoded`); None (not
        a body the engine reads: forward it unchanged), or an error response for the caller."""
        assert self.engine is not None
        body = json_or_none(raw)
        if not isinstance(body, dict):
            return None
        try:
            hint = session_hint(headers, body)
        except InvalidSessionIdError as err:
            return api_error(400, str(err))
        ex = self.engine.exchange(body, explicit=hint, now=now, raw=raw,
                                  client_lowers=lowers_reserve(headers.get("user-agent")))
        with self.holding(headers):
            step = ex.start()
        self.flush(ex)
        return ex, step, encoded(step)

    def received(self, ex: RequestExchange, status: int, payload: Any, headers: dict[str, str]
                 ) -> tuple[Send | Refuse | None, bytes]:
        """Compact mode, in a worker thread: the exchange's next step after a response
        (`RequestExchange.received`), with the caller's credentials held for its summaries, and
        for a `Send` its body's bytes (`encoded`)."""
        with self.holding(headers):
            step = ex.received(status, payload)
        return step, encoded(step)

    def record(self, ex: RequestExchange, answer: Answer, headers: Mapping[str, str]) -> Finding | None:
        """Compact mode, in a worker thread: the exchange records the answer; with idle compaction,
        the session's credential is held until its cache expires (`held_credentials`), or
        dropped when no idle decision can follow (the response called a tool)."""
        assert self.engine is not None and ex.prepared is not None
        finding = ex.answered(answer)
        self.flush(ex)
        if self.idle is not None and self.held is not None:
            sid = ex.prepared.live.sid
            until = self.engine.credential_until(sid)
            if until is not None:
                self.held.hold(sid, headers, until)
            else:
                self.held.forget(sid)
            self.idle.poke()
        return finding

    def flush(self, ex: RequestExchange) -> None:
        """Make the records the exchange's step wrote durable (`Session.flush`) in another worker,
        while this one hands the step back (`CompactionEngine.defer_fsync`)."""
        if ex.prepared is not None:
            self.compute.submit(_flush, ex.prepared.live.session)

    @property
    def pending(self) -> int:
        """Requests whose records are not written yet."""
        return self._pending

    def begin(self) -> None:
        with self._plock:
            self._pending += 1

    def submit(self, ex: Exchange) -> None:
        """Queue one response's analysis. Its request body (and the one sent instead) and the
        response bytes its tap holds until the analysis reads them count toward the bound;
        compact mode's (``ex.prepared``) is always recorded."""
        size = len(ex.raw) + len(ex.sent) + ex.tap.size
        with self._plock:
            if ex.prepared is None and self._pending_bytes + size > self.max_pending_bytes:
                self._pending -= 1
                self.dropped += 1
                if self.dropped == 1 or self.dropped % 1000 == 0:
                    log.warning("cachecompact proxy: analysis is behind; %d requests forwarded without analysis",
                                self.dropped)
                return
            self._pending_bytes += size
        self.queue.put((size, ex))

    def _analyse(self) -> None:
        while True:
            item = self.queue.get()
            if item is None:
                return
            batch, last = [item], False
            while len(batch) < ANALYSIS_BATCH:  # what is queued already: one batch, its records synced together
                try:
                    more = self.queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    last = True
                    break
                batch.append(more)
            try:
                with self.observer.batch():
                    for _, ex in batch:
                        analyse(self, ex)
            finally:
                with self._plock:
                    self._pending -= len(batch)
                    self._pending_bytes -= sum(size for size, _ in batch)
            if last:
                return

    def close(self) -> None:
        if self.idle is not None:
            self.idle.stop()
        self.queue.put(None)
        self.worker.join(30)
        if self.engine is not None:  # the flushes still queued may be cancelled below: every session's now
            for live in self.engine.registry.sessions():
                _flush(live.session)
        self.compute.shutdown(wait=False, cancel_futures=True)


STATE: web.AppKey[ProxyState] = web.AppKey("state")


def _flush(session: Session) -> None:
    try:
        session.flush()
    except Exception:  # the records stay written; the next plain append syncs them, or this is said
        log.exception("cachecompact proxy: could not sync session %s to disk", session.session_id)


def encoded(step: Send | Refuse | None) -> bytes:
    """The bytes a `Send` puts on the wire (`bytes_as_is` of its body), made in the worker thread
    beside the step, not on the event loop; empty for any other step."""
    return bytes_as_is(step.body) if isinstance(step, Send) else b""


class _Messages(msgspec.Struct):
    """A body's messages as its own bytes, one span each."""

    messages: list[msgspec.Raw]


def sent_keys(sent: bytes, body: dict[str, Any]) -> list[bytes] | None:
    """The memo key of each message of ``body`` (`request_from_body`'s ``keys``): the hash of its
    bytes as they were sent (``sent``, the encoding of ``body``), so the analysis of a request
    hashes the messages' bytes instead of encoding each message again. Equal bytes are an equal
    message, markers included. None when the bytes do not split into ``body``'s messages."""
    msgs = body.get("messages")
    if not sent or not isinstance(msgs, list):
        return None
    try:
        spans = msgspec.json.decode(sent, type=_Messages).messages
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if len(spans) != len(msgs):
        return None
    return [xxhash.xxh3_128_digest(x) for x in spans]


def _clip(reason: str, width: int = 200) -> str:
    """A compaction's reason as the dashboard lists it: whole up to ``width`` characters, else cut
    at a word boundary with `` ...`` (it was cut mid-word)."""
    return reason if len(reason) <= width else textwrap.shorten(reason, width, placeholder=" ...")


def spent(state: ProxyState) -> None:
    """What the engine's steps spent on summaries since the last call, into the dashboard and
    /metrics (`Observer.spent`): read from the engine as data (`CompactionEngine.step_events`)."""
    if state.engine is None:
        return
    for sid, link, events in state.engine.drain_step_events():
        try:
            state.observer.spent(sid, events, link)
        except Exception:  # never let analysis take the proxy down
            log.exception("cachecompact proxy: could not count a summary's cost")


def analyse(state: ProxyState, ex: Exchange) -> None:
    """After the response, in the analysis thread: forensics and the session record (compact
    mode: unless the engine recorded it already, see `Handlers.messages`), then what the steps
    spent on summaries (`spent`)."""
    try:
        _analyse_one(state, ex)
    finally:
        spent(state)


def _analyse_one(state: ProxyState, ex: Exchange) -> None:
    raw, headers, p, status, now, timing, stream = ex.raw, ex.headers, ex.prepared, ex.status, ex.now, ex.timing, \
        ex.stream
    try:
        got = ex.tap.finish()  # here, not on the request path
        if p is None or state.engine is None:
            state.observer.observe(raw, headers, status=status, usage=got.usage if got else None,
                                   message_id=got.message_id if got else None,
                                   cache_miss_reason=got.cache_miss_reason if got else None,
                                   now=now, timing=timing, stream=stream)
            return
        finding = ex.recorded[0] if ex.recorded else (
            ex.exchange.answered(got) if ex.exchange is not None and got is not None and got.usage else None)
        if not ex.recorded:
            _flush(p.live.session)  # recorded here, if at all: not by `ProxyState.record`, which syncs it
        sess = p.live.session
        comps = [{"seq": e.seq, "level": e.level, "kind": e.kind, "start": e.start, "end": e.end,
                  "tokens_before": e.tokens_before, "tokens_after": e.tokens_after, "reason": _clip(e.reason or "")}
                 for e in sess.ledger.entries]
        plan = p.render.thinking
        thinking = {"left_out": sorted(plan.strip), "left_out_tokens": p.render.left_out_tokens,
                    "drop_block": plan.kept_invalid} if (plan.strip or plan.drop_block) else None
        state.observer.note(sess.session_id, usage=got.usage if got else None, finding=finding, model=p.model,
                            now=now, status=status, timing=timing, stream=stream, compactions=comps,
                            link=sess.link, raw=raw, sent=p.body, thinking=thinking,
                            sent_keys=sent_keys(ex.sent, p.body))
    except Exception:  # never let analysis take the proxy down
        log.exception("cachecompact proxy: could not record a request")
