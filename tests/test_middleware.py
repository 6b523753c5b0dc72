"""The middleware through the real SDK against the emulator: sync, async, streaming, retries
under injected faults, reactive compaction, fail-open, branches, restarts and the monitor."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest

import cachecompact
from cachecompact import LedgerCorruptError, Session
from cachecompact.emulator import CLOCK_HEADER, Emulator, FaultConfig, ReplayResponder, SummarizingResponder
from cachecompact.events import Event
from cachecompact.middleware import CompactionMiddleware, wrap
from cachecompact.monitor import load_records, session_report
from cachecompact.policy import ContextFullError, PolicyConfig
from cachecompact.traces import Trace, synthetic_trace

from .conftest import history

MODEL = "claude-sonnet-4-6"
SYSTEM = "You are a careful agent. " * 120
SMALL = PolicyConfig(window_tokens=40_000, margin_tokens=4_000, min_batch_tokens=1_000)


@pytest.fixture
def emu() -> Iterator[Emulator]:
    with Emulator() as e:
        yield e


def _mw(client: Any) -> CompactionMiddleware:
    mw = client.middleware[-1]
    assert isinstance(mw, CompactionMiddleware)
    return mw


def _turns(trace: Trace) -> Iterator[tuple[float, list[dict[str, Any]], dict[str, Any] | None]]:
    """(time, history to send, recorded next user message) for an agent loop over a trace."""
    msgs = trace.messages
    for i in range(1, len(msgs), 2):
        yield (trace.timestamps[i - 1] or float(i)), msgs[:i], (msgs[i + 1] if i + 1 < len(msgs) else None)


def run_agent(client: Any, trace: Trace, stream: bool = False, max_tokens: int = 2000) -> list[dict[str, Any]]:
    """A plain agent loop: full history each turn; the model's reply comes from the replay."""
    history = [trace.messages[0]]
    for t, _, next_user in _turns(trace):
        kw = dict(model=MODEL, max_tokens=max_tokens, system=trace.system or SYSTEM, tools=trace.tools,
                  messages=history, extra_headers={CLOCK_HEADER: str(t)})
        if stream:
            with client.messages.stream(**kw) as s:
                reply = s.get_final_message()
        else:
            reply = client.messages.create(**kw)
        history = [*history, {"role": "assistant", "content": [b.model_dump(exclude_none=True)
                                                              for b in reply.content]}]
        if next_user is not None:
            history = [*history, next_user]
    return history


async def run_agent_async(client: Any, trace: Trace, stream: bool = False) -> list[dict[str, Any]]:
    history = [trace.messages[0]]
    for t, _, next_user in _turns(trace):
        kw = dict(model=MODEL, max_tokens=2000, system=trace.system or SYSTEM, tools=trace.tools,
                  messages=history, extra_headers={CLOCK_HEADER: str(t)})
        if stream:
            async with client.messages.stream(**kw) as s:
                reply = await s.get_final_message()
        else:
            reply = await client.messages.create(**kw)
        history = [*history, {"role": "assistant", "content": [b.model_dump(exclude_none=True)
                                                              for b in reply.content]}]
        if next_user is not None:
            history = [*history, next_user]
    return history


def _check_session(mw: CompactionMiddleware, history: list[dict[str, Any]]) -> Session:
    sessions = mw.sessions()
    assert len(sessions) == 1
    s = sessions[0]
    # nothing lost, nothing twice: the last reply and tool result were never sent back
    assert s.messages() == history[: len(s)] and len(s) >= len(history) - 2
    seqs = [e.seq for e in s.ledger.entries]
    assert seqs == list(range(len(seqs)))
    if s.path is not None:
        again = Session.open(s.path)  # the store verifies: hashes, chain, replay
        assert again.messages() == s.messages() and len(again.ledger) == len(s.ledger)
    return s


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
def test_sync_client_compacts_and_records(tmp_path: Path, stream: bool) -> None:
    trace = synthetic_trace(3)
    with Emulator(SummarizingResponder(ReplayResponder(trace.messages))) as emu:
        client = wrap(anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0), store_dir=tmp_path,
                      config=SMALL)
        history = run_agent(client, trace, stream=stream)
        sent = [r for r in emu.requests if not r.get("internal")]  # not the summarizer's own calls
    mw = _mw(client)
    s = _check_session(mw, history)
    assert len(s.ledger) > 0  # the small window forced compaction
    assert max(r["total_input_tokens"] for r in sent) <= SMALL.window_tokens
    recs = load_records(s.path)  # type: ignore[arg-type]
    assert len(recs) == len(sent) and all(r.usage.get("output_tokens") for r in recs)
    reads = sum(r["usage"]["cache_read_input_tokens"] for r in sent)
    assert reads / sum(r["total_input_tokens"] for r in sent) > 0.5


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
def test_async_client(tmp_path: Path, stream: bool) -> None:
    trace = synthetic_trace(4)
    with Emulator(SummarizingResponder(ReplayResponder(trace.messages))) as emu:
        client = wrap(anthropic.AsyncAnthropic(base_url=emu.url, api_key="t", max_retries=0), store_dir=tmp_path,
                      config=SMALL)
        history = asyncio.run(run_agent_async(client, trace, stream=stream))
        n = sum(1 for r in emu.requests if not r.get("internal"))
    s = _check_session(_mw(client), history)
    assert len(load_records(s.path)) == n  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", ["sync", "sync-stream", "async", "async-stream"])
def test_retries_under_20_percent_faults_never_duplicate(tmp_path: Path, mode: str) -> None:
    trace = synthetic_trace(6)
    # the same run without faults is the reference
    with Emulator(SummarizingResponder(ReplayResponder(trace.messages))) as emu:
        ref = wrap(anthropic.Anthropic(base_url=emu.url, api_key="t"), store_dir=tmp_path / "ref", config=SMALL)
        run_agent(ref, trace)
    ref_s = _mw(ref).sessions()[0]
    with Emulator(SummarizingResponder(ReplayResponder(trace.messages)), faults=FaultConfig(rate=0.2, seed=11)) as emu:
        kw: dict[str, Any] = dict(base_url=emu.url, api_key="t", max_retries=12)
        stream = mode.endswith("stream")
        if mode.startswith("async"):
            client = wrap(anthropic.AsyncAnthropic(**kw), store_dir=tmp_path / "f", config=SMALL)
            history = asyncio.run(run_agent_async(client, trace, stream=stream))
        else:
            client = wrap(anthropic.Anthropic(**kw), store_dir=tmp_path / "f", config=SMALL)
            history = run_agent(client, trace, stream=stream)
        faults = sum(1 for r in emu.requests if r.get("fault"))
    assert faults > 3
    s = _check_session(_mw(client), history)
    assert [(e.kind, e.start, e.end, e.level) for e in s.ledger.entries] == \
        [(e.kind, e.start, e.end, e.level) for e in ref_s.ledger.entries]


def test_reactive_compaction_on_prompt_too_long(emu: Emulator) -> None:
    events: list[Event] = []
    big = PolicyConfig(window_tokens=2_000_000, margin_tokens=0, tool_share=1.0)  # the policy never sees it coming
    client = wrap(anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0), store_dir=None, config=big,
                  summarizer=None, on_event=events.append)
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
    client = wrap(anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0), store_dir=None,
                  config=PolicyConfig(window_tokens=2_000_000, margin_tokens=0), summarizer=None)
    huge = " ".join(f"t{j}" for j in range(110_000))  # the task itself is over the window
    with pytest.raises(ContextFullError, match="start a new session"):
        client.messages.create(model="claude-haiku-4-5", max_tokens=10, messages=[{"role": "user", "content": huge}])


def test_fail_open_sends_the_original_request(emu: Emulator, caplog: pytest.LogCaptureFixture) -> None:
    events: list[Event] = []
    client = wrap(anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0), store_dir=None,
                  summarizer=None, on_event=events.append)
    mw = _mw(client)

    def boom(*a: Any, **k: Any) -> Any:
        raise RuntimeError("bug in a level")

    client.messages.create(model=MODEL, max_tokens=10, messages=history(1))
    assert len(mw.sessions()) == 1
    live = next(iter(mw._live.values()))
    live.strategy.before_request = boom  # type: ignore[method-assign]
    with caplog.at_level(logging.ERROR, logger="cachecompact"):
        out = client.messages.create(model=MODEL, max_tokens=10, messages=history(2))
    assert out.content and any(e.kind == "failure" and "bug in a level" in e.reason for e in events)
    assert emu.requests[-1]["n_messages"] == len(history(2))


def test_other_endpoints_pass_through(emu: Emulator) -> None:
    client = wrap(anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0), store_dir=None, summarizer=None)
    assert client.messages.count_tokens(model=MODEL, messages=history(1)).input_tokens > 0
    with pytest.raises(anthropic.NotFoundError):
        client.models.list()
    assert _mw(client).sessions() == []


def test_rewritten_history_starts_a_branch(tmp_path: Path, emu: Emulator, caplog: pytest.LogCaptureFixture) -> None:
    client = wrap(anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0), store_dir=tmp_path,
                  summarizer=None)
    client.messages.create(model=MODEL, max_tokens=10, system=SYSTEM, messages=history(4))
    first_dir = _mw(client).sessions()[0].path
    assert first_dir is not None
    before = (first_dir / "transcript.jsonl").read_bytes()
    edited = history(5)
    edited[3]["content"][0]["text"] = "a different step"
    with caplog.at_level(logging.WARNING, logger="cachecompact"):
        client.messages.create(model=MODEL, max_tokens=10, system=SYSTEM, messages=edited)
    assert "starting branch session" in caplog.text and "message 3 differs" in caplog.text
    assert (first_dir / "transcript.jsonl").read_bytes() == before
    branch = Path(str(first_dir) + ".b1")
    assert Session.open(branch).messages() == edited


def test_restart_continues_and_corrupt_store_names_the_file(tmp_path: Path, emu: Emulator) -> None:
    def fresh() -> Any:
        return wrap(anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0), store_dir=tmp_path,
                    summarizer=None)

    fresh().messages.create(model=MODEL, max_tokens=10, system=SYSTEM, messages=history(3))
    again = fresh()
    again.messages.create(model=MODEL, max_tokens=10, system=SYSTEM, messages=history(5))
    s = _mw(again).sessions()[0]
    assert len(s) == len(history(5)) and s.path is not None
    lines = (s.path / "transcript.jsonl").read_bytes().split(b"\n")
    lines[1] = lines[1].replace(b"step 0", b"STEP 0")
    (s.path / "transcript.jsonl").write_bytes(b"\n".join(lines))
    with pytest.raises(LedgerCorruptError, match=r"transcript\.jsonl:2"):
        fresh().messages.create(model=MODEL, max_tokens=10, system=SYSTEM, messages=history(6))


def test_monitor_flags_an_unexplained_system_change_and_keeps_diagnostics(tmp_path: Path, emu: Emulator) -> None:
    breaks: list[Event] = []
    client = wrap(anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0), store_dir=tmp_path,
                  summarizer=None, diagnostics=True,
                  on_event=lambda e: breaks.append(e) if e.kind == "cache_break" else None)
    for n in range(1, 6):
        client.messages.create(model=MODEL, max_tokens=10, system=SYSTEM + "Date: 2026-11-30", messages=history(n),
                               extra_headers={CLOCK_HEADER: str(100 + n)})
    client.messages.create(model=MODEL, max_tokens=10, system=SYSTEM + "Date: 2026-12-01", messages=history(6),
                           extra_headers={CLOCK_HEADER: "107"})
    assert len(breaks) == 1
    ev = breaks[0]
    assert ev.detail["divergence"] == "system[0]" and ev.detail["explained_by"] is None
    assert "NOT explained" in ev.reason
    sessions = _mw(client).sessions()
    assert len(sessions) == 2  # the changed system prompt is a new immutable prefix
    recs = load_records(sessions[0].path)  # type: ignore[arg-type]
    assert recs[-1].hit_rate > 0.5 and recs[0].cache_miss_reason is None
    report = session_report(sessions[1].path, plot=tmp_path / "p.png")  # type: ignore[arg-type]
    assert "BREAK at system[0]" in report and (tmp_path / "p.png").stat().st_size > 1000
    from cachecompact.cli import main

    assert main(["report", str(sessions[0].path)]) == 0


def test_events_become_opentelemetry_span_events(emu: Emulator) -> None:
    otel = pytest.importorskip("opentelemetry.sdk.trace")
    from opentelemetry import trace
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = otel.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)  # the SDK's own per-call spans use the global provider
    tracer = provider.get_tracer("test")
    client = wrap(anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0), store_dir=None, summarizer=None,
                  config=PolicyConfig(window_tokens=20_000, margin_tokens=2_000, min_batch_tokens=0))
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


def test_wrap_refuses_bad_config() -> None:
    with pytest.raises(ValueError):
        CompactionMiddleware(session_id="../etc")
    with pytest.raises(cachecompact.CacheCompactError):
        wrap(anthropic.Anthropic(api_key="t"), summarizer="magic")
    assert json.loads(json.dumps({"ok": True}))


def test_example_agent_loop_prints_the_cache_report() -> None:
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, str(root / "examples" / "replay_agent.py"), "--window", "60000"],
                         capture_output=True, text=True, timeout=300, check=True)
    assert "through a wrapped client" in out.stdout and "overall hit rate" in out.stdout
