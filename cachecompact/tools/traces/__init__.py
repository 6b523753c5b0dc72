"""Trace loaders: Claude Code logs, mini-swe-agent / OpenAI chat, Anthropic JSON, synthetic.

``load_trace(path)`` detects the format; every failure is a `TraceFormatError` naming the
file and the reason.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ...base.errors import MalformedMessageError
from ...base.wire import message_from_dict, system_from_param, tool_from_dict
from ._mini_swe import BASH_TOOL, load_openai_chat
from ._reading import json_value, read_text
from ._synthetic import SyntheticSpec, synthetic_trace
from .claude_code_logs import is_claude_code, load_claude_code
from .trace_model import Trace, TraceFormatError, parse_time

__all__ = [
    "BASH_TOOL",
    "SyntheticSpec",
    "Trace",
    "TraceFormatError",
    "default_trace_dir",
    "discover",
    "discover_all",
    "load_trace",
    "parse_time",
    "synthetic_trace",
]


def default_trace_dir() -> Path | None:
    """``../shared/traces`` next to the working directory or the package checkout, if present."""
    env = os.environ.get("CACHECOMPACT_TRACES")
    cands = [Path(env)] if env else []
    here = Path(__file__).resolve()
    cands += [Path.cwd().parent / "shared" / "traces", here.parents[3] / "shared" / "traces"]
    for c in cands:
        if c.is_dir():
            return c
    return None


def discover(paths: list[str | Path]) -> list[Path]:
    """Expand directories to the trace files under them (``*.json`` / ``*.jsonl``), sorted."""
    return discover_all(paths)[0]


def discover_all(paths: list[str | Path]) -> tuple[list[Path], list[dict[str, str]]]:
    """`discover`, and every path it cannot use with the reason: a missing path, and under a
    folder a ``*.json(l)`` entry that is no regular file (a pipe, a device, a dangling link), so
    a run says what it left out instead of dropping it in silence. A path given by name is
    returned as it is: the loader says why it cannot read it."""
    out: list[Path] = []
    skipped: list[dict[str, str]] = []
    for p in map(Path, paths):
        if p.is_dir():
            for x in sorted(p.rglob("*")):
                if x.suffix not in (".json", ".jsonl"):
                    continue
                if x.is_file():
                    out.append(x)
                elif not x.is_dir():
                    why = "a dangling link" if x.is_symlink() and not x.exists() else "not a regular file"
                    skipped.append({"file": str(x), "reason": f"{why}, not a log file"})
        elif not p.exists() and not p.is_symlink():
            skipped.append({"file": str(p), "reason": "no such file or folder"})
        else:
            out.append(p)
    return out, skipped


def _is_anthropic(messages: list[Any]) -> bool:
    for m in messages[:20]:
        if isinstance(m, dict) and isinstance(m.get("content"), list):
            types = {b.get("type") for b in m["content"] if isinstance(b, dict)}
            if types & {"tool_use", "tool_result", "thinking"}:
                return True
        if isinstance(m, dict) and (m.get("role") == "tool" or "tool_calls" in m):
            return False
    return not any(isinstance(m, dict) and m.get("role") in ("system", "tool") for m in messages)


def load_trace(path: str | Path) -> Trace:
    """Load one trace file of any supported format; every message is checked as the API would
    (a hostile tool_use id, a message without content), so a bad file is refused by name here
    and never fails a benchmark halfway."""
    p = Path(path)
    try:
        trace = _load_any(p)
        for i, m in enumerate(trace.messages):
            message_from_dict(m, i)
        for k, t in enumerate(trace.tools):
            tool_from_dict(t, k)
        system_from_param(trace.system)
    except TraceFormatError:
        raise
    except MalformedMessageError as err:
        raise TraceFormatError(str(p), f"not a valid conversation: {err}") from None
    except (KeyError, TypeError, AttributeError, IndexError, ValueError, ArithmeticError, RecursionError,
            UnicodeError) as err:  # a shape no check above caught: still this file's problem, said in one line
        raise TraceFormatError(str(p), f"malformed ({type(err).__name__}: {str(err)[:160]})") from None
    return trace


def _load_any(p: Path) -> Trace:
    text = read_text(p)
    if not text.strip():
        raise TraceFormatError(str(p), "empty file")
    if p.suffix == ".jsonl":
        return load_claude_code(p, text)
    if not text.lstrip().startswith(("{", "[")):
        raise TraceFormatError(str(p), "not JSON: expected a JSON object, array or JSON Lines")
    try:
        data = json_value(text, str(p))
    except json.JSONDecodeError as err:
        if err.msg == "Extra data":  # several JSON values: JSON Lines under a .json name
            return load_claude_code(p, text)
        raise TraceFormatError(str(p), f"not valid JSON (truncated?): {err}") from None
    if isinstance(data, list) and data and isinstance(data[0], dict) and is_claude_code(data):
        return load_claude_code(p, text)
    if isinstance(data, dict) and str(data.get("trajectory_format", "")).startswith("mini-swe-agent"):
        return load_openai_chat(p, data, "mini-swe-agent")
    messages = data.get("messages") if isinstance(data, dict) else data
    if isinstance(messages, list) and messages:
        if _is_anthropic(messages):
            return _load_anthropic(p, data)
        return load_openai_chat(p, data, "openai-chat")
    raise TraceFormatError(str(p), "unknown trace format (expected Claude Code, mini-swe-agent, Anthropic or "
                                   "OpenAI chat JSON)")


def _load_anthropic(p: Path, data: Any) -> Trace:
    """``{"system":..., "tools":[...], "messages":[...]}`` or a bare list of Anthropic messages."""
    from ._repair import repair_pairing

    body = data if isinstance(data, dict) else {"messages": data}
    for i, m in enumerate(body["messages"]):  # the shape the pairing repair below relies on; the rest is
        c = m.get("content") if isinstance(m, dict) else None  # checked after it, as for every format
        if isinstance(m, dict) and m.get("role") in ("user", "assistant") and not (
                isinstance(c, str) or (isinstance(c, list) and all(isinstance(b, dict) for b in c))):
            raise MalformedMessageError(f"messages[{i}].content", "missing, or not a string or a list of blocks")
    msgs = [m for m in body["messages"] if isinstance(m, dict) and m.get("role") in ("user", "assistant")]
    msgs, _, notes = repair_pairing(msgs, [None] * len(msgs))
    if not msgs or msgs[0]["role"] != "user":
        raise TraceFormatError(str(p), "conversation does not start with a user message")
    return Trace(name=f"{p.parent.name}/{p.stem}", source=str(p), format="anthropic", system=body.get("system"),
                 tools=list(body.get("tools") or []), messages=msgs, timestamps=[None] * len(msgs),
                 usage=[None] * len(msgs), model=body.get("model"), notes=notes)
