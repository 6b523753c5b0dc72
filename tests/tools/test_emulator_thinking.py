"""The emulator is the API of December 2026: preserved thinking, its prefix check and outcomes,
``drop_block`` and ``input_transformations``, the API version 2026-10-21, and on-demand
compaction. Each rule is the documented one (cachecompact/tools/emulator/_binding.py says where
from), driven through the real ``anthropic`` SDK; where the docs leave an outcome open, both
settings are tested."""

from __future__ import annotations

import copy
import itertools
import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx2
import pytest

from cachecompact.tools.emulator import Emulator, ScriptedResponder
from cachecompact.tools.emulator._binding import BETA, ThinkingRules
from cachecompact.tools.emulator.responders import Reply

from ..conftest import API_VERSION

OPUS = "claude-opus-5-5"
TOOLS = [{"name": "read", "description": "Read a file.", "input_schema": {"type": "object",
                                                                         "properties": {"path": {"type": "string"}}}}]
SYSTEM = "You are a careful agent. " * 50


def reader(body: dict[str, Any]) -> Reply:
    """Reads f1, f2, ... one per turn; answers when told to stop."""
    last = body["messages"][-1]["content"]
    if isinstance(last, str) and "stop" in last:
        return Reply([{"type": "text", "text": "done"}])
    n = sum(1 for m in body["messages"] if m["role"] == "assistant") + 1
    return Reply([{"type": "tool_use", "id": f"toolu_{n:03d}", "name": "read", "input": {"path": f"f{n}.py"}}],
                 "tool_use")


def _result(call_id: str, text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id, "content": text}]}


@pytest.fixture
def emu() -> Iterator[Emulator]:
    with Emulator(ScriptedResponder(reader)) as e:
        yield e


def _client(emu: Emulator) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0)


def _loop(client: anthropic.Anthropic, turns: int, model: str = OPUS, **kw: Any) -> list[dict[str, Any]]:
    """A tool loop of ``turns`` turns on ``model``; returns the history, the last tool result last."""
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "Read the files."}]
    for k in range(turns):
        r = client.messages.create(model=model, max_tokens=2000, system=SYSTEM, tools=TOOLS, messages=msgs, **kw)
        msgs.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]})
        call = next(b for b in r.content if b.type == "tool_use")
        msgs.append(_result(call.id, f"contents of file {k}\n" + "line\n" * 200))
    return msgs


def _send(client: anthropic.Anthropic, msgs: list[dict[str, Any]], model: str = OPUS, *, system: str = SYSTEM,
          drop: bool = False, beta: bool = False, **kw: Any) -> Any:
    extra: dict[str, Any] = {}
    if drop:
        kw["thinking"] = {"type": "adaptive", "block_binding": {"prefix_mismatch_behavior": "drop_block"}}
    if beta or drop:
        extra["extra_headers"] = {"anthropic-beta": BETA}
    return client.messages.with_raw_response.create(model=model, max_tokens=2000, system=system, tools=TOOLS,
                                                    messages=msgs, **kw, **extra)


def _thinking_paths(msgs: list[dict[str, Any]]) -> list[str]:
    return [f"messages.{i}.content.{j}" for i, m in enumerate(msgs) if isinstance(m["content"], list)
            for j, b in enumerate(m["content"]) if b.get("type") == "thinking"]


# -- adaptive thinking by default, omitted text, billing ------------------------------------------------


def test_current_models_think_by_default_with_the_text_omitted_and_billed(emu: Emulator) -> None:
    c = _client(emu)
    r = c.messages.create(model=OPUS, max_tokens=2000, system=SYSTEM, tools=TOOLS,
                          messages=[{"role": "user", "content": "Read the files."}])
    first = r.content[0]
    assert first.type == "thinking" and first.thinking == "" and first.signature  # display "omitted"
    visible = emu.requests[-1]["usage"]["output_tokens"]
    assert visible >= 32  # the thought is billed as output although its text was omitted
    msgs = _loop(c, 3)
    before = emu.requests[-1]["total_input_tokens"]
    _send(c, msgs)  # sent back unchanged: accepted, and billed as input (part of the cached prefix)
    rec = emu.requests[-1]
    assert rec["thinking"]["kept"] == 3 and rec["thinking"]["kept_tokens"] >= 3 * 32
    assert rec["total_input_tokens"] > before


def test_the_older_api_version_and_models_keep_todays_behaviour(emu: Emulator) -> None:
    c = _client(emu)
    r = c.messages.create(model="claude-sonnet-4-6", max_tokens=100, messages=[{"role": "user", "content": "x"}])
    assert all(b.type != "thinking" for b in r.content)  # no thinking unless asked
    assert emu.requests[-1]["api_version"] == "2026-10-21"  # what anthropic 2.x sends by default


# -- the prefix check ------------------------------------------------------------------------------------


def test_an_edit_before_a_thinking_block_is_refused_with_the_documented_message(emu: Emulator) -> None:
    c = _client(emu)
    msgs = _loop(c, 4)
    edited = copy.deepcopy(msgs)
    edited[2]["content"][0]["content"] = "[cleared]"  # an earlier tool result, as a compactor clears it
    with pytest.raises(anthropic.BadRequestError) as err:
        _send(c, edited)
    msg = err.value.body["error"]["message"]  # type: ignore[index]
    assert msg.startswith("messages.3.content.0: Invalid `signature` in `thinking` block. The block is bound to a "
                          "different conversation. Remove the block, or set `thinking.block_binding."
                          "prefix_mismatch_behavior` to \"drop_block\".")
    assert msg.endswith(f"That setting requires the `{BETA}` value in the `anthropic-beta` header.")
    assert emu.core.refusals and emu.core.refusals[-1]["where"] == "messages.3.content.0"
    # a changed system prompt invalidates every block
    with pytest.raises(anthropic.BadRequestError, match=r"messages\.1\.content\.0: Invalid `signature`"):
        _send(c, msgs, system=SYSTEM + " Be brief.")


def test_forms_the_api_treats_as_one_pass_the_check(emu: Emulator) -> None:
    """Values, not bytes: cache_control markers, key order, a string for one text block, other
    parameters (max_tokens, tool_choice, metadata) are outside the prefix."""
    c = _client(emu)
    msgs = _loop(c, 3)
    same = copy.deepcopy(msgs)
    same[0]["content"] = [{"type": "text", "text": "Read the files.", "cache_control": {"type": "ephemeral"}}]
    same[2]["content"][0]["cache_control"] = {"type": "ephemeral"}
    same[4]["content"][0]["content"] = [{"type": "text", "text": same[4]["content"][0]["content"]}]
    r = _send(c, same, tool_choice={"type": "auto"}, metadata={"user_id": "u"})
    assert r.http_response.status_code == 200 and emu.requests[-1]["thinking"]["kept"] == 3


def test_blocks_may_go_from_the_start_from_the_end_or_all_but_a_gap_fails(emu: Emulator) -> None:
    c = _client(emu)
    msgs = _loop(c, 4)
    c.messages.create(model=OPUS, max_tokens=2000, system=SYSTEM, tools=TOOLS,
                      messages=[*msgs, {"role": "assistant", "content": "noted"}, {"role": "user", "content": "stop"}])

    def strip(m: list[dict[str, Any]], at: set[int]) -> list[dict[str, Any]]:
        out = copy.deepcopy(m)
        for i in at:
            out[i]["content"] = [b for b in out[i]["content"] if b.get("type") != "thinking"]
        return out

    assistant = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]  # 1, 3, 5, 7
    ok_start = strip(msgs, set(assistant[:2]))
    assert _send(c, ok_start).http_response.status_code == 200
    assert _send(c, strip(msgs, set(assistant))).http_response.status_code == 200
    with pytest.raises(anthropic.BadRequestError, match=r"messages\.5\.content\.0: Invalid `signature`"):
        _send(c, strip(msgs, {assistant[1]}))  # a gap: the block after it no longer follows its predecessor
    moved = copy.deepcopy(msgs)
    moved[3]["content"][0], moved[5]["content"][0] = moved[5]["content"][0], moved[3]["content"][0]
    with pytest.raises(anthropic.BadRequestError, match="Invalid `signature`"):
        _send(c, moved)


def test_a_changed_block_is_a_different_failure_that_drop_block_does_not_cover(emu: Emulator) -> None:
    c = _client(emu)
    msgs = _loop(c, 2)
    bad = copy.deepcopy(msgs)
    bad[1]["content"][0]["thinking"] = "I invented this."
    with pytest.raises(anthropic.BadRequestError) as err:
        _send(c, bad, drop=True)
    assert err.value.body["error"]["message"] == "messages.1.content.0: Invalid `signature` in `thinking` block"  # type: ignore[index]
    bad[1]["content"][0]["signature"] = ""
    with pytest.raises(anthropic.BadRequestError, match="Invalid `signature`"):
        _send(c, msgs[:1] + bad[1:], drop=True)


# -- drop_block, input_transformations, billing ---------------------------------------------------------


def test_drop_block_drops_the_failing_block_and_every_later_one_unbilled() -> None:
    with Emulator(ScriptedResponder(reader), thinking=ThinkingRules(latest_tool_turn="lenient")) as emu:
        _drop_block(emu)


def _drop_block(emu: Emulator) -> None:
    c = _client(emu)
    msgs = _loop(c, 4)
    edited = copy.deepcopy(msgs)
    edited[4]["content"][0]["content"] = "[cleared]"  # invalidates the blocks of messages 5 and 7
    r = _send(c, edited, drop=True)
    data = json.loads(r.http_response.text)
    assert data["input_transformations"] == [
        {"type": "thinking_dropped", "path": "messages.5.content.0", "reason": "prefix_binding_mismatch"},
        {"type": "thinking_dropped", "path": "messages.7.content.0", "reason": "prefix_binding_mismatch"}]
    rec = emu.requests[-1]
    assert rec["thinking"] == {**rec["thinking"], "kept": 2, "dropped": 2}
    # without the header, block_binding itself is refused
    with pytest.raises(anthropic.BadRequestError, match="block_binding: Extra inputs are not permitted"):
        c.messages.create(model=OPUS, max_tokens=2000, system=SYSTEM, tools=TOOLS, messages=edited,
                          thinking={"type": "adaptive", "block_binding": {"prefix_mismatch_behavior": "drop_block"}})
    # under the beta, every response carries input_transformations, [] when nothing was dropped
    assert json.loads(_send(c, msgs, beta=True).http_response.text)["input_transformations"] == []
    # dropped blocks are not billed: the same request, the blocks removed by hand, costs the same input
    by_hand = copy.deepcopy(edited)
    for i in (5, 7):
        by_hand[i]["content"] = by_hand[i]["content"][1:]
    billed = rec["total_input_tokens"]
    _send(c, by_hand[:5] + by_hand[5:], beta=True)
    assert emu.requests[-1]["total_input_tokens"] == billed
    # "the request succeeds" even where a dropped block was all an assistant message held: the message
    # goes with it (a replayed 2026 log has such turns); the emulator used to refuse the emptied message
    alone = copy.deepcopy(edited)
    alone[5:6] = [{"role": "assistant", "content": [alone[5]["content"][0]]},
                  {"role": "user", "content": "go on"}, alone[5]]
    data = json.loads(_send(c, alone, drop=True).http_response.text)
    assert [t["path"] for t in data["input_transformations"]] == \
        ["messages.5.content.0", "messages.7.content.0", "messages.9.content.0"]


@pytest.mark.parametrize(("rules", "model", "outcome"), [
    (ThinkingRules(), "claude-sonnet-5-5", "drop"),
    (ThinkingRules(unset={"claude-sonnet-5-5": "error"}), "claude-sonnet-5-5", "error"),
    (ThinkingRules(), "claude-haiku-5-5", "drop"),
    (ThinkingRules(), "claude-fable-5-2", "error"),
    (ThinkingRules(account_before_2026_08_31=True), "claude-fable-5-2", "error"),  # every account
    (ThinkingRules(), "claude-fable-5-1", "error"),
    (ThinkingRules(account_before_2026_08_31=True), "claude-fable-5-1", "allow"),
    (ThinkingRules(unset={"claude-mythos-5-1": "drop"}), "claude-mythos-5-1", "drop"),
])
def test_the_outcome_of_a_failing_block_per_model_both_where_the_docs_are_open(
        rules: ThinkingRules, model: str, outcome: str) -> None:
    with Emulator(ScriptedResponder(reader), thinking=rules) as emu:
        c = _client(emu)
        msgs = _loop(c, 3, model=model)
        edited = copy.deepcopy(msgs)
        edited[2]["content"][0]["content"] = "[cleared]"
        if outcome == "error":
            with pytest.raises(anthropic.BadRequestError, match="bound to a different conversation"):
                _send(c, edited, model=model)
            return
        data = json.loads(_send(c, edited, model=model, beta=True).http_response.text)
        kinds = {t["type"] for t in data["input_transformations"]}
        assert kinds == ({"thinking_dropped"} if outcome == "drop" else {"thinking_mismatch_allowed"})
        assert emu.requests[-1]["thinking"]["dropped"] == (2 if outcome == "drop" else 0)
        # the silent form: no header, no list, the blocks all the same dropped or let through
        r = _send(c, edited, model=model)
        assert "input_transformations" not in json.loads(r.http_response.text)


def test_which_model_reads_whose_blocks(emu: Emulator) -> None:
    c = _client(emu)
    for producer, reader_model, kept in (("claude-opus-5-5", "claude-fable-5-1", True),
                                         ("claude-fable-5-1", "claude-opus-5-5", False),
                                         ("claude-haiku-5-5", "claude-opus-5-5", True),
                                         ("claude-opus-5-5", "claude-haiku-5-5", False),
                                         ("claude-fable-5-2", "claude-fable-5-1", False)):
        msgs = _loop(c, 2, model=producer)
        data = json.loads(_send(c, msgs, model=reader_model, beta=True,
                                thinking={"type": "adaptive", "block_binding": {
                                    "prefix_mismatch_behavior": "error"}}).http_response.text)
        dropped = {t["reason"] for t in data["input_transformations"]}
        assert (dropped == set()) if kept else (dropped == {"model_binding_mismatch"}), (producer, reader_model)


# -- the latest assistant message ----------------------------------------------------------------------


@pytest.mark.parametrize("rule", ["strict", "lenient"])
def test_a_tool_loops_latest_turn_must_come_back_with_its_thinking(rule: str) -> None:
    with Emulator(ScriptedResponder(reader), thinking=ThinkingRules(latest_tool_turn=rule)) as emu:  # type: ignore[arg-type]
        c = _client(emu)
        msgs = _loop(c, 2)
        stripped = copy.deepcopy(msgs)
        stripped[3]["content"] = stripped[3]["content"][1:]  # the latest assistant turn, mid tool loop
        if rule == "strict":
            with pytest.raises(anthropic.BadRequestError, match="in the latest assistant message cannot be modified"):
                _send(c, stripped)
        else:
            assert _send(c, stripped).http_response.status_code == 200
        # outside a tool loop, removing the latest turn's thinking is removing "from the end"
        done = [*msgs, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "stop"}]
        r = c.messages.create(model=OPUS, max_tokens=2000, system=SYSTEM, tools=TOOLS, messages=done)
        final = [*msgs, {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]}]
        final[-1]["content"] = [b for b in final[-1]["content"] if b["type"] != "thinking"]
        assert _send(c, [*final, {"role": "user", "content": "stop"}]).http_response.status_code == 200


# -- thinking settings per model ---------------------------------------------------------------------


def test_thinking_settings_each_model_accepts(emu: Emulator) -> None:
    c = _client(emu)
    msgs = [{"role": "user", "content": "Read the files."}]
    for model, cfg, says in (
            ("claude-opus-5-5", {"type": "disabled"}, '"thinking.type.disabled" is not supported for this model'),
            ("claude-opus-5-5", {"type": "enabled", "budget_tokens": 1024}, '"thinking.type.enabled" is not supported'),
            ("claude-sonnet-5-5", {"type": "disabled"}, "between_tools"),
            ("claude-opus-5-5", {"type": "between_tools"}, "not supported for claude-opus-5-5")):
        with pytest.raises(anthropic.BadRequestError, match=says.replace(".", r"\.")):
            c.messages.create(model=model, max_tokens=2000, messages=msgs, thinking=cfg)  # type: ignore[arg-type]
    # between_tools: no thinking up front; a short note between tool calls, sent back like any block
    two = ScriptedResponder(lambda b: Reply([{"type": "tool_use", "id": "toolu_a", "name": "read", "input": {}},
                                             {"type": "tool_use", "id": "toolu_b", "name": "read", "input": {}}],
                                            "tool_use"))
    with Emulator(two) as e2:
        r = _client(e2).messages.create(model="claude-sonnet-5-5", max_tokens=2000, tools=TOOLS, messages=msgs,
                                        thinking={"type": "between_tools"})  # type: ignore[typeddict-item]
        assert [b.type for b in r.content] == ["tool_use", "thinking", "tool_use"] and r.content[1].thinking


# -- API version 2026-10-21 --------------------------------------------------------------------------


def test_api_version_2026_10_21_refuses_what_the_migration_guide_lists(emu: Emulator) -> None:
    body: dict[str, Any] = {"model": "claude-sonnet-4-6", "max_tokens": 10, "messages": [
        {"role": "user", "content": "x"}]}
    with httpx2.Client(base_url=emu.url, headers=API_VERSION) as http:
        def post(extra: dict[str, Any], version: str) -> httpx2.Response:
            return http.post("/v1/messages", json={**body, **extra}, headers={"anthropic-version": version})

        for extra, says in (({"temperature": 1.0}, "temperature: Extra inputs are not permitted"),
                            ({"top_p": 0.9}, "top_p: Extra inputs"), ({"top_k": 5}, "top_k: Extra inputs"),
                            ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": [
                                {"type": "document", "source": {"type": "text", "media_type": "text/plain",
                                                                "data": "d"}}]},
                                           {"role": "user", "content": "y"}]}, "document blocks are not permitted"),
                            ({"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "citations": [
                                {"type": "char_location", "cited_text": "x"}]}]}]}, "citations are not permitted")):
            r = post(extra, "2026-10-21")
            assert r.status_code == 400 and says in r.json()["error"]["message"], r.text
            assert post(extra, "2023-06-01").status_code == 200, extra  # the old version keeps today's behaviour
        r = http.post("/v1/messages", json=body, headers={"anthropic-version": "2099-01-01"})
        assert r.status_code == 400
        assert r.json()["error"]["message"] == 'anthropic-version: "2099-01-01" is not a valid version'
    # api/versioning: "you must send an anthropic-version request header"; every SDK does (issue 46: the
    # emulator took a request without it)
    with httpx2.Client(base_url=emu.url) as bare:
        for method, path in (("POST", "/v1/messages"), ("POST", "/v1/messages/count_tokens"), ("GET", "/v1/models")):
            r = bare.request(method, path, json=body if method == "POST" else None)
            assert r.status_code == 400 and r.json()["error"] == {"type": "invalid_request_error",
                                                                 "message": "anthropic-version: header is required"}
    # through the SDK, which sends 2026-10-21 and a Bearer key
    with pytest.raises(anthropic.BadRequestError, match="temperature"):
        _client(emu).messages.create(**body, extra_body={"temperature": 0.2})


# -- on-demand compaction --------------------------------------------------------------------------------


def _compact(client: anthropic.Anthropic, msgs: list[dict[str, Any]], *, beta: bool = True, **kw: Any) -> Any:
    extra = {"extra_headers": {"anthropic-beta": "compact-2026-09-04"}} if beta else {}
    return client.messages.with_raw_response.create(model=OPUS, max_tokens=2000, system=SYSTEM, tools=TOOLS,
                                                    messages=msgs, extra_body={"compaction": {"type": "summarize",
                                                                                              **kw}}, **extra)


def test_on_demand_compaction_and_the_kept_turns_thinking(emu: Emulator) -> None:
    c = _client(emu)
    msgs = _loop(c, 5)
    head, kept = msgs[:7], msgs[7:]  # summarize the first three rounds, keep the last two verbatim
    data = json.loads(_compact(c, head).http_response.text)
    assert data["stop_reason"] == "compaction" and [b["type"] for b in data["content"]] == ["compaction"]
    block = data["content"][0]
    assert block["content"] and block["signature"]
    assert data["usage"]["input_tokens"] == 0 and data["usage"]["output_tokens"] == 0
    assert [it["type"] for it in data["usage"]["iterations"]] == ["compaction"]
    # the API wrote the summary, so the thinking in the kept turns stays valid
    after = [{"role": "assistant", "content": [block]}, *kept]
    r = c.messages.with_raw_response.create(model=OPUS, max_tokens=2000, system=SYSTEM, tools=TOOLS, messages=after,
                                            extra_headers={"anthropic-beta": f"compact-2026-09-04,{BETA}"})
    assert json.loads(r.http_response.text)["input_transformations"] == []
    assert emu.requests[-1]["thinking"]["kept"] == 2
    # a stream carries the block whole in content_block_start, with no delta
    with c.messages.stream(model=OPUS, max_tokens=2000, system=SYSTEM, tools=TOOLS, messages=head,
                           extra_body={"compaction": {"type": "summarize"}},
                           extra_headers={"anthropic-beta": "compact-2026-09-04"}) as s:
        events = [e.type for e in s]
    assert "content_block_delta" not in events and "content_block_start" in events


def test_on_demand_compactions_documented_errors(emu: Emulator) -> None:
    c = _client(emu)
    msgs = _loop(c, 3)
    block = json.loads(_compact(c, msgs[:5]).http_response.text)["content"][0]

    def code(fn: Any) -> str | None:
        with pytest.raises(anthropic.BadRequestError) as err:
            fn()
        return err.value.body["error"].get("details", {}).get("error_code")  # type: ignore[index, no-any-return]

    later = {"extra_headers": {"anthropic-beta": "compact-2026-09-04"}}

    def send(m: list[dict[str, Any]], **kw: Any) -> Any:
        return c.messages.create(model=OPUS, max_tokens=2000, system=SYSTEM, tools=TOOLS, messages=m,
                                 **{**later, **kw})

    assert code(lambda: _compact(c, msgs, beta=False)) is None  # the parameter needs the header
    assert code(lambda: _compact(c, msgs, instructions="x" * 16_385)) is None
    assert code(lambda: c.messages.create(model=OPUS, max_tokens=2000, messages=msgs, **later,
                                          extra_body={"compaction": {"type": "summarize"},
                                                      "context_management": {"edits": []}})) is None
    assert code(lambda: _compact(c, msgs[:2])) == "compaction_incomplete_turn"  # ends in a call without result
    misplaced = [msgs[0], {"role": "assistant", "content": [block]}, *msgs[5:]]
    assert code(lambda: send(misplaced)) == "compaction_block_misplaced"
    two = [{"role": "assistant", "content": [block]}, {"role": "user", "content": [block, {"type": "text",
                                                                                          "text": "x"}]}]
    assert code(lambda: send(two)) == "compaction_block_ambiguous"
    forged = {**block, "signature": "emucp.00.11.22"}
    assert code(lambda: send([{"role": "assistant", "content": [forged]}, *msgs[5:]])) == \
        "compaction_signature_invalid"
    changed = {**block, "content": block["content"] + " (edited)"}
    assert code(lambda: send([{"role": "assistant", "content": [changed]}, *msgs[5:]])) == \
        "compaction_content_mismatch"
    with pytest.raises(anthropic.BadRequestError, match="'compaction' found using 'type' does not match"):
        c.messages.create(model=OPUS, max_tokens=2000, system=SYSTEM, tools=TOOLS,
                          messages=[{"role": "assistant", "content": [block]}, *msgs[5:]])
    with pytest.raises(anthropic.BadRequestError, match="not supported for claude-haiku-4-5"):
        c.messages.create(model="claude-haiku-4-5", max_tokens=100, messages=msgs[:1], **later,
                          extra_body={"compaction": {"type": "summarize"}})
    # token counting ignores the parameter
    n = c.messages.count_tokens(model=OPUS, system=SYSTEM, tools=TOOLS,  # type: ignore[arg-type]
                                messages=[*msgs[:2], _result("toolu_001", "x")],
                                extra_body={"compaction": {"type": "summarize"}})
    assert n.input_tokens > 0
    # and it runs the same prefix check: without the system prompt the blocks are bound elsewhere
    with pytest.raises(anthropic.BadRequestError, match="bound to a different conversation"):
        c.messages.count_tokens(model=OPUS, messages=[*msgs[:2], _result("toolu_001", "x")])


def test_server_compaction_starts_the_checked_prefix_at_its_block() -> None:
    """"With server-side compaction, the checked prefix starts at the most recent compaction
    block": the history before it goes back as it was (the server drops it unchecked), and the
    thinking after the block, in the compacting reply and later, stays valid."""
    calls = itertools.count(1)  # the model sees only the block after compaction: ids from a counter

    def reads(body: dict[str, Any]) -> Reply:
        n = next(calls)
        return Reply([{"type": "tool_use", "id": f"toolu_{n:03d}", "name": "read", "input": {"path": f"f{n}.py"}}],
                     "tool_use")
    with Emulator(ScriptedResponder(reads)) as emu:
        _server_compaction(emu)


def _server_compaction(emu: Emulator) -> None:
    c = _client(emu)
    msgs = _loop(c, 4)
    msgs[-1]["content"][0]["content"] = "word " * 60_000  # past the smallest trigger, 50k
    edit = {"edits": [{"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 50_000}}]}

    def send(m: list[dict[str, Any]]) -> dict[str, Any]:
        r = c.messages.with_raw_response.create(
            model=OPUS, max_tokens=2000, system=SYSTEM, tools=TOOLS, messages=m,
            extra_body={"context_management": edit},
            thinking={"type": "adaptive", "block_binding": {"prefix_mismatch_behavior": "drop_block"}},
            extra_headers={"anthropic-beta": f"compact-2026-01-12,{BETA}"})
        return json.loads(r.http_response.text)  # type: ignore[no-any-return]

    reply = send(msgs)
    assert [b["type"] for b in reply["content"]][:2] == ["compaction", "thinking"]
    msgs.append({"role": "assistant", "content": reply["content"]})
    call = next(b for b in reply["content"] if b["type"] == "tool_use")
    msgs.append(_result(call["id"], "more"))
    for _ in range(2):
        data = send(msgs)
        assert data["input_transformations"] == [] and emu.requests[-1]["thinking"]["dropped"] == 0
        assert emu.requests[-1]["thinking"]["kept"] >= 1
        msgs.append({"role": "assistant", "content": data["content"]})
        call = next(b for b in data["content"] if b["type"] == "tool_use")
        msgs.append(_result(call["id"], "more"))
    # an edit after the block still counts: the thinking after it is bound to what was sent
    edited = copy.deepcopy(msgs)
    edited[-3]["content"][0]["content"] = "changed"
    with pytest.raises(anthropic.BadRequestError, match="bound to a different conversation"):
        c.messages.create(model=OPUS, max_tokens=2000, system=SYSTEM, tools=TOOLS, messages=edited,
                          extra_body={"context_management": edit},
                          extra_headers={"anthropic-beta": "compact-2026-01-12"})


@pytest.mark.parametrize("model", ["claude-sonnet-4-6", "claude-opus-5-5"])
def test_a_signature_the_emulator_never_issued_is_refused_unless_replays_bind_it(model: str) -> None:
    """The API refuses a thinking block whose signature it cannot decrypt (made up, or another
    key's); the emulator took ``"AAAA"`` (issue 46). By default it refuses one it did not issue, on
    every model; ``ThinkingRules(foreign_signatures="bind")`` keeps the binding for replays that send
    a recorded session's real signatures."""
    msgs: list[dict[str, Any]] = [
        {"role": "user", "content": "Plan it."},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "", "signature": "AAAA"},
                                          {"type": "text", "text": "A plan."}]},
        {"role": "user", "content": "Go on."}]
    with Emulator() as strict:
        with pytest.raises(anthropic.BadRequestError, match=r"messages\.1\.content\.0: Invalid `signature`"):
            _client(strict).messages.create(model=model, max_tokens=2000, messages=msgs)  # type: ignore[arg-type]
        ours = _client(strict).messages.create(model=model, max_tokens=2000, messages=msgs[:1],
                                               thinking={"type": "adaptive"})
        issued = [b.model_dump(exclude_none=True) for b in ours.content]
        again = [msgs[0], {"role": "assistant", "content": issued}, msgs[2]]  # its own signatures: accepted
        assert _client(strict).messages.create(model=model, max_tokens=2000, messages=again,  # type: ignore[arg-type]
                                               thinking={"type": "adaptive"}).content
    with Emulator(thinking=ThinkingRules(foreign_signatures="bind")) as binding:
        assert _client(binding).messages.create(model=model, max_tokens=2000,  # type: ignore[arg-type]
                                                messages=msgs).content
