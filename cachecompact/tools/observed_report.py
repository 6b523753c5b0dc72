"""`report` and `ledger verify` on a session the proxy kept in observe mode.

Observe mode forwards every request untouched, so it keeps no transcript and no ledger: a
stored observe session is ``session.json`` (``"observed": true``) and one ``observation``
record per request in the event log (what the dashboard shows: usage, cost, the forensics
finding). `report` on it reads those records; `ledger verify` checks that they are what observe
mode writes, instead of taking the absent ledger for a tampered one (issue 50: an untouched
proxy store printed INVALID).
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from typing import Any

from ..base.pricing import billed_tokens
from ..store.contract import SessionStore

__all__ = ["observed_problems", "observed_report", "observed_session"]

_RECORD_KEYS = ("i", "time", "model", "status", "usage", "cost_usd", "finding")


def observed_session(store: SessionStore) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
    """The metadata and observation records of an observe-mode session; None for a session
    that keeps a ledger."""
    meta = store.read_meta()
    if meta.get("observed") is not True:
        return None
    return meta, [e for e in store.read_events() if e.get("kind") == "observation"]


def observed_problems(meta: dict[str, Any], records: list[dict[str, Any]]) -> list[str]:
    """What is not as observe mode writes it: the metadata, and each record's fields and order."""
    out = []
    if not isinstance(meta.get("session_id"), str) or meta.get("format") != "cachecompact-session":
        out.append("session.json: not an observe-mode session's metadata (session_id, format)")
    for k, r in enumerate(records):
        missing = [key for key in _RECORD_KEYS if key not in r]
        if missing:
            out.append(f"events.jsonl: observation {k}: fields {', '.join(missing)} are missing")
        elif r["i"] != k:
            out.append(f"events.jsonl: observation {k} is numbered {r['i']}: records were removed or reordered")
    return out


def _when(t: Any) -> str:
    try:
        return datetime.fromtimestamp(float(t), UTC).strftime("%Y-%m-%d %H:%M:%S")
    except (TypeError, ValueError, OverflowError):
        return "?"


def observed_report(meta: dict[str, Any], records: list[dict[str, Any]], *, detail: bool = True) -> str:
    """The text report of an observe-mode session: what the requests cost and read, and why the
    cache missed where it did (the forensics finding each record carries)."""
    sid = meta.get("session_id", "?")
    ok = [r for r in records if r.get("status") == 200]
    usage = [r.get("usage") or {} for r in ok]
    read = sum(int(u.get("cache_read_input_tokens") or 0) for u in usage)
    prompt = sum(sum(int(u.get(k) or 0) for k in ("input_tokens", "cache_read_input_tokens",
                                                    "cache_creation_input_tokens")) for u in usage)
    cost = sum(float(r.get("cost_usd") or 0.0) for r in ok)
    wasted = sum(float((r.get("finding") or {}).get("wasted_usd") or 0.0) for r in ok)
    causes = Counter(str((r.get("finding") or {}).get("cls")) for r in ok
                     if (r.get("finding") or {}).get("cls") not in (None, "read_as_expected", "first_request"))
    lines = [f"session {sid}  (observe mode: the proxy forwarded every request untouched, so there is no "
             "transcript or ledger; these are its observation records)"]
    if meta.get("name") and meta.get("name") != sid:
        lines.append(f"  name: {meta['name']}")
    span = f", {_when(records[0].get('time'))} to {_when(records[-1].get('time'))} UTC" if records else ""
    lines.append(f"requests: {len(records)} ({len(records) - len(ok)} not answered 200){span}")
    lines.append(f"cost ${cost:.4f}; cache hit rate {read / prompt:.3f} of {prompt:,} prompt tokens; wasted "
                 f"${wasted:.4f} (what the misses cost beyond a warm cache)" if prompt else f"cost ${cost:.4f}")
    if causes:
        lines.append("misses by cause: " + ", ".join(f"{c} {n}" for c, n in causes.most_common()))
    if detail and records:
        lines += ["", "   #  time (UTC)           model                      prompt     read  written  cost $    "
                      "finding"]
        for r in records:
            u = billed_tokens(r.get("usage") or {})  # a compaction call's are in usage.iterations
            p = u["input_tokens"] + u["cache_read_input_tokens"] + u["cache_creation_input_tokens"]
            lines.append(f"{r.get('i', '?'):>4}  {_when(r.get('time'))}  {str(r.get('model'))[:25]:<25} {p:>8,} "
                         f"{u['cache_read_input_tokens']:>8,} "
                         f"{u['cache_creation_input_tokens']:>8,}  {float(r.get('cost_usd') or 0):.4f}  "
                         f"{(r.get('finding') or {}).get('cls') or ''}"
                         + ("" if r.get("status") == 200 else f" (status {r.get('status')})"))
    return "\n".join(lines)
