"""The extension point: a `Strategy` decides one session's compaction, a `StrategyConfig` builds it.

Draft in, plan out (issue 49). A strategy is built with a `StrategyContext` whose ``draft`` is
the session as it may see it (`history.draft.Draft`): the transcript and ledger to read, renders
and counts, and two ways to propose, ``stage`` (a ledger edit) and ``keep`` (scratchpad content).
It never holds the `Session` or its store. The middleware (or the proxy) calls it around every
request of its session:

* `before_request` runs with the session synced to the agent's history, before the request
  is rendered; it plans against the draft and returns a `Plan`: the edits it staged, the
  scratchpad content it kept, the TTLs and beta headers the request is rendered and sent with,
  its events and "context full". The request cycle then has the session store the content
  and the edits together (`Session.commit`); no strategy writes;
* `after_response` gets the request time and the usage the API reported;
* `reactive` runs after a prompt-too-long error and returns whether it freed enough (its
  staged edits are stored the same way; the request keeps the TTLs and betas of its plan);
* the request body is rendered from transcript + ledger. A strategy that edits the caller's
  body directly instead (a sliding window, server-side clearing) is a `BodyShaper`: the second
  protocol, whose `shape` rewrites the body the caller sent; the beta headers its body needs
  follow from what the body carries (`history.thinking.betas_for_body`). Which of the two a
  strategy is follows from its type, once, when its session is made (`shaper_of`); no flag says it.

Two capabilities stay optional, because they are things a strategy does, not answers the engine
asks it for: `StatefulStrategy` (its state travels with the session's request records) and
`CompactsIdle` (it acts while the session is quiet).

Every summarizing strategy summarises a range with `summarize_range`, so the same range gets
the same input whoever asks; only the decisions differ. Each strategy has its own frozen
config class with a ``build(ctx)`` method, in the manner of the OpenHands condensers, and is
registered by name in `cachecompact.compaction.catalog`.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

import msgspec

from ..base.events import Event, EventBus
from ..base.person import person_text
from ..base.pricing import ModelInfo
from ..base.values import TTL, IdleDecision, SummaryMode
from ..base.wire import TextBlock, content_blocks, message_to_dict
from ..history.draft import Draft
from ..history.ledger import LedgerEntry, ReplaceWithSummary, widen_to_pairs
from ..history.session import Session
from .levels.working_set import WORKING_SET_HEADER
from .summarize.extractive import request_head
from .summarize.llm import (
    STORED_HEADER,
    Summarizer,
    SummaryRequest,
    SummaryResult,
    format_summary,
    open_issues_of,
    stored_outputs,
)

__all__ = [
    "BodyShaper",
    "CompactsIdle",
    "KnowsClient",
    "LedgerStrategy",
    "Plan",
    "StatefulStrategy",
    "Strategy",
    "StrategyConfig",
    "StrategyContext",
    "TurnReport",
    "latest_request",
    "shaper_of",
    "summarize_range",
    "summary_request",
    "task_goal",
]

log = logging.getLogger("cachecompact")


@dataclass(slots=True)
class Plan:
    """What a strategy decided for one request, as data.

    ``entries``: the ledger edits it staged (`Draft.stage`); ``blobs``: the scratchpad content it
    kept (`Draft.keep`), by reference. The request cycle has the session store both together
    after the strategy returns, and fills these lists in when a strategy left them empty.
    ``ttl`` and ``prefix_ttl``: the cache TTLs its breakpoints are rendered with (None: the API's
    default, 5 minutes; a caller's own ``ttl=`` wins); ``betas``: ``anthropic-beta`` values the
    request needs beyond those its body shows. ``events``, the tokens before and after, and, when
    even its last resort cannot fit the request, why (``context_full``: the message the adapter
    gives the caller as its transport's error)."""

    tokens_before: int
    tokens_after: int
    events: list[Event] = field(default_factory=list)
    entries: list[LedgerEntry] = field(default_factory=list)
    context_full: str | None = None
    ttl: TTL | None = None
    prefix_ttl: TTL | None = None
    betas: tuple[str, ...] = ()
    blobs: dict[str, bytes] = field(default_factory=dict)


#: The 0.2 name of `Plan`, kept until 0.4.
TurnReport = Plan


@runtime_checkable
class Strategy(Protocol):
    """A strategy that compacts through the session's ledger: the request body is rendered from
    transcript + ledger, so every edit is hashed, audited and rendered the same way."""

    def before_request(self, now: float, model: str, max_tokens: int = 0,
                       params: dict[str, Any] | None = None) -> Plan: ...

    def after_response(self, now: float, usage: dict[str, Any] | None = None) -> None: ...

    def reactive(self, reported_tokens: int, limit: int, now: float, model: str, max_tokens: int = 0) -> bool: ...


@runtime_checkable
class BodyShaper(Strategy, Protocol):
    """A strategy that rewrites the caller's request body itself instead of keeping a ledger
    (the peers that model a sliding window or the API's own context editing): `shape` gets the
    caller's whole body and returns the one to send."""

    def shape(self, body: dict[str, Any]) -> dict[str, Any]: ...


class _PassThrough:
    """A 0.3 strategy with ``renders = False`` and no ``shape`` of its own (it inherited
    `LedgerStrategy`'s, which passed the body through): the body goes as the caller sent it."""

    def __init__(self, strategy: Strategy) -> None:
        self.strategy = strategy

    def before_request(self, now: float, model: str, max_tokens: int = 0,
                       params: dict[str, Any] | None = None) -> Plan:
        return self.strategy.before_request(now, model, max_tokens, params)

    def after_response(self, now: float, usage: dict[str, Any] | None = None) -> None:
        self.strategy.after_response(now, usage)

    def reactive(self, reported_tokens: int, limit: int, now: float, model: str, max_tokens: int = 0) -> bool:
        return self.strategy.reactive(reported_tokens, limit, now, model, max_tokens)

    def shape(self, body: dict[str, Any]) -> dict[str, Any]:
        return body


_TOLD: set[type] = set()  # strategy classes told about the 0.3 flag (once each)


def _tell(cls: type, why: str) -> None:
    """A `DeprecationWarning`, and the same once in the log: the warning is raised deep inside a
    request, where Python's default filters would hide it from the strategy's author."""
    warnings.warn(why, DeprecationWarning, stacklevel=3)
    if cls not in _TOLD:
        _TOLD.add(cls)
        log.warning("cachecompact: %s", why)


def shaper_of(strategy: Strategy) -> BodyShaper | None:
    """The strategy as a `BodyShaper`, or None when the body is rendered from its ledger; asked
    once, when a session is made.

    A 0.3 strategy said which it was with a ``renders`` flag, and `LedgerStrategy` carried an
    identity ``shape``; both are still read until 0.4, with a `DeprecationWarning`: ``renders =
    True`` renders even with a ``shape`` method, ``renders = False`` shapes (passing the body
    through if it has no ``shape`` of its own), and a `LedgerStrategy` subclass with its own
    ``shape`` but no flag renders, as it did in 0.3."""
    cls = type(strategy)
    renders = getattr(strategy, "renders", None)
    if isinstance(renders, bool):
        _tell(cls, f"{cls.__name__}.renders is read until 0.4: a strategy that rewrites the body implements "
                   "BodyShaper (a shape method); one that renders from the ledger has no shape method")
        if renders:
            return None
        return strategy if isinstance(strategy, BodyShaper) else _PassThrough(strategy)
    if isinstance(strategy, LedgerStrategy) and isinstance(strategy, BodyShaper):
        _tell(cls, f"{cls.__name__}.shape is ignored until 0.4, as in 0.3 (a LedgerStrategy renders from its "
                   "ledger); set renders = False to shape the body, or remove shape")
        return None
    return strategy if isinstance(strategy, BodyShaper) else None


# -- optional capabilities: a strategy without them still qualifies; the engine uses them where
# a strategy has them (isinstance, so a type checker sees the contract). What a request is
# rendered and sent with (TTLs, betas) is not one of them: it travels in the `Plan`.

@runtime_checkable
class StatefulStrategy(Protocol):
    """A strategy whose next decision depends on more than the session: its `state` is stored
    with each request record, and a replica (or a restarted process) that picks the session up
    continues from it with `load_state`, deciding exactly as this one would have."""

    def state(self) -> dict[str, Any]: ...

    def load_state(self, state: dict[str, Any]) -> None: ...


@runtime_checkable
class KnowsClient(Protocol):
    """A strategy that plans by what the adapter knows of the client sending the session's
    requests: ``lowers`` is True when the client lowers max_tokens on the API's 400 for it
    ("input length and `max_tokens` exceed context limit"), as Claude Code does, and None when
    the adapter does not know (the proxy reads it from the User-Agent, `adapters.proxy._clients`).
    Told before each request is decided."""

    def client_lowers_reserve(self, lowers: bool | None) -> None: ...


@runtime_checkable
class CompactsIdle(Protocol):
    """A strategy that acts while its session is quiet: cachecompact's priced summary before the
    cache expires (`compaction.idle`), or a peer's on its own clock (Claude Code's ~55 minutes).

    ``idle_due`` says when it wants to decide in the current quiet period (None: it will not);
    ``idle`` decides then. ``body`` is the session's last request as it was sent (its cached
    prefix is what a warm summary reads), ``max_tokens`` its own; ``away_s`` how long the caller
    says it will be away, if it knows. The edits wait for the next request, which appends and
    renders them: the response to the last request, not yet in the transcript, was made before them."""

    def idle(self, now: float, model: str, max_tokens: int, body: dict[str, Any] | None, *,
             away_s: float | None = None) -> IdleDecision: ...

    def idle_due(self) -> float | None: ...


@dataclass(slots=True, init=False)
class StrategyContext:
    """What a strategy is built with: the session as it may see it (``draft``), never the
    `Session` itself, so nothing a strategy does reaches the store.

    The 0.2 spellings are read until 0.4, with a `DeprecationWarning`: a `Session` given as the
    draft (``StrategyContext(session, ...)`` or ``session=``) is wrapped in its `Draft`, and
    ``scratchpad=`` is ignored (kept content travels in the plan now)."""

    draft: Draft
    summarizer: Summarizer
    events: EventBus
    window_tokens: int  # the context window the strategy must respect
    scratchpad_tool: bool  # the agent's requests carry the read_scratchpad tool
    prices: Mapping[str, ModelInfo] | None  # the client's own price entries (wrap(pricing=...))

    def __init__(self, draft: Draft | None = None, summarizer: Summarizer | None = None,
                 events: EventBus | None = None, window_tokens: int | None = None, scratchpad_tool: bool = False,
                 prices: Mapping[str, ModelInfo] | None = None, *, session: Session | None = None,
                 scratchpad: object = None) -> None:
        given: Draft | Session | None = draft if draft is not None else session
        if isinstance(given, Session):
            _tell(type(self), "StrategyContext(session=...) is read until 0.4: pass draft=Draft(session)")
            given = Draft(given)
        if given is None or summarizer is None or events is None or window_tokens is None:
            raise TypeError("StrategyContext needs draft, summarizer, events and window_tokens")
        if scratchpad is not None:
            _tell(type(self), "StrategyContext(scratchpad=...) is ignored until 0.4 and refused after: a "
                              "strategy keeps content with Draft.keep, and the session stores it")
        self.draft, self.summarizer, self.events = given, summarizer, events
        self.window_tokens, self.scratchpad_tool, self.prices = window_tokens, scratchpad_tool, prices

    @property
    def session(self) -> Draft:
        """The 0.2 name of ``draft`` (read until 0.4). It was the `Session`; it is the `Draft`
        now, which reads alike and proposes with ``stage`` instead of writing with ``edit``."""
        _tell(type(self), "StrategyContext.session is read until 0.4: it is the Draft now (ctx.draft); a "
                          "strategy proposes edits with draft.stage and returns them in its Plan")
        return self.draft


class StrategyConfig(Protocol):
    """A strategy's settings; frozen, with defaults, registered by name."""

    name: ClassVar[str]
    prefix_messages: int  # immutable prefix size in messages for sessions it manages
    summary_model: str | None  # model its summaries use (None: the agent's own model)
    summary_mode: SummaryMode  # see LLMSummarizer

    def build(self, ctx: StrategyContext) -> Strategy: ...


def _person(draft: Draft, i: int) -> str:
    t = draft.transcript
    if t[i].role != "user" or t.is_tool_result_message(i):
        return ""
    return person_text(message_to_dict(t[i]))


def task_goal(draft: Draft) -> str:
    """The task goal every summary must keep: what a person wrote in the first message that holds
    their words (`base.person`: not a client's ``<system-reminder>``); else the text of the first
    user message, as a client without a person sends it."""
    if not len(draft):
        return ""
    for i in range(len(draft)):
        text = _person(draft, i)
        if text:
            return text
    blocks = content_blocks(draft.transcript[0])
    return "\n".join(b.text for b in blocks if isinstance(b, TextBlock) and b.text).strip()


def latest_request(draft: Draft) -> tuple[int, str] | None:
    """The newest message a person wrote in, and its words (`base.person.person_text`), when it
    is not the one the task goal comes from: the request the agent works on now, which every
    edit that covers it must carry word for word (issue 62). None before a second request."""
    first = next((i for i in range(len(draft)) if _person(draft, i)), None)
    for i in range(len(draft) - 1, -1, -1):
        if first is not None and i <= first:
            return None
        text = _person(draft, i)
        if text:
            return i, text
    return None


def summary_request(draft: Draft, start: int, end: int, *, body: dict[str, Any] | None = None,
                    cache_warm: bool = False, at: float | None = None) -> SummaryRequest:
    """What a summary of transcript messages ``start..end`` is asked with: the rendered view of
    the range, the task goal, the person's latest request when the range covers it, and the open
    issues of a summary starting at ``start`` that the new one replaces (also what a summary's
    price is estimated from, before it is made)."""
    r = draft.render(breakpoints=False)
    msgs = r.messages_in(start, end)
    prev = next((e for e in draft.ledger.effective() if e.kind == "summary" and e.start == start
                 and e.tool_use_id is None), None)
    latest = latest_request(draft)
    return SummaryRequest(messages=msgs, goal=task_goal(draft),
                          previous_open_issues=open_issues_of(prev.summary or "") if prev else [],
                          range=(start, end), body=body, cache_warm=cache_warm, at=at,
                          latest_request=request_head(latest[1]) if latest is not None and start <= latest[0] <= end
                          else "")


def summarize_range(draft: Draft, start: int, end: int, summarizer: Summarizer, *, reason: str,
                    body: dict[str, Any] | None = None, cache_warm: bool = False,
                    verbatim: Sequence[str] = (), at: float | None = None) -> tuple[ReplaceWithSummary, SummaryResult]:
    """Summarise transcript messages ``start..end`` as they render now.

    The one range summarizer (its input: `summary_request`). ``verbatim``: lines the caller
    keeps beside the summary, word for word (the compactor's working set, `levels.working_set`);
    the summarizer never sees or changes them.
    """
    req = summary_request(draft, start, end, body=body, cache_warm=cache_warm, at=at)
    res = summarizer.summarize(req)
    return summary_edit(req, res, reason=reason, verbatim=verbatim), res


def summary_edit(req: SummaryRequest, res: SummaryResult, *, reason: str,
                 verbatim: Sequence[str] = ()) -> ReplaceWithSummary:
    """The edit a summarizer's answer ``res`` to ``req`` makes (`summarize_range`'s second half:
    also what a summary made in the background becomes when it lands)."""
    start, end = req.range
    if req.latest_request and res.summary.latest_request != req.latest_request:
        # the person's newest request goes on word for word, whatever the summarizer made of it
        res.summary = msgspec.structs.replace(res.summary, latest_request=req.latest_request)
    text = format_summary(res.summary)
    stored = stored_outputs(req.messages)
    if stored:
        text += f"\n{STORED_HEADER}\n" + "\n".join(f"- {x}" for x in stored)
    if verbatim:
        text += f"\n{WORKING_SET_HEADER}\n" + "\n".join(verbatim)
    return ReplaceWithSummary(start, end, text, reason)


class LedgerStrategy:
    """Plumbing for strategies that compact through the session's ledger."""

    def __init__(self, ctx: StrategyContext) -> None:
        self.ctx = ctx
        self.draft = ctx.draft
        self.summarizer = ctx.summarizer
        self.events = ctx.events
        self.summary_cost = 0.0
        self.last_request_at: float | None = None

    @property
    def session(self) -> Draft:
        """The 0.2 name of ``draft`` (read until 0.4): the `Draft` a strategy plans against."""
        _tell(type(self), f"{type(self).__name__}.session is read until 0.4: use self.draft (a Draft, which "
                          "proposes edits with stage)")
        return self.draft

    @session.setter
    def session(self, value: Draft | Session) -> None:
        """A 0.2 subclass that set ``self.session = ctx.session`` itself (read until 0.4)."""
        _tell(type(self), f"{type(self).__name__}.session is set until 0.4: use self.draft")
        self.draft = Draft(value) if isinstance(value, Session) else value

    def _emit(self, kind: str, **kw: Any) -> Event:
        return self.events.emit(Event(kind=kind, session_id=self.draft.session_id, **kw))

    def _tokens(self) -> int:
        return self.draft.counter.calibrated(self.draft.render(breakpoints=False).raw_tokens)

    def _summarize(self, start: int, end: int, level: str, reason: str, *, body: dict[str, Any] | None = None,
                   cache_warm: bool = False) -> list[int]:
        """Summarise (widened to whole tool pairs) and append, or record a failure event: the
        peers' simple failure handling."""
        span = widen_to_pairs(self.draft.transcript, start, end)
        if span is None or span[1] < span[0] or span[0] < (self.draft.prefix_end or 0):
            return []
        start, end = span
        before = self._tokens()
        t0 = time.perf_counter()
        try:
            edit, res = summarize_range(self.draft, start, end, self.summarizer, reason=reason, body=body,
                                        cache_warm=cache_warm)
            entry = self.draft.stage(edit, level=level)
        except Exception as err:  # a peer's summarizer or edit failed: count it and go on
            self._emit("failure", level=level, reason=f"{type(err).__name__}: {err}",
                       cost_usd=getattr(err, "cost_usd", 0.0))
            self.summary_cost += getattr(err, "cost_usd", 0.0)
            return []
        self.summary_cost += res.cost_usd
        self._emit("compaction", level=level, reason=reason, tokens_before=before, tokens_after=self._tokens(),
                   cost_usd=res.cost_usd, duration_s=time.perf_counter() - t0, entries=[entry.seq])
        return [entry.seq]

    def after_response(self, now: float, usage: dict[str, Any] | None = None) -> None:
        self.last_request_at = now
