"""Request validation as the Messages API does it, with the API's kind of message and a path.

Every check raises `MalformedMessageError(where, problem)`, which the emulator answers with
400 ``invalid_request_error``. Per-message checks are pure functions of the message (its
index only names places in errors), so the emulator memoises them by the message's bytes:
a long conversation is validated once per new message, not once per request.

Checked: types and ranges of the top-level parameters (``max_tokens``, ``temperature``,
``top_p``, ``top_k``, ``stream``, ``stop_sequences``, ``tool_choice``, ``thinking``,
``metadata``...), tool definitions (objects, unique names, schema objects), system blocks,
every content block (non-empty text, tool ids, image sources, ``cache_control`` markers),
roles, tool pairing (every ``tool_use`` answered in the next message, no stray result), at
most 4 breakpoints and 1-hour TTLs before 5-minute ones.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

from ..base.errors import MalformedMessageError
from .cache_keys import check_marker, check_marker_order

__all__ = ["MessageInfo", "check_message", "check_pairing", "check_request", "count_breakpoints",
           "validate_messages", "validate_request"]

_ROLES = ("user", "assistant", "system")
# block types the API documents besides the ones checked field by field (server tools' uses and
# results are recognised by their suffix)
_OTHER_TYPES = frozenset({"redacted_thinking", "search_result", "container_upload", "tool_reference", "browser_state"})
# what a tool_result's content list may hold: the SDK's ``ToolResultBlockParam.Content`` union
# (anthropic 2.16, ``types/tool_result_block_param.py``). ``tool_reference`` is what Claude Code's
# ToolSearch returns (``{"type": "tool_reference", "tool_name": ...}``), and the API bills it.
_RESULT_TYPES = ("text", "image", "document", "search_result", "tool_reference", "browser_state")
_TOOL_ID = re.compile(r"^[A-Za-z0-9_-]{1,256}$")
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
_IMAGE_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")


def _bad(where: str, problem: str) -> MalformedMessageError:
    return MalformedMessageError(where, problem)


def _is_int(v: Any) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(v)


def _check_cc(cc: Any, where: str) -> str | None:
    """A ``cache_control`` marker: its TTL, or None when absent (the one rule, `cache_keys.check_marker`)."""
    return check_marker(cc, where)


@dataclass(frozen=True, slots=True)
class MessageInfo:
    """What the pairing and breakpoint checks need of one valid message."""

    role: str
    use_ids: tuple[str, ...]
    result_ids: tuple[str, ...]
    markers: tuple[tuple[str, str], ...]  # (path suffix within the message, ttl)
    compaction_first: bool = False  # opens with a compaction block: may start the conversation as an assistant turn


def _check_text(b: dict[str, Any], where: str) -> None:
    t = b.get("text")
    if not isinstance(t, str):
        raise _bad(f"{where}.text", "must be a string")
    if not t:
        raise _bad(f"{where}.text", "text content blocks must be non-empty")


def _check_source(src: Any, where: str, kind: str) -> None:
    if not isinstance(src, dict) or not isinstance(src.get("type"), str):
        raise _bad(f"{where}.source", f"{kind} source must be an object with a type")
    st = src["type"]
    if st == "base64":
        data = src.get("data")
        if not isinstance(data, str):
            raise _bad(f"{where}.source.data", "must be a base64 string")
        try:
            base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            raise _bad(f"{where}.source.data", "is not valid base64") from None
        if kind == "image" and src.get("media_type") not in _IMAGE_TYPES:
            raise _bad(f"{where}.source.media_type", f"must be one of {', '.join(_IMAGE_TYPES)}")
    elif st == "url" and not isinstance(src.get("url"), str):
        raise _bad(f"{where}.source.url", "must be a string")


def _check_block(b: Any, where: str, role: str, markers: list[tuple[str, str]], suffix: str) -> str:
    if not isinstance(b, dict) or not isinstance(b.get("type"), str):
        raise _bad(where, "a content block must be an object with a string 'type'")
    t: str = b["type"]
    ttl = _check_cc(b.get("cache_control"), where)
    if ttl is not None:
        if t in ("thinking", "redacted_thinking"):
            raise _bad(f"{where}.cache_control", "thinking blocks cannot carry cache_control")
        markers.append((suffix, ttl))
    if t == "text":
        _check_text(b, where)
    elif t in ("image", "document"):
        if role != "user" and t == "image":
            raise _bad(where, "image blocks belong in user messages")
        _check_source(b.get("source"), where, t)
    elif t == "tool_use":
        if role != "assistant":
            raise _bad(where, "tool_use blocks belong in assistant messages")
        if not isinstance(b.get("id"), str) or not _TOOL_ID.match(b["id"]):
            raise _bad(f"{where}.id", f"must match {_TOOL_ID.pattern}")
        if not isinstance(b.get("name"), str) or not b["name"]:
            raise _bad(f"{where}.name", "must be a non-empty string")
        if not isinstance(b.get("input"), dict):
            raise _bad(f"{where}.input", "must be an object")
    elif t == "tool_result":
        if role != "user":
            raise _bad(where, "tool_result blocks belong in user messages")
        tid = b.get("tool_use_id")
        if not isinstance(tid, str) or not _TOOL_ID.match(tid):
            raise _bad(f"{where}.tool_use_id", f"must match {_TOOL_ID.pattern}")
        if "is_error" in b and not isinstance(b["is_error"], bool):
            raise _bad(f"{where}.is_error", "must be a boolean")
        c = b.get("content")
        if isinstance(c, list):
            for k, x in enumerate(c):
                if not isinstance(x, dict) or x.get("type") not in _RESULT_TYPES:
                    raise _bad(f"{where}.content[{k}]", "tool_result content blocks must be one of "
                                                        f"{', '.join(_RESULT_TYPES)}")
                _check_block(x, f"{where}.content[{k}]", "user", markers, f"{suffix}.content[{k}]")
        elif c is not None and not isinstance(c, str):
            raise _bad(f"{where}.content", "must be a string or a list of blocks")
    elif t == "thinking":
        if role != "assistant":
            raise _bad(where, "thinking blocks belong in assistant messages")
        if not isinstance(b.get("thinking"), str):
            raise _bad(f"{where}.thinking", "must be a string")
        if "signature" in b and not isinstance(b["signature"], str):
            raise _bad(f"{where}.signature", "must be a string")
    elif t == "compaction":  # a server compaction's summary, sent back (anthropic-cache-facts.md §3.2, §3.5: "as
        # an assistant message of its own or as the first content block of the first message, whether that is a
        # user or assistant message")
        if role != "assistant" and (role != "user" or b.get("signature") is None):
            raise _bad(where, "compaction blocks belong in assistant messages (a signed on-demand block may also "
                              "open a user message)")
        c = b.get("content")
        if c is not None and not isinstance(c, str):
            raise _bad(f"{where}.content", "must be a string or null")
        if c == "":
            raise _bad(f"{where}.content", "Empty string content is not allowed")
    elif t == "redacted_thinking" and not isinstance(b.get("data"), str):
        raise _bad(f"{where}.data", "must be a string")
    elif t == "tool_reference" and not (isinstance(b.get("tool_name"), str) and b["tool_name"]):
        raise _bad(f"{where}.tool_name", "must be a non-empty string")
    elif t == "browser_state" and not isinstance(b.get("tabs"), list):
        raise _bad(f"{where}.tabs", "must be a list")
    elif t not in _OTHER_TYPES and not t.endswith(("_tool_result", "_tool_use")):
        raise _bad(f"{where}.type", f"Input tag {t[:40]!r} found using 'type' does not match any of the expected "
                                    "tags")
    return t


def check_message(m: Any, i: int) -> MessageInfo:
    """Shape of message ``i`` (pairing is `check_pairing`'s)."""
    where = f"messages[{i}]"
    if not isinstance(m, dict):
        raise _bad(where, "must be an object")
    role = m.get("role")
    if role not in _ROLES:
        raise _bad(f"{where}.role", f"unknown role {str(role)[:40]!r}; expected 'user' or 'assistant'")
    content = m.get("content")
    if content is None:
        raise _bad(f"{where}.content", "Field required")
    markers: list[tuple[str, str]] = []
    uses: list[str] = []
    results: list[str] = []
    if isinstance(content, str):
        if not content:
            raise _bad(f"{where}.content", "must not be empty")
    elif isinstance(content, list):
        if not content:
            raise _bad(f"{where}.content", "must not be empty")
        for j, b in enumerate(content):
            t = _check_block(b, f"{where}.content[{j}]", str(role), markers, f".content[{j}]")
            if role == "system" and t != "text":
                raise _bad(f"{where}.content[{j}]", "system messages hold text blocks only")
            if t == "tool_use":
                uses.append(b["id"])
            elif t == "tool_result":
                if b["tool_use_id"] in results:
                    raise _bad(f"{where}.content[{j}].tool_use_id", f"duplicate tool_result for {b['tool_use_id']!r}")
                results.append(b["tool_use_id"])
        if len(set(uses)) != len(uses):
            raise _bad(f"{where}.content", "duplicate tool_use ids")
    else:
        raise _bad(f"{where}.content", "must be a string or a list of blocks")
    opens = isinstance(content, list) and isinstance(content[0], dict) and content[0].get("type") == "compaction"
    return MessageInfo(str(role), tuple(uses), tuple(results), tuple(markers), opens)


def check_pairing(infos: Sequence[MessageInfo]) -> None:
    """Roles and tool pairing: the first message is the user's; every tool_use is answered by a
    tool_result in the next message; no tool_result answers nothing; tool_use ids are unique."""
    if not infos:
        raise _bad("messages", "at least one message is required")
    first = next((k for k, x in enumerate(infos) if x.role != "system"), None)
    # "Put the block first in messages, either as an assistant message of its own or as the first content
    # block of the first message" (on-demand compaction): then an assistant turn may come first
    if first is None or (infos[first].role != "user" and not infos[first].compaction_first):
        raise _bad(f"messages[{first or 0}].role", "the first message must be from the user")
    seen: set[str] = set()
    pending: tuple[str, ...] = ()
    pending_at = -1
    for i, info in enumerate(infos):
        answered = set(info.result_ids)
        stray = answered - set(pending)
        if stray:
            raise _bad(f"messages[{i}]", f"unexpected tool_use_id {sorted(stray)[0]!r} in tool_result blocks: each "
                                         "tool_result must have a corresponding tool_use in the previous message")
        missing = set(pending) - answered
        if missing:
            raise _bad(f"messages[{pending_at}]", f"tool_use ids were found without tool_result blocks immediately "
                                                  f"after: {', '.join(sorted(missing))}")
        for tid in info.use_ids:
            if tid in seen:
                raise _bad(f"messages[{i}]", f"duplicate tool_use id {tid!r}")
            seen.add(tid)
        pending, pending_at = info.use_ids, i
    # a trailing assistant tool_use is allowed: the next request answers it


def _check_tools(tools: Any) -> list[str]:
    """Tool definitions; returns the TTLs of their markers in order."""
    if not isinstance(tools, list):
        raise _bad("tools", "must be a list")
    names: set[str] = set()
    ttls: list[str] = []
    for i, t in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(t, dict):
            raise _bad(where, "must be an object")
        name = t.get("name")
        if not isinstance(name, str) or not _TOOL_NAME.match(name):
            raise _bad(f"{where}.name", f"must match {_TOOL_NAME.pattern}")
        if name in names:
            raise _bad(f"{where}.name", f"tool names must be unique: {name!r} appears twice")
        names.add(name)
        if ("type" not in t or t.get("type") == "custom") and not isinstance(t.get("input_schema"), dict):
            raise _bad(f"{where}.input_schema", "Field required (an object)")
        if "description" in t and not isinstance(t["description"], str):
            raise _bad(f"{where}.description", "must be a string")
        ttl = _check_cc(t.get("cache_control"), where)
        if ttl is not None:
            ttls.append(ttl)
    return ttls


def _check_system(system: Any) -> list[str]:
    if isinstance(system, str):
        return []
    if not isinstance(system, list):
        raise _bad("system", "must be a string or a list of text blocks")
    ttls = []
    for j, b in enumerate(system):
        if not isinstance(b, dict) or b.get("type") != "text":
            raise _bad(f"system[{j}]", "system blocks must be text blocks")
        _check_text(b, f"system[{j}]")
        ttl = _check_cc(b.get("cache_control"), f"system[{j}]")
        if ttl is not None:
            ttls.append(ttl)
    return ttls


def _check_params(body: dict[str, Any], max_output: int | None) -> None:
    mt = body.get("max_tokens")
    if not _is_int(mt) or mt < 0:
        raise _bad("max_tokens", "Field required (a non-negative integer)")
    if max_output is not None and mt > max_output:
        raise _bad("max_tokens", f"max_tokens: {mt} > {max_output}, which is the maximum allowed number of output "
                                 f"tokens for {body.get('model')}")
    for k, lo, hi in (("temperature", 0.0, 1.0), ("top_p", 0.0, 1.0)):
        if k in body and not (_is_num(body[k]) and lo <= body[k] <= hi):
            raise _bad(k, f"must be a number between {lo} and {hi}")
    if "top_k" in body and not (_is_int(body["top_k"]) and body["top_k"] >= 0):
        raise _bad("top_k", "must be a non-negative integer")
    if "stream" in body and not isinstance(body["stream"], bool):
        raise _bad("stream", "must be a boolean")
    ss = body.get("stop_sequences")
    if ss is not None and not (isinstance(ss, list) and all(isinstance(x, str) and x.strip() for x in ss)):
        raise _bad("stop_sequences", "must be a list of non-blank strings")
    md = body.get("metadata")
    if md is not None and (not isinstance(md, dict) or ("user_id" in md and md["user_id"] is not None
                                                           and not isinstance(md["user_id"], str))):
        raise _bad("metadata", "must be an object whose user_id is a string")
    tc = body.get("tool_choice")
    if tc is not None:
        if not isinstance(tc, dict) or tc.get("type") not in ("auto", "any", "tool", "none"):
            raise _bad("tool_choice", "must be {'type': 'auto' | 'any' | 'tool' | 'none'}")
        if tc["type"] == "tool" and not isinstance(tc.get("name"), str):
            raise _bad("tool_choice.name", "Field required when type is 'tool'")
        if tc["type"] == "tool" and tc["name"] not in {t.get("name") for t in body.get("tools") or []
                                                       if isinstance(t, dict)}:
            raise _bad("tool_choice.name", f"no tool named {str(tc['name'])[:60]!r}")
    th = body.get("thinking")
    if th is not None:
        if not isinstance(th, dict) or th.get("type") not in ("enabled", "disabled", "adaptive", "between_tools"):
            raise _bad("thinking", "must be {'type': 'enabled', 'budget_tokens': N} | {'type': 'disabled'} | "
                                   "{'type': 'adaptive'} | {'type': 'between_tools'}")
        if th["type"] == "enabled":
            bt = th.get("budget_tokens")
            if not _is_int(bt) or bt < 1024:
                raise _bad("thinking.budget_tokens", "must be an integer >= 1024")
            if _is_int(mt) and mt and bt >= mt:
                raise _bad("thinking.budget_tokens", "must be less than max_tokens")
    _check_objects(body)
    cm = body.get("context_management")
    if isinstance(cm, dict):
        edits = cm.get("edits", [])
        if not isinstance(edits, list):
            raise _bad("context_management.edits", "must be a list")
        for j, e in enumerate(edits):
            if not isinstance(e, dict) or not isinstance(e.get("type"), str):
                raise _bad(f"context_management.edits[{j}]", "must be an object with a type")
            ex = e.get("exclude_tools")
            if ex is not None and not (isinstance(ex, list) and all(isinstance(x, str) for x in ex)):
                raise _bad(f"context_management.edits[{j}].exclude_tools", "must be a list of tool names")
            for key in ("trigger", "keep", "clear_at_least"):
                v = e.get(key)
                valid = v is None or (key == "keep" and v == "all") or (
                    isinstance(v, dict) and _is_int(v.get("value")) and v["value"] >= 0)
                if not valid:
                    raise _bad(f"context_management.edits[{j}].{key}", "must be {'type': ..., 'value': N >= 0}")
    dg = body.get("diagnostics")
    if isinstance(dg, dict) and dg.get("previous_message_id") is not None \
            and not isinstance(dg["previous_message_id"], str):
        raise _bad("diagnostics.previous_message_id", "must be a string or null")


def _check_objects(body: dict[str, Any]) -> None:
    """The parameters that are objects when present, on ``messages`` and ``count_tokens`` alike."""
    for k in ("context_management", "diagnostics", "output_config"):
        if k in body and body[k] is not None and not isinstance(body[k], dict):
            raise _bad(k, "must be an object")


def check_request(body: Any, infos: Sequence[MessageInfo], *, max_output: int | None = None,
                  count_only: bool = False) -> None:
    """Everything but the per-message shapes (already in ``infos``)."""
    if not isinstance(body, dict):
        raise _bad("body", "must be a JSON object")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise _bad("model", "Field required")
    if not count_only:
        _check_params(body, max_output)
    else:
        _check_objects(body)
    ttls = _check_tools(body["tools"]) if body.get("tools") is not None else []
    ttls += _check_system(body["system"]) if body.get("system") is not None else []
    check_pairing(infos)
    marks = ttls + [ttl for info in infos for _, ttl in info.markers]
    check_marker_order(marks, _check_cc(body.get("cache_control"), "body"))


def validate_messages(messages: Any) -> list[MessageInfo]:
    """Shapes, roles and pairing of a message list (no memo)."""
    if not isinstance(messages, list) or not messages:
        raise _bad("messages", "must be a non-empty list")
    infos = [check_message(m, i) for i, m in enumerate(messages)]
    check_pairing(infos)
    return infos


def validate_request(body: Any, max_output: int | None = None) -> None:
    """Validate a whole ``POST /v1/messages`` body (no memo)."""
    if not isinstance(body, dict):
        raise _bad("body", "must be a JSON object")
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise _bad("messages", "must be a non-empty list")
    check_request(body, [check_message(m, i) for i, m in enumerate(msgs)], max_output=max_output)


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
        content = m.get("content") if isinstance(m, dict) else None
        for j, b in enumerate(content if isinstance(content, list) else []):
            if isinstance(b, dict):
                if isinstance(b.get("cache_control"), dict):
                    out.append((f"messages[{i}].content[{j}]", b["cache_control"]))
                if b.get("type") == "tool_result" and isinstance(b.get("content"), list):
                    for k, x in enumerate(b["content"]):
                        if isinstance(x, dict) and isinstance(x.get("cache_control"), dict):
                            out.append((f"messages[{i}].content[{j}].content[{k}]", x["cache_control"]))
    return out
