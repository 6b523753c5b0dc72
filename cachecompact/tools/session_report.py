"""The per-session cache report (``cachecompact report``): requests, misses and their causes,
what they cost, compactions, and everything that went wrong.

The total is what was billed: the agent's requests plus cachecompact's own summary calls
(failed ones included). Data comes from the session's request log (each record carries the
forensics `Finding`) and its event log.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

from ..base.errors import CacheCompactError
from ..base.events import summary_cost as summary_cost_of
from ..base.pricing import billed_tokens, priced
from ..cache.forensics import is_compaction_rewrite, rewrite_cost
from ..history.ledger import GIVEN_BACK_LEVEL
from ..history.session import Session
from ..store import Store
from ._terminal import fold, shorten

__all__ = ["conversation_segments", "plot_session", "session_data", "session_report"]

_COUNTED = ("compaction", "externalized", "deferred", "failure", "refused", "breaker_open", "context_full", "skipped",
            "repeated_tool_calls", "recent_budget", "restored", "idle_summary", "compaction_requested",
            "idle_declined", "window_too_small")


def session_data(session: Session) -> dict[str, Any]:
    """Everything the report shows, as plain data (the dashboard's API serves the same)."""
    store = session.store
    typed = session.request_records()
    requests = [r.fields() for r in typed]  # the per-request rows, as plain data
    events = store.read_events() if store is not None else []
    usage_cost = sum(r.cost_usd for r in typed)
    summary_cost = sum(summary_cost_of(e) for e in events)  # the proxy's dashboard and /metrics add the same
    reads = sum(r.usage.cache_read_input_tokens for r in typed)
    total_in = sum(r.usage.prompt_tokens for r in typed)
    kinds = Counter(str(e.get("kind")) for e in events)
    # the requests the proxy recorded that were not answered 200 (its `observation` records): the ones it
    # refused itself (the context was full) and the upstream's errors; the request records hold the answered
    unanswered = [e for e in events if e.get("kind") == "observation" and e.get("status") not in (None, 200)]
    refused = sum(1 for e in unanswered if e.get("refused"))
    misses: Counter[str] = Counter()
    wasted: dict[str, float] = {}
    rewrites, rewrite_usd = 0, 0.0  # re-writes our own ledger edits caused: paid on purpose, not misses
    for r in typed:
        f = r.finding
        if is_compaction_rewrite(f):
            rewrites += 1
            # what was paid: the written tokens x (write - read) at the request's own prices, from its
            # usage (a store written before this was priced as if the old prompt had been re-written)
            rewrite_usd += rewrite_cost(priced(r.model), r.usage.to_dict())[1]
        elif f.get("cls") and f["cls"] != "read_as_expected":
            misses[f["cls"]] += 1
            wasted[f["cls"]] = wasted.get(f["cls"], 0.0) + float(f.get("wasted_usd") or 0.0)
    turns: set[int] = set()
    left_out_tokens, asked_drop = 0, 0
    for r in typed:
        th = r.thinking or {}
        turns.update(int(i) for i in th.get("left_out") or [])
        if th.get("drop_block") is not None:
            turns.add(int(th["drop_block"]))
            asked_drop += 1
        left_out_tokens += int(th.get("left_out_tokens") or 0)
    msgs = session.messages()
    invalidated = sum(1 for i in turns if i < len(msgs) and isinstance(msgs[i].get("content"), list)
                      for b in msgs[i]["content"] if isinstance(b, dict) and b.get("type") in ("thinking",
                                                                                              "redacted_thinking"))
    return {
        "session_id": session.session_id, "location": store.location if store is not None else None,
        # preserved thinking: blocks our edits invalidated, the tokens of them requests left out (summed over the
        # requests), and the requests that asked the API to drop a tool-loop turn's (history.thinking)
        "thinking": {"blocks_invalidated": invalidated, "turns": len(turns), "left_out_tokens": left_out_tokens,
                     "drop_block_requests": asked_drop},
        "messages": len(session), "ledger_entries": len(session.ledger), "prefix_hash": session.prefix_hash,
        "head": session.head, "requests": requests, "events": events,
        "cost": {"requests_usd": usage_cost, "summaries_usd": summary_cost, "total_usd": usage_cost + summary_cost},
        "hit_rate": reads / total_in if total_in else 0.0,
        "not_answered": {"refused": refused, "upstream": len(unanswered) - refused},
        "counts": {k: kinds.get(k, 0) for k in _COUNTED},
        "misses": dict(misses), "wasted_usd": wasted,
        "compaction_rewrites": {"requests": rewrites, "usd": rewrite_usd},
        "compactions": [{"seq": e.seq, "level": e.level, "kind": e.kind, "start": e.start, "end": e.end,
                         "tokens_before": e.tokens_before, "tokens_after": e.tokens_after, "reason": e.reason}
                        for e in session.ledger.entries],
    }


def conversation_segments(store: Store, session_id: str) -> list[Session]:
    """Every session of ``session_id``'s conversation, oldest first: the first one and each
    session linked to it (`Session.link`: segments after a rewrite or a changed system prompt,
    another agent under the same name), opened read-only."""
    def root_of(sid: str) -> str:
        seen = {sid}
        while True:
            link = Session.open(store, sid, readonly=True).link
            if link is None or link["session"] in seen or not store.exists(link["session"]):
                return sid
            sid = link["session"]
            seen.add(sid)

    root = root_of(session_id)
    out: list[Session] = []
    for sid in store.list(root.split(".")[0]):
        if sid == root or root_of(sid) == root:
            out.append(Session.open(store, sid, readonly=True))
    return out


def _store_of(sess: Session) -> Store | None:
    """The store holding ``sess``: its conversation's other sessions are there."""
    from ..store import FileSessionStore, FileStore

    st = sess.store
    if isinstance(st, FileSessionStore):  # a directory opened by path is in a store only under its own id
        return FileStore(st.path.parent) if st.path.name == sess.session_id else None
    owner = getattr(st, "store", None)
    return owner if isinstance(owner, Store) else None


def conversation_data(segments: list[Session]) -> dict[str, Any]:
    """`session_data` over a conversation's segments: requests in time order, totals summed."""
    parts = [session_data(s) for s in segments]
    d = dict(parts[0])
    d["requests"] = sorted(({**r, "session": p["session_id"]} for p in parts for r in p["requests"]),
                           key=lambda r: float(r.get("time") or 0.0))
    d["events"] = [e for p in parts for e in p["events"]]
    d["cost"] = {k: sum(p["cost"][k] for p in parts) for k in parts[0]["cost"]}
    reads = sum(int(r["usage"].get("cache_read_input_tokens") or 0) for r in d["requests"])
    total = sum(sum(int(r["usage"].get(k) or 0) for k in ("cache_read_input_tokens", "cache_creation_input_tokens",
                                                          "input_tokens")) for r in d["requests"])
    d["hit_rate"] = reads / total if total else 0.0
    d["counts"] = {k: sum(p["counts"][k] for p in parts) for k in _COUNTED}
    d["not_answered"] = {k: sum(p["not_answered"][k] for p in parts) for k in ("refused", "upstream")}
    d["misses"] = dict(sum((Counter(p["misses"]) for p in parts), Counter()))
    d["wasted_usd"] = {k: sum(p["wasted_usd"].get(k, 0.0) for p in parts) for k in d["misses"]}
    d["compaction_rewrites"] = {k: sum(p["compaction_rewrites"][k] for p in parts) for k in ("requests", "usd")}
    d["thinking"] = {k: sum(p["thinking"][k] for p in parts) for k in parts[0]["thinking"]}
    d["segments"] = [{"session_id": s.session_id, "link": s.link, "messages": len(s),
                      "requests": s.requests_recorded, "not_answered": p["not_answered"]}
                     for s, p in zip(segments, parts, strict=True)]
    return d


def session_report(target: Session | str | os.PathLike[str] | Store, session_id: str | None = None,
                   plot: str | os.PathLike[str] | None = None, *, detail: bool = True) -> str:
    """The text report of one session: its header, a summary by cause and by level, then (with
    ``detail``) a line per request; with ``plot`` also a PNG (the ``[plot]`` extra)."""
    if isinstance(target, Session):
        sess = target
    elif isinstance(target, Store):
        sess = Session.open(target, session_id, readonly=True)
    else:
        sess = Session.open(target, readonly=True)
    store = target if isinstance(target, Store) else _store_of(sess)
    try:
        segments = conversation_segments(store, sess.session_id) if store is not None else [sess]
    except (CacheCompactError, OSError):  # the rest of the store unreadable: this session alone
        segments = [sess]
    # the conversation's first session reports all of them; any other reports itself and names the first
    # (issue 50: `report <id>.a4` printed the root conversation)
    whole = len(segments) > 1 and segments[0].session_id == sess.session_id
    d = conversation_data(segments) if whole else session_data(sess)
    lines = [f"session {d['session_id']}  ({d['location']})",
             f"transcript: {d['messages']} messages; ledger: {d['ledger_entries']} edits; prefix {d['prefix_hash']}",
             f"head: {d['head']}"]
    if whole:  # one line each: a list of 15 in one sentence folded into a 20-line header (issue 50)
        lines.append(f"one conversation in {len(segments)} sessions (requests below name theirs):")
        lines += [f"  {s.session_id}  {s.requests_recorded} requests" + _unanswered(seg["not_answered"])
                  + (f"  ({s.link['reason']}, from {s.link['session']} at messages[{s.link.get('at', 0)}])"
                     if s.link else "  (the first)") for s, seg in zip(segments, d["segments"], strict=True)]
    elif len(segments) > 1:
        link = f" ({sess.link['reason']}, from {sess.link['session']})" if sess.link else ""
        lines.append(f"one of the {len(segments)} sessions of conversation {segments[0].session_id}{link}: this "
                     f"report is this session's alone; `cachecompact report {segments[0].session_id}` has them all")
    reqs = d["requests"]
    c = d["cost"]
    lines.append(f"requests: {len(reqs)} answered{_unanswered(d['not_answered'], ', {} not')}; cost "
                 f"${c['total_usd']:.4f} (requests ${c['requests_usd']:.4f} + summaries ${c['summaries_usd']:.4f}); "
                 f"overall hit rate {d['hit_rate']:.3f}")
    counts = {k: v for k, v in d["counts"].items() if v}
    if counts:
        lines.append("events: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    if d["misses"]:
        lines.append("cache misses: " + ", ".join(f"{k} {v} (${d['wasted_usd'][k]:.4f} wasted)"
                                                  for k, v in sorted(d["misses"].items())))
    th = d["thinking"]
    if th["blocks_invalidated"] or th["drop_block_requests"]:
        lines.append(f"thinking: {th['blocks_invalidated']} blocks in {th['turns']} turns invalidated by our edits "
                     f"(preserved thinking), left out of later requests ({th['left_out_tokens']:,} tokens in all, "
                     f"estimated); {th['drop_block_requests']} requests asked the API to drop a tool-loop turn's "
                     "thinking it could not leave out")
    cr = d["compaction_rewrites"]
    if cr["requests"]:
        lines.append(f"cache re-writes caused by the session's own compactions (deliberate; cachecompact's policy "
                     f"edits only where the saving pays for them, another strategy may not): {cr['requests']} "
                     f"(${cr['usd']:.4f})")
    lines += _summary(d)
    if reqs and detail:
        width = max((len(str(r.get("session", ""))) for r in reqs), default=0) if whole else 0
        head = "session".ljust(width) + "  " if width else ""
        lines += ["", f"   #  {head}read   write  input      cost  finding"]
        for i, r in enumerate(reqs):
            u = r["usage"]
            f = r.get("finding") or {}
            if is_compaction_rewrite(f):
                note = (f"compaction re-write (ledger entry #{f.get('explained_by')}, "
                        f"${rewrite_cost(priced(str(r.get('model') or '')), u)[1]:.4f})")
            else:
                note = "" if f.get("cls") in (None, "read_as_expected") else (
                    f"{f['cls']} at {f.get('location') or '-'} (${float(f.get('wasted_usd') or 0):.4f})"
                    + (f" [API: {f['api_reason']}]" if f.get("api_reason") else ""))
            who = f" {str(r.get('session', '')).ljust(width)} " if width else ""
            b = billed_tokens(u)  # a compaction call's are in usage.iterations, its top level zeros
            lines.append(f"{i:4d}{who} {b['cache_read_input_tokens']:6d} {b['cache_creation_input_tokens']:6d} "
                         f"{b['input_tokens']:6d} ${float(r.get('cost_usd') or 0):.5f}  {note}")
    trouble = [e for e in d["events"] if e.get("kind") in ("failure", "refused", "breaker_open", "context_full",
                                                           "deferred", "recent_budget", "window_too_small")]
    if trouble:
        lines += ["", "failures, deferrals, the breaker and the recent budget:"]
        for e in trouble[-40:]:
            lines.append(f"  {e.get('kind')} {e.get('level') or ''} {shorten(str(e.get('reason')), 110)}")
    if d["compactions"] and detail:
        lines += ["", "compactions:"]
        for e in d["compactions"]:
            lines.append(f"  #{e['seq']} {e['level']} {e['kind']} {e['start']}..{e['end']} "
                         f"{e['tokens_before']}->{e['tokens_after']} {shorten(e['reason'], 70)}")
    # a terminal's 120 columns: a long line (a conversation of many sessions) folds, indented
    text = fold("\n".join(lines))
    if plot is not None and reqs:
        plot_session(d, Path(plot))
        text += f"\n\nplot written to {plot}"
    return text


def _unanswered(n: dict[str, int], head: str = " + {} not answered") -> str:
    """The requests the proxy recorded that got no answer, in words ("" when none): those it
    refused itself (the context was full) and those the upstream answered with an error."""
    parts = ([f"{n['refused']} refused by the proxy: the context was full"] if n["refused"] else []) + \
        ([f"{n['upstream']} answered by the upstream with an error"] if n["upstream"] else [])
    return head.format(n["refused"] + n["upstream"]) + f" ({'; '.join(parts)})" if parts else ""


def _summary(d: dict[str, Any]) -> list[str]:
    """The two short tables a reader wants before the detail: what the cache misses cost, by
    cause, and what each compaction level did."""
    out: list[str] = []
    total = float(d["cost"]["total_usd"]) or 1.0
    if d["misses"]:
        out += ["", "by cause        misses    wasted  share of cost"]
        for k, n in sorted(d["misses"].items(), key=lambda kv: -float(d["wasted_usd"].get(kv[0], 0))):
            w = float(d["wasted_usd"].get(k, 0))
            out.append(f"{k[:14]:<14}  {n:6d}  ${w:8.4f}  {w / total:13.1%}")
    levels: dict[str, list[int]] = {}
    given = [0, 0]  # lines given back (`compaction.restore`): edits that add, not remove
    for e in d["compactions"]:
        row = given if e["level"] == GIVEN_BACK_LEVEL else levels.setdefault(str(e["level"]), [0, 0])
        row[0] += 1
        row[1] += int(e["tokens_before"]) - int(e["tokens_after"])
    if levels:
        out += ["", "by level   edits  tokens removed"]
        out += [f"{lv:<9}  {n:5d}  {gone:14,d}" for lv, (n, gone) in sorted(levels.items())]
    if given[0]:
        out.append(f"given back {given[0]:5d}  {-given[1]:+14,d}  (lines of hidden output the agent's calls named)")
    if out:
        out.append("(wasted: what the misses cost beyond a warm cache; tokens removed: at the edit, before growth)")
    return out


def plot_session(d: dict[str, Any], out: Path) -> None:
    """Input tokens per request (read / written / uncached) with misses marked, and cumulative cost."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:  # the optional [plot] extra
        raise RuntimeError("plotting needs matplotlib: pip install 'cachecompact[plot]'") from err
    reqs = d["requests"]
    xs = list(range(len(reqs)))
    read = [int(r["usage"].get("cache_read_input_tokens") or 0) for r in reqs]
    write = [int(r["usage"].get("cache_creation_input_tokens") or 0) for r in reqs]
    inp = [int(r["usage"].get("input_tokens") or 0) for r in reqs]
    fig, ax = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    ax[0].bar(xs, read, label="read", color="#4c9f70")
    ax[0].bar(xs, write, bottom=read, label="written", color="#e07a5f")
    ax[0].bar(xs, inp, bottom=[a + b for a, b in zip(read, write, strict=True)], label="uncached", color="#999")
    findings = [r.get("finding") or {} for r in reqs]
    ours = [i for i, f in enumerate(findings) if is_compaction_rewrite(f)]
    miss = [i for i, f in enumerate(findings)
            if f.get("cls") not in (None, "read_as_expected") and not is_compaction_rewrite(f)]
    ax[0].scatter(miss, [read[i] + write[i] + inp[i] for i in miss], color="red", marker="v", label="miss", zorder=3)
    ax[0].scatter(ours, [read[i] + write[i] + inp[i] for i in ours], color="#3d5a80", marker="D",
                  label="re-write after our compaction", zorder=3)
    ax[0].set_ylabel("input tokens")
    ax[0].legend()
    cum, c = [], 0.0
    for r in reqs:
        c += float(r.get("cost_usd") or 0.0)
        cum.append(c)
    ax[1].plot(xs, cum, label="cumulative cost ($)")
    ax[1].set_xlabel("request")
    ax[1].set_ylabel("$")
    ax[1].legend()
    fig.suptitle(f"session {str(d['session_id'])[:24]}")
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
