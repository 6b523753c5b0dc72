from __future__ import annotations

import json
from pathlib import Path

import pytest

from cachecompact import Session
from cachecompact.tools.emulator.validation import validate_messages
from cachecompact.tools.traces import TraceFormatError, discover, load_trace, synthetic_trace


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
    from cachecompact.tools.traces._repair import NO_USER_TURN

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
    from cachecompact.tools.emulator import ReplayResponder, SummarizingResponder

    msgs = [{"role": "user", "content": "<task-notification><summary>Background task done</summary>"
                                        "</task-notification> please summarize"},
            {"role": "assistant", "content": [{"type": "text", "text": "the recorded reply"}]}]
    r = SummarizingResponder(ReplayResponder(msgs)).respond({"messages": msgs[:1]})
    assert r.content[0]["text"] == "the recorded reply"
    ask = 'Answer with the JSON for {"type": "object", "properties": {"s": {"type": "string"}}} inside ' \
          "<summary></summary> tags."
    r = SummarizingResponder(ReplayResponder(msgs)).respond({"messages": [*msgs, {"role": "user", "content": ask}]})
    assert r.content[0]["text"].startswith("<summary>")


def _cc_log(path: Path, entries: list[dict[str, object]]) -> Path:
    path.write_text("\n".join(json.dumps({"sessionId": "s", "timestamp": "2026-02-09T06:42:00Z", **e})
                              for e in entries) + "\n")
    return path


def _asst(mid: str, blocks: list[dict[str, object]], **usage: int) -> dict[str, object]:
    return {"type": "assistant", "message": {"role": "assistant", "id": mid, "model": "claude-opus-4-6",
                                             "content": blocks, "usage": {"input_tokens": 3, **usage}}}


def _results(*ids: str) -> dict[str, object]:
    return {"type": "user", "message": {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": i, "content": f"out {i}"} for i in ids]}}


def _call(tid: str) -> dict[str, object]:
    return {"type": "tool_use", "id": tid, "name": "Read", "input": {"file_path": tid}}


def test_parallel_tool_calls_logged_with_results_between_are_one_call(tmp_path: Path) -> None:
    """Claude Code 2.1 logs a response with two tool calls as call, result, call, result under
    one message id: that is one API call, and the API saw both calls, then both results."""
    log = _cc_log(tmp_path / "p.jsonl", [
        {"type": "user", "message": {"role": "user", "content": "read both"}},
        _asst("m1", [_call("a")], cache_read_input_tokens=10), _results("a"),
        _asst("m1", [_call("b")], cache_read_input_tokens=10), _results("b"),
        _asst("m2", [{"type": "text", "text": "done"}]),
    ])
    tr = load_trace(log)
    assert tr.turns == 2
    assert [b["id"] for b in tr.messages[1]["content"]] == ["a", "b"]
    assert [b["tool_use_id"] for b in tr.messages[2]["content"]] == ["a", "b"]
    validate_messages(tr.messages)
    # a person speaking between two entries of the same id ends the response
    log = _cc_log(tmp_path / "q.jsonl", [
        {"type": "user", "message": {"role": "user", "content": "go"}},
        _asst("m1", [{"type": "text", "text": "one"}]),
        {"type": "user", "message": {"role": "user", "content": "and?"}},
        _asst("m1", [{"type": "text", "text": "two"}]),
    ])
    assert load_trace(log).turns == 2


def test_sub_agents_in_progress_entries_are_threads_of_their_own(tmp_path: Path) -> None:
    """A 2.1 sub-agent's calls come nested in ``progress`` entries; they are loaded as their
    own conversation, count in the recorded usage, and stay out of the main chain."""
    def progress(inner: dict[str, object]) -> dict[str, object]:
        return {"type": "progress", "parentToolUseID": "t0", "data": {
            "type": "agent_progress", "agentId": "a81", "prompt": "look", "message": {
                **inner, "timestamp": "2026-02-09T06:42:05Z"}}}
    log = _cc_log(tmp_path / "sub.jsonl", [
        {"type": "user", "message": {"role": "user", "content": "find it"}},
        _asst("m1", [{"type": "tool_use", "id": "t0", "name": "Task", "input": {"prompt": "look"}}]),
        progress({"type": "user", "message": {"role": "user", "content": [{"type": "text", "text": "look"}]}}),
        progress(_asst("s1", [_call("x")], cache_creation_input_tokens=24_090)),
        progress(_results("x")),
        progress(_asst("s2", [{"type": "text", "text": "found"}], cache_read_input_tokens=24_090)),
        {"type": "progress", "data": {"type": "bash_progress", "output": "..."}},
        _results("t0"),
        _asst("m2", [{"type": "text", "text": "it is there"}]),
    ])
    tr = load_trace(log)
    assert tr.turns == 2 and len(tr.subagents) == 1
    sub = tr.subagents[0]
    assert sub.name.endswith(".agent-a81") and sub.turns == 2
    validate_messages(sub.messages)
    assert len(tr.recorded_usage()) == 4
    assert sum(int(u.get("cache_read_input_tokens") or 0) for _, u in tr.recorded_usage()) == 24_090


def test_compact_and_microcompact_boundaries_are_understood(tmp_path: Path) -> None:
    """``compact_boundary`` marks where Claude Code compacted; ``microcompact_boundary`` where it
    cleared old results. The replay keeps the whole conversation and records both; the billing
    view (keep_compaction) shows what was sent: the cleared results after a microcompact."""
    from cachecompact.tools.traces.claude_code_logs import CLEARED, load_claude_code

    log = _cc_log(tmp_path / "c.jsonl", [
        {"type": "user", "message": {"role": "user", "content": "work"}},
        _asst("m1", [_call("a")]), _results("a"),
        _asst("m2", [_call("b")]), _results("b"),
        {"type": "system", "subtype": "microcompact_boundary", "content": "cleared",
         "microcompactMetadata": {"trigger": "auto", "compactedToolIds": ["a"], "tokensSaved": 900}},
        _asst("m3", [{"type": "text", "text": "next"}]),
        {"type": "user", "message": {"role": "user", "content": "more"}},
        {"type": "system", "subtype": "compact_boundary", "content": "Conversation compacted",
         "compactMetadata": {"trigger": "auto", "preTokens": 167_370}},
        {"type": "user", "isCompactSummary": True, "message": {
            "role": "user", "content": "This session is being continued from a previous conversation ..."}},
        _asst("m4", [{"type": "text", "text": "resumed"}]),
    ])
    tr = load_trace(log)
    assert [b["kind"] for b in tr.boundaries] == ["microcompact", "compact"]
    assert tr.boundaries[0]["tool_ids"] == ["a"] and tr.boundaries[0]["tokens_saved"] == 900
    assert tr.boundaries[1]["pre_tokens"] == 167_370 and tr.boundaries[1]["trigger"] == "auto"
    assert tr.turns == 4 and CLEARED not in json.dumps(tr.messages)  # the replay has every result
    assert tr.compactions == [b["index"] for b in tr.boundaries]
    sent = load_claude_code(log, keep_compaction=True)
    seg = sent.compactions[0]
    assert json.dumps(sent.messages[:seg]).count(CLEARED) == 0
    after = json.dumps(sent.messages[seg:])
    assert CLEARED in after and "out b" in after and "out a" not in after
    validate_messages(sent.messages[seg:sent.compactions[1]])


def _at(ts: str, e: dict[str, object], uid: str | None = None) -> dict[str, object]:
    return {**e, "timestamp": ts, **({"uuid": uid} if uid else {})}


def test_the_compact_metadata_of_claude_code_2_1_3xx_is_read(tmp_path: Path) -> None:
    """A 2.1.3xx compact boundary carries more than ``trigger`` and ``preTokens``. No licensed log
    in ../shared shows one, so this fixture is written from the field list in the facts' 2026-12-02
    addendum (on disk camelCase); a boundary without the new fields reads them as None."""
    log = _cc_log(tmp_path / "m.jsonl", [
        {"type": "user", "message": {"role": "user", "content": "work"}},
        _asst("m1", [{"type": "text", "text": "done"}]),
        {"type": "user", "message": {"role": "user", "content": "more"}},
        {"type": "system", "subtype": "compact_boundary", "content": "Conversation compacted",
         "compactMetadata": {"trigger": "auto", "preTokens": 212_000, "postTokens": 19_400, "precomputed": True,
                             "cumulativeDroppedTokens": 190_100, "durationMs": 8_200, "messagesSummarized": 2,
                             "preservedMessages": {"anchorUuid": "u3", "uuids": ["u3"], "allUuids": ["u3"]}}},
        {"type": "user", "isCompactSummary": True, "message": {
            "role": "user", "content": "This session is being continued from a previous conversation ..."}},
        _asst("m2", [{"type": "text", "text": "resumed"}]),
        {"type": "system", "subtype": "compact_boundary", "compactMetadata": {"trigger": "manual", "preTokens": 30}},
    ])
    b, old = load_trace(log).boundaries
    assert (b["pre_tokens"], b["post_tokens"], b["dropped_tokens"], b["duration_ms"]) == (212_000, 19_400, 190_100,
                                                                                          8_200)
    assert b["precomputed"] is True and b["preserved"] == 1 and b["messages_summarized"] == 2 and not b["idle"]
    assert old["post_tokens"] is None and old["precomputed"] is None and old["trigger"] == "manual"


@pytest.mark.parametrize(("trigger", "boundary_at", "idle"), [
    ("idle", "10:20:00", True),  # its trigger says so
    ("auto", "10:55:30", True),  # about 55 minutes into a quiet spell no person ended
    ("auto", "10:20:00", False),  # 20 minutes: not Claude Code's idle schedule
    ("manual", "10:55:30", False),  # the person typed /compact
    ("auto", "tool", False),  # 55 minutes into a tool run: not a wait for a person
])
def test_an_idle_compaction_is_told_from_one_at_a_persons_return(tmp_path: Path, trigger: str, boundary_at: str,
                                                                 idle: bool) -> None:
    """Claude Code 2.1.286+ compacts a session about 55 minutes after the last reply. The trigger's
    spelling for it is not in any stored source, so the schedule tells it too; forensics then says
    "idle compaction" for the re-write after it (the class stays ``client_compaction``)."""
    from cachecompact.tools.traces.claude_code_logs import load_claude_code

    tool_run = boundary_at == "tool"  # the reply calls a tool whose result comes 55 minutes later
    boundary_at = "10:55:30" if tool_run else boundary_at
    reply = [_call("t")] if tool_run else [{"type": "text", "text": "done"}]
    log = _cc_log(tmp_path / "i.jsonl", [
        _at("2026-10-20T10:00:00Z", {"type": "user", "message": {"role": "user", "content": "work"}}),
        _at("2026-10-20T10:00:30Z", _asst("m1", reply)),
        *([_at("2026-10-20T10:55:00Z", _results("t"))] if tool_run else []),
        _at(f"2026-10-20T{boundary_at}Z", {"type": "system", "subtype": "compact_boundary",
                                           "compactMetadata": {"trigger": trigger, "preTokens": 240_000}}),
        _at(f"2026-10-20T{boundary_at}Z", {"type": "user", "isCompactSummary": True, "message": {
            "role": "user", "content": "This session is being continued from a previous conversation ..."}}),
        _at("2026-10-20T12:00:00Z", {"type": "user", "message": {"role": "user", "content": "back"}}),
        _at("2026-10-20T12:00:20Z", _asst("m2", [{"type": "text", "text": "hi"}])),
    ])
    tr = load_trace(log)
    assert tr.boundaries[0]["idle"] is idle
    assert any("idle compaction" in n for n in tr.notes) is idle
    sent = load_claude_code(log, keep_compaction=True)
    assert sent.compaction_kinds == ["idle compaction" if idle else "compact"]


def test_history_a_second_compact_appends_again_is_read_once(tmp_path: Path) -> None:
    """A second ``/compact`` appends the history it summarized to the log again under the same
    uuids (anthropics/claude-code#92089). No licensed log shows it (0 repeated uuids in the 22
    shared logs), so the fixture copies the entries as the report describes; each is read once."""
    first = [
        _at("2026-10-20T10:00:00Z", {"type": "user", "message": {"role": "user", "content": "work"}}, "u1"),
        _at("2026-10-20T10:00:05Z", _asst("m1", [_call("a")], cache_creation_input_tokens=9_000), "u2"),
        _at("2026-10-20T10:00:06Z", _results("a"), "u3"),
        _at("2026-10-20T10:00:09Z", _asst("m2", [{"type": "text", "text": "read"}]), "u4"),
    ]
    log = _cc_log(tmp_path / "d.jsonl", [
        *first,
        _at("2026-10-20T10:05:00Z", {"type": "user", "message": {"role": "user", "content": "next"}}, "u5"),
        *first,  # written again by the second /compact
        _at("2026-10-20T10:05:09Z", _asst("m3", [{"type": "text", "text": "ok"}]), "u6"),
    ])
    tr = load_trace(log)
    assert tr.turns == 3 and [m["role"] for m in tr.messages] == ["user", "assistant", "user", "assistant", "user",
                                                                  "assistant"]
    assert any("4 entries written again" in n and "#92089" in n for n in tr.notes)
    assert len(tr.recorded_usage()) == 3  # each call billed once
