"""The policy has the API write its L3/L4 summaries (issue 48): in the background as the recipe
says, on the conversation's own model, with the kept turns verbatim; our own summaries where the
model is not on the list or the API refuses. Through wrap() and the real SDK against the emulator,
which checks every block and bills every call."""

from __future__ import annotations

import copy
import itertools
from typing import Any

import anthropic
import pytest

import cachecompact
from cachecompact.compaction.policy import LevelSettings, PolicyConfig
from cachecompact.compaction.summarize import api_compaction
from cachecompact.tools.emulator import Emulator, ScriptedResponder, SummarizingResponder
from cachecompact.tools.emulator.responders import Reply

TOOLS = [{"name": "read", "description": "Read a file.",
          "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}]
WINDOW = 60_000


def _agent(turns: int, model: str, emu: Emulator, thinking: bool = False,
           **kw: Any) -> tuple[Any, list[list[dict[str, Any]]]]:
    """A reader: a file a turn, a person's turn every sixth; returns the client and every history
    sent. The API writes every summary it may (``api_summaries=True``: these tests are of how it
    writes them) unless ``config`` says otherwise."""
    kw.setdefault("config", PolicyConfig(levels=LevelSettings(api_summaries=True)))
    client = cachecompact.wrap(anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0), store=None,
                               window_tokens=WINDOW, **kw)
    more: dict[str, Any] = {"thinking": {"type": "adaptive"}} if thinking else {}
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "Audit the project."}]
    sent: list[list[dict[str, Any]]] = []
    for k in range(turns):
        sent.append(copy.deepcopy(msgs))
        r = client.messages.create(model=model, max_tokens=2000, system="You audit code. " * 100, tools=TOOLS,
                                   messages=msgs, **more)
        content = [b.model_dump(exclude_none=True) for b in r.content]
        msgs.append({"role": "assistant", "content": content})
        use = next((b for b in content if b["type"] == "tool_use"), None)
        if use is None:
            msgs.append({"role": "user", "content": f"Next part {k}."})
        else:
            msgs.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"],
                                                      "content": f"# {use['input']}\n" + "x = f(1)\n" * 500}]})
    return client, sent


def _reader(seen: list[dict[str, Any]] | None = None, think: int = 0) -> ScriptedResponder:
    """The reader's model; with thinking on and ``think``, each turn thinks that many tokens first
    (a display-omitted block, as a model with preserved thinking sends it)."""
    n = itertools.count(1)

    def answer(body: dict[str, Any]) -> Reply:
        if seen is not None:
            seen.append(copy.deepcopy(body))
        k = next(n)
        thought = [{"type": "thinking", "thinking": ""}] if think and body.get("thinking") else []
        tokens = [think] if thought else None
        if k % 6 == 0:
            return Reply([*thought, {"type": "text", "text": f"part {k // 6} done"}], thinking_tokens=tokens)
        return Reply([*thought, {"type": "tool_use", "id": f"toolu_{k:05d}", "name": "read",
                                 "input": {"path": f"m{k}.py"}}], "tool_use", thinking_tokens=tokens)
    return ScriptedResponder(answer)


def _opens_with_block(body: dict[str, Any]) -> bool:
    c = body["messages"][0]["content"]
    return isinstance(c, list) and c[0]["type"] == "compaction"


def _plain(m: dict[str, Any]) -> dict[str, Any]:
    """A message without cache markers, its content as blocks (how the request compares to the caller's)."""
    c = m["content"]
    blocks = [{"type": "text", "text": c}] if isinstance(c, str) else c
    return {"role": m["role"], "content": [{k: v for k, v in b.items() if k != "cache_control"} for b in blocks]}


def test_the_api_writes_the_summary_in_the_background_on_the_conversations_model() -> None:
    model = "claude-opus-5-5"
    seen: list[dict[str, Any]] = []
    with Emulator(SummarizingResponder(_reader(seen))) as emu:
        client, sent = _agent(40, model, emu)
        log = [r for r in emu.requests if r.get("status") == 200]
        refusals = list(emu.core.refusals)
    assert refusals == []
    (s,) = cachecompact.wrapped_sessions(client)
    api = [e for e in s.ledger.entries if e.kind == "compaction"]
    assert api and all(e.kind != "summary" for e in s.ledger.entries)
    internal = [k for k, r in enumerate(log) if r["internal"]]
    assert internal and all(log[k]["model"] == model for k in internal)  # the conversation's own model
    assert all(log[k]["usage"]["iterations"][0]["type"] == "compaction" for k in internal)
    # the compaction request reads the history up to the cut where an earlier request left it warm (here the
    # request that ended at the cut, seconds before): nothing of it is written again
    steps = [log[k]["usage"]["iterations"][0] for k in internal]
    assert all(int(x.get("cache_creation_input_tokens") or 0) == 0 for x in steps), steps
    assert all(int(x.get("cache_read_input_tokens") or 0) > 0 for x in steps), steps
    # in the background: each call follows the response of the agent request that asked for it, and the
    # agent's next request carries the block
    for k in internal:
        assert 0 < k < len(log) - 1 and not log[k - 1]["internal"] and not log[k + 1]["internal"]
    first = next(j for j, b in enumerate(seen) if _opens_with_block(b))
    assert not _opens_with_block(seen[first - 1])  # the request that asked went whole
    e = api[0]
    kept = [_plain(m) for m in seen[first]["messages"][1:]]
    assert kept == [_plain(m) for m in sent[first][e.end + 1:]]  # the caller's turns after the range, verbatim
    # every entry starts at message 0, ends on a user message, and the kept turns start with the assistant
    for e in api:
        assert e.start == 0 and s.transcript[e.end].role == "user" and s.transcript[e.end + 1].role == "assistant"


def _priced_run(thinking: bool) -> tuple[Any, list[Any]]:
    """The reader through wrap() at the default writer choice; with ``thinking``, 2,000 tokens of
    thinking a turn (Opus at adaptive effort on a tool loop: a few hundred to a few thousand)."""
    events: list[Any] = []
    with Emulator(SummarizingResponder(_reader(think=2_000 if thinking else 0))) as emu:
        client, _ = _agent(40, "claude-opus-5-5", emu, thinking=thinking, on_event=events.append,
                           config=PolicyConfig())  # the default: the writer chosen by price
    (s,) = cachecompact.wrapped_sessions(client)
    return s, [e for e in events if e.kind in ("compaction", "compaction_requested", "deferred") and e.detail
               and "writers" in e.detail]


def test_without_thinking_to_keep_our_summary_is_written() -> None:
    """Issue 63: on a model the API may summarize for, with no thinking to keep valid, the API's
    summary buys nothing: it reads the whole request on the conversation's model, ours reads the
    range on a small one. The writer is chosen by price, and each decision says both prices."""
    s, weighed = _priced_run(thinking=False)
    kinds = {e.kind for e in s.ledger.entries if e.level in ("L3", "L4")}
    assert kinds == {"summary"}, kinds
    assert weighed, "no summary was priced"
    for e in weighed:
        w = e.detail["writers"]
        assert e.detail["writer"] == "ours" and w["ours_usd"] + w["reasoning_lost_usd"] < w["api_usd"], w


def test_with_thinking_to_keep_the_api_writes_where_it_pays() -> None:
    """The same agent thinking before each call: our summary would throw away the reasoning of the
    task under way (the API's keeps it valid), and where that costs more than the price gap, the
    API writes it; each decision is the cheaper of the two as priced."""
    s, weighed = _priced_run(thinking=True)
    assert weighed, "no summary was priced"
    for e in weighed:
        w = e.detail["writers"]
        api = w["api_usd"] < w["ours_usd"] + w["reasoning_lost_usd"]
        assert e.detail["writer"] == ("api" if api else "ours"), w
    assert any(e.detail["writer"] == "api" for e in weighed), [e.detail["writers"] for e in weighed]
    assert any(e.kind == "compaction" for e in s.ledger.entries)


def test_a_model_off_the_list_gets_our_own_summary() -> None:
    with Emulator(SummarizingResponder(_reader())) as emu:
        client, _ = _agent(40, "claude-haiku-4-5", emu)
        log = [r for r in emu.requests if r.get("status") == 200]
    (s,) = cachecompact.wrapped_sessions(client)
    kinds = {e.kind for e in s.ledger.entries if e.level in ("L3", "L4")}
    assert kinds == {"summary"}, kinds
    assert not any("iterations" in r["usage"] for r in log if r["internal"])


def test_a_refusal_turns_api_summaries_off_for_the_session(monkeypatch: pytest.MonkeyPatch) -> None:
    """A client whose list is ahead of the API (it names a model the API refuses): the first
    compaction request is a 400, counted as a failed summary, and our own summaries follow."""
    monkeypatch.setattr(api_compaction, "ONDEMAND_COMPACTION_MODELS",
                        api_compaction.ONDEMAND_COMPACTION_MODELS | {"claude-haiku-4-5"})
    events: list[Any] = []
    with Emulator(SummarizingResponder(_reader())) as emu:
        client, _ = _agent(40, "claude-haiku-4-5", emu, on_event=events.append)
    refused = [e for e in events if e.kind == "failure" and "compaction is not supported" in e.reason]
    (s,) = cachecompact.wrapped_sessions(client)
    assert len(refused) == 1, [e.reason for e in events]  # asked once, then never again for this session
    assert {e.kind for e in s.ledger.entries if e.level in ("L3", "L4")} == {"summary"}


def test_a_failed_api_summary_is_followed_by_ours_never_by_dropped_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 62: a failed API-written summary falls back to our own summary, never to L5 while a
    summary fits. Here every compaction request is refused (a model the API does not list)."""
    monkeypatch.setattr(api_compaction, "ONDEMAND_COMPACTION_MODELS",
                        api_compaction.ONDEMAND_COMPACTION_MODELS | {"claude-haiku-4-5"})
    events: list[Any] = []
    with Emulator(SummarizingResponder(_reader())) as emu:
        _agent(40, "claude-haiku-4-5", emu, on_event=events.append)
    assert any(e.kind == "failure" and "API-written summary" in e.reason for e in events)
    done = [e for e in events if e.kind == "compaction"]
    assert done and not any(e.level == "L5" for e in done), [(e.level, e.reason[:80]) for e in done]


@pytest.mark.parametrize(("caller", "window", "tokens", "thinking", "expected"), [
    (128_000, 1_000_000, 150_000, None, 128_000),  # fits: the caller's own, as the docs say the call uses
    (128_000, 200_000, 150_000, None, 50_000),  # lowered to what the window leaves beside the input
    (128_000, 200_000, 195_000, None, api_compaction.COMPACTION_MIN_OUTPUT),  # never below several thousand
    (2_000, 200_000, 195_000, None, 2_000),  # the caller asked for less: theirs
    (128_000, 200_000, 195_000, {"type": "enabled", "budget_tokens": 10_000},
     10_000 + api_compaction.COMPACTION_MIN_OUTPUT),  # max_tokens must exceed a thinking budget
    (0, None, 10, None, api_compaction.COMPACTION_MIN_OUTPUT),  # nothing given: several thousand
])
def test_the_compaction_requests_max_tokens(caller: int, window: int | None, tokens: int, thinking: Any,
                                            expected: int) -> None:
    assert api_compaction.compaction_max_tokens(caller, window, tokens, thinking) == expected


def test_a_compaction_request_that_binds_thinking_carries_its_beta() -> None:
    """Issue 56: the render asks ``thinking.block_binding`` (drop_block) for thinking an edit
    invalidated; the compaction request carried it with only the compaction beta, and the API
    refused it ("Extra inputs are not permitted"), so the summary fell to dropped rounds."""
    body = {"model": "claude-opus-5-5", "max_tokens": 8000,
            "thinking": {"type": "adaptive", "block_binding": {"prefix_mismatch_behavior": "drop_block"}},
            "messages": [{"role": "user", "content": "Audit the project. " * 50},
                         {"role": "assistant", "content": "Reading it."},
                         {"role": "user", "content": "Go on. " * 50}]}
    with Emulator(SummarizingResponder(_reader())) as emu:
        client = anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0)
        res = api_compaction.call_ondemand(client, body)
        refusals = list(emu.core.refusals)
    assert res.content and res.signature and refusals == []
