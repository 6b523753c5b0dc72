from __future__ import annotations

from typing import Any

import pytest
from anthropic.types import Message as SDKMessage
from hypothesis import given, settings, strategies as st

from cachecompact.base.errors import MalformedMessageError
from cachecompact.base.wire import (
    TextBlock,
    ToolResultBlock,
    UnknownBlock,
    block_from_dict,
    message_from_dict,
    message_to_dict,
    plain,
    system_from_param,
)

json_scalar = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.text(max_size=20))
json_value = st.recursive(json_scalar, lambda c: st.one_of(st.lists(c, max_size=3),
                                                           st.dictionaries(st.text(max_size=8), c, max_size=3)),
                          max_leaves=10)
extra_fields = st.dictionaries(st.sampled_from(["x_custom", "meta", "citations_hint", "zz"]), json_value, max_size=2)
tool_id = st.from_regex(r"[A-Za-z0-9_-]{1,20}", fullmatch=True)


@st.composite
def block(draw: Any, role: str) -> dict[str, Any]:
    kind = draw(st.sampled_from(["text", "image", "document", "unknown", "thinking", "redacted_thinking"]
                                + (["tool_use"] if role == "assistant" else [])))
    extra = draw(extra_fields)
    if kind == "text":
        b: dict[str, Any] = {"type": "text", "text": draw(st.text(min_size=1, max_size=40))}
        if draw(st.booleans()):
            b["cache_control"] = {"type": "ephemeral"}
    elif kind == "image":
        b = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    elif kind == "document":
        b = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": draw(st.text())},
             "title": draw(st.one_of(st.none(), st.text(max_size=10)))}
    elif kind == "thinking":
        b = {"type": "thinking", "thinking": draw(st.text(max_size=30)), "signature": "sig"}
    elif kind == "redacted_thinking":
        b = {"type": "redacted_thinking", "data": "abc"}
    elif kind == "tool_use":
        b = {"type": "tool_use", "id": draw(tool_id), "name": "bash",
             "input": draw(st.dictionaries(st.text(max_size=5), json_value, max_size=3))}
    else:
        b = {"type": draw(st.sampled_from(["server_tool_use", "web_search_tool_result", "compaction"])),
             "anything": draw(json_value)}
    return {**extra, **b}


@settings(max_examples=200, deadline=None)
@given(role=st.sampled_from(["user", "assistant"]), data=st.data())
def test_dict_struct_round_trip_is_lossless(role: str, data: Any) -> None:
    blocks = data.draw(st.lists(block(role), min_size=1, max_size=4))
    content: Any = blocks
    if data.draw(st.booleans()):
        content = data.draw(st.text(min_size=1, max_size=30))
    msg = {"role": role, "content": content, **data.draw(st.dictionaries(st.sampled_from(["name", "x"]),
                                                                          json_value, max_size=1))}
    assert message_to_dict(message_from_dict(msg, 0)) == msg


def test_tool_result_nested_blocks_and_is_error_round_trip() -> None:
    msg = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "is_error": True,
                                        "content": [{"type": "text", "text": "boom"},
                                                    {"type": "image", "source": {"type": "url", "url": "u"}},
                                                    {"type": "mystery", "k": 1}]}]}
    parsed = message_from_dict(msg, 0)
    tr = parsed.content[0]
    assert isinstance(tr, ToolResultBlock) and tr.is_error is True
    assert isinstance(tr.content, list) and isinstance(tr.content[0], TextBlock)
    assert isinstance(tr.content[2], UnknownBlock)
    assert message_to_dict(parsed) == msg


def test_sdk_pydantic_blocks_are_accepted_like_the_sdk_sends_them() -> None:
    resp = SDKMessage.model_validate({
        "id": "msg_1", "type": "message", "role": "assistant", "model": "m", "stop_reason": "tool_use",
        "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 1},
        "content": [{"type": "text", "text": "hi"}, {"type": "tool_use", "id": "toolu_9", "name": "bash",
                                                      "input": {"command": "ls"}}]})
    m = message_from_dict({"role": "assistant", "content": resp.content}, 4)
    d = message_to_dict(m)
    assert d["content"][1] == {"type": "tool_use", "id": "toolu_9", "name": "bash", "input": {"command": "ls"}}
    assert d["content"][0]["type"] == "text" and d["content"][0]["text"] == "hi"
    assert plain({"a": resp.content[1]})["a"]["input"] == {"command": "ls"}


@pytest.mark.parametrize(("msg", "where"), [
    ({"role": "robot", "content": "x"}, "messages[7].role"),
    ({"role": "system", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "x"}]},
     "messages[7].content"),
    ({"role": "user"}, "messages[7].content"),
    ({"role": "user", "content": ""}, "messages[7].content"),
    ({"role": "user", "content": []}, "messages[7].content"),
    ({"role": "user", "content": 42}, "messages[7].content"),
    ({"role": "user", "content": [{"type": "text", "text": 5}]}, "messages[7].content[0].text"),
    ({"role": "user", "content": [{"text": "no type"}]}, "messages[7].content[0].type"),
    ({"role": "assistant", "content": [{"type": "tool_use", "id": "../../etc/passwd", "name": "x", "input": {}}]},
     "messages[7].content[0].id"),
    ({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a b"}]},
     "messages[7].content[0].tool_use_id"),
    ({"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "x", "input": "notadict"}]},
     "messages[7].content[0].input"),
])
def test_malformed_messages_name_index_and_field(msg: dict[str, Any], where: str) -> None:
    with pytest.raises(MalformedMessageError) as ei:
        message_from_dict(msg, 7)
    assert ei.value.where == where, str(ei.value)


def test_system_forms() -> None:
    assert system_from_param("hello")[0].text == "hello"
    assert system_from_param([{"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}}])[0].text == "a"
    assert system_from_param(None) == []
    with pytest.raises(MalformedMessageError):
        system_from_param([{"type": "image", "source": {}}])


def test_unknown_block_kept_verbatim() -> None:
    raw = {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"q": "x"}}
    b = block_from_dict(raw, "x")
    assert isinstance(b, UnknownBlock) and b.raw == raw
