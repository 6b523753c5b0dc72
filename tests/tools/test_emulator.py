"""The emulator through the real anthropic SDK: each billing rule, JSON and streaming alike."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import pytest

from cachecompact.tools.emulator import CLOCK_HEADER, Emulator, FaultConfig, ReplayResponder, Reply, ScriptedResponder
from cachecompact.tools.traces import discover, load_trace, synthetic_trace

from ..conftest import API_VERSION

MODEL = "claude-sonnet-4-6"
CC = {"type": "ephemeral"}
CC1H = {"type": "ephemeral", "ttl": "1h"}


@pytest.fixture
def emu() -> Iterator[Emulator]:
    with Emulator() as e:
        yield e


@pytest.fixture
def client(emu: Emulator) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=emu.url, api_key="test", max_retries=0)


def para(i: int, words: int = 120) -> str:
    return " ".join(f"w{i}x{j}" for j in range(words))


def blocks(n: int, bps: dict[int, dict[str, str]]) -> list[dict[str, Any]]:
    """n text blocks numbered 1..n with cache_control at the given numbers."""
    return [{"type": "text", "text": para(i), **({"cache_control": bps[i]} if i in bps else {})}
            for i in range(1, n + 1)]


def call(client: anthropic.Anthropic, stream: bool, t: float, **body: Any) -> Any:
    """One request at simulated time t; returns the usage, by JSON or by SSE."""
    body.setdefault("model", MODEL)
    body.setdefault("max_tokens", 64)
    headers = {CLOCK_HEADER: str(t)}
    if stream:
        with client.messages.stream(**body, extra_headers=headers) as s:
            return s.get_final_message().usage
    return client.messages.create(**body, extra_headers=headers).usage


def total(u: Any) -> int:
    return int(u.input_tokens + (u.cache_read_input_tokens or 0) + (u.cache_creation_input_tokens or 0))


modes = pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])


@modes
def test_lookback_example_through_the_sdk(client: anthropic.Anthropic, stream: bool) -> None:
    u1 = call(client, stream, 0, messages=[{"role": "user", "content": blocks(10, {10: CC})}])
    assert u1.cache_creation_input_tokens == total(u1) - u1.input_tokens > 0
    u2 = call(client, stream, 10, messages=[{"role": "user", "content": blocks(15, {15: CC})}])
    assert u2.cache_read_input_tokens == u1.cache_creation_input_tokens
    u3 = call(client, stream, 20, messages=[{"role": "user", "content": blocks(35, {35: CC})}])
    assert u3.cache_read_input_tokens == 0  # @15 is one position outside the 20-position window
    # the same three turns on a fresh cache (another model), with a second breakpoint @15 in turn 3
    other = "claude-opus-4-8"
    call(client, stream, 100, model=other, messages=[{"role": "user", "content": blocks(10, {10: CC})}])
    v2 = call(client, stream, 110, model=other, messages=[{"role": "user", "content": blocks(15, {15: CC})}])
    v3 = call(client, stream, 120, model=other, messages=[{"role": "user", "content": blocks(35, {15: CC, 35: CC})}])
    assert v3.cache_read_input_tokens == v2.cache_read_input_tokens + v2.cache_creation_input_tokens


@modes
def test_five_breakpoints_is_a_400(client: anthropic.Anthropic, stream: bool) -> None:
    with pytest.raises(anthropic.BadRequestError, match="A maximum of 4 blocks with cache_control"):
        call(client, stream, 0, messages=[{"role": "user", "content": blocks(6, {k: CC for k in range(1, 6)})}])


@modes
def test_below_minimum_nothing_is_cached(client: anthropic.Anthropic, stream: bool) -> None:
    for t in (0, 1):
        u = call(client, stream, t, messages=[{"role": "user", "content": blocks(2, {2: CC})}])
        assert (u.cache_creation_input_tokens, u.cache_read_input_tokens) == (0, 0) and u.input_tokens > 0


@modes
def test_ttl_from_request_start_via_clock_header(client: anthropic.Anthropic, stream: bool) -> None:
    msgs = [{"role": "user", "content": blocks(10, {10: CC})}]
    call(client, stream, 1000, messages=msgs)
    assert call(client, stream, 1299, messages=msgs).cache_read_input_tokens > 0
    assert call(client, stream, 1299 + 301, messages=msgs).cache_read_input_tokens == 0


@modes
def test_mixed_ttl_and_1h_survives(client: anthropic.Anthropic, stream: bool) -> None:
    system = [{"type": "text", "text": para(0, 800), "cache_control": CC1H}]
    msgs = [{"role": "user", "content": blocks(6, {6: CC})}]
    u1 = call(client, stream, 0, system=system, messages=msgs)
    assert u1.cache_creation.ephemeral_1h_input_tokens > 0 and u1.cache_creation.ephemeral_5m_input_tokens > 0
    u2 = call(client, stream, 900, system=system, messages=msgs)  # 15 min: only the 1h entry lives
    assert u2.cache_read_input_tokens == u1.cache_creation.ephemeral_1h_input_tokens
    assert u2.cache_creation.ephemeral_5m_input_tokens == u1.cache_creation.ephemeral_5m_input_tokens


@modes
def test_automatic_top_level_cache_control(client: anthropic.Anthropic, stream: bool) -> None:
    msgs = [{"role": "user", "content": blocks(10, {})}]
    u1 = call(client, stream, 0, messages=msgs, cache_control=CC)
    assert u1.cache_creation_input_tokens > 0
    assert call(client, stream, 1, messages=msgs, cache_control=CC).cache_read_input_tokens == total(u1)


@modes
def test_tool_choice_invalidates_messages_only_and_models_are_separate(client: anthropic.Anthropic,
                                                                      stream: bool) -> None:
    tools = [{"name": "bash", "description": para(1, 700), "input_schema": {"type": "object"},
              "cache_control": CC}]
    msgs = [{"role": "user", "content": blocks(10, {10: CC})}]
    u1 = call(client, stream, 0, tools=tools, messages=msgs)
    u2 = call(client, stream, 1, tools=tools, messages=msgs, tool_choice={"type": "any"})
    assert 0 < u2.cache_read_input_tokens < total(u1)  # the tools level still hits
    u3 = call(client, stream, 2, tools=tools, messages=msgs, model="claude-opus-4-8")
    assert u3.cache_read_input_tokens == 0


def test_prompt_too_long_is_the_apis_400(client: anthropic.Anthropic) -> None:
    huge = " ".join(f"t{j}" for j in range(110_000))  # ~220k tokens: over Haiku 4.5's 200k window
    with pytest.raises(anthropic.BadRequestError) as ei:
        client.messages.create(model="claude-haiku-4-5", max_tokens=10, messages=[{"role": "user", "content": huge}])
    assert ei.value.status_code == 400
    msg = ei.value.body["error"]["message"]  # type: ignore[index]
    assert msg.startswith("prompt is too long: ") and msg.endswith(" tokens > 200000 maximum")


def test_count_tokens_and_unknown_model(client: anthropic.Anthropic) -> None:
    n = client.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": para(1)}]).input_tokens
    u = client.messages.create(model=MODEL, max_tokens=5, messages=[{"role": "user", "content": para(1)}]).usage
    assert n == total(u)
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="gpt-4", max_tokens=5, messages=[{"role": "user", "content": "x"}])


@modes
def test_diagnostics_reasons(client: anthropic.Anthropic, stream: bool) -> None:
    def go(prev: str | None, t: float, **body: Any) -> tuple[str, Any]:
        body.setdefault("model", MODEL)
        body.setdefault("system", "sys")
        body.setdefault("max_tokens", 64)
        if stream:
            with client.messages.stream(diagnostics={"previous_message_id": prev},
                                        extra_headers={CLOCK_HEADER: str(t)}, **body) as s:
                m = s.get_final_message()
        else:
            m = client.messages.create(diagnostics={"previous_message_id": prev},
                                       extra_headers={CLOCK_HEADER: str(t)}, **body)
        return m.id, m.diagnostics

    h = [{"role": "user", "content": "hello"}]
    first, d = go(None, 0, messages=h)
    assert d is None
    reply = client.messages.create(model=MODEL, max_tokens=64, system="sys", messages=h).content
    grown = [*h, {"role": "assistant", "content": [b.model_dump() for b in reply]}, {"role": "user", "content": "more"}]
    _, d = go(first, 1, messages=grown)
    assert d is None  # appended: no divergence
    _, d = go(first, 2, messages=[{"role": "user", "content": "HELLO"}])
    assert d.cache_miss_reason.type == "messages_changed" and d.cache_miss_reason.cache_missed_input_tokens > 0
    _, d = go(first, 3, messages=h, system="other sys")
    assert d.cache_miss_reason.type == "system_changed"
    _, d = go(first, 4, messages=h, model="claude-opus-4-8")
    assert d.cache_miss_reason.type == "model_changed"
    _, d = go(first, 5, messages=h, tools=[{"name": "x", "input_schema": {"type": "object"}}])
    assert d.cache_miss_reason.type == "tools_changed"
    _, d = go(first, 6, messages=h, max_tokens=2048,
                  thinking={"type": "enabled", "budget_tokens": 1024})
    assert d.cache_miss_reason.type == "unavailable"
    _, d = go("msg_nope", 7, messages=h)
    assert d.cache_miss_reason.type == "previous_message_not_found"


def test_faults_are_injected_and_retried_by_the_sdk() -> None:
    with Emulator(faults=FaultConfig(rate=1.0, statuses=(529,), seed=1)) as emu:
        c = anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0)
        with pytest.raises(anthropic.APIStatusError) as ei:
            c.messages.create(model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "x"}])
        assert ei.value.status_code == 529
    with Emulator(faults=FaultConfig(rate=0.5, seed=7)) as emu:
        c = anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=10)
        for i in range(10):
            c.messages.create(model=MODEL, max_tokens=5, messages=[{"role": "user", "content": f"x{i}"}])
        faults = [r for r in emu.requests if r.get("fault")]
        assert faults and {r["status"] for r in faults} <= {429, 529, 500}
        assert sum(1 for r in emu.requests if r.get("status") == 200) == 10


def test_bad_input_gets_400s_never_500s(emu: Emulator) -> None:
    bodies: list[bytes] = [
        b"{not json", b"[]", b"null", json.dumps({"model": MODEL, "messages": []}).encode(),
        json.dumps({"model": MODEL, "max_tokens": 5}).encode(),
        json.dumps({"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": ""}]}).encode(),
        json.dumps({"model": MODEL, "max_tokens": 5, "messages": [
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "x", "content": "r"}]}]}).encode(),
        json.dumps({"model": MODEL, "max_tokens": 5, "messages": [
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "b", "input": {}}]},
            {"role": "user", "content": "no result"}]}).encode(),
        json.dumps({"model": MODEL, "max_tokens": "5", "messages": [{"role": "user", "content": "a"}]}).encode(),
        json.dumps({"model": MODEL, "max_tokens": 5,
                    "system": [{"type": "text", "text": "a", "cache_control": {"type": "ephemeral", "ttl": "5m"}}],
                    "messages": [{"role": "user", "content": [
                        {"type": "text", "text": "b", "cache_control": CC1H}]}]}).encode(),
    ]
    with httpx2.Client(base_url=emu.url, headers=API_VERSION) as http:
        for raw in bodies:
            r = http.post("/v1/messages", content=raw, headers={"content-type": "application/json"})
            assert r.status_code == 400, (raw, r.text)
            assert r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error"
        assert http.post("/v1/nope", content=b"{}").status_code == 404
        assert http.post("/v1/models", content=b"{}").status_code == 405
        assert http.get("/v1/messages").status_code == 405
        r = http.post("/v1/messages", content=b'{"model":"claude-sonnet-4-6","max_tokens":1,"messages":'
                      b'[{"role":"user","content":"x"}]}', headers={CLOCK_HEADER: "yesterday"})
        assert r.status_code == 400 and CLOCK_HEADER in r.text


def test_request_log_is_jsonl(tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    with Emulator(log=log) as emu:
        c = anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0)
        c.messages.create(model=MODEL, max_tokens=5, messages=[{"role": "user", "content": blocks(8, {8: CC})}])
        # issue 62: a refused request has its line too (the docs: every request appends one)
        with pytest.raises(anthropic.BadRequestError):
            c.messages.create(model=MODEL, max_tokens=5, messages=[])
        with pytest.raises(anthropic.NotFoundError):
            c.messages.create(model="claude-nonesuch-9", max_tokens=5, messages=[{"role": "user", "content": "x"}])
        billed = len(emu.requests)
    rec, bad, unknown = (json.loads(line) for line in log.read_text().splitlines())
    assert rec["usage"]["cache_creation_input_tokens"] > 0 and rec["cost_usd"] > 0 and len(rec["prefix_hashes"]) == 1
    assert bad["status"] == 400 and bad["error"]["type"] == "invalid_request_error" and bad["path"] == "/v1/messages"
    assert "at least one message" in bad["error"]["message"] and bad["request_id"].startswith("req_")
    assert unknown["status"] == 404 and "claude-nonesuch-9" in unknown["error"]["message"]
    assert billed == 1  # `emu.requests` keeps what was billed


def test_scripted_responder_tool_use_and_pre_warm(client: anthropic.Anthropic) -> None:
    with Emulator(ScriptedResponder([{"content": [{"type": "tool_use", "id": "toolu_a", "name": "bash",
                                                     "input": {"command": "ls"}}]}, "done"])) as emu:
        c = anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0)
        m = c.messages.create(model=MODEL, max_tokens=50, messages=[{"role": "user", "content": "go"}])
        assert m.stop_reason == "tool_use" and m.content[0].input == {"command": "ls"}
        with c.messages.stream(model=MODEL, max_tokens=50, messages=[{"role": "user", "content": "go"}]) as s:
            assert s.get_final_message().content[0].text == "done"
        warm = c.messages.create(model=MODEL, max_tokens=0, messages=[{"role": "user", "content": "go"}])
        assert warm.content == [] and warm.stop_reason == "max_tokens" and warm.usage.output_tokens == 0


def test_summarizer_fills_a_forced_tool_schema(client: anthropic.Anthropic) -> None:
    schema = {"type": "object", "required": ["task_goal", "open_issues"], "properties": {
        "task_goal": {"type": "string"}, "completed_steps": {"type": "array", "items": {"type": "string"}},
        "key_findings": {"type": "array", "items": {"type": "string"}},
        "open_issues": {"type": "array", "items": {"type": "string"}},
        "file_refs": {"type": "array", "items": {"type": "object"}}}}
    m = client.messages.create(
        model=MODEL, max_tokens=2000, tools=[{"name": "emit_summary", "input_schema": schema}],
        tool_choice={"type": "tool", "name": "emit_summary"},
        messages=[{"role": "user", "content": "Fix the crash in src/app/main.py"},
                  {"role": "assistant", "content": "Looking at src/app/main.py now."},
                  {"role": "user", "content": "Tests still failing: ImportError in tests/test_main.py"}])
    args = m.content[0].input
    assert args["task_goal"] == "Fix the crash in src/app/main.py"
    assert any("ImportError" in x for x in args["open_issues"])
    assert {"path": "src/app/main.py", "relevance": "mentioned"} in args["file_refs"]


def _replay(trace: Any, client: anthropic.Anthropic) -> list[dict[str, Any]]:
    """A real agent loop: send the history, append the reply, append the recorded tool results."""
    msgs = trace.messages
    history = [msgs[0]]
    i = 1
    while i < len(msgs):
        t = trace.timestamps[i] or 0.0
        reply = client.messages.create(model=MODEL, max_tokens=8000, system=trace.system or anthropic.omit,
                                       tools=trace.tools or anthropic.omit, messages=history,
                                       extra_headers={CLOCK_HEADER: str(t)}, cache_control=CC)
        history.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]})
        i += 1
        if i < len(msgs):
            history.append(msgs[i])
            i += 1
    return history


def test_a_real_trace_replays_end_to_end(shared_traces: Path) -> None:
    files = sorted(discover([shared_traces / "mini-swe-agent"]), key=lambda p: p.stat().st_size)
    trace = load_trace(files[0])
    with Emulator(ReplayResponder(trace.messages)) as emu:
        client = anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0)
        history = _replay(trace, client)
    assert len(history) == len(trace.messages)
    for got, want in zip(history, trace.messages, strict=True):
        if want["role"] == "assistant":
            assert [b["type"] for b in got["content"]] == [b["type"] for b in want["content"]]
    reads = [r["usage"]["cache_read_input_tokens"] for r in emu.requests]
    assert sum(reads[1:]) > 0 and len(emu.requests) == trace.turns


def test_a_replayed_turn_that_thinks_starts_with_its_thinking() -> None:
    """A 2026 Claude Code log keeps a whitespace-only text block before a turn's thinking; the API
    never answers so, and when that turn came back as the tool loop's last assistant message the
    emulator refused it as the API would ("a final `assistant` message must start with a thinking
    block"): `cachecompact bench` lost the session at 50k. Replayed, the turn starts with its
    thinking and the loop goes on."""
    turn = {"role": "assistant", "content": [
        {"type": "text", "text": "\n\n"}, {"type": "thinking", "thinking": "Read the file first.", "signature": "x"},
        {"type": "text", "text": "Reading it."},
        {"type": "tool_use", "id": "toolu_r1", "name": "read_file", "input": {"path": "a.py"}}]}
    messages = [{"role": "user", "content": "fix a.py"}, turn,
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_r1", "content": "x = 1"}]},
                {"role": "assistant", "content": [{"type": "text", "text": "done"}]}]
    tools = [{"name": "read_file", "description": "Read a file.",
              "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}]
    with Emulator(ReplayResponder(messages)) as emu:
        client = anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0)
        think: Any = {"type": "enabled", "budget_tokens": 1_024}
        first = client.messages.create(model="claude-opus-4-6", max_tokens=4_096, thinking=think, tools=tools,
                                       messages=messages[:1])
        assert [b.type for b in first.content] == ["thinking", "text", "tool_use"]
        again = client.messages.create(model="claude-opus-4-6", max_tokens=4_096, thinking=think, tools=tools,
                                       messages=[messages[0], {"role": "assistant", "content": first.content},
                                                 messages[2]])
    assert [b.type for b in again.content] == ["text"]


def test_synthetic_trace_replays_without_shared_folder() -> None:
    trace = synthetic_trace(2)
    with Emulator(ReplayResponder(trace.messages)) as emu:
        client = anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0)
        history = _replay(trace, client)
    assert len(history) == len(trace.messages)
    hit = [r["usage"]["cache_read_input_tokens"] / r["total_input_tokens"] for r in emu.requests[1:]]
    assert sum(hit) / len(hit) > 0.5  # automatic caching keeps most of each request warm


def test_a_scripted_function_may_return_a_string_a_dict_or_a_reply() -> None:
    """As the README shows: the function's reply takes the same forms as a script item."""
    def model(body: dict[str, Any]) -> Any:
        n = len(body["messages"])
        if n == 1:
            return {"content": [{"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "a.py"}}]}
        return "done" if n == 3 else Reply([{"type": "text", "text": "again"}])

    with Emulator(ScriptedResponder(model)) as emu:
        c = anthropic.Anthropic(base_url=emu.url, api_key="test", max_retries=0)
        tools = [{"name": "read_file", "input_schema": {"type": "object"}}]
        history: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
        first = c.messages.create(model="claude-sonnet-4-6", max_tokens=64, tools=tools, messages=history)
        assert first.stop_reason == "tool_use" and first.content[0].type == "tool_use"
        history += [{"role": "assistant", "content": [b.model_dump() for b in first.content]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "x"}]}]
        second = c.messages.create(model="claude-sonnet-4-6", max_tokens=64, tools=tools, messages=history)
        assert second.stop_reason == "end_turn" and second.content[0].text == "done"
    with pytest.raises(TypeError, match="a scripted reply must be a Reply, a str or a dict, not int"):
        ScriptedResponder(lambda body: 7).respond({"messages": []})


def test_a_bare_function_is_a_responder_and_anything_else_is_refused_at_once() -> None:
    """The README's ``Emulator(lambda body: "hi")``: a function of the request body answers (it
    was accepted, then every request got a 500); an object that is neither is a TypeError."""
    with Emulator(lambda body: f"hi ({len(body['messages'])})") as emu:
        c = anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0)
        r = c.messages.create(model="claude-sonnet-4-6", max_tokens=20, messages=[{"role": "user", "content": "x"}])
    assert r.content[0].text == "hi (1)"  # type: ignore[union-attr]
    with pytest.raises(TypeError, match="respond"):
        Emulator(42)  # type: ignore[arg-type]
