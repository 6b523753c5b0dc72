"""Cache health: per-request hit rate, breaks and their causes, and a per-session report.

For each request the monitor keeps the render's block hash chain and the usage the API
reported. Hit rate = cache_read / (cache_read + cache_write + input). When a request's
hit rate falls below 0.8 x the rolling baseline (mean of the previous ``window`` requests
of the same conversation), it warns through logging and a ``cache_break`` event naming the
first divergent block (tools, system, or message i block j), whether a ledger edit explains
it, the idle gap (an expired TTL explains a miss too), and the API's ``cache_miss_reason``
when diagnostics were requested. An unexplained divergence is a regression: a timestamp
in the system prompt, a tool description that changes per request, and so on.

Conversations are keyed by their first message, not by the session: a system prompt that
changes every request gives a new immutable prefix, hence a new session, each time, and
the monitor still compares it with the previous request of the same conversation.
"""

from __future__ import annotations

import statistics
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from .events import Event, EventBus
from .render import RenderResult
from .store import REQUESTS

__all__ = ["CacheMonitor", "RequestRecord", "hit_rate", "load_records", "session_report"]


def hit_rate(usage: dict[str, Any]) -> float:
    read = int(usage.get("cache_read_input_tokens") or 0)
    write = int(usage.get("cache_creation_input_tokens") or 0)
    inp = int(usage.get("input_tokens") or 0)
    total = read + write + inp
    return read / total if total else 0.0


class RequestRecord(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One line of a session's ``requests.jsonl``."""

    time: float
    session_id: str
    model: str
    usage: dict[str, Any]
    hit_rate: float
    cost_usd: float
    est_tokens: int
    ledger_entries: int
    baseline: float | None = None
    cache_break: bool = False
    divergence: str | None = None  # where the first changed block is
    explained_by: int | None = None  # ledger entry seq
    idle_s: float | None = None
    cache_miss_reason: dict[str, Any] | None = None
    message_id: str | None = None


@dataclass(slots=True)
class _Conversation:
    last: RenderResult | None = None
    last_session: str | None = None
    last_time: float | None = None
    rates: list[float] = field(default_factory=list)


class CacheMonitor:
    """Watches every request the middleware sends; thread-safe per conversation by its caller."""

    def __init__(self, events: EventBus | None = None, *, window: int = 10, ratio: float = 0.8,
                 ttl_s: float = 300.0, keep_conversations: int = 256) -> None:
        self.events = events or EventBus()
        self.window, self.ratio, self.ttl_s = window, ratio, ttl_s
        self._conv: OrderedDict[bytes, _Conversation] = OrderedDict()
        self._keep = keep_conversations

    def _conversation(self, key: bytes) -> _Conversation:
        c = self._conv.get(key)
        if c is None:
            c = self._conv[key] = _Conversation()
            while len(self._conv) > self._keep:
                self._conv.popitem(last=False)
        self._conv.move_to_end(key)
        return c

    def record(self, *, conversation: bytes, session_id: str, render: RenderResult, usage: dict[str, Any],
               now: float, model: str, cost_usd: float, ledger_entries: int,
               cache_miss_reason: dict[str, Any] | None = None, message_id: str | None = None) -> RequestRecord:
        conv = self._conversation(conversation)
        rate = hit_rate(usage)
        baseline = statistics.fmean(conv.rates[-self.window:]) if conv.rates else None
        rec = RequestRecord(time=now, session_id=session_id, model=model, usage=usage, hit_rate=rate,
                            cost_usd=cost_usd, est_tokens=render.tokens, ledger_entries=ledger_entries,
                            baseline=baseline, cache_miss_reason=cache_miss_reason, message_id=message_id)
        if conv.last_time is not None:
            rec.idle_s = now - conv.last_time
        if conv.last is not None:
            div = render.first_divergence(conv.last)
            if div is not None:
                rec.divergence = str(div.location)
                same = conv.last_session == session_id
                rec.explained_by = div.explained_by.seq if (div.explained_by is not None and same) else None
        if baseline is not None and rate < self.ratio * baseline:
            rec.cache_break = True
            self.events.emit(Event(
                "cache_break", session_id, reason=self._cause(rec), tokens_before=render.tokens,
                tokens_after=render.tokens,
                detail={"hit_rate": rate, "baseline": baseline, "divergence": rec.divergence,
                        "explained_by": rec.explained_by, "idle_s": rec.idle_s,
                        "cache_miss_reason": cache_miss_reason}))
        conv.rates.append(rate)
        conv.last, conv.last_session, conv.last_time = render, session_id, now
        return rec

    def _cause(self, rec: RequestRecord) -> str:
        where = rec.divergence or "no divergent block"
        if rec.idle_s is not None and rec.idle_s > self.ttl_s:
            why = f"cache expired: idle {rec.idle_s:.0f}s > TTL {self.ttl_s:.0f}s"
        elif rec.explained_by is not None:
            why = f"explained by ledger entry #{rec.explained_by}"
        elif rec.divergence is not None:
            why = "NOT explained by any ledger edit: a regression (e.g. a timestamp in the system prompt)"
        else:
            why = "no local cause found (server-side eviction or routing)"
        api = f"; API says {rec.cache_miss_reason.get('type')}" if rec.cache_miss_reason else ""
        base = rec.baseline or 0.0
        return f"hit rate {rec.hit_rate:.2f} < {self.ratio} x baseline {base:.2f} at {where}: {why}{api}"


def load_records(session_dir: str | Path) -> list[RequestRecord]:
    p = Path(session_dir) / REQUESTS
    if not p.exists():
        return []
    dec = msgspec.json.Decoder(RequestRecord)
    out = []
    for line in p.read_bytes().split(b"\n"):
        if line.strip():
            try:
                out.append(dec.decode(line))
            except msgspec.DecodeError:  # a torn last line of an informational log
                continue
    return out


def session_report(session_dir: str | Path, plot: str | Path | None = None) -> str:
    """Hit rate over time, breaks with causes, cost and compactions for one session directory."""
    from .session import Session

    d = Path(session_dir)
    sess = Session.open(d)
    recs = load_records(d)
    lines = [f"session {sess.session_id}  ({d})",
             f"transcript: {len(sess)} messages; ledger: {len(sess.ledger)} edits; prefix {sess.prefix_hash}"]
    if recs:
        total = sum(r.cost_usd for r in recs)
        reads = sum(int(r.usage.get("cache_read_input_tokens") or 0) for r in recs)
        alls = sum(sum(int(r.usage.get(k) or 0) for k in ("cache_read_input_tokens", "cache_creation_input_tokens",
                                                            "input_tokens")) for r in recs)
        lines.append(f"requests: {len(recs)}; cost ${total:.4f}; overall hit rate {reads / alls if alls else 0:.3f}")
        lines.append("")
        lines.append("  #  hit   cost       tokens  note")
        for i, r in enumerate(recs):
            note = ""
            if r.cache_break:
                note = f"BREAK at {r.divergence or '-'}" + (f" (ledger #{r.explained_by})" if r.explained_by is not None
                                                            else "")
                if r.idle_s is not None and r.idle_s > 300:
                    note += f" idle {r.idle_s:.0f}s"
                if r.cache_miss_reason:
                    note += f" API: {r.cache_miss_reason.get('type')}"
            lines.append(f"{i:3d}  {r.hit_rate:.2f}  ${r.cost_usd:.5f}  {r.est_tokens:7d}  {note}")
    else:
        lines.append("requests: none recorded")
    if sess.ledger.entries:
        lines.append("")
        lines.append("compactions:")
        for e in sess.ledger.entries:
            lines.append(f"  #{e.seq} {e.level} {e.kind} {e.start}..{e.end} {e.tokens_before}->{e.tokens_after} "
                         f"{e.reason[:70]}")
    if plot is not None and recs:
        _plot(recs, sess, Path(plot))
        lines.append(f"\nplot written to {plot}")
    return "\n".join(lines)


def _plot(recs: list[RequestRecord], sess: Any, out: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:  # the optional [plot] extra
        raise RuntimeError("plotting needs matplotlib: pip install 'cachecompact[plot]'") from err
    fig, ax = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    xs = list(range(len(recs)))
    ax[0].plot(xs, [r.hit_rate for r in recs], label="hit rate")
    ax[0].scatter([i for i, r in enumerate(recs) if r.cache_break],
                  [r.hit_rate for r in recs if r.cache_break], color="red", label="cache break", zorder=3)
    ax[0].set_ylabel("cache hit rate")
    ax[0].legend()
    cum, c = [], 0.0
    for r in recs:
        c += r.cost_usd
        cum.append(c)
    ax[1].plot(xs, cum, label="cumulative cost ($)")
    ax[1].set_xlabel("request")
    ax[1].set_ylabel("$")
    ax[1].legend()
    fig.suptitle(f"session {sess.session_id[:12]}")
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
