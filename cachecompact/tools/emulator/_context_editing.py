"""Server-side context editing in the emulator: the ``clear_tool_uses_20250919`` strategy.

The docs (anthropic-cache-facts.md §2) define the parameters but not whether the server's
choice of what to clear is stable from one request to the next. **Model (our choice):** the
server keeps, per conversation, how many of the oldest tool results are cleared. When the
prompt exceeds ``trigger``, it proposes to clear every result except the most recent
``keep``; with ``clear_at_least`` it only advances when that clears at least that many
tokens more than are already cleared, otherwise the previous cut stays. Without
``clear_at_least`` the cut therefore advances every request once over the trigger (the
4th-newest result is cleared each turn); with it, clearing happens in batches and the
cleared prefix is stable in between, which is what the docs say the parameter is for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import xxhash

from ...base.wire import canonical_bytes

__all__ = ["CLEARED_TEXT", "ClearToolUses", "apply_context_management"]

CLEARED_TEXT = "[Tool result cleared to save context]"  # the real placeholder text is UNCONFIRMED


@dataclass(slots=True)
class ClearToolUses:
    trigger: int = 100_000
    keep: int = 3
    clear_at_least: int = 0
    exclude: frozenset[str] = frozenset()

    @classmethod
    def from_param(cls, edit: dict[str, Any]) -> ClearToolUses:
        def value(key: str, default: int) -> int:
            v = edit.get(key)
            return int(v.get("value", default)) if isinstance(v, dict) else default

        return cls(trigger=value("trigger", 100_000), keep=value("keep", 3),
                   clear_at_least=value("clear_at_least", 0), exclude=frozenset(edit.get("exclude_tools") or ()))


def _results(messages: list[dict[str, Any]], exclude: frozenset[str]) -> list[tuple[int, int, str]]:
    """(message index, block index, tool name) of every clearable tool_result, oldest first."""
    names: dict[str, str] = {}
    out = []
    for i, m in enumerate(messages):
        content = m.get("content")
        if not isinstance(content, list):
            continue
        for j, b in enumerate(content):
            if not isinstance(b, dict):
                continue
            if b.get("type") == "tool_use":
                names[str(b.get("id"))] = str(b.get("name"))
            elif b.get("type") == "tool_result":
                name = names.get(str(b.get("tool_use_id")), "")
                if name not in exclude:
                    out.append((i, j, name))
    return out


def apply_context_management(body: dict[str, Any], input_tokens: int, block_tokens: dict[tuple[int, int], int],
                             state: dict[bytes, int]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The body the model sees after server-side edits, and ``applied_edits`` for the response."""
    cm = body.get("context_management")
    edits = cm.get("edits") if isinstance(cm, dict) else None
    if not isinstance(edits, list):
        return body, []
    applied: list[dict[str, Any]] = []
    messages = body["messages"]
    key = xxhash.xxh3_128_digest(canonical_bytes(messages[0]) if messages else b"")
    for edit in edits:
        if not isinstance(edit, dict) or edit.get("type") != "clear_tool_uses_20250919":
            continue
        cfg = ClearToolUses.from_param(edit)
        results = _results(messages, cfg.exclude)
        cut = state.get(key, 0)
        if input_tokens > cfg.trigger:
            proposed = max(cut, len(results) - cfg.keep)
            more = sum(block_tokens.get((i, j), 0) for i, j, _ in results[cut:proposed])
            if proposed > cut and more >= cfg.clear_at_least:
                cut = proposed
        cut = min(cut, len(results))
        state[key] = cut
        if cut == 0:
            continue
        messages = [dict(m) for m in messages]
        cleared = 0
        for i, j, _ in results[:cut]:
            content = list(messages[i]["content"])
            cleared += block_tokens.get((i, j), 0)
            content[j] = {**content[j], "content": CLEARED_TEXT}
            messages[i] = {**messages[i], "content": content}
        applied.append({"type": "clear_tool_uses_20250919", "cleared_tool_uses": cut, "cleared_input_tokens": cleared})
    if not applied:
        return body, []
    return {**body, "messages": messages}, applied
