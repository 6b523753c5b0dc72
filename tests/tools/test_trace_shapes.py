"""Every request shape the shared traces hold passes the emulator's validation.

The emulator must accept what the API accepted: a real log is a record of requests the API
billed, so a 400 from the emulator on one of its shapes is the emulator's bug (issue 37: a
``tool_reference`` block inside a tool result, from Claude Code's ToolSearch, was refused and
three 1M-window sessions silently dropped out of ``whatif``). Each trace's messages (its
sub-agents' too), tools and system prompt are validated as one request, the whole history at
once: every message shape, the roles, the tool pairing and the breakpoints.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cachecompact.tools.emulator.validation import validate_request
from cachecompact.tools.traces import Trace, discover, load_trace

from ..conftest import SHARED_TRACES


def _all(trace: Trace) -> list[Trace]:
    return [trace, *(t for s in trace.subagents for t in _all(s))]


def _trace_files() -> list[Path]:
    if not SHARED_TRACES.is_dir():
        return []
    return [p for p in discover([SHARED_TRACES]) if p.name != "SOURCES.md"]


def _body(t: Trace) -> dict[str, Any]:
    body: dict[str, Any] = {"model": t.model or "claude-sonnet-4-6", "max_tokens": 1, "messages": t.messages}
    if t.system:
        body["system"] = t.system
    if t.tools:
        body["tools"] = t.tools
    return body


@pytest.mark.slow
@pytest.mark.parametrize("path", _trace_files() or [pytest.param(None, marks=pytest.mark.skip(
    reason=f"shared traces not present at {SHARED_TRACES}"))], ids=lambda p: p.name if p else "none")
def test_every_recorded_request_shape_is_accepted(path: Path) -> None:
    trace = load_trace(path)
    for t in _all(trace):
        validate_request(_body(t))  # raises MalformedMessageError, naming the place, on a shape it refuses


def test_the_shapes_claude_code_2026_sends_are_accepted() -> None:
    """Without the shared traces too: the block kinds and nestings of the 2026 logs, by hand."""
    body = {"model": "claude-opus-5", "max_tokens": 1, "messages": [
        {"role": "user", "content": "find the tool"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "", "signature": "c2ln"},
            {"type": "tool_use", "id": "toolu_1", "name": "ToolSearch", "input": {"query": "select:Read"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [
            {"type": "tool_reference", "tool_name": "Read"}, {"type": "text", "text": "1 tool"}]}]},
    ]}
    validate_request(body)
