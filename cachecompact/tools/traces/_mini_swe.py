"""mini-swe-agent trajectories (OpenAI chat with tool_calls) and plain OpenAI chat JSON."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ._repair import repair_pairing
from .trace_model import Trace, TraceFormatError, parse_time

__all__ = ["BASH_TOOL", "openai_to_anthropic"]

# mini-swe-agent does not store its tool schema; this is the one-argument bash tool it uses.
BASH_TOOL: dict[str, Any] = {
    "name": "bash",
    "description": "Execute a bash command in the task's shell and return its output.",
    "input_schema": {
        "type": "object",
        "properties": {"command": {"type": "string", "description": "The bash command to run."}},
        "required": ["command"],
    },
}


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def openai_to_anthropic(
    path: str, messages: list[Any]
) -> tuple[str | None, list[dict[str, Any]], list[tuple[float | None, dict[str, Any] | None]], set[str]]:
    """Convert OpenAI chat messages to (system, messages, per-message (time, usage), tool names)."""
    system_parts: list[str] = []
    out: list[dict[str, Any]] = []
    extras: list[tuple[float | None, dict[str, Any] | None]] = []
    tools: set[str] = set()
    for n, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m:
            raise TraceFormatError(path, f"messages[{n}] is not a chat message")
        role = m["role"]
        raw_extra = m.get("extra")
        extra: dict[str, Any] = raw_extra if isinstance(raw_extra, dict) else {}
        ts = parse_time(extra.get("timestamp"))
        if role in ("system", "developer"):
            system_parts.append(_text(m.get("content")))
        elif role == "user":
            text = _text(m.get("content"))
            if text:
                out.append({"role": "user", "content": text})
                extras.append((ts, None))
        elif role == "assistant":
            blocks: list[dict[str, Any]] = []
            text = _text(m.get("content"))
            if text:
                blocks.append({"type": "text", "text": text})
            for k, call in enumerate(m.get("tool_calls") or []):
                fn = call.get("function") or {}
                try:
                    args = json.loads(fn.get("arguments") or "{}")
                except json.JSONDecodeError:
                    args = {"raw_arguments": fn.get("arguments")}
                if not isinstance(args, dict):
                    args = {"value": args}
                name = fn.get("name") or "tool"
                tools.add(name)
                blocks.append({"type": "tool_use", "id": _safe_id(call.get("id"), f"call_{n}_{k}"), "name": name,
                               "input": args})
            if blocks:
                raw_resp = extra.get("response")
                resp: dict[str, Any] = raw_resp if isinstance(raw_resp, dict) else {}
                out.append({"role": "assistant", "content": blocks})
                extras.append((ts, resp.get("usage") if isinstance(resp.get("usage"), dict) else None))
        elif role == "tool":
            out.append({"role": "user", "content": [{"type": "tool_result",
                                                      "tool_use_id": _safe_id(m.get("tool_call_id"), ""),
                                                      "content": _text(m.get("content")) or "(no output)"}]})
            extras.append((ts, None))
        # other roles ("exit") carry the final submission, not conversation
    return ("\n\n".join(p for p in system_parts if p) or None), out, extras, tools


def _safe_id(raw: Any, fallback: str) -> str:
    """An OpenAI tool-call id in the Anthropic alphabet (``functions.bash:0`` -> ``functions_bash_0``),
    the same on the call and its result so they still pair."""
    if not isinstance(raw, str) or not raw:
        return fallback
    return re.sub(r"[^A-Za-z0-9_-]", "_", raw)[:256]


def load_openai_chat(path: str | Path, data: Any, fmt: str = "openai-chat") -> Trace:
    """A mini-swe-agent trajectory ({"messages": [...], "info": ...}) or a bare message list."""
    p = Path(path)
    messages = data.get("messages") if isinstance(data, dict) else data
    if not isinstance(messages, list) or not messages:
        raise TraceFormatError(str(p), "no 'messages' list")
    system, msgs, extras, tool_names = openai_to_anthropic(str(p), messages)
    msgs, extras, notes = repair_pairing(msgs, extras)
    if not msgs or msgs[0]["role"] != "user":
        raise TraceFormatError(str(p), "conversation does not start with a user message")
    tools = [BASH_TOOL] if tool_names <= {"bash"} and tool_names else [
        {"name": t, "description": f"{t} (schema not recorded)", "input_schema": {"type": "object"}}
        for t in sorted(tool_names)]
    model = None
    if isinstance(data, dict):
        cfg = (data.get("info") or {}).get("config") or {}
        model = ((cfg.get("model") or {}).get("model_name")) if isinstance(cfg, dict) else None
    return Trace(name=f"{p.parent.name}/{p.name.removesuffix('.json').removesuffix('.traj')}", source=str(p),
                 format=fmt,
                 system=system, tools=tools, messages=msgs, timestamps=[x[0] for x in extras],
                 usage=[x[1] for x in extras], model=model, notes=notes)
