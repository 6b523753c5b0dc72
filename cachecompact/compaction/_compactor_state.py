"""The compactor's state as data: everything `CacheAwareCompactor`'s next decision depends on
besides the session itself, in one typed struct (issue 63, item 6).

The state is stored with every request record (``strategy_state``, docs/ledger-format.md), so
that a replica, or a restarted process, that picks the session up decides exactly as the process
that wrote it would have. It was saved by a 41-line hand mapping that left fields out as the
compactor grew: a replica forgot that the API had refused its summaries (and asked again, a
failure toward the breaker each time), said the deferral before any look-back and the window
being too small a second time, planned a retried turn for the lowered reserve, and priced its
limits for the 5-minute TTL while the session's was an hour. Here the compactor keeps those
attributes in a `CompactorState` (each is a `cache_aware.Held` attribute reading its field),
`msgspec.to_builtins` stores it and `msgspec.convert` reads it back: a field added here travels
with the session, with no mapping to forget. Every field has a default, which is what a
stored state that lacks the field means (a state written before the field existed), so old
records still load; the key names are the stored format's, unchanged from 0.3's mapping.

Every attribute of the compactor that changes after ``__init__``, and where its value comes from
when a replica picks the session up:

=====================================  ==========================================================
attribute                              verdict
=====================================  ==========================================================
steps, last_compact_step               persisted (``resume`` counts them when no state is stored)
failures, tripped                      persisted: the breaker
last_request_at                        persisted: cold gaps, idle compaction, the gap meter
_seen                                  persisted (clamped to the transcript on load)
_pending                               persisted: the level deferred, applied when the cache is cold
summary_cost                           persisted
_growth                                persisted: each recent turn's growth (the critical margin)
_last_tokens, _deferred_old            persisted
_learnt                                persisted: the budget last reported (``recent_budget``)
_short_said                            persisted: the reach ``window_too_small`` last said
_unshown_said                          persisted: the deferral before any look-back, said once
_first                                 persisted (default False: a stored state had a request)
gaps                                   persisted: the gap meter (TTL choice, idle compaction)
ttl, prefix_ttl                        persisted: the TTL in force prices the next limits;
                                       a fixed ``Economics.ttl`` of the loading process wins
_sent                                  persisted: the last request's tokens and TTL
_thought                               persisted: each turn's output tokens (preserved thinking)
_idle_at                               persisted: the quiet period already summarized
_calls                                 persisted: the calls of the last 30 s (repeated calls)
_api_refused                           persisted: the API refused its summaries for the session
_turn_reserve                          persisted: a retried turn keeps its first reserve
_estimate_errors                       persisted: the estimate's recent errors (the margin)
_lowers, _probe                        persisted: whether the client lowers max_tokens on the
                                       API's 400, as this session showed it (the reserve planned)
draft.counter.calibration              persisted (``calibration``; the counter holds it)
_lookback                              derived: the look-back meter reads the transcript and
                                       the ledger from the start (`_lookback`)
_scan                                  derived: `_loop_ahead`'s reading of the transcript
_learnt_now, _coverage_now, _short     transient: recomputed by each turn's limits before use
_now, _producing, _request, _wait_at   transient: this turn's, set before use
_idle                                  transient: made for a session another process moves on
_api_req, _own_req                     transient: a summary under way belongs to the process
                                       that asked for it (its call cannot travel)
=====================================  ==========================================================
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar

import msgspec

from ..base.values import TTL
from ._gaps import Bounded, GapMeter, dec_hook, enc_hook

__all__ = ["FIELDS", "GROWTH_TURNS", "CallLog", "CompactorState", "EstimateErrors", "Growth", "dump", "load"]

log = logging.getLogger("cachecompact")

GROWTH_TURNS = 20  # the critical threshold leaves room for the median growth of this many recent turns
CALLS_KEPT = 16  # the newest results kept per call (repeated calls)
ESTIMATE_ERRORS = 20  # answered requests whose estimate error sets the session's margin


class Growth(Bounded[int]):
    """The tokens each of the newest `GROWTH_TURNS` turns added."""

    MAXLEN: ClassVar[int] = GROWTH_TURNS
    ITEMS: ClassVar[Any] = list[int]


class CallLog(Bounded[tuple[float, str]]):
    """One call's newest results: (request time, the result's xxh3-128 in hex)."""

    MAXLEN: ClassVar[int] = CALLS_KEPT
    ITEMS: ClassVar[Any] = list[tuple[float, str]]


class EstimateErrors(Bounded[float]):
    """The signed relative error of the calibrated estimate of each of the newest
    `ESTIMATE_ERRORS` answered requests ((API's count - ours) / API's count: positive where ours
    fell short): the session's own estimate margin. States stored before the sign was kept hold
    the absolute error, which reads as falling short: the margin they give is as before."""

    MAXLEN: ClassVar[int] = ESTIMATE_ERRORS
    ITEMS: ClassVar[Any] = list[float]


class CompactorState(msgspec.Struct):
    """What the compactor's next decision depends on besides the session (see the module's table)."""

    steps: int = 0  # assistant turns seen
    last_compact_step: int = 0  # the step of the last compaction
    failures: int = 0  # consecutive failed summaries (the breaker)
    tripped: bool = False  # the breaker is open: no more summaries for the session
    last_request_at: float | None = None  # when the last request was answered
    seen: int = 0  # transcript messages observed
    pending: str | None = None  # the level last deferred (applied when the cache goes cold)
    summary_cost: float = 0.0  # what the session's summaries cost, USD
    growth: Growth = msgspec.field(default_factory=Growth)
    last_tokens: int | None = None  # the request size after the previous turn's compaction
    deferred_old: int | None = None  # old tool output when the last economic proposal was deferred
    learnt: int | None = None  # the learnt recent budget last reported (raw tokens; None: configured)
    # the token counter's calibration (`TokenCounter.calibration`); None leaves the loading one's
    calibration: Annotated[float, msgspec.Meta(gt=0)] | None = None
    gaps: GapMeter = msgspec.field(default_factory=GapMeter)  # the gaps between requests (the TTL's evidence)
    sent: tuple[int, float] | None = None  # the last request's tokens and its entries' TTL (s)
    # preserved thinking: the output tokens of each turn of the task under way, by transcript index
    thought: dict[int, int] = msgspec.field(default_factory=dict)
    idle_at: float | None = None  # the request time of the quiet period last summarized (`compaction.idle`)
    calls: dict[str, CallLog] = msgspec.field(default_factory=dict)  # a call's key (hex) -> its results
    api_refused: bool = False  # the API refused its summaries for this session: our own from then on
    # (history length, largest max_tokens asked at it): a retry of the same turn keeps the turn's first reserve
    turn_reserve: tuple[int, int] = (-1, 0)
    ttl: TTL | None = None  # the TTL in force after the prefix (None: the API's default, 5 minutes)
    prefix_ttl: TTL | None = None  # and on the prefix
    first: bool = False  # no request of the session has been decided yet (a compaction of it is said, once)
    unshown_said: bool = False  # the deferral before any look-back was said (once a session)
    short_said: int = 0  # the reach `window_too_small` last said (0: never)
    # the estimate's relative error on the newest answered requests (the margin, `_margin`)
    estimate_errors: EstimateErrors = msgspec.field(default_factory=EstimateErrors)
    # whether the client lowers max_tokens on the API's 400 for it, as this session showed it (None:
    # not shown; `CacheAwareCompactor._reserve_lowered`), and the (history length, max_tokens) of a
    # request sent over its reserve and not answered yet, whose next request shows it
    lowers: bool | None = None
    probe: tuple[int, int] | None = None


FIELDS = frozenset(CompactorState.__struct_fields__)


def dump(st: CompactorState) -> dict[str, Any]:
    """The stored form: JSON values, the keys the field names (0.3's)."""
    out: dict[str, Any] = msgspec.to_builtins(st, enc_hook=enc_hook, str_keys=True)
    return out


def _convert(st: Mapping[str, Any]) -> CompactorState:
    return msgspec.convert(st, CompactorState, dec_hook=dec_hook, strict=False)


def load(st: Any) -> CompactorState | None:
    """The state stored as ``st``; unknown keys are ignored, and a field whose value is bad keeps
    its default (logged), the others load. None when ``st`` is no JSON object at all."""
    if not isinstance(st, Mapping):
        log.warning("cachecompact: ignoring a stored compactor state that is not an object: %r", type(st).__name__)
        return None
    try:
        return _convert(st)
    except msgspec.ValidationError:
        pass
    good: dict[str, Any] = {}
    for k, v in st.items():
        if k not in FIELDS:
            continue
        try:
            _convert({k: v})
        except msgspec.ValidationError as err:
            log.warning("cachecompact: ignoring a stored compactor state's %r: %s", k, err)
            continue
        good[k] = v
    return _convert(good)
