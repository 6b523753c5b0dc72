"""What a Claude Code log shows around each main-chain call, beyond the rebuilt messages: when
the request really left and its response really ended, and what happened since the call
before. The fidelity study (`fidelity`) replays with these times and classifies each call
whose hit or miss the documented rules do not reproduce by what the log shows.

Times (issue 50; each measured on the shared logs, docs/cache-model.md):

* a merged tool-result message carries the time of its first piece, but the request left after
  its last one: the request time is the latest main-chain ``user`` entry logged between the
  previous call's last response piece and this call's first (a sub-agent that ran beside it can
  make the two minutes apart);
* a response logged in pieces ends at its last piece: the cache entries a call read or wrote
  live from then (in the 2026 logs with the 5-minute TTL, calls read an entry up to 311 s after
  the previous response's end, and missed from 320 s, while 303-437 s after its request's start
  gave both);
* a resumed log's copied history carries the moment of the resume: those times are repaired as
  forensics repairs them (`load_claude_code(repair_times=True)`), and a call whose time the log
  lost is given no gap.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..traces.claude_code_logs import main_chain_entries
from ..traces.trace_model import parse_time

__all__ = ["CallFacts", "call_facts"]


@dataclass(slots=True)
class CallFacts:
    """One main-chain call, as the raw log shows it."""

    sent: float | None  # when its request left (the latest piece of what it answers); None: lost
    ended: float | None  # its response's last piece; None: lost
    resumed: bool  # since the call before: Claude Code started again (resume, startup or fork; /exit;
    #                another session id or version on the conversation's entries)
    compacted: bool  # since the call before: a compact boundary, a compact summary, SessionStart:compact
    changed: bool  # since the call before: the effort changed, or /effort, /clear, ultra effort


def _hook(e: dict[str, Any]) -> tuple[str, str] | None:
    """(hookEvent, hookName) of a hook entry: 2.1 ``progress`` (``hook_progress``) or 2.1.2xx
    ``attachment``."""
    d = e.get("data")
    if e.get("type") == "progress" and isinstance(d, dict) and d.get("type") == "hook_progress":
        return str(d.get("hookEvent")), str(d.get("hookName"))
    a = e.get("attachment")
    if e.get("type") == "attachment" and isinstance(a, dict) and a.get("hookEvent"):
        return str(a.get("hookEvent")), str(a.get("hookName"))
    return None


def call_facts(path: str | Path, message_ids: list[str | None]) -> list[CallFacts]:
    """The facts of each call answered by ``message_ids`` (in order), from the log's raw entries:
    the main chain in file order (sub-agents apart), copied times repaired."""
    # hooks stay in file order beside the chain (a SessionStart hook says a resume)
    main = main_chain_entries(path, keep=lambda e: _hook(e) is not None)
    pieces: dict[str, list[int]] = {}
    for k, e in enumerate(main):
        m = e.get("message")
        if e.get("type") == "assistant" and isinstance(m, dict) and isinstance(m.get("id"), str):
            pieces.setdefault(m["id"], []).append(k)
    out: list[CallFacts] = []
    prev_last: int | None = None
    for mid in message_ids:
        at = pieces.get(mid or "", [])
        first, last = (at[0], at[-1]) if at else (None, None)
        ends = [t for k in at if (t := parse_time(main[k].get("timestamp"))) is not None]
        lo = prev_last + 1 if prev_last is not None and first is not None and prev_last < first else first
        between = main[lo:first] if lo is not None and first is not None else []
        users = [t for e in between if e.get("type") == "user" and (t := parse_time(e.get("timestamp"))) is not None]
        head = main[prev_last] if prev_last is not None else None
        resumed = compacted = changed = False
        for e in between + ([main[first]] if first is not None else []):
            kind = e.get("type")
            if head is not None and kind in ("user", "assistant"):
                for key in ("sessionId", "version"):
                    if e.get(key) and head.get(key) and e[key] != head[key]:
                        resumed = True
            h = _hook(e)
            if h is not None and h[0] == "SessionStart":
                how = h[1].rsplit(":", 1)[-1]
                resumed |= how in ("resume", "startup", "fork")
                compacted |= how == "compact"
                changed |= how == "clear"
            if (kind == "system" and e.get("subtype") in ("compact_boundary", "microcompact_boundary")) \
                    or e.get("isCompactSummary"):
                compacted = True
            c = (e.get("message") or {}).get("content") if kind == "user" else None
            if isinstance(c, str) and "<command-name>" in c:
                resumed |= "/exit" in c
                changed |= "/effort" in c or "/clear" in c
            a = e.get("attachment")
            if kind == "attachment" and isinstance(a, dict) and a.get("type") in ("ultra_effort_enter",
                                                                                   "ultra_effort_exit"):
                changed = True
        if head is not None and first is not None and head.get("effort") != main[first].get("effort"):
            changed = True
        out.append(CallFacts(max(users) if users else None, max(ends) if ends else None, resumed, compacted, changed))
        prev_last = last if last is not None else prev_last
    return out
