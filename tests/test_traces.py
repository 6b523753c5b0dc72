from __future__ import annotations

import json
from pathlib import Path

import pytest

from cachecompact import Session
from cachecompact.emulator.validation import validate_messages
from cachecompact.traces import TraceFormatError, discover, load_trace, synthetic_trace


def test_every_shared_trace_loads_and_syncs(shared_traces: Path) -> None:
    files = discover([shared_traces])
    assert len(files) >= 40
    for f in files:
        tr = load_trace(f)
        assert tr.messages and tr.messages[0]["role"] == "user"
        assert len(tr.timestamps) == len(tr.messages) == len(tr.usage)
        validate_messages(tr.messages)
        Session.create(None, system=tr.system, tools=tr.tools).sync(tr.messages)


def test_claude_code_loader_merges_and_skips(tmp_path: Path) -> None:
    base = {"sessionId": "s", "isSidechain": False, "timestamp": "2025-07-21T18:16:42.755Z"}
    entries = [
        {**base, "type": "user", "message": {"role": "user", "content": "do it"}},
        {**base, "type": "assistant", "message": {"id": "m1", "role": "assistant", "model": "claude-x",
                                                   "content": [{"type": "text", "text": "ok"}],
                                                   "usage": {"input_tokens": 3}}},
        {**base, "type": "assistant", "message": {"id": "m1", "role": "assistant",
                                                   "content": [{"type": "tool_use", "id": "t1", "name": "Bash",
                                                                "input": {}}],
                                                   "usage": {"input_tokens": 3, "cache_read_input_tokens": 9}}},
        {**base, "type": "assistant", "isSidechain": True, "message": {"id": "side", "role": "assistant",
                                                                        "content": [{"type": "text", "text": "x"}]}},
        {**base, "type": "user", "message": {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": "r1"}]}},
        {**base, "type": "user", "isCompactSummary": True, "message": {
            "role": "user", "content": "This session is being continued from a previous conversation ..."}},
        {**base, "type": "system", "content": "hook ran"},
    ]
    p = tmp_path / "chat.jsonl"
    p.write_text("\n".join(json.dumps(e) for e in entries) + "\n")
    tr = load_trace(p)
    assert [m["role"] for m in tr.messages] == ["user", "assistant", "user"]
    assert [b["type"] for b in tr.messages[1]["content"]] == ["text", "tool_use"]
    assert tr.usage[1] == {"input_tokens": 3, "cache_read_input_tokens": 9}
    assert tr.timestamps[0] == pytest.approx(1753121802.755)
    assert any("compaction" in n for n in tr.notes)
    arr = tmp_path / "chat.json"
    arr.write_text(json.dumps(entries))
    assert load_trace(arr).messages == tr.messages


def test_openai_chat_conversion(tmp_path: Path) -> None:
    data = {"messages": [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "task"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": "{\"command\": \"ls\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "a.py"},
        {"role": "assistant", "content": "done"}]}
    p = tmp_path / "o.json"
    p.write_text(json.dumps(data))
    tr = load_trace(p)
    assert tr.system == "sys" and tr.tools[0]["name"] == "bash"
    assert tr.messages[1]["content"] == [{"type": "tool_use", "id": "call_1", "name": "bash",
                                          "input": {"command": "ls"}}]
    assert tr.messages[2]["content"][0]["tool_use_id"] == "call_1"


@pytest.mark.parametrize(("content", "reason"), [
    ("", "empty file"),
    ('[{"type": "user", "sessionId": "s", "message": {"role": "user", "content": "x"}}', "truncated"),
    ('{"hello": 1}', "unknown trace format"),
    ("\x00\x01garbage", "not JSON"),
])
def test_malformed_traces_name_file_and_reason(tmp_path: Path, content: str, reason: str) -> None:
    p = tmp_path / "bad.json"
    p.write_text(content)
    with pytest.raises(TraceFormatError) as ei:
        load_trace(p)
    assert str(p) in str(ei.value) and reason in str(ei.value)


def test_synthetic_is_deterministic_and_valid() -> None:
    a, b = synthetic_trace(3), synthetic_trace(3)
    assert a.messages == b.messages and a.timestamps == b.timestamps
    assert synthetic_trace(4).messages != a.messages
    validate_messages(a.messages)
    Session.create(None, system=a.system, tools=a.tools).sync(a.messages)


def test_what_the_repair_fixes_still_loads_and_foreign_ids_are_mapped(tmp_path: Path) -> None:
    """Checked after the pairing repair: an empty trailing turn and an orphan result with an id
    the API would refuse are dropped, not fatal; OpenAI ids (``functions.bash:0``) are mapped
    into the API's alphabet on the call and its result alike."""
    a = tmp_path / "a.json"
    a.write_text(json.dumps({"messages": [
        {"role": "user", "content": "go"}, {"role": "assistant", "content": [{"type": "text", "text": "hi"}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "x.y:1", "content": "o"},
                                     {"type": "text", "text": "more"}]},
        {"role": "assistant", "content": []}]}))
    t = load_trace(a)
    assert len(t.messages) == 3 and any("orphan" in n for n in t.notes)
    b = tmp_path / "b.json"
    b.write_text(json.dumps([
        {"role": "system", "content": "sys"}, {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "functions.bash:0", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "functions.bash:0", "content": "a b"},
        {"role": "assistant", "content": "ok"}]))
    t = load_trace(b)
    validate_messages(t.messages)
    assert t.messages[1]["content"][0]["id"] == t.messages[2]["content"][0]["tool_use_id"] == "functions_bash_0"


def test_a_line_holding_two_entries_is_read_as_two(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A log appended to by two writers can hold two entries on one line: both are read, with
    a warning; a line that is not JSON at all is still refused by name."""
    user = {"type": "user", "sessionId": "s", "message": {"role": "user", "content": "hello"}}
    asst = {"type": "assistant", "sessionId": "s", "message": {"role": "assistant", "id": "m1", "content": [
        {"type": "text", "text": "hi"}]}}
    f = tmp_path / "two.jsonl"
    f.write_text(json.dumps(user) + json.dumps(asst) + "\n" + json.dumps({**user, "message": {
        "role": "user", "content": "again"}}) + "\n")
    caplog.set_level("WARNING", logger="cachecompact")
    tr = load_trace(f)
    assert [m["role"] for m in tr.messages] == ["user", "assistant", "user"]
    assert any("holds 2 entries" in r.getMessage() for r in caplog.records)
    f.write_text(json.dumps(user) + "{not json\n" + json.dumps(asst) + "\n")
    with pytest.raises(TraceFormatError, match="line 1: not JSON"):
        load_trace(f)


def test_two_replies_back_to_back_get_a_marked_user_turn_between(tmp_path: Path) -> None:
    from cachecompact.traces._repair import NO_USER_TURN

    entries = [{"type": "user", "sessionId": "s", "message": {"role": "user", "content": "go"}}]
    for k in range(2):
        entries.append({"type": "assistant", "sessionId": "s", "message": {
            "role": "assistant", "id": f"m{k}", "content": [{"type": "text", "text": f"reply {k}"}]}})
    f = tmp_path / "s.jsonl"
    f.write_text("\n".join(json.dumps(e) for e in entries) + "\n")
    tr = load_trace(f)
    assert [m["role"] for m in tr.messages] == ["user", "assistant", "user", "assistant"]
    assert tr.messages[2]["content"] == NO_USER_TURN


def test_an_agent_turn_holding_summary_tags_is_not_taken_for_a_summary_request() -> None:
    """Claude Code's task notifications carry <summary> elements: the emulator's summarizing
    responder answers only a summarizer's ask (empty tags and a JSON schema)."""
    from cachecompact.emulator import ReplayResponder, SummarizingResponder

    msgs = [{"role": "user", "content": "<task-notification><summary>Background task done</summary>"
                                        "</task-notification> please summarize"},
            {"role": "assistant", "content": [{"type": "text", "text": "the recorded reply"}]}]
    r = SummarizingResponder(ReplayResponder(msgs)).respond({"messages": msgs[:1]})
    assert r.content[0]["text"] == "the recorded reply"
    ask = 'Answer with the JSON for {"type": "object", "properties": {"s": {"type": "string"}}} inside ' \
          "<summary></summary> tags."
    r = SummarizingResponder(ReplayResponder(msgs)).respond({"messages": [*msgs, {"role": "user", "content": ask}]})
    assert r.content[0]["text"].startswith("<summary>")
