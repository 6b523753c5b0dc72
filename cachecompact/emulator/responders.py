"""The emulator's pluggable "model": what it answers, not how it bills.

* `ScriptedResponder`: deterministic replies for tests (a list, a function, or an echo).
* `ReplayResponder`: answers with the recorded next assistant message of a trace, so a real
  agent loop can be replayed request by request.
* `SummarizingResponder`: when ``tool_choice`` forces a named tool (a summarization call),
  fills that tool's ``input_schema`` extractively from the conversation; answers cachecompact's
  in-text summary requests the same way; otherwise delegates.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import xxhash

from ..summarize import SUMMARY_SCHEMA, extract_facts, facts_from_summary_request
from ..wire import canonical_bytes

__all__ = ["ReplayResponder", "Reply", "Responder", "ScriptedResponder", "SummarizingResponder", "fill_schema"]


@dataclass(slots=True)
class Reply:
    content: list[dict[str, Any]]
    stop_reason: str = "end_turn"


class Responder(Protocol):
    def respond(self, body: dict[str, Any]) -> Reply: ...


def _text_reply(text: str) -> Reply:
    return Reply([{"type": "text", "text": text}])


@dataclass
class ScriptedResponder:
    """Replies from ``script`` in order (cycling), or from a function of the request body.

    With no script it answers ``"ok (N messages)"``, which is deterministic for a given request.
    """

    script: Sequence[Reply | str | dict[str, Any]] | Callable[[dict[str, Any]], Reply] | None = None
    _i: int = 0

    def respond(self, body: dict[str, Any]) -> Reply:
        if callable(self.script):
            return self.script(body)
        if not self.script:
            return _text_reply(f"ok ({len(body.get('messages') or [])} messages)")
        item = self.script[self._i % len(self.script)]
        self._i += 1
        if isinstance(item, Reply):
            return item
        if isinstance(item, str):
            return _text_reply(item)
        content = item.get("content")
        blocks = content if isinstance(content, list) else [{"type": "text", "text": str(content)}]
        stop = "tool_use" if any(b.get("type") == "tool_use" for b in blocks) else "end_turn"
        return Reply(blocks, item.get("stop_reason", stop))


def _user_key(m: dict[str, Any]) -> bytes:
    """Identity of a user message for replay lookup (cache_control ignored)."""
    content = m.get("content")
    if isinstance(content, str):
        content = [{"type": "text", "text": content}]
    blocks = [{k: v for k, v in b.items() if k != "cache_control"} for b in content or [] if isinstance(b, dict)]
    return xxhash.xxh3_128_digest(canonical_bytes(blocks))


@dataclass
class ReplayResponder:
    """Answer each request with the trace's next assistant message.

    A cursor walks the trace: the next unused assistant message answers, as long as the
    request's last user message is the one before it (or cannot be recognised, e.g. because
    compaction changed it). If the request clearly belongs elsewhere in the trace, the
    assistant message that followed that user message answers instead. Sessions that repeat
    an identical user message therefore still replay in order.
    """

    messages: Sequence[dict[str, Any]]
    _by_user: dict[bytes, int] = field(default_factory=dict)
    _cursor: int = 0

    def __post_init__(self) -> None:
        for i, m in enumerate(self.messages[:-1]):
            if m.get("role") == "user" and self.messages[i + 1].get("role") == "assistant":
                self._by_user.setdefault(_user_key(m), i + 1)

    def respond(self, body: dict[str, Any]) -> Reply:
        msgs = body.get("messages") or []
        last_user = next((m for m in reversed(msgs) if m.get("role") == "user"), None)
        key = _user_key(last_user) if last_user else None
        idx = next((i for i in range(self._cursor, len(self.messages))
                    if self.messages[i].get("role") == "assistant"), None)
        expected = self.messages[idx - 1] if idx else None
        if key is not None and (expected is None or _user_key(expected) != key):
            idx = self._by_user.get(key, idx)
        if idx is None:
            return _text_reply("[replay finished: the trace has no further assistant message]")
        self._cursor = idx + 1
        content = self.messages[idx]["content"]
        blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
        blocks = [b for b in blocks if b.get("type") not in ("thinking", "redacted_thinking")] or blocks
        stop = "tool_use" if any(b.get("type") == "tool_use" for b in blocks) else "end_turn"
        return Reply([dict(b) for b in blocks], stop)


# -- extractive schema filling --------------------------------------------------------------------

def fill_schema(schema: dict[str, Any], facts: dict[str, Any], name: str = "") -> Any:
    """A value of JSON-schema ``schema`` built from ``facts`` (by property name, then by type)."""
    if name in facts:
        val = facts[name]
        t = schema.get("type")
        if t == "string" and not isinstance(val, str):
            return "; ".join(map(str, val)) if isinstance(val, list) else str(val)
        if t == "array" and isinstance(val, str):
            return [val] if val else []
        return val
    t = schema.get("type")
    if t == "object" or "properties" in schema:
        props = schema.get("properties") or {}
        return {k: fill_schema(v if isinstance(v, dict) else {}, facts, k) for k, v in props.items()}
    if t == "array":
        return []
    if t in ("integer", "number"):
        return 0
    if t == "boolean":
        return False
    if schema.get("enum"):
        return schema["enum"][0]
    return "; ".join(facts.get("completed_steps", [])[-3:]) if t == "string" else None


@dataclass
class SummarizingResponder:
    """Forced-tool requests get an extractive tool_use; everything else goes to ``inner``."""

    inner: Responder = field(default_factory=ScriptedResponder)

    def respond(self, body: dict[str, Any]) -> Reply:
        msgs = body.get("messages") or []
        choice = body.get("tool_choice") or {}
        asked = facts_from_summary_request(msgs)
        if isinstance(choice, dict) and choice.get("type") == "tool":
            tool = next((t for t in body.get("tools") or [] if t.get("name") == choice.get("name")), None)
            if tool is not None:
                facts = asked if asked is not None else extract_facts(msgs)
                args = fill_schema(tool.get("input_schema") or {"type": "object"}, facts)
                n = sum(1 for m in body.get("messages") or [] if m.get("role") == "assistant")
                return Reply([{"type": "tool_use", "id": f"toolu_emu_summary_{n:06d}", "name": tool["name"],
                               "input": args}], "tool_use")
        if asked is not None:  # a summary requested in text, on the session's own cached prefix
            args = fill_schema(SUMMARY_SCHEMA, asked)
            return _text_reply(f"<summary>{json.dumps(args)}</summary>")
        return self.inner.respond(body)
