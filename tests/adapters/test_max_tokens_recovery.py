"""Compact mode never turns a request the upstream would take into a refusal (issue 62).

Claude Code sends ``max_tokens`` 128,000 whatever the window; the API answers "input length and
`max_tokens` exceed context limit: N + K > M", and Claude Code retries with a lower
``max_tokens`` (anthropic-cache-facts.md, addendum 2026-12-06). The compact proxy used to refuse
such a request itself ("context is full") before the API saw it, or replace the API's 400 with
its own, so the client could not recover. Here a client that recovers the way Claude Code does
runs through both proxy modes against the emulator, which bills and refuses as the API does."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path
from typing import Any

import anthropic
import pytest

from cachecompact import EngineOptions
from cachecompact.adapters.proxy import Proxy, ProxyConfig
from cachecompact.base.errors import ConfigError
from cachecompact.tools.emulator import Emulator, ScriptedResponder, SummarizingResponder
from cachecompact.tools.emulator.responders import Reply

MODEL = "claude-sonnet-4-6"
WINDOW = 40_000
TOOLS = [{"name": "bash", "description": "Run a command.",
          "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}]
_LIMIT = re.compile(r"input length and `max_tokens` exceed context limit: (\d+) \+ (\d+) > (\d+)")


_IDS = itertools.count(1)


def _bash(body: dict[str, Any]) -> Reply:
    n = next(_IDS)  # ids unique across the run: a compacted history is shorter than the caller's
    return Reply([{"type": "tool_use", "id": f"toolu_{n:05d}", "name": "bash", "input": {"command": f"step {n}"}}],
                 "tool_use")


def _recovering_client(url: str, turns: int, first: str) -> tuple[int, list[str]]:
    """A client at Claude Code's default ``max_tokens`` that lowers it on the API's own 400, as
    Claude Code does; the recoveries it made, and every other 400's message."""
    client = anthropic.Anthropic(base_url=url, api_key="k", max_retries=0)
    msgs: list[dict[str, Any]] = [{"role": "user", "content": first}]
    recovered, others = 0, []
    for _ in range(turns):
        max_tokens = 128_000
        for _attempt in range(3):
            try:
                with client.messages.stream(model=MODEL, max_tokens=max_tokens, tools=TOOLS,
                                            messages=msgs) as s:
                    r = s.get_final_message()
                break
            except anthropic.BadRequestError as err:
                m = _LIMIT.search(str(err.message))
                if m is None:
                    others.append(str(err.message))
                    return recovered, others
                n, _k, limit = (int(x) for x in m.groups())
                max_tokens = max(1, limit - n - 1_000)
                recovered += 1
        else:
            others.append("no recovery in 3 tries")
            return recovered, others
        content = [b.model_dump(exclude_none=True) for b in r.content]
        use = next(b for b in content if b["type"] == "tool_use")
        msgs += [{"role": "assistant", "content": content},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"],
                                               "content": f"output of {use['input']['command']}\n" + "ok 1\n" * 400}]}]
    return recovered, others


@pytest.mark.parametrize("mode", ["observe", "compact"])
def test_a_client_that_lowers_max_tokens_on_the_apis_400_recovers_through_the_proxy(mode: str) -> None:
    """The prompt fits the window; only 128,000 of output does not. Both modes send it, the API's
    own 400 reaches the client word for word, and its retry at a lower max_tokens goes through."""
    with Emulator(SummarizingResponder(ScriptedResponder(_bash)), context_window=WINDOW) as emu, \
            Proxy(ProxyConfig(upstream=emu.url, port=0, mode=mode, window_tokens=WINDOW if mode == "compact"
                              else None)) as px:
        recovered, others = _recovering_client(px.url, 20, "Run the steps. " + "Context line.\n" * 1_500)
        px.wait_idle()
    assert others == [], others  # no "context is full" of the proxy's own, on any turn
    assert recovered >= 20  # every turn needed the client's own recovery, and got it


def test_a_refusal_of_the_proxy_names_its_own_flag() -> None:
    """A prompt that cannot fit the window however it is compacted (a first tool output bigger than
    the window, in the immutable prefix) is refused before it is sent; the refusal names the
    proxy's ``--prefix-messages``, not ``wrap()``'s keyword, which a proxy user cannot set."""
    big = " ".join(f"r{j}" for j in range(40_000))
    msgs = [{"role": "user", "content": "read the file"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "bash",
                                               "input": {"command": "cat big"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": big}]}]
    with Emulator(ScriptedResponder(_bash), context_window=30_000) as emu, \
            Proxy(ProxyConfig(upstream=emu.url, port=0, mode="compact", window_tokens=30_000)) as px:
        client = anthropic.Anthropic(base_url=px.url, api_key="k", max_retries=0)
        with pytest.raises(anthropic.BadRequestError) as err:
            client.messages.create(model=MODEL, max_tokens=100, tools=TOOLS, messages=msgs)
        sent = [r for r in emu.requests if not r.get("internal")]
    msg = str(err.value.message)
    assert "--prefix-messages 1" in msg and "wrap(" not in msg, msg
    assert sent == []  # refused before it was sent: it could not fit


def test_prefix_messages_is_a_compact_mode_setting_of_the_proxy() -> None:
    """``--prefix-messages`` reaches the engine in compact mode, and observe mode refuses it (it
    changes nothing there, and a user would believe it took effect)."""
    with pytest.raises(ConfigError, match="--prefix-messages applies only with --mode compact"):
        ProxyConfig(mode="observe", engine_options=EngineOptions(prefix_messages=1)).check()
    with Emulator(ScriptedResponder(_bash)) as emu, \
            Proxy(ProxyConfig(upstream=emu.url, port=0, mode="compact",
                              engine_options=EngineOptions(prefix_messages=1))) as px:
        anthropic.Anthropic(base_url=px.url, api_key="k", max_retries=0).messages.create(
            model=MODEL, max_tokens=100, tools=TOOLS, messages=[{"role": "user", "content": "go"}])
        px.wait_idle()
        engine = px.state.engine
        assert engine is not None
        assert [s.prefix_messages for s in engine.sessions()] == [1]


def test_a_retry_of_the_same_turn_stays_in_its_session(tmp_path: Path) -> None:
    """Issue 62 item 5: a client's retry of a turn with the same history and other parameters
    (Claude Code's lower ``max_tokens`` after the API's 400, other ``stop_sequences``) continues the
    session it names; it is never a segment (``.sN``) or another agent (``.aN``). What does make
    one is a retry whose history or system prompt differs from the attempt that went unanswered
    (docs/architecture.md, *A turn that went unanswered*)."""
    meta = {"user_id": json.dumps({"session_id": "0c5e-retry"})}  # how Claude Code names its session
    store = tmp_path / "store"
    with Emulator(SummarizingResponder(ScriptedResponder(_bash)), context_window=WINDOW) as emu, \
            Proxy(ProxyConfig(upstream=emu.url, port=0, mode="compact", window_tokens=WINDOW,
                              store=str(store))) as px:
        client = anthropic.Anthropic(base_url=px.url, api_key="k", max_retries=0)
        msgs: list[dict[str, Any]] = [{"role": "user", "content": "Run the steps. " + "Context line.\n" * 1_500}]
        refused = 0
        for _ in range(6):
            for max_tokens, extra in ((128_000, {}), (12_000, {"stop_sequences": ["END"]})):
                try:
                    with client.messages.stream(model=MODEL, max_tokens=max_tokens, tools=TOOLS, messages=msgs,
                                                metadata=meta, extra_body=extra) as s:
                        r = s.get_final_message()
                    break
                except anthropic.BadRequestError as err:
                    assert _LIMIT.search(str(err.message)), err.message
                    refused += 1
            use = next(b for b in r.content if b.type == "tool_use")
            msgs += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                   "content": "ok\n" * 600}]}]
        px.wait_idle()
        sessions = {s.sid: s for s in px.state.observer.sessions()}
    assert refused >= 6  # every turn was retried
    assert list(sessions) == ["cc-0c5e-retry"] and sessions["cc-0c5e-retry"].link is None
    assert sessions["cc-0c5e-retry"].requests == 6 + refused
    assert [p.name for p in store.iterdir()] == ["cc-0c5e-retry"]


@pytest.mark.parametrize("mode", ["observe", "compact"])
def test_a_mistyped_model_gets_the_nearest_ids_from_the_compact_proxy(mode: str) -> None:
    """Issue 56: for a model id the price table does not list, the compact proxy relayed the
    upstream's bare 404 and said the nearest ids only in its own log. Compact mode adds them to
    the API's message (status and type kept); observe mode changes nothing."""
    with Emulator(ScriptedResponder(_bash)) as emu, Proxy(ProxyConfig(upstream=emu.url, port=0, mode=mode)) as px:
        client = anthropic.Anthropic(base_url=px.url, api_key="k", max_retries=0)
        with pytest.raises(anthropic.NotFoundError) as err:
            client.messages.create(model="claude-opus-9", max_tokens=100, messages=[{"role": "user", "content": "hi"}])
        px.wait_idle()
        errors = px.state.observer.totals.errors
    msg = str(err.value.message)
    assert err.value.status_code == 404 and "claude-opus-9" in msg
    assert ("nearest: claude-opus-5" in msg) == (mode == "compact"), msg
    assert errors == 1  # still counted as the error it is


def _through_compact_mode(turns: int) -> tuple[int, list[str], list[Any]]:
    """The recovering client through the compact proxy at `WINDOW`, ``turns`` turns: its
    recoveries, its other 400s, and the engine's events."""
    events: list[Any] = []
    with Emulator(SummarizingResponder(ScriptedResponder(_bash)), context_window=WINDOW) as emu, \
            Proxy(ProxyConfig(upstream=emu.url, port=0, mode="compact", window_tokens=WINDOW,
                              engine_options=EngineOptions(on_event=events.append))) as px:
        recovered, others = _recovering_client(px.url, turns, "Run the steps. " + "Context line.\n" * 1_500)
        px.wait_idle()
    return recovered, others, events


def test_a_large_output_reserve_does_not_make_the_proxy_drop_rounds() -> None:
    """Issue 62: at a 40k window a client reserving 32,000 of output left the policy 10,000 tokens
    of input, and every turn dropped every round it could (L5), on the first try and again on the
    API's 400, though the client lowers max_tokens on that 400 and the prompt fit. L5 now drops
    rounds only for the window itself (with at most a quarter of it kept for the reply), and the
    reactive path leaves such a 400 to the client."""
    recovered, others, events = _through_compact_mode(12)
    assert others == [] and recovered >= 12
    dropped = [e for e in events if e.kind == "compaction" and e.level == "L5"]
    assert dropped == [], [(e.tokens_before, e.tokens_after, e.reason[:80]) for e in dropped]
    assert any(e.kind == "max_tokens_over" for e in events)


def test_a_client_lowering_max_tokens_each_turn_is_not_compacted_each_turn() -> None:
    """Issue 62: a client that lowers max_tokens on the API's 400 asks, on the retry, for the rest
    of the window beside its prompt (window - prompt - 1,000). Planned for that reserve, each retry
    had to hide a little more: one old tool result cleared on 25 of 30 turns, a cache re-write
    each time. The turn is planned with the largest reserve it asked (here 128,000, which the
    window cannot hold, so the quarter L5 works to), and a few collapses suffice."""
    recovered, others, events = _through_compact_mode(30)
    assert others == [] and recovered >= 30
    done = [e for e in events if e.kind == "compaction"]
    assert 1 <= len(done) <= 5, [(e.level, e.tokens_before, e.tokens_after) for e in done]
    assert not [e for e in done if e.level == "L5"]
