"""A summary call never holds a request that can be sent without it (issue 62, item 9).

Through wrap() and the real SDK: the agent talks to one emulator, and its summaries are written
through a second emulator that answers every call ``DELAY`` seconds late (the emulator's own
injected delay), so a request that waited for a summary call shows it in its own wall time.
A request between the hard and the critical threshold goes whole at once, and the summary lands
on a later request, recorded there in the ledger; a request at the critical threshold or over it
cannot go without the compaction, and waits for it."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import anthropic
import pytest

import cachecompact
from cachecompact.compaction.policy import LevelSettings, PolicyConfig, Triggers
from cachecompact.compaction.summarize.caller_key import CallerKeySummarizer
from cachecompact.compaction.summarize.llm import LLMSummarizer, SummaryRequest
from cachecompact.tools.emulator import Emulator, FaultConfig, ScriptedResponder, SummarizingResponder
from cachecompact.tools.emulator.responders import Reply

TOOLS = [{"name": "read", "description": "Read a file.",
          "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}]
WINDOW = 40_000
OURS = "claude-haiku-4-5"  # off the on-demand list: our own summaries
API = "claude-sonnet-4-6"  # on it, and thinks only when asked: the API writes them (on-demand compaction)
DELAY = 2.0  # seconds each summary call takes
FAST = 1.0  # a request that waited for no summary call answers well within this


def _reader() -> ScriptedResponder:
    n = itertools.count(1)

    def answer(body: dict[str, Any]) -> Reply:
        k = next(n)
        return Reply([{"type": "tool_use", "id": f"toolu_{k:05d}", "name": "read", "input": {"path": f"m{k}.py"}}],
                     "tool_use")
    return ScriptedResponder(answer)


@dataclass
class Agent:
    """A reader whose results the test sizes turn by turn; each request's wall time and the
    events it raised, by turn."""

    client: Any
    model: str = OURS
    msgs: list[dict[str, Any]] = field(default_factory=lambda: [{"role": "user", "content": "Audit the project."}])
    turn: int = 0
    seconds: list[float] = field(default_factory=list)
    events: list[tuple[int, Any]] = field(default_factory=list)

    def step(self, lines: int) -> float:
        t0 = time.perf_counter()
        r = self.client.messages.create(model=self.model, max_tokens=2000, system="You audit code. " * 100, tools=TOOLS,
                                        messages=self.msgs)
        took = time.perf_counter() - t0
        self.seconds.append(took)
        self.turn += 1
        content = [b.model_dump(exclude_none=True) for b in r.content]
        use = next(b for b in content if b["type"] == "tool_use")
        self.msgs += [{"role": "assistant", "content": content},
                      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"],
                                                    "content": f"# {use['input']['path']}\n"
                                                               + "".join(f"v{self.turn}_{i} = f({i})\n"
                                                                         for i in range(lines))}]}]
        return took

    def of(self, kind: str) -> list[tuple[int, Any]]:
        return [(k, e) for k, e in self.events if e.kind == kind and e.level in ("L3", "L4")]


@contextmanager
def _agent(model: str = OURS) -> Iterator[tuple[Agent, Emulator]]:
    with Emulator(SummarizingResponder(_reader())) as emu, \
            Emulator(SummarizingResponder(), faults=FaultConfig(slow_rate=1.0, slow_seconds=DELAY)) as slow:
        # one API behind both: the agent's emulator reads the compaction blocks the slow one signs
        slow.core._secret = emu.core._secret
        summarizer = LLMSummarizer(anthropic.Anthropic(base_url=slow.url, api_key="t", max_retries=0),
                                   model=OURS, mode="forced-tool")
        agent = Agent(None, model)
        agent.client = cachecompact.wrap(anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0),
                                         store=None, window_tokens=WINDOW, summarizer=summarizer,
                                         # the hard threshold well below critical, so a small turn after it
                                         # stays below critical; the recent budget as given (this agent never
                                         # looks back: with the meter on, only the window would edit, issue 63)
                                         config=PolicyConfig(triggers=Triggers(hard=0.85),
                                                             levels=LevelSettings(lookback_coverage=0.0,
                                                                                  keep_recent_tokens=20_000,
                                                                                  # the API writes where it may:
                                                                                  # these test the call, not
                                                                                  # the choice of writer
                                                                                  api_summaries=True)),
                                         on_event=lambda e: agent.events.append((agent.turn, e)))
        yield agent, emu


def _until_requested(agent: Agent, lines: int = 120, turns: int = 60) -> int:
    """Steps until a request decides a summary (asks for it, or, before issue 62, makes it); that
    request's turn."""
    for _ in range(turns):
        agent.step(lines)
        decided = agent.of("compaction_requested") + agent.of("compaction")
        if decided:
            return min(j for j, _ in decided)
    raise AssertionError(f"no summary asked in {turns} turns: {[(k, e.kind, e.level) for k, e in agent.events]}")


@pytest.mark.parametrize("model", [OURS, API])
def test_a_request_below_critical_never_waits_for_the_summary_call(model: str) -> None:
    with _agent(model) as (agent, emu):
        k = _until_requested(agent)
        assert agent.seconds[k] < FAST, agent.seconds  # it went whole, at once
        agent.msgs[-1]["content"][0]["content"] = "# empty"  # a small result (never sent yet)
        agent.step(1)  # the next one, still below critical: the call is under way, and it does not wait
        assert agent.seconds[k + 1] < FAST, agent.seconds
        assert not agent.of("compaction")  # nothing applied yet
        time.sleep(DELAY + 0.5)  # the agent runs its tools; the summary comes back meanwhile
        agent.step(1)
        sent = [r for r in emu.requests if r.get("status") == 200]
    landed = agent.of("compaction")
    assert [j for j, _ in landed] == [k + 2], [(j, e.reason[:80]) for j, e in landed]
    assert agent.seconds[k + 2] < FAST, agent.seconds
    (s,) = cachecompact.wrapped_sessions(agent.client)
    (entry,) = [e for e in s.ledger.entries if e.level in ("L3", "L4")]
    assert entry.kind == ("summary" if model == OURS else "compaction")  # ours, or the API's block
    # recorded against the request it was first applied to: that request's transcript length
    assert entry.transcript_len == len(agent.msgs) - 2
    assert entry.end < k * 2  # a range the request that asked for it had
    u = sent[k + 2]["usage"]
    assert sum(int(u.get(x) or 0) for x in ("input_tokens", "cache_read_input_tokens",
                                            "cache_creation_input_tokens")) < landed[0][1].tokens_before


@pytest.mark.parametrize("model", [OURS, API])
def test_a_request_over_critical_waits_for_it_and_is_compacted(model: str) -> None:
    with _agent(model) as (agent, emu):
        k = _until_requested(agent)
        assert agent.seconds[k] < FAST, agent.seconds
        # the agent's next result is big: the request it makes is over the critical threshold at once
        agent.msgs[-1]["content"][0]["content"] += "".join(f"big_{i} = g({i})\n" for i in range(600))
        agent.step(1)
        sent = [r for r in emu.requests if r.get("status") == 200]
    landed = agent.of("compaction")
    assert [j for j, _ in landed] == [k + 1], [(j, e.reason[:80]) for j, e in landed]
    assert agent.seconds[k + 1] >= DELAY * 0.8, agent.seconds  # it waited for the call under way
    e = landed[0][1]
    assert e.tokens_after < e.tokens_before
    u = sent[k + 1]["usage"]
    assert sum(int(u.get(x) or 0) for x in ("input_tokens", "cache_read_input_tokens",
                                            "cache_creation_input_tokens")) < WINDOW - 2000


def test_the_proxys_summary_call_takes_the_callers_key_into_the_pool() -> None:
    """The compact proxy's summarizer reads the caller's credentials from a thread-local of the
    request's thread; a call made on the background pool must carry them (bound in that thread),
    or it would fall back to an extractive summary (no key), or to the operator's."""
    creds = threading.local()
    with Emulator(SummarizingResponder()) as emu:
        summarizer = CallerKeySummarizer(emu.url, OURS, "forced-tool", creds)
        assert summarizer.bind() is None  # no credential in this thread: extractive, nothing to wait for
        creds.headers = {"x-api-key": "caller-key"}
        call = summarizer.bind()
        creds.headers = {}  # the request's thread moves on
        assert call is not None
        req = SummaryRequest(messages=[{"role": "user", "content": "Audit the project."},
                                       {"role": "assistant", "content": "Read m1.py: x = f(1)."}],
                             goal="Audit the project.", range=(1, 2))
        with ThreadPoolExecutor(1) as pool:
            res = pool.submit(call, req).result()
        billed = [r for r in emu.requests if r.get("status") == 200]
    assert res.mode == "forced-tool" and res.summary.task_goal  # made by the model, on the caller's key
    assert len(billed) == 1 and billed[0]["internal"]
