"""Which session a request belongs to, and that session live: the one rule, the live record
and its maker, and the registry that acts on the rule, in this order.

**The rule** (`decide`, for `wrap()`, compact mode and observe mode). A request is compared
with stored histories by the identity of **every** message (`transcript.message_hash`: forms
the API treats as one message have one identity), never by a sample. It is a pure function of
the request and the candidate histories of its *family* (the sessions under the request's name,
or, unnamed, the sessions whose first message is the request's first message):

1. **continue** the longest candidate whose whole history the request extends, when its tools
   and system prompt (the *head*) are the caller's (at equal length the same head wins);
2. **segment** when that candidate's head differs: the same conversation with a changed system
   prompt or tool list (reported as prefix churn). The immutable prefix never changes, so the
   new head needs a new session; it is linked to the one it continues;
3. **segment** when no candidate is extended but one has the same head: a rewrite of history
   (an agent redacted an old result; Claude Code compacted and now opens with its summary). It
   is linked to the candidate sharing the longest common prefix;
4. otherwise a new session: for a named request whose family holds only other heads, another
   agent under the same name (Claude Code's sub-agents share its session id), linked to the
   name's first session; for an unnamed one, simply a new conversation.

Whichever it is, the request that goes out is rendered from a history equal, message by
message, to what the caller sent. The adapters keep the candidates (live sessions, or the
proxy's observed ones) and act on the decision; nothing here does I/O.

**The maker** (`LiveMaker`) builds the live record (`Live`) of a new or a stored session: the
session over the store, the strategy built for its model and window with its summarizer, its
forensics and its scratchpad. It imports the compaction runtime inside its methods, so observe
mode, which uses the rule alone, never loads it (tests/test_guarantees.py checks what it loads).

**The registry** (`SessionRegistry`) keeps the candidates: sessions in memory, least recently
used first out, and the store's for the rest, so it serves one process or many replicas over a
shared store alike. It acts on the decision: it syncs the chosen session, or creates the new
one, syncs it before any other request can see it, and links it to the session it continues.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

import msgspec
import xxhash

from ..base.errors import (
    HistoryRewrittenError,
    InvalidSessionIdError,
    MalformedMessageError,
    SessionExistsError,
    SessionNotFoundError,
    UnknownModelError,
)
from ..base.headers import SESSION_HEADER
from ..base.pricing import UNKNOWN_MODEL_WINDOW, OwnPrices, model_prices, priced
from ..base.wire import canonical_bytes, plain
from ..cache.forensics import Forensics
from ..history.transcript import identity_of_bytes, message_hash
from ..store import Store, check_session_id

if TYPE_CHECKING:  # the compaction runtime: loaded by `LiveMaker` when it makes a session live
    from ..base.events import EventBus
    from ..cache.simulator import SimBlock
    from ..compaction.scratchpad import Scratchpad
    from ..compaction.strategy import Strategy, StrategyConfig
    from ..compaction.summarize.llm import Summarizer
    from ..history.session import Session
    from .options import EngineOptions

__all__ = ["Candidate", "Decision", "Live", "LiveMaker", "RequestHistory", "Resolved", "SessionRegistry",
           "SummarizerFactory", "decide", "family_key", "family_order", "head_key", "in_family", "model_window",
           "new_id", "session_hint"]

log = logging.getLogger("cachecompact")


# -- the rule -------------------------------------------------------------------------------------

Kind = Literal["continue", "segment", "agent", "new"]


def _unmarked_blocks(value: Any) -> Any:
    """A system prompt or tool list without ``cache_control`` markers, a string system prompt as
    one text block (the forms the API caches as the same prefix)."""
    if isinstance(value, str):
        return [{"type": "text", "text": value}] if value else value
    if isinstance(value, list):
        return [{k: v for k, v in x.items() if k != "cache_control"} if isinstance(x, dict) else x for x in value]
    return value


def head_key(tools: Any, system: Any) -> bytes:
    """Identity of a request's tools and system prompt (markers and string form ignored)."""
    tools = [plain(t) for t in tools] if isinstance(tools, list) else tools
    system = [plain(b) for b in system] if isinstance(system, list) else system
    return xxhash.xxh3_128_digest(canonical_bytes([_unmarked_blocks(tools or None), _unmarked_blocks(system)]))


def family_key(first: bytes) -> str:
    """The family of unnamed sessions that open with the message of identity ``first``:
    ``s_`` + 24 hex digits. Tools and system are not in it, so a changed system prompt is still
    found as the same conversation."""
    return "s_" + first.hex()[:24]


@dataclass(frozen=True, slots=True)
class RequestHistory:
    """A request's head and the identity of each of its messages, computed once per request."""

    head: bytes
    ids: list[bytes]

    @classmethod
    def of(cls, body: dict[str, Any]) -> RequestHistory:
        msgs = body.get("messages")
        ids = [message_hash(m) for m in msgs] if isinstance(msgs, list) else []
        return cls(head_key(body.get("tools"), body.get("system")), ids)

    @classmethod
    def of_bytes(cls, raw: bytes, body: dict[str, Any]) -> RequestHistory:
        """`of`, for a body that arrived as JSON ``raw`` (the proxy): each message's identity is
        looked up by the hash of the client's own bytes for it, and computed only for bytes not
        seen before."""
        try:
            spans = msgspec.json.decode(raw, type=_Messages).messages
        except (msgspec.DecodeError, msgspec.ValidationError):
            return cls.of(body)
        msgs = body.get("messages")
        if not isinstance(msgs, list) or len(msgs) != len(spans):
            return cls.of(body)
        return cls(head_key(body.get("tools"), body.get("system")),
                   [identity_of_bytes(s, m) for s, m in zip(spans, msgs, strict=True)])

    def fingerprint(self, *extra: Any) -> bytes:
        """xxh3-128 over the whole history (and ``extra``): equal exactly when the requests are."""
        h = xxhash.xxh3_128()
        h.update(self.head)
        h.update(b"".join(self.ids))  # one C call, not one per message
        h.update(canonical_bytes(list(extra)))
        return h.digest()


class _Messages(msgspec.Struct):
    """A request body's messages as the client's own bytes, one span each."""

    messages: list[msgspec.Raw]


class Candidate(Protocol):
    """A stored history the request may continue."""

    @property
    def sid(self) -> str: ...

    @property
    def head(self) -> bytes: ...

    @property
    def identities(self) -> Sequence[bytes]: ...


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do with a request: ``continue`` ``target``, or start a new session (``segment``,
    ``agent`` or ``new``) linked to ``target`` (None: linked to nothing). ``reason`` says why in
    words for events and the dashboard; ``at`` is the first message that differs from
    ``target`` (a rewrite), or its length."""

    kind: Kind
    target: str | None
    reason: str
    at: int = 0


def _extends(req: list[bytes], ids: Sequence[bytes]) -> bool:
    """Whether ``req`` starts with all of ``ids`` (the last one first: the cheap refusal)."""
    n = len(ids)
    if n > len(req) or (n and req[n - 1] != ids[n - 1]):
        return False
    return req[:n] == (ids if isinstance(ids, list) else list(ids))


def _common(req: list[bytes], ids: Sequence[bytes]) -> int:
    """Length of the common prefix of two histories."""
    n = min(len(req), len(ids))
    if _extends(req, ids[:n]):
        return n
    return next(i for i in range(n) if req[i] != ids[i])


def decide(req: RequestHistory, candidates: Iterable[Candidate], *, named: bool, fixed_head: bool = True) -> Decision:
    """The one rule (module docstring). ``candidates`` come in family order (the first session
    of the family first, the newest last, which breaks the remaining ties). ``fixed_head`` says
    whether a session's tools and system are fixed (a session with an immutable prefix); where
    they are not (the proxy's observe mode records requests and holds no prefix), a changed
    head continues the conversation and is reported there."""
    cands = list(candidates)
    best: Candidate | None = None
    for c in cands:
        ids = c.identities
        if not _extends(req.ids, ids) or (not ids and c.head != req.head):
            continue
        if best is None or len(ids) > len(best.identities) or \
                (len(ids) == len(best.identities) and (c.head == req.head or best.head != req.head)):
            best = c
    if best is not None:
        n = len(best.identities)
        if best.head == req.head or not fixed_head:
            return Decision("continue", best.sid, "extends", n)
        if n >= 2:  # a conversation under way: its tools or system prompt changed
            return Decision("segment", best.sid, "prefix_churn", n)
        # one message in common is only a shared opening: another agent, not this conversation
    same = [c for c in cands if c.head == req.head and c.identities]
    if same:  # the same agent with another history, if it kept some of it: a rewrite
        scored = [(_common(req.ids, c.identities), k, c) for k, c in enumerate(same)]
        kept = [x for x in scored if _rewrites(req.ids, x[2], x[0], named)]
        if kept:
            at, _, base = max(kept, key=lambda x: (x[0], x[1]))
            return Decision("segment", base.sid, "rewrite", at)
    if named and cands:
        why = ("another agent under this name (its tools or system differ)" if not same else
               "another agent under this name (same tools and system, none of a session's history kept)")
        return Decision("agent", cands[0].sid, why, 0)
    return Decision("new", None, "new conversation", 0)


def _is_agent(sid: str) -> bool:
    """Whether ``sid`` is another agent under a name (``<name>.a<n>``)."""
    tail = sid.rsplit(".", 1)[-1] if "." in sid else ""
    return tail[:1] == "a" and tail[1:].isdigit()


def _rewrites(req: list[bytes], c: Candidate, at: int, named: bool) -> bool:
    """Whether a request that parts from ``c`` at ``at`` is ``c``'s own history rewritten.

    - It kept ``c``'s newest message after the change (a redacted or cleared old result, a
      framework that summarised the middle and kept the recent turns): a rewrite, named or not.
    - Under a name, on the owner's line (not a sub-agent's ``.aN``): Claude Code's own compaction
      opens with its summary (nothing in common, ``at`` 0), and a rewind goes back to an earlier
      turn of the same conversation (more than the opening in common).
    - Otherwise it shares only what every agent of the family shares, the opening message (and,
      under a name, a sub-agent's tools and system): another agent, not this conversation.
      Independent agents with the same first message are separate conversations, and a
      sub-agent of the same kind as an earlier one is another ``.aN``."""
    ids = c.identities
    if ids[-1] in req[at:]:
        return True
    return named and not _is_agent(c.sid) and at != 1


def in_family(sid: str, base: str) -> bool:
    """Whether ``sid`` is ``base`` or one of its numbered sessions (``base.2``, ``base.s3``, ``base.a1``)."""
    if sid == base:
        return True
    if not sid.startswith(base + "."):
        return False
    tail = sid[len(base) + 1:]
    return tail.isdigit() or (tail[:1] in ("s", "a") and tail[1:].isdigit())


def new_id(base: str, kind: Kind, named: bool, taken: set[str]) -> str:
    """The first free id for a new session of ``base``'s family: ``base`` itself, then
    ``base.s<n>`` for a segment and ``base.a<n>`` for another agent of a named session, and
    ``base.<n>`` for an unnamed one."""
    if base not in taken:
        return base
    sep = "." if not named else (".a" if kind == "agent" else ".s")
    n = 2
    while f"{base}{sep}{n}" in taken:
        n += 1
    return f"{base}{sep}{n}"


def family_order(sid: str) -> tuple[int, str]:
    """Members of a family in number order (``x``, ``x.2``, ``x.10``; ``x.s2``, ``x.s10``)."""
    tail = sid.rsplit(".", 1)[-1].lstrip("sa") if "." in sid else ""
    return (int(tail) if tail.isdigit() else 0, sid)


def session_hint(headers: Mapping[str, str], body: Any) -> str | None:
    """The session a request names: the ``x-cachecompact-session`` header, else the client's own
    session metadata (Claude Code sends ``metadata.user_id``, a JSON string with ``session_id``).
    Raises `InvalidSessionIdError` for a header that could name a path."""
    h = headers.get(SESSION_HEADER)
    if h is not None:
        return check_session_id(h, SESSION_HEADER)
    meta = body.get("metadata") if isinstance(body, dict) else None
    uid = meta.get("user_id") if isinstance(meta, dict) else None
    if isinstance(uid, str) and uid.startswith("{"):
        try:
            sid = json.loads(uid).get("session_id")
        except (json.JSONDecodeError, AttributeError):
            return None
        if isinstance(sid, str):
            try:
                return check_session_id("cc-" + sid[:100], "metadata.user_id.session_id")
            except InvalidSessionIdError:
                return None
    return None


# -- the live record and its maker ---------------------------------------------------------------

SummarizerFactory = Callable[[str | None, str], "Summarizer"]  # (model or None: the agent's, mode) -> summarizer


@dataclass(slots=True, eq=False)
class Live:
    """A session in memory with what the engine keeps beside it, each field typed and named (no
    bag of keys): the engine writes them, and the registry only hands a new segment its
    parent's forensics."""

    session: Session
    strategy: Strategy
    head: bytes  # `head_key` of the caller's tools and system the session was made for
    forensics: Forensics  # compares each request with the one before it in this conversation
    scratchpad: Scratchpad | None = None  # the one the levels write to (an in-memory session's folder)
    lock: threading.Lock = field(default_factory=threading.Lock)
    last_message_id: str | None = None  # the last response's id (the diagnostics' previous_message_id)
    requests_seen: int = 0  # request records this process has applied (`CompactionEngine._catch_up`)
    told_ttl: bool = False  # the caller's 1-hour markers were said to be replaced (once per session)
    sim_memo: dict[tuple[bytes, int], tuple[list[SimBlock], bool]] = field(default_factory=dict)  # priced blocks

    @property
    def sid(self) -> str:
        return self.session.session_id

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

    def summarizer_for(self, model: str | None) -> Summarizer:
        """The summarizer a session on ``model`` gets: the caller's, or one made for the strategy's summary model."""
        from ..compaction.summarize.llm import ExtractiveSummarizer, Summarizer

        s = self._summarizer
        if s is None:
            return ExtractiveSummarizer()
        if isinstance(s, Summarizer):
            return s
        cfg = self.strategy_config
        return s(cfg.summary_model or model, cfg.summary_mode)

    def _live(self, session: Session, body: dict[str, Any], caller_head: bytes) -> Live:
        """The live record: the strategy built for the session's model and window, fresh forensics."""
        from ..compaction.scratchpad import Scratchpad
        from ..compaction.strategy import StrategyContext

        model = str(body.get("model") or "")
        own = model_window(model, self.options.prices)
        window = self.window_tokens or own
        if window > own and (model, window) not in _LARGER_WARNED:
            _LARGER_WARNED.add((model, window))  # compaction would wait for room the model does not have
            log.warning("cachecompact: window_tokens=%d is larger than %s's context window (%d tokens); the API "
                        "will refuse requests before compaction starts", window, model or "the model", own)
        ctx = StrategyContext(session=session, summarizer=self.summarizer_for(model or None), events=self.events,
                              window_tokens=window, scratchpad=Scratchpad.for_session(session),
                              scratchpad_tool=self.options.scratchpad_tool, prices=self.options.prices)
        prices = self.options.prices
        return Live(session=session, strategy=self.strategy_config.build(ctx), head=caller_head,
                    forensics=Forensics(lambda m: priced(m, prices)), scratchpad=ctx.scratchpad)

    def create(self, sid: str, body: dict[str, Any], link: dict[str, Any] | None) -> Live:
        """A new session ``sid`` in the store for the request ``body`` (`SessionExistsError` if taken)."""
        from ..compaction.scratchpad import READ_SCRATCHPAD_TOOL
        from ..history.session import Session

        tools = list(body.get("tools") or [])
        if self.options.scratchpad_tool:
            tools.append(READ_SCRATCHPAD_TOOL)
        model = str(body.get("model") or "")
        ratio = priced(model, self.options.prices).token_ratio if model else 1.0
        prefix = self.options.prefix_messages if self.options.prefix_messages is not None else \
            self.strategy_config.prefix_messages
        session = Session.create(self.store, session_id=sid, system=body.get("system"), tools=tools,
                                 prefix_messages=prefix, token_ratio=ratio, link=link)
        return self._live(session, body, head_key(body.get("tools"), body.get("system")))

    def open(self, sid: str) -> Live:
        """The stored session ``sid``, live (`SessionNotFoundError` if there is none)."""
        from ..compaction.scratchpad import READ_SCRATCHPAD_TOOL
        from ..history.session import Session

        assert self.store is not None
        session = Session.open(self.store, sid)
        tools = session.tools_param
        if self.options.scratchpad_tool and tools and tools[-1].get("name") == READ_SCRATCHPAD_TOOL["name"]:
            tools = tools[:-1]
        body = {"model": (session.last_request or {}).get("model", ""), "tools": tools or None,
                "system": session.system_param}
        return self._live(session, body, head_key(tools or None, session.system_param))


_UNKNOWN_WARNED: set[str] = set()  # models whose window was assumed, said once each
_LARGER_WARNED: set[tuple[str, int]] = set()  # (model, window_tokens) said to exceed the model's window


def model_window(model: str, own: OwnPrices | None = None) -> int:
    """The model's context window from the price table (its family's for a newer id); for a name
    of no known family, `UNKNOWN_MODEL_WINDOW`, said once per name."""
    try:
        return model_prices(model, own=own).context_window if model else UNKNOWN_MODEL_WINDOW
    except UnknownModelError:
        if model not in _UNKNOWN_WARNED:
            _UNKNOWN_WARNED.add(model)
            log.warning("cachecompact: model %r is not in the price table; assuming a %d-token context window "
                        "(pass window_tokens=... to set it)", model, UNKNOWN_MODEL_WINDOW)
        return UNKNOWN_MODEL_WINDOW


# -- the registry --------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Resolved:
    """A request's session, the transcript indices its sync appended, and the decision taken."""

    live: Live
    new: list[int]
    decision: Decision


class SessionRegistry:
    """Resolves requests to sessions and keeps them live; thread-safe."""

    def __init__(self, store: Store | None, maker: LiveMaker, *, keep: int = 512) -> None:
        self.store = store
        self.maker = maker  # new and stored sessions come from it, already live
        self._keep = keep
        self._live: OrderedDict[str, Live] = OrderedDict()
        self._lock = threading.Lock()

    def sessions(self) -> list[Live]:
        with self._lock:
            return list(self._live.values())

    def get(self, sid: str) -> Live | None:
        with self._lock:
            return self._live.get(sid)

    def _remember(self, sid: str, live: Live) -> Live:
        self._live[sid] = live
        self._live.move_to_end(sid)
        while len(self._live) > self._keep:
            self._live.popitem(last=False)
        return live

    def _load(self, sid: str) -> Live | None:
        live = self._live.get(sid)
        if live is not None:
            self._live.move_to_end(sid)
            return live
        if self.store is None:
            return None
        try:
            return self._remember(sid, self.maker.open(sid))
        except SessionNotFoundError:
            return None

    def _family(self, base: str, stored: bool) -> list[str]:
        """Ids of ``base``'s family in number order: live ones, and with ``stored`` the store's too."""
        ids = {k for k in self._live if in_family(k, base)}
        if stored and self.store is not None:
            ids |= {k for k in self.store.list(base) if in_family(k, base)}
        return sorted(ids, key=family_order)

    # -- resolution ----------------------------------------------------------------------------------

    def resolve(self, body: dict[str, Any], explicit: str | None = None,
                req: RequestHistory | None = None) -> Resolved:
        """The live session this request continues (`decide`), synced with its history.

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
                chosen = self._choose(base, named, req)
                if isinstance(chosen, Decision):
                    return self._start(base, named, req, chosen, body)
            with chosen.lock:
                try:
                    new = chosen.session.sync(messages, identities=req.ids)
                except HistoryRewrittenError:
                    continue  # it moved on under us; what it holds now is decided on again
                return Resolved(chosen, new, Decision("continue", chosen.sid, "extends", len(chosen.session)))
        with self._lock:
            return self._start(base, named, req, Decision("new", None, "no stored history settled after repeated "
                                                                       "concurrent appends"), body)

    def _choose(self, base: str, named: bool, req: RequestHistory) -> Live | Decision:
        """The live session to continue, or the decision to start one. Memory first; the store's
        members of the family (another process's, or ones this process let go) when memory has
        no session to continue. Caller holds ``_lock``."""
        members = [self._live[k] for k in self._family(base, stored=False)]
        d = decide(req, members, named=named)
        if d.kind != "continue" and self.store is not None:
            unloaded = [k for k in self._family(base, stored=True) if k not in self._live]
            if unloaded:
                for sid in unloaded:
                    self._load(sid)
                members = [x for k in self._family(base, stored=False) if (x := self._live.get(k)) is not None]
                d = decide(req, members, named=named)
        if d.kind == "continue":
            assert d.target is not None
            live = self._live[d.target]
            self._live.move_to_end(d.target)
            return live
        return d

    def _start(self, base: str, named: bool, req: RequestHistory, d: Decision, body: dict[str, Any]) -> Resolved:
        """Create the session ``d`` asks for and sync it before anyone else can see it. Caller
        holds ``_lock``."""
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
        with live.lock:
            new = live.session.sync(body["messages"], identities=req.ids)
        self._remember(sid, live)
        return Resolved(live, new, d)
