"""The transport-independent core of `wrap()` and the proxy's compact mode.

`CompactionEngine` takes a Messages API request body (a dict), finds its session, runs the
strategy and returns the body to send; after the response it records usage and runs the
cache forensics. The SDK middleware (`middleware.py`) and the proxy (`proxy/`) are thin
adapters around it, so sessions, ledger, policy and forensics exist once.

`RequestExchange` is the one sequence of a request, without I/O (httpx's sans-IO way):
prepare, send, on a prompt-too-long 400 compact and send once more, record. It says what to
send (`Send`), when to answer the caller instead (`Refuse`), and takes back what came; the
sync middleware, the async middleware and the proxy each only do its I/O (issue 49: the
sequence was written three times, and each fix to it had to be made three times).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

from ..base.errors import (
    CacheCompactError,
    ForeignHistoryError,
    InvalidEditError,
    InvalidSessionIdError,
    MalformedMessageError,
    SessionNotFoundError,
    StagedEditsConflictError,
    UnconfirmedEntryError,
    UnknownModelError,
)
from ..base.events import Event, EventBus
from ..base.http import too_long, too_long_message
from ..base.pricing import PRESERVED_THINKING, canonical_id, get_model, priced
from ..base.refs import blob_ref
from ..base.values import PREFIX_SETTING, TTL, Answer, ContextFull, IdleDecision, Refuse, RequestRecord, Send
from ..cache.cache_keys import NOT_CACHEABLE, check_marker, check_marker_order
from ..cache.forensics import Finding, Layout, Snapshot, params_key, snapshot_from_sim
from ..cache.simulator import request_from_body
from ..compaction.idle import DECIDE_BEFORE_S
from ..compaction.policy import PolicyConfig
from ..compaction.strategy import CompactsIdle, KnowsClient, Plan, StatefulStrategy, Strategy, StrategyConfig
from ..compaction.summarize.llm import Summarizer
from ..history.ledger import LedgerEntry
from ..history.render import RenderResult
from ..history.scratchpad import REF_RE, Scratchpad
from ..history.session import Session
from ..history.thinking import BINDING_BETA, DROP_BLOCK
from ..store import Store, check_session_id, open_writable_store
from ._registry import Live, LiveMaker, SessionRegistry, SummarizerFactory
from .identity import RequestHistory, family_key, in_family
from .options import EngineOptions

_T = TypeVar("_T")

__all__ = ["STILL_TOO_LONG", "CompactionEngine", "ContextFull", "Prepared", "Refuse", "RequestExchange", "Retry",
           "Send", "SummarizerFactory"]

log = logging.getLogger("cachecompact")

STILL_TOO_LONG = "context is full: still too long after reactive compaction; start a new session"
TURN_ENDS = frozenset({"end_turn", "stop_sequence"})  # stop reasons after which a person speaks next


def still_too_long(info: tuple[int, int, int]) -> str:
    """The refusal after the reactive retry came back too long too: the API's numbers, in its
    words (`too_long_message`: a client that compacts on them, Claude Code, still can)."""
    return too_long_message(info[0], info[1], STILL_TOO_LONG)


def _snapshot_from_render(r: RenderResult, *, time: float, model: str, params: dict[str, Any]) -> Snapshot:
    """A snapshot of a request cachecompact rendered, for forensics: the engine copies the render's
    arrays and hands over where each block came from, as data, so the cache layer never calls
    back into the history layer."""
    default: list[TTL] = ["5m"] * len(r.breakpoints)
    bps = list(zip(r.breakpoints, r.breakpoint_ttls or default, strict=True))
    blocks = r.flat_blocks
    tools = [blocks[k].key for k in range(r.n_tools)]
    chain, cum, pos = r.cache_arrays()
    layout = Layout(r.n_tools, r.n_system, starts=r.message_starts, n_messages=r.n_messages, blocks=blocks,
                    edit_starts=r.edit_starts)
    return Snapshot(time=time, model=model, params=params, chain=chain, cum=cum, pos=pos, breakpoints=bps,
                    layout=layout, tool_keys=tools, n_entries=r.n_entries)


@dataclass(frozen=True, slots=True)
class Retry:
    """What an adapter does after the API refused a prepared request as too long
    (`CompactionEngine.after_too_long`): send ``body`` once more, or, when it is None, answer
    with ``message`` (the context is full)."""

    body: dict[str, Any] | None
    message: str


@dataclass(slots=True)
class Prepared:
    """A request made ready to send, and what is needed to record its response."""

    live: Live
    body: dict[str, Any]
    render: RenderResult
    snapshot: Callable[[], Snapshot]
    now: float
    model: str
    max_tokens: int
    params: dict[str, Any]
    fingerprint: bytes
    betas: tuple[str, ...] = ()  # beta headers the strategy's body needs (added to anthropic-beta)
    ids: list[bytes] = field(default_factory=list)  # the identity of each message the caller sent


class RequestExchange:
    """One request through the engine, as steps and no I/O. The adapter calls `start`; while it
    gets a `Send` it sends that body and gives `received` the status (and, where `reads` says so,
    the response's JSON); `None` means the response it holds is the caller's (from `start`: send
    the caller's own request unchanged); a `Refuse` ends the exchange with the message. Once the
    caller's response is complete, `answered` records it. Each step may run in a worker thread;
    a step is never run twice at once. The too-long retry happens at most once: a second
    prompt-too-long answer is `Refuse(still_too_long(...))`, in the API's words."""

    def __init__(self, engine: CompactionEngine, body: dict[str, Any], *, explicit: str | None, now: float,
                 retry: bool = False, raw: bytes | None = None, client_lowers: bool | None = None) -> None:
        self.engine = engine
        self.body, self.explicit, self.now, self.retry, self.raw = body, explicit, now, retry, raw
        self.client_lowers = client_lowers  # what the adapter knows of its client (`KnowsClient`)
        self.prepared: Prepared | None = None  # after `start`: what the engine made of the request
        self._resent = False

    def start(self) -> Send | Refuse | None:
        """Prepare the request (`CompactionEngine.prepare_or_fail_open`): the body to send, a
        refusal (the context is full before anything is sent), or None (send it unchanged)."""
        p = self.engine.prepare_or_fail_open(self.body, explicit=self.explicit, now=self.now, retry=self.retry,
                                             raw=self.raw, client_lowers=self.client_lowers)
        if isinstance(p, ContextFull):
            return Refuse(p.message, p.session_id)
        self.prepared = p
        return None if p is None else Send(p.body, p.betas)

    @staticmethod
    def reads(status: int) -> bool:
        """Whether `received` needs the response's JSON for this status (a 400's, to tell a
        prompt-too-long error); any other response is passed on unread."""
        return status == 400

    def received(self, status: int, payload: Any = None) -> Send | Refuse | None:
        """What came back for the last `Send`: None when the response is the caller's (relay it),
        else what to do instead of relaying it (`CompactionEngine.after_too_long`)."""
        assert self.prepared is not None, "received() before a Send"
        if status != 400:
            return None
        if self._resent:
            info = too_long(payload)
            if info is None or (info[2] and info[0] < info[1]):
                return None  # not too long, or only max_tokens is: the API's own 400, for the client to act on
            return Refuse(still_too_long(info), self.prepared.live.sid)
        retry = self.engine.after_too_long(self.prepared, payload)
        if retry is None:
            return None
        self._resent = True
        if retry.body is None:
            return Refuse(retry.message, self.prepared.live.sid)
        return Send(retry.body, self.prepared.betas)

    def answered(self, answer: Answer) -> Finding | None:
        """Record the caller's complete response (`CompactionEngine.record`; never raises)."""
        assert self.prepared is not None, "answered() without a prepared request"
        return self.engine.record(self.prepared, answer)

    def unanswered(self) -> None:
        """The exchange ended without an answer (an error relayed, or a refusal): called on the
        request path, before the client can send its next attempt (`CompactionEngine.unanswered`)."""
        if self.prepared is not None:
            self.engine.unanswered(self.prepared)


class CompactionEngine:
    """Sessions, strategy and forensics for request bodies; thread-safe."""

    def __init__(self, store: str | os.PathLike[str] | Store | None = ".cachecompact/sessions",
                 options: EngineOptions | None = None, *, summarizer: Summarizer | SummarizerFactory | None = None,
                 **settings: Any) -> None:
        """``options`` (an `EngineOptions`), or its settings as keywords (``strategy=``, ``ttl=``, ...)."""
        opts = self.options = EngineOptions.of(options, settings)
        self.strategy_config: StrategyConfig = opts.strategy_config()
        self.config = opts.config or PolicyConfig()
        self.window_tokens = opts.window()  # one home: EngineOptions.window
        self.store: Store | None = open_writable_store(store)
        self.session_id = opts.session_id
        self._summarizer = summarizer
        self.prefix_messages = opts.prefix_messages
        self.scratchpad_tool = opts.scratchpad_tool
        self.diagnostics = opts.diagnostics
        self.ttl, self.prefix_ttl = opts.ttl, opts.prefix_ttl
        self.events = EventBus(opts.hooks, unsaved=True)  # each session's, persisted by the cycle (`_save_events`)
        self.clock = opts.clock
        # refuse a request whose model the price table does not list (wrap(); the proxy, which
        # serves clients it does not configure, prices such a request as the default model)
        self.strict_models = opts.strict_models
        self._unknown_models: set[str] = set()  # ids not in the price table, warned about once
        self.overhead_s = 0.0  # time spent preparing requests and recording usage
        self.registry = SessionRegistry(self.store, LiveMaker(self.store, opts, self.strategy_config, summarizer,
                                                              self.events, self.window_tokens),
                                        max_bytes=opts.max_memory_mb << 20 if opts.max_memory_mb else None)
        self._last_prepared: dict[bytes, Prepared] = {}
        self._lock = threading.Lock()
        # each step's events (a session's id, its link, the events) as they are kept (`_save_events`), for an
        # adapter that reads them: the proxy's dashboard and /metrics count its summary calls' cost from them,
        # as `report` reads them from the store. Data the adapter drains (`drain_step_events`), never a call
        # back up into it; None (the default): not kept
        self.step_events: deque[tuple[str, dict[str, Any] | None, list[Event]]] | None = None

    # -- sessions ----------------------------------------------------------------------------

    @property
    def defer_fsync(self) -> bool:
        """Whether the sessions this engine makes from now on write transcript and request records
        without waiting for the disk (`Session.defer_fsync`). An adapter that turns it on calls
        `Session.flush` of a request's session (`Prepared.live`) after its steps, off the
        request's path; what names those records is written only once they are durable."""
        return self.registry.maker.defer_fsync

    @defer_fsync.setter
    def defer_fsync(self, on: bool) -> None:
        self.registry.maker.defer_fsync = on

    def sessions(self) -> list[Session]:
        """The sessions this engine has in memory."""
        return [x.session for x in self.registry.sessions()]

    def strategies(self) -> list[Strategy]:
        return [x.strategy for x in self.registry.sessions()]

    # -- preparing a request ---------------------------------------------------------------------

    def prepare(self, body: dict[str, Any], *, explicit: str | None, now: float, retry: bool = False,
                raw: bytes | None = None, client_lowers: bool | None = None) -> Prepared | ContextFull:
        """The session, strategy and render for ``body``, or `ContextFull`; raises for bad input.

        ``retry`` marks a repeated attempt of the previous request: its prepared body is reused
        (same fingerprint), so nothing is appended twice. ``raw`` is the body as the client sent
        it, when the adapter has the bytes (the proxy): identities are then looked up by them.
        When the strategy's plan could not be stored because another writer (a replica on the
        same store) appended edits first, the session is opened again from the store and the
        request decided once more.
        """
        try:
            return self._prepare(body, explicit=explicit, now=now, retry=retry, raw=raw, client_lowers=client_lowers)
        except StagedEditsConflictError as err:  # the stale session was let go (`_commit`)
            log.info("cachecompact: %s; deciding again on the stored session", err)
        except ForeignHistoryError as err:  # another writer appended between the sync and the render
            log.info("cachecompact: %s; deciding again", err)
        return self._prepare(body, explicit=explicit, now=now, retry=retry, raw=raw, client_lowers=client_lowers)

    def _prepare(self, body: dict[str, Any], *, explicit: str | None, now: float, retry: bool,
                 raw: bytes | None, client_lowers: bool | None) -> Prepared | ContextFull:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise MalformedMessageError("messages", "must be a non-empty list")
        asks_hour = _check_untouched(body)
        if isinstance(body.get("model"), str):
            try:
                get_model(body["model"], self.options.prices)  # UnknownModelError names the nearest ids, how to price
            except UnknownModelError as err:
                if self.strict_models:
                    raise
                if body["model"] not in self._unknown_models:  # the proxy forwards it (the API decides), and says
                    self._unknown_models.add(body["model"])  # once what wrap() says (issue 50)
                    log.warning("cachecompact: %s; forwarded as sent (the upstream decides whether it exists)", err)
        if explicit is not None:
            check_session_id(explicit, "session id")
        else:
            explicit = self.session_id
        params = {k: v for k, v in body.items() if k not in ("messages", "system", "tools")}
        # every message's identity, once per request
        req = RequestHistory.of_bytes(raw, body) if raw is not None else RequestHistory.of(body)
        fp = req.fingerprint(explicit, params)  # the whole request: a retry is exactly the same body
        with self._lock:
            again = self._last_prepared.get(fp) if retry else None
        if again is not None:
            return again  # a retried attempt: nothing new to record
        with self.registry.held(body, explicit, req) as resolved:  # the session's lock, until rendered
            live = resolved.live
            if live.session.stale:  # a write of it failed after its plan (while recording): open it again
                self.registry.forget(live.sid, live)
                raise StagedEditsConflictError(live.sid, f"session {live.sid}: its memory holds what the store "
                                               "does not; deciding again on the stored session")
            unconfirmed = live.session.unconfirmed()
            if unconfirmed:
                # a summary (ours or the API's) no request record commits to, which this process
                # did not make (a restart, another process's or a forger's append): the request goes
                # out as the caller sent it, with a `failure` event naming the entry, before the
                # strategy plans anything on top of it (docs/ledger-format.md, *Unconfirmed entries*)
                raise UnconfirmedEntryError(live.sid, unconfirmed)
            d = resolved.decision
            if d.kind != "continue":
                log.log(logging.INFO if d.target is not None else logging.DEBUG,
                        "cachecompact: session %s starts (%s%s)", live.sid, d.reason,
                        f", continuing {d.target} from messages[{d.at}]" if d.target is not None else "")
            self._catch_up(live)
            model = str(params.pop("model", ""))
            max_tokens = int(params.pop("max_tokens", 0) or 0)
            if self.diagnostics:
                params["diagnostics"] = {"previous_message_id": live.last_message_id}
            if isinstance(live.strategy, KnowsClient):
                live.strategy.client_lowers_reserve(client_lowers)
            plan = self._planned(live, lambda: live.strategy.before_request(now, model, max_tokens, params=params))
            self._save_events(live)
            if plan.context_full is not None:
                return ContextFull(plan.context_full, live.sid)
            ttl, prefix_ttl = self._ttls(live)
            if asks_hour and live.shaper is None and "1h" not in (ttl, prefix_ttl) and not live.told_ttl:
                live.told_ttl = True  # once per session: every request of a client like Claude Code asks it
                log.warning("cachecompact: session %s: the request's cache_control asks a 1-hour TTL; cachecompact "
                            "places its own breakpoints and chose %s from the session's gaps (wrap(ttl='1h') or "
                            "EngineOptions(ttl='1h') keeps the hour)", live.sid, ttl or "5m")
            r = live.session.render(model=model, max_tokens=max_tokens, ttl=ttl, prefix_ttl=prefix_ttl, **params)
            if live.shaper is None:
                foreign = _not_own_history(live.session, r, req.ids)
                if foreign is not None:  # never sent: decided again, then failed open (`prepare`)
                    raise ForeignHistoryError(live.sid, foreign)
            live.in_flight = now  # until its answer is recorded, the session is not quiet
            if live.shaper is None:
                out = r.body

                def snap() -> Snapshot:
                    return _snapshot_from_render(r, time=now, model=model, params=params_key(out, r.has_image))
            else:
                whole: dict[str, Any] = {**params, "model": model, "max_tokens": max_tokens,
                                         **{k: body[k] for k in ("system", "tools") if k in body},
                                         "messages": messages}
                out = _escape_hatch(live.shaper.shape(whole), model)
                memo = live.sim_memo
                t = live.session.transcript
                n = len(messages)
                same = n == len(t) and out.get("messages") is messages

                def snap() -> Snapshot:
                    if len(memo) > 50_000:
                        memo.clear()
                    keys = [t.hash_of(i) for i in range(n)] if same else None  # the transcript's own hashes
                    sim = request_from_body(out, now, live.session.counter, memo, keys=keys)
                    return snapshot_from_sim(sim, out, keep_text=False)
            p = Prepared(live, out, r, snap, now, model, max_tokens, params, fp, _betas(live, r, out), req.ids)
        with self._lock:
            self._last_prepared = {fp: p}
        return p

    def _planned(self, live: Live, decide: Callable[[], _T]) -> _T:
        """Run a strategy's decision, then have the session store what it staged, scratchpad
        content and ledger edits together (`Session.commit`): the strategy plans against its
        draft, the cycle writes. What was staged before a failure is stored too, as each edit was
        when strategies wrote them; a plan that lost a race with another writer lets the session
        go (`SessionRegistry.forget`) and raises `StagedEditsConflictError`. A `Plan` is taken
        whole: its TTLs and betas are what the request is rendered and sent with."""
        try:
            out = decide()
        except BaseException:
            with contextlib.suppress(Exception):
                self._commit(live)
            raise
        if isinstance(out, Plan) and out.blobs:
            self._stage_carried(live, out)
        blobs = live.session.staged_blobs
        stored = self._commit(live)
        if isinstance(out, Plan):
            if not out.entries:
                out.entries = stored  # a strategy that did not list what it staged
            if not out.blobs:
                out.blobs = blobs
            _read_old_attributes(live.strategy, out)
            live.ttl, live.prefix_ttl, live.betas = out.ttl, out.prefix_ttl, tuple(out.betas)
        return out

    def _stage_carried(self, live: Live, plan: Plan) -> None:
        """Stage the content a plan carries itself (not through `Draft.keep`). Content filed under
        a name that is not its hash would leave a stored entry naming content the store lacks
        (a ledger that fails verification), so such a plan is refused whole: nothing of it is
        stored, the session is let go (the next request opens it from the store), and the
        request goes out unchanged, the error logged and given to the event hooks as a
        ``failure``."""
        bad = next((ref for ref, data in plan.blobs.items()
                    if not isinstance(data, bytes) or blob_ref(data) != ref), None)
        if bad is None:
            for data in plan.blobs.values():
                live.session.stage_blob(data)
            return
        live.session.stale = True  # its memory holds what the plan staged, which is not stored
        self.registry.forget(live.sid, live)
        self.events.drain(live.sid)
        raise InvalidEditError(f"{type(live.strategy).__name__}'s plan: Plan.blobs[{str(bad)[:60]!r}] is not "
                               "the reference of the bytes it carries; name kept content by the reference "
                               "Draft.keep(text) returns (nothing of this plan was stored)")

    def _commit(self, live: Live) -> list[LedgerEntry]:
        """`Session.commit`; when it fails, the session's memory is not the store's any more:
        this live session is let go (the next request opens it from the store), and the events
        of the plan that was not stored are replaced by one ``failure`` event that keeps what
        its summaries cost (they were paid; their entries were not stored)."""
        try:
            return live.session.commit()
        except Exception as err:
            self.registry.forget(live.sid, live)
            lost = self.events.drain(live.sid)
            self.events.emit(Event("failure", live.sid, reason=f"plan not stored ({type(err).__name__}: {err}); "
                                   f"its {len(lost)} event(s) dropped", cost_usd=sum(e.cost_usd for e in lost)))
            raise

    @staticmethod
    def _catch_up(live: Live) -> None:
        """Another process (a replica on the same store) recorded requests of this session since
        we last did: continue from the strategy state stored with the newest one."""
        s = live.session
        if s.requests_recorded == live.requests_seen:
            return
        st = (s.last_request or {}).get("strategy_state")
        if isinstance(st, dict) and isinstance(live.strategy, StatefulStrategy):
            live.strategy.load_state(st)
        # what this process last saw of the session is not its last request any more
        live.last_body, live.last_stop_reason = None, None
        live.requests_seen = s.requests_recorded

    def exchange(self, body: dict[str, Any], *, explicit: str | None, now: float, retry: bool = False,
                 raw: bytes | None = None, client_lowers: bool | None = None) -> RequestExchange:
        """The steps of one request through this engine (`RequestExchange`), for an adapter to
        drive with its own I/O. ``client_lowers``: whether the client lowers max_tokens on the
        API's 400 for it (`KnowsClient`; None: not known)."""
        return RequestExchange(self, body, explicit=explicit, now=now, retry=retry, raw=raw,
                               client_lowers=client_lowers)

    def prepare_or_fail_open(self, body: dict[str, Any], *, explicit: str | None, now: float,
                             retry: bool = False, raw: bytes | None = None, client_lowers: bool | None = None,
                             _anew: bool = True) -> Prepared | ContextFull | None:
        """`prepare`, or None (send the original request) on anything but an unknown model.
        A session set aside here (`SessionRegistry.quarantine`) is followed by one more `prepare`
        (``_anew``): this very request starts the conversation's new session, compacted from the
        caller's history, instead of going out uncompacted (past a small window, a 400)."""
        t0 = time.perf_counter()
        try:
            return self.prepare(body, explicit=explicit, now=now, retry=retry, raw=raw, client_lowers=client_lowers)
        except UnknownModelError:
            raise  # a model nobody priced: say so clearly
        except (MalformedMessageError, InvalidSessionIdError) as err:
            log.warning("cachecompact: request passed through unchanged: %s", err)
            return None
        except UnicodeEncodeError as err:  # text no UTF-8 can hold (a lone surrogate escape): not valid JSON
            # for the API either ("JSON is malformed"); the client's mistake, which the upstream answers
            log.warning("cachecompact: request passed through unchanged: its text is not valid Unicode (%s at "
                        "character %d)", err.reason, err.start)
            return None
        except Exception as err:  # fail open: the user's request still goes out
            if isinstance(err, UnconfirmedEntryError):  # a verdict on the stored session, not a bug: no traceback
                log.warning("cachecompact: %s; sending the original request", err)
            else:
                log.exception("cachecompact: compaction failed; sending the original request")
            sid = getattr(err, "session_id", None) or self.session_id or "-"
            self.events.emit(Event("failure", sid, reason=f"compaction: {type(err).__name__}: {err}"))
            live = self.registry.get(sid)
            if live is not None:
                self._save_events(live)
                if isinstance(err, UnconfirmedEntryError) and _settled(live, err.entries):
                    self.registry.quarantine(sid, live)  # kept as evidence; this request starts anew
                    if _anew:
                        return self.prepare_or_fail_open(body, explicit=explicit, now=now, retry=retry, raw=raw,
                                                         client_lowers=client_lowers, _anew=False)
            else:
                self.events.drain(sid)  # no session to keep it in: the log line and the hooks had it
            return None
        finally:
            self.overhead_s += time.perf_counter() - t0

    # -- after the response --------------------------------------------------------------------

    def record(self, p: Prepared, answer: Answer) -> Finding | None:
        """Usage and forensics of one response; never raises."""
        t0 = time.perf_counter()
        usage, message_id = answer.usage, answer.message_id
        try:
            live = p.live
            with live.lock:
                # what a strategy stages after a response is stored like a plan (`_planned`), so a
                # write that fails lets the session go instead of leaving it stale in memory
                let_go = False
                try:
                    self._planned(live, lambda: live.strategy.after_response(p.now, usage))
                except StagedEditsConflictError as err:
                    log.info("cachecompact: %s; the request is recorded in the session as stored", err)
                    let_go = True
                live.last_message_id = message_id or live.last_message_id
                cost = priced(p.model, self.options.prices).cost(usage)
                snap = p.snapshot()
                finding: Finding = live.forensics.observe(snap, usage, answer.cache_miss_reason)
                self._report(live, finding)
                self._save_events(live)
                rec = RequestRecord(time=p.now, model=p.model, usage=usage, cost_usd=round(cost, 8),
                                    est_tokens=p.render.tokens, message_id=message_id, stream=answer.stream,
                                    sent_tokens=snap.total, finding=finding.to_dict())
                if isinstance(live.strategy, StatefulStrategy):
                    rec.strategy_state = live.strategy.state()
                plan = p.render.thinking
                if plan.strip or plan.drop_block:  # preserved thinking that edits invalidated (history.thinking)
                    rec.thinking = {"left_out": sorted(plan.strip), "left_out_blocks": plan.blocks,
                                    "left_out_tokens": p.render.left_out_tokens, "drop_block": plan.kept_invalid}
                if live.shaper is None and let_go and self.store is not None:
                    # the request was sent and billed from a render of what is stored (the late
                    # edits came after it): it is recorded there, with the state the strategy
                    # reached, and the next request opens the session from the store
                    stored = Session.open(self.store, live.sid)
                    stored.stable_before = live.session.stable_before  # the mark it was rendered with
                    stored.record_request(p.render, rec)
                elif live.shaper is None:  # a body shaper's requests are not the session's renders
                    live.session.record_request(p.render, rec)
                    live.requests_seen = live.session.requests_recorded
                    live.last_body, live.last_model, live.last_max_tokens = p.body, p.model, p.max_tokens
                    live.last_stop_reason = answer.stop_reason
                live.in_flight = None
                return finding
        except Exception:  # recording must never break the caller's response
            log.exception("cachecompact: could not record usage")
            return None
        finally:
            self.overhead_s += time.perf_counter() - t0

    @staticmethod
    def unanswered(p: Prepared) -> None:
        """The request ``p`` ended without an answer: the session is no longer waiting for it,
        and one that never had an answer is the one a client's retry of the turn takes over
        (`identity.decide`'s ``retry``; issue 62). Plain assignments, no lock: it runs on the
        request path, where the session's lock may be held by a long plan."""
        live = p.live
        if live.in_flight == p.now:
            live.in_flight = None
        live.unanswered += 1

    # -- while a session is quiet ---------------------------------------------------------------

    def compact_idle(self, session_id: str | None = None, *, now: float | None = None,
                     away_s: float | None = None) -> list[IdleDecision]:
        """Summarize quiet sessions before their caches expire, where it pays (`compaction.idle`):
        the one named, or every session in memory. ``away_s``: how long the caller knows it will be
        away, in seconds (else the session's own gaps tell). The edits wait for the next request."""
        now = self.clock() if now is None else now
        if session_id is None:
            lives = self.registry.sessions()
        else:
            live = self.registry.get(session_id)
            if live is None:
                raise SessionNotFoundError(f"compact_idle: no session {session_id!r} is in memory here; "
                                           "with no id it takes every one that is")
            lives = [live]
        out = []
        for live in lives:
            with live.lock:
                try:
                    self._catch_up(live)
                    out.append(self._idle_one(live, now, away_s))
                except Exception as err:  # one session's failure is its decision; the others still get theirs
                    log.exception("cachecompact: idle compaction of session %s failed", live.sid)
                    out.append(IdleDecision(session_id=live.sid, at=now, fired=False,
                                            reason=f"failed: {type(err).__name__}: {err}"))
                d = out[-1]
                if not d.fired:  # a decision that does not fire leaves its reason in the session's log too (issue 50)
                    self.events.emit(Event("idle_declined", live.sid, reason=d.reason, tokens_before=d.tokens_before,
                                           tokens_after=d.tokens_after, detail={"at": d.at, "p_late": d.p_late,
                                                                                "value_usd": d.value_usd}),
                                     level=logging.DEBUG)
                self._save_events(live)
        return out

    @staticmethod
    def _idle_one(live: Live, now: float, away_s: float | None) -> IdleDecision:
        def no(why: str) -> IdleDecision:
            return IdleDecision(session_id=live.sid, at=now, fired=False, reason=why)

        if live.shaper is not None or not isinstance(live.strategy, CompactsIdle):
            return no(f"its strategy ({type(live.strategy).__name__}) does not compact quiet sessions")
        if live.last_body is None:
            return no("no request of this session has been answered here yet")
        if live.in_flight is not None:
            return no("a request of this session is under way: it is not quiet")
        if live.last_stop_reason == "tool_use":
            # the next request answers that turn's calls: an edit before it would invalidate thinking
            # the API needs back exactly as it was (history.thinking), and a tool, not a person, is awaited
            return no("the last response called a tool: the agent, not a person, speaks next")
        return live.strategy.idle(now, live.last_model, live.last_max_tokens, live.last_body, away_s=away_s)

    def idle_due(self) -> list[tuple[str, float]]:
        """For a scheduler: each session whose strategy wants to decide while it is quiet, and
        when (cachecompact's: `DECIDE_BEFORE_S` before its cache expires)."""
        out = []
        for live in self.registry.sessions():
            due = self._due(live)
            if due is not None:
                out.append((live.sid, due))
        return out

    def credential_until(self, session_id: str) -> float | None:
        """How long the named session's credential is needed for its idle decision: a minute
        past the moment it is due, which for cachecompact is when its cache expires (None: no
        decision will come, or no such session is in memory)."""
        live = self.registry.get(session_id)
        due = self._due(live) if live is not None else None
        return due + DECIDE_BEFORE_S if due is not None else None

    @staticmethod
    def _due(live: Live) -> float | None:
        """A scheduler decides only for a session whose last response ended the turn (the next
        request waits for a person) and that has no request under way."""
        if live.shaper is not None or not isinstance(live.strategy, CompactsIdle) or live.last_body is None \
                or live.in_flight is not None or live.last_stop_reason not in TURN_ENDS:
            return None
        with live.lock:  # the strategy reads the session, which a request may be changing
            return live.strategy.idle_due()

    def _report(self, live: Live, f: Finding) -> None:
        if f.cls == "read_as_expected":
            return
        if f.cls == "compaction_rewrite":  # our own edit's re-write, paid on purpose: never a cache_miss
            entries = [f.explained_by] if f.explained_by is not None else []
            self.events.emit(Event("compaction_rewrite", live.session.session_id, reason=f.detail,
                                   cost_usd=f.wasted_usd, entries=entries, detail=f.to_dict()), level=logging.DEBUG)
            return
        level = (logging.DEBUG if f.explained_by is not None or f.cls == "below_minimum" else
                 logging.INFO if f.cls in ("ttl_expiry", "server_edit") else logging.WARNING)
        self.events.emit(Event("cache_miss", live.session.session_id, reason=f"{f.cls}: {f.detail}",
                               cost_usd=f.wasted_usd, detail=f.to_dict()), level=level)

    def _save_events(self, live: Live) -> None:
        """Persist what ``live``'s step emitted (the event log is informational: a store that
        fails here is logged, and the request goes on)."""
        events = self.events.drain(live.sid)
        if events and self.step_events is not None:
            self.step_events.append((live.sid, live.session.link, events))
        if live.session.store is None:
            return
        for ev in events:
            try:
                live.session.log_event(ev.to_dict())
            except (OSError, CacheCompactError):
                log.exception("cachecompact: could not persist an event")

    def unknown_model(self, model: Any) -> str | None:
        """What the price table says of a model id it does not list (the nearest ids, how to price
        it), else None: an adapter adds it to the upstream's own "not found" answer, so the person
        who mistyped the id reads the hint, not only the log."""
        if not isinstance(model, str):
            return None
        try:
            get_model(model, self.options.prices)
        except UnknownModelError as err:
            return str(err)
        return None

    def drain_step_events(self) -> list[tuple[str, dict[str, Any] | None, list[Event]]]:
        """The steps' events kept since the last call (`step_events`), oldest first."""
        out = []
        q = self.step_events
        while q:
            try:
                out.append(q.popleft())
            except IndexError:  # another thread drained it first
                break
        return out

    def _ttls(self, live: Live) -> tuple[TTL | None, TTL | None]:
        """The TTLs a request is rendered with: the caller's (``ttl=``, ``prefix_ttl=``), else its
        strategy's plan's (the policy's choice, or a peer's model of its client); a 1-hour
        breakpoint never follows a 5-minute one."""
        ttl = self.ttl or live.ttl
        prefix = self.prefix_ttl or live.prefix_ttl
        if ttl == "1h" and prefix == "5m":
            prefix = "1h"
        return ttl, prefix

    def after_too_long(self, p: Prepared, payload: Any) -> Retry | None:
        """The one reactive path of both adapters, for a 400 they got for ``p``: None when
        ``payload`` (the 400's JSON) is not a prompt-too-long error; else reactive compaction,
        and what to do: send `Retry.body` once more, or answer with `Retry.message`."""
        info = too_long(payload)
        if info is None:
            return None
        try:
            body = self.reactive(p, info)
        except Exception as err:  # the caller's request must get an answer
            # its edits were not stored (another writer first, or the store failed): the API's
            # own 400 goes back, not "context full", which would not be true; the session was let
            # go, and the next request plans on the stored one
            log.warning("cachecompact: reactive compaction not stored: %s: %s", type(err).__name__, err)
            return None
        if body is not None:
            return Retry(body, "")
        n, limit, out = info
        if out and n < limit:
            # the prompt fits; only max_tokens does not: the API's own 400 goes back as it is, so a
            # client that lowers max_tokens on it (Claude Code) recovers, as it does without us
            return None
        reserved = out or p.max_tokens
        s = p.live.session
        fixed = s.prefix_end if s.prefix_end is not None else len(s)
        r = s.render(breakpoints=False)  # while the prefix forms, every message so far is fixed
        # one counter for both sides: the prefix's share of our estimate, of the API's count
        share = (r.prefix_tokens if s.prefix_end is not None else r.tokens) / max(1, r.tokens)
        prefix = min(n, round(share * n))
        why = "compaction cannot remove enough"
        if prefix * 2 >= n:
            why = (f"{prefix:,} of them (by the same count) are the immutable prefix (tools, system and the first "
                   f"{fixed} message{'s' if fixed != 1 else ''}), which no compaction edits"
                   + (f": {PREFIX_SETTING} fixes only the first message, so the rest can be compacted"
                      if fixed > 1 else ": the task itself is over the limit; shorten it"))
        return Retry(None, too_long_message(
            n, limit, f"context is full: the prompt has {n:,} tokens and the request reserves {reserved:,} output "
                      f"tokens (its max_tokens) within the API's {limit:,}-token limit, so it would take a window "
                      f"of at least {n + reserved:,}; {why}. Shorten the conversation or start a new session"))

    def reactive(self, p: Prepared, info: tuple[int, int, int]) -> dict[str, Any] | None:
        """Compact after a prompt-too-long error: the new body, or None when nothing more fits."""
        n, limit, out = info
        live = p.live
        with live.lock:
            freed = self._planned(live, lambda: live.strategy.reactive(n, limit, p.now, p.model, out or p.max_tokens))
            self._save_events(live)
            if not freed:
                return None
            ttl, prefix_ttl = self._ttls(live)
            r = live.session.render(model=p.model, max_tokens=p.max_tokens, ttl=ttl, prefix_ttl=prefix_ttl,
                                    **p.params)
            foreign = _not_own_history(live.session, r, p.ids) if live.shaper is None else None
            if foreign is not None:  # the session moved on since the request was prepared: the API's 400 stands
                raise ForeignHistoryError(live.sid, foreign)
            p.render = r
            p.body = r.body if live.shaper is None else live.shaper.shape(p.body)
            p.betas = _betas(live, r, p.body)
            return p.body

    # -- the read_scratchpad tool ---------------------------------------------------------------------

    def read_scratchpad(self, tool_input: dict[str, Any], messages: list[Any] | None = None) -> tuple[str, bool]:
        """Answer a ``read_scratchpad`` tool call: (tool_result content, is_error), from the
        caller's own conversation only (issue 56: one tenant never reads another's output).

        With ``messages`` (the agent's history, as it sends it), the conversation is that of the
        session whose whole transcript the history starts with, in memory or stored: after a
        restart the agent's pending call still finds what an earlier process kept for it.
        Without them, the sessions this engine has served (in memory) and, for a named engine
        (``session_id=``), that name's stored sessions. A conversation is its session, its
        segments and its sub-agents (linked, docs/architecture.md). A reference of any other
        session answers exactly as a missing one, so its existence does not leak."""
        ref = tool_input.get("ref") if isinstance(tool_input, dict) else None
        if not isinstance(ref, str) or not REF_RE.match(ref):
            return Scratchpad(None).handle_tool_call(tool_input)  # the malformed reference's own error
        try:
            scope = self._own_sessions(messages)
        except (CacheCompactError, OSError) as err:  # the store is unreadable: an error result, not a crash
            return f"read_scratchpad error: the session store cannot be read: {err}", True
        for sid in scope:
            live = self.registry.get(sid)
            try:
                sp = Scratchpad.for_session(live.session) if live is not None else \
                    Scratchpad(self.store.open(sid)) if self.store is not None else None
                if sp is None:
                    continue
                text, is_error = sp.handle_tool_call(tool_input)
            except (CacheCompactError, OSError):  # a broken or just-deleted session: the next may serve
                continue
            if not is_error:
                return text, is_error
        return Scratchpad(None).handle_tool_call(tool_input)

    def _own_sessions(self, messages: list[Any] | None) -> list[str]:
        """The ids `read_scratchpad` may read from, the caller's own first."""
        if messages is not None:
            req = RequestHistory.of({"messages": messages})
            if not req.ids:
                return []
            named = self.options.session_id
            sid = self.registry.holding(req, check_session_id(named) if named else family_key(req.ids[0]))
            return self.registry.conversation(sid) if sid is not None else []
        starts = [live.sid for live in self.registry.sessions()]
        if self.options.session_id and self.store is not None:
            starts += [k for k in self.store.list(self.options.session_id) if in_family(k, self.options.session_id)]
        out: dict[str, None] = {}
        for sid in starts:
            if sid not in out:
                out.update(dict.fromkeys(self.registry.conversation(sid)))
        return list(out)


_TOLD_OLD: set[tuple[type, str]] = set()


# how long an unconfirmed summary (ours or the API's) may be one whose request is still under way on
# another process sharing the store (the anthropic SDK's default timeout is 10 minutes): until
# then its session fails open per request; after, it is set aside (`SessionRegistry.quarantine`)
UNCONFIRMED_GRACE_S = 600.0


def _settled(live: Live, seqs: list[int]) -> bool:
    """Whether every unconfirmed entry ``seqs`` of ``live`` is older than a request carrying it
    could still be under way elsewhere (`UNCONFIRMED_GRACE_S`, by its ``created_at``): a replica
    sharing the store must not set aside a session another one is about to confirm (its request
    record lands when the answer does). An entry whose time cannot be read counts as settled."""
    entries = live.session.ledger.entries
    now = time.time()
    for k in seqs:
        try:
            made = datetime.strptime(entries[k].created_at, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()
        except (IndexError, ValueError, TypeError):
            continue
        if now - made < UNCONFIRMED_GRACE_S:
            return False
    return True


def _read_old_attributes(strategy: object, plan: Plan) -> None:
    """Fill ``plan`` with what a 0.3-development strategy said on itself instead of in its plan: a
    ``ttl``, ``prefix_ttl`` or ``betas`` attribute fills the plan's field when the plan leaves it
    unset, with a `DeprecationWarning` (read until 0.4), said once per class in the log too.
    Without it such a strategy's betas would silently go unsent (the API refuses the body) and
    its 1-hour TTL become 5 minutes."""
    cls = type(strategy)

    def tell(name: str) -> None:
        why = f"{cls.__name__}.{name} is read until 0.4: return it in the Plan (Plan.{name})"
        warnings.warn(why, DeprecationWarning, stacklevel=4)
        if (cls, name) not in _TOLD_OLD:
            _TOLD_OLD.add((cls, name))
            log.warning("cachecompact: %s", why)

    for name in ("ttl", "prefix_ttl"):
        value = getattr(strategy, name, None)
        if getattr(plan, name) is None and value in ("5m", "1h"):
            tell(name)
            setattr(plan, name, value)
    betas = getattr(strategy, "betas", None)
    if not plan.betas and isinstance(betas, (tuple, list)) and betas and all(isinstance(b, str) for b in betas):
        tell("betas")
        plan.betas = tuple(betas)


def _not_own_history(session: Session, r: RenderResult, ids: list[bytes]) -> str | None:
    """Why render ``r`` is not made from the caller's own history alone, or None when it is.

    The check every rendered request passes before it is sent (issue 46): the render covers
    exactly the caller's ``len(ids)`` messages; the session's transcript holds, at each of those
    indices, the message the caller sent there (by identity, every message, not a sample); and
    every ledger edit it applies was made on at most those messages and ends inside them, so no
    summary or placeholder carries what another agent appended. The transcript is append-only,
    so a transcript that equals the caller's history up to ``len(ids)`` cannot be changed there
    later; what this catches is a render of a session that has moved on (another thread, replica
    or process appended after the sync), whatever the cause.
    """
    n = len(ids)
    if r.transcript_len != n:
        return f"the render covers {r.transcript_len} transcript messages, the request has {n}"
    have = session.transcript.identities
    if len(have) < n or have[:n] != ids:
        first = next((i for i in range(min(n, len(have))) if have[i] != ids[i]), min(n, len(have)))
        return f"the session's message {first} is not the one the request sent there"
    for e in session.ledger.effective(r.n_entries):
        if e.transcript_len > n or e.end >= n:
            return (f"ledger entry #{e.seq} ({e.start}..{e.end}, made at {e.transcript_len} messages) reaches past "
                    f"the request's {n} messages")
    return None


def _betas(live: Live, r: RenderResult, out: dict[str, Any] | None = None) -> tuple[str, ...]:
    """The ``anthropic-beta`` values a prepared body needs: its strategy's plan's (a server-side
    peer's), and the one ``thinking.block_binding`` needs (the render's, or a body peer's escape
    hatch)."""
    betas = live.betas
    if live.shaper is None:
        return tuple(dict.fromkeys((*betas, *r.betas)))
    th = (out or {}).get("thinking")
    return tuple(dict.fromkeys((*betas, BINDING_BETA))) if isinstance(th, dict) and "block_binding" in th else betas


def _escape_hatch(out: dict[str, Any], model: str) -> dict[str, Any]:
    """A peer that shapes bodies its own way keeps no ledger to tell which thinking its edits
    invalidated, so on a model with preserved thinking it asks the API to drop what fails the
    prefix check: the documented escape hatch (``prefix_mismatch_behavior: "drop_block"``), as its
    real counterpart would have to. A caller's own ``block_binding`` stands."""
    if canonical_id(model) not in PRESERVED_THINKING or not any(
            isinstance(b, dict) and b.get("type") in ("thinking", "redacted_thinking")
            for m in out.get("messages") or [] if isinstance(m, dict) and isinstance(m.get("content"), list)
            for b in m["content"]):
        return out
    th = out.get("thinking")
    th = dict(th) if isinstance(th, dict) else {"type": "adaptive"}
    th.setdefault("block_binding", dict(DROP_BLOCK))
    return {**out, "thinking": th}


def _check_untouched(body: dict[str, Any]) -> bool:
    """The caller's fields that rendering would otherwise change, checked as the API checks them:
    a request the API would refuse goes out exactly as the caller sent it (`MalformedMessageError`:
    the adapters pass it through), so the caller gets the API's own answer (issue 46: a missing
    ``max_tokens``, ``tools: false`` or a bad marker got 200 through compact mode, a numeric
    ``model`` got 404). What is checked is what the cycle rewrites: ``model`` and ``max_tokens``
    (read as a string and an integer), top-level ``null`` values (the renderer leaves them out),
    the types of ``tools`` and ``system`` (a falsy one would be dropped), and every
    ``cache_control`` marker, the top-level one included (replaced by the renderer's own): each
    valid (`cache_keys.check_marker`), none on a thinking block, at most 4, no 1-hour marker
    after a 5-minute one. Returns whether a marker asks the 1-hour TTL: the engine says once
    that its own choice replaces it."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise MalformedMessageError("model", "must be a non-empty string")
    mt = body.get("max_tokens")
    if not isinstance(mt, int) or isinstance(mt, bool) or mt < 0:
        raise MalformedMessageError("max_tokens", f"must be a non-negative integer, got {str(mt)[:40]}")
    nulls = [k for k, v in body.items() if v is None]
    if nulls:
        raise MalformedMessageError(nulls[0], "is null; such a request is sent as it came, for the API to answer")
    tools, system = body.get("tools"), body.get("system")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise MalformedMessageError("tools", "must be a list of tool definitions")
    if system is not None and not (isinstance(system, str) or (
            isinstance(system, list) and all(isinstance(b, dict) for b in system))):
        raise MalformedMessageError("system", "must be a string or a list of text blocks")
    ttls: list[str] = []
    for i, t in enumerate(tools or ()):
        if (ttl := check_marker(t.get("cache_control"), f"tools[{i}]")) is not None:
            ttls.append(ttl)
    for j, b in enumerate(system if isinstance(system, list) else ()):
        if (ttl := check_marker(b.get("cache_control"), f"system[{j}]")) is not None:
            ttls.append(ttl)
    for i, m in enumerate(body["messages"]):
        content = m.get("content") if isinstance(m, dict) else None
        if not isinstance(content, list):
            continue
        for j, b in enumerate(content):
            if not isinstance(b, dict):
                continue
            cc = b.get("cache_control")
            if cc is not None:
                where = f"messages[{i}].content[{j}]"
                ttls.append(check_marker(cc, where) or "5m")
                if b.get("type") in NOT_CACHEABLE:
                    raise MalformedMessageError(f"{where}.cache_control", "thinking blocks cannot carry cache_control")
            inner = b.get("content") if b.get("type") == "tool_result" else None
            for k, x in enumerate(inner if isinstance(inner, list) else ()):
                if isinstance(x, dict) and x.get("cache_control") is not None:
                    ttls.append(check_marker(x["cache_control"], f"messages[{i}].content[{j}].content[{k}]") or "5m")
    top = check_marker(body.get("cache_control"), "body")
    check_marker_order(ttls, top)
    return "1h" in ttls or top == "1h"
