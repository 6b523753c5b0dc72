"""The five levels, the scratchpad and the summarizers."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import anthropic
import pytest

from cachecompact import Session
from cachecompact.base.keylines import Focus, key_lines
from cachecompact.base.pricing import DEFAULT_SUMMARY_MODEL
from cachecompact.compaction.levels import (
    build_view,
    propose_entry_summary,
    propose_full,
    propose_micro,
    propose_tool_summary,
    propose_truncate,
    propose_turn_collapse,
    results_since,
    rule_summary,
    superseded_edits,
)
from cachecompact.compaction.levels.l1_micro import DEFAULT_WRITE_TOOLS
from cachecompact.compaction.levels.view import ResultInfo
from cachecompact.compaction.summarize.llm import (
    ExtractiveSummarizer,
    LLMSummarizer,
    Summary,
    SummaryRejected,
    SummaryRequest,
    check_summary,
    format_summary,
    open_issues_of,
    parse_summary,
)
from cachecompact.history.draft import Draft
from cachecompact.history.ledger import ReplaceWithSummary
from cachecompact.history.scratchpad import READ_SCRATCHPAD_TOOL, Scratchpad, ScratchpadRefError
from cachecompact.tools.emulator import Emulator
from cachecompact.tools.emulator.validation import validate_request

from ..conftest import history

GOAL = "Fix the failing test in foo.py"


def tool_turn(k: int, name: str, result: str | list[dict[str, Any]],
              inp: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    tid = f"toolu_{k}"
    return [{"role": "assistant", "content": [{"type": "text", "text": f"step {k}"},
                                              {"type": "tool_use", "id": tid, "name": name,
                                               "input": inp or {"path": f"f{k}.py"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tid, "content": result}]}]


def session_with(turns: list[list[dict[str, Any]]], prefix: int = 1) -> Session:
    s = Session.create(None, prefix_messages=prefix)
    msgs: list[dict[str, Any]] = [{"role": "user", "content": GOAL}]
    for t in turns:
        msgs += t
    s.sync(msgs)
    return s


# -- scratchpad -------------------------------------------------------------------------------------

def test_scratchpad_is_content_addressed_private_and_refuses_escapes(tmp_path: Path) -> None:
    sp = Scratchpad(tmp_path / "sp")
    ref = sp.put("hello " * 1000)
    assert ref == sp.put("hello " * 1000) and ref.startswith("sp_") and len(ref) == 35
    f = tmp_path / "sp" / f"{ref}.txt"
    assert stat.S_IMODE(f.stat().st_mode) == 0o600
    assert sp.read(ref, 6, 5) == "hello"
    for bad in ["../../etc/passwd", "sp_../../x", "sp_" + "g" * 32, "/etc/passwd", "sp_" + "0" * 31, ""]:
        with pytest.raises(ScratchpadRefError):
            sp.read(bad)
    with pytest.raises(ScratchpadRefError, match="unknown"):
        sp.read("sp_" + "0" * 32)
    out, err = sp.handle_tool_call({"ref": ref, "offset": 0, "limit": 10})
    assert not err and out.startswith("hello hell") and "more characters; call again with offset=10" in out
    out, err = sp.handle_tool_call({"ref": "../../etc/passwd"})
    assert err and "invalid scratchpad reference" in out
    assert READ_SCRATCHPAD_TOOL["input_schema"]["required"] == ["ref"]
    f.write_text("edited")  # damaged: refused, and storing the same output again mends it
    with pytest.raises(ScratchpadRefError, match="run the tool again"):
        sp.read(ref)
    assert sp.put("hello " * 1000) == ref and sp.read(ref, 0, 5) == "hello"


# -- L1 ---------------------------------------------------------------------------------------------

def test_l1_keeps_recent_and_write_ops_and_exempt_tools() -> None:
    turns = [tool_turn(k, "read_file", f"contents {k}\n" * 200) for k in range(6)]
    turns.insert(2, tool_turn(90, "write_file", "File written.\n" * 100, {"path": "a.py"}))
    turns.insert(3, tool_turn(91, "memory", "remember this\n" * 100))
    s = session_with(turns)
    view = build_view(Draft(s))
    p = propose_micro(view, keep_recent=3, write_tools=DEFAULT_WRITE_TOOLS, exempt_tools=frozenset({"memory"}),
                      min_tokens=100, keep_recent_tokens=0)
    cleared = {e.start for e in p.edits}
    ids = {r.message: r.name for r in view.results}
    assert {ids[i] for i in cleared} == {"read_file"} and len(cleared) == 3  # 6 reads - 3 recent
    assert p.break_at == min(cleared) and p.tokens_removed > 0
    for e in p.edits:
        s.edit(e, level="L1")
    body = s.render().body
    validate_request(body)
    text = str(body)
    assert "File written." in text and "remember this" in text
    # a caller predicate can mark writes too
    p2 = propose_micro(build_view(Draft(s)), keep_recent=0, write_tools=frozenset(), exempt_tools=frozenset(),
                       min_tokens=100, is_write=lambda name, inp: name == "read_file")
    # and a token budget keeps the newest results verbatim too
    p3 = propose_micro(build_view(Draft(session_with(turns))), keep_recent=0, write_tools=DEFAULT_WRITE_TOOLS,
                       exempt_tools=frozenset({"memory"}), min_tokens=100, keep_recent_tokens=10**9)
    assert not p3.edits
    assert all(view.results[0].name != "read_file" or e.tool_use_id != "toolu_0" for e in p2.edits)


def test_a_superseded_result_is_cleared_after_a_break_keeping_the_lines_its_successor_lacks() -> None:
    old = "".join(f"line {k}\n" for k in range(300)) + "def stale_helper(): pass\n"
    new = "".join(f"line {k}\n" for k in range(300))
    short = "error: file moved\n"
    turns = [tool_turn(0, "read_file", "other\n" * 300),
             tool_turn(1, "read_file", old, {"path": "a.py"}),
             tool_turn(2, "write_file", "File written.\n" * 50, {"path": "a.py"}),
             tool_turn(3, "read_file", new, {"path": "a.py"}),
             tool_turn(4, "write_file", "File written.\n" * 50, {"path": "a.py"}),
             tool_turn(5, "read_file", new, {"path": "b.py"}),
             tool_turn(6, "read_file", short, {"path": "b.py"})]
    s = session_with(turns)
    view = build_view(Draft(s))
    kw: dict[str, Any] = {"skip_ids": set(), "write_tools": DEFAULT_WRITE_TOOLS, "exempt_tools": frozenset(),
                          "min_tokens": 100, "key_fraction": 0.25, "key_max_chars": 2000}
    edits, removed = superseded_edits(view, after=0, **kw)
    # the older read of a.py only: writes repeat too but are kept, and the newer b.py result lacks
    # nearly every line of the older one, more than a placeholder keeps, so that one stays
    assert [e.tool_use_id for e in edits] == ["toolu_1"] and removed > 1000
    text = edits[0].summary
    assert "superseded" in text and "tool_use_id toolu_3" in text
    assert text.endswith("\ndef stale_helper(): pass") and "line 7" not in text  # every missing line, no other
    # never before the planned break, never one the plan edits, never against a newer one it edits
    assert superseded_edits(view, after=edits[0].start, **kw)[0] == []
    assert superseded_edits(view, after=0, **{**kw, "skip_ids": {"toolu_1"}})[0] == []
    assert superseded_edits(view, after=0, **{**kw, "skip_ids": {"toolu_3"}})[0] == []
    s.edit(edits[0], level="L1")
    validate_request(s.render().body)
    # once the newer result is itself cleared, the older one is not superseded by anything shown
    s2 = session_with(turns)
    v2 = build_view(Draft(s2))
    newer = next(r for r in v2.results if r.tool_use_id == "toolu_3")
    s2.edit(ReplaceWithSummary(newer.message, newer.message, "[cleared]", "t", tool_use_id="toolu_3"), level="L1")
    assert superseded_edits(build_view(Draft(s2)), after=0, **kw)[0] == []
    # a result with an image: its text does not show all of it, so it is never called superseded
    img = [{"type": "text", "text": new}, {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                         "data": "iVBORw0KGgo="}}]
    s3 = session_with([tool_turn(0, "screenshot", img, {}), tool_turn(1, "screenshot", img, {})])
    assert superseded_edits(build_view(Draft(s3)), after=0, **kw)[0] == []


def test_l1_clears_one_result_of_a_parallel_call_with_a_write() -> None:
    msgs = [{"role": "user", "content": GOAL},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "toolu_r", "name": "read_file", "input": {"path": "x"}},
                {"type": "tool_use", "id": "toolu_w", "name": "write_file", "input": {"path": "y"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_r", "content": "x\n" * 500},
                {"type": "tool_result", "tool_use_id": "toolu_w", "content": "wrote y\n" * 100}]}]
    for k in range(4):
        msgs += tool_turn(k, "read_file", "z\n" * 300)
    s = Session.create(None, prefix_messages=1)
    s.sync(msgs)
    p = propose_micro(build_view(Draft(s)), keep_recent=3, write_tools=DEFAULT_WRITE_TOOLS, exempt_tools=frozenset(),
                      min_tokens=100)
    assert [(e.start, e.tool_use_id) for e in p.edits][:1] == [(2, "toolu_r")]


def test_l1_placeholder_keeps_key_lines_verbatim() -> None:
    code = "\n".join(["import os", "", 'TIMEOUT_S = "30"', "def parse(path, limit=3):", "    x = 1",
                       "    return x", *(f"    y{k} = {k}" for k in range(200)), "class Loader:", "    pass"])
    s = session_with([tool_turn(0, "read_file", code), *(tool_turn(k, "read_file", "z\n" * 300)
                                                        for k in range(1, 5))])
    p = propose_micro(build_view(Draft(s)), keep_recent=3, write_tools=DEFAULT_WRITE_TOOLS, exempt_tools=frozenset(),
                      min_tokens=50, key_fraction=0.25, key_max_chars=1500, counter=s.counter)
    text = p.edits[0].summary  # type: ignore[union-attr]
    assert 'TIMEOUT_S = "30"' in text.split("\n") and "def parse(path, limit=3):" in text.split("\n")
    assert "class Loader:" in text.split("\n") and "    y3 = 3" not in text
    assert "read_scratchpad" not in text and "run the tool again" in text


def test_key_lines_see_through_a_line_number_gutter() -> None:
    # Claude Code's Read ("   351→") and cat -n ("    12\t") number every line; the file's own
    # line decides whether it is a key line, and the kept line keeps its number
    text = "\n".join(["   350→", "   351→func validateConfig(cfg *Config) error {", "   352→\treturn nil",
                      "    12\tTIMEOUT_S = 30", "    13\t    y = 1"])
    assert key_lines(text, 1_000) == ["   351→func validateConfig(cfg *Config) error {", "    12\tTIMEOUT_S = 30"]


def test_focus_is_only_what_calls_after_the_result_used() -> None:
    # the result's own call and a parallel call beside it name compute_1 and compute_2; only a
    # call answered later (compute_3) makes a line of the result part of the working set
    from cachecompact.compaction.levels.view import LaterIdentifiers
    body = "\n".join(f"    y{k} = compute_{k}(state)" for k in range(1, 4))
    msgs: list[dict[str, Any]] = [{"role": "user", "content": GOAL},
                                  {"role": "assistant", "content": [
                                      {"type": "tool_use", "id": "toolu_a", "name": "Read",
                                       "input": {"file_path": "a.py", "note": "compute_1"}},
                                      {"type": "tool_use", "id": "toolu_b", "name": "Grep",
                                       "input": {"pattern": "compute_2"}}]},
                                  {"role": "user", "content": [
                                      {"type": "tool_result", "tool_use_id": "toolu_a", "content": body},
                                      {"type": "tool_result", "tool_use_id": "toolu_b", "content": "none"}]},
                                  *tool_turn(9, "Edit", "ok", {"file_path": "a.py", "old_string": "compute_3(state)"})]
    s = Session.create(None, prefix_messages=1)
    s.sync(msgs)
    focus = LaterIdentifiers(build_view(Draft(s))).after(2)
    assert focus is not None
    used = {x for x, at in focus.last_use.items() if at > focus.after}
    assert "compute_3" in used and "compute_1" not in used and "compute_2" not in used
    assert LaterIdentifiers(build_view(Draft(s))).after(4) is None  # nothing came after the last result
    assert key_lines(body, 1_000, focus=focus) == ["    y3 = compute_3(state)"]


def test_a_common_name_cannot_crowd_out_the_definitions() -> None:
    # focus lines take at most half the budget first; the key lines still get in
    text = "\n".join([*(f"import os.path  # {k}" for k in range(40)), "def load(path):", "MAX_SIZE = 10"])
    kept = key_lines(text, 200, focus=Focus({"os.path": 1}, 0))
    assert "def load(path):" in kept and "MAX_SIZE = 10" in kept and any(x.startswith("import") for x in kept)
    assert sum(len(x) + 1 for x in kept) <= 200


def test_l1_placeholder_keeps_lines_the_agent_later_named() -> None:
    # the agent's calls after a result name identifiers (here in an edit's old_string): lines of
    # the cleared result naming them are kept first; a name used only before it is not special
    body = [f"    y{k} = compute_{k}(state)" for k in range(400)]
    code = "\n".join(["import os", "def parse(path):", *body])
    s = session_with([tool_turn(0, "Read", "    y7 = before_only(x)\n" * 2),
                      tool_turn(1, "Read", code, {"file_path": "src/a.py"}),
                      tool_turn(2, "Edit", "ok", {"file_path": "src/a.py", "old_string": "y3 = compute_350(state)"}),
                      *(tool_turn(k, "Read", "z\n" * 300) for k in range(3, 7))])
    p = propose_micro(build_view(Draft(s)), keep_recent=3, write_tools=DEFAULT_WRITE_TOOLS, exempt_tools=frozenset(),
                      min_tokens=50, key_fraction=0.25, key_max_chars=1500, counter=s.counter)
    placeholder = next(e.summary for e in p.edits if e.tool_use_id == "toolu_1")  # type: ignore[union-attr]
    kept = placeholder.split("\n")[1:]
    assert "    y350 = compute_350(state)" in kept and "def parse(path):" in kept
    assert kept.index("def parse(path):") < kept.index("    y350 = compute_350(state)")  # in file order
    assert "    y7 = compute_7(state)" not in kept and "    y8 = compute_8(state)" not in kept


# -- L2 ---------------------------------------------------------------------------------------------

def test_l2_on_entry_shortens_without_breaking_the_cache(tmp_path: Path) -> None:
    big = "\n".join(f"src/mod{k % 7}.py:{k}: def handler_{k}(): pass" for k in range(3000))
    s = session_with([tool_turn(0, "read_file", "small")])
    before = s.render()
    since = len(s)
    s.append(tool_turn(1, "grep", big, {"pattern": "handler"}))
    p = propose_entry_summary(results_since(Draft(s), since), True, s.counter, big_tokens=10_000, turn_tokens=50_000,
                              preview_chars=2_000, key_chars=1_500)
    assert len(p.edits) == 1 and p.break_at is None
    # proposing stores nothing: the content travels with the proposal, and the session stores it
    # with the edit that names it
    assert not s.staged_blobs and list(p.blobs.values()) == [big]
    draft = Draft(s)
    for text in p.blobs.values():
        draft.keep(text)
    (e,) = [draft.stage(p.edits[0], level="L2")]
    s.commit()
    after = s.render()
    assert after.first_divergence(before) is None  # only new content changed: nothing cached breaks
    shown = after.body["messages"][-1]["content"][0]["content"]
    ref = shown.split("scratchpad as ")[1].split(";")[0]
    assert "grep: 3000 matches in 7 files" in shown and len(shown) < 5000
    assert "src/mod6.py:2999: def handler_2999(): pass" not in shown  # past both budgets
    assert list(p.blobs) == [ref] and Scratchpad.for_session(s).read(ref, 100, 50) == big[100:150]
    assert e.tokens_after < e.tokens_before // 10
    # without the scratchpad tool the placeholder never names it: re-run the tool instead
    plain = propose_entry_summary(results_since(Draft(s), since), False, s.counter, big_tokens=10_000,
                                  turn_tokens=50_000, preview_chars=2_000)
    assert "read_scratchpad" not in plain.edits[0].summary and "run the tool again" in plain.edits[0].summary  # type: ignore[union-attr]


def test_l2_leaves_alone_a_result_its_placeholder_would_not_shorten(tmp_path: Path) -> None:
    """An output of definitions is all key lines: its placeholder kept every line plus a header,
    so it grew (10,874 -> 10,945 tokens) and told the agent to re-run the tool for a rest that
    was not missing; on old results each such edit broke the cache for nothing."""
    defs = "\n".join(f"def f_1_{k}(x): return g_{k % 13}(x, w={k * 37 % 997})" for k in range(300))
    mixed = defs + "\n" + "\n".join(f"    step {k} of the loop, nothing to keep" for k in range(2000))
    s = Session.create(None, prefix_messages=1)
    s.sync([{"role": "user", "content": GOAL}])
    since = len(s)
    s.append(tool_turn(1, "read_file", defs, {"path": "defs.py"}))
    s.append(tool_turn(2, "read_file", mixed, {"path": "mixed.py"}))
    p = propose_entry_summary(results_since(Draft(s), since), True, s.counter, big_tokens=1_000, turn_tokens=10**9,
                              preview_chars=2_000, key_chars=16_000)
    assert [e.tool_use_id for e in p.edits] == ["toolu_2"]  # only the one it shortens
    assert list(p.blobs) == [Scratchpad.ref_for(mixed)]  # and only its content is kept
    old = propose_tool_summary(build_view(Draft(s)), False, s.counter, old_min_tokens=1_000, preview_chars=2_000,
                               key_chars=16_000)
    assert [e.tool_use_id for e in old.edits] == ["toolu_2"] and old.tokens_removed > 0


def test_l2_turn_budget_takes_largest_results_first(tmp_path: Path) -> None:
    results = [("toolu_a", "a " * 60_000), ("toolu_b", "b " * 45_000), ("toolu_c", "c " * 12_500)]
    msgs = [{"role": "user", "content": GOAL},
            {"role": "assistant", "content": [{"type": "tool_use", "id": i, "name": "bash", "input": {"command": "x"}}
                                              for i, _ in results]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": i, "content": c} for i, c in results]}]
    s = Session.create(None, prefix_messages=1)
    s.sync(msgs)
    p = propose_entry_summary(results_since(Draft(s), 1), True, s.counter, big_tokens=10**9,
                              turn_tokens=70_000, preview_chars=2_000)
    assert [e.tool_use_id for e in p.edits] == ["toolu_a"]  # 117k -> 58k tokens once the largest goes


def test_l2_on_old_results_keeps_the_recent_ones_and_the_prefix() -> None:
    s = session_with([tool_turn(k, "bash", f"out {k} " * 2000, {"command": f"run {k}"}) for k in range(8)], prefix=3)
    p = propose_tool_summary(build_view(Draft(s)), False, s.counter, old_min_tokens=1000, preview_chars=400,
                             keep_recent=2, keep_recent_tokens=0)
    assert p.edits and all(e.start >= 3 for e in p.edits)
    assert {e.tool_use_id for e in p.edits}.isdisjoint({"toolu_6", "toolu_7"})
    assert p.break_at == min(e.start for e in p.edits)


@pytest.mark.parametrize(("name", "inp", "text", "expect"), [
    ("grep", {"pattern": "x"}, "a.py:1: x\nb.py:2: x\na.py:9: x\n", "grep: 3 matches in 2 files"),
    ("bash", {"command": "rg handler src"}, "src/a.py:3:handler\n", "grep: 1 matches in 1 files"),
    ("read_file", {"path": "a.py"}, "1\n2\n3\n", "file contents: 3 lines of a.py"),
    ("bash", {"command": "ls -la"}, "a\nb\n", "listing: 2 entries"),
    ("bash", {"command": "pytest"}, "...\n===== 2 failed, 10 passed in 1.20s =====\n", "test run: 2 failed, 10 passed"),
])
def test_rule_summaries_per_tool_kind(name: str, inp: dict[str, Any], text: str, expect: str) -> None:
    r = ResultInfo(2, 0, "t", name, inp, 10, len(text), text, False, True, False)
    assert rule_summary(r) == expect


# -- L3 / L4 / L5 -------------------------------------------------------------------------------------

def test_l3_takes_just_enough_old_rounds_and_l4_keeps_the_tail() -> None:
    s = session_with([tool_turn(k, "read_file", f"data {k}\n" * 300) for k in range(12)])
    view = build_view(Draft(s))
    p3 = propose_turn_collapse(view, target_tokens=view.total_tokens - 3000, keep_rounds=4, summary_tokens=200,
                               min_batch_tokens=0)
    assert p3.summarize is not None and p3.summarize[0] == 1
    small = p3.summarize[1]
    assert s.transcript[small].role == "user" and s.transcript[small + 1].role == "assistant"
    p3b = propose_turn_collapse(view, target_tokens=0, keep_rounds=4, summary_tokens=200, min_batch_tokens=0)
    assert p3b.summarize is not None and p3b.summarize[1] > small
    assert p3b.summarize[1] == len(s) - 1 - 2 * 4  # the last 4 rounds stay
    p4 = propose_full(view, keep_rounds=2, summary_tokens=200)
    assert p4.summarize == (1, len(s) - 1 - 2 * 2)


def test_l3_with_a_keep_budget_collapses_everything_older_than_it() -> None:
    s = session_with([tool_turn(k, "read_file", f"data {k}\n" * 300) for k in range(12)])
    view = build_view(Draft(s))
    last = len(s) - 1
    round_tokens = view.tokens_between(view.round_ends[-2] + 1, view.round_ends[-1])
    just = propose_turn_collapse(view, target_tokens=view.total_tokens - 3000, keep_rounds=2, summary_tokens=200,
                                 min_batch_tokens=0)
    deep = propose_turn_collapse(view, target_tokens=view.total_tokens - 3000, keep_rounds=2, summary_tokens=200,
                                 min_batch_tokens=0, keep_tokens=3 * round_tokens)
    assert just.summarize is not None and deep.summarize is not None
    assert deep.summarize[1] > just.summarize[1]  # one cache break, a bigger batch
    kept = view.tokens_between(deep.summarize[1] + 1, last)
    assert kept <= 3 * round_tokens  # what stays is within the budget ...
    assert view.tokens_between(view.round_ends[view.round_ends.index(deep.summarize[1]) - 1] + 1, last) \
        > 3 * round_tokens  # ... and the round before the cut would not have fit
    never = propose_turn_collapse(view, target_tokens=0, keep_rounds=4, summary_tokens=200, min_batch_tokens=0,
                                  keep_tokens=0)
    assert never.summarize is not None and never.summarize[1] == last - 2 * 4  # the last rounds always stay


def test_l3_batch_size_never_eats_into_the_recent_budget() -> None:
    """Issue 47: a cold-cache collapse asked for "at least a batch" and cut under the budget the
    agent's look-backs had set. With a budget, the batch is what lies past it; a collapse
    smaller than a batch is proposed as it is, and the economics decide."""
    s = session_with([tool_turn(k, "read_file", f"data {k}\n" * 300) for k in range(12)])
    view = build_view(Draft(s))
    last = len(s) - 1
    keep = view.tokens_between(view.round_ends[-6] + 1, last)  # the newest rounds in tokens
    p = propose_turn_collapse(view, target_tokens=view.total_tokens - 1000, keep_rounds=2, summary_tokens=200,
                              min_batch_tokens=view.total_tokens, keep_tokens=keep)
    assert p.summarize is not None and view.tokens_between(p.summarize[1] + 1, last) <= keep
    assert view.tokens_between(p.summarize[1] + 1, last) > keep // 2  # not cut to the last rounds
    assert p.tokens_removed < view.total_tokens  # less than the batch asked for: the caller decides
    # without a budget, the batch still sets how much goes
    q = propose_turn_collapse(view, target_tokens=view.total_tokens - 1000, keep_rounds=2, summary_tokens=200,
                              min_batch_tokens=view.total_tokens)
    assert q.summarize is not None and q.summarize[1] == last - 2 * 2


def test_l5_drops_whole_rounds_and_keeps_prefix_and_earlier_summary() -> None:
    s = session_with([tool_turn(k, "read_file", f"data {k}\n" * 300) for k in range(10)], prefix=3)
    s.edit(__import__("cachecompact").ReplaceWithSummary(3, 6, "Goal: x\nOpen issues:\n- bug"), level="L3")
    view = build_view(Draft(s))
    p = propose_truncate(view, target_tokens=view.total_tokens // 2)
    e = p.edits[0]
    assert e.start == 7 and s.transcript[e.end].role == "user"
    s.edit(e, level="L5")
    body = s.render().body
    validate_request(body)
    assert body["messages"][0]["content"][0]["text"] == GOAL and "Open issues" in str(body["messages"][3])


# -- summaries ---------------------------------------------------------------------------------------

def test_summary_validation_refuses_garbage_lost_goal_and_lost_issue() -> None:
    with pytest.raises(SummaryRejected):
        parse_summary("not json at all")
    with pytest.raises(SummaryRejected):
        parse_summary({"task_goal": "x"})  # required lists missing
    good = Summary(GOAL, ["read foo.py"], ["bug in parse()"], ["test_x still failing"])
    check_summary(good, GOAL, ["test_x still failing"])
    with pytest.raises(SummaryRejected, match="goal"):
        check_summary(Summary("Refactor the parser", [], [], []), GOAL)
    with pytest.raises(SummaryRejected, match="open issue"):
        check_summary(Summary(GOAL, [], [], []), GOAL, ["test_x still failing"])
    text = format_summary(good)
    assert open_issues_of(text) == ["test_x still failing"]


def test_extractive_summarizer_keeps_goal_and_previous_issues() -> None:
    msgs = [{"role": "assistant", "content": "Reading src/app/main.py"},
            {"role": "user", "content": "ImportError: cannot import name x"}]
    res = ExtractiveSummarizer().summarize(SummaryRequest(msgs, GOAL, ["flaky CI"], (3, 4)))
    assert res.summary.task_goal == GOAL and "flaky CI" in res.summary.open_issues
    assert any("ImportError" in x for x in res.summary.open_issues)
    assert res.cost_usd == 0.0
    # a long line is cut at a space: a reference in it is kept whole or left out, never cut short
    ref = "sp_" + "ab" * 16
    long = [{"role": "user", "content": "Error: " + "word " * 29 + f"see {ref} for the full output"}]
    issues = ExtractiveSummarizer().summarize(SummaryRequest(long, GOAL, [], (3, 3))).summary.open_issues
    assert issues and all(ref in x or "sp_" not in x for x in issues) and all(len(x) <= 164 for x in issues)
    for token, kept in (("/src/" + "d" * 200 + ".py", True), ("/src/" + "d" * 400 + ".py", False)):
        got = ExtractiveSummarizer().summarize(SummaryRequest([{"role": "user", "content": f"Error:{token}"}],
                                                              GOAL, [], (3, 3))).summary.open_issues
        assert any(token in x for x in got) == kept and not any("/src/d" in x and token not in x for x in got)


@pytest.mark.parametrize("mode", ["forced-tool", "prefix-reuse"])
def test_llm_summarizer_through_the_sdk(mode: str) -> None:
    s = Session.create(None, system="You are an agent. " * 300, prefix_messages=1)
    s.sync(history(10))
    with Emulator() as emu:
        client = anthropic.Anthropic(base_url=emu.url, api_key="test", max_retries=0)
        body = s.render(model="claude-sonnet-4-6", max_tokens=100).body
        client.messages.create(**body)  # the agent's request: warms the cache
        summ = LLMSummarizer(client, mode=mode)  # type: ignore[arg-type]
        msgs = s.render().body["messages"][1:9]
        res = summ.summarize(SummaryRequest(msgs, s.messages()[0]["content"], ["toolu_3 output unclear"], (1, 8),
                                            body=body, cache_warm=True))
        last = emu.requests[-1]
    assert res.mode == mode and res.cost_usd > 0
    assert res.summary.task_goal.startswith("Fix the failing test")
    assert "toolu_3 output unclear" in res.summary.open_issues
    if mode == "prefix-reuse":
        assert last["model"] == "claude-sonnet-4-6" and last["usage"]["cache_read_input_tokens"] > 0
    else:
        assert last["model"] == DEFAULT_SUMMARY_MODEL == "claude-haiku-5-5"


def test_in_memory_sessions_keep_the_scratchpad_out_of_the_working_directory(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    sp = Scratchpad.for_session(Session.create(None))
    sp.put("big output")
    assert not sp.path.is_relative_to(tmp_path)
    assert stat.S_IMODE(sp.path.stat().st_mode) == 0o700
    persisted = Session.create(tmp_path / "s")
    ref = Scratchpad.for_session(persisted).put("more output")
    assert (tmp_path / "s" / "scratchpad" / f"{ref}.txt").read_text() == "more output"
    assert list(tmp_path.iterdir()) == [tmp_path / "s"]


def test_a_summary_keeps_the_scratchpad_references_of_what_it_replaces() -> None:
    """An L3/L4 summary lists every scratchpad reference its range showed, with the call that
    produced the output, and carries an earlier summary's list on: otherwise externalized output
    becomes unreachable the moment its placeholder is summarised away."""
    from cachecompact.compaction.strategy import summarize_range
    from cachecompact.compaction.summarize.llm import STORED_HEADER, stored_outputs

    ref_a, ref_b = "sp_" + "a" * 32, "sp_" + "b" * 32
    msgs = history(6)
    msgs[4]["content"][0]["content"] = f"preview...\n[the full output is in the scratchpad as {ref_a}; call ...]"
    s = Session.create(None, system="sys", prefix_messages=3)
    s.sync(msgs)
    call = msgs[3]["content"][-1]
    edit, _ = summarize_range(s, 3, 6, ExtractiveSummarizer(), reason="test")
    assert STORED_HEADER in edit.summary
    assert f"- {ref_a}: {call['name']}(" in edit.summary
    s.edit(edit, level="L3")
    # a later summary over the first one and a newer placeholder keeps both, newest last
    more = history(9)[len(msgs):]
    more[1]["content"][0]["content"] = f"[... the full output is in the scratchpad as {ref_b}; ...]"
    msgs = [*msgs, *more]
    s.sync(msgs)
    edit2, _ = summarize_range(s, 3, len(msgs) - 3, ExtractiveSummarizer(), reason="test")
    lines = [x for x in edit2.summary.splitlines() if x.startswith("- sp_")]
    assert [x[2:37] for x in lines] == [ref_a, ref_b]
    assert stored_outputs([{"role": "user", "content": "no references here"}]) == []


def test_a_summary_keeps_verbatim_the_lines_naming_what_the_agent_used_since() -> None:
    """`working_lines`: of the summarised results, the lines naming an identifier a later call or
    text used, most recently used first within the budget, in transcript order; lines naming
    nothing the agent used are left to the summary."""
    from cachecompact.compaction.levels.working_set import working_lines

    listing = "\n".join(["config_loader.py: def load_config(path):", "unrelated_helper.py: def spare():",
                         "MAX_RETRIES = 7", "a plain line of prose"])
    turns = [tool_turn(0, "grep", listing, {"pattern": "def"}),
             tool_turn(1, "read_file", "body", {"path": "config_loader.py"}),  # uses config_loader.py
             [{"role": "assistant", "content": "MAX_RETRIES is the limit I will raise."},
              {"role": "user", "content": "go on"}],
             tool_turn(2, "read_file", "x", {"path": "other.py"})]
    s = session_with(turns)
    assert working_lines(Draft(s), 1, 2, 1_000) == ["config_loader.py: def load_config(path):", "MAX_RETRIES = 7"]
    # the newest use wins the budget (MAX_RETRIES was used last); no budget, nothing
    assert working_lines(Draft(s), 1, 2, len("MAX_RETRIES = 7") + 1) == ["MAX_RETRIES = 7"]
    assert working_lines(Draft(s), 1, 2, 0) == []
    # the compactor's summaries carry them under their header
    from cachecompact.compaction.levels.working_set import WORKING_SET_HEADER
    from cachecompact.compaction.strategy import summarize_range

    edit, _ = summarize_range(s, 1, 6, ExtractiveSummarizer(), reason="test",
                              verbatim=working_lines(Draft(s), 1, 6, 1_000))
    assert f"{WORKING_SET_HEADER}\nconfig_loader.py: def load_config(path):\nMAX_RETRIES = 7" in (edit.summary or "")
