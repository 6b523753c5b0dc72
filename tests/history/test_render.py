"""Renderer guarantees (design invariants 2-7), mostly as property tests over random
histories and edit sequences."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from cachecompact import ImmutablePrefixError, InvalidEditError, ReplaceWithSummary, Session, SkipRange
from cachecompact.cache.cache_keys import LOOKBACK
from cachecompact.history.render import RenderResult
from cachecompact.tools.emulator.validation import count_breakpoints, validate_request

from ..conftest import SYSTEM, TOOLS, history, turn


@st.composite
def histories(draw: Any) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "Task: fix the bug"}]
    for k in range(draw(st.integers(1, 14))):
        n_calls = draw(st.integers(0, 3))
        size = draw(st.sampled_from([1, 5, 60]))
        t = turn(k, n_calls, result="x" * size)
        if n_calls and draw(st.booleans()):
            t[1]["content"][0]["content"] = [{"type": "text", "text": "img follows"},
                                             {"type": "image", "source": {"type": "url", "url": "http://i"}}]
            t[1]["content"][0]["is_error"] = draw(st.booleans())
        if draw(st.integers(0, 5)) == 0:
            t[0]["content"].insert(0, {"type": "thinking", "thinking": "hmm", "signature": "s"})
        msgs += t
    return msgs


ops = st.lists(st.tuples(st.sampled_from(["skip", "summary", "append", "target-skip", "target-summary"]),
                         st.integers(0, 40), st.integers(0, 12)), max_size=10)


def _first_block_at_or_after(r: RenderResult, s: int, entries: list[Any]) -> int:
    for k in range(r.n_blocks):
        loc = r.location(k)
        if loc.section != "messages":
            continue
        if loc.transcript_index is not None and loc.transcript_index >= s:
            return k
        if loc.entry_seq is not None and entries[loc.entry_seq].start >= s:
            return k
    return r.n_blocks


def _check(r: RenderResult) -> None:
    validate_request(r.body)
    assert r.to_json() == msgspec.json.encode(r.body, order="sorted")
    marks = count_breakpoints(r.body)
    assert 1 <= len(marks) <= 4
    assert len(r.breakpoints) == len(marks)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(h=histories(), prefix=st.integers(0, 4), script=ops, cut=st.integers(1, 6))
def test_random_histories_and_edits_keep_every_invariant(h: list[dict[str, Any]], prefix: int,
                                                          script: list[tuple[str, int, int]], cut: int) -> None:
    s = Session.create(None, system=SYSTEM, tools=TOOLS, prefix_messages=prefix)
    upto = max(1, len(h) - cut * 2)
    while upto < len(h) and h[upto - 1]["role"] == "assistant" and any(
            b.get("type") == "tool_use" for b in h[upto - 1]["content"]):
        upto += 1
    s.sync(h[:upto])
    prev = s.render()
    _check(prev)
    prefix_hash = prev.prefix_hash
    for op, a, width in script:
        if op == "append":
            nxt = min(len(h), upto + 2)
            if nxt == upto:
                continue
            upto = nxt
            s.sync(h[:upto])
            r = s.render()
            _check(r)
            # (c) appending without edits leaves every earlier block identical, but for the one exception
            # of history.thinking: a tool-loop turn whose thinking an edit invalidated on the request that
            # answered it was sent once (drop_block) and is left out from then on
            kept = prev.thinking.kept_invalid
            same = len(prev.block_hashes) if kept is None else _first_block_at_or_after(prev, kept, s.ledger.entries)
            assert r.block_hashes[:same] == prev.block_hashes[:same]
            if kept is None:
                assert r.first_divergence(prev) is None
            else:
                assert not r.thinking.drop_block and kept in r.thinking.strip
        else:
            start = a % len(s)
            end = min(len(s) - 1, start + width)
            edit: SkipRange | ReplaceWithSummary
            if op.startswith("target"):
                ids = [b["tool_use_id"] for b in s.messages()[start]["content"]
                       if isinstance(b, dict) and b.get("type") == "tool_result"] if start < len(s) else []
                if not ids:
                    continue
                tid = ids[width % len(ids)]
                edit = (SkipRange(start, start, "t", tid) if op == "target-skip"
                        else ReplaceWithSummary(start, start, f"[externalized {tid}]", "t", tid))
            elif op == "skip":
                edit = SkipRange(start, end, "t")
            else:
                edit = ReplaceWithSummary(start, end, f"summary of {start}-{end}", "t")
            try:
                entry = s.edit(edit, level="manual")
            except InvalidEditError:
                continue
            r = s.render()
            _check(r)
            # (d) an edit changes nothing before its start, and (7) the change is explained
            boundary = _first_block_at_or_after(prev, entry.start, s.ledger.entries)
            assert r.block_hashes[:boundary] == prev.block_hashes[:boundary]
            div = r.first_divergence(prev)
            if div is not None:
                assert div.index >= boundary
                assert div.explained_by is not None and div.explained_by.seq == entry.seq
        if prefix_hash is None:
            prefix_hash = r.prefix_hash
        elif r.prefix_hash is not None:
            assert r.prefix_hash == prefix_hash  # (2) the immutable prefix never changes
        prev = r
    # (3) the same transcript + ledger renders byte-identically in a fresh session
    s2 = Session.create(None, system=SYSTEM, tools=TOOLS, prefix_messages=prefix)
    for e in s.ledger.entries:  # each edit made on the history it was made on: when is part of what it does
        s2.sync(h[:e.transcript_len])
        s2.edit(e.edit, level=e.level, created_at=e.created_at)
    s2.sync(h[:upto])
    assert s2.render(breakpoints=False).to_json() == s.render(breakpoints=False).to_json()


def test_render_is_byte_identical_in_a_fresh_process(tmp_path: Path) -> None:
    s = Session.create(tmp_path / "s", system=SYSTEM, tools=TOOLS)
    s.sync(history(12, n_calls=2))
    s.edit(SkipRange(4, 4), level="L1")
    s.edit(ReplaceWithSummary(5, 10, "explored f3..f5 — nothing relevant"), level="L3")
    s.record_request(s.render(), {})  # the request that carried the summary: any process renders it now
    here = hashlib.sha256(s.render(model="claude-haiku-4-5", max_tokens=77, temperature=0).to_json()).hexdigest()
    code = ("import hashlib,sys; from cachecompact import Session; s=Session.open(sys.argv[1]); "
            "print(hashlib.sha256(s.render(model='claude-haiku-4-5', max_tokens=77, temperature=0).to_json())"
            ".hexdigest())")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "s")], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == here


def test_the_preamble_is_the_tools_and_system_blocks() -> None:
    """`preamble_blocks` counts the blocks before the first message; the 0.2 name still reads."""
    tool = {"name": "read", "description": "Read a file.", "input_schema": {"type": "object"}}
    s = Session.create(None, prefix_messages=3, system=[{"type": "text", "text": "You are terse."}], tools=[tool])
    s.sync(history(4))
    r = s.render()
    assert r.preamble_blocks == len(r.body["tools"]) + len(r.body["system"]) == 2
    with pytest.warns(DeprecationWarning, match="head_blocks is now preamble_blocks"):
        assert r.head_blocks == r.preamble_blocks


def test_skip_of_whole_exchanges_removes_them_and_summary_is_marked() -> None:
    s = Session.create(None, prefix_messages=3)
    h = history(6)
    s.sync(h)
    s.edit(SkipRange(3, 4), level="manual")
    body = s.render().body
    assert len(body["messages"]) == len(h) - 2
    s.edit(ReplaceWithSummary(5, 8, "Looked at f2 and f3."), level="L3")
    msgs = s.render().body["messages"]
    assert len(msgs) == len(h) - 2 - 4 + 1
    summary = msgs[3]
    assert summary["role"] == "user"
    assert summary["content"][0]["text"].startswith("[cachecompact summary of messages 5-8 (ledger entry #1, L3)")
    assert "Looked at f2 and f3." in summary["content"][0]["text"]


def test_skip_of_tool_results_renders_placeholders_that_keep_the_pair() -> None:
    s = Session.create(None, prefix_messages=1)
    s.sync(history(4, n_calls=2))
    s.edit(SkipRange(2, 2, "stale"), level="L1")
    msgs = s.render().body["messages"]
    assert msgs[1]["content"][1]["id"] == "toolu_0_0"
    res = msgs[2]["content"]
    assert [b["tool_use_id"] for b in res] == ["toolu_0_0", "toolu_0_1"]
    assert all("cleared to save context" in b["content"] and "message 2" in b["content"] for b in res)


def test_breakpoints_at_prefix_end_last_block_and_lookback() -> None:
    s = Session.create(None, system=SYSTEM, tools=TOOLS, prefix_messages=3)
    s.sync(history(3))
    r1 = s.render()
    prefix_last = 5  # tools[0]=0, system[0]=1, msg0=2, msg1=3,4, msg2=5
    assert r1.breakpoints == [prefix_last, r1.n_blocks - 1]
    s.note_sent(r1)
    # append more than LOOKBACK positions: the previous end must get its own breakpoint
    s.sync(history(3 + LOOKBACK))
    r2 = s.render()
    prev_end = r1.n_blocks - 1
    assert r2.positions[-1] - r2.positions[prev_end] >= LOOKBACK
    assert prev_end in r2.breakpoints and r2.block_hashes[prev_end] == r1.block_hashes[prev_end]
    assert len(r2.breakpoints) <= 4
    s.note_sent(r2)
    # a short append stays within the lookback: no extra breakpoint
    s.sync(history(4 + LOOKBACK))
    r3 = s.render()
    assert r3.breakpoints == [prefix_last, r3.n_blocks - 1]


def test_positions_count_tool_runs_once() -> None:
    s = Session.create(None, prefix_messages=0)
    s.sync(history(1, n_calls=3))  # user, [text, tu, tu, tu], [tr, tr, tr]
    r = s.render()
    assert r.positions == [0, 1, 2, 2, 2, 3, 3, 3]


def test_breakpoint_skips_uncacheable_thinking_and_string_content_is_normalised() -> None:
    s = Session.create(None, prefix_messages=0)
    s.sync([{"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "text", "text": "a"},
                                              {"type": "thinking", "thinking": "t", "signature": "s"}]}])
    body = s.render().body
    assert body["messages"][0]["content"] == [{"type": "text", "text": "hi"}]
    assert "cache_control" not in body["messages"][1]["content"][1]
    assert body["messages"][1]["content"][0]["cache_control"] == {"type": "ephemeral"}


def test_caller_cache_control_is_replaced_and_ttls_are_ordered() -> None:
    h = history(2)
    h[0] = {"role": "user", "content": [{"type": "text", "text": "x", "cache_control": {"type": "ephemeral"}}]}
    s = Session.create(None, system=[{"type": "text", "text": "S", "cache_control": {"type": "ephemeral"}}])
    s.sync(h)
    r = s.render(prefix_ttl="1h", cache_control={"type": "ephemeral"})
    validate_request(r.body)
    marks = count_breakpoints(r.body)
    assert [m[1].get("ttl") for m in marks] == ["1h", None]
    assert "cache_control" not in r.body


def test_first_divergence_unexplained_for_changed_system() -> None:
    h = history(3)
    a = Session.create(None, system="Today is Monday", tools=TOOLS)
    b = Session.create(None, system="Today is Tuesday", tools=TOOLS)
    a.sync(h)
    b.sync(h)
    div = b.render().first_divergence(a.render())
    assert div is not None and div.location.section == "system" and div.explained_by is None
    assert "NOT explained" in str(div)


def test_immutable_prefix_is_checked_on_open(tmp_path: Path) -> None:
    s = Session.create(tmp_path / "s", system=SYSTEM, tools=TOOLS)
    s.sync(history(3))
    meta = tmp_path / "s" / "session.json"
    text = meta.read_text().replace("careful coding agent", "careless coding agent")
    meta.write_text(text)
    with pytest.raises(ImmutablePrefixError):
        Session.open(tmp_path / "s")


def test_render_at_entry_replays_history(tmp_path: Path) -> None:
    s = Session.create(tmp_path / "s")
    s.sync(history(5))
    first = s.edit(SkipRange(4, 4), level="L1")
    r_then = s.render()
    s.sync(history(8))
    s.edit(ReplaceWithSummary(3, 10, "later"), level="L4")
    again = Session.open(tmp_path / "s").render(at_entry=first.seq)
    assert again.to_json() == r_then.to_json()


def test_a_render_of_the_start_with_warm_marks_what_earlier_requests_wrote() -> None:
    """Issue 48: the API's compaction request covers messages 0..end. Rendered as any earlier
    state, it marked only the prefix and its last block, so it read the prefix and wrote the rest
    unless the cut's own request was still warm. With ``warm=True`` it also marks the previous
    request's writes it shares, and reads the longest warm one."""
    s = Session.create(None, system=SYSTEM, tools=TOOLS, prefix_messages=3)
    s.sync(history(3))
    r1 = s.render()
    s.note_sent(r1)
    s.sync(history(3 + LOOKBACK))
    r2 = s.render()
    s.note_sent(r2)
    last = r2.n_blocks - 1  # what the previous request wrote last
    s.sync(history(6 + 3 * LOOKBACK))
    cut = len(history(3 + 2 * LOOKBACK))  # past r2's end, more than LOOKBACK positions ahead of it
    plain = s.render(transcript_len=cut)
    warm = s.render(transcript_len=cut, warm=True)
    assert warm.positions[-1] - warm.positions[last] >= LOOKBACK
    assert last not in plain.breakpoints
    assert last in warm.breakpoints and warm.n_blocks - 1 in warm.breakpoints  # read it, then write on
    assert warm.block_hashes[last] == r2.block_hashes[last]
    assert s.render(transcript_len=cut).body == plain.body  # warm changes only the markers of that render
