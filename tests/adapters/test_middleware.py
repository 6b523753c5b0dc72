"""The middleware through the real SDK against the emulator: sync, async, streaming, retries
under injected faults, reactive compaction, fail-open and fail-fast, sessions for many
agents, branches, restarts, gzip, and a 150-turn tool agent at a 40k window."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest
from aiohttp import web

import cachecompact
from cachecompact import Session
from cachecompact.adapters.httpserver import ServerThread
from cachecompact.adapters.middleware import SESSION_HEADER, CompactionMiddleware, scratchpad_handler, wrap
from cachecompact.adapters.sdk_errors import ContextFullError
from cachecompact.base.errors import ConfigError, PolicyConfigError, UnknownStrategyError
from cachecompact.base.events import Event
from cachecompact.compaction.policy import LevelSettings, PolicyConfig
from cachecompact.tools.cli import main as cli_main
from cachecompact.tools.emulator import (
    CLOCK_HEADER,
    Emulator,
    FaultConfig,
    ReplayResponder,
    ScriptedResponder,
    SummarizingResponder,
)
from cachecompact.tools.emulator.responders import Reply
from cachecompact.tools.traces import Trace, synthetic_trace

from ..conftest import history

MODEL = "claude-sonnet-4-6"
SYSTEM = "You are a careful agent. " * 120


@pytest.fixture
def emu() -> Iterator[Emulator]:
    with Emulator() as e:
        yield e


def _mw(client: Any) -> CompactionMiddleware:
    mw = client.middleware[-1]
    assert isinstance(mw, CompactionMiddleware)
    return mw


def _requests(s: Session) -> list[dict[str, Any]]:
    assert s.store is not None
    return [rec for _, rec in s.store.read_all("requests")]


def _turns(trace: Trace) -> Iterator[tuple[float, dict[str, Any] | None]]:
    msgs = trace.messages
    for i in range(1, len(msgs), 2):
        yield (trace.timestamps[i - 1] or float(i)), (msgs[i + 1] if i + 1 < len(msgs) else None)


def run_agent(client: Any, trace: Trace, stream: bool = False, max_tokens: int = 2000) -> list[dict[str, Any]]:
    """A plain agent loop: full history each turn; the model's reply comes from the replay."""
    hist = [trace.messages[0]]
    for t, next_user in _turns(trace):
        kw = dict(model=MODEL, max_tokens=max_tokens, system=trace.system or SYSTEM, tools=trace.tools,
                  messages=hist, extra_headers={CLOCK_HEADER: str(t)})
        if stream:
            with client.messages.stream(**kw) as s:
                reply = s.get_final_message()
        else:
            reply = client.messages.create(**kw)
        hist = [*hist, {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]}]
        if next_user is not None:
            hist = [*hist, next_user]
    return hist


async def run_agent_async(client: Any, trace: Trace, stream: bool = False) -> list[dict[str, Any]]:
    hist = [trace.messages[0]]
    for t, next_user in _turns(trace):
        kw = dict(model=MODEL, max_tokens=2000, system=trace.system or SYSTEM, tools=trace.tools,
                  messages=hist, extra_headers={CLOCK_HEADER: str(t)})
        if stream:
            async with client.messages.stream(**kw) as s:
                reply = await s.get_final_message()
        else:
            reply = await client.messages.create(**kw)
        hist = [*hist, {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]}]
        if next_user is not None:
            hist = [*hist, next_user]
    return hist


def _check_session(mw: CompactionMiddleware, hist: list[dict[str, Any]]) -> Session:
    sessions = mw.sessions()
    assert len(sessions) == 1
    s = sessions[0]
    # nothing lost, nothing twice: the last reply and tool result were never sent back
    assert s.messages() == hist[: len(s)] and len(s) >= len(hist) - 2
    assert [e.seq for e in s.ledger.entries] == list(range(len(s.ledger)))
    if s.path is not None:
        again = Session.open(s.path, readonly=True)  # the store verifies: hashes, chains, replay
        assert again.messages() == s.messages() and len(again.ledger) == len(s.ledger)
    return s


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
def test_sync_client_compacts_and_records(tmp_path: Path, stream: bool) -> None:
    trace = synthetic_trace(6)
    with Emulator(SummarizingResponder(ReplayResponder(trace.messages))) as emu:
        client = wrap(anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0), store=tmp_path,
                      window_tokens=40_000)
        hist = run_agent(client, trace, stream=stream)
        sent = [r for r in emu.requests if not r.get("internal")]  # not the summarizer's own calls
        billed = sum(r["cost_usd"] for r in emu.requests if r.get("status") == 200)
    s = _check_session(_mw(client), hist)
    assert len(s.ledger) > 0  # the small window forced compaction
    assert max(r["total_input_tokens"] for r in sent) <= 40_000
    recs = _requests(s)
    assert len(recs) == len(sent) and all(r["usage"].get("output_tokens") for r in recs)
    reads = sum(r["usage"]["cache_read_input_tokens"] for r in sent)
    assert reads / sum(r["total_input_tokens"] for r in sent) > 0.5
    # the report's total is what the emulator billed (agent requests and summaries)
    from cachecompact.tools.session_report import session_data

    assert session_data(s)["cost"]["total_usd"] == pytest.approx(billed, rel=1e-6)


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
def test_async_client(tmp_path: Path, stream: bool) -> None:
    trace = synthetic_trace(2)
    with Emulator(SummarizingResponder(ReplayResponder(trace.messages))) as emu:
        client = wrap(anthropic.AsyncAnthropic(base_url=emu.url, api_key="t", max_retries=0), store=tmp_path,
                      window_tokens=40_000)
        hist = asyncio.run(run_agent_async(client, trace, stream=stream))
        n = sum(1 for r in emu.requests if not r.get("internal"))
    s = _check_session(_mw(client), hist)
    assert len(_requests(s)) == n


@pytest.mark.parametrize("mode", ["sync", "sync-stream", "async", "async-stream"])
def test_retries_under_20_percent_faults_never_duplicate(tmp_path: Path, mode: str) -> None:
    trace = synthetic_trace(6)
    with Emulator(SummarizingResponder(ReplayResponder(trace.messages))) as emu:  # the reference: no faults
        ref = wrap(anthropic.Anthropic(base_url=emu.url, api_key="t"), store=tmp_path / "ref", window_tokens=40_000)
        run_agent(ref, trace)
    ref_s = _mw(ref).sessions()[0]
    faults = FaultConfig(rate=0.2, seed=11)
    with Emulator(SummarizingResponder(ReplayResponder(trace.messages)), faults=faults) as emu:
        kw: dict[str, Any] = dict(base_url=emu.url, api_key="t", max_retries=12)
        stream = mode.endswith("stream")
        if mode.startswith("async"):
            client: Any = wrap(anthropic.AsyncAnthropic(**kw), store=tmp_path / "f", window_tokens=40_000)
            hist = asyncio.run(run_agent_async(client, trace, stream=stream))
        else:
            client = wrap(anthropic.Anthropic(**kw), store=tmp_path / "f", window_tokens=40_000)
            hist = run_agent(client, trace, stream=stream)
        n_faults = sum(1 for r in emu.requests if r.get("fault"))
    assert n_faults > 3
    s = _check_session(_mw(client), hist)
    assert [(e.kind, e.start, e.end, e.level) for e in s.ledger.entries] == \
        [(e.kind, e.start, e.end, e.level) for e in ref_s.ledger.entries]


# -- a tool agent as a new user writes it ------------------------------------------------------------


def _file_text(n: int) -> str:
    """What read_file returns: ~2k tokens for the first file, ~1.2k after that, one fact line each."""
    lines = [f"# module {n}", f"CONFIG_{n} = {n * 7919 % 100_003}"]
    body = 260 if n == 0 else 150
    lines += [f"def step_{n}_{k}(x):  return transform_{k}(x, scale={k}, offset={n})" for k in range(body)]
    return "\n".join(lines)


def _tool_model(body: dict[str, Any]) -> Reply:
    """The scripted model: reads the next file, numbered by the tool results it was shown so far."""
    seen = sum(1 for m in body["messages"] if isinstance(m.get("content"), list)
               for b in m["content"] if b.get("type") == "tool_result")
    n = int(body["messages"][-1]["content"][-1]["tool_use_id"].rsplit("_", 1)[-1]) + 1 \
        if seen and isinstance(body["messages"][-1].get("content"), list) else 0
    return Reply([{"type": "text", "text": f"Reading module {n}."},
                  {"type": "tool_use", "id": f"toolu_read_{n:04d}", "name": "read_file",
                   "input": {"path": f"src/mod_{n}.py"}}], "tool_use")


TOOLS = [{"name": "read_file", "description": "Read a file.",
          "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}]


def _tool_result(call: Any) -> dict[str, Any]:
    n = int(call.input["path"].split("_")[-1].split(".")[0])
    return {"type": "tool_result", "tool_use_id": call.id, "content": _file_text(n)}


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "stream", "async"])
def test_a_tool_agent_runs_150_turns_at_a_40k_window(tmp_path: Path, mode: str) -> None:
    events: list[Event] = []
    turns = 150
    with Emulator(SummarizingResponder(ScriptedResponder(_tool_model))) as emu:
        kw = dict(store=tmp_path, window_tokens=40_000, on_event=events.append)
        messages: list[dict[str, Any]] = [{"role": "user", "content": "Read every module and note its CONFIG."}]

        def step(reply: Any) -> None:
            messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True)
                                                              for b in reply.content]})
            calls = [b for b in reply.content if b.type == "tool_use"]
            messages.append({"role": "user", "content": [_tool_result(c) for c in calls]})

        if mode == "async":
            aclient = wrap(anthropic.AsyncAnthropic(base_url=emu.url, api_key="t", max_retries=0), **kw)

            async def loop() -> None:
                for _ in range(turns):
                    step(await aclient.messages.create(model=MODEL, max_tokens=1024, system=SYSTEM, tools=TOOLS,
                                                       messages=messages))
            asyncio.run(loop())
            mw = _mw(aclient)
        else:
            client = wrap(anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0), **kw)
            for _ in range(turns):
                if mode == "stream":
                    with client.messages.stream(model=MODEL, max_tokens=1024, system=SYSTEM, tools=TOOLS,
                                                messages=messages) as s:
                        step(s.get_final_message())
                else:
                    step(client.messages.create(model=MODEL, max_tokens=1024, system=SYSTEM, tools=TOOLS,
                                                messages=messages))
            mw = _mw(client)
        sent = [r for r in emu.requests if not r.get("internal") and r.get("status") == 200]
    assert len(sent) == turns
    assert max(r["total_input_tokens"] for r in sent) <= 40_000
    bad = [e for e in events if e.kind in ("failure", "context_full", "refused", "breaker_open")]
    assert not bad, bad[:3]
    levels = {e.level for s in mw.sessions() for e in s.ledger.entries}
    assert levels & {"L3", "L4"}, levels
    (s,) = mw.sessions()
    # nothing edits the prefix but a summary the API wrote, whose block must open the request
    assert all(e.start >= (s.prefix_end or 0) or e.kind == "compaction" for e in s.ledger.entries)
    assert s.path is not None and cli_main(["ledger", "verify", str(s.path)]) == 0


def _long_result(call: Any) -> dict[str, Any]:
    """A file with prose after its definitions: its placeholder (preview and key lines) is shorter.
    A file of definitions alone is all key lines, and L2 leaves it whole."""
    r = _tool_result(call)
    return {**r, "content": r["content"] + "".join(f"\n# note {k}: this step scales and offsets" for k in range(200))}


def _too_big_result(call: Any) -> dict[str, Any]:
    """A result over half a 20k window: more than a compaction could keep whole, so it is shortened
    as it arrives (smaller ones arrive whole, issue 47)."""
    r = _long_result(call)
    return {**r, "content": r["content"] + "".join(f"\n# more notes {k}: scaled, offset, kept" for k in range(900))}


def test_placeholders_name_only_tools_the_request_carries(tmp_path: Path) -> None:
    with Emulator(SummarizingResponder(ScriptedResponder(_tool_model))) as emu:
        # with the scratchpad tool on a stored session and on an in-memory one (store=None)
        for opt, store in ((False, tmp_path / "a"), (True, tmp_path / "b"), (True, None)):
            client = wrap(anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0), store=store,
                          window_tokens=20_000, scratchpad_tool=opt, summarizer=None, prefix_messages=1)
            messages: list[dict[str, Any]] = [{"role": "user", "content": "Read every module."}]
            for _ in range(30):
                reply = client.messages.create(model=MODEL, max_tokens=512, system=SYSTEM, tools=TOOLS,
                                               messages=messages)
                messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True)
                                                                  for b in reply.content]})
                messages.append({"role": "user", "content": [_too_big_result(c) for c in reply.content
                                                             if c.type == "tool_use"]})
            mw = _mw(client)
            body = mw.sessions()[0].render().body
            text = str(body["messages"])
            names = [t["name"] for t in body.get("tools", [])]
            assert ("read_scratchpad" in names) == opt
            if opt:
                assert "read_scratchpad" in text
                handle = scratchpad_handler(client)
                import re

                ref = re.search(r"sp_[0-9a-f]{8,}", text)
                assert ref is not None
                out, is_error = handle({"ref": ref.group(0)})
                assert not is_error and "CONFIG_" in out
                # the read's own result reaches the model whole: shortening it again would hand the
                # agent a new reference to the same text, a loop
                use = {"type": "tool_use", "id": "toolu_9999", "name": "read_scratchpad",
                       "input": {"ref": ref.group(0)}}
                reread = [*messages, {"role": "assistant", "content": [use]},
                          {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_9999",
                                                        "content": out}]}]
                client.messages.create(model=MODEL, max_tokens=512, system=SYSTEM, tools=TOOLS, messages=reread)
                sent = mw.sessions()[0].render().body["messages"][-1]["content"][0]["content"]
                assert sent == out and len(out) > 4 * mw.sessions()[0].counter.calibration * 1000
                if store is not None:  # a restarted agent answers its pending call before any request,
                    # from its own conversation, which its history names (issue 56)
                    again = wrap(anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0), store=store,
                                 window_tokens=20_000, scratchpad_tool=True, summarizer=None)
                    assert scratchpad_handler(again)({"ref": ref.group(0)}, reread) == (out, False)
                    half_made = store / "000-crashed-while-created"  # listed first, holds no session
                    half_made.mkdir()
                    (half_made / "session.json").write_text("{}")
                    third = wrap(anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0), store=store,
                                 window_tokens=20_000, scratchpad_tool=True, summarizer=None)
                    assert scratchpad_handler(third)({"ref": ref.group(0)}, reread) == (out, False)
            else:
                assert "read_scratchpad" not in text  # never a tool the request does not carry
                # and never advice that cannot work: a result too big for the window's room is not offered
                # whole on a re-run (it would be shortened again, a loop), but asked for in parts
                assert "too large to show whole here" in text and "ask for the part you need" in text


# -- sessions ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_50_async_agents_with_identical_openings_get_one_session_each(tmp_path: Path) -> None:
    with Emulator() as emu:
        client = wrap(anthropic.AsyncAnthropic(base_url=emu.url, api_key="t", max_retries=2), store=tmp_path,
                      summarizer=None)

        async def agent(k: int) -> None:
            msgs: list[dict[str, Any]] = [{"role": "user", "content": "Same task for everyone."}]
            for turn in range(8):
                reply = await client.messages.create(model=MODEL, max_tokens=50, system=SYSTEM, messages=msgs)
                if turn == 7:
                    break
                msgs = [*msgs, {"role": "assistant", "content": [b.model_dump(exclude_none=True)
                                                                 for b in reply.content]},
                        {"role": "user", "content": f"agent {k} step {turn}"}]

        async def main() -> None:
            await asyncio.gather(*(agent(k) for k in range(50)))
        asyncio.run(main())
    ids = cachecompact.store.FileStore(tmp_path).list()
    assert len(ids) == 50
    stored = [Session.open(cachecompact.store.FileStore(tmp_path), sid, readonly=True) for sid in ids]
    assert sum(len(s) for s in stored) == 750


def test_rewritten_history_starts_a_branch(tmp_path: Path, emu: Emulator, caplog: pytest.LogCaptureFixture) -> None:
    client = wrap(anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0), store=tmp_path, summarizer=None)
    client.messages.create(model=MODEL, max_tokens=10, system=SYSTEM, messages=history(4))
    first = _mw(client).sessions()[0]
    assert first.path is not None
    before = (first.path / "transcript.jsonl").read_bytes()
    edited = history(5)
    edited[8]["content"][0]["content"] = "a different output"  # the last stored message, rewritten
    client.messages.create(model=MODEL, max_tokens=10, system=SYSTEM, messages=edited)
    assert (first.path / "transcript.jsonl").read_bytes() == before
    ids = cachecompact.store.FileStore(tmp_path).list()
    assert ids == [first.session_id, first.session_id + ".2"]
    assert Session.open(tmp_path / ids[1]).messages() == edited


def test_named_session_header_is_checked(tmp_path: Path, emu: Emulator) -> None:
    client = wrap(anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0), store=tmp_path, summarizer=None)
    client.messages.create(model=MODEL, max_tokens=10, messages=history(1), extra_headers={SESSION_HEADER: "job-7"})
    assert cachecompact.store.FileStore(tmp_path).list() == ["job-7"]
    # a hostile id never names a path: the request goes out unchanged and nothing is stored
    out = client.messages.create(model=MODEL, max_tokens=10, messages=history(1), extra_headers={SESSION_HEADER: ".."})
    assert out.content and cachecompact.store.FileStore(tmp_path).list() == ["job-7"]
    assert not (tmp_path.parent / "session.json").exists()


def test_restart_continues_and_a_corrupt_store_fails_open(tmp_path: Path, emu: Emulator) -> None:
    events: list[Event] = []

    def fresh() -> Any:
        return wrap(anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0), store=tmp_path,
                    summarizer=None, on_event=events.append)

    fresh().messages.create(model=MODEL, max_tokens=10, system=SYSTEM, messages=history(3))
    again = fresh()
    again.messages.create(model=MODEL, max_tokens=10, system=SYSTEM, messages=history(5))
    s = _mw(again).sessions()[0]
    assert len(s) == len(history(5)) and s.path is not None
    p = s.path / "transcript.jsonl"
    lines = p.read_bytes().split(b"\n")
    lines[1] = lines[1].replace(b"step 0", b"STEP 0")
    p.write_bytes(b"\n".join(lines))
    tampered = p.read_bytes()
    out = fresh().messages.create(model=MODEL, max_tokens=10, system=SYSTEM, messages=history(6))
    assert out.content  # the agent goes on with its original request ...
    assert any(e.kind == "failure" and "transcript.jsonl:2" in e.reason for e in events)  # ... and is told why
    assert p.read_bytes() == tampered  # nothing overwritten


# -- failing fast and failing open ---------------------------------------------------------------------


def test_wrap_refuses_misconfiguration_when_called(tmp_path: Path) -> None:
    c = anthropic.Anthropic(api_key="t", base_url="http://127.0.0.1:9")
    with pytest.raises(UnknownStrategyError, match="known:"):
        wrap(c, strategy="magic")
    with pytest.raises(PolicyConfigError, match="window_tokens"):
        wrap(c, window_tokens=1_000)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match="not a writable directory"):
        wrap(c, store=blocker / "sub")
    with pytest.raises(ConfigError, match="postgres"):
        wrap(c, store="mysql://x")
    for bad in ({"store": 123}, {"store_dir": 5}):  # a bare TypeError from pathlib before
        with pytest.raises(ConfigError, match="store must be a directory path"):
            wrap(c, **bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        wrap(c, summarizer="magic")  # type: ignore[arg-type]
    with pytest.raises(cachecompact.base.errors.InvalidSessionIdError):
        wrap(c, session_id="../etc")
    with pytest.raises(ConfigError, match="scratchpad_tool must be True or False"):
        wrap(c, scratchpad_tool="yes")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="on_event must be a callable"):
        wrap(c, on_event=5)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="1-hour breakpoint after a 5-minute one"):
        wrap(c, ttl="1h", prefix_ttl="5m")
    with pytest.raises(ConfigError, match="not both"):
        wrap(c, store=tmp_path / "a", store_dir=tmp_path / "b")
    for bad in ("haiku", "gpt-4o"):  # a family name prices fine, but no API takes it
        with pytest.raises(ConfigError, match="not a Claude model id"):
            wrap(c, summarizer_model=bad)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    # the accepted shortcuts
    mw = _mw(wrap(c, store=None, window_tokens=40_000, summarizer_model="claude-haiku-4-5"))
    assert mw.window_tokens == 40_000


def test_context_full_error_is_an_sdk_error() -> None:
    assert issubclass(ContextFullError, anthropic.APIError)
    assert issubclass(ContextFullError, cachecompact.CacheCompactError)


def test_reactive_compaction_on_prompt_too_long(emu: Emulator) -> None:
    events: list[Event] = []
    # the policy believes in a 2M window, so only the API's 400 tells it the prompt is too long
    blind = PolicyConfig(window_tokens=2_000_000, levels=LevelSettings(keep_recent_tokens=5_000_000))
    client = wrap(anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0), store=None,
                  config=blind, summarizer=None, on_event=events.append)
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "Task: fix it"}]
    for k in range(70):
        msgs += [{"role": "assistant", "content": [{"type": "tool_use", "id": f"toolu_{k}", "name": "bash",
                                                    "input": {"command": f"cat f{k}"}}]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{k}",
                                               "content": " ".join(f"v{k}x{j}" for j in range(1800))}]}]
    out = client.messages.create(model="claude-haiku-4-5", max_tokens=1000, messages=msgs)
    assert out.content[0].type == "text"
    assert any(e.kind == "compaction" and "prompt too long" in e.reason for e in events)
    assert emu.requests[-1]["total_input_tokens"] <= 200_000 - 1000


def test_context_full_when_nothing_can_be_removed(emu: Emulator) -> None:
    client = wrap(anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0), store=None,
                  window_tokens=2_000_000, summarizer=None)
    huge = " ".join(f"t{j}" for j in range(110_000))  # the task itself is over the window
    with pytest.raises(ContextFullError, match="start a new session") as err:
        client.messages.create(model="claude-haiku-4-5", max_tokens=10, messages=[{"role": "user", "content": huge}])
    msg = str(err.value)
    assert "reserves 10 output tokens (its max_tokens)" in msg and "take a window of at least" in msg
    # the first message is the prefix, and it is what is full: said, with what to do
    assert "immutable prefix" in msg and "the task itself is over the limit" in msg, msg
    assert "-" not in msg.split("window of at least")[1].split(";")[0], msg  # no negative reserve


def test_context_full_names_prefix_messages_when_the_prefix_is_full(emu: Emulator) -> None:
    """Issue 37: the README's fix for a first tool result too big for the window is
    ``prefix_messages=1``, and the error did not name it."""
    client = wrap(anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0), store=None,
                  window_tokens=30_000, summarizer=None)
    big = " ".join(f"r{j}" for j in range(40_000))
    msgs = [{"role": "user", "content": "read the file"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "bash",
                                               "input": {"command": "cat big"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": big}]}]
    with pytest.raises(ContextFullError) as err:
        client.messages.create(model="claude-haiku-4-5", max_tokens=100, messages=msgs)
    msg = str(err.value)
    assert "prefix_messages=1" in msg and "immutable prefix" in msg, msg
    assert "estimate error" not in msg or "-" not in msg.split("estimate error")[0].rsplit(" and ", 1)[-1], msg


def test_fail_open_sends_the_original_request(emu: Emulator, caplog: pytest.LogCaptureFixture) -> None:
    events: list[Event] = []
    client = wrap(anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0), store=None, summarizer=None,
                  on_event=events.append)
    client.messages.create(model=MODEL, max_tokens=10, messages=history(1))
    (strategy,) = _mw(client).strategies()

    def boom(*a: Any, **k: Any) -> Any:
        raise RuntimeError("bug in a level")

    strategy.before_request = boom  # type: ignore[method-assign]
    with caplog.at_level(logging.ERROR, logger="cachecompact"):
        out = client.messages.create(model=MODEL, max_tokens=10, messages=history(2))
    assert out.content and any(e.kind == "failure" and "bug in a level" in e.reason for e in events)
    assert emu.requests[-1]["n_messages"] == len(history(2))


def test_a_non_json_400_reaches_the_caller_as_the_sdks_own_error() -> None:
    async def plain(_: web.Request) -> web.Response:
        return web.Response(status=400, text="<html>bad gateway config</html>", content_type="text/html")

    def app() -> web.Application:
        a = web.Application()
        a.router.add_route("*", "/{tail:.*}", plain)
        return a

    with ServerThread(app) as srv:
        for c in (anthropic.Anthropic(base_url=srv.url, api_key="t", max_retries=0),
                  wrap(anthropic.Anthropic(base_url=srv.url, api_key="t", max_retries=0), store=None,
                       summarizer=None)):
            with pytest.raises(anthropic.BadRequestError):
                c.messages.create(model=MODEL, max_tokens=10, messages=history(1))


def test_usage_is_read_after_gzip_decoding(tmp_path: Path) -> None:
    with Emulator(gzip=True) as emu:
        client = wrap(anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0), store=tmp_path,
                      summarizer=None)
        for n in (1, 2, 3):
            client.messages.create(model=MODEL, max_tokens=10, system=SYSTEM, messages=history(n))
        with client.messages.stream(model=MODEL, max_tokens=10, system=SYSTEM, messages=history(4)) as s:
            s.get_final_message()
        billed = [r["usage"] for r in emu.requests]
    recs = _requests(_mw(client).sessions()[0])
    assert [r["usage"]["cache_read_input_tokens"] for r in recs] == [u["cache_read_input_tokens"] for u in billed]
    assert recs[-1]["usage"]["cache_read_input_tokens"] > 0


def test_other_endpoints_pass_through(emu: Emulator) -> None:
    client = wrap(anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0), store=None, summarizer=None)
    assert client.messages.count_tokens(model=MODEL, messages=history(1)).input_tokens > 0
    assert any(m.id == MODEL for m in client.models.list())
    assert _mw(client).sessions() == []


def test_events_become_opentelemetry_span_events(emu: Emulator) -> None:
    otel = pytest.importorskip("opentelemetry.sdk.trace")
    from opentelemetry import trace
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = otel.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    tracer = provider.get_tracer("test")
    client = wrap(anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0), store=None, summarizer=None,
                  window_tokens=20_000)
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    with tracer.start_as_current_span("agent-turn"):
        for k in range(12):
            msgs += [{"role": "assistant", "content": [{"type": "tool_use", "id": f"toolu_{k}", "name": "read_file",
                                                        "input": {"path": f"f{k}"}}]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{k}",
                                                   "content": f"line {k} " * 500}]}]
            client.messages.create(model=MODEL, max_tokens=100, messages=msgs)
    names = {e.name for s in exporter.get_finished_spans() for e in s.events}
    assert "cachecompact.compaction" in names or "cachecompact.externalized" in names


@pytest.mark.slow
def test_example_agent_loop_prints_the_cache_report() -> None:
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, str(root / "examples" / "replay_agent.py"), "--window", "60000"],
                         capture_output=True, text=True, timeout=300, check=True)
    assert "through a wrapped client" in out.stdout and "hit rate" in out.stdout


def test_signed_thinking_survives_compaction(tmp_path: Path) -> None:
    """With thinking on, the emulator signs each thinking block and refuses a changed one, and a
    tool loop's last assistant turn must still start with its thinking (as the API does)."""

    def thinker(body: dict[str, Any]) -> Reply:
        r = _tool_model(body)
        n = r.content[-1]["input"]["path"]
        return Reply([{"type": "thinking", "thinking": f"I should read {n} next, then compare."}, *r.content],
                     "tool_use")

    events: list[Event] = []
    with Emulator(SummarizingResponder(ScriptedResponder(thinker))) as emu:
        client = wrap(anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0), store=tmp_path,
                      window_tokens=20_000, on_event=events.append)
        messages: list[dict[str, Any]] = [{"role": "user", "content": "Read every module."}]
        for _ in range(60):
            reply = client.messages.create(model=MODEL, max_tokens=4096, system=SYSTEM, tools=TOOLS,
                                           thinking={"type": "enabled", "budget_tokens": 1024}, messages=messages)
            messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]})
            messages.append({"role": "user", "content": [_tool_result(c) for c in reply.content
                                                         if c.type == "tool_use"]})
        bad = [r for r in emu.requests if r.get("status") != 200]
    assert not bad, bad[:2]  # every rendered request kept every signature and the loop's thinking
    (s,) = _mw(client).sessions()
    assert len(s.ledger) > 0 and not [e for e in events if e.kind in ("failure", "context_full")]
    body = s.render(model=MODEL, max_tokens=4096, thinking={"type": "enabled", "budget_tokens": 1024}).body
    sent = {json.dumps(b, sort_keys=True) for m in body["messages"] if m["role"] == "assistant"
            for b in m["content"] if isinstance(m["content"], list) and b.get("type") == "thinking"}
    original = {json.dumps(b, sort_keys=True) for m in s.messages() if m["role"] == "assistant"
                for b in m["content"] if b.get("type") == "thinking"}
    assert sent and sent <= original  # thinking blocks are kept whole or dropped with their turn, never edited


def test_a_window_larger_than_the_models_is_said_once(emu: Emulator, caplog: pytest.LogCaptureFixture) -> None:
    """A window the model does not have would let the API refuse requests before compaction starts."""
    import logging

    client = wrap(anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0), store=None,
                  window_tokens=3_000_000, summarizer=None)
    with caplog.at_level(logging.WARNING, "cachecompact"):
        for k in range(2):
            client.messages.create(model="claude-haiku-4-5", max_tokens=64, system=SYSTEM,
                                   messages=[{"role": "user", "content": f"hello {k}"}])
    assert caplog.text.count("larger than claude-haiku-4-5's context window") == 1


def test_a_callers_1_hour_markers_replaced_are_said_once(emu: Emulator, caplog: pytest.LogCaptureFixture) -> None:
    """Caller markers are not history (the renderer places its own), so a 1-hour TTL the caller
    asked went to 5 minutes without a word: after an idle gap that is a cold cache."""
    system = [{"type": "text", "text": SYSTEM * 3, "cache_control": {"type": "ephemeral", "ttl": "1h"}}]
    for ttl in (None, "1h"):
        client = wrap(anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0), store=None,
                      summarizer=None, ttl=ttl)
        caplog.clear()
        with caplog.at_level(logging.WARNING, "cachecompact"):
            hist = [{"role": "user", "content": f"hello {ttl}"}]
            for k in range(3):  # one conversation, three requests
                reply = client.messages.create(model=MODEL, max_tokens=64, system=system, messages=hist)
                hist += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]},
                         {"role": "user", "content": f"and {k}?"}]
        said = caplog.text.count("asks a 1-hour TTL")
        assert said == (1 if ttl is None else 0), caplog.text
        written = emu.requests[-3]["usage"]["cache_creation"]  # this conversation's first request
        assert written[f"ephemeral_{ttl or '5m'}_input_tokens"] > 0 and sum(written.values()) == written[
            f"ephemeral_{ttl or '5m'}_input_tokens"], written


@pytest.mark.parametrize("mode", ["sync-create", "sync-stream", "async-create", "async-stream"])
def test_the_claude_code_peer_compacts_under_streaming(mode: str) -> None:
    """Its summary on the cached prefix copies the agent's request: a streaming request's copy
    must not stream (it failed every compaction with "'Stream' object has no attribute
    'usage'" and fell open, uncompacted)."""
    trace = synthetic_trace(6)
    events: list[Event] = []
    with Emulator(SummarizingResponder(ReplayResponder(trace.messages))) as emu:
        base = anthropic.AsyncAnthropic if mode.startswith("async") else anthropic.Anthropic
        client = wrap(base(base_url=emu.url, api_key="t", max_retries=0), store=None, strategy="claude-code",
                      window_tokens=40_000, on_event=events.append)
        stream = mode.endswith("stream")
        if mode.startswith("async"):
            asyncio.run(run_agent_async(client, trace, stream=stream))
        else:
            run_agent(client, trace, stream=stream)
        sent = [r for r in emu.requests if not r.get("internal") and r.get("status") == 200]
    assert [e for e in events if e.kind == "failure"] == []
    assert any(e.kind == "compaction" and e.level == "L4" for e in events)
    assert max(r["total_input_tokens"] for r in sent) <= 40_000


def test_the_openhands_peer_holds_a_window_only_through_the_apis_errors() -> None:
    """Documented (strategies/openhands.py): window_tokens is not an OpenHands setting. With a
    model window of 1M it goes past a 40k window_tokens; with a 40k context window at the API it
    condenses when the API refuses a request (and may still not fit: its tail is 55 events)."""
    trace = synthetic_trace(6)
    with Emulator(SummarizingResponder(ReplayResponder(trace.messages))) as emu:
        client = wrap(anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0), store=None,
                      strategy="openhands", window_tokens=40_000)
        run_agent(client, trace)
        peak = max(r["total_input_tokens"] for r in emu.requests if r.get("status") == 200 and not r.get("internal"))
    assert peak > 40_000
    events: list[Event] = []
    with Emulator(SummarizingResponder(ReplayResponder(trace.messages)), context_window=40_000) as emu:
        client = wrap(anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0), store=None,
                      strategy="openhands", window_tokens=40_000, on_event=events.append)
        with contextlib.suppress(ContextFullError):
            run_agent(client, trace)
    assert any(e.kind == "compaction" and "context window exceeded" in (e.reason or "") for e in events)


def test_a_model_id_not_in_the_price_table_is_refused_with_the_nearest_ids(emu: Emulator) -> None:
    """``claude-sonnet-4.6`` was priced as Sonnet 5.5 (a third off) with one warning; ``claude-opus-6``
    as Opus 5.5. wrap() now refuses them before anything is sent, naming the nearest ids; a
    dated id of a table entry is fine; ``pricing=`` prices an unlisted model on purpose."""
    from cachecompact.base.errors import UnknownModelError

    client = wrap(anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0), store=None, summarizer=None)
    for bad, near in (("claude-sonnet-4.6", "claude-sonnet-4-6"), ("claude-opus-6", "claude-opus-4-6")):
        with pytest.raises(UnknownModelError, match=near):
            client.messages.create(model=bad, max_tokens=10, messages=history(1))
    assert emu.requests == []
    client.messages.create(model="claude-sonnet-4-6-20261001", max_tokens=10, messages=history(1))
    priced = wrap(anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0), store=None, summarizer=None,
                  pricing={"claude-lab-1": {"input": 3, "output": 15, "context_window": 200_000}})
    mw = next(m for m in priced.middleware if isinstance(m, CompactionMiddleware))
    assert mw.engine.options.prices is not None and mw.engine.options.prices["claude-lab-1"].read == pytest.approx(0.3)
    with pytest.raises(ConfigError, match="input and output"):
        wrap(anthropic.Anthropic(base_url=emu.url, api_key="t"), store=None, pricing={"x": {"in": 1}})


def test_the_claude_code_peer_writes_with_the_1_hour_ttl(emu: Emulator) -> None:
    """Claude Code 2.1 writes every cache entry with the 1-hour TTL (the 2026 logs), and so does its
    peer; cachecompact's default stays with the 5-minute one."""
    for strategy, field in (("claude-code", "ephemeral_1h_input_tokens"),
                            ("cachecompact", "ephemeral_5m_input_tokens")):
        client = wrap(anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0), store=None,
                      strategy=strategy, summarizer=None)
        client.messages.create(model=MODEL, max_tokens=10, system=SYSTEM + strategy,
                               messages=[{"role": "user", "content": "go " * 1500}])
        cc = emu.requests[-1]["usage"]["cache_creation"]
        assert cc[field] > 0 and sum(cc.values()) == cc[field], (strategy, cc)


def test_pricing_applies_to_the_wrapped_client_only(emu: Emulator) -> None:
    """``wrap(pricing=...)`` used to register its entries in the process-wide table, so one
    client's prices changed every other client's (and the emulator's) bill. Now the entry
    prices that client's requests and nothing else."""
    from cachecompact.base.errors import UnknownModelError
    from cachecompact.base.pricing import get_model

    own = wrap(anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0), store=None, summarizer=None,
               pricing={"claude-sonnet-4-6-lab": {"input": 30, "output": 150}})
    other = wrap(anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0), store=None, summarizer=None)
    with pytest.raises(UnknownModelError):
        get_model("claude-sonnet-4-6-lab")  # the process's table is as it was
    with pytest.raises(UnknownModelError, match="claude-sonnet-4-6"):
        other.messages.create(model="claude-sonnet-4-6-lab", max_tokens=10, messages=history(1))
    n = len(emu.requests)
    with pytest.raises(anthropic.NotFoundError):  # priced here, so sent; the emulator does not know the model
        own.messages.create(model="claude-sonnet-4-6-lab", max_tokens=10, messages=history(1))
    assert len(emu.requests) == n  # refused by the emulator's model lookup, before billing
    # a model both know: this client's own entry is what its records are priced with
    dear = wrap(anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0), store=None, summarizer=None,
                pricing={"claude-sonnet-4-6": {"input": 300, "output": 1500}})
    dear.messages.create(model=MODEL, max_tokens=10, messages=history(1))
    [session] = cachecompact.wrapped_sessions(dear)
    billed = emu.requests[-1]["cost_usd"]
    assert session.last_request is not None
    recorded = session.last_request["cost_usd"]
    assert recorded == pytest.approx(100 * billed, rel=1e-6)
    assert get_model(MODEL).input == 3.0


def test_a_tool_result_without_content_is_compacted_not_failed_open(tmp_path: Path, emu: Emulator) -> None:
    """``content`` is optional on a tool result; the repeated-call tracker hashed the unset field
    and failed, so every such request went out uncompacted with a ``failure`` event."""
    events: list[Event] = []
    client = wrap(anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0), store=tmp_path,
                  summarizer=None, on_event=events.append)
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "Touch the files."}]
    for k in range(4):
        client.messages.create(model=MODEL, max_tokens=10, system=SYSTEM, messages=msgs)
        tid = f"toolu_touch_{k}"
        msgs += [{"role": "assistant", "content": [{"type": "tool_use", "id": tid, "name": "touch", "input": {}}]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tid}]}]
    client.messages.create(model=MODEL, max_tokens=10, system=SYSTEM, messages=msgs)
    assert [e.reason for e in events if e.kind == "failure"] == []
    assert _requests(_mw(client).sessions()[0])  # recorded: it went through the engine
