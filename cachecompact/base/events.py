"""Structured events (compactions, deferrals, failures, cache breaks) and their delivery.

Callbacks get every event; a failing callback is logged and never breaks compaction. When
``opentelemetry-api`` is installed, events are also added to the current span (later issue).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["WARNING_KINDS", "Event", "EventBus", "summary_cost"]

# what a user must hear about: failures, a full context, a planning bug, a burst of repeated calls;
# compactions are INFO, a cache miss is logged at the level its class deserves (see middleware)
WARNING_KINDS = frozenset({"failure", "breaker_open", "context_full", "refused", "repeated_tool_calls",
                           "first_compaction"})

log = logging.getLogger("cachecompact")

# the events that carry what cachecompact's own calls cost (`summary_cost`)
_SPENDING_KINDS = frozenset({"compaction", "failure", "idle_summary"})
_SPENDING_LEVELS = frozenset({"L3", "L4", "seed", None})


def summary_cost(event: Event | Mapping[str, Any]) -> float:
    """What cachecompact's own calls cost, as ``event`` (an `Event` or its stored dict) records
    them: the summaries it made and the API wrote for it (on-demand compaction), failed ones
    included, at the level they were made for. The one rule `report`, the proxy's dashboard and
    ``/metrics`` add a session's summary calls by, so their totals agree; 0 for any other event
    (a ``cache_miss``'s ``cost_usd`` is what the miss wasted, not a call)."""
    kind: Any
    level: Any
    cost: Any
    if isinstance(event, Event):
        kind, level, cost = event.kind, event.level, event.cost_usd
    else:
        kind, level, cost = event.get("kind"), event.get("level"), event.get("cost_usd")
    if kind not in _SPENDING_KINDS or level not in _SPENDING_LEVELS:
        return 0.0
    return float(cost or 0.0)

_otel_trace: Any
try:  # the optional [otel] extra: events also become span events (Langfuse, LangSmith, ...)
    from opentelemetry import trace as _otel_trace
except ImportError:  # pragma: no cover - depends on the environment
    _otel_trace = None


@dataclass(slots=True)
class Event:
    """One thing that happened to a session's context.

    ``kind``: compaction | externalized | deferred | failure | refused | breaker_open |
    context_full | max_tokens_over (the prompt fits the window but not beside the request's
    ``max_tokens``: sent as it is, so the API's own 400, which clients recover from, decides) |
    repeated_tool_calls | cache_miss | compaction_rewrite (the request after one of
    our own compactions re-wrote the cache from the edit on: paid on purpose, priced as the written
    tokens times write minus read; never a ``cache_miss``) | skipped | recent_budget | restored (lines of
    hidden output a call named, given back beside its result) | first_compaction (the first
    request of a session changed a history the caller brought: said once, a warning) |
    idle_summary (a quiet session was summarized on its warm cache before it expired; its edits
    come with the next request's ``compaction`` event, which carries ``detail={"idle": True}``) |
    idle_declined (an idle decision that did not fire, with its reason: the proxy's scheduler
    decides unseen, so the session's log says why) |
    window_too_small (the reach the agent's look-backs ask for does not fit the window beside the
    prefix, a summary and one turn: ``detail`` names the numbers; said once, and again whenever
    the reach grows by half) |
    compaction_requested (an L3/L4 summary is made in the background, by the API or by our
    summarizer, ``detail["writer"]`` "api" or "ours"; the ``compaction`` event of the later request
    it lands on, with the same ``writer`` and ``waited_s``, the time that request waited for the
    call, applies it: docs/policy.md, *Summaries in the background*).

    Every ``compaction`` the policy plans carries ``detail["hidden"]``: the ``messages`` (first,
    last) and ``tokens`` it took out of view, the ``kept_tokens`` every level keeps, and
    ``chance_of_use``, the estimated chance that the agent's next look-back reaches past them
    (None before any look-back; issue 63).

    A warm ``compaction`` of ours that the policy weighed, and a ``deferred`` one the economics
    declined, carries what weighed it in ``detail`` (issue 48): ``net_usd`` = ``saving_per_turn_usd``
    x ``turns`` - ``rewrite_usd`` - ``summary_usd`` - ``reasoning_lost_usd``
    (``reasoning_lost_tokens``: thinking the edit invalidates; 0 when the API would write the summary,
    ``writer``), ``recent_budget_tokens``, the newest history every level keeps verbatim, and
    ``coverage_target``, the share of the agent's look-backs that budget is sized to cover (None
    when the budget is fixed); the reason says the same in words. An API-written summary's events
    (``compaction_requested``, then ``compaction`` with ``writer: "api"``) do not carry it yet.
    """

    kind: str
    session_id: str
    level: str | None = None
    reason: str = ""
    tokens_before: int = 0
    tokens_after: int = 0
    cost_usd: float = 0.0
    duration_s: float = 0.0
    entries: list[int] = field(default_factory=list)
    detail: dict[str, Any] = field(default_factory=dict)
    time: float = field(default_factory=time.time)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class EventBus:
    """Fan-out to callbacks, plus an in-memory history for reports and tests.

    With ``unsaved=True`` it also holds each session's events until its owner takes them
    (`drain`): the request cycle persists a session's events after each of its steps, so nothing
    subscribes back into the cycle from below."""

    def __init__(self, callbacks: list[Callable[[Event], None]] | None = None, keep: int = 10_000,
                 unsaved: bool = False) -> None:
        self.callbacks = list(callbacks or [])
        self.history: list[Event] = []
        self._keep = keep
        self._unsaved: dict[str, list[Event]] | None = {} if unsaved else None
        self._lock = threading.Lock()

    def subscribe(self, fn: Callable[[Event], None]) -> None:
        self.callbacks.append(fn)

    def emit(self, event: Event, level: int | None = None) -> Event:
        """Record, log (at ``level``, else the kind's default) and deliver an event."""
        self.history.append(event)
        if len(self.history) > self._keep:
            del self.history[: len(self.history) - self._keep]
        if self._unsaved is not None:
            with self._lock:
                self._unsaved.setdefault(event.session_id, []).append(event)
        if level is None:
            level = logging.WARNING if event.kind in WARNING_KINDS else logging.INFO
        if log.isEnabledFor(level):
            tokens = f" ({event.tokens_before} -> {event.tokens_after} tokens)" if event.tokens_before else ""
            log.log(level, "%s %s%s: %s%s", event.session_id[:16], event.kind, f" {event.level}" if event.level else "",
                    event.reason, tokens)
        for fn in self.callbacks:
            try:
                fn(event)
            except Exception:  # a user's callback must not break compaction
                log.exception("cachecompact event callback failed")
        _to_span(event)
        return event


    def drain(self, session_id: str) -> list[Event]:
        """The events of ``session_id`` emitted since the last drain, in order (none without
        ``unsaved``)."""
        if self._unsaved is None:
            return []
        with self._lock:
            return self._unsaved.pop(session_id, [])


def _to_span(event: Event) -> None:
    """Add the event to the current OpenTelemetry span, when the API is installed and recording."""
    if _otel_trace is None:
        return
    span = _otel_trace.get_current_span()
    if not span.is_recording():
        return
    attrs: dict[str, Any] = {"cachecompact.session_id": event.session_id, "cachecompact.reason": event.reason,
                             "cachecompact.tokens_before": event.tokens_before,
                             "cachecompact.tokens_after": event.tokens_after,
                             "cachecompact.cost_usd": event.cost_usd}
    if event.level:
        attrs["cachecompact.level"] = event.level
    span.add_event(f"cachecompact.{event.kind}", attributes=attrs)
