"""Anthropic's server compaction (``compact_20260112``) in the emulator, each documented rule
through the real SDK's beta client (anthropic-cache-facts.md §3.1-3.4), and the two peers that
the bench adds for it: ``anthropic-compact`` and ``masking``."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

import cachecompact
from cachecompact.base.pricing import get_model
from cachecompact.compaction.catalog import get_strategy, strategy_names
from cachecompact.compaction.peers.body import MASKED, AnthropicCompactConfig
from cachecompact.tools.emulator import Emulator, ScriptedResponder
from cachecompact.tools.emulator.responders import Reply

MODEL = "claude-sonnet-4-6"
BETA = ["compact-2026-01-12"]


def edit(**kw: Any) -> dict[str, Any]:
    return {"edits": [{"type": "compact_20260112", **kw}]}


def big(tokens: int, tag: str = "log") -> list[dict[str, Any]]:
    """A conversation of about ``tokens`` tokens ending with a user turn."""
    return [{"role": "user", "content": "Fix the parser in src/parse.py"},
            {"role": "assistant", "content": "Reading the log."},
            {"role": "user", "content": f"{tag} " + "entry " * tokens}]


class Seen:
    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    def __call__(self, body: dict[str, Any]) -> Reply:
        self.bodies.append(copy.deepcopy(body))
        return Reply([{"type": "text", "text": "continuing"}], "end_turn")


@pytest.fixture
def emu() -> Iterator[tuple[Emulator, Seen]]:
    seen = Seen()
    with Emulator(ScriptedResponder(seen)) as e:
        yield e, seen


def client(e: Emulator) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=e.url, api_key="t", max_retries=0)


def test_the_default_trigger_is_150k_input_tokens(emu: tuple[Emulator, Seen]) -> None:
    e, _ = emu
    c = client(e)
    under = c.beta.messages.create(model=MODEL, max_tokens=50, messages=big(140_000), betas=BETA,
                                   context_management=edit())
    assert [b.type for b in under.content] == ["text"] and under.usage.iterations is None
    over = c.beta.messages.create(model=MODEL, max_tokens=50, messages=big(155_000), betas=BETA,
                                  context_management=edit())
    assert [b.type for b in over.content] == ["compaction", "text"] and over.stop_reason == "end_turn"
    assert over.content[0].content is not None and over.content[0].content.startswith("<summary>")


@pytest.mark.parametrize(("bad", "where"), [
    ({"trigger": {"type": "input_tokens", "value": 49_999}}, "trigger.value"),
    ({"trigger": {"type": "tool_uses", "value": 60_000}}, "trigger"),
    ({"trigger": {"type": "input_tokens", "value": "60000"}}, "trigger"),
    ({"pause_after_compaction": "yes"}, "pause_after_compaction"),
    ({"instructions": ""}, "instructions"),
    ({"instructions": 5}, "instructions"),
    ({"keep": 3}, "keep"),
])
def test_bad_parameters_are_400s_naming_the_field(emu: tuple[Emulator, Seen], bad: dict[str, Any],
                                                  where: str) -> None:
    e, _ = emu
    with pytest.raises(anthropic.BadRequestError) as ei:
        client(e).beta.messages.create(model=MODEL, max_tokens=50, messages=big(1000), betas=BETA,
                                       context_management=edit(**bad))
    assert f"context_management.edits[0].{where}" in str(ei.value.message)


def test_the_beta_header_is_required_and_one_edit_at_most(emu: tuple[Emulator, Seen]) -> None:
    e, _ = emu
    c = client(e)
    with pytest.raises(anthropic.BadRequestError, match="compact-2026-01-12"):
        c.messages.create(model=MODEL, max_tokens=50, messages=big(1000), extra_body={"context_management": edit()})
    two = {"edits": [{"type": "compact_20260112"}, {"type": "compact_20260112"}]}
    with pytest.raises(anthropic.BadRequestError, match="at most one"):
        c.beta.messages.create(model=MODEL, max_tokens=50, messages=big(1000), betas=BETA, context_management=two)


@pytest.mark.parametrize("stream", [False, True])
def test_pause_after_compaction_stops_with_the_block(emu: tuple[Emulator, Seen], stream: bool) -> None:
    e, seen = emu
    kw: dict[str, Any] = {"model": MODEL, "max_tokens": 50, "messages": big(60_000), "betas": BETA,
                          "context_management": edit(trigger={"type": "input_tokens", "value": 50_000},
                                                     pause_after_compaction=True)}
    c = client(e)
    if stream:
        with c.beta.messages.stream(**kw) as s:
            m = s.get_final_message()
    else:
        m = c.beta.messages.create(**kw)
    assert m.stop_reason == "compaction" and [b.type for b in m.content] == ["compaction"]
    assert m.usage.input_tokens == 0 and m.usage.output_tokens == 0
    assert m.usage.iterations is not None and [i.type for i in m.usage.iterations] == ["compaction"]
    assert m.usage.iterations[0].input_tokens > 60_000 and seen.bodies == []  # the model was not asked


@pytest.mark.parametrize("stream", [False, True])
def test_usage_iterations_and_the_bill(emu: tuple[Emulator, Seen], stream: bool) -> None:
    """The summarization is its own iteration, left out of the top level; the bill is the sum."""
    e, seen = emu
    kw: dict[str, Any] = {"model": MODEL, "max_tokens": 50, "messages": big(60_000), "betas": BETA,
                          "context_management": edit(trigger={"type": "input_tokens", "value": 50_000})}
    c = client(e)
    if stream:
        with c.beta.messages.stream(**kw) as s:
            m = s.get_final_message()
    else:
        m = c.beta.messages.create(**kw)
    its = m.usage.iterations
    assert its is not None and [i.type for i in its] == ["compaction", "message"]
    assert its[1].input_tokens == m.usage.input_tokens < 2_000 < 60_000 < its[0].input_tokens
    assert its[0].output_tokens > 0 and m.content[0].type == "compaction"
    price = get_model(MODEL)
    billed = sum(price.cost(i.model_dump()) for i in its)
    assert e.requests[-1]["cost_usd"] == pytest.approx(billed, rel=1e-6)
    # the model answered from the summary alone: the compaction block starts its response
    (body,) = seen.bodies
    assert [b["type"] for m_ in body["messages"] for b in m_["content"]] == ["compaction"]


def test_instructions_replace_the_default_prompt(emu: tuple[Emulator, Seen]) -> None:
    e, _ = emu
    c = client(e)
    trig = {"type": "input_tokens", "value": 50_000}
    plain = c.beta.messages.create(model=MODEL, max_tokens=50, messages=big(60_000), betas=BETA,
                                   context_management=edit(trigger=trig, pause_after_compaction=True))
    told = c.beta.messages.create(model=MODEL, max_tokens=50, messages=big(60_000), betas=BETA,
                                  context_management=edit(trigger=trig, pause_after_compaction=True,
                                                          instructions="Keep only file paths. " * 200))
    assert plain.usage.iterations and told.usage.iterations
    assert told.usage.iterations[0].input_tokens > plain.usage.iterations[0].input_tokens + 500
    assert "Keep only file paths." in (told.content[0].content or "")


def test_everything_before_the_compaction_block_is_dropped_and_cached(emu: tuple[Emulator, Seen]) -> None:
    """The round trip: the next request sends the block back (with cache_control) after the old
    messages; the model sees only the block and what follows, and the block's cache is read on
    the request after."""
    e, seen = emu
    c = client(e)
    cm = edit(trigger={"type": "input_tokens", "value": 50_000})
    msgs = big(60_000)
    r = c.beta.messages.create(model=MODEL, max_tokens=50, messages=msgs, betas=BETA, context_management=cm)
    block = {**r.content[0].model_dump(exclude_none=True), "cache_control": {"type": "ephemeral"}}
    block["content"] += "\n" + "Summary detail line. " * 1000  # over the minimum cacheable length
    history = [*msgs, {"role": "assistant", "content": [block, {"type": "text", "text": "continuing"}]},
               {"role": "user", "content": "go on"}]
    seen.bodies.clear()
    first = c.beta.messages.create(model=MODEL, max_tokens=50, messages=history, betas=BETA, context_management=cm)
    assert first.usage.iterations is None and first.usage.input_tokens + first.usage.cache_creation_input_tokens < 5_000
    assert first.usage.cache_creation_input_tokens > 0
    (body,) = seen.bodies
    assert body["messages"][0]["content"][0]["type"] == "compaction" and len(body["messages"]) == 2
    again = c.beta.messages.create(model=MODEL, max_tokens=50, betas=BETA, context_management=cm,
                                   messages=[*history, {"role": "assistant", "content": "ok"},
                                             {"role": "user", "content": "more"}])
    assert again.usage.cache_read_input_tokens >= first.usage.cache_creation_input_tokens


def test_compaction_blocks_sent_back_are_checked(emu: tuple[Emulator, Seen]) -> None:
    e, seen = emu
    c = client(e)
    base = big(1000)
    empty = [*base, {"role": "assistant", "content": [{"type": "compaction", "content": ""}]},
             {"role": "user", "content": "go"}]
    with pytest.raises(anthropic.BadRequestError, match="Empty string content is not allowed"):
        c.beta.messages.create(model=MODEL, max_tokens=50, messages=empty, betas=BETA, context_management=edit())
    in_user = [{"role": "user", "content": [{"type": "compaction", "content": "x"}]}]
    with pytest.raises(anthropic.BadRequestError, match="assistant messages"):
        c.beta.messages.create(model=MODEL, max_tokens=50, messages=in_user, betas=BETA, context_management=edit())
    failed = [*base, {"role": "assistant", "content": [{"type": "compaction", "content": None},
                                                       {"type": "text", "text": "ok"}]},
              {"role": "user", "content": "go"}]
    seen.bodies.clear()
    c.beta.messages.create(model=MODEL, max_tokens=50, messages=failed, betas=BETA, context_management=edit())
    assert len(seen.bodies[0]["messages"]) == len(failed)  # a failed (null) compaction is a no-op


# -- the peers --------------------------------------------------------------------------------------------


def test_the_anthropic_compact_peer_compacts_through_wrap(emu: tuple[Emulator, Seen]) -> None:
    """Its trigger is the documented default, 150k input tokens at any window (issue 48: scaled
    to 75% of a 1M window it never fired); the sweep's variants and the ``-scaled`` extra are
    named strategies; never under the documented minimum, 50k. It sends the beta header itself;
    the block goes back with the history and the emulator drops the rest."""
    e, _ = emu
    peer = AnthropicCompactConfig()
    assert peer.trigger(200_000) == peer.trigger(1_000_000) == peer.trigger(60_000) == 150_000
    scaled = get_strategy("anthropic-compact-scaled")
    assert isinstance(scaled, AnthropicCompactConfig)
    assert scaled.trigger(200_000) == 150_000 and scaled.trigger(60_000) == 50_000
    assert scaled.trigger(1_000_000) == 750_000
    assert AnthropicCompactConfig(trigger_tokens=20_000).trigger(200_000) == 50_000  # the documented minimum
    sweep = get_strategy("anthropic-compact-50k")
    assert isinstance(sweep, AnthropicCompactConfig) and sweep.trigger(1_000_000) == 50_000
    assert "anthropic-compact-50k" not in strategy_names() and "anthropic-compact-50k" in strategy_names(extras=True)
    c = cachecompact.wrap(client(e), store=None, strategy="anthropic-compact-50k", window_tokens=80_000)
    msgs = big(62_000)
    r = c.messages.create(model=MODEL, max_tokens=50, messages=msgs, system="You fix parsers.")
    content = [b.model_dump(exclude_none=True) for b in r.content]
    assert content[0]["type"] == "compaction"
    with c.messages.stream(model=MODEL, max_tokens=50, system="You fix parsers.",
                           messages=[*msgs, {"role": "assistant", "content": content},
                                     {"role": "user", "content": "next"}]) as s:
        s.get_final_message()
    assert e.requests[-1]["total_input_tokens"] < 5_000


def test_the_masking_peer_keeps_the_last_10_turns_observations() -> None:
    seen = Seen()
    with Emulator(ScriptedResponder(seen)) as e:
        c = cachecompact.wrap(client(e), store=None, strategy="masking")
        msgs: list[dict[str, Any]] = [{"role": "user", "content": "Inspect the repo."}]
        for t in range(14):
            msgs += [{"role": "assistant", "content": [{"type": "text", "text": f"look {t}"},
                                                       {"type": "tool_use", "id": f"toolu_{t:02d}", "name": "ls",
                                                        "input": {"t": t}}]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{t:02d}",
                                                   "content": f"line a {t}\nline b {t}\nline c {t}"}]}]
        c.messages.create(model=MODEL, max_tokens=50, messages=msgs)
    sent = seen.bodies[0]["messages"]
    results = [b["content"] for m in sent for b in m["content"] if isinstance(b, dict) and b["type"] == "tool_result"]
    assert results[:4] == [MASKED.format(n=3)] * 4 and all("line a" in str(r) for r in results[4:])
    assert [b["text"] for m in sent[1::2] for b in m["content"] if b["type"] == "text"] == [f"look {t}"
                                                                                            for t in range(14)]
