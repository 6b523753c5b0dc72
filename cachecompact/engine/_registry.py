"""The live sessions of one engine: the live record, its maker and the registry.

**The maker** (`LiveMaker`) builds the live record (`Live`) of a new or a stored session: the
session over the store, the strategy built for its model and window with its summarizer, its
forensics and its scratchpad.

**The registry** (`SessionRegistry`) keeps the candidates of the rule (`engine.identity`):
sessions in memory, least recently used first out, and the store's for the rest, so it serves
one process or many replicas over a shared store alike. It acts on the decision: it syncs the
chosen session, or creates the new one, syncs it before any other request can see it, and
links it to the session it continues.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..base.errors import (
    ConfigError,
    HistoryRewrittenError,
    MalformedMessageError,
    SessionExistsError,
    SessionIdMismatchError,
    SessionNotFoundError,
    StoreError,
)
from ..base.events import EventBus
from ..base.pricing import model_window, priced
from ..base.values import TTL, SummaryMode
from ..cache.forensics import Forensics
from ..cache.simulator import SimBlock
from ..compaction.strategy import BodyShaper, Strategy, StrategyConfig, StrategyContext, shaper_of
from ..compaction.summarize.llm import ExtractiveSummarizer, Summarizer
from ..history.draft import Draft
from ..history.scratchpad import READ_SCRATCHPAD_TOOL
from ..history.session import Session
from ..store import Store, check_session_id
from .identity import (
    Decision,
    RequestHistory,
    decide,
    family_base,
    family_key,
    family_order,
    in_family,
    new_id,
    preamble_key,
)
from .options import EngineOptions

__all__ = ["Live", "LiveMaker", "Resolved", "SessionRegistry", "SummarizerFactory"]

log = logging.getLogger("cachecompact")


# -- the live record and its maker ---------------------------------------------------------------

SummarizerFactory = Callable[[str | None, SummaryMode], Summarizer]  # (model or None: the agent's, mode) -> summarizer


@dataclass(slots=True, eq=False)
class Live:
    """A session in memory with what the engine keeps beside it, each field typed and named (no
    bag of keys): the engine writes them, and the registry only hands a new segment its
    parent's forensics."""

    session: Session
    strategy: Strategy
    shaper: BodyShaper | None  # the strategy, when it rewrites the caller's body instead of rendering (`shaper_of`)
    preamble: bytes  # `preamble_key` of the caller's tools and system the session was made for
    forensics: Forensics  # compares each request with the one before it in this conversation
    lock: threading.Lock = field(default_factory=threading.Lock)
    last_message_id: str | None = None  # the last response's id (the diagnostics' previous_message_id)
    requests_seen: int = 0  # request records this process has applied (`CompactionEngine._catch_up`)
    told_ttl: bool = False  # the caller's 1-hour markers were said to be replaced (once per session)
    sim_memo: dict[tuple[bytes, int], tuple[list[SimBlock], bool]] = field(default_factory=dict)  # priced blocks
    # the last answered request as sent, and why its response stopped: what idle compaction reads
    # (a warm summary reuses that request's cached prefix; after ``tool_use`` no person is awaited)
    last_body: dict[str, Any] | None = None
    last_model: str = ""
    last_max_tokens: int = 0
    last_stop_reason: str | None = None
    in_flight: float | None = None  # the time of a request prepared and not yet answered
    unanswered: int = 0  # requests that ended without an answer (an error relayed, `CompactionEngine.unanswered`)
    # what the strategy's last plan rendered and sent the request with (`Plan`): a retry after a
    # prompt-too-long error keeps them
    ttl: TTL | None = None
    prefix_ttl: TTL | None = None
    betas: tuple[str, ...] = ()

    @property
    def sid(self) -> str:
        return self.session.session_id

    @property
    def failed(self) -> bool:
        """Whether every request this session was sent ended without an answer, none under way:
        a client's next attempt at that turn takes it over (`identity.decide`'s retry)."""
        return self.unanswered > 0 and self.in_flight is None and self.session.requests_recorded == 0

    @property
    def nbytes(self) -> int:
        """An estimate of the memory the live session holds: its messages' bytes, times the
        copies kept of them (parsed messages, rendered blocks and their canonical bytes, the
        chain arrays). benchmarks/proxy_memory.py measures what a capped proxy still holds
        against it (docs/benchmarks.md, *Proxy memory under its byte cap*)."""
        return LIVE_BYTES_PER_MESSAGE_BYTE * self.session.transcript.nbytes

    @property
    def identities(self) -> Sequence[bytes]:
        return self.session.transcript.identities


class LiveMaker:
    """Makes the live record of a new or a stored session for one engine's settings."""

    def __init__(self, store: Store | None, options: EngineOptions, strategy_config: StrategyConfig,
                 summarizer: Summarizer | SummarizerFactory | None, events: EventBus,
                 window_tokens: int | None) -> None:
        self.store, self.options, self.strategy_config = store, options, strategy_config
        self._summarizer, self.events, self.window_tokens = summarizer, events, window_tokens
        # the sessions it makes write transcript and request records without waiting for the disk
        # (`Session.defer_fsync`); the adapter that sets it flushes each one once a request is answered
        self.defer_fsync = False

    def summarizer_for(self, model: str | None) -> Summarizer:
        """The summarizer a session on ``model`` gets: the caller's, or one made for the strategy's summary model."""
        s = self._summarizer
        if s is None:
            return ExtractiveSummarizer()
        if isinstance(s, Summarizer):
            return s
        cfg = self.strategy_config
        return s(cfg.summary_model or model, cfg.summary_mode)

    def _live(self, session: Session, body: dict[str, Any], caller_preamble: bytes) -> Live:
        """The live record: the strategy built for the session's model and window, fresh forensics."""
        model = str(body.get("model") or "")
        own = model_window(model, self.options.prices)
        window = self.window_tokens or own
        if window > own and (model, window) not in _LARGER_WARNED:
            _LARGER_WARNED.add((model, window))  # compaction would wait for room the model does not have
            log.warning("cachecompact: window_tokens=%d is larger than %s's context window (%d tokens); the API "
                        "will refuse requests before compaction starts", window, model or "the model", own)
        # the tool is the session's, fixed when it was made: a session stored without it, reopened by
        # an engine that adds it to new ones, must not have placeholders name a tool its requests lack
        carries = any(isinstance(t, dict) and t.get("name") == READ_SCRATCHPAD_TOOL["name"]
                      for t in session.tools_param)
        ctx = StrategyContext(draft=Draft(session), summarizer=self.summarizer_for(model or None),
                              events=self.events, window_tokens=window,
                              scratchpad_tool=self.options.scratchpad_tool and carries, prices=self.options.prices)
        strategy = self.strategy_config.build(ctx)
        missing = [m for m in ("before_request", "after_response", "reactive")
                   if not callable(getattr(strategy, m, None))]
        if missing:  # said by name, not as an AttributeError deep inside the request
            raise ConfigError(f"strategy {type(self.strategy_config).__name__}.build returned a "
                              f"{type(strategy).__name__} without {', '.join(missing)}: a strategy implements "
                              "before_request, after_response and reactive (compaction/strategy.py, Strategy; "
                              "LedgerStrategy gives after_response)")
        return Live(session=session, strategy=strategy, shaper=shaper_of(strategy), preamble=caller_preamble,
                    forensics=Forensics(self.options.prices))

    def create(self, sid: str, body: dict[str, Any], link: dict[str, Any] | None) -> Live:
        """A new session ``sid`` in the store for the request ``body`` (`SessionExistsError` if taken)."""
        tools = list(body.get("tools") or [])
        if self.options.scratchpad_tool:
            tools.append(READ_SCRATCHPAD_TOOL)
        model = str(body.get("model") or "")
        ratio = priced(model, self.options.prices).token_ratio if model else 1.0
        prefix = self.options.prefix_messages if self.options.prefix_messages is not None else \
            self.strategy_config.prefix_messages
        session = Session.create(self.store, session_id=sid, system=body.get("system"), tools=tools,
                                 prefix_messages=prefix, token_ratio=ratio, link=link)
        session.defer_fsync = self.defer_fsync
        return self._live(session, body, preamble_key(body.get("tools"), body.get("system")))

    def open(self, sid: str, model: str = "") -> Live:
        """The stored session ``sid``, live (`SessionNotFoundError` if there is none); its model
        (window, summaries) is its last request's, else ``model`` (the request that opens it)."""
        assert self.store is not None
        session = Session.open(self.store, sid)
        session.defer_fsync = self.defer_fsync
        tools = session.tools_param
        if self.options.scratchpad_tool and tools and tools[-1].get("name") == READ_SCRATCHPAD_TOOL["name"]:
            tools = tools[:-1]
        body = {"model": (session.last_request or {}).get("model") or model, "tools": tools or None,
                "system": session.system_param}
        return self._live(session, body, preamble_key(tools or None, session.system_param))


LIVE_BYTES_PER_MESSAGE_BYTE = 4  # `Live.nbytes`: copies of each message byte a live session keeps

_LARGER_WARNED: set[tuple[str, int]] = set()  # (model, window_tokens) said to exceed the model's window


# -- the registry --------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Resolved:
    """A request's session, the transcript indices its sync appended, and the decision taken."""

    live: Live
    new: list[int]
    decision: Decision


class SessionRegistry:
    """Resolves requests to sessions and keeps them live; thread-safe."""

    def __init__(self, store: Store | None, maker: LiveMaker, *, keep: int = 512, max_bytes: int | None = None
                 ) -> None:
        """``keep`` sessions at most in memory, and with ``max_bytes`` at most that many bytes of
        them (`Live.nbytes`), least recently used out first: a session let go opens again from the
        store when its next request comes (without a store it starts anew)."""
        self.store = store
        self.maker = maker  # new and stored sessions come from it, already live
        self._keep = keep
        self.max_bytes = max_bytes
        self._live: OrderedDict[str, Live] = OrderedDict()
        self._not_ours: set[str] = set()  # stored observe-mode records in a family: their ids are taken, no more
        self._lock = threading.Lock()

    def sessions(self) -> list[Live]:
        with self._lock:
            return list(self._live.values())

    def get(self, sid: str) -> Live | None:
        with self._lock:
            return self._live.get(sid)

    def forget(self, sid: str, live: Live) -> None:
        """Let ``live`` go from memory: the next request of ``sid`` opens it again from the store
        (its strategy from the state stored with its last request), as after a restart. Only
        that object: one another thread opened since under the same id stays."""
        with self._lock:
            if self._live.get(sid) is live:
                del self._live[sid]

    def quarantine(self, sid: str, live: Live) -> None:
        """Never continue ``sid`` again in this process: let ``live`` go, and leave the stored
        session out of every later decision (as another mode's records are). A session whose
        ledger holds an entry this process may not render (an unconfirmed summary, ours or the API's:
        a forger's append, or a genuine one left by a crash) stays in the store as evidence, and
        the conversation's next request starts a session of its own from the caller's history,
        compacted again from there, instead of going out uncompacted for good."""
        with self._lock:
            if self._live.get(sid) is live:
                del self._live[sid]
            self._not_ours.add(sid)

    def _remember(self, sid: str, live: Live) -> Live:
        self._live[sid] = live
        self._live.move_to_end(sid)
        self._trim()
        return live

    def _trim(self) -> None:
        """Let the least recently used sessions go while more than ``keep`` are held, or more than
        ``max_bytes`` (never the newest: a request is using it). Caller holds ``_lock``."""
        while len(self._live) > self._keep:
            self._live.popitem(last=False)
        if self.max_bytes is None:
            return
        total = sum(x.nbytes for x in self._live.values())
        while total > self.max_bytes and len(self._live) > 1:
            _, gone = self._live.popitem(last=False)
            total -= gone.nbytes

    def _load(self, sid: str, model: str = "") -> Live | None:
        live = self._live.get(sid)
        if live is not None:
            self._live.move_to_end(sid)
            return live
        if self.store is None:
            return None
        try:
            return self._remember(sid, self.maker.open(sid, model))
        except SessionNotFoundError:
            return None
        except SessionIdMismatchError as err:  # a copied or renamed folder: not this id's session
            self._not_ours.add(sid)
            log.warning("cachecompact: session %s is passed over: %s", sid, err)
            return None
        except StoreError:
            if not self._observed(sid):
                raise  # a damaged session of ours: the request fails open and says why (a `failure` event)
            self._not_ours.add(sid)  # a proxy's record of requests it forwarded unchanged: never a candidate
            return None

    def _observed(self, sid: str) -> bool:
        """Whether stored ``sid`` is an observe-mode record (a proxy's, not a session with a ledger)."""
        assert self.store is not None
        try:
            return self.store.open(sid).read_meta().get("observed") is True
        except Exception:  # unreadable either way: the caller's error stands
            return False

    def _family(self, base: str, stored: bool) -> list[str]:
        """Ids of ``base``'s family in number order: live ones, and with ``stored`` the store's too."""
        ids = {k for k in self._live if in_family(k, base)}
        if stored and self.store is not None:
            ids |= {k for k in self.store.list(base) if in_family(k, base)}
        return sorted(ids, key=family_order)

    # -- a caller's conversation (read_scratchpad's scope) -------------------------------------------

    def holding(self, req: RequestHistory, base: str) -> str | None:
        """The session whose whole transcript ``req``'s history starts with (the longest), in
        ``base``'s family, in memory or stored; None when there is none. The caller proves the
        session is its own by sending all of it, so no other caller's session is found this way."""
        best: tuple[int, str] | None = None
        with self._lock:
            for sid in self._family(base, stored=True):
                if sid in self._not_ours:
                    continue
                try:
                    live = self._load(sid)
                except (StoreError, OSError):  # damaged or just deleted: not the caller's to read
                    continue
                ids = live.identities if live is not None else ()
                if ids and len(ids) <= len(req.ids) and list(ids) == req.ids[:len(ids)] \
                        and (best is None or len(ids) > best[0]):
                    best = (len(ids), sid)
        return best[1] if best is not None else None

    def _link_of(self, sid: str) -> str | None:
        live = self.get(sid)
        if live is not None:
            link = live.session.link
        elif self.store is not None:
            try:
                link = self.store.open(sid).read_meta().get("link")
            except (StoreError, OSError):
                return None
        else:
            return None
        target = link.get("session") if isinstance(link, dict) else None
        return target if isinstance(target, str) else None

    def conversation(self, sid: str) -> list[str]:
        """Ids of ``sid``'s conversation: the session its links lead back to, and every session of
        its family linked to that one (segments, sub-agents under the same name), ``sid`` first."""
        base = family_base(sid)

        def root_of(k: str) -> str:
            seen = {k}
            while (up := self._link_of(k)) is not None and up not in seen and in_family(up, base):
                seen.add(up)
                k = up
            return k

        root = root_of(sid)
        with self._lock:
            members = self._family(base, stored=True)
        return [sid, *(k for k in members if k != sid and k not in self._not_ours and root_of(k) == root)]

    # -- resolution ----------------------------------------------------------------------------------

    @contextlib.contextmanager
    def held(self, body: dict[str, Any], explicit: str | None = None,
             req: RequestHistory | None = None) -> Iterator[Resolved]:
        """The live session this request continues (`decide`), synced with its history, with
        the session's lock held until the block ends.

        The lock is taken before the sync and kept through whatever the caller does next (the
        strategy's plan, the render): no other request can append to the session in between,
        so what is rendered is the history this request synced, not one another agent with the
        same opening appended after it (issue 46: a request that synced, released the lock and
        rendered later carried the other agent's messages).
        """
        resolved = self._resolve(body, explicit, req)
        try:
            yield resolved
        finally:
            resolved.live.lock.release()

    def _resolve(self, body: dict[str, Any], explicit: str | None, req: RequestHistory | None) -> Resolved:
        """`held`'s work: returns with ``Resolved.live.lock`` acquired.

        A sync that finds the session moved on (another thread or process appended first)
        decides again with what it now holds; after repeated races the request gets a session
        of its own rather than an error.
        """
        messages = body["messages"]
        req = req or RequestHistory.of(body)
        if not req.ids:
            raise MalformedMessageError("messages", "must be a non-empty list")
        named = explicit is not None
        base = check_session_id(explicit) if explicit is not None else family_key(req.ids[0])
        for _ in range(8):
            with self._lock:
                chosen = self._choose(base, named, req, str(body.get("model") or ""))
                if isinstance(chosen, Decision):
                    return self._start(base, named, req, chosen, body)
            chosen.lock.acquire()
            try:
                new = chosen.session.sync(messages, identities=req.ids)
            except HistoryRewrittenError:
                chosen.lock.release()
                continue  # it moved on under us; what it holds now is decided on again
            except BaseException:
                chosen.lock.release()
                raise
            if new and self.max_bytes is not None:
                with self._lock:  # the session grew: the byte cap may let an older one go
                    self._trim()
            return Resolved(chosen, new, Decision("continue", chosen.sid, "extends", len(chosen.session)))
        with self._lock:
            return self._start(base, named, req, Decision("new", None, "no stored history settled after repeated "
                                                                       "concurrent appends"), body)

    def _choose(self, base: str, named: bool, req: RequestHistory, model: str = "") -> Live | Decision:
        """The live session to continue, or the decision to start one. Memory first; the store's
        members of the family (another process's, or ones this process let go) when memory has
        no session to continue. Caller holds ``_lock``."""
        members = [self._live[k] for k in self._family(base, stored=False)]
        failed = frozenset(x.sid for x in members if x.failed)
        d = decide(req, members, named=named, failed=failed)
        if d.kind not in ("continue", "retry") and self.store is not None:
            unloaded = [k for k in self._family(base, stored=True) if k not in self._live and k not in self._not_ours]
            if unloaded:
                for sid in unloaded:
                    self._load(sid, model)
                members = [x for k in self._family(base, stored=False) if (x := self._live.get(k)) is not None]
                d = decide(req, members, named=named, failed=failed)
        if d.kind == "continue":
            assert d.target is not None
            live = self._live[d.target]
            self._live.move_to_end(d.target)
            return live
        return d

    def _start(self, base: str, named: bool, req: RequestHistory, d: Decision, body: dict[str, Any]) -> Resolved:
        """Create the session ``d`` asks for and sync it before anyone else can see it. Caller
        holds ``_lock``; returns with the new session's lock held (`held`)."""
        if d.kind == "retry":
            return self._take_over(base, named, req, d, body)
        link = {"session": d.target, "reason": d.reason, "at": d.at} if d.target is not None else None
        taken = set(self._family(base, stored=True))
        for _ in range(100):
            sid = new_id(base, d.kind, named, taken)
            try:
                live = self.maker.create(sid, body, link)
                break
            except SessionExistsError:  # another process took it: the next number
                taken.add(sid)
        else:
            raise SessionExistsError(f"could not find a free session id in the family of {base}")
        parent = self._live.get(d.target) if d.target is not None else None
        if parent is not None and d.kind == "segment":
            live.forensics = parent.forensics.fork()  # compared with the request before it
        return self._adopt(live, body, req, d)

    def _adopt(self, live: Live, body: dict[str, Any], req: RequestHistory, d: Decision) -> Resolved:
        """A session just made, synced with the request's history before anyone else can see
        it, and remembered; returned with its lock held for the caller (`held`)."""
        live.lock.acquire()  # nobody else knows it yet: uncontended
        try:
            new = live.session.sync(body["messages"], identities=req.ids)
        except BaseException:
            live.lock.release()
            raise
        self._remember(live.sid, live)
        return Resolved(live, new, d)

    def _take_over(self, base: str, named: bool, req: RequestHistory, d: Decision, body: dict[str, Any]) -> Resolved:
        """A client's retry of a turn that got no answer (`decide`'s ``retry``): the session made
        for the failed attempt is made again, under its id and link, from this request. The model
        never saw the attempt, so nothing of it is fixed: its transcript and any edits planned for
        it go; the proxy's records of its requests (``observation`` events) stay, and a
        ``retried`` event says what was replaced. A session another request holds, or one that
        has been answered meanwhile, is not taken over: the request is decided without it."""
        assert d.target is not None
        old = self._live.get(d.target)
        if old is None or not old.lock.acquire(blocking=False):
            return self._start(base, named, req, self._without(base, named, req), body)
        try:
            if not old.failed:
                return self._start(base, named, req, self._without(base, named, req), body)
            sid, link, replaced = old.sid, old.session.link, len(old.session)
            kept: list[dict[str, Any]] = []
            if self.store is not None:
                try:
                    kept = [e for e in self.store.open(sid).read_events() if e.get("kind") == "observation"]
                    self.store.delete(sid)  # the attempt never reached the model: nothing stored of it is a record
                except (StoreError, OSError):  # left as it is: the request is decided without it
                    return self._start(base, named, req, self._without(base, named, req), body)
            del self._live[sid]
        finally:
            old.lock.release()
        live = self.maker.create(sid, body, link)
        for e in kept:
            live.session.log_event(e)
        live.session.log_event({"kind": "retried", "time": time.time(), "reason": d.reason,
                                "detail": {"replaced_messages": replaced, "unanswered": old.unanswered,
                                           "common_messages": d.at}})
        return self._adopt(live, body, req, d)

    def _without(self, base: str, named: bool, req: RequestHistory) -> Decision:
        """The decision for ``req`` with no session taken over (the one it retries is in use, or
        was answered meanwhile): what `decide` says without the failed ones."""
        members = [self._live[k] for k in self._family(base, stored=False)]
        return decide(req, members, named=named)
