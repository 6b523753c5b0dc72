"""Giving back what the agent reached for: hidden lines its newest calls name return beside their results."""

from __future__ import annotations

from typing import Any

import anthropic

import cachecompact
from cachecompact import Session
from cachecompact.compaction._lookback import LookbackMeter
from cachecompact.compaction._restore import RESTORE_HEADER, RESTORE_LEVEL, restore_edits
from cachecompact.compaction.cache_aware import CacheAwareCompactor
from cachecompact.history.draft import Draft
from cachecompact.history.ledger import ReplaceWithSummary
from cachecompact.tools.emulator import CLOCK_HEADER, Emulator, ScriptedResponder
from cachecompact.tools.emulator.responders import Reply

from .test_levels import GOAL, tool_turn
from .test_policy import _grow, cfg

SETTING = "    apply_retry_limit(17)"  # an ordinary line: no placeholder or summary keeps it


def _reads(n: int) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [{"role": "user", "content": GOAL}]
    msgs += tool_turn(0, "read", "\n".join([SETTING, *(f"line {k} of config.py" for k in range(300))]),
                      {"path": "config.py"})
    for k in range(1, n):
        msgs += tool_turn(k, "read", "\n".join(f"other_{k} line {j}" for j in range(300)), {"path": f"f{k}.py"})
    return msgs


def _collapsed(msgs: list[dict[str, Any]]) -> Session:
    """The reads, with the first ones collapsed into a summary that keeps no line of config.py."""
    s = Session.create(None, prefix_messages=1)
    s.sync(msgs)
    s.edit(ReplaceWithSummary(1, 6, "[summary: read config.py and two other files]", "test"), level="L3")
    return s


def _plan(s: Session, budget: int = 3_000) -> list[ReplaceWithSummary]:
    m = LookbackMeter(300)
    m.observe(Draft(s))
    return restore_edits(Draft(s), m, budget)


def test_a_call_naming_hidden_output_gets_its_line_back_in_its_own_result() -> None:
    msgs = _reads(6)
    s = _collapsed(msgs)
    since = len(msgs)
    msgs += tool_turn(50, "edit", "The file config.py has been updated.",
                      {"path": "config.py", "old": "apply_retry_limit"})
    s.sync(msgs)
    edits = _plan(s)
    assert len(edits) == 1
    e = edits[0]
    assert (e.start, e.end, e.tool_use_id) == (since + 1, since + 1, "toolu_50")  # the result never sent yet
    assert e.summary is not None and e.summary.startswith("The file config.py has been updated.")
    assert RESTORE_HEADER in e.summary and SETTING.strip() in e.summary
    entry = s.edit(e, level=RESTORE_LEVEL)
    assert SETTING.strip() in str(s.render().body["messages"][-1])
    assert s.transcript[since + 1] is not None  # the transcript keeps the original result
    assert "apply_retry_limit" not in str(s.messages()[since + 1])
    # the next call naming it finds the line given back: nothing more is added
    msgs += tool_turn(51, "edit", "ok", {"path": "config.py", "old": "apply_retry_limit"})
    s.sync(msgs)
    assert _plan(s) == [] and entry.level == RESTORE_LEVEL


def test_nothing_comes_back_when_the_line_is_in_view_or_was_never_there() -> None:
    msgs = _reads(6)
    s = Session.create(None, prefix_messages=1)
    s.sync(msgs)
    s.edit(ReplaceWithSummary(5, 10, "[summary of three other reads]", "test"), level="L3")
    s.sync([*msgs, *tool_turn(50, "edit", "ok", {"old": "apply_retry_limit"})])
    assert _plan(s) == []  # config.py's read is in view: the summary covers other reads
    s2 = _collapsed(msgs)
    s2.sync([*msgs, *tool_turn(51, "edit", "ok", {"old": "NEVER_SHOWN_ANYWHERE"})])
    assert _plan(s2) == []
    s3 = Session.create(None, prefix_messages=1)  # compacted, but the summary kept the line verbatim
    s3.sync(msgs)
    s3.edit(ReplaceWithSummary(1, 6, f"[summary]\n{SETTING.strip()}", "test"), level="L3")
    s3.sync([*msgs, *tool_turn(52, "edit", "ok", {"old": "apply_retry_limit"})])
    assert _plan(s3) == []
    s4 = _collapsed(msgs)  # the call's own result shows it again: nothing to give back
    s4.sync([*msgs, *tool_turn(53, "grep", f"config.py:1:{SETTING}", {"pattern": "apply_retry_limit"})])
    assert _plan(s4) == []
    s5 = _collapsed(msgs)  # the same call with a result that does not show it: the line comes back
    s5.sync([*msgs, *tool_turn(54, "grep", "no match", {"pattern": "apply_retry_limit"})])
    assert len(_plan(s5)) == 1


def test_a_brought_history_gets_nothing_back_on_its_first_request() -> None:
    """The calls a caller brings were made from its own, uncompacted history: an edit made on
    this request hid nothing from them."""
    msgs = [*_reads(6), *tool_turn(50, "edit", "ok", {"old": "apply_retry_limit"})]
    s = Session.create(None, prefix_messages=1)
    s.sync(msgs)
    s.edit(ReplaceWithSummary(1, 6, "[summary]", "test"), level="L3")  # made now, after every call
    assert _plan(s) == []


def test_a_result_with_lines_given_back_can_still_be_cleared() -> None:
    """What was given back adds to a result; L1 and L2 may clear it later like any other."""
    from cachecompact.compaction.levels import build_view

    msgs = _reads(6)
    s = _collapsed(msgs)
    msgs += tool_turn(50, "read", "\n".join(f"big line {k}" for k in range(400)),
                      {"path": "config.py", "old": "apply_retry_limit"})
    s.sync(msgs)
    (edit,) = _plan(s)
    s.edit(edit, level=RESTORE_LEVEL)
    (r,) = [x for x in build_view(Draft(s)).results if x.tool_use_id == "toolu_50"]
    assert not r.edited and r.visible


def test_what_comes_back_is_bounded_per_turn_and_skips_results_with_media() -> None:
    msgs = _reads(6)
    s = _collapsed(msgs)
    since = len(msgs)
    msgs += tool_turn(50, "edit", "ok", {"old": "apply_retry_limit"})
    s.sync(msgs)
    assert _plan(s, budget=10) == []  # the line does not fit
    image = [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]
    msgs2 = msgs[:since] + tool_turn(52, "shot", image, {"old": "apply_retry_limit"})
    s2 = _collapsed(msgs2[:since])
    s2.sync(msgs2)
    assert _plan(s2) == []


def test_the_compactor_gives_lines_back_without_touching_what_was_sent() -> None:
    """Compaction hides config.py; the agent then edits it: its line comes back, appended to
    the new result, and every block the previous request sent is unchanged."""
    msgs = _reads(40)
    s = Session.create(None, prefix_messages=1)
    c = CacheAwareCompactor.for_session(s, cfg(30_000))
    events = _grow(s, c, [msgs[i:i + 2] for i in range(1, len(msgs), 2)])
    assert any(e.kind == "compaction" for e in events)
    before = s.render(model="claude-sonnet-4-6", max_tokens=1000)
    assert SETTING.strip() not in str(before.body)
    events = _grow(s, c, [tool_turn(90, "edit", "ok", {"path": "config.py", "old": "apply_retry_limit"})], t0=1_000.0)
    given = [e for e in events if e.kind == "restored"]
    assert len(given) == 1 and given[0].level == RESTORE_LEVEL
    after = s.render(model="claude-sonnet-4-6", max_tokens=1000)
    assert SETTING.strip() in str(after.body["messages"][-1])
    entry = s.ledger.entries[given[0].entries[0]]
    assert entry.start == entry.end == len(s) - 1  # the line goes with the new result, nowhere else
    if any(e.kind == "compaction" for e in events):
        return  # the same turn also compacted (its own deliberate re-write): the restore is shown above
    def bare(m: Any) -> Any:  # a block as the cache keys it: breakpoints move from request to request
        if isinstance(m, dict):
            return {k: bare(v) for k, v in m.items() if k != "cache_control"}
        return [bare(x) for x in m] if isinstance(m, list) else m

    sent = bare(before.body["messages"])
    assert bare(after.body["messages"])[:len(sent)] == sent  # nothing already sent changed


def test_through_the_sdk_the_request_after_the_call_carries_the_line() -> None:
    """wrap() against the emulator: a scripted agent reads many files at a small window, then
    edits the first; the request after that edit shows its setting line again."""
    seen: list[str] = []

    def model(body: dict[str, Any]) -> Reply:
        n = sum(1 for m in body["messages"] if m["role"] == "assistant")
        seen.append(str(body["messages"]))
        return Reply([{"type": "text", "text": "ok"}], "end_turn") if n > 60 else Reply([{"type": "text", "text": "."}],
                                                                                         "end_turn")

    with Emulator(ScriptedResponder(model), context_window=30_000) as emu:
        client = cachecompact.wrap(anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0), store=None,
                                   window_tokens=30_000, summarizer=None)
        history = _reads(40)[:1]  # config.py is read after the immutable prefix (the first three messages)
        turns = [tool_turn(99, "read", "the readme", {"path": "README"})] + \
            [_reads(40)[i:i + 2] for i in range(1, 81, 2)] + \
            [tool_turn(90, "edit", "ok", {"path": "config.py", "old": "apply_retry_limit"})]
        for k, t in enumerate(turns):
            history = history + t
            client.messages.create(model="claude-sonnet-4-6", max_tokens=1000, messages=history,
                                   extra_headers={CLOCK_HEADER: str(1_000.0 + 10 * k)})
    assert SETTING.strip() not in seen[-2]  # compacted away before the edit
    assert SETTING.strip() in seen[-1]  # and back beside the edit's result
