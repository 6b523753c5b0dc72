from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from cachecompact import HistoryRewrittenError, MalformedMessageError, Session
from cachecompact.history.transcript import immutable_prefix_end, message_hash

from ..conftest import SYSTEM, TOOLS, history, turn


def test_sync_appends_only_the_new_tail(tmp_path: Path) -> None:
    s = Session.create(tmp_path / "s", system=SYSTEM, tools=TOOLS)
    h = history(3)
    assert s.sync(h) == list(range(len(h)))
    h2 = h + turn(3)
    assert s.sync(h2) == [len(h), len(h) + 1]
    assert s.sync(h2) == []
    assert s.messages() == h2
    assert len((tmp_path / "s" / "transcript.jsonl").read_text().splitlines()) == len(h2)


def test_key_order_is_not_a_rewrite() -> None:
    s = Session.create(None)
    h = history(2)
    s.sync(h)
    reordered = [dict(reversed(list(m.items()))) for m in h]
    assert s.sync(reordered) == []


@pytest.mark.parametrize("mutate", ["change", "drop"])
def test_rewritten_history_names_first_differing_index(tmp_path: Path, mutate: str) -> None:
    s = Session.create(tmp_path / "s")
    h = history(4)
    s.sync(h)
    size = (tmp_path / "s" / "transcript.jsonl").stat().st_size
    bad = copy.deepcopy(h) + turn(9)
    if mutate == "change":
        bad[5]["content"][0]["text"] = "edited"
        expect = 5
    else:
        bad = bad[:3]
        expect = 3
    with pytest.raises(HistoryRewrittenError) as ei:
        s.sync(bad)
    assert ei.value.index == expect
    assert (tmp_path / "s" / "transcript.jsonl").stat().st_size == size  # nothing written
    assert len(s) == len(h)


def test_every_stored_message_is_compared_on_every_sync() -> None:
    """A rewrite anywhere (first, last, any message between) is caught on the very sync that
    makes it, never later: there is no sampling."""
    s = Session.create(None)
    h = history(10)
    s.sync(h)
    for k in range(len(h)):
        bad = copy.deepcopy(h)
        bad[k]["content"] = "edited" if isinstance(bad[k]["content"], str) else [{"type": "text", "text": "e"}]
        with pytest.raises(HistoryRewrittenError) as ei:
            s.sync([*bad, *turn(20)])
        assert ei.value.index == k
    assert len(s) == len(h)


@pytest.mark.parametrize("form", ["string", "marked block", "tool_result string"])
def test_forms_the_api_treats_as_one_are_one_message(form: str) -> None:
    """A plain string and one text block, a block with and without cache_control, a tool_result's
    string content and the same as one text block: one identity, so no rewrite."""
    s = Session.create(None)
    if form == "tool_result string":
        first: list[dict[str, Any]] = [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "t", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "out"}]}]
        second = copy.deepcopy(first)
        second[2]["content"][0]["content"] = [{"type": "text", "text": "out", "cache_control": {"type": "ephemeral"}}]
    else:
        marked = {"type": "text", "text": "hello", "cache_control": {"type": "ephemeral"}}
        first = [{"role": "user", "content": [marked]}]
        second = [{"role": "user", "content": "hello"}] if form == "string" else \
            [{"role": "user", "content": [{"type": "text", "text": "hello"}]}]
    s.sync(first)
    assert s.sync(second) == []
    assert s.sync([*second, {"role": "assistant", "content": "ok"}]) == [len(first)]
    assert message_hash(first[-1]) == message_hash(second[-1])
    assert message_hash({"role": "user", "content": "hello"}) != message_hash({"role": "user", "content": "hello!"})


def test_tool_result_without_matching_tool_use_is_rejected_and_nothing_written(tmp_path: Path) -> None:
    s = Session.create(tmp_path / "s")
    h = history(2)
    s.sync(h)
    bad = [*h, {"role": "assistant", "content": "ok"},
           {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_nope", "content": "x"}]}]
    with pytest.raises(MalformedMessageError) as ei:
        s.sync(bad)
    assert ei.value.where == f"messages[{len(h) + 1}].content[0].tool_use_id"
    assert len(Session.open(tmp_path / "s")) == len(h)


def test_unanswered_tool_use_is_rejected_but_a_trailing_one_is_pending() -> None:
    s = Session.create(None)
    h = history(1)
    call = turn(5)[0]
    s.sync([*h, call])  # pending call at the end is fine
    with pytest.raises(MalformedMessageError, match="does not answer"):
        s.sync([*h, call, {"role": "user", "content": "never mind"}])


def test_first_message_must_be_user() -> None:
    with pytest.raises(MalformedMessageError) as ei:
        Session.create(None).sync([{"role": "assistant", "content": "hi"}])
    assert ei.value.where == "messages[0].role"


def test_duplicate_tool_use_id_rejected() -> None:
    s = Session.create(None)
    h = history(1)
    dup = turn(0)  # same ids as turn 0 in history(1)
    with pytest.raises(MalformedMessageError, match="duplicate tool_use id"):
        s.sync(h + dup)


def test_immutable_prefix_extends_past_a_tool_pair() -> None:
    s = Session.create(None, prefix_messages=2)
    h = history(3)  # 0 user, 1 assistant(tool_use), 2 results, ...
    s.sync(h[:2])
    assert s.prefix_end is None  # results of message 1 not in yet
    s.sync(h[:3])
    assert s.prefix_end == 3
    assert immutable_prefix_end(s.transcript, 0) == 0


def test_append_validates_only_the_new_messages(tmp_path: Path) -> None:
    s = Session.create(tmp_path / "s")
    s.sync(history(2))
    assert s.append(turn(2)) == [5, 6]
    assert Session.open(tmp_path / "s").messages() == history(3)
    with pytest.raises(MalformedMessageError):
        s.append([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "r"}]}])
    assert len(Session.open(tmp_path / "s")) == 7
