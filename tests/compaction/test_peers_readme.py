"""The strategy example in cachecompact/compaction/peers/README.md ("A complete example") runs as
written: a new user's strategy through `wrap()` against the emulator, with the real SDK (it
reads ``ANTHROPIC_BASE_URL`` and ``ANTHROPIC_API_KEY`` like any client)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import anthropic
import pytest

import cachecompact
from cachecompact.compaction import catalog
from cachecompact.tools.cli import main as cli_main
from cachecompact.tools.emulator import Emulator

README = Path(cachecompact.__file__).parent / "compaction" / "peers" / "README.md"


def test_the_readme_strategy_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert len(blocks) == 1, "the README's example is its one python block"
    monkeypatch.chdir(tmp_path)  # wrap()'s default store is ./.cachecompact/sessions
    monkeypatch.setattr(catalog, "_REGISTRY", dict(catalog._REGISTRY))  # the example registers its strategy
    with Emulator() as emu:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", emu.url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", "test")
        ns: dict[str, Any] = {}
        exec(compile(blocks[0], str(README), "exec"), ns)
        client, read = ns["client"], ns["read_scratchpad"]
        msgs: list[dict[str, Any]] = [{"role": "user", "content": "Fix the parser."}]
        outputs = {}
        for k in range(12):
            tid = f"toolu_{k}"
            outputs[tid] = "\n".join(f"src/file{k}.py:{j}: value_{k}_{j} = {j * k}" for j in range(120))
            msgs += [{"role": "assistant", "content": [{"type": "tool_use", "id": tid, "name": "bash",
                                                        "input": {"command": f"cat src/file{k}.py"}}]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tid,
                                                   "content": outputs[tid]}]}]
            client.messages.create(model="claude-sonnet-4-6", max_tokens=100, messages=msgs)
        (session,) = cachecompact.wrapped_sessions(client)
        moved = [e for e in session.ledger.entries if e.level == "L1"]
        assert moved and all(e.tool_use_id in outputs for e in moved)
        for e in moved:  # each placeholder's reference reads back the whole output
            ref = re.search(r'ref="(sp_[0-9a-f]{32})"', e.summary or "")
            assert ref is not None and read({"ref": ref.group(1)}) == (outputs[e.tool_use_id or ""], False)
        # the plan's TTL: the requests after the first were written for an hour
        assert sum(r["usage"]["cache_creation"]["ephemeral_1h_input_tokens"] for r in emu.requests) > 0
        assert all(r["usage"]["cache_creation"]["ephemeral_5m_input_tokens"] == 0 for r in emu.requests)
        # a restarted process serves the same content, and the stored ledger verifies
        again = cachecompact.wrap(anthropic.Anthropic(), strategy="move-old-output", scratchpad_tool=True)
        first = re.search(r'ref="(sp_[0-9a-f]{32})"', moved[0].summary or "")
        assert first is not None
        # with the agent's history, which names its own session (issue 56: a reference is read from the
        # caller's own conversation only, never from whichever stored session holds it)
        assert cachecompact.scratchpad_handler(again)({"ref": first.group(1)}, msgs) == (
            outputs[moved[0].tool_use_id or ""], False)
    assert session.path is not None
    assert cli_main(["ledger", "verify", str(session.path)]) == 0
