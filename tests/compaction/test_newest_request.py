"""The person's newest request is never lost (issue 62).

A summary kept only the first user text as the goal, which for Claude Code is a
``<system-reminder>``; collapses, L5 and the API-written summary's range put the person's newest
message inside what they removed while the agent's tool loop ran, and the agent went back to an
older task, or had none. Now what a person wrote is told from what a client injected
(`base.person`), L5 never drops the newest request, and every summary that covers it carries it
word for word (ours by construction; the API's through its instructions, checked on return).

The closed loop here is the issue's scripted model: it answers prompt K ("run S steps of L
lines") with S tool calls and then "done K", taking the task from the newest prompt it can see,
and answers "LOST" when none is left."""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

import anthropic
import pytest

import cachecompact
from cachecompact.base.person import latest_person_message, person_text
from cachecompact.compaction.levels.l5_truncate import propose_truncate
from cachecompact.compaction.levels.view import build_view
from cachecompact.compaction.policy import LevelSettings, PolicyConfig
from cachecompact.compaction.strategy import latest_request, summarize_range, task_goal
from cachecompact.compaction.summarize import api_compaction
from cachecompact.compaction.summarize.llm import LATEST_REQUEST_HEADER, ExtractiveSummarizer
from cachecompact.history.draft import Draft
from cachecompact.history.session import Session
from cachecompact.tools.emulator import Emulator, ScriptedResponder, SummarizingResponder
from cachecompact.tools.emulator.responders import Reply

REMINDER = ("<system-reminder>\nWhen you commit, add the attribution line. This reminder is from the client, "
            "not the person.\n</system-reminder>")
TOOLS = [{"name": "Bash", "description": "Run a command.",
          "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}]
_PROMPT = re.compile(r"prompt (\d+): run (\d+) steps of (\d+) lines")


def _prompt(k: int, steps: int, lines: int) -> dict[str, Any]:
    """A person's prompt as Claude Code sends it: a client reminder block, then the person's words."""
    return {"role": "user", "content": [{"type": "text", "text": REMINDER},
                                        {"type": "text", "text": f"prompt {k}: run {steps} steps of {lines} lines"}]}


def test_person_text_leaves_out_what_a_client_injected() -> None:
    assert person_text(_prompt(2, 3, 4)) == "prompt 2: run 3 steps of 4 lines"
    assert person_text({"role": "user", "content": REMINDER}) == ""
    assert person_text({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "x"},
                                                    {"type": "text", "text": "beside a result"}]}) == ""
    assert person_text({"role": "assistant", "content": "prompt 9"}) == ""
    assert person_text({"role": "user", "content": "[cachecompact summary of messages 3-9 ...]"}) == ""
    assert person_text({"role": "user", "content": "a <system-reminder>cut off"}) == "a"
    msgs = [_prompt(0, 1, 1), {"role": "assistant", "content": "ok"}, _prompt(1, 1, 1)]
    assert latest_person_message(msgs) == (2, "prompt 1: run 1 steps of 1 lines")


def _loop_session(prompts: int, steps: int, lines: int) -> Session:
    """A Claude Code-like history: each prompt, ``steps`` tool rounds, then "done K"."""
    s = Session.create(None, tools=TOOLS)
    msgs: list[dict[str, Any]] = []
    n = itertools.count()
    for k in range(prompts):
        msgs.append(_prompt(k, steps, lines))
        for j in range(steps):
            i = next(n)
            msgs += [{"role": "assistant", "content": [{"type": "tool_use", "id": f"toolu_{i:04d}", "name": "Bash",
                                                        "input": {"command": f"step {k}.{j}"}}]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{i:04d}",
                                                   "content": "\n".join(f"line {k}.{j}.{x}" for x in range(lines))}]}]
        if k < prompts - 1:
            msgs.append({"role": "assistant", "content": f"done {k}"})
    s.sync(msgs)
    return s


def test_the_goal_is_the_persons_words_and_the_latest_request_the_newest() -> None:
    s = _loop_session(3, 4, 50)
    assert task_goal(Draft(s)) == "prompt 0: run 4 steps of 50 lines"  # not the client's reminder
    found = latest_request(Draft(s))
    assert found is not None and found[1] == "prompt 2: run 4 steps of 50 lines"
    assert latest_request(Draft(_loop_session(1, 4, 50))) is None  # the goal itself is no second request


def test_l5_never_drops_the_newest_request() -> None:
    s = _loop_session(3, 8, 200)
    k, text = latest_request(Draft(s)) or (-1, "")
    view = build_view(Draft(s))
    p = propose_truncate(view, target_tokens=view.total_tokens // 5, keep=k)
    assert p.edits and p.tokens_removed > 0
    assert not any(e.start <= k <= e.end for e in p.edits), [(e.start, e.end) for e in p.edits]
    assert any(e.end > k for e in p.edits)  # it dropped rounds of the loop after the request too
    for e in p.edits:
        Draft(s).stage(e, level="L5")
    body = json.dumps(s.render(model="claude-sonnet-4-6", max_tokens=100).body["messages"])
    assert text in body


def test_a_second_l5_cut_around_the_newest_request_drops_nothing_twice() -> None:
    """A second L5 cut that reaches past the person's newest request splits around it again; the
    part before it that the first cut already dropped is not dropped a second time (Claude Code at
    40k: every later L5 logged a 0-token skip of the same range, an edit that changed nothing)."""
    s = _loop_session(2, 8, 200)
    k, _ = latest_request(Draft(s)) or (-1, "")
    view = build_view(Draft(s))
    first = propose_truncate(view, target_tokens=view.total_tokens - view.tokens_between(3, k - 2), keep=k)
    assert [(e.start, e.end) for e in first.edits] == [(3, k - 2)]
    Draft(s).stage(first.edits[0], level="L5")
    view = build_view(Draft(s))
    again = propose_truncate(view, target_tokens=view.total_tokens // 3, keep=k)
    assert again.edits and again.tokens_removed > 0
    assert all(view.tokens_between(e.start, e.end) > 0 for e in again.edits), \
        [(e.start, e.end, view.tokens_between(e.start, e.end)) for e in again.edits]
    assert not any(e.start <= k <= e.end for e in again.edits)


def test_our_summary_that_covers_the_newest_request_quotes_it() -> None:
    s = _loop_session(3, 6, 100)
    k, text = latest_request(Draft(s)) or (-1, "")
    edit, res = summarize_range(Draft(s), 3, len(s) - 3, ExtractiveSummarizer(), reason="test")
    assert edit.start <= k <= edit.end
    assert f"{LATEST_REQUEST_HEADER}\n{text}" in (edit.summary or "") and res.summary.latest_request == text
    assert "Goal: prompt 0: run 6 steps of 100 lines" in (edit.summary or "")


def test_an_api_summary_that_does_not_quote_the_requests_is_refused() -> None:
    """The API-written summary stands in for the first messages too (it must come first): its
    instructions ask for the person's first request and their newest word for word, and a block
    that leaves either out is refused (issues 56 and 62)."""
    V = api_compaction.Verbatim
    keep = V(goal="prompt 0: run 8 steps", latest="prompt 4: run 3 steps of 9 lines")
    ask = api_compaction.instructions_keeping(keep)
    assert "prompt 0: run 8 steps" in ask and "prompt 4: run 3 steps of 9 lines" in ask
    assert len(ask) <= api_compaction.MAX_INSTRUCTIONS and "Do not call any tool" in ask
    both = ("<summary>Original request:\nprompt 0: run 8  steps\nLatest request:\n prompt 4: run 3\n"
            "steps of 9 lines</summary>")
    assert api_compaction.kept_verbatim(keep, both)
    assert not api_compaction.kept_verbatim(keep, "<summary>Task: prompt 0: run 8 steps</summary>")
    assert not api_compaction.kept_verbatim(keep, "<summary>Latest: prompt 4: run 3 steps of 9 lines</summary>")
    assert api_compaction.kept_verbatim(V(goal="the task"), "<summary>Task: the task</summary>")
    huge = V(goal="g " * 20_000, latest="x " * 20_000)
    assert len(api_compaction.instructions_keeping(huge)) <= api_compaction.MAX_INSTRUCTIONS
    assert not V()  # nothing to quote: the API's own prompt


def _model() -> Any:
    """The issue's scripted model: the newest prompt it can see, the steps of it it can see done."""
    ids = itertools.count(1)

    def respond(body: dict[str, Any]) -> Reply:
        text = json.dumps(body["messages"])
        seen = _PROMPT.findall(text)  # wherever it shows: a message, or a summary (ours, or the API's block)
        if not seen:
            return Reply([{"type": "text", "text": "LOST"}])
        k, steps, lines = (int(x) for x in seen[-1])
        done = {int(x) for x in re.findall(rf"line {k}\.(\d+)\.0\b", text)}
        n = max(done) + 1 if done else 0
        if n >= steps:
            return Reply([{"type": "text", "text": f"done {k}"}])
        i = next(ids)
        return Reply([{"type": "tool_use", "id": f"toolu_{i:05d}", "name": "Bash",
                       "input": {"command": f"emit {k} {n} {lines}"}}], "tool_use")
    return respond


def _client_run(client: Any, model: str, prompts: int, steps: int, lines: int) -> list[str]:
    msgs: list[dict[str, Any]] = []
    answers = []
    for k in range(prompts):
        msgs.append(_prompt(k, steps, lines))
        for _ in range(steps * 3):
            r = client.messages.create(model=model, max_tokens=4000, tools=TOOLS, messages=msgs)
            content = [b.model_dump(exclude_none=True) for b in r.content]
            msgs.append({"role": "assistant", "content": content})
            use = next((b for b in content if b["type"] == "tool_use"), None)
            if use is None:
                answers.append(" ".join(b["text"] for b in content if b["type"] == "text"))
                break
            kk, n, ln = use["input"]["command"].split()[1:]
            msgs.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"], "content":
                                                      "\n".join(f"line {kk}.{n}.{x} of the output" for x in
                                                                range(int(ln)))}]})
        else:
            answers.append("no answer")
    return answers


@pytest.mark.parametrize(("model", "api"), [("claude-opus-5-5", True), ("claude-opus-5-5", False),
                                            ("claude-sonnet-4-6", False)])
def test_every_prompt_is_answered_as_its_own_through_compaction(model: str, api: bool) -> None:
    """Six prompts of long tool loops in a small window: compaction runs inside the loops, and
    every prompt is still answered as its own."""
    events: list[Any] = []
    with Emulator(SummarizingResponder(ScriptedResponder(_model())), context_window=40_000) as emu:
        client = cachecompact.wrap(anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0), store=None,
                                   window_tokens=40_000, on_event=events.append,
                                   config=PolicyConfig(levels=LevelSettings(api_summaries=api)))
        answers = _client_run(client, model, 6, 8, 250)
    compactions = [e for e in events if e.kind == "compaction"]
    assert len(compactions) >= 3, [(e.level, e.reason[:60]) for e in compactions]
    assert answers == [f"done {k}" for k in range(6)], answers
    (session,) = cachecompact.wrapped_sessions(client)
    blocks = [e for e in session.ledger.entries if e.kind == "compaction"]
    assert bool(blocks) == api  # the API wrote them where it may, else ours
    # each API-written block stands in for the first messages, and quotes the task word for word (issue 56)
    assert all("prompt 0: run 8 steps of 250 lines" in (e.summary or "") for e in blocks)


def test_a_pasted_request_is_quoted_as_far_as_a_summary_should() -> None:
    """A newest "request" that is a 60,000-word paste is quoted by its first 300 words and how much
    was left out: a summary as big as what it replaces would save nothing (L5 keeps it whole)."""
    from cachecompact.compaction.summarize.extractive import GOAL_WORDS, request_head

    short = "prompt 1: run 2 steps of 3 lines"
    assert request_head(short) == short
    head = request_head("log " + "entry " * 60_000)
    assert head.startswith("log entry") and "59701 more words of this request" in head
    assert len(head.split()) < GOAL_WORDS + 20
