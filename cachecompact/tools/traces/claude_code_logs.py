"""Claude Code session logs: JSONL files under ~/.claude/projects, or a JSON array of entries."""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._reading import check_usage, finite, json_value, read_text
from ._repair import repair_pairing
from .trace_model import Trace, TraceFormatError, parse_time

__all__ = ["CLEARED", "is_claude_code", "load_claude_code", "main_chain_entries", "threads"]

log = logging.getLogger("cachecompact")

_CONTINUATION = "This session is being continued from a previous conversation"


def _entries(path: Path, text: str) -> list[dict[str, Any]]:
    """The log's entries, each checked where later steps read it (`_check_entry`): a bad line is a
    `TraceFormatError` naming it, never an exception several steps later."""
    where = str(path)
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            data = json_value(text, where)
        except json.JSONDecodeError as err:
            raise TraceFormatError(where, f"not valid JSON (truncated?): {err}") from None
        if not isinstance(data, list):
            raise TraceFormatError(where, "expected a JSON array of Claude Code entries")
        entries = [e for e in data if isinstance(e, dict)]
        for k, e in enumerate(entries):
            _check_entry(e, where, f"entry {k}")
        return entries
    out = []
    lines = text.splitlines()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        values: list[Any] | None
        try:
            values = [json_value(line, where, n)]
        except json.JSONDecodeError as err:
            values = _several(line, where, n)  # two entries written on one line (a log appended to concurrently)
            if values is None:
                if n == len(lines) and n > 1:
                    raise TraceFormatError(where, f"line {n}: truncated last line: {err}") from None
                raise TraceFormatError(where, f"line {n}: not JSON: {err}") from None
            log.warning("%s: line %d holds %d entries; read as %d", path, n, len(values), len(values))
        for e in values:
            if isinstance(e, dict):
                _check_entry(e, where, f"line {n}")
                out.append(e)
    return out


def _check_entry(e: dict[str, Any], where: str, at: str) -> None:
    """The fields of an entry that the loader reads, in the types Claude Code writes them; a
    user or assistant message's ``content`` a string or a list of objects, its ``model`` and
    ``id`` strings, its ``usage`` token counts (`check_usage`), a boundary's tool ids a list."""
    msg = e.get("message")
    if e.get("type") in ("user", "assistant") and msg is not None:
        if not isinstance(msg, dict):
            raise TraceFormatError(where, f"{at}: message is not an object")
        c = msg.get("content")
        if c is not None and not (isinstance(c, str) or (isinstance(c, list) and all(
                isinstance(b, dict) and isinstance(b.get("type"), str) for b in c))):
            raise TraceFormatError(where, f"{at}: message.content is neither text nor a list of typed blocks")
        for k in ("model", "id"):
            if msg.get(k) is not None and not isinstance(msg[k], str):
                raise TraceFormatError(where, f"{at}: message.{k} is not a string")
        for b in c if isinstance(c, list) else ():
            if b["type"] == "tool_use" and not (isinstance(b.get("id"), str) and isinstance(b.get("name"), str)):
                raise TraceFormatError(where, f"{at}: a tool_use block without a string id and name")
            if b["type"] == "tool_result" and not isinstance(b.get("tool_use_id"), str):
                raise TraceFormatError(where, f"{at}: a tool_result block without a string tool_use_id")
        check_usage(msg.get("usage"), where, at)
    for holder in (e, e.get("microcompactMetadata")):
        ids = holder.get("compactedToolIds") if isinstance(holder, dict) else None
        if ids is not None and not isinstance(ids, list):
            raise TraceFormatError(where, f"{at}: compactedToolIds is not a list")


def _several(line: str, where: str, n: int) -> list[Any] | None:
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
            _v, j = dec.raw_decode(line, i)
        except json.JSONDecodeError:
            return None
        except RecursionError:
            raise TraceFormatError(where, f"line {n}: nested too deeply to read") from None
        out.append(json_value(line[i:j], where, n))  # checked as a value of its own (NaN, surrogates)
        i = j
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


CLEARED = "[Old tool result content cleared]"  # what Claude Code's microcompact leaves in a result


def threads(entries: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]]]:
    """The main chain's entries, and each sub-agent's conversation as entries of the same shape.

    Claude Code 2.1 logs a sub-agent's calls inside ``type: progress`` entries
    (``data.type: agent_progress``, ``data.message`` holding the user or assistant entry,
    ``data.agentId``); earlier versions log them as ``isSidechain`` entries, which carry an
    ``agentId`` from 2.0 on. A sidechain entry without one joins the thread of its
    ``parentUuid``, or starts a thread of its own."""
    main: list[dict[str, Any]] = []
    agents: dict[str, list[dict[str, Any]]] = {}
    thread_of: dict[str, str] = {}  # sidechain uuid -> its thread
    for e in entries:
        kind = e.get("type")
        if kind == "progress":
            d = e.get("data")
            m = d.get("message") if isinstance(d, dict) and d.get("type") == "agent_progress" else None
            if isinstance(m, dict) and m.get("type") in ("user", "assistant") and isinstance(m.get("message"), dict):
                key = f"agent-{d.get('agentId') or e.get('parentToolUseID') or 'unnamed'}"  # type: ignore[union-attr]
                agents.setdefault(key, []).append({"type": m["type"], "message": m["message"],
                                                   "timestamp": m.get("timestamp") or e.get("timestamp")})
            continue
        if e.get("isSidechain"):
            if kind in ("user", "assistant"):
                key = (f"agent-{e['agentId']}" if e.get("agentId") else
                       thread_of.get(str(e.get("parentUuid"))) or f"sidechain-{len(agents) + 1}")
                thread_of[str(e.get("uuid"))] = key
                agents.setdefault(key, []).append(e)
            continue
        main.append(e)
    return main, agents


def load_claude_code(path: str | Path, text: str | None = None, *, keep_compaction: bool = False,
                     repair_times: bool = False) -> Trace:
    """Rebuild the main-chain, uncompacted conversation with its recorded usage and times.

    Assistant entries that share ``message.id`` (one API response split over entries) are
    merged; consecutive user entries (grouped tool results) become one message; Claude Code's
    compaction summaries and continuation messages are removed, keeping the real messages
    before them. ``compact_boundary`` and ``microcompact_boundary`` entries are recorded in
    ``boundaries`` and ``compactions``. Sub-agent conversations (see `threads`) are loaded
    the same way into ``subagents``, so their calls count in usage and forensics.

    With ``keep_compaction=True`` those messages are kept instead, so that
    ``messages[c:i]`` for the last ``c`` in ``compactions`` before ``i`` is what Claude Code
    actually sent for the call answered by message ``i`` (used to check billing fidelity):
    after a microcompact the segment restarts with a copy of the history whose cleared
    results read as Claude Code sent them.

    With ``repair_times=True`` (forensics) a resumed session's copied times are replaced by its
    tools' hook times, or by None where the log has none (`_true_times`); replays keep the
    times as logged, which the benchmark's tables were measured with.
    """
    p = Path(path)
    entries = _entries(p, read_text(p) if text is None else text)
    if not is_claude_code(entries):
        raise TraceFormatError(str(p), "no Claude Code user/assistant entries found")
    entries, again = _once_per_uuid(entries)
    main, agents = threads(entries)
    name = f"{p.parent.name}/{p.stem.removesuffix('__chat')}"
    hooks = _tool_times(entries) if repair_times else {}

    def timed(es: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return _true_times(es, hooks) if repair_times else es

    trace = _conversation(timed(main), name, str(p), keep_compaction)
    if again:
        trace.notes.append(f"{again} entr{'y' if again == 1 else 'ies'} written again under a uuid already read "
                           "(a second /compact re-appends the history it summarized, anthropics/claude-code#92089); "
                           "read once")
    for key, agent_entries in agents.items():
        try:
            sub = _conversation(timed(agent_entries), f"{name}.{key}", str(p), keep_compaction)
        except TraceFormatError:
            continue  # a sub-agent that logged no complete message: nothing to bill or replay
        if sub.turns:
            trace.subagents.append(sub)
    if trace.subagents:
        trace.notes.append(f"{len(trace.subagents)} sub-agent conversation(s), "
                           f"{sum(s.turns for s in trace.subagents)} call(s), loaded apart from the main chain")
    return trace


def main_chain_entries(path: str | Path, keep: Callable[[dict[str, Any]], bool] = lambda e: False
                       ) -> list[dict[str, Any]]:
    """The log's main-chain entries in file order, each ``uuid`` once and copied times repaired
    as `load_claude_code(repair_times=True)` repairs them, with the other entries ``keep``
    accepts (hooks, say: `threads` leaves progress entries out of the chain) in their places."""
    p = Path(path)
    raw, _ = _once_per_uuid(_entries(p, read_text(p)))
    chain, _agents = threads(raw)
    repaired = {id(e): r for e, r in zip(chain, _true_times(chain, _tool_times(raw)), strict=True)}
    return [repaired.get(id(e), e) for e in raw if id(e) in repaired or keep(e)]


def _once_per_uuid(entries: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """The log's conversation entries, each ``uuid`` read once (the first time), and how many
    were written again. A second ``/compact`` appends the history it summarized to the log once
    more, under the same uuids (anthropics/claude-code#92089, in the facts' 2026-12-02 addendum);
    read twice, every message of it would be sent and billed twice. Entries without a uuid, and
    sub-agent progress entries (which carry their parent's), are all kept."""
    seen: set[str] = set()
    out: list[dict[str, Any]] = []
    for e in entries:
        u = e.get("uuid")
        if isinstance(u, str) and e.get("type") in ("user", "assistant", "system"):
            if u in seen:
                continue
            seen.add(u)
        out.append(e)
    return out, len(entries) - len(out)


def _tool_times(entries: list[dict[str, Any]]) -> dict[str, list[float]]:
    """When each tool call's hooks and progress were logged, by tool use id: entries that
    Claude Code writes as the tool runs (``toolUseID``), at the time they happened."""
    out: dict[str, list[float]] = {}
    for e in entries:
        tid = e.get("toolUseID")
        t = parse_time(e.get("timestamp")) if isinstance(tid, str) and e.get("type") != "assistant" else None
        if t is not None:
            out.setdefault(str(tid), []).append(t)
    return out


def _true_times(entries: list[dict[str, Any]], hooks: dict[str, list[float]]) -> list[dict[str, Any]]:
    """A thread's entries with copied times replaced. Claude Code writes a resumed session's
    history again, every entry stamped with the moment of the resume; two different responses
    of one thread logged in the same millisecond are such a copy (calls in one thread are
    sequential). A copied entry takes the time of its tool's hooks where the log has them (a
    response: its first tool's earliest; a tool result: its tools' latest), else no time, so
    that no idle gap is read from a copy."""
    ids_at: dict[str, set[str]] = {}
    for e in entries:
        m = e.get("message")
        if e.get("type") == "assistant" and isinstance(m, dict) and isinstance(e.get("timestamp"), str):
            ids_at.setdefault(e["timestamp"], set()).add(str(m.get("id") or e.get("uuid")))
    copied = {t for t, ids in ids_at.items() if len(ids) > 1}
    if not copied:
        return entries
    out = []
    for e in entries:
        if e.get("timestamp") not in copied:
            out.append(e)
            continue
        m = e.get("message")
        content = m.get("content") if isinstance(m, dict) else None
        blocks = [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []
        if e.get("type") == "assistant":
            seen = [t for b in blocks if b.get("type") == "tool_use" for t in hooks.get(str(b.get("id")), ())]
            t = min(seen, default=None)
        else:
            seen = [t for b in blocks if b.get("type") == "tool_result"
                    for t in hooks.get(str(b.get("tool_use_id")), ())]
            t = max(seen, default=None)
        out.append({**e, "timestamp": t})  # a number (seconds) or None: parse_time takes both
    return out


# Claude Code 2.1.286+ compacts a session of 200k tokens or more about 55 minutes after the last
# reply, before the 1-hour cache expires (../shared/docs/anthropic-cache-facts.md, 2026-12-02
# addendum: changelog rows, timing third-party). No stored source spells its boundary's trigger, so
# a boundary is read as idle when its trigger says so, or when it was written 50 to 60 minutes
# after a reply that called no tool, with nothing logged in between (a long tool run is not a
# wait; a compaction at a person's return is taken to follow that person's message in the log,
# which no stored source confirms either way). The token threshold is a user setting
# (CLAUDE_CODE_IDLE_COMPACT_MIN_TOKENS), so it is not checked.
IDLE_AFTER_S = (50 * 60.0, 60 * 60.0)
IDLE_KIND = "idle compaction"  # the compaction kind of such a boundary (`Trace.compaction_kinds`)


def _int(meta: dict[str, Any], *names: str) -> int | None:
    """The first of ``names`` that ``meta`` holds as a number (the log writes camelCase; some
    readers document snake_case)."""
    for n in names:
        v = finite(meta.get(n))
        if v is not None and abs(v) < 1 << 53:
            return int(v)
    return None


def _boundary(e: dict[str, Any]) -> dict[str, Any] | None:
    """A ``compact_boundary`` / ``microcompact_boundary`` system entry, as the trace records it.

    A compact boundary's ``compactMetadata`` (2.1.3xx: ``postTokens``, ``precomputed``,
    ``preservedMessages``, ``cumulativeDroppedTokens``, ``durationMs``, ``messagesSummarized``;
    the facts' addendum lists them) is read where present, and None where a version did not
    write it."""
    if e.get("type") != "system" or e.get("subtype") not in ("compact_boundary", "microcompact_boundary"):
        return None
    if e["subtype"] == "compact_boundary":
        cm = e.get("compactMetadata")
        meta: dict[str, Any] = cm if isinstance(cm, dict) else {}
        kept = meta.get("preservedMessages", meta.get("preserved_messages"))
        kept_ids = kept.get("uuids", []) if isinstance(kept, dict) else []
        return {"kind": "compact", "trigger": str(meta.get("trigger") or "unknown"),
                "pre_tokens": _int(meta, "preTokens", "pre_tokens") or 0,
                "post_tokens": _int(meta, "postTokens", "post_tokens"),
                "dropped_tokens": _int(meta, "cumulativeDroppedTokens", "cumulative_dropped_tokens"),
                "duration_ms": _int(meta, "durationMs", "duration_ms"),
                "messages_summarized": _int(meta, "messagesSummarized", "messages_summarized"),
                "precomputed": meta.get("precomputed") if isinstance(meta.get("precomputed"), bool) else None,
                "preserved": len(kept_ids) if isinstance(kept_ids, list) else 0,
                "idle": str(meta.get("trigger")) == "idle", "time": parse_time(e.get("timestamp"))}
    mm = e.get("microcompactMetadata")
    meta = mm if isinstance(mm, dict) else e
    ids = meta.get("compactedToolIds") or e.get("compactedToolIds") or []
    return {"kind": "microcompact", "trigger": str(meta.get("trigger") or "auto"),
            "tool_ids": [str(i) for i in ids if isinstance(i, str)],
            "tokens_saved": _int(meta, "tokensSaved") or _int(e, "tokensSaved") or 0,
            "time": parse_time(e.get("timestamp"))}


def _cleared(m: dict[str, Any], ids: set[str]) -> dict[str, Any]:
    content = m["content"]
    if m["role"] != "user" or not isinstance(content, list):
        return m
    return {**m, "content": [{**b, "content": CLEARED} if b.get("type") == "tool_result" and b.get("tool_use_id") in ids
                             else b for b in content]}


def _conversation(entries: list[dict[str, Any]], name: str, source: str, keep_compaction: bool) -> Trace:
    msgs: list[dict[str, Any]] = []
    # per message: time, usage, model, the API's message id
    extras: list[tuple[float | None, dict[str, Any] | None, str | None, str | None]] = []
    cut_kind: dict[int, str] = {}  # cut point -> what made it
    last_id: str | None = None
    open_at: int | None = None  # the assistant message that ``last_id`` names
    model = None
    removed = 0
    cut_points: list[int] = []
    boundaries: list[dict[str, Any]] = []
    waiting: float | None = None  # when a reply that called no tool ended the turn, if nothing was logged since
    reply_calls_tool = False  # the newest response called a tool (in any of its pieces)
    for e in entries:
        b = _boundary(e)
        if b is not None:
            b["index"] = len(msgs)
            if b["kind"] == "compact" and not b["idle"] and b["trigger"] != "manual" \
                    and b["time"] is not None and waiting is not None:
                b["idle"] = IDLE_AFTER_S[0] <= b["time"] - waiting <= IDLE_AFTER_S[1]
            boundaries.append(b)
            if b["kind"] == "microcompact" and b["tool_ids"]:
                if keep_compaction:  # what was sent from here on: the history with those results cleared
                    lo = max((c for c in cut_points if c <= len(msgs)), default=0)
                    ids_ = set(b["tool_ids"])
                    copies = [_cleared(m, ids_) for m in msgs[lo:]]
                    cut_points.append(len(msgs))
                    cut_kind[len(msgs)] = "microcompact"
                    extras += [(x[0], None, x[2], x[3]) for x in extras[lo:]]
                    msgs += copies
                else:
                    cut_points.append(len(msgs))
                    cut_kind[len(msgs)] = "microcompact"
            last_id, open_at = None, None
            continue
        if e.get("type") not in ("user", "assistant"):
            continue
        msg = e.get("message")
        if not isinstance(msg, dict) or msg.get("role") not in ("user", "assistant"):
            continue
        if _is_compaction_artifact(e):
            last_id, open_at = None, None
            removed += 1
            cut_points.append(len(msgs))
            cut_kind.setdefault(len(msgs), "compact")
            if not keep_compaction:
                continue
        content = msg.get("content")
        if isinstance(content, list):
            content = [b for b in content if isinstance(b, dict)]
        if not content:
            continue
        ts = parse_time(e.get("timestamp"))
        calls_tool = isinstance(content, list) and any(b.get("type") == "tool_use" for b in content)
        if msg["role"] == "assistant":  # a response logged in pieces calls a tool if any piece does
            piece = msg.get("id") is not None and msg.get("id") == last_id
            reply_calls_tool = calls_tool or (piece and reply_calls_tool)
        # the turn is over and Claude Code waits for a person only after a reply that called no
        # tool; a tool result, a person's message or a reply that calls a tool ends the wait
        waiting = ts if msg["role"] == "assistant" and not reply_calls_tool else None
        if msg["role"] == "assistant":
            model = msg.get("model") or model
            mid = msg.get("id")
            usage = msg.get("usage") if isinstance(msg.get("usage"), dict) else None
            if mid is not None and mid == last_id and open_at is not None:
                # one response logged in pieces, parallel tool calls with each one's result
                # logged in between: one call, whose results the next user message gathers
                prev = msgs[open_at]
                prev["content"] = list(prev["content"]) + (content if isinstance(content, list)
                                                           else [{"type": "text", "text": content}])
                t0, u0, m0, i0 = extras[open_at]
                extras[open_at] = (t0, usage or u0, m0, i0)
                continue
            last_id = mid
            open_at = len(msgs)
            msgs.append({"role": "assistant", "content": content})
            extras.append((ts, usage, msg.get("model"), mid if isinstance(mid, str) else None))
        else:
            if not (isinstance(content, list) and all(b.get("type") == "tool_result" for b in content)):
                last_id, open_at = None, None  # a person spoke: the response is over
            msgs.append({"role": "user", "content": content})
            extras.append((ts, None, None, None))
    cut_points = sorted(set(cut_points))
    verb = "kept" if keep_compaction else "removed"
    notes: list[str] = []
    compactions: list[int] = []
    kinds: list[str] = []
    if keep_compaction:
        # each context since a compaction is its own conversation: repair segments separately
        bounds = [0, *cut_points, len(msgs)]
        out_m: list[dict[str, Any]] = []
        out_x: list[tuple[float | None, dict[str, Any] | None, str | None, str | None]] = []
        for lo, hi in itertools.pairwise(bounds):
            if lo >= hi:
                continue
            seg_m, seg_x, seg_notes = repair_pairing(msgs[lo:hi], extras[lo:hi])
            if lo in cut_points:
                compactions.append(len(out_m))
                kinds.append(cut_kind.get(lo, "compact"))
            if seg_m and seg_m[0]["role"] != "user":
                seg_m.insert(0, {"role": "user", "content": "[session start]"})
                seg_x.insert(0, (seg_x[0][0], None, None, None))
            out_m += seg_m
            out_x += seg_x
            notes += seg_notes
        msgs, extras = out_m, out_x
    else:
        # the uncompacted conversation: cut points map to the first message after the removed summary
        tagged = [(*x, k) for k, x in enumerate(extras)]
        msgs, tagged, notes = repair_pairing(msgs, tagged)
        origin = [t[4] for t in tagged]
        extras = [(t[0], t[1], t[2], t[3]) for t in tagged]
        compactions = sorted({next((i for i, o in enumerate(origin) if o >= c), len(origin)) for c in cut_points})
        for b in boundaries:
            b["index"] = next((i for i, o in enumerate(origin) if o >= b["index"]), len(origin))
    if removed:
        notes.append(f"{verb} {removed} Claude Code compaction/continuation message(s)")
    if boundaries:
        kinds = [b["kind"] for b in boundaries]
        notes.append(", ".join(f"{kinds.count(k)} {k}_boundary" for k in ("compact", "microcompact") if k in kinds))
        idle = sum(1 for b in boundaries if b.get("idle"))
        if idle:
            notes.append(f"{idle} of them idle compaction(s), made while the person was away")
            # what forensics calls the re-write after it (`Finding.detail`)
            kinds = [IDLE_KIND if b.get("idle") else k for b, k in zip(boundaries, kinds, strict=True)]
    if not msgs:
        raise TraceFormatError(source, "no main-chain messages")
    if msgs[0]["role"] != "user":
        msgs.insert(0, {"role": "user", "content": "[session start]"})
        extras.insert(0, (extras[0][0], None, None, None))
        compactions = [c + 1 for c in compactions]
        for b in boundaries:
            b["index"] += 1
        notes.append("inserted a user message before a leading assistant message")
    return Trace(
        name=name, source=source, format="claude-code", system=None,
        tools=[], messages=msgs,
        timestamps=[x[0] for x in extras], usage=[x[1] for x in extras], model=model, notes=notes,
        compactions=compactions, models=[x[2] for x in extras], boundaries=boundaries,
        compaction_kinds=kinds if len(kinds) == len(compactions) else [],
        message_ids=[x[3] for x in extras],
    )
