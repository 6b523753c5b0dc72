"""Claude Code session logs: JSONL files under ~/.claude/projects, or a JSON array of entries."""

from __future__ import annotations

import itertools
import json
import logging
from pathlib import Path
from typing import Any

from ._repair import repair_pairing
from .model import Trace, TraceFormatError, parse_time

__all__ = ["is_claude_code", "load_claude_code"]

log = logging.getLogger("cachecompact")

_CONTINUATION = "This session is being continued from a previous conversation"


def _entries(path: Path, text: str) -> list[dict[str, Any]]:
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise TraceFormatError(str(path), f"not valid JSON (truncated?): {err}") from None
        if not isinstance(data, list):
            raise TraceFormatError(str(path), "expected a JSON array of Claude Code entries")
        return [e for e in data if isinstance(e, dict)]
    out = []
    lines = text.splitlines()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        values: list[Any] | None
        try:
            values = [json.loads(line)]
        except json.JSONDecodeError as err:
            values = _several(line)  # two entries written on one line (a log appended to concurrently)
            if values is None:
                if n == len(lines):
                    raise TraceFormatError(str(path), f"line {n}: truncated last line: {err}") from None
                raise TraceFormatError(str(path), f"line {n}: not JSON: {err}") from None
            log.warning("%s: line %d holds %d entries; read as %d", path, n, len(values), len(values))
        out += [e for e in values if isinstance(e, dict)]
    return out


def _several(line: str) -> list[Any] | None:
    """The JSON values written back to back on one line, or None if it is not such a line."""
    dec = json.JSONDecoder()
    out: list[Any] = []
    i, n = 0, len(line)
    while i < n:
        while i < n and line[i].isspace():
            i += 1
        if i == n:
            break
        try:
            v, i = dec.raw_decode(line, i)
        except json.JSONDecodeError:
            return None
        out.append(v)
    return out if len(out) > 1 else None


def is_claude_code(entries: list[dict[str, Any]]) -> bool:
    return any(e.get("type") in ("user", "assistant") and isinstance(e.get("message"), dict)
               and "sessionId" in e for e in entries[:50])


def _is_compaction_artifact(e: dict[str, Any]) -> bool:
    """Claude Code's own compaction summary and continuation boilerplate."""
    if e.get("isCompactSummary"):
        return True
    content = e.get("message", {}).get("content")
    if isinstance(content, str):
        return content.startswith(_CONTINUATION)
    if isinstance(content, list) and content and isinstance(content[0], dict):
        return str(content[0].get("text", "")).startswith(_CONTINUATION)
    return False


def load_claude_code(path: str | Path, text: str | None = None, *, keep_compaction: bool = False) -> Trace:
    """Rebuild the main-chain, uncompacted conversation with its recorded usage and times.

    Sub-agent traffic (``isSidechain``) is skipped; assistant entries that share
    ``message.id`` (one API response split over entries) are merged; consecutive user
    entries (grouped tool results) become one message; Claude Code's compaction summaries
    and continuation messages are removed, keeping the real messages before them.

    With ``keep_compaction=True`` those messages are kept instead, so that
    ``messages[c:i]`` for the last ``c`` in ``compactions`` before ``i`` is what Claude Code
    actually sent for the call answered by message ``i`` (used to check billing fidelity).
    """
    p = Path(path)
    entries = _entries(p, p.read_text(encoding="utf-8") if text is None else text)
    if not is_claude_code(entries):
        raise TraceFormatError(str(p), "no Claude Code user/assistant entries found")
    msgs: list[dict[str, Any]] = []
    extras: list[tuple[float | None, dict[str, Any] | None, str | None]] = []  # time, usage, model
    last_id: str | None = None
    model = None
    removed = 0
    cut_points: list[int] = []
    for e in entries:
        if e.get("type") not in ("user", "assistant") or e.get("isSidechain"):
            continue
        msg = e.get("message")
        if not isinstance(msg, dict) or msg.get("role") not in ("user", "assistant"):
            continue
        if _is_compaction_artifact(e):
            removed += 1
            cut_points.append(len(msgs))
            if not keep_compaction:
                continue
        content = msg.get("content")
        if isinstance(content, list):
            content = [b for b in content if isinstance(b, dict)]
        if not content:
            continue
        ts = parse_time(e.get("timestamp"))
        if msg["role"] == "assistant":
            model = msg.get("model") or model
            mid = msg.get("id")
            usage = msg.get("usage") if isinstance(msg.get("usage"), dict) else None
            if mid is not None and mid == last_id and msgs and msgs[-1]["role"] == "assistant":
                prev = msgs[-1]
                prev["content"] = list(prev["content"]) + (content if isinstance(content, list)
                                                           else [{"type": "text", "text": content}])
                extras[-1] = (extras[-1][0], usage or extras[-1][1], extras[-1][2])
                continue
            last_id = mid
            msgs.append({"role": "assistant", "content": content})
            extras.append((ts, usage, msg.get("model")))
        else:
            last_id = None
            msgs.append({"role": "user", "content": content})
            extras.append((ts, None, None))
    verb = "kept" if keep_compaction else "removed"
    notes: list[str] = []
    compactions: list[int] = []
    if keep_compaction:
        # each context since a compaction is its own conversation: repair segments separately
        bounds = [0, *cut_points, len(msgs)]
        out_m: list[dict[str, Any]] = []
        out_x: list[tuple[float | None, dict[str, Any] | None, str | None]] = []
        for lo, hi in itertools.pairwise(bounds):
            if lo >= hi:
                continue
            seg_m, seg_x, seg_notes = repair_pairing(msgs[lo:hi], extras[lo:hi])
            if lo in cut_points:
                compactions.append(len(out_m))
            if seg_m and seg_m[0]["role"] != "user":
                seg_m.insert(0, {"role": "user", "content": "[session start]"})
                seg_x.insert(0, (seg_x[0][0], None, None))
            out_m += seg_m
            out_x += seg_x
            notes += seg_notes
        msgs, extras = out_m, out_x
    else:
        # the uncompacted conversation: cut points map to the first message after the removed summary
        tagged = [(*x, k) for k, x in enumerate(extras)]
        msgs, tagged, notes = repair_pairing(msgs, tagged)
        origin = [t[3] for t in tagged]
        extras = [(t[0], t[1], t[2]) for t in tagged]
        compactions = sorted({next((i for i, o in enumerate(origin) if o >= c), len(origin)) for c in cut_points})
    if removed:
        notes.append(f"{verb} {removed} Claude Code compaction/continuation message(s)")
    if not msgs:
        raise TraceFormatError(str(p), "no main-chain messages")
    if msgs[0]["role"] != "user":
        msgs.insert(0, {"role": "user", "content": "[session start]"})
        extras.insert(0, (extras[0][0], None, None))
        compactions = [c + 1 for c in compactions]
        notes.append("inserted a user message before a leading assistant message")
    return Trace(
        name=f"{p.parent.name}/{p.stem.removesuffix('__chat')}", source=str(p), format="claude-code", system=None,
        tools=[], messages=msgs,
        timestamps=[x[0] for x in extras], usage=[x[1] for x in extras], model=model, notes=notes,
        compactions=compactions, models=[x[2] for x in extras],
    )
