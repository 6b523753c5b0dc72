"""The default strategy (``cachecompact``): the policy run each turn, its edits appended to the ledger.

Per turn, with the session synced to the agent's history and before the request renders:

1. **L2 on entry** shortens big new tool results; they were never sent, so it breaks nothing.
   **Given back**: hidden lines the newest calls name are appended to their results
   (`compaction.restore`), never sent either.
2. **Triggers** (`policy.evaluate`) set the highest level allowed; they need only the
   render's running totals, so a quiet turn costs time proportional to the new messages.
3. **Candidates** from L1 up to that level; each proposal passes `_guard`, the one check that
   no edit touches the immutable prefix. The first that reaches the target is used.
4. **Cache economics** decide whether an edit that changes bytes already sent pays now,
   unless the window forces it.
5. The edits are appended (L3/L4 summarise first). A proposal the ledger refuses is a
   planning bug: it is logged and dropped and the next candidate is tried; it is not a
   failure. A summarizer failure counts toward the breaker. When the request still does
   not fit, L5 runs, even with the breaker open; only when not even L5 can make it fit does
   the report say the context is full (`Plan.context_full`).
"""

from __future__ import annotations

import logging
import math
import time
import warnings
from collections.abc import Iterator
from dataclasses import replace
from itertools import pairwise
from typing import Any, Generic, TypeVar, overload

import msgspec
import xxhash

from ..base.errors import InvalidEditError, SummaryRejected, UnknownModelError
from ..base.events import Event
from ..base.http import too_long_message
from ..base.pricing import UNKNOWN_MODEL_WINDOW, priced
from ..base.values import PREFIX_SETTING, TTL, IdleDecision, Level
from ..base.wire import (
    RedactedThinkingBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    call_key,
    canonical_bytes,
    content_blocks,
    tool_result_ids,
)
from ..history.draft import Draft
from ..history.ledger import GIVEN_BACK_LEVEL, LedgerEntry, ReplaceWithSummary, SkipRange
from ..history.scratchpad import READ_SCRATCHPAD_TOOL
from ..history.session import Session
from ..history.thinking import latest_tool_turn
from ._api_summary import ApiRequest, OwnRequest, api_range_end, bound_call, usable
from ._compactor_state import FIELDS, GROWTH_TURNS, CallLog, CompactorState, EstimateErrors, Growth, dump, load
from ._gaps import LONG_TTL_S, SHORT_TTL_S, GapMeter
from ._lookback import LookbackMeter
from ._restore import RESTORE_LEVEL, RESTORE_REASON, restore_edits
from .idle import DECIDE_BEFORE_S, idle_value, late_chance
from .levels import (
    Proposal,
    ResultInfo,
    View,
    build_view,
    propose_entry_summary,
    propose_full,
    propose_micro,
    propose_tool_summary,
    propose_truncate,
    propose_turn_collapse,
    results_since,
    superseded_edits,
)
from .levels.l2_tool_summary import ON_ENTRY
from .levels.superseded import SUPERSEDED_REASON
from .levels.working_set import working_lines
from .policy import (
    LEVEL_ORDER,
    Limits,
    PolicyConfig,
    Trigger,
    choose_ttls,
    economics,
    evaluate,
    limits,
    reach_cap,
)
from .strategy import (
    Plan,
    StrategyContext,
    latest_request,
    summarize_range,
    summary_edit,
    summary_request,
    task_goal,
)
from .summarize.api_compaction import OnDemandSummarizer, Verbatim, compaction_max_tokens
from .summarize.extractive import first_words, request_head
from .summarize.llm import ExtractiveSummarizer, PricedSummarizer

__all__ = ["GROWTH_TURNS", "REPEAT_CALLS", "REPEAT_WINDOW_S", "CacheAwareCompactor"]

log = logging.getLogger("cachecompact")

# the most of the window an output reserve (max_tokens) makes L5 drop rounds for: a client that
# reserves more lowers it on the API's own 400 (`CacheAwareCompactor._forced_limits`)
OWN_RESERVE_SHARE = 0.25
MARGIN_EVIDENCE = 5  # answered requests before the estimate margin is the session's own (`_margin`)
MIN_MARGIN = 0.01  # the least share of the window kept free for estimate error
MAX_MARGIN = 0.25  # the most (a session whose estimates miss by more keeps a quarter free)
REPEAT_WINDOW_S = 30.0  # the first seed's rule: more than REPEAT_CALLS identical calls with identical
REPEAT_CALLS = 2  # results within this many seconds means the model lost something it needed


T = TypeVar("T")


class Held(Generic[T]):
    """An attribute of the compactor kept in its `CompactorState` (``_st``, stored with each
    request record): the field of the same name, without the leading underscore. Checked when
    the class is made, so a misspelt one fails at import."""

    def __set_name__(self, owner: type[Any], name: str) -> None:
        self.field = name.lstrip("_")
        if self.field not in FIELDS:
            raise TypeError(f"{owner.__name__}.{name}: CompactorState has no field {self.field!r}")

    @overload
    def __get__(self, obj: None, owner: type[Any]) -> Held[T]: ...

    @overload
    def __get__(self, obj: CacheAwareCompactor, owner: type[Any]) -> T: ...

    def __get__(self, obj: CacheAwareCompactor | None, owner: type[Any]) -> T | Held[T]:
        if obj is None:
            return self
        value: T = getattr(obj._st, self.field)
        return value

    def __set__(self, obj: CacheAwareCompactor, value: T) -> None:
        setattr(obj._st, self.field, value)


class CacheAwareCompactor:
    """Cache-aware compaction for one session (the ``cachecompact`` strategy)."""

    # the state a replica needs to decide alike, kept in `_st`, a `_state.CompactorState` that is
    # stored with each request record (`state`, `load_state`); each of these is its field
    steps = Held[int]()
    last_compact_step = Held[int]()
    failures = Held[int]()
    tripped = Held[bool]()
    last_request_at = Held[float | None]()
    summary_cost = Held[float]()
    gaps = Held[GapMeter]()
    ttl = Held[TTL | None]()  # the cache TTL this turn's request is rendered with (its `Plan` carries both)
    prefix_ttl = Held[TTL | None]()
    _seen = Held[int]()
    _pending = Held[str | None]()
    _growth = Held[Growth]()
    _calls = Held[dict[str, CallLog]]()
    _last_tokens = Held[int | None]()
    _deferred_old = Held[int | None]()
    _learnt = Held[int | None]()
    _short_said = Held[int]()
    _unshown_said = Held[bool]()
    _first = Held[bool]()
    _sent = Held[tuple[int, float] | None]()
    _thought = Held[dict[int, int]]()
    _idle_at = Held[float | None]()
    _api_refused = Held[bool]()
    _turn_reserve = Held[tuple[int, int]]()
    _lowers = Held[bool | None]()
    _probe = Held[tuple[int, int] | None]()
    _estimate_errors = Held[EstimateErrors]()

    def __init__(self, ctx: StrategyContext, config: PolicyConfig | None = None) -> None:
        self.ctx = ctx
        self.draft = ctx.draft
        self.cfg = config or PolicyConfig()
        self.summarizer = ctx.summarizer
        self.events = ctx.events
        self.externalize = ctx.scratchpad_tool  # L2 keeps full outputs in the scratchpad, for read_scratchpad
        # L2 never shortens a write (its result says what changed) nor a scratchpad read: that output
        # is already the stored original, and shortening it again would hand the agent a new
        # reference to the same text, a loop
        lv = self.cfg.levels
        self._l2_exempt = lv.exempt_tools | lv.write_tools | {READ_SCRATCHPAD_TOOL["name"]}
        # the cache TTL: chosen each turn from the session's gaps, unless the configuration fixes it
        fixed: TTL | None = "1h" if self.cfg.economics.ttl == "1h" else None  # None: the API's default, 5 minutes
        self._st = CompactorState(first=True, ttl=fixed, prefix_ttl=fixed)
        # `_loop_ahead`'s reading of the transcript, extended by the messages appended since (it is
        # append-only): messages read, whether an assistant turn among them thinks, the person's turns,
        # and the number of assistant turns before each index
        self._scan: tuple[int, bool, list[int], list[int]] = (0, False, [], [0])
        self._lookback = LookbackMeter(self.cfg.levels.min_clear_tokens)
        self._learnt_now: int | None = None  # the one this turn's limits use
        self._coverage_now = self.cfg.levels.lookback_coverage  # the share of look-backs it covers (raised on misses)
        # the reach the look-backs ask for when the window cannot hold it (prefix, reach, one turn, the limits;
        # `_note_window_too_small`)
        self._short: tuple[int, int, int, Limits] | None = None
        self._producing: int | None = None  # the transcript index the pending response will take
        self._now: float | None = None  # the time of the decision under way (summaries are asked at it)
        # idle compaction (`compaction.idle`): the summary made while the session was quiet, whose edits
        # the next request appends
        self._idle: tuple[Proposal, list[SkipRange | ReplaceWithSummary], str] | None = None
        # API-written summaries (`compaction._api_summary`): the one asked for and not yet swapped in
        self._api_req: ApiRequest | None = None
        # our own L3/L4 summary whose call runs in the background (`_api_summary.OwnRequest`), not landed yet
        self._own_req: OwnRequest | None = None
        self._wait_at = 0  # this turn's prompt size from which a request waits for a summary call
        self._request: tuple[int, dict[str, Any]] = (0, {})  # this turn's max_tokens and caller parameters
        self._client_lowers: bool | None = None  # what the adapter knows of the client (`client_lowers_reserve`)

    @property
    def session(self) -> Draft:
        """The 0.3-development name of ``draft`` (read until 0.4)."""
        warnings.warn("CacheAwareCompactor.session is read until 0.4: use .draft (the session's Draft)",
                      DeprecationWarning, stacklevel=2)
        return self.draft

    @property
    def _ttl_s(self) -> float:
        """How long the last request's entries after the prefix live."""
        if self.cfg.economics.ttl == "auto":
            return self._sent[1] if self._sent is not None else SHORT_TTL_S
        return LONG_TTL_S if self.cfg.economics.ttl == "1h" else self.cfg.economics.cache_ttl_s

    @classmethod
    def for_session(cls, session: Session | Draft, config: PolicyConfig | None = None,
                    **kw: Any) -> CacheAwareCompactor:
        """A compactor with an extractive summarizer and its own event bus (tests, scripts). It
        plans against the session's `Draft`; what it stages is stored when the session next
        writes, or by `Session.commit`."""
        from ..base.events import EventBus

        draft = session if isinstance(session, Draft) else Draft(session)
        ctx = StrategyContext(draft=draft, summarizer=kw.pop("summarizer", None) or ExtractiveSummarizer(),
                              events=kw.pop("events", None) or EventBus(),
                              window_tokens=(config or PolicyConfig()).window_tokens or UNKNOWN_MODEL_WINDOW, **kw)
        return cls(ctx, config)

    def resume(self) -> None:
        """Pick up a reopened session: count its steps and when it was last compacted."""
        t = self.draft.transcript
        self._seen = len(t)
        asst = [i for i in range(len(t)) if t[i].role == "assistant"]
        self.steps = len(asst)
        done = [e for e in self.draft.ledger.entries
                if not e.reason.startswith(ON_ENTRY) and e.level != RESTORE_LEVEL]
        if done:
            at = done[-1].transcript_len
            self.last_compact_step = sum(1 for i in asst if i < at)

    # -- state that travels with the session (replicas sharing a store) ------------------------

    def state(self) -> dict[str, Any]:
        """Everything the next decision depends on besides the session itself, as JSON (the
        `_state.CompactorState`, converted whole). Stored with each request record, so a replica
        that picks the session up next decides exactly as this one would have."""
        return dump(msgspec.structs.replace(self._st, calibration=self.draft.counter.calibration))

    def load_state(self, st: dict[str, Any]) -> None:
        """Continue from `state` recorded by another process, or by 0.3's mapping (a field it did
        not write keeps its default; unknown fields are ignored; a bad one keeps its default and
        is logged)."""
        loaded = load(st)
        if loaded is None:
            return
        loaded.seen = min(loaded.seen, len(self.draft.transcript))
        if self.cfg.economics.ttl != "auto":  # this process's configuration fixes the TTL
            loaded.ttl, loaded.prefix_ttl = self._st.ttl, self._st.prefix_ttl
        if loaded.calibration is not None:
            self.draft.counter.calibration = loaded.calibration
        self._st = loaded
        self._idle = None  # made for a session another process has moved on

    # -- bookkeeping -------------------------------------------------------------------------

    def _emit(self, kind: str, **kw: Any) -> Event:
        return self.events.emit(Event(kind=kind, session_id=self.draft.session_id, **kw))

    def _observe_new(self, now: float, report: Plan) -> int:
        """Count steps since the last turn and watch for repeated calls; the first new index."""
        t = self.draft.transcript
        start, self._seen = self._seen, len(t)
        last_reply = None
        for i in range(start, len(t)):
            if t[i].role == "assistant":
                self.steps += 1
                last_reply = i
            elif i > 0 and tool_result_ids(t[i]):
                self._track_results(i, now, report)
        if last_reply is not None and self.last_request_at is not None:
            called = any(isinstance(b, ToolUseBlock) for b in content_blocks(t[last_reply]))
            self.gaps.observe(now - self.last_request_at, after_tool_call=called)
        return start

    def _track_results(self, i: int, now: float, report: Plan) -> None:
        """A burst of more than `REPEAT_CALLS` identical calls with identical results within
        `REPEAT_WINDOW_S` is a warning: re-running a test command is routine, getting the same
        answer again and again is not."""
        t = self.draft.transcript
        # forget calls whose newest result is older than the window: they count toward nothing, and the map,
        # stored with each request record, stays as small as the window
        self._calls = {k: v for k, v in self._calls.items() if v and now - v[-1][0] <= REPEAT_WINDOW_S}
        calls = {b.id: b for b in content_blocks(t[i - 1]) if isinstance(b, ToolUseBlock)}
        for b in content_blocks(t[i]):
            if not isinstance(b, ToolResultBlock) or b.tool_use_id not in calls:
                continue
            use = calls[b.tool_use_id]
            key = call_key(use).hex()
            # a result may have no content at all (the field is optional in the API)
            result = xxhash.xxh3_128_hexdigest(canonical_bytes(b.content if isinstance(b.content, (str, list)) else ""))
            seen = self._calls.setdefault(key, CallLog())
            while seen and now - seen[0][0] > REPEAT_WINDOW_S:
                seen.popleft()
            seen.append((now, result))
            same = sum(1 for _, r in seen if r == result)
            if same == REPEAT_CALLS + 1:
                report.events.append(self._emit(
                    "repeated_tool_calls", reason=f"{same} identical {use.name} calls with identical results within "
                                                  f"{REPEAT_WINDOW_S:.0f}s: the model may have lost what it needed",
                    detail={"call": canonical_bytes([use.name, use.input]).decode(errors="replace")[:200]}))

    def _plain_limits(self, max_tokens: int, model: str, *, as_asked: bool = False) -> tuple[Limits, int, int, float]:
        """`policy.limits` for this session now, before any learnt recent budget; with the
        prefix, the typical turn's growth and the write-over-read ratio it was made from.

        The output reserve planned for is the request's ``max_tokens`` where the window holds it
        beside the prefix, one summary and one turn: then no request of the session gets the
        API's 400 for it. Where it does not, nothing we hide can make it fit, so the reserve
        planned for is the one L5 works to (`OWN_RESERVE_SHARE` of the window, `_forced_limits`),
        which the client reaches by lowering max_tokens on the API's 400 ("input length and
        `max_tokens` exceed context limit"). Planned for the request's reserve, the summaries
        aimed below the prefix itself, never fitted, and L5 dropped rounds every few turns while
        a summary would have fitted (issue 62: Claude Code at 40k, 32,000 of output, a 25k
        prefix).

        A client known to lower it (`_reserve_lowered`) is planned for that reserve wherever its
        own is larger. Planned for its own, Claude Code's 128,000 at a 200k window kept the
        input under ~62k: compact mode compacted from ~54k while direct ran to ~196k, and cost
        1.8-2.4x direct (issue 62's trial; docs/benchmarks.md, *A client that lowers its
        reserve*). A client not known to lower it keeps its own where the window holds it: one
        that never lowers it (opencode) would get the API's 400 and fail the turn."""
        s = self.draft
        prefix = s.counter.calibrated(s.render(breakpoints=False).prefix_tokens)
        growth = sorted(self._growth)[len(self._growth) // 2] if self._growth else 0  # a typical turn
        window = self.ctx.window_tokens  # the one window the engine resolved (EngineOptions.window), or the bench's
        price = priced(model, self.ctx.prices)
        ratio = price.write_over_read(self.ttl or "5m")  # the model's own prices, for the TTL in force
        margin = self._margin()
        lim = limits(self.cfg, window, max_tokens, prefix, growth, write_over_read=ratio, estimate_error=margin)
        cap = int(OWN_RESERVE_SHARE * lim.window)
        if not as_asked and max_tokens > cap and self._reserve_lowered():
            lim = limits(self.cfg, window, cap, prefix, growth, write_over_read=ratio, estimate_error=margin)
        elif not as_asked and max_tokens > cap:
            # what the window leaves beside the reserve itself (not `policy.limits`' floor of a
            # quarter of the window, which a reserve of most of the window never leaves)
            raw = lim.window - int(margin * lim.window) - max_tokens
            below = lim.limit - lim.critical  # the headroom critical keeps below the limit
            if reach_cap(raw - below, prefix, self.cfg.levels.summary_tokens, max(growth, lim.limit // 100)) <= 0:
                lim = limits(self.cfg, window, cap, prefix, growth, write_over_read=ratio, estimate_error=margin)
        return lim, prefix, growth, ratio

    def _margin(self) -> float:
        """The share of the window kept free for the token estimate's error (issue 63: "the
        safety margin follows this session's measured estimate error, not a fixed 5%"): the
        configured one (`Safety.estimate_error`) until `MARGIN_EVIDENCE` answered requests have
        shown the session's own error, then twice the largest relative shortfall of the newest
        of them (the API's count above the calibrated estimate), at least `MIN_MARGIN` and at
        most `MAX_MARGIN`. At 1M the configured 5% kept 50,000 tokens free that a session
        estimated within 1% never needed; a session whose estimates fall short by more (images,
        another tokenizer) gets more than 5%. Only a shortfall counts: an estimate that runs high
        never makes a request too long, and counting it refused requests the API takes (issue 62's
        trial: after an edit invalidated thinking sent with ``drop_block``, estimates ran 2-38%
        high, the margin reached a quarter of a 40k window, and the proxy said "context is full"
        at an estimated 32k of a real 27k). A request that still comes out too long gets the
        API's prompt-too-long 400, which the reactive path compacts and retries."""
        errors = self._estimate_errors
        if len(errors) < MARGIN_EVIDENCE:
            return self.cfg.safety.estimate_error
        return min(MAX_MARGIN, max(MIN_MARGIN, 2 * max(errors)))

    def _limits(self, max_tokens: int, model: str) -> Limits:
        s = self.draft
        lim, prefix, growth, ratio = self._plain_limits(max_tokens, model)
        window = lim.window
        coverage = self.cfg.levels.lookback_coverage
        if coverage <= 0:
            return lim
        self._lookback.observe(s)
        coverage = self._coverage_now = self._lookback.coverage_for(coverage, self.cfg.levels.miss_rate)
        # the window alone caps what the agent's look-backs ask for (`policy.reach_cap`)
        turn = max(growth, lim.limit // 100)
        room = reach_cap(lim.critical, prefix, self.cfg.levels.summary_tokens, turn)
        cal = max(s.counter.calibration, 1e-9)
        learnt = self._lookback.budget(coverage, int(room / cal))
        if learnt is None:  # until a budget is certified, the agent's own look-backs may still show it must grow
            # above what a collapse keeps of the configured budget (the room below soft caps that guess)
            learnt = self._lookback.provisional(coverage, int(lim.collapse_keep / cal), int(room / cal))
        self._learnt_now = learnt
        wanted = self._lookback.provisional(coverage, int(room / cal), 2**62)  # past the cap, uncapped; else None
        self._short = None if wanted is None else (prefix, s.counter.calibrated(wanted), turn, lim)
        if learnt is None:
            return lim
        # the reserve `_plain_limits` planned for, not the request's: a client that lowers it was planned for a
        # quarter of the window until a budget was learnt, and then for its 128,000 again (issue 62's trial: at
        # 200k the critical threshold fell from ~143k to ~66k, and a long tool loop was compacted every call)
        return limits(self.cfg, window, lim.max_tokens, prefix, growth, recent_tokens=s.counter.calibrated(learnt),
                      write_over_read=ratio, estimate_error=lim.estimate_error)

    def _note_window_too_small(self, report: Plan) -> None:
        """An event when the reach the agent's look-backs ask for does not fit the window beside
        the prefix, a summary and one turn (`policy.reach_cap`): what lies beyond what fits will be
        re-read or guessed. Said when it first happens and whenever the reach grows by half
        again, so a long session does not repeat it every turn (issue 63, "tight windows, said
        aloud")."""
        if self._short is None:
            return
        prefix, reach, turn, lim = self._short
        if self._short_said and reach < 1.5 * self._short_said:
            return
        self._short_said = reach
        summary = self.cfg.levels.summary_tokens
        need = prefix + reach + summary + turn
        report.events.append(self._emit(
            "window_too_small", tokens_before=need, tokens_after=lim.critical,
            reason=f"the window is too small for this agent's reach: prefix {prefix:,} + reach {reach:,} + summary "
                   f"{summary:,} + one turn {turn:,} = {need:,} tokens > {lim.critical:,} (the critical threshold of "
                   f"a {lim.window:,}-token window); keeping the newest {lim.keep_recent:,}: the agent will re-read "
                   "what lies beyond (a larger window, or a smaller max_tokens, keeps it)",
            detail={"prefix": prefix, "reach": reach, "summary": summary, "turn": turn, "need": need,
                    "critical": lim.critical, "window": lim.window, "kept": lim.keep_recent}))

    def _note_recent_budget(self, lim: Limits, report: Plan) -> None:
        """An event when the budget learnt from the agent's look-backs first replaces the
        configured one, whenever it has moved by a factor of 1.5 either way since the last event
        (by the meter's raw tokens, so a moving calibration does not repeat it), and when it
        falls back to the configured one."""
        learnt, before = self._learnt_now, self._learnt
        if learnt == before or (learnt is not None and before is not None and before / 1.5 < learnt < before * 1.5):
            return
        self._learnt = learnt
        m = self._lookback
        cal = max(self.draft.counter.calibration, 1e-9)
        far, at_risk = m.beyond(learnt if learnt is not None else int(lim.configured_recent / cal))
        what = (f"learnt: {lim.keep_recent} tokens (configured {lim.configured_recent})" if learnt is not None
                else f"back to the configured {lim.configured_recent} tokens")
        coverage = self._coverage_now
        report.events.append(self._emit(
            "recent_budget", reason=f"recent budget {what}, to cover {coverage:.1%} of the agent's look-backs: "
                                    f"{far} of the {at_risk} that could reach past it did; {m.missed} of the "
                                    f"{m.exposed} that reached into compacted history found no line of it in view",
            detail={"recent_tokens": lim.keep_recent, "configured": lim.configured_recent, "learnt": learnt,
                    "coverage": coverage, "beyond": far, "at_risk": at_risk, "exposed": m.exposed,
                    "missed": m.missed, "lookbacks": len(m.lookbacks)}))

    def _reruns_of_hidden(self, new: list[ResultInfo], room: int) -> frozenset[str]:
        """The new results (tool_use ids) that repeat a call whose earlier result compaction hid
        (shortened on arrival, cleared, or summarized; not given back), and that fit in ``room``
        (raw tokens): the agent asked for that output again, so it comes back whole (issue 47: a
        re-run was shortened to the same placeholder every time, and the agent looped). The levels
        make room for it from older history; one too big for the window stays shortened, and its
        placeholder says so."""
        s = self.draft
        t = s.transcript
        hidden: set[str] = set()
        for e in s.ledger.effective():
            if e.level == GIVEN_BACK_LEVEL:
                continue
            if e.tool_use_id is not None:
                hidden.add(e.tool_use_id)
                continue
            for i in range(e.start, min(e.end + 1, len(t))):
                hidden.update(b.tool_use_id for b in content_blocks(t[i]) if isinstance(b, ToolResultBlock))
        if not hidden:
            return frozenset()
        first = min(r.message for r in new)
        asked = {call_key(b) for i in range(first) if t[i].role == "assistant"
                 for b in content_blocks(t[i]) if isinstance(b, ToolUseBlock) and b.id in hidden}
        out, left = set(), room
        for r in sorted(new, key=lambda x: x.tokens):
            if r.tokens <= left and call_key(ToolUseBlock(id=r.tool_use_id, name=r.name, input=r.input)) in asked:
                out.add(r.tool_use_id)
                left -= r.tokens
        return frozenset(out)

    def _now_tokens(self) -> int:
        return self.draft.counter.calibrated(self.draft.render(breakpoints=False).raw_tokens)

    # -- levels --------------------------------------------------------------------------------

    def _propose(self, level: Level, view: View, lim: Limits) -> Proposal:
        """A level's plan, with every superseded result after its break cleared too: the break
        re-writes them anyway, and the newer result shows all they share with it."""
        p = self._plan(level, view, lim)
        if p.empty or p.break_at is None or level not in ("L1", "L2", "L3", "L4"):
            return p
        lv = self.cfg.levels
        after = max(p.break_at - 1, p.summarize[1] if p.summarize is not None else -1)
        own = {e.tool_use_id for e in p.edits if e.tool_use_id}
        extra, removed = superseded_edits(view, after=after, skip_ids=own,
                                          write_tools=lv.write_tools, exempt_tools=lv.exempt_tools,
                                          min_tokens=lv.min_clear_tokens, is_write=lv.is_write,
                                          key_fraction=lv.key_fraction, key_max_chars=lv.key_max_chars,
                                          counter=self.draft.counter)
        if not extra:
            return p
        return replace(p, edits=sorted([*p.edits, *extra], key=lambda e: e.start),
                       tokens_removed=p.tokens_removed + removed,
                       reason=f"{p.reason}; and {len(extra)} superseded result(s) after it")

    def _plan(self, level: Level, view: View, lim: Limits) -> Proposal:
        lv, ctr = self.cfg.levels, self.draft.counter
        target_raw = int(lim.aim() / max(ctr.calibration, 1e-9))
        if level == "L1":
            return propose_micro(view, keep_recent=lv.keep_recent_results, write_tools=lv.write_tools,
                                 exempt_tools=lv.exempt_tools, min_tokens=lv.min_clear_tokens, is_write=lv.is_write,
                                 keep_recent_tokens=lim.keep_recent,
                                 key_fraction=lv.key_fraction, key_max_chars=lv.key_max_chars, counter=ctr)
        if level == "L2":
            return propose_tool_summary(view, self.externalize, ctr, old_min_tokens=lim.old_result,
                                        preview_chars=lv.preview_chars, key_chars=lv.key_max_chars,
                                        keep_recent=lv.keep_recent_results,
                                        keep_recent_tokens=lim.keep_recent,
                                        exempt_tools=self._l2_exempt)
        if level == "L3":
            return propose_turn_collapse(view, target_tokens=target_raw, keep_rounds=lv.keep_rounds_l3,
                                         summary_tokens=lv.summary_tokens, min_batch_tokens=lim.min_batch,
                                         keep_tokens=int(lim.collapse_keep / max(ctr.calibration, 1e-9)))
        if level == "L4":  # the rounds the recent budget holds, in tokens; the configured count is a floor
            keep = int(lim.collapse_keep / max(ctr.calibration, 1e-9))
            return propose_full(view, keep_rounds=max(lv.keep_rounds_l4, view.rounds_within(keep)),
                                summary_tokens=lv.summary_tokens)
        return propose_truncate(view, target_tokens=target_raw, keep=self._latest_request())

    def _guard(self, p: Proposal) -> Proposal:
        """The one check every proposal passes: nothing may touch the immutable prefix (nor what
        an API-written summary stands for: its block opens the request)."""
        pe = self.draft.edit_floor
        if pe is None:
            return Proposal(p.level, p.reason)
        bad = [e for e in p.edits if e.start < pe]
        if p.summarize is not None and p.summarize[0] < pe:
            bad.append(ReplaceWithSummary(p.summarize[0], p.summarize[1], "-", "summary range"))
        if not bad:
            return p
        for e in bad:
            self._planning_bug(p.level, f"{p.level} proposed an edit of messages {e.start}..{e.end}, inside the "
                                        f"immutable prefix (messages 0..{pe - 1}); dropped")
        keep = [e for e in p.edits if e.start >= pe]
        summarize = p.summarize if p.summarize is None or p.summarize[0] >= pe else None
        return replace(p, edits=keep, summarize=summarize) if (keep or summarize) else Proposal(p.level, p.reason)

    def _planning_bug(self, level: Level, why: str) -> None:
        log.error("cachecompact: planning bug: %s", why)
        self._emit("refused", level=level, reason=f"planning bug: {why}")

    def _apply(self, p: Proposal, cold: bool, body: dict[str, Any] | None) -> tuple[list[LedgerEntry], float]:
        """Stage a proposal's edits (summarising first for L3/L4). Raises on failure."""
        edits, cost = self._edits_of(p, cold, body)
        return self._stage(p, edits), cost

    def _stage(self, p: Proposal, edits: list[SkipRange | ReplaceWithSummary]) -> list[LedgerEntry]:
        """Stage ``edits`` of proposal ``p``, and keep the scratchpad content their placeholders
        name (first: an edit never names content its plan does not carry)."""
        for text in p.blobs.values():
            self.draft.keep(text)
        return [self.draft.stage(x, level=p.level) for x in edits]

    def _edits_of(self, p: Proposal, cold: bool, body: dict[str, Any] | None
                  ) -> tuple[list[SkipRange | ReplaceWithSummary], float]:
        """A proposal's edits, its summary made (L3/L4), not yet appended. Raises on failure."""
        edits: list[SkipRange | ReplaceWithSummary] = list(p.edits)
        cost = 0.0
        if p.summarize is not None:
            start, end = p.summarize
            # the verbatim lines the agent used since (`working_set_chars`, fitted: about half the summary)
            keep = working_lines(self.draft, start, end, self.cfg.levels.working_set_chars)
            edit, res = summarize_range(self.draft, start, end, self.summarizer, reason=f"{p.level}: {p.reason}",
                                        body=body, cache_warm=not cold, verbatim=keep, at=self._now)
            cost = res.cost_usd
            before, after = self.draft.edit_effect(edit)
            if after >= before:  # checked before appending: the ledger never keeps a useless summary
                raise SummaryRejected(f"no reduction: the summary ({after} tokens) is not smaller than the range "
                                      f"({before} tokens)", cost)
            edits.append(edit)
        return edits, cost

    # -- the turn --------------------------------------------------------------------------------

    def before_request(self, now: float, model: str, max_tokens: int = 0,
                       params: dict[str, Any] | None = None) -> Plan:
        """Decide and stage this turn's compaction; ``context_full`` in the plan says why when
        nothing fits (the adapters turn it into their transport's error). The plan carries the
        TTLs this turn's request is rendered with."""
        plan = self._decide(now, model, max_tokens, params)
        plan.ttl, plan.prefix_ttl = self.ttl, self.prefix_ttl
        return plan

    def client_lowers_reserve(self, lowers: bool | None) -> None:
        """What the adapter knows of the client that sends this session's requests: True when it
        lowers max_tokens on the API's 400 ("input length and `max_tokens` exceed context limit"),
        as Claude Code does; None when it does not know. The session's own evidence wins over it
        (`_reserve_lowered`)."""
        self._client_lowers = lowers

    def _reserve_lowered(self) -> bool:
        """Whether the client lowers its max_tokens on the API's 400 for it: as this session
        showed it, else as the adapter knows it (`client_lowers_reserve`), else not. A request
        sent over its reserve (`_over_reserve`) and not answered is the evidence: the client's next
        request asks less (it lowered) or not (it does not, and gets planned for what it asks)."""
        return bool(self._lowers if self._lowers is not None else self._client_lowers)

    def _decide(self, now: float, model: str, max_tokens: int, params: dict[str, Any] | None) -> Plan:
        report = Plan(0, 0)
        since = self._observe_new(now, report)
        self._now = now
        s = self.draft
        if not self.cfg.economics.mark_compacted:
            s.stable_before = None  # also one restored from requests recorded with the mark on
        if s.prefix_end is None or not len(s):
            return report
        self._request = (max_tokens, dict(params or {}))
        if self._probe is not None:  # the request before went over its reserve and was not answered
            self._lowers = 0 < max_tokens < self._probe[1]
            self._probe = None
        # the reserve planned for is the largest this turn asked: a client that lowers max_tokens
        # on the API's 400 asks for the rest of the window beside its prompt (Claude Code: window
        # - prompt - 1,000), and planned for that, each retry hid a little more, every turn
        # (issue 62: at 40k, one tool result cleared on each of 25 turns)
        n, asked = self._turn_reserve
        self._turn_reserve = (len(s), max(max_tokens, asked) if n == len(s) else max_tokens)
        # a summary made in the background lands here when it is back (recorded against this request)
        self._land(report, wait=not self.cfg.levels.background_summaries or self._simulated())
        if self._idle is not None:
            self._append_idle(report)
        lim = self._limits(self._turn_reserve[1], model)
        self._note_recent_budget(lim, report)
        self._note_window_too_small(report)
        self._producing = len(s)
        human = self._task_start()
        self._thought = {k: v for k, v in self._thought.items() if k > human}
        tokens0 = self._now_tokens()
        report.tokens_before = report.tokens_after = tokens0
        lv = self.cfg.levels
        # L2 on entry: results never sent yet, so shortening them breaks nothing
        new = results_since(s, since)
        if new:
            prefix_now = s.counter.calibrated(s.render(breakpoints=False).prefix_tokens)
            room = max(0, lim.room)  # a result this size fits below soft beside the prefix and a summary
            cal = max(s.counter.calibration, 1e-9)
            big = [r for r in new if s.counter.calibrated(r.tokens) > lim.big_result]
            p2 = self._guard(propose_entry_summary(
                new, self.externalize, s.counter, big_tokens=int(lim.big_result / cal),
                turn_tokens=int(lim.big_result / cal), preview_chars=lv.preview_chars, key_chars=lv.key_max_chars,
                exempt_tools=self._l2_exempt,
                whole=self._reruns_of_hidden(big, int(room / cal)) if big else frozenset(),
                why=(f"more than the ~{lim.big_result} tokens this session keeps verbatim through a compaction, "
                     f"at a {lim.window:,}-token window with ~{prefix_now:,} fixed"),
                rerun_fits=int(room / cal)))
            if p2.edits:
                entries = self._apply_or_refuse(p2, True, None)
                if entries:
                    report.entries += entries
                    report.events.append(self._emit("externalized", level="L2", reason=p2.reason,
                                                    tokens_before=tokens0, tokens_after=self._now_tokens(),
                                                    entries=[e.seq for e in entries]))
        if lv.working_set_chars > 0:
            self._restore(report)
        r = s.render(breakpoints=False)
        tokens = s.counter.calibrated(r.raw_tokens)
        if self._last_tokens is not None and tokens > self._last_tokens:
            self._growth.append(tokens - self._last_tokens)
        # from the critical threshold a request cannot go without the compaction (the next turn would not fit
        # beside its max_tokens); below it, it never waits for a summary call
        self._wait_at = lim.critical if self.cfg.levels.background_summaries else 0
        if self._under_way() and tokens >= self._wait_at:
            # this request cannot be sent without the compaction: it waits for the summary under way
            self._land(report, wait=True)
            r = s.render(breakpoints=False)
            tokens = s.counter.calibrated(r.raw_tokens)
        cold = self.last_request_at is not None and now - self.last_request_at > self._ttl_s
        old = max(0, s.counter.calibrated(r.tool_tokens) - lim.keep_recent)
        trig = evaluate(lim, tokens=tokens, old_tool_tokens=old)
        if trig.max_level == "L2" and not cold and self._deferred_old is not None \
                and old < self._deferred_old + lim.min_batch // 4:
            trig = Trigger(None, "deferred before; not enough new old output since")  # no view every turn
        if trig.max_level is None and cold and self._pending:
            trig = Trigger(self._pending, "cache is cold: applying the deferred compaction at no re-write cost")
        if trig.max_level in (None, "L1", "L2") and self.cfg.economics.cache_aware and not self.tripped:
            ahead = self._loop_ahead(tokens)
            if ahead is not None and tokens + ahead >= lim.hard:
                # the edit comes within the loop anyway, re-write and all: the choice is only where, and here
                # no reasoning is lost, so the window's economics do not hold it back (forced)
                trig = Trigger("L3", f"a person's turn: the tool loop ahead (about {ahead} tokens, by the session's "
                                     "own loops) would reach the hard threshold mid-loop, where an edit costs the "
                                     "thinking of the turn it answers; compacting now, where nothing is lost",
                               forced=True, min_removed=lim.min_batch)  # a batch, or it is not worth it
                lim = self._room_for(lim, ahead)
        if cold and self.cfg.economics.cache_aware and not self.tripped and trig.max_level in (None, "L1", "L2"):
            trig = Trigger("L3", "cache is cold: the next request re-writes everything anyway, so a collapse "
                                 "costs no extra write", cold=True, fallback=trig.max_level)
        if trig.max_level is not None and not trig.forced and lv.lookback_coverage > 0 \
                and not self._lookback.lookbacks:
            # nothing the window does not force until the agent has shown how far back it looks: a budget
            # chosen before any look-back is a guess, and what it hides the agent may need (issue 63: at 1M,
            # clearing at 104k under the configured 50k hid the reads an agent came back to 16 reads later,
            # and 8 of its first 8 submissions re-read)
            self._pending = trig.max_level
            if not self._unshown_said:
                self._unshown_said = True
                report.events.append(self._emit(
                    "deferred", level=trig.max_level, tokens_before=tokens, tokens_after=tokens,
                    reason=f"{trig.reason}; the agent has not yet looked back at anything it read: nothing is hidden "
                           "until it has, or until the window forces it (said once)"))
            trig = Trigger(None, "the agent's reach is not shown yet")
        # while a summary is under way in the background, no other compaction is planned before it lands
        if trig.max_level is not None and not self._under_way():
            if self.tripped:
                report.events.append(self._emit("skipped", reason="summaries are stopped for this session after "
                                                f"{self.cfg.safety.failure_limit} consecutive failures",
                                                tokens_before=tokens, tokens_after=tokens))
            else:
                body = None
                if model and self._wants_body():
                    body = s.render(model=model, max_tokens=max_tokens or 1, **(params or {})).body
                before = tokens
                tokens = self._compact(trig, cold, body, report, model, lim)
                # deferred, or nothing worth clearing: look again once a quarter batch more old output
                # has accrued, not every turn (each look builds a view of the whole session)
                self._deferred_old = old if (self._pending or tokens >= before) else None
        report.tokens_after = self._ensure_fits(tokens, lim, report, model)
        if report.context_full is not None:
            return report
        self._last_tokens = report.tokens_after
        # what changes bytes already sent: not the shortening of new results, nor lines given back to them
        self._choose_ttl(model, report.tokens_after, edited=any(e.start < since for e in report.entries), cold=cold)
        if self._first:
            self._first = False
            if any(e.level != RESTORE_LEVEL for e in report.entries):
                report.events.append(self._first_notice(report))
        return report

    def _restore(self, report: Plan) -> None:
        """Lines of hidden output that the newest calls named, appended to their results
        (`compaction.restore`): never sent yet, so nothing cached changes."""
        s = self.draft
        self._lookback.observe(s)
        edited = frozenset(e.tool_use_id for e in report.entries if e.tool_use_id)
        edits = restore_edits(s, self._lookback, self.cfg.levels.working_set_chars, skip_ids=edited)
        if not edits:
            return
        before = self._now_tokens()
        entries = self._apply_or_refuse(Proposal(RESTORE_LEVEL, RESTORE_REASON, edits=list(edits)), True, None)
        if entries:
            report.entries += entries
            report.events.append(self._emit("restored", level=RESTORE_LEVEL, reason=RESTORE_REASON,
                                            tokens_before=before,
                                            tokens_after=self._now_tokens(), entries=[e.seq for e in entries]))

    def _first_notice(self, report: Plan) -> Event:
        """What the first request changed in the history the caller brought, and how to get it
        back: a user who wraps a long session sees it cut once, and must be told."""
        edits = [e for e in report.entries if e.level != RESTORE_LEVEL]  # what removed, not what was given back
        levels = sorted({e.level for e in edits if e.level})
        spans = ", ".join(f"messages[{e.start}]" if e.start == e.end else f"messages[{e.start}..{e.end}]"
                          for e in edits[:6]) + (", ..." if len(edits) > 6 else "")
        where = self.draft.path
        back = (f"`cachecompact render {where} --uncompacted` prints it whole" if where is not None else
                "Session.render(uncompacted=True) renders it whole")
        return self._emit(
            "first_compaction", level=levels[-1] if levels else None,
            reason=f"the first request of this session compacted the history it brought: {len(edits)} "
                   f"edit(s) ({', '.join(levels)}) of {spans}, {report.tokens_before:,} -> {report.tokens_after:,} "
                   f"tokens; the transcript keeps every original: {back}; wrap(..., strategy='none') sends "
                   "histories unchanged",
            tokens_before=report.tokens_before, tokens_after=report.tokens_after,
            entries=[e.seq for e in edits])

    def _choose_ttl(self, model: str, tokens: int, *, edited: bool, cold: bool) -> None:
        """This request's TTLs, when the policy chooses them (``Economics.ttl="auto"``): what it
        writes is what the previous request did not leave in the cache (nothing after a cold gap,
        the prefix after an edit), priced by the model at this prompt size; the chance of a gap
        between the two TTLs comes from the session's own gaps (`GapMeter`)."""
        if self.cfg.economics.ttl != "auto":
            return
        prefix = self.draft.counter.calibrated(self.draft.render(breakpoints=False).prefix_tokens)
        if self._sent is None or cold:
            read = 0
        elif edited:
            read = min(prefix, self._sent[0])
        else:
            read = min(self._sent[0], tokens)
        prefix_written = max(0, prefix - read)
        choice = choose_ttls(priced(model, self.ctx.prices), p_between=self.gaps.between(), prefix_tokens=prefix,
                             total_tokens=tokens, prefix_written=prefix_written,
                             rest_written=max(0, tokens - max(read, prefix)))
        # "5m" is rendered as the API's default (no ttl key), as without a choice
        self.prefix_ttl = "1h" if choice.prefix == "1h" else None
        self.ttl = "1h" if choice.rest == "1h" else None
        self._sent = (tokens, LONG_TTL_S if choice.rest == "1h" else SHORT_TTL_S)

    def _wants_body(self) -> bool:
        """Only a prefix-reusing summarizer needs the agent's own request."""
        return getattr(self.summarizer, "mode", "forced-tool") in ("auto", "prefix-reuse")

    def _candidates(self, view: View, trig: Trigger, lim: Limits, stop_at_target: bool = True) -> list[Proposal]:
        """Guarded proposals from L1 up to the trigger's level; stop at the first that reaches the
        target (unless ``stop_at_target`` is False)."""
        tokens = self.draft.counter.calibrated(view.total_tokens)
        out: list[Proposal] = []
        top = LEVEL_ORDER.index(trig.max_level or "L1")
        for level in LEVEL_ORDER[: top + 1]:
            p = self._guard(self._propose(level, view, lim))
            if p.empty:
                continue
            out.append(p)
            if stop_at_target and tokens - self.draft.counter.calibrated(p.tokens_removed) <= lim.aim():
                break
        return out

    def _compact(self, trig: Trigger, cold: bool, body: dict[str, Any] | None, report: Plan, model: str,
                 lim: Limits) -> int:
        s, cfg = self.draft, self.cfg
        view = build_view(s)
        tokens = s.counter.calibrated(view.total_tokens)
        cands = self._candidates(view, trig, lim, stop_at_target=not trig.cold)
        reached = [p for p in cands if tokens - s.counter.calibrated(p.tokens_removed) <= lim.aim()]
        order = reached + sorted([p for p in cands if p not in reached], key=lambda x: -x.tokens_removed)
        if trig.min_removed:  # only a plan big enough to make the room it is for
            order = [p for p in order if s.counter.calibrated(p.tokens_removed) >= trig.min_removed]
        if trig.cold:  # nothing extra to re-write: the plan that removes most, if it is a batch worth a summary
            big = sorted([p for p in cands if p.tokens_removed >= lim.min_batch], key=lambda x: -x.tokens_removed)
            low = LEVEL_ORDER.index(trig.fallback) if trig.fallback else -1
            order = big or [p for p in order if LEVEL_ORDER.index(p.level) <= low]  # else what the triggers allow
        if cfg.economics.cache_aware and not cold:
            paying = [q for p in order for q in self._no_thrash(p, view, lim, model)]
            if not paying and cands and cands[-1].level != trig.max_level:
                # the levels tried first thrash: the higher ones the trigger allows may not
                more = self._candidates(view, trig, lim, stop_at_target=False)[len(cands):]
                paying = [q for p in more for q in self._no_thrash(p, view, lim, model)]
            order = paying or self._least_thrash(order, view, lim, model)  # the window forces it
        loop = self._mid_tool_loop_thinking()
        for p in order:
            weighed: dict[str, Any] = {}  # what decided the edit, in its event (issue 48: which way, and why)
            api_end = self._api_end(p, model)
            writers = self._writer_prices(p, api_end, model, cold, body, view) if api_end is not None else None
            if writers is not None and not writers["api_pays"]:
                api_end = None  # our own summary: cheaper, with the reasoning it throws away counted
            if writers is not None:  # which writer, and both prices, in the decision's event
                weighed = {"writer": "api" if api_end is not None else "ours",
                           "writers": {k: v for k, v in writers.items() if k != "api_pays"}}
            later = self._lands_later(p, api_end, tokens)
            # a summary that lands on a later request lands on a warm cache: priced so, not as this cold one
            now_cold = cold and not later
            if loop is not None and not trig.forced and p.break_at is not None and p.break_at < loop \
                    and api_end is None:  # an API-written summary keeps that thinking valid
                # the turn whose tool calls this request answers thinks: an edit before it invalidates that
                # thinking, which may not be removed (the API would drop it). Wait for a turn where it can be.
                self._pending = p.level
                report.events.append(self._emit(
                    "deferred", level=p.level, tokens_before=tokens, tokens_after=tokens,
                    reason=f"{trig.reason}; mid tool loop: an edit now would invalidate the thinking of the turn whose "
                           f"calls this request answers (messages[{loop}]), which may not be removed; deferred to the "
                           "next request where it can be left out (a person's turn, or a turn without thinking)"))
                return tokens
            if cfg.economics.cache_aware and not trig.forced and p.break_at is not None:
                price = priced(model, self.ctx.prices)
                est_summary = ((cfg.levels.summary_tokens * price.output + view.total_tokens * price.read) / 1e6
                               if p.summarize else 0.0)
                if writers is not None:  # the writer chosen, as priced when choosing
                    est_summary = writers["api_usd"] if api_end is not None else writers["ours_usd"]
                reasoning = 0 if api_end is not None else self._reasoning_lost(p.break_at)  # the API's keeps it
                econ = economics(cfg, price, removed=p.tokens_removed,
                                 suffix=view.suffix_tokens(self._rewrite_from(p.break_at)),
                                 steps=self.steps, cold=now_cold, summary_cost=est_summary, ttl=self.ttl or "5m",
                                 reasoning_tokens=reasoning)
                weighed = {**weighed, "net_usd": round(econ.net, 6),
                           "saving_per_turn_usd": round(econ.saving_per_turn, 6),
                           "turns": econ.remaining_turns, "rewrite_usd": round(econ.rewrite_cost, 6),
                           "summary_usd": round(econ.summary_cost, 6), "reasoning_lost_tokens": reasoning,
                           "reasoning_lost_usd": round(econ.reasoning_cost, 6),
                           "recent_budget_tokens": lim.keep_recent,
                           "coverage_target": self._coverage_now if self.cfg.levels.lookback_coverage > 0 else None,
                           "writer": "api" if api_end is not None else "ours"}
                small = not now_cold and p.tokens_removed < lim.min_batch
                if small or not econ.pays:
                    self._pending = p.level
                    why = (f"removes {p.tokens_removed} < {lim.min_batch} tokens" if small else
                           f"re-write ${econ.rewrite_cost:.4f} + summary ${econ.summary_cost:.4f}"
                           + (f" + reasoning lost ${econ.reasoning_cost:.4f}" if econ.reasoning_cost else "")
                           + f" > saving ${econ.saving_per_turn:.5f}/turn x {econ.remaining_turns}")
                    report.events.append(self._emit("deferred", level=p.level, reason=f"{trig.reason}; {why}",
                                                    tokens_before=tokens, tokens_after=tokens, detail=weighed))
                    if cold and not now_cold:
                        continue  # it would land warm: a plan this cold request makes for free may still be worth it
                    return tokens
            if api_end is not None:
                done = self._ask_api(p, api_end, trig, cold, tokens, lim, report, model, weighed)
                if done is not None:
                    return done  # else no call could be made: our own summary
            if later and api_end is None and self._ask_own(p, trig, cold, body, tokens, report, weighed):
                return tokens  # this request goes whole; the summary lands on a later one
            t0 = time.perf_counter()
            try:
                entries, cost = self._apply(p, cold, body)
            except InvalidEditError as err:  # the ledger refused the plan: a bug in planning, not a failure
                self._planning_bug(p.level, f"the ledger refused {p.level}'s edit: {err}")
                continue
            except Exception as err:  # summarizer errors, invalid summaries, API errors count for the breaker
                cost = getattr(err, "cost_usd", 0.0)
                self.summary_cost += cost
                self._fail(p.level, f"{type(err).__name__}: {err}", tokens, cost, report)
                if self.tripped:
                    return tokens
                continue
            self.summary_cost += cost
            after = self._now_tokens()
            report.entries += entries
            if after >= tokens:
                self._fail(p.level, "no reduction", tokens, cost, report)
                continue
            if p.summarize:
                self.failures = 0  # the breaker counts summaries: an L1/L2 success says nothing about them
            self._mark_compacted(p)
            self.last_compact_step = self.steps
            self._pending = None
            pays = (f"; pays: saving ${weighed['saving_per_turn_usd']:.5f}/turn x {weighed['turns']} > re-write "
                    f"${weighed['rewrite_usd']:.4f} + summary ${weighed['summary_usd']:.4f}"
                    + (f" + {weighed['reasoning_lost_tokens']} reasoning tokens lost "
                       f"${weighed['reasoning_lost_usd']:.4f}" if weighed["reasoning_lost_tokens"]
                       else "; no reasoning lost")
                    + f"; keeps the newest {weighed['recent_budget_tokens']:,} tokens verbatim"
                    + (f", sized to cover {weighed['coverage_target']:.0%} of the agent's look-backs"
                       if weighed["coverage_target"] else "")) if "net_usd" in weighed else ""
            report.events.append(self._emit("compaction", level=p.level, reason=f"{trig.reason}: {p.reason}{pays}",
                                            tokens_before=tokens, tokens_after=after, cost_usd=cost,
                                            duration_s=time.perf_counter() - t0, entries=[e.seq for e in entries],
                                            detail={**weighed, "hidden": self._hidden(p, lim)}))
            return after
        return tokens

    def _hidden(self, p: Proposal, lim: Limits) -> dict[str, Any]:
        """What an edit hid, for its event (issue 63): the messages and the tokens it took out of
        view, and the estimated chance that the agent's next look-back reaches past what it kept:
        of the look-backs made with more than the kept budget behind them, the share that reached
        past it, with half a look-back each way (Jeffreys), so none seen reads 0.5; None before
        any look-back. The price paid is the rest of the detail (``rewrite_usd``, ``summary_usd``,
        ``reasoning_lost_usd``) where the economics weighed it."""
        spans = [(e.start, e.end) for e in p.edits]
        if p.summarize is not None:
            spans.append(p.summarize)
        keep = int(lim.keep_recent / max(self.draft.counter.calibration, 1e-9))
        far, at_risk = self._lookback.beyond(keep)
        chance = round((far + 0.5) / (at_risk + 1.0), 4) if self._lookback.lookbacks else None
        return {"messages": [min(a for a, _ in spans), max(b for _, b in spans)] if spans else None,
                "tokens": self.draft.counter.calibrated(p.tokens_removed), "kept_tokens": lim.keep_recent,
                "chance_of_use": chance}

    # -- API-written summaries (`compaction._api_summary`) ---------------------------------------

    def _api_end(self, p: Proposal, model: str) -> int | None:
        """The last message an API-written summary in place of ``p`` covers (from message 0), or
        None when ours is made instead: not a summary level, the model or summarizer cannot, the
        API refused before, or the kept turns would not start with a change of role."""
        if p.summarize is None or p.level not in ("L3", "L4") or self._api_refused \
                or not usable(self.summarizer, model, self.cfg.levels.api_summaries is not False):
            return None
        return api_range_end(self.draft.transcript, p.summarize[1])

    def _writer_prices(self, p: Proposal, end: int, model: str, cold: bool, body: dict[str, Any] | None,
                       view: View) -> dict[str, Any] | None:
        """Who writes ``p``'s summary, by price (issue 63, "API-written summaries only where they
        buy something"): the API's on the conversation's own model reads the whole request
        through message ``end`` (at the cache-read price when warm: it shares the request's
        cache; written when cold) and writes the summary at that model's output price; ours
        costs what our summarizer estimates for the range (`PricedSummarizer.estimate_usd`: a
        small model reading the range, or the conversation's cached prefix) plus the reasoning it
        throws away (the thinking of the task under way after the edit, `_reasoning_lost`, priced
        as output: the API's keeps that valid). The API's is chosen when it costs less. Without
        thinking to keep there is nothing to buy with it: a cell of the retention grid spent
        $3.34 of $8.11 on API summaries where ours cost $0.02-0.08 a run. None when ours cannot
        be priced (a summarizer without an estimate): the API's, as before. The thinking the
        compaction call itself may spend is not counted (it is the caller's setting), nor reading
        the first messages ours keeps verbatim where the API's block stands for them: counted (as
        read on each remaining turn) it moved thinking cells of the retention grid to the API's
        and their cost from -11.9% to -7.7% of always-API, and changed no cell without thinking."""
        if self.cfg.levels.api_summaries != "priced" or p.summarize is None or p.break_at is None \
                or not isinstance(self.summarizer, PricedSummarizer):
            return None
        price = priced(model, self.ctx.prices)
        ctr = self.draft.counter
        read_in = ctr.calibrated(view.total_tokens - view.suffix_tokens(end + 1))
        api = (read_in * (price.write_5m if cold else price.read) + self.cfg.levels.summary_tokens * price.output) / 1e6
        start, stop = p.summarize
        req = summary_request(self.draft, start, stop, body=body if self._wants_body() else None,
                              cache_warm=not cold, at=self._now)
        ours = self.summarizer.estimate_usd(req)
        reasoning = self._reasoning_lost(p.break_at)
        lost = reasoning * price.output / 1e6
        return {"api_usd": round(api, 6), "ours_usd": round(ours, 6), "reasoning_lost_usd": round(lost, 6),
                "api_pays": api < ours + lost}

    def _ask_api(self, p: Proposal, end: int, trig: Trigger, cold: bool, tokens: int, lim: Limits,
                 report: Plan, model: str, weighed: dict[str, Any] | None = None) -> int | None:
        """Ask the API to summarize messages 0..end: in the background (swapped in on the next
        request) unless the window forces it now or the cache is cold; the tokens after, or None
        when no call could be bound (no client, no credential) or no block came back in the
        foreground: the caller then makes its own summary."""
        req = self._api_request(p.level, f"{trig.reason}: {p.reason}", end, model, tokens, lim)
        if req is None:
            return None
        req.weighed = dict(weighed or {})
        self._pending = None
        wait = tokens >= self._wait_at if self.cfg.levels.background_summaries else (
            trig.forced or cold or tokens >= lim.hard)  # before issue 62's item 9
        if wait:
            return self._swap_api(req, report)  # None when it failed: our own summary, now
        self._api_req = req
        report.events.append(self._emit(
            "compaction_requested", level=p.level, tokens_before=tokens, tokens_after=tokens,
            reason=f"{req.reason}; the API writes the summary of messages 0..{end} in the background, swapped in "
                   "on a later request (this one goes whole)",
            detail={**(weighed or {}), "writer": "api", "covers": [0, end]}))
        return tokens

    # -- summaries in the background (ours and the API's) ----------------------------------------

    def _lands_later(self, p: Proposal, api_end: int | None, tokens: int) -> bool:
        """Whether ``p``'s summary would be made in the background and land on a later request:
        a summary level, a request that can be sent without it (below `_wait_at`), and a call to
        make: the API's, or our summarizer's, except in a session whose turns think. There it is
        made at once: landing inside the tool loop that follows would invalidate the loop's
        thinking (the API drops the calling turn's block), and the API's summary, which keeps
        it, is the default on every model with preserved thinking."""
        if p.summarize is None or tokens >= self._wait_at:
            return False
        return api_end is not None or (not self._turns_think() and bound_call(self.summarizer) is not None)

    def _turns_think(self) -> bool:
        """Whether the latest assistant turn carries thinking."""
        t = self.draft.transcript
        for i in range(len(t) - 1, -1, -1):
            if t[i].role == "assistant":
                return any(isinstance(b, (ThinkingBlock, RedactedThinkingBlock)) for b in content_blocks(t[i]))
        return False

    def _simulated(self) -> bool:
        """Whether the session runs on a clock that is not the wall's (its summarizer carries it:
        a replay, the bench). Wall time means nothing there, so a summary under way lands on the
        next request, which waits for it: the run stays reproducible."""
        return getattr(self.summarizer, "clock", None) is not None

    def _under_way(self) -> bool:
        """Whether a summary asked in the background has not landed yet."""
        return self._api_req is not None or self._own_req is not None

    def _land(self, report: Plan, *, wait: bool) -> None:
        """Apply the summary under way in the background when its call is back, on this request
        (the ledger records its edit here, as every edit, against the request it is first applied
        to). With ``wait`` (the request cannot be sent without it) wait for the call, or make one
        never started. Without, a call not back yet stays under way (started now if its request
        got no response), and so does our own summary while this request answers a thinking
        turn's calls (it would invalidate that thinking: as `_append_idle`, a later request)."""
        if self._api_req is not None:
            req = self._api_req
            if not wait and not req.ready():
                req.send(self._now)
                return
            self._api_req = None
            self._swap_api(req, report)
        elif self._own_req is not None:
            own = self._own_req
            if not wait:
                if not own.ready():
                    own.send()
                    return
                loop = self._mid_tool_loop_thinking()
                if loop is not None and own.plan.break_at is not None and own.plan.break_at < loop:
                    return
            self._own_req = None
            self._swap_own(own, report)

    def _ask_own(self, p: Proposal, trig: Trigger, cold: bool, body: dict[str, Any] | None, tokens: int,
                 report: Plan, weighed: dict[str, Any]) -> bool:
        """Start our own summary for ``p`` in the background (at once, or, when it reuses this
        request's cached prefix, once its response is in), when the summarizer makes a call that
        can be bound here; False when it cannot (extractive: the caller summarizes now, nothing to
        wait for)."""
        assert p.summarize is not None
        call = bound_call(self.summarizer)
        if call is None:
            return False
        start, end = p.summarize
        keep = working_lines(self.draft, start, end, self.cfg.levels.working_set_chars)
        req = summary_request(self.draft, start, end, body=body, cache_warm=not cold, at=self._now)
        own = self._own_req = OwnRequest(p, f"{trig.reason}: {p.reason}", req, call, tokens, keep)
        if req.body is None:  # a summary on the range alone shares no cache with this request: it starts now
            own.send()
        self._pending = None
        report.events.append(self._emit(
            "compaction_requested", level=p.level, tokens_before=tokens, tokens_after=tokens,
            reason=f"{trig.reason}: {p.reason}; the summary of messages {start}..{end} is made in the background "
                   "and lands on a later request (this one goes whole)",
            detail={**weighed, "writer": "ours", "covers": [start, end]}))
        return True

    def _swap_own(self, own: OwnRequest, report: Plan) -> int | None:
        """Apply our own summary made in the background with the rest of its plan; the tokens
        after, or None when it failed (counted for the breaker, as in the foreground) or the
        ledger refused it (the history changed under it: dropped, not retried)."""
        s = self.draft
        before = self._now_tokens()
        t0 = time.perf_counter()
        try:
            res = own.result()
            waited = time.perf_counter() - t0  # the request's wait for the call (0 when it was back)
            edit = summary_edit(own.req, res, reason=f"{own.level}: {own.plan.reason}", verbatim=own.verbatim)
            b, a = s.edit_effect(edit)
            if a >= b:
                raise SummaryRejected(f"no reduction: the summary ({a} tokens) is not smaller than the range "
                                      f"({b} tokens)", res.cost_usd)
        except Exception as err:  # summarizer errors, invalid summaries, API errors count for the breaker
            cost = getattr(err, "cost_usd", 0.0)
            self.summary_cost += cost
            self._fail(own.level, f"{type(err).__name__}: {err}", before, cost, report)
            return None
        self.summary_cost += res.cost_usd
        try:
            entries = self._stage(own.plan, [*own.plan.edits, edit])
        except InvalidEditError as err:
            self._planning_bug(own.level, f"the ledger refused the summary made in the background: {err}")
            return None
        after = self._now_tokens()
        report.entries += entries
        if after >= before:
            self._fail(own.level, "no reduction", before, res.cost_usd, report)
            return None
        self.failures = 0
        self._mark_compacted(own.plan)
        self.last_compact_step = self.steps
        self._pending = None
        start, end = own.req.range
        report.events.append(self._emit(
            "compaction", level=own.level, reason=f"{own.reason}; summarized in the background, applied here",
            tokens_before=before, tokens_after=after, cost_usd=res.cost_usd,
            duration_s=time.perf_counter() - t0, entries=[e.seq for e in entries],
            detail={"writer": "ours", "covers": [start, end], "decided_at_tokens": own.tokens,
                    "waited_s": round(waited, 4)}))
        return after

    def _api_request(self, level: Level, reason: str, end: int, model: str, tokens: int,
                     lim: Limits) -> ApiRequest | None:
        """The compaction request for messages 0..end, its call bound in this thread (the proxy's
        caller key is here); None when the summarizer cannot make one (no client, no key). Its
        ``max_tokens`` is the caller's, lowered to what the window leaves beside this request's
        tokens and the estimate margin (`compaction_max_tokens` cites the rule)."""
        call = self.summarizer.ondemand() if isinstance(self.summarizer, OnDemandSummarizer) else None
        if call is None:
            return None
        max_tokens, params = self._request
        out = compaction_max_tokens(max_tokens, lim.window, tokens + int(lim.estimate_error * lim.window),
                                    params.get("thinking"))
        # marks what earlier requests wrote too, so it reads the longest warm entry before it writes the rest
        body = self.draft.render(transcript_len=end + 1, warm=True,
                                   **{**params, "model": model, "max_tokens": out}).body
        # what the API's summary must quote (checked on return): the task, whose first messages the block
        # stands in for from now on, and the person's newest request when the range covers it
        latest = latest_request(self.draft)
        keep = Verbatim(goal=first_words(task_goal(self.draft)),
                        latest=first_words(latest[1]) if latest is not None and latest[0] <= end else "")
        return ApiRequest(level, reason, end, body, call, tokens, keep=keep)

    def _swap_api(self, req: ApiRequest, report: Plan) -> int | None:
        """Put the API's block in place of messages 0..req.end; the tokens after, or None when no
        block came (the caller then makes its own summary where one fits, never dropping rounds
        for want of the API's). A failure is counted as a failed summary, and one the API refused
        (not a transient 529) turns them off for the session: the policy's own summaries stand
        from then on."""
        s = self.draft
        before = self._now_tokens()
        t0 = time.perf_counter()
        try:
            res = req.result(self._now)
            waited = time.perf_counter() - t0  # the request's wait for the call (0 when it was back)
        except Exception as err:  # the SDK's errors, a refused answer (SummaryRejected)
            cost = getattr(err, "cost_usd", 0.0)
            self.summary_cost += cost
            if getattr(err, "status_code", None) not in (429, 500, 502, 503, 529):  # a refusal, not a passing failure
                self._api_refused = True
            self._fail(req.level, f"API-written summary: {type(err).__name__}: {str(err)[:300]}", before, cost,
                       report)
            return None
        self.summary_cost += res.cost_usd
        try:
            entry = s.stage(req.edit(res), level=req.level)
        except InvalidEditError as err:  # the history changed under it (an L5 cut since): dropped, not retried
            self._planning_bug(req.level, f"the ledger refused the API-written summary: {err}")
            return None
        after = self._now_tokens()
        report.entries.append(entry)
        self.failures = 0
        s.stable_before = None  # a summary starts at the first message: the next one re-writes from there anyway
        self.last_compact_step = self.steps
        report.events.append(self._emit(
            "compaction", level=req.level, reason=f"{req.reason}; written by the API (on-demand compaction): "
                                                  "the kept turns' thinking stays valid",
            tokens_before=before, tokens_after=after, cost_usd=res.cost_usd,
            duration_s=time.perf_counter() - t0, entries=[entry.seq],
            detail={**req.weighed, "writer": "api", "covers": [0, req.end], "decided_at_tokens": req.tokens,
                    "waited_s": round(waited, 4)}))
        return after

    def _loop_ahead(self, tokens: int) -> int | None:
        """At a person's turn of a session whose turns think (preserved thinking), the tokens the tool
        loop that starts now is expected to add before the next person's turn: the median number of
        assistant turns of the session's own finished loops times its typical growth per turn. None
        elsewhere, or before one loop has finished (nothing to go by)."""
        t = self.draft.transcript
        n = len(t)
        if n < 2 or t[n - 1].role != "user" or t.is_tool_result_message(n - 1) or not self._growth:
            return None
        thinks, people, assistants = self._scanned(n)
        if not thinks:
            return None
        loops = [assistants[b] - assistants[a + 1] for a, b in pairwise(people)]
        if not loops:
            return None
        turns = sorted(loops)[len(loops) // 2]
        growth = sorted(self._growth)[len(self._growth) // 2]
        return turns * growth

    def _scanned(self, n: int) -> tuple[bool, list[int], list[int]]:
        """Over the transcript's first ``n`` messages: whether an assistant turn thinks, the
        indices of the person's turns (user messages that are not tool results), and the number
        of assistant turns before each index (``n + 1`` counts). Each message is read once: the
        scan so far is kept and extended (`_scan`), so a turn costs what it appended."""
        t = self.draft.transcript
        done, thinks, people, assistants = self._scan
        if n < done:  # never for an append-only transcript; read again rather than trust it
            done, thinks, people, assistants = 0, False, [], [0]
        for i in range(done, n):
            m = t[i]
            if m.role == "assistant":
                thinks = thinks or any(isinstance(b, (ThinkingBlock, RedactedThinkingBlock)) for b in content_blocks(m))
                assistants.append(assistants[-1] + 1)
            else:
                if m.role == "user" and not t.is_tool_result_message(i):
                    people.append(i)
                assistants.append(assistants[-1])
        self._scan = (n, thinks, people, assistants)
        return thinks, people, assistants

    def _room_for(self, lim: Limits, ahead: int) -> Limits:
        """``lim`` for a compaction at a person's turn that makes room for the loop ahead: it aims under
        the hard threshold less the loop's expected growth, and keeps at most what fits beside it."""
        s = self.draft
        prefix = s.counter.calibrated(s.render(breakpoints=False).prefix_tokens)
        summary = self.cfg.levels.summary_tokens
        aim = max(prefix + summary, lim.hard - ahead)
        keep = max(0, min(lim.keep_recent, aim - prefix - summary))
        return replace(lim, target=min(lim.aim(), aim), keep_recent=keep, collapse_keep=min(lim.collapse_keep, keep))

    def _mid_tool_loop_thinking(self) -> int | None:
        """The latest assistant message when this request answers its tool calls and it carries
        thinking (`history.thinking`: its thinking may not be left out), else None."""
        t = self.draft.transcript
        a = latest_tool_turn(t, len(t))
        if a is None or not any(isinstance(b, (ThinkingBlock, RedactedThinkingBlock)) for b in content_blocks(t[a])):
            return None
        return a

    def _latest_request(self) -> int | None:
        """The message of the person's newest request (`strategy.latest_request`), which no drop
        removes and every summary that covers it carries word for word."""
        found = latest_request(self.draft)
        return found[0] if found is not None else None

    def _long_request(self) -> int | None:
        """The message of the person's newest request when a summary could not carry it whole (a
        paste longer than a summary quotes, `request_head`): no summary may cover it, for it would
        keep only its first words (L5 keeps it whole). A shorter one is quoted word for word, so any
        edit may cover it."""
        found = latest_request(self.draft)
        return found[0] if found is not None and request_head(found[1]) != found[1] else None

    def _task_start(self) -> int:
        """The latest message a person wrote (a user message that is not tool results): the task
        under way starts after it (-1 when there is none)."""
        t = self.draft.transcript
        for i in range(len(t) - 1, -1, -1):
            if t[i].role == "user" and not t.is_tool_result_message(i):
                return i
        return -1

    def _reasoning_lost(self, break_at: int) -> int:
        """The output tokens of the turns of the task under way that carry thinking an edit at
        ``break_at`` invalidates (preserved thinking: `history.thinking`): the turns after both the
        edit and the person's latest message. Turns of a finished task are not counted: the agent
        has moved on from that reasoning. Zero at a person's turn, so edits go there when they can."""
        t = self.draft.transcript
        lost = 0
        for i, n in self._thought.items():
            if i > break_at and i < len(t) and t[i].role == "assistant" and any(
                    isinstance(b, (ThinkingBlock, RedactedThinkingBlock)) for b in content_blocks(t[i])):
                lost += n
        return lost

    def _payback_margin(self, p: Proposal, view: View, lim: Limits, model: str) -> float:
        """The no-thrash rule (docs/policy.md, "No thrash"): an edit re-writes what it keeps after
        its edit point (``kept``) at w - r more than reading it, and saves ``removed`` reads a
        turn, so it pays back after kept * (w/r - 1) / removed turns. The context grows back to
        ``critical`` (where the window forces the next compaction) after (critical - after) / g
        turns, g the session's typical growth. The margin is the turns left between the two:
        below zero the edit thrashes (the next one re-writes again before this one's saving has
        covered it)."""
        if p.break_at is None or p.tokens_removed <= 0:
            return math.inf  # nothing sent is changed: no re-write
        ctr = self.draft.counter
        removed = ctr.calibrated(p.tokens_removed)
        kept = max(0, ctr.calibrated(view.suffix_tokens(self._rewrite_from(p.break_at))) - removed)
        after = ctr.calibrated(view.total_tokens) - removed
        growth = sorted(self._growth)[len(self._growth) // 2] if self._growth else 0
        g = max(1, growth, lim.limit // 100)
        premium = max(0.0, priced(model, self.ctx.prices).write_over_read(self.ttl or "5m") - 1)
        return (lim.critical - after) / g - kept * premium / max(1, removed)

    def _pays_back(self, p: Proposal, view: View, lim: Limits, model: str) -> bool:
        return self._payback_margin(p, view, lim, model) >= 0

    def _deeper_cuts(self, p: Proposal, view: View, lim: Limits) -> Iterator[Proposal]:
        """The same summary level keeping fewer of the newest tokens, most kept first: down to
        what the agent's own look-backs have shown it reaches (`LookbackMeter.reach`), and never
        less than the newest round (its result has not been shown to the agent yet).

        The floor is evidence, not the configured budget: a budget the agent has not shown it
        needs is a guess, and where a turn adds a large share of the window, keeping it makes
        every collapse re-write it again a few turns later (benchmarks/async_agent.py, 60k
        window, 2.5-10k files read whole: re-writes were 0.81 of the cost with the configured
        budget as the floor). A cut that ignored the look-backs hid what the agent comes back to
        (issue 47: facts two to nine reads back were re-read in 34 of 40 closed-loop runs). None
        for a budget the user fixed (the meter off): it is kept as given."""
        if p.level not in ("L3", "L4") or p.break_at is None or self.cfg.levels.lookback_coverage <= 0:
            return  # a budget the user fixed is kept as given (issue 63: cut to 3-7k, it re-read on every use)
        lv, ctr = self.cfg.levels, self.draft.counter
        cal = max(ctr.calibration, 1e-9)
        keep = int(lim.collapse_keep / cal)
        floor = self._lookback.reach(self._coverage_now) if lv.lookback_coverage > 0 else 0
        pasted = self._long_request()
        last = view.n - 1
        tails = sorted({view.suffix_tokens(e + 1) for e in view.round_ends if e < last}, reverse=True)  # O(1) each
        for tail in tails:
            if tail >= keep:
                continue
            rounds = view.rounds_within(tail)
            if tail < floor or rounds < 1:
                return
            if p.level == "L4":
                q = propose_full(view, keep_rounds=rounds, summary_tokens=lv.summary_tokens)
            else:
                q = propose_turn_collapse(view, target_tokens=int(lim.aim() / cal), keep_rounds=rounds,
                                          summary_tokens=lv.summary_tokens, min_batch_tokens=lim.min_batch,
                                          keep_tokens=tail)
            q = self._guard(q)
            if pasted is not None and q.summarize is not None and q.summarize[1] >= pasted:
                return  # the person's long newest message stays whole: a summary would quote its first words only
            if not q.empty and q.tokens_removed > p.tokens_removed:
                yield replace(q, reason=f"{q.reason}; keeps the newest {ctr.calibrated(tail):,} tokens, not "
                                        f"{lim.collapse_keep:,}: the cycle must pay back its re-write (the "
                                        f"agent's look-backs reach {ctr.calibrated(floor):,})")

    def _no_thrash(self, p: Proposal, view: View, lim: Limits, model: str) -> list[Proposal]:
        """``p`` if it pays back (`_pays_back`); else the deeper cut of it that keeps the most and
        pays back (`_deeper_cuts`); else nothing (the next candidate is tried; when none pays
        back, `_least_thrash` picks among them)."""
        if self._pays_back(p, view, lim, model):
            return [p]
        return next(([q] for q in self._deeper_cuts(p, view, lim) if self._pays_back(q, view, lim, model)), [])

    def _least_thrash(self, order: list[Proposal], view: View, lim: Limits, model: str) -> list[Proposal]:
        """When the window forces a compaction and no plan pays back: the plans and their deeper
        cuts, closest to paying back first. Every plan here re-writes before it has paid back; the
        one with the largest margin re-writes least per turn (the 60k async agent kept four rounds
        of 8k files at each forced collapse, removing 5-10k, and collapsed again a turn later)."""
        plans = [*order, *(q for p in order for q in self._deeper_cuts(p, view, lim))]
        ctr = self.draft.counter
        total = view.total_tokens

        def over(q: Proposal) -> bool:  # still above critical: the window would force L5 after it
            return ctr.calibrated(total - q.tokens_removed) > lim.critical

        # a plan that gets under critical first, whatever its margin (a cheaper-looking one that does not
        # would be followed by L5's cut, a second re-write)
        return sorted(plans, key=lambda q: (over(q), -self._payback_margin(q, view, lim, model)))

    def _rewrite_from(self, break_at: int) -> int:
        """The first message an edit at ``break_at`` makes the next request write again: after the
        marked compacted part if the edit starts behind it (that entry is still read), else
        after the immutable prefix (the only other entry before the edit that a read reaches)."""
        pe, mark = self.draft.edit_floor or 0, self.draft.stable_before
        return mark if mark is not None and pe <= mark <= break_at else pe

    def _mark_compacted(self, p: Proposal) -> None:
        """After clearing old results, nothing before the last one cleared changes until the
        next clear, which starts after it: mark that point for the breakpoint planner (the
        session keeps it in each request record). A summary or cut starts at the prefix, so
        the next one re-writes from there anyway."""
        cleared = self.cfg.economics.mark_compacted and p.level in ("L1", "L2") and p.summarize is None
        own = [e for e in p.edits if e.reason != SUPERSEDED_REASON]  # superseded ones may sit in the recent part
        self.draft.stable_before = max(e.end for e in own) + 1 if cleared and own else None

    def _truncate(self, tokens: int, lim: Limits, report: Plan, why: str, drop_summary: bool = False) -> int:
        """L5: drop the oldest whole rounds; needs no summarizer, so it runs with the breaker open.

        It cuts to as far below the soft threshold as the window is above it, so one cache
        re-write buys many turns instead of the next critical turn coming two turns later.
        Unless it drops the leading summary too (the last resort), the rounds it would drop are
        summarized instead where that summary fits (`_summary_for_drop`)."""
        target = max(lim.soft - (lim.limit - lim.soft), lim.soft // 2)
        p = self._guard(propose_truncate(build_view(self.draft), target_tokens=int(
            target / max(self.draft.counter.calibration, 1e-9)), drop_summary=drop_summary,
            keep=self._latest_request()))
        if p.empty:
            return tokens
        no_summary = "drops the leading summary"
        if not drop_summary:
            done, no_summary = self._summary_for_drop(p, tokens, lim, report, why)
            if done is not None:
                return done
        try:
            entries, _ = self._apply(p, True, None)
        except InvalidEditError as err:
            self._planning_bug("L5", f"the ledger refused L5's edit: {err}")
            return tokens
        after = self._now_tokens()
        report.entries += entries
        self._mark_compacted(p)
        report.events.append(self._emit("compaction", level="L5", reason=why, tokens_before=tokens, tokens_after=after,
                                        entries=[e.seq for e in entries], detail={"no_summary": no_summary}))
        return after

    def _summary_for_drop(self, drop: Proposal, tokens: int, lim: Limits, report: Plan, why: str,
                          under: int | None = None) -> tuple[int | None, str]:
        """The window forces a cut: a summary of the rounds L5's ``drop`` would take out (from the
        first editable message, so it subsumes a leading summary, to the last round ``drop``
        ends), made in place of the drop where it fits: the request ends one turn below the
        critical threshold with it (or under ``under``, the reactive compaction's goal), or with
        less than the drop would leave, and within the limit. The tokens after, or None and why
        not (for L5's event): L5 drops them as before.

        Issue 62 ("never L5 while a summary fits"): L4 keeps at least `keep_rounds_l4` rounds,
        so with fewer in view beside a large prefix (Claude Code at 40-80k) its proposal was
        empty and L5 dropped the rounds with no summary at all. Our own summarizer writes it,
        never the API's: the alternative is a drop, which keeps no reasoning either, and the
        API's call reads the whole request and re-writes the first messages its block stands
        for, the price that made an earlier fewer-rounds L4 cost 4-32% more (docs/benchmarks.md,
        *A fewer-rounds L4 before L5, measured*). Not with the breaker open, not where the cut
        would reach a long newest request of the person's (a summary quotes its first words,
        `_long_request`; L5 keeps it whole), and not where the summary would not fit: then a
        summary call buys nothing a drop does not. A summary that fails counts for the breaker,
        and L5 drops the rounds as before."""
        if self.tripped:
            return None, "summaries are stopped (the breaker is open)"
        view = build_view(self.draft)
        start, prev = view.editable_start()
        end = max(e.end for e in drop.edits)
        ctr = self.draft.counter
        size = self.cfg.levels.summary_tokens
        long = self._long_request()
        if long is not None and start <= long <= end:
            return None, f"it would cover the person's long newest request (messages[{long}]), which L5 keeps whole"
        if end < start or view.tokens_between(start, end) <= size:
            return None, "the rounds are no bigger than a summary"
        p = self._guard(Proposal(
            "L4", f"the window forces a cut: a summary of the rounds L5 would drop (messages {start}..{end}), "
                  "which fits, in place of the drop", summarize=(start, end),
            tokens_removed=view.tokens_between(start, end) - size, break_at=start, previous_summary=prev))
        if p.empty:
            return None, "nothing after the immutable prefix to summarize"
        # fits: the request ends one turn below the ceiling with it, so the next turn goes without another cut;
        # a summary made again on every turn (a prefix that fills the window) cost 40% more than the drops in
        # a trial's 40k cell, with the same answers. Or it leaves less than the drop would (it subsumes a
        # leading summary the drop keeps): then it is no worse for room in any case
        ceiling = lim.critical if under is None else under
        turn = max(0, lim.limit - lim.critical) if under is None else 0
        with_it, dropped = tokens - ctr.calibrated(p.tokens_removed), tokens - ctr.calibrated(drop.tokens_removed)
        if (with_it > ceiling - turn and with_it > dropped) or with_it > lim.limit:  # over the limit: dropped next
            return None, (f"a summary does not fit: ~{with_it:,} tokens with it, over "
                          + (f"critical ({ceiling:,}) less one turn ({turn:,})" if under is None
                             else f"the goal ({ceiling:,})") + f", and ~{dropped:,} after the drop")
        t0 = time.perf_counter()
        try:
            entries, cost = self._apply(p, True, None)
        except InvalidEditError as err:
            self._planning_bug("L4", f"the ledger refused the summary in place of L5's drop: {err}")
            return None, "planning bug (logged)"
        except Exception as err:  # summarizer errors and rejected summaries count for the breaker
            cost = getattr(err, "cost_usd", 0.0)
            self.summary_cost += cost
            self._fail("L4", f"{type(err).__name__}: {err}", tokens, cost, report)
            return None, f"the summary failed: {type(err).__name__}"
        self.summary_cost += cost
        report.entries += entries
        self.failures = 0
        self._mark_compacted(p)
        self.last_compact_step = self.steps
        self._pending = None
        after = self._now_tokens()
        report.events.append(self._emit("compaction", level="L4", reason=f"{why}: {p.reason}", tokens_before=tokens,
                                        tokens_after=after, cost_usd=cost, duration_s=time.perf_counter() - t0,
                                        entries=[e.seq for e in entries],
                                        detail={"writer": "ours", "in_place_of": "L5",
                                                "hidden": self._hidden(p, lim)}))
        return after, ""

    def _forced_limits(self, lim: Limits, model: str) -> Limits:
        """The limits L5 works to: ``lim``, with the output reserve at most `OWN_RESERVE_SHARE` of
        the window. L5 drops rounds, so it runs only where the window forces it. A client that
        reserves more (Claude Code's 128,000 at 200k, its 32,000 at 40k) lowers it on the API's
        own 400 ("input length and `max_tokens` exceed context limit"), which compact mode passes
        through (issue 62): dropping the conversation's rounds for that reserve lost work the
        client never asked to lose (at 40k, Claude Code's turns each dropped every round they
        could). The summaries aim under ``lim``, which is planned for this reserve too where the
        request's own does not leave the window room for the prefix, a summary and a turn
        (`_plain_limits`)."""
        cap = int(OWN_RESERVE_SHARE * lim.window)
        return lim if lim.max_tokens <= cap else self._plain_limits(cap, model)[0]

    def _ensure_fits(self, tokens: int, lim: Limits, report: Plan, model: str) -> int:
        """Past the critical threshold, L5 until the request fits, and if the newest round beside a
        leading summary still does not (the prefix fills most of the window), L5 again with the
        summary dropped; ``report.context_full`` says why if even that cannot fit. The thresholds
        are ``lim``'s with the output reserve capped (`_forced_limits`)."""
        drop = self._forced_limits(lim, model)
        asked = self._request[0]
        if 0 < asked != lim.max_tokens:  # the limits planned for a smaller reserve than the request's
            lim = self._plain_limits(asked, model, as_asked=True)[0]
        if tokens < drop.critical:
            if tokens > lim.limit and lim.max_tokens > 0:
                self._over_reserve(tokens, lim, report)
            return tokens
        tokens = self._truncate(tokens, drop, report, "over the critical threshold after the other levels")
        if tokens > drop.limit:
            tokens = self._truncate(tokens, drop, report, "still over the window: the leading summary dropped too "
                                    "(the task stays in the immutable prefix)", drop_summary=True)
        if tokens > drop.limit or (tokens > lim.limit and lim.max_tokens > 0):
            if tokens <= lim.window:
                # the prompt fits the window by our estimate; its output reserve or the estimate's
                # margin may not. Sent as it is: the API decides, a refusal of ours would turn a
                # request the upstream may take into an error (issue 62). Its own 400 is what a
                # client recovers from: "input length and `max_tokens` exceed context limit" by
                # lowering max_tokens (Claude Code does), "prompt is too long" by the reactive
                # compaction (`after_too_long`) and then by the client's own
                if lim.max_tokens > 0:
                    self._over_reserve(tokens, lim, report)
                return tokens
            report.events.append(self._emit("context_full", reason="the request does not fit even after L5",
                                            tokens_before=tokens, tokens_after=tokens))
            report.context_full = self._full_message(tokens, lim)
        return tokens

    def _over_reserve(self, tokens: int, lim: Limits, report: Plan) -> None:
        self._probe = (len(self.draft), lim.max_tokens)  # the next request shows whether the client lowers it
        report.events.append(self._emit(
            "max_tokens_over", tokens_before=tokens, tokens_after=tokens,
            reason=f"the prompt (~{tokens:,} tokens) fits the {lim.window:,}-token window but not beside "
                   f"max_tokens={lim.max_tokens:,} and the estimate's margin; sent as it is, for the API (and the "
                   f"client) to decide"))

    def _full_message(self, tokens: int, lim: Limits) -> str:
        """What is true and what to do when the request cannot fit (``tokens`` over the window), in
        the API's words first (`too_long_message`): what is left, what fills it
        (the immutable prefix when that is most of it, with the setting that shrinks it), and
        how the window is shared between input, the reply and the estimate margin."""
        s = self.draft
        r = s.render(breakpoints=False)  # while the prefix forms, every message so far is fixed
        prefix = s.counter.calibrated(r.prefix_tokens if s.prefix_end is not None else r.tokens)
        n_fixed = s.prefix_end if s.prefix_end is not None else len(s)
        margin = int(lim.estimate_error * lim.window)
        if lim.max_tokens >= lim.window:  # the request's own output reserve cannot fit: say so first
            budget = (f"max_tokens={lim.max_tokens:,} is larger than the {lim.window:,}-token window itself (lower it; "
                      f"the input is planned for a quarter of the window, {lim.limit:,} tokens)")
        elif lim.window - margin - max(0, lim.max_tokens) < lim.window // 4:  # `policy.limits`' floor
            budget = (f"max_tokens={lim.max_tokens:,} is most of the {lim.window:,}-token window, which leaves a "
                      f"quarter, {lim.limit:,} tokens, for input")
        else:
            budget = (f"the input may use {lim.limit:,} of the {lim.window:,}-token window: {max(0, lim.max_tokens):,} "
                      f"are kept for the reply (max_tokens) and {lim.window - lim.limit - max(0, lim.max_tokens):,} "
                      f"for estimate error")
        what = f"context is full: {tokens:,} input tokens (estimated) remain after every compaction level"
        if prefix * 2 >= tokens and n_fixed > 1:
            what += (f"; {prefix:,} of them are the immutable prefix (tools, system and the first {n_fixed} messages), "
                     f"which no compaction edits: {PREFIX_SETTING} fixes only the first message, so the "
                     f"rest can be compacted")
        elif prefix * 2 >= tokens:
            what += (f"; {prefix:,} of them are the tools, system prompt and first message, which no compaction edits "
                     f"(the task itself): shorten them")
        else:
            what += ", the newest round included, which is always kept"
        return too_long_message(tokens, lim.window, f"{what}; {budget}. Use a window of at least "
                                f"{lim.window_for(tokens):,} tokens, lower max_tokens, or start a new session")

    def _apply_or_refuse(self, p: Proposal, cold: bool, body: dict[str, Any] | None) -> list[LedgerEntry]:
        try:
            entries, _ = self._apply(p, cold, body)
            return entries
        except InvalidEditError as err:
            self._planning_bug(p.level, f"the ledger refused {p.level}'s edit: {err}")
            return []

    def _fail(self, level: Level, why: str, tokens: int, cost: float, report: Plan) -> None:
        self.failures += 1
        report.events.append(self._emit("failure", level=level, reason=why, tokens_before=tokens,
                                        tokens_after=tokens, cost_usd=cost,
                                        detail={"consecutive_failures": self.failures}))
        if self.failures >= self.cfg.safety.failure_limit and not self.tripped:
            self.tripped = True
            report.events.append(self._emit("breaker_open", reason=f"{self.failures} consecutive compaction "
                                            "failures: summaries are stopped for this session (L1, L2 and L5 go on)"))

    # -- while the session is quiet (`compaction.idle`) ----------------------------------------------

    def idle(self, now: float, model: str, max_tokens: int, body: dict[str, Any] | None, *,
             away_s: float | None = None) -> IdleDecision:
        """Summarize now, on the warm cache, what the cold rule would collapse on a late return,
        when that pays by `compaction.idle`'s prices; the edits wait for the next request."""
        s = self.draft

        def no(why: str, **kw: Any) -> IdleDecision:
            return IdleDecision(session_id=s.session_id, at=now, fired=False, reason=why, **kw)

        if self.last_request_at is None or s.prefix_end is None or not len(s):
            return no("no request of this session has been answered yet")
        if self._idle is not None or self._idle_at == self.last_request_at:
            return no("already summarized in this quiet period")
        if self._under_way():
            return no("a summary is under way in the background")
        if not self.cfg.economics.cache_aware:
            return no("cache economics are off (Economics.cache_aware=False)")
        if self.tripped:
            return no("summaries are stopped for this session (the breaker is open)")
        ttl, quiet = self._ttl_s, now - self.last_request_at
        if quiet >= ttl:
            return no(f"the cache expired {quiet - ttl:.0f}s ago: the return writes it again anyway, and the cold "
                      "rule collapses then at no extra write")
        if not isinstance(self.summarizer, PricedSummarizer):
            return no(f"the summarizer ({type(self.summarizer).__name__}) gives no price estimate (estimate_usd)")
        try:
            price = priced(model, self.ctx.prices)
        except UnknownModelError as err:
            return no(f"cannot price the session's model: {err}")
        self._now = now
        lim = self._limits(max_tokens, model)
        view = build_view(s)
        tokens = s.counter.calibrated(view.total_tokens)
        cands = self._candidates(view, Trigger("L3", "idle"), lim, stop_at_target=False)
        # the cold rule's choice on a late return: the plan that removes most, if it is a batch
        big = sorted([p for p in cands if p.tokens_removed >= lim.min_batch and p.break_at is not None],
                     key=lambda x: -x.tokens_removed)
        if not big:
            return no(f"nothing to collapse: no plan removes a batch ({lim.min_batch} tokens)", tokens_before=tokens,
                      tokens_after=tokens)
        p = big[0]
        assert p.break_at is not None
        reuse = body if self._wants_body() else None
        warm = cold = 0.0
        # our own summary, even where the API could write it: its compaction request ends at the range's end,
        # where no cache entry is warm this late in a quiet period (only the last request's are), so it would
        # pay the range cold, and the idle summary exists to be made warm (docs/policy.md)
        if p.summarize is not None:
            req = summary_request(s, *p.summarize, body=reuse, cache_warm=True, at=now)
            try:
                warm = self.summarizer.estimate_usd(req)
                req.cache_warm = False
                cold = self.summarizer.estimate_usd(req)
            except UnknownModelError as err:
                return no(f"cannot price the summary: {err}")
        early = economics(self.cfg, price, removed=p.tokens_removed,
                          suffix=view.suffix_tokens(self._rewrite_from(p.break_at)), steps=self.steps, cold=False,
                          summary_cost=warm, ttl=self.ttl or "5m",
                          reasoning_tokens=self._reasoning_lost(p.break_at))
        p_late = late_chance(quiet, ttl, from_gaps=self.gaps.returns_after(quiet, ttl), away_s=away_s)
        value = idle_value(p_late, summary_cold=cold, summary_warm=warm, early=early)
        after = max(0, tokens - s.counter.calibrated(p.tokens_removed))
        priced_kw: dict[str, Any] = {"level": p.level, "p_late": round(p_late, 4), "value_usd": round(value, 6),
                                     "summary_warm_usd": round(warm, 6), "summary_cold_usd": round(cold, 6),
                                     "early_net_usd": round(early.net, 6),
                                     "early_cost_usd": round(early.cost_now, 6), "tokens_before": tokens}
        # the early-return term as it is added: what the edit costs at once (its later savings never count,
        # `compaction.idle`), with its parts
        sums = (f"chance of a return after the {ttl / 60:.0f}-minute cache {p_late:.3f} x (summary cold "
                f"${cold:.4f} - warm ${warm:.4f}) + {1 - p_late:.3f} x the edit on an early return "
                f"${-early.cost_now:+.4f} (re-write ${early.rewrite_cost:.4f}, summary ${early.summary_cost:.4f}"
                + (f", reasoning ${early.reasoning_cost:.4f}" if early.reasoning_cost else "")
                + f"; its later savings uncounted) = ${value:+.4f}")
        if value <= 0:
            return no(f"does not pay: {sums}", tokens_after=tokens, **priced_kw)
        try:
            edits, cost = self._edits_of(p, False, reuse)
        except InvalidEditError as err:
            self._planning_bug(p.level, f"the ledger would refuse {p.level}'s idle edit: {err}")
            return no(f"planning bug: {err}", tokens_after=tokens, **priced_kw)
        except Exception as err:  # summarizer errors count for the breaker, as at a request
            cost = getattr(err, "cost_usd", 0.0)
            self.summary_cost += cost
            self._fail(p.level, f"idle {type(err).__name__}: {err}", tokens, cost, Plan(tokens, tokens))
            return no(f"the summary failed: {type(err).__name__}: {err}", tokens_after=tokens, cost_usd=cost,
                      **priced_kw)
        self.summary_cost += cost
        self.failures = 0 if p.summarize else self.failures
        why = f"idle: the session is quiet {quiet / 60:.1f} min of its {ttl / 60:.0f}-minute cache; {sums}"
        self._idle, self._idle_at = (p, edits, why), self.last_request_at
        self._emit("idle_summary", level=p.level, reason=why, tokens_before=tokens, tokens_after=after,
                   cost_usd=cost, detail=dict(priced_kw))
        return IdleDecision(session_id=s.session_id, at=now, fired=True, reason=why, tokens_after=after,
                            cost_usd=cost, **priced_kw)

    def idle_due(self) -> float | None:
        """`DECIDE_BEFORE_S` before the cache of the last request expires, so the summary is
        answered while it is warm; None once decided in this quiet period."""
        if self.last_request_at is None or self._idle is not None or self._idle_at == self.last_request_at \
                or self.tripped or not self.cfg.economics.cache_aware or self._under_way():
            return None
        return self.last_request_at + self._ttl_s - DECIDE_BEFORE_S

    def _append_idle(self, report: Plan) -> None:
        """The edits of the summary made while the session was quiet, appended now that the
        response they were made after is in the transcript (so the thinking they invalidate is
        told by the ledger's usual rule, `history.thinking`). Its cost was its `idle_summary`
        event's."""
        assert self._idle is not None
        if self._mid_tool_loop_thinking() is not None:
            return  # this request answers a thinking turn's calls: not here (history.thinking); a later one
        p, edits, why = self._idle
        self._idle = None
        before = self._now_tokens()
        try:
            entries = self._stage(p, edits)
        except InvalidEditError as err:  # the history the summary covered changed under it
            self._planning_bug(p.level, f"the ledger refused the idle summary's edit: {err}")
            return
        report.entries += entries
        self._mark_compacted(p)
        self.last_compact_step = self.steps
        self._pending = None
        report.events.append(self._emit("compaction", level=p.level, reason=why, tokens_before=before,
                                        tokens_after=self._now_tokens(), entries=[e.seq for e in entries],
                                        detail={"idle": True}))

    # -- after the call, and prompt-too-long -------------------------------------------------------

    def after_response(self, now: float, usage: dict[str, Any] | None = None) -> None:
        """Record the request time (for TTL reasoning) and calibrate token estimates; start an
        API-written summary asked for on this request (the agent now runs its tools)."""
        self.last_request_at = now
        self._probe = None  # answered: the API took the request as it was
        if self._api_req is not None:
            self._api_req.send(now)
        if self._own_req is not None:
            self._own_req.send()
        if usage and self._producing is not None:
            self._thought[self._producing] = int(usage.get("output_tokens") or 0)
        if usage:
            total = sum(int(usage.get(k) or 0) for k in ("input_tokens", "cache_creation_input_tokens",
                                                          "cache_read_input_tokens"))
            est = self.draft.render(breakpoints=False).raw_tokens
            if est > 0 and total > 0:  # how far off the estimate this request was planned with was
                self._estimate_errors.append((total - self.draft.counter.calibrated(est)) / total)  # + fell short
            self.draft.counter.observe(est, total)

    def reactive(self, reported_tokens: int, limit: int, now: float, model: str, max_tokens: int = 0) -> bool:
        """After a prompt-too-long error: L4 (unless the breaker is open), then L5, until the
        request fits with a 5% margin. Returns False when nothing more can be removed, and at once
        when the prompt fits and the output reserve is more than `OWN_RESERVE_SHARE` of the window:
        the client's to lower on the API's own 400, which then goes back (`_forced_limits`)."""
        s = self.draft
        if self._under_way():  # the request was sent and is too long: it cannot go without the summary
            self._land(Plan(0, 0), wait=True)
        raw = s.render(breakpoints=False).raw_tokens
        if raw > 0:
            s.counter.calibration = max(s.counter.calibration, reported_tokens / raw)
        if reported_tokens < limit and max_tokens > OWN_RESERVE_SHARE * limit:
            return False
        goal = int((limit - max_tokens) * 0.95)
        lim = self._limits(max_tokens, model)
        changed = False
        why = f"prompt too long ({reported_tokens} > {limit})"
        no_summary = ""
        for level in ("L4", "L5"):
            view = build_view(s)
            tokens = s.counter.calibrated(view.total_tokens)
            if tokens <= goal:
                return changed
            if level == "L4":
                if self.tripped:
                    continue
                p = self._guard(self._propose("L4", view, lim))
            else:
                p = self._guard(propose_truncate(view, target_tokens=int(goal / max(s.counter.calibration, 1e-9)),
                                                 keep=self._latest_request()))
                if not p.empty:  # the rounds it would drop, summarized instead where that fits (as `_ensure_fits`)
                    done, no_summary = self._summary_for_drop(p, tokens, lim, Plan(tokens, tokens), why, under=goal)
                    if done is not None:
                        changed = True
                        continue
            if p.empty:
                continue
            try:
                entries, cost = self._apply(p, True, None)
            except InvalidEditError as err:
                self._planning_bug(level, f"the ledger refused {level}'s edit: {err}")
                continue
            except Exception as err:  # the breaker counts it; L5 is next
                self._fail(level, f"reactive {type(err).__name__}: {err}", tokens, getattr(err, "cost_usd", 0.0),
                           Plan(tokens, tokens))
                continue
            self.summary_cost += cost
            changed = True
            self._emit("compaction", level=level, reason=why, tokens_before=tokens, tokens_after=self._now_tokens(),
                       cost_usd=cost, entries=[e.seq for e in entries],
                       detail={"no_summary": no_summary} if level == "L5" else None)
        return changed and self._now_tokens() <= goal


#: The 0.3 name of `CacheAwareCompactor`, kept for one release.
Compactor = CacheAwareCompactor
