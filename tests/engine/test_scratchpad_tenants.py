"""`read_scratchpad` answers from the caller's own conversation only (issue 56): a second client
with its own key and session never reads another tenant's stored output by its reference, on
the file store and on PostgreSQL, in the process that stored it and after a restart; the
owner still reads it back after a restart, as the docs promise."""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import anthropic
import pytest

from cachecompact import scratchpad_handler, wrap, wrapped_sessions
from cachecompact.base.refs import text_ref
from cachecompact.tools.emulator import Emulator

MODEL = "claude-sonnet-4-6"
SYSTEM = "You are a careful agent. " * 60


def _store(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    return str(tmp_path / "sessions") if kind == "files" else str(request.getfixturevalue("pg_url"))


def _conversation(tag: str) -> list[dict[str, Any]]:
    """A task, a tool call and a result too big to arrive whole at a 20k window (it is kept in the
    scratchpad and its placeholder names the reference)."""
    out = "".join(f"SECRET_{tag}_{k} = {k * 7}  # a value of tenant {tag}\n" for k in range(1500))
    return [{"role": "user", "content": f"Read the settings of {tag} ({uuid.uuid4().hex})."},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_01", "name": "read_file",
                                               "input": {"path": "settings.py"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01", "content": out}]}]


TOOLS = [{"name": "read_file", "description": "Read a file.",
          "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}]


def _client(emu: Emulator, key: str, store: str, **kw: Any) -> anthropic.Anthropic:
    return wrap(anthropic.Anthropic(base_url=emu.url, api_key=key, max_retries=0), store=store,
                window_tokens=20_000, scratchpad_tool=True, summarizer=None, prefix_messages=1, **kw)


def _send(client: anthropic.Anthropic, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    reply = client.messages.create(model=MODEL, max_tokens=256, system=SYSTEM, tools=TOOLS,  # type: ignore[arg-type]
                                   messages=messages)  # type: ignore[arg-type]
    return [*messages, {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]}]


def _ref(client: anthropic.Anthropic) -> str:
    text = str(wrapped_sessions(client)[0].render().body["messages"])
    m = re.search(r"sp_[0-9a-f]{32}", text)
    assert m is not None, "the big result was not kept in the scratchpad"
    return m.group(0)


@pytest.mark.parametrize("kind", ["files", "postgres"])
def test_a_tenant_never_reads_another_tenants_stored_output(kind: str, tmp_path: Path,
                                                            request: pytest.FixtureRequest) -> None:
    store = _store(kind, tmp_path, request)
    with Emulator() as emu:
        a = _client(emu, "key-of-tenant-a", store)
        hist_a = _send(a, _conversation("A"))
        ref = _ref(a)
        out, is_error = scratchpad_handler(a)({"ref": ref})
        assert not is_error and "SECRET_A_1 " in out  # the owner reads its own
        assert scratchpad_handler(a)({"ref": ref}, hist_a) == (out, False)

        b = _client(emu, "key-of-tenant-b", store)
        hist_b = _send(b, _conversation("B"))
        missing = text_ref("never stored")
        for handle, messages in ((scratchpad_handler(b), None), (scratchpad_handler(b), hist_b),
                                 (scratchpad_handler(b), hist_a[:1]),  # A's opening alone proves nothing
                                 # B restarted: nothing in memory, its own history, or none
                                 (scratchpad_handler(_client(emu, "key-of-tenant-b", store)), hist_b),
                                 (scratchpad_handler(_client(emu, "key-of-tenant-b", store)), None)):
            text, is_error = handle({"ref": ref}, messages) if messages is not None else handle({"ref": ref})
            assert is_error and "SECRET_A" not in text
            # answered exactly as a reference that exists nowhere: its existence does not leak
            gone, _ = handle({"ref": missing}, messages) if messages is not None else handle({"ref": missing})
            assert text == gone.replace(missing, ref)

        # A restarted: its pending call finds what the earlier process kept for its session
        again = _client(emu, "key-of-tenant-a", store)
        assert scratchpad_handler(again)({"ref": ref}, hist_a) == (out, False)


@pytest.mark.parametrize("kind", ["files", "postgres"])
def test_a_named_conversation_reads_its_own_after_a_restart(kind: str, tmp_path: Path,
                                                            request: pytest.FixtureRequest) -> None:
    """A client that names its session (``session_id=``) reads its conversation's output after a
    restart without passing its history; another name does not."""
    store = _store(kind, tmp_path, request)
    name, other = f"job-{uuid.uuid4().hex[:8]}", f"job-{uuid.uuid4().hex[:8]}"
    with Emulator() as emu:
        a = _client(emu, "k1", store, session_id=name)
        _send(a, _conversation("N"))
        ref = _ref(a)
        out, is_error = scratchpad_handler(_client(emu, "k1", store, session_id=name))({"ref": ref})
        assert not is_error and "SECRET_N_1 " in out
        text, is_error = scratchpad_handler(_client(emu, "k2", store, session_id=other))({"ref": ref})
        assert is_error and "unknown scratchpad reference" in text
