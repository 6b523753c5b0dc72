"""Signatures the emulator did not issue (issue 56): a session recorded against the real API,
resumed with its real signatures, is taken as the API takes it, directly, through wrap() and in
the on-demand compaction request wrap() makes for it; a made-up signature is still refused, and
`foreign_signatures="refuse"` keeps the strict reading for the tests that want it. The real SDK
against the emulator throughout."""

from __future__ import annotations

import base64
import copy
import itertools
import random
from pathlib import Path
from typing import Any

import anthropic
import pytest

import cachecompact
from cachecompact.tools.emulator import Emulator, ScriptedResponder, SummarizingResponder, ThinkingRules
from cachecompact.tools.emulator._binding import api_shaped
from cachecompact.tools.emulator.responders import Reply
from cachecompact.tools.traces import load_trace

TOOLS = [{"name": "read", "description": "Read a file.",
          "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}]
SYSTEM = "You audit code. " * 100


def _real_shaped(rng: random.Random) -> str:
    """A signature shaped like the API's (standard base64 of a protobuf-like record; the real ones
    in the shared logs start with "E" or "CAIS"), of random bytes: nobody's key made it."""
    return base64.b64encode(b"\x12" + rng.randbytes(rng.randrange(200, 600))).decode()


def _recorded(turns: int, seed: int = 0) -> list[dict[str, Any]]:
    """A history as a client recorded it against the API: each assistant turn thinks (with the
    API's signature) and calls a tool; the last message is a tool result."""
    rng = random.Random(seed)
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "Audit the project."}]
    for k in range(turns):
        msgs.append({"role": "assistant", "content": [
            {"type": "thinking", "thinking": f"I should read m{k}.py next.", "signature": _real_shaped(rng)},
            {"type": "tool_use", "id": f"toolu_rec_{k:03d}", "name": "read", "input": {"path": f"m{k}.py"}}]})
        msgs.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_rec_{k:03d}",
                                                  "content": f"# m{k}.py\n" + "x = f(1)\n" * 400}]})
    return msgs


def _send(client: Any, model: str, msgs: list[dict[str, Any]], **kw: Any) -> Any:
    return client.messages.create(model=model, max_tokens=2000, system=SYSTEM, tools=TOOLS, messages=msgs, **kw)


def test_the_shape_of_the_apis_signatures() -> None:
    rng = random.Random(1)
    assert api_shaped(_real_shaped(rng))
    real = ("EpwFCkYIBhgCKkCBsZ46IivvtLPGRGnT5YdVvkR52hN0DMzFya0RlhIdYq58l6tq5dlKAao5VW9N/OB5" * 4)
    assert api_shaped(real)
    for made_up in ("AAAA", "sig", "s", "c2lnbmF0dXJl", "", "emu2.x.y", "not base64 at all " * 20,
                    base64.urlsafe_b64encode(b"\xfb\xff" * 100).decode(),  # another alphabet
                    _real_shaped(rng) + "!"):
        assert not api_shaped(made_up), made_up


@pytest.mark.parametrize("model", ["claude-sonnet-4-6", "claude-opus-5-5"])
def test_a_recorded_session_is_taken_by_default_and_refused_when_asked(model: str) -> None:
    msgs = _recorded(3)
    with Emulator() as emu:
        c = anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0)
        assert _send(c, model, msgs).content
        assert _send(c, model, msgs).content  # again: bound where first sent, and sent the same
        assert emu.core.refusals == []
        assert emu.requests[-1]["thinking"]["kept"] == 3
        # what the emulator can check of a signature it cannot verify: the text it was first sent with ...
        changed = copy.deepcopy(msgs)
        changed[3]["content"][0]["thinking"] = "I invented this."
        with pytest.raises(anthropic.BadRequestError, match=r"messages\.3\.content\.0: Invalid `signature`"):
            _send(c, model, changed)
        # ... and, with preserved thinking, the prefix it was first sent after
        edited = copy.deepcopy(msgs)
        edited[2]["content"][0]["content"] = "[cleared]"
        if model == "claude-opus-5-5":
            with pytest.raises(anthropic.BadRequestError, match="bound to a different conversation"):
                _send(c, model, edited)
        else:  # no prefix check before preserved thinking
            assert _send(c, model, edited).content
        # a made-up signature is still refused
        fake = copy.deepcopy(msgs)
        fake[1]["content"][0]["signature"] = "AAAA"
        with pytest.raises(anthropic.BadRequestError, match=r"messages\.1\.content\.0: Invalid `signature`"):
            _send(c, model, fake)
        # and so is one of the emulator's own format that fails its check
        forged = copy.deepcopy(msgs)
        forged[1]["content"][0]["signature"] = "emu2.e30=.00000000000000000000000000000000"
        with pytest.raises(anthropic.BadRequestError, match=r"messages\.1\.content\.0: Invalid `signature`"):
            _send(c, model, forged)
    with Emulator(foreign_signatures="refuse") as strict:  # the opt-in: every foreign signature refused
        c = anthropic.Anthropic(base_url=strict.url, api_key="t", max_retries=0)
        with pytest.raises(anthropic.BadRequestError, match=r"messages\.1\.content\.0: Invalid `signature`"):
            _send(c, model, msgs)
    with Emulator(thinking=ThinkingRules(foreign_signatures="bind")) as loose:  # placeholders taken too
        c = anthropic.Anthropic(base_url=loose.url, api_key="t", max_retries=0)
        assert _send(c, model, fake).content


def test_an_unknown_setting_is_refused() -> None:
    with pytest.raises(ValueError, match="foreign_signatures"):
        ThinkingRules(foreign_signatures="maybe")  # type: ignore[arg-type]


def _reader() -> ScriptedResponder:
    n = itertools.count(1)

    def answer(body: dict[str, Any]) -> Reply:
        k = next(n)
        return Reply([{"type": "tool_use", "id": f"toolu_{k:05d}", "name": "read", "input": {"path": f"n{k}.py"}}],
                     "tool_use")
    return ScriptedResponder(answer)


def test_a_resumed_session_goes_through_wrap_and_its_api_written_summary_is_not_refused() -> None:
    """A session resumed from its record (real-shaped signatures) continues through wrap() on a
    model with preserved thinking and a small window: every request, the on-demand compaction
    request the policy makes for the resumed history included, is answered."""
    model = "claude-opus-5-5"
    with Emulator(SummarizingResponder(_reader())) as emu:
        client = cachecompact.wrap(anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0), store=None,
                                   window_tokens=60_000, strategy="cachecompact-api-summaries")
        msgs = _recorded(8)
        for _ in range(30):
            r = _send(client, model, msgs)
            content = [b.model_dump(exclude_none=True) for b in r.content]
            use = next(b for b in content if b["type"] == "tool_use")
            msgs += [{"role": "assistant", "content": content},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"],
                                                   "content": f"# {use['input']}\n" + "y = g(2)\n" * 500}]}]
        refusals = list(emu.core.refusals)
        errors = [r for r in emu.requests if r.get("status", 200) != 200]
        internal = [r for r in emu.requests if r.get("internal")]
    assert refusals == [] and errors == []
    (s,) = cachecompact.wrapped_sessions(client)
    assert any(e.kind == "compaction" for e in s.ledger.entries), [(e.kind, e.level) for e in s.ledger.entries]
    assert any(r["usage"]["iterations"][0]["type"] == "compaction" for r in internal)


def test_a_real_claude_code_session_with_thinking_resumes_through_wrap(shared_traces: Path) -> None:
    """A 2025 Claude Code session that carries thinking (attio-mcp-server 55acb2, Opus 4.1, 70
    signed blocks), resumed request by request from its log through wrap(): 0 errors (80 of 81
    requests were refused before issue 56); with the strict setting the same replay is refused."""
    path = shared_traces / "claude-code" / "attio-mcp-server" / "55acb2eceaf4__chat.json"
    if not path.is_file():
        pytest.skip(f"{path} is not among the shared traces")
    tr = load_trace(path)
    assert any(isinstance(m.get("content"), list) and any(b.get("type") == "thinking" for b in m["content"])
               for m in tr.messages)

    def replay(emu: Emulator) -> tuple[int, int]:
        client = cachecompact.wrap(anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0), store=None)
        sent = errors = 0
        for i, m in enumerate(tr.messages):
            if i and m["role"] == "assistant":
                sent += 1
                try:
                    client.messages.create(model=tr.model or "claude-opus-4-1-20250805", max_tokens=1000,
                                           messages=tr.messages[:i])  # type: ignore[arg-type]
                except anthropic.APIStatusError:
                    errors += 1
        return sent, errors

    with Emulator() as emu:
        sent, errors = replay(emu)
        assert (errors, emu.core.refusals) == (0, []) and sent > 50
    with Emulator(foreign_signatures="refuse") as strict:
        _, refused = replay(strict)
        assert refused > 0
