"""No request carries a thinking block the API would refuse or drop (issue 38).

A wrapped agent on each current model, thinking adaptively by default, works through tool loops
between a person's turns long enough to compact several times, in the four client modes of
``wrap()`` (sync, async, streamed sync, streamed async) and through the compact proxy. The
emulator checks every thinking block it is sent against the documented prefix check
(`cachecompact.tools.emulator._binding`), and the test reads its verdicts, not the product's own
accounting: no refusal, no block dropped, and compaction really happened.

Every model here supports on-demand compaction, so by default the API writes the summaries and
the kept turns' thinking stays valid (issue 48): nothing is left out. With ``api_summaries``
off, our own summaries remove the thinking after them, and the report says so.
"""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

import anthropic
import pytest

import cachecompact
from cachecompact.adapters.middleware import _middleware_of
from cachecompact.adapters.proxy import Proxy, ProxyConfig
from cachecompact.base.pricing import PRESERVED_THINKING
from cachecompact.compaction.policy import LevelSettings, PolicyConfig
from cachecompact.tools.emulator import Emulator, ScriptedResponder, SummarizingResponder
from cachecompact.tools.emulator.responders import Reply
from cachecompact.tools.session_report import session_report

TOOLS = [{"name": "read", "description": "Read a file.",
          "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}]
SYSTEM = "You are a careful agent. " * 200
TURNS = 70
LOOP = 7  # turns of a tool loop, a person's turn between them
RESULT = 200  # lines of each tool result (about 1,800 tokens): a loop adds about 11k tokens
WINDOW = 60_000
MODELS = sorted(PRESERVED_THINKING)


def _model() -> ScriptedResponder:
    """Reads a file a turn; every `LOOP`-th turn it reports, and a person asks for the next part."""
    calls = itertools.count(1)

    def answer(body: dict[str, Any]) -> Reply:
        n = next(calls)
        if n % LOOP == 0:
            return Reply([{"type": "text", "text": f"Part {n // LOOP} done."}])
        return Reply([{"type": "tool_use", "id": f"toolu_{n:05d}", "name": "read",
                       "input": {"path": f"src/m{n}.py"}}], "tool_use")
    return ScriptedResponder(answer)


def _next(msgs: list[dict[str, Any]], content: list[dict[str, Any]], k: int) -> None:
    msgs.append({"role": "assistant", "content": content})
    calls = [b for b in content if b["type"] == "tool_use"]
    if calls:
        msgs.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": b["id"],
             "content": f"module {k}\n" + f"def f{k}(x): return x\n" * RESULT} for b in calls]})
    else:
        msgs.append({"role": "user", "content": f"Now part {k}."})


def _timeout(max_tokens: int) -> dict[str, Any]:
    """What a user of the SDK passes to call without streaming at a large ``max_tokens``: a timeout
    of its own (else the SDK refuses the call, cli-sdks-libraries/sdks/python, *Long requests*)."""
    return {"timeout": 600.0} if max_tokens > 21_000 else {}


def _sync(client: Any, model: str, stream: bool, max_tokens: int = 4000) -> None:
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "Audit the project, part by part."}]
    for k in range(TURNS):
        kw = dict(model=model, max_tokens=max_tokens, system=SYSTEM, tools=TOOLS, messages=msgs, **_timeout(max_tokens))
        if stream:
            with client.messages.stream(**kw) as s:
                r = s.get_final_message()
        else:
            r = client.messages.create(**kw)
        _next(msgs, [b.model_dump(exclude_none=True) for b in r.content], k)


async def _async(client: Any, model: str, stream: bool, max_tokens: int = 4000) -> None:
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "Audit the project, part by part."}]
    for k in range(TURNS):
        kw = dict(model=model, max_tokens=max_tokens, system=SYSTEM, tools=TOOLS, messages=msgs, **_timeout(max_tokens))
        if stream:
            async with client.messages.stream(**kw) as s:
                r = await s.get_final_message()
        else:
            r = await client.messages.create(**kw)
        _next(msgs, [b.model_dump(exclude_none=True) for b in r.content], k)


def _verdict(emu: Emulator) -> tuple[int, int, int, int]:
    """What the emulator saw: refusals, blocks dropped, blocks kept, requests that asked drop_block."""
    agent = [r for r in emu.requests if r.get("status") == 200 and not r.get("internal")]
    return (len(emu.core.refusals), sum(r["thinking"]["dropped"] for r in agent),
            sum(r["thinking"]["kept"] for r in agent), sum(r["thinking"]["asked"] == "drop_block" for r in agent))


def _reasoning_kept(emu: Emulator) -> float:
    """Of the thinking the emulator issued with the turns the requests showed, the share that
    reached the model valid (the bench's *reasoning kept*)."""
    agent = [r for r in emu.requests if r.get("status") == 200 and not r.get("internal")]
    issued = sum(r["thinking"]["issued_tokens"] for r in agent)
    return sum(r["thinking"]["kept_of_issued"] for r in agent) / issued if issued else 1.0


def _run(mode: str, model: str, store: Path | None = None, api: bool = True, max_tokens: int = 4000,
         window: int = WINDOW, events: list[Any] | None = None) -> tuple[tuple[int, int, int, int], int, float]:
    """One agent through ``mode``; at a ``window`` other than the default, the emulator's is the same
    (its requests must fit input + ``max_tokens`` as the API's do)."""
    config = PolicyConfig(levels=LevelSettings(api_summaries=api))
    hooks: dict[str, Any] = {"on_event": events.append} if events is not None else {}
    with Emulator(SummarizingResponder(_model()), **({} if window == WINDOW else {"context_window": window})) as emu:
        if mode == "proxy":
            # the API writes every summary it may, as `config` has wrap() do (the writer priced is
            # tests/compaction/test_api_summary_policy.py's)
            writer = "cachecompact-api-summaries" if api else "cachecompact-own-summaries"
            with Proxy(ProxyConfig(upstream=emu.url, port=0, mode="compact", window_tokens=WINDOW,
                                   strategy=writer)) as px:
                _sync(anthropic.Anthropic(base_url=px.url, api_key="k", max_retries=0), model, stream=False)
                px.wait_idle()
                engine = px.state.engine
                assert engine is not None
                edits = sum(len(s.ledger) for s in engine.sessions())
                (seen,) = px.state.observer.sessions()  # the dashboard's API counts what our edits invalidated
                assert seen.summary()["thinking"]["turns"] == 0  # the API wrote the summaries: none
        elif mode.startswith("async"):
            client = cachecompact.wrap(anthropic.AsyncAnthropic(base_url=emu.url, api_key="t", max_retries=0),
                                       store=None, window_tokens=window, config=config, **hooks)
            asyncio.run(_async(client, model, stream=mode == "async-stream", max_tokens=max_tokens))
            edits = sum(len(s.ledger) for s in cachecompact.wrapped_sessions(client))
        else:
            client = cachecompact.wrap(anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0),
                                       store=store, window_tokens=window, config=config, **hooks)
            _sync(client, model, stream=mode == "sync-stream", max_tokens=max_tokens)
            edits = sum(len(s.ledger) for s in cachecompact.wrapped_sessions(client))
            if store is not None:
                (session,) = cachecompact.wrapped_sessions(client)
                report = session_report(session, detail=False)  # the report counts what our edits invalidated
                if not api:
                    assert "blocks in" in report and "invalidated by our edits" in report, report
                assert all(e.kind == ("compaction" if api else "summary") for e in session.ledger.entries
                           if e.level in ("L3", "L4")), [e.kind for e in session.ledger.entries]
        return _verdict(emu), edits, _reasoning_kept(emu)


@pytest.mark.parametrize(("mode", "max_tokens"), [("sync", 128_000), ("sync-stream", 64_000), ("async", 32_000),
                                                  ("async-stream", 128_000)])
def test_api_written_summaries_work_at_a_clients_max_tokens(mode: str, max_tokens: int) -> None:
    """Issue 62: Claude Code sends ``max_tokens`` 128,000 and opencode 32,000. The compaction call
    used to reuse it without streaming, which the SDK refuses ("Streaming is required"), so every
    summary fell to L5 and then to ours, invalidating the thinking after it. Now it streams: the API
    writes every L3/L4 summary, no rounds are dropped, and every turn's thinking goes back valid.
    The window is ``max_tokens`` more than the other tests' (the emulator's too), so the same agent
    compacts as often there, and input + ``max_tokens`` must fit as the API asks."""
    events: list[Any] = []
    (refused, dropped, _kept, asked), _edits, reasoning = _run(mode, "claude-opus-5-5", max_tokens=max_tokens,
                                                             window=WINDOW + max_tokens, events=events)
    summaries = [e for e in events if e.kind == "compaction" and e.level in ("L3", "L4", "L5")]
    failures = [e.reason for e in events if e.kind == "failure"]
    assert failures == [] and not any("Streaming is required" in r for r in failures)
    assert summaries and all(e.level != "L5" for e in summaries), [(e.level, e.reason) for e in summaries]
    assert all("written by the API" in e.reason for e in summaries if e.level in ("L3", "L4"))
    assert (refused, dropped, asked) == (0, 0, 0) and reasoning >= 0.99, (refused, dropped, asked, reasoning)


def test_a_wrapped_agent_on_opus_5_5_compacts_without_a_refused_or_dropped_block(tmp_path: Path) -> None:
    """The API writes the summaries: every turn's thinking goes back valid."""
    (refused, dropped, kept, asked), edits, reasoning = _run("sync", "claude-opus-5-5", tmp_path)
    assert edits >= 3, edits  # compacted several times
    assert (refused, dropped, asked) == (0, 0, 0) and kept > TURNS  # earlier turns' thinking went back, valid
    assert reasoning >= 0.99, reasoning


def test_our_own_summaries_remove_the_thinking_after_them(tmp_path: Path) -> None:
    """``api_summaries`` off: our summaries, the thinking after each removed (not refused, not
    dropped), so less of the reasoning reaches the model."""
    (refused, dropped, kept, _asked), edits, reasoning = _run("sync", "claude-opus-5-5", tmp_path, api=False)
    assert edits >= 3, edits
    assert (refused, dropped) == (0, 0) and kept > TURNS
    assert reasoning < 0.99, reasoning


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "async", "sync-stream", "async-stream", "proxy"])
@pytest.mark.parametrize("model", MODELS)
def test_every_current_model_in_every_client_mode(mode: str, model: str) -> None:
    (refused, dropped, kept, asked), edits, reasoning = _run(mode, model)
    assert edits >= 3, (model, mode, edits)
    assert (refused, dropped) == (0, 0), (model, mode, refused, dropped, asked)
    assert kept > TURNS
    assert reasoning >= 0.99, (model, mode, reasoning)


@pytest.mark.parametrize("via", ["wrap", "proxy"])
def test_a_too_long_retry_carries_the_betas_its_compacted_body_needs(via: str) -> None:
    """The review of issue 49's exchange: after a prompt-too-long 400 the proxy sent the compacted
    body with the first body's beta headers. Reactive compaction mid tool loop binds the loop's
    thinking (``block_binding``, which needs its beta), so the retry was refused with "Extra inputs
    are not permitted" where wrap() went on. A window the client believes larger than the API's
    makes every compaction reactive; both adapters now finish the loop."""
    model = "claude-sonnet-5-5"
    with Emulator(SummarizingResponder(_model()), context_window=30_000) as emu:
        if via == "proxy":
            with Proxy(ProxyConfig(upstream=emu.url, port=0, mode="compact", window_tokens=2_000_000)) as px:
                client = anthropic.Anthropic(base_url=px.url, api_key="k", max_retries=0)
                msgs: list[dict[str, Any]] = [{"role": "user", "content": "Audit the project, part by part."}]
                for k in range(30):
                    r = client.messages.create(model=model, max_tokens=4000, system=SYSTEM, tools=TOOLS,  # type: ignore[arg-type]
                                               messages=msgs)  # type: ignore[arg-type]
                    _next(msgs, [b.model_dump(exclude_none=True) for b in r.content], k)
                px.wait_idle()
                assert px.state.engine is not None
                events = list(px.state.engine.events.history)
        else:
            client = cachecompact.wrap(anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0), store=None,
                                       window_tokens=2_000_000)
            msgs = [{"role": "user", "content": "Audit the project, part by part."}]
            for k in range(30):
                r = client.messages.create(model=model, max_tokens=4000, system=SYSTEM, tools=TOOLS,  # type: ignore[arg-type]
                                           messages=msgs)  # type: ignore[arg-type]
                _next(msgs, [b.model_dump(exclude_none=True) for b in r.content], k)
            events = list(_middleware_of(client).engine.events.history)
        refusals = list(emu.core.refusals)
    # all 30 turns answered (before, the proxy's turn 13 raised BadRequestError), and the retry path ran
    assert any(e.kind == "compaction" and (e.reason or "").startswith("prompt too long") for e in events)
    assert refusals == []
