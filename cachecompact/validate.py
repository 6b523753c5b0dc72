"""Check a request body the way the Messages API does, and say where it is wrong.

Used by the renderer's tests (every render must pass) and by the emulator, which answers
400 with the API's error shape when this raises.
"""

from __future__ import annotations

from typing import Any

from .cachemodel import MAX_BREAKPOINTS
from .errors import MalformedMessageError

__all__ = ["count_breakpoints", "validate_messages", "validate_request"]
_TTL_ORDER = {"1h": 0, "5m": 1}


def _blocks(content: Any) -> list[Any]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return content if isinstance(content, list) else []


def validate_messages(messages: Any) -> None:
    """Roles, non-empty content and tool pairing: every tool_use answered in the next message."""
    if not isinstance(messages, list) or not messages:
        raise MalformedMessageError("messages", "must be a non-empty list")
    pending: dict[str, int] = {}
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise MalformedMessageError(where, "must be an object")
        role = m.get("role")
        if role not in ("user", "assistant"):
            raise MalformedMessageError(f"{where}.role", f"unknown role {role!r}")
        if i == 0 and role != "user":
            raise MalformedMessageError(f"{where}.role", "the first message must be from the user")
        content = m.get("content")
        if content is None:
            raise MalformedMessageError(f"{where}.content", "missing")
        if not isinstance(content, (str, list)):
            raise MalformedMessageError(f"{where}.content", "must be a string or a list of blocks")
        if not content:
            raise MalformedMessageError(f"{where}.content", "must not be empty")
        blocks = _blocks(content)
        answered: set[str] = set()
        for j, b in enumerate(blocks):
            bw = f"{where}.content[{j}]"
            if not isinstance(b, dict) or not isinstance(b.get("type"), str):
                raise MalformedMessageError(bw, "a block must be an object with a string 'type'")
            t = b["type"]
            if t == "text" and not isinstance(b.get("text"), str):
                raise MalformedMessageError(f"{bw}.text", "must be a string")
            if t == "tool_result":
                if role != "user":
                    raise MalformedMessageError(bw, "tool_result blocks belong in user messages")
                tid = b.get("tool_use_id")
                if tid not in pending:
                    raise MalformedMessageError(f"{bw}.tool_use_id",
                                                f"unexpected tool_use_id {tid!r}: no tool_use in the previous message")
                answered.add(tid)
            elif t == "tool_use":
                if role != "assistant":
                    raise MalformedMessageError(bw, "tool_use blocks belong in assistant messages")
                if not isinstance(b.get("id"), str) or not isinstance(b.get("input"), dict):
                    raise MalformedMessageError(bw, "tool_use needs a string id and an object input")
        missing = set(pending) - answered
        if missing:
            k = min(pending[x] for x in missing)
            raise MalformedMessageError(
                f"messages[{k}]",
                f"tool_use ids {sorted(missing)} were not answered by tool_result blocks in messages[{k + 1}]")
        pending = {}
        if role == "assistant":
            for b in blocks:
                if b.get("type") == "tool_use":
                    if b["id"] in pending:
                        raise MalformedMessageError(where, f"duplicate tool_use id {b['id']!r}")
                    pending[b["id"]] = i
    # a trailing assistant tool_use is allowed: the next request must answer it


def count_breakpoints(body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """All explicit cache_control markers in prefix order: (location, marker)."""
    out: list[tuple[str, dict[str, Any]]] = []
    for i, t in enumerate(body.get("tools") or []):
        if isinstance(t, dict) and isinstance(t.get("cache_control"), dict):
            out.append((f"tools[{i}]", t["cache_control"]))
    system = body.get("system")
    if isinstance(system, list):
        for j, b in enumerate(system):
            if isinstance(b, dict) and isinstance(b.get("cache_control"), dict):
                out.append((f"system[{j}]", b["cache_control"]))
    for i, m in enumerate(body.get("messages") or []):
        if not isinstance(m, dict):
            continue
        for j, b in enumerate(_blocks(m.get("content"))):
            if isinstance(b, dict):
                if isinstance(b.get("cache_control"), dict):
                    out.append((f"messages[{i}].content[{j}]", b["cache_control"]))
                if b.get("type") == "tool_result" and isinstance(b.get("content"), list):
                    for k, x in enumerate(b["content"]):
                        if isinstance(x, dict) and isinstance(x.get("cache_control"), dict):
                            out.append((f"messages[{i}].content[{j}].content[{k}]", x["cache_control"]))
    return out


def validate_request(body: Any) -> None:
    """Validate a ``POST /v1/messages`` body: required fields, messages, breakpoints, TTL order."""
    if not isinstance(body, dict):
        raise MalformedMessageError("body", "must be a JSON object")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise MalformedMessageError("model", "Field required")
    mt = body.get("max_tokens")
    if not isinstance(mt, int) or isinstance(mt, bool) or mt < 0:
        raise MalformedMessageError("max_tokens", "Field required (a non-negative integer)")
    validate_messages(body.get("messages"))
    marks = count_breakpoints(body)
    top = body.get("cache_control")
    n = len(marks) + (1 if isinstance(top, dict) else 0)
    if n > MAX_BREAKPOINTS:
        raise MalformedMessageError(
            "cache_control", f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. "
                             f"Found {n}.")
    last = -1
    for where, cc in marks:
        if cc.get("type") != "ephemeral":
            raise MalformedMessageError(f"{where}.cache_control.type", "must be 'ephemeral'")
        ttl = cc.get("ttl", "5m")
        if ttl not in _TTL_ORDER:
            raise MalformedMessageError(f"{where}.cache_control.ttl", "must be '5m' or '1h'")
        if _TTL_ORDER[ttl] < last:
            raise MalformedMessageError(
                f"{where}.cache_control.ttl",
                "a ttl='1h' cache_control block must not come after a ttl='5m' cache_control block")
        last = _TTL_ORDER[ttl]
