"""Make a recorded conversation API-valid without inventing content: fix tool pairing."""

from __future__ import annotations

from typing import Any

__all__ = ["repair_pairing"]

MISSING_RESULT = "[no tool result was recorded for this call]"
# between two replies the log holds back to back (a reply that was interrupted and asked again):
# each was a real API call, so both stay, with a user turn between as the API needs
NO_USER_TURN = "[no user message was recorded between these two replies]"


def _blocks(m: dict[str, Any]) -> list[dict[str, Any]]:
    c = m["content"]
    return [{"type": "text", "text": c}] if isinstance(c, str) else list(c)


def _placeholder(tool_id: str) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": tool_id, "content": MISSING_RESULT, "is_error": True}


def repair_pairing(
    messages: list[dict[str, Any]], extras: list[Any]
) -> tuple[list[dict[str, Any]], list[Any], list[str]]:
    """Merge consecutive user messages, separate consecutive assistant messages by a marked user
    turn, drop orphan tool_results, answer unanswered tool_uses (a trailing call may stay
    pending) and drop empty messages. ``extras[i]`` rides along with message i (the first one
    wins on a merge)."""
    notes: list[str] = []
    merged: list[dict[str, Any]] = []
    merged_extras: list[Any] = []
    for m, ex in zip(messages, extras, strict=True):
        if merged and merged[-1]["role"] == "user" and m["role"] == "user":
            merged[-1] = {**merged[-1], "content": _blocks(merged[-1]) + _blocks(m)}
            continue
        merged.append(m)
        merged_extras.append(ex)

    out: list[dict[str, Any]] = []
    out_extras: list[Any] = []
    pending: list[str] = []
    for m, ex in zip(merged, merged_extras, strict=True):
        blocks = _blocks(m)
        if m["role"] == "user":
            kept = [b for b in blocks if b.get("type") != "tool_result" or b.get("tool_use_id") in pending]
            if len(kept) != len(blocks):
                notes.append(f"dropped {len(blocks) - len(kept)} orphan tool_result block(s)")
            answered = {b.get("tool_use_id") for b in kept if b.get("type") == "tool_result"}
            missing = [i for i in pending if i not in answered]
            if missing:
                notes.append(f"answered {len(missing)} unrecorded tool call(s) with a placeholder")
            # the API wants tool_result blocks first in the message
            blocks = [_placeholder(i) for i in missing] + sorted(
                kept, key=lambda b: 0 if b.get("type") == "tool_result" else 1)
            pending = []
        else:
            if pending:
                notes.append(f"answered {len(pending)} unrecorded tool call(s) with a placeholder")
                out.append({"role": "user", "content": [_placeholder(i) for i in pending]})
                out_extras.append(ex)
            elif out and out[-1]["role"] == "assistant" and blocks:
                notes.append("put a marked user turn between two consecutive replies")
                out.append({"role": "user", "content": NO_USER_TURN})
                out_extras.append(ex)
            pending = [b["id"] for b in blocks if b.get("type") == "tool_use"]
        if not blocks:
            continue
        keep_str = isinstance(m["content"], str) and len(blocks) == 1 and blocks[0].get("type") == "text"
        out.append({**m, "content": m["content"] if keep_str else blocks})
        out_extras.append(ex)
    return out, out_extras, notes
