"""The compactor's state is data (issue 63, item 6): a replica that loads the state stored with
the newest request record decides the next turn exactly as the process that wrote it would have.

Each run drives one compactor through a session turn by turn, recording every request with its
`state()` as the engine does. Before every turn a replica is built fresh on a copy of the store,
loads that state (`load_state`, the engine's `_catch_up`), and decides the same turn: its plan
(entries, events, tokens, TTLs) must be the original's. The runs between them provoke every kind
of event the compactor emits on a request: compactions at L1 to L5, shortening on entry, lines
given back, the deferral before any look-back, a learnt recent budget, a window too small for
the agent's reach, repeated calls, failures and the breaker, a refused API summary, a retried
turn, and cache TTLs chosen from the session's gaps."""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cachecompact import Session
from cachecompact.base.events import Event
from cachecompact.compaction.cache_aware import CacheAwareCompactor
from cachecompact.compaction.policy import PolicyConfig
from cachecompact.compaction.strategy import Plan
from cachecompact.compaction.summarize.api_compaction import Verbatim
from cachecompact.compaction.summarize.llm import ExtractiveSummarizer, SummaryRequest, SummaryResult
from cachecompact.history.ledger import LedgerEntry
from cachecompact.tools.emulator.validation import validate_request

from .test_levels import GOAL, tool_turn
from .test_lookback import _agent, _file
from .test_policy import MODEL, cfg

# timings, which no two runs share
_CLOCK = {"duration_s", "waited_s", "time"}


@dataclass
class Turn:
    """One request: the history it is made from, when, with which max_tokens, what it used."""

    history: list[dict[str, Any]]
    at: float
    max_tokens: int = 1000
    output_tokens: int = 200


def _entry(e: LedgerEntry) -> tuple[Any, ...]:
    return (e.seq, e.kind, e.level, e.start, e.end, e.reason, e.summary, e.tool_use_id, e.tokens_before,
            e.tokens_after)


def _event(e: Event, store: Path) -> dict[str, Any]:
    """The event as the original would have said it: no timings, and the session's path (a
    `first_compaction` names it) the original's."""
    d = {k: v for k, v in e.to_dict().items() if k not in _CLOCK}
    d["reason"] = e.reason.replace(str(store), "<store>")
    d["detail"] = {k: v for k, v in e.detail.items() if k not in _CLOCK}
    return d


def _plan(p: Plan, store: Path) -> dict[str, Any]:
    return {"tokens": (p.tokens_before, p.tokens_after), "full": p.context_full, "ttl": (p.ttl, p.prefix_ttl),
            "betas": p.betas, "entries": [_entry(e) for e in p.entries],
            "events": [_event(e, store) for e in p.events]}


def _replica(store: Path, config: PolicyConfig, summarizer: Any) -> tuple[Session, CacheAwareCompactor]:
    """A process that opens the session from its store and picks it up as the engine does: the
    strategy is built (`resume`) and continues from the state of the newest request record."""
    s = Session.open(store)
    c = CacheAwareCompactor.for_session(s, config, summarizer=summarizer)
    c.resume()
    st = (s.last_request or {}).get("strategy_state")
    if isinstance(st, dict):
        c.load_state(st)
    return s, c


def replicated(tmp_path: Path, turns: Sequence[Turn], config: PolicyConfig,
               summarizer: Callable[[], Any] = ExtractiveSummarizer) -> list[Event]:
    """Run ``turns`` through one compactor; before each, a replica decides the same turn from the
    stored state and must plan exactly as the original. Every event of the original's plans."""
    store = tmp_path / "a"
    s = Session.create(store, prefix_messages=1)
    s.sync(turns[0].history[:1])
    a = CacheAwareCompactor.for_session(s, config, summarizer=summarizer())
    events: list[Event] = []
    for k, t in enumerate(turns):
        # a summary under way in the background belongs to the process that asked for it: a replica
        # cannot wait for it, so no replica is asked to decide while one is (the original's next turn lands it)
        with_replica = not a._under_way()
        if with_replica:
            copy = tmp_path / f"b{k}"
            shutil.copytree(store, copy)
            sb, b = _replica(copy, config, summarizer())
            sb.sync(t.history)
        s.sync(t.history)
        pa = a.before_request(t.at, MODEL, t.max_tokens)
        if with_replica:
            pb = b.before_request(t.at, MODEL, t.max_tokens)
            assert _plan(pb, copy) == _plan(pa, store), f"turn {k}: the replica decided otherwise"
            assert b.state() == a.state(), f"turn {k}: the replica's state differs after the same decision"
            shutil.rmtree(copy)
        events += pa.events
        s.commit()
        r = s.render(model=MODEL, max_tokens=t.max_tokens)
        validate_request(r.body)
        a.after_response(t.at, {"input_tokens": r.tokens, "output_tokens": t.output_tokens})
        # the record as the engine writes it, after the response; stored as JSON
        s.record_request(r, {"time": t.at, "strategy_state": json.loads(json.dumps(a.state()))})
    return events


def _one_per_turn(msgs: list[dict[str, Any]], gap: float = 10.0, t0: float = 0.0, **kw: Any) -> list[Turn]:
    """The history after each assistant turn and its answer, one request each."""
    return [Turn(msgs[:i + 2], t0 + gap * (k + 1), **kw) for k, i in enumerate(range(1, len(msgs), 2))]


def _kinds(events: list[Event]) -> set[tuple[str, str | None]]:
    return {(e.kind, e.level) for e in events}


def test_replicas_decide_alike_through_the_look_back_budget_and_a_tight_window(tmp_path: Path) -> None:
    """An agent that looks 30 reads back in a 24k window: the deferral before its first look-back,
    compactions at several levels, a learnt budget, lines given back, and the window said too
    small for its reach; each depends on state the replica must carry (said-once flags, the
    reach last said, the budget last reported, the growth of recent turns)."""
    events = replicated(tmp_path, _one_per_turn(_agent(turns=60, gap=30)), cfg(24_000))
    kinds = _kinds(events)
    assert {"deferred", "recent_budget", "window_too_small", "restored", "compaction"} <= {k for k, _ in kinds}, kinds


def test_replicas_decide_alike_after_a_first_request_that_brought_a_long_history(tmp_path: Path) -> None:
    """A caller that wraps a session under way: its first request is compacted (said once, as
    ``first_compaction``), and the session goes on one turn at a time."""
    msgs = _agent(turns=70, gap=6)
    turns = [Turn(msgs[:81], 10.0), *_one_per_turn(msgs[80:], t0=10.0)]
    turns[1:] = [Turn(msgs[:80] + t.history, t.at) for t in turns[1:]]
    kinds = _kinds(replicated(tmp_path, turns, cfg(24_000)))
    assert "first_compaction" in {k for k, _ in kinds}, kinds


def test_replicas_decide_alike_through_repeated_calls_and_big_results(tmp_path: Path) -> None:
    """A reader that re-runs one command with the same answer three times within 30 seconds (the
    warning reads the calls the state carries), then reads two logs too big to keep verbatim
    (shortened on entry), and goes on reading."""
    msgs = _agent(turns=30, gap=6)
    for k in range(3):
        msgs += tool_turn(100 + k, "bash", "FAILED test_x: assert 1 == 2\n" * 40, {"command": "pytest -x"})
    for k in range(2):
        log = f"build log {k}: compiling unit_{k}_42 ok\n" * 3000
        msgs += tool_turn(200 + k, "bash", log, {"command": f"make {k}"})
    msgs += _agent(turns=50, gap=6)[61:]
    events = replicated(tmp_path, _one_per_turn(msgs, gap=4.0), cfg(40_000))
    kinds = {k for k, _ in _kinds(events)}
    assert {"compaction", "externalized", "repeated_tool_calls"} <= kinds, kinds


class _Failing(ExtractiveSummarizer):
    """A summarizer whose calls fail: each is a failure for the breaker."""

    def summarize(self, req: SummaryRequest) -> SummaryResult:
        raise RuntimeError("the summarizer is down")


def test_replicas_decide_alike_through_failures_and_the_open_breaker(tmp_path: Path) -> None:
    events = replicated(tmp_path, _one_per_turn(_agent(turns=70, gap=4)), cfg(24_000, failure_limit=2),
                        summarizer=_Failing)
    kinds = {k for k, _ in _kinds(events)}
    assert {"failure", "breaker_open"} <= kinds, kinds
    assert any(e.kind == "compaction" and e.level == "L5" for e in events) or "skipped" in kinds, kinds


class _ApiRefuses(ExtractiveSummarizer):
    """Our own summaries work; the API refuses every on-demand compaction (a model it does not
    list for it: a 400, not a passing 529), so the session turns API summaries off."""

    def __init__(self) -> None:
        self.asked = 0

    def ondemand(self) -> Callable[[dict[str, Any], float | None, Verbatim | None], Any]:
        def call(body: dict[str, Any], at: float | None, keep: Verbatim | None = None) -> Any:
            self.asked += 1
            raise RuntimeError("compaction is not supported for this model")
        return call


def test_replicas_decide_alike_after_the_api_refused_its_summaries(tmp_path: Path) -> None:
    """The refusal is session state (`_api_refused`): a replica that forgot it asked the API again
    on its next summary, failed again, and counted it toward the breaker."""
    # the API asked wherever it may (the writer not chosen by price): this tests the refusal's state
    events = replicated(tmp_path, _one_per_turn(_agent(turns=80, gap=4)),
                        cfg(24_000, background_summaries=False, api_summaries=True), summarizer=_ApiRefuses)
    refused = [e for e in events if e.kind == "failure" and "not supported" in e.reason]
    assert len(refused) == 1, [(e.kind, e.level, e.reason[:80]) for e in events]
    assert [e for e in events if e.kind == "compaction" and e.level in ("L3", "L4")], _kinds(events)


def _conversation(rounds: int) -> list[Turn]:
    """A person and an agent: three reads, a reply, then the person comes back after 10 minutes
    (between the 5-minute and the 1-hour TTL): the gaps make the 1-hour TTL pay."""
    rng = random.Random(3)
    msgs: list[dict[str, Any]] = [{"role": "user", "content": GOAL}]
    turns: list[Turn] = []
    now = 0.0
    for r in range(rounds):
        for j in range(3):
            k = 3 * r + j
            inp = {"path": f"mod_{k}.py", "note": f"local_{max(0, k - 4)}_30"}
            msgs = msgs + tool_turn(k, "read", _file(rng, k), inp)
            now += 8.0
            turns.append(Turn(msgs, now))
        msgs = [*msgs, {"role": "assistant", "content": f"round {r} read"}, {"role": "user", "content": f"go on {r}"}]
        now += 600.0
        turns.append(Turn(msgs, now))
    return turns


def test_replicas_decide_alike_with_the_ttl_chosen_from_the_gaps(tmp_path: Path) -> None:
    """The TTL in force prices this turn's limits (its write-over-read ratio) before this turn
    chooses again; a replica that started from the 5-minute TTL planned against other limits."""
    turns = _conversation(16)
    events = replicated(tmp_path, turns, cfg(30_000))
    assert any(e.kind == "compaction" for e in events), _kinds(events)


def test_a_retried_turn_on_a_replica_is_planned_with_the_turns_first_reserve(tmp_path: Path) -> None:
    """Issue 62: a client that lowers max_tokens on the API's 400 retries the same history; the
    turn is planned with the largest reserve it asked, on whichever replica the retry lands."""
    msgs = _agent(turns=40, gap=4)
    turns: list[Turn] = []
    for k, i in enumerate(range(1, len(msgs), 2)):
        turns.append(Turn(msgs[:i + 2], 10.0 * k + 1, max_tokens=16_000))
        turns.append(Turn(msgs[:i + 2], 10.0 * k + 2, max_tokens=2_000))  # the retry, the reserve lowered
    events = replicated(tmp_path, turns, cfg(40_000))
    assert any(e.kind == "compaction" for e in events), _kinds(events)


@pytest.mark.parametrize("bad", [{"steps": "many"}, {"growth": "x"}, {"gaps": []}, {"calls": {"00": "x"}},
                                 {"calibration": -1.0}, {"sent": [1]}])
def test_a_bad_stored_field_keeps_its_default_and_the_rest_loads(bad: dict[str, Any],
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    s = Session.create(None, prefix_messages=1)
    c = CacheAwareCompactor.for_session(s, cfg(24_000))
    c.load_state({"failures": 2, "tripped": True, "unknown_key": 1, **bad})
    assert c.failures == 2 and c.tripped
    assert "ignoring" in caplog.text


# a state as the hand mapping of 0.3 wrote it (before issue 63, item 6): it still loads, field by field
OLD_STATE: dict[str, Any] = {
    "steps": 12, "last_compact_step": 9, "failures": 1, "tripped": False, "last_request_at": 130.0, "seen": 25,
    "pending": "L2", "summary_cost": 0.0123, "growth": [700, 820, 760], "last_tokens": 18_000,
    "deferred_old": 4_000, "learnt": 6_103, "calibration": 1.07,
    "gaps": {"tool": [10.0, 12.5], "person": [600.0], "turn_ends": 1, "responses": 3},
    "sent": [18_000, 3600.0], "thought": {"23": 150, "25": 90}, "idle_at": 120.0,
    "calls": {"00ff" * 8: [[125.0, "ab" * 16], [130.0, "ab" * 16]]}}


def test_a_state_in_the_old_format_loads_and_is_written_back_the_same(tmp_path: Path) -> None:
    s = Session.create(None, prefix_messages=1)
    s.sync(_agent(turns=12, gap=6)[:25])
    c = CacheAwareCompactor.for_session(s, cfg(24_000))
    c.load_state(json.loads(json.dumps(OLD_STATE)))
    assert (c.steps, c.last_compact_step, c.failures, c.tripped, c.last_request_at) == (12, 9, 1, False, 130.0)
    assert c.draft.counter.calibration == 1.07 and c._sent == (18_000, 3600.0)
    assert c.gaps.person[-1] == 600.0 and c.gaps.responses == 3
    assert c._thought == {23: 150, 25: 90} and list(c._growth) == [700, 820, 760]
    st = json.loads(json.dumps(c.state()))  # as the record stores it
    assert {k: st[k] for k in OLD_STATE} == OLD_STATE  # every key as it was written, with its value
