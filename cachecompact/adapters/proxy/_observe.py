"""What the proxy knows about each session: its requests, their usage, cost and cache findings.

`Observer` is fed one request at a time, after its response. In ``observe`` mode it builds
the request's block hash chain itself and runs the forensics engine (`cachecompact.cache.forensics`,
the one implementation); in ``compact`` mode the `CompactionEngine` has already done that and
hands over its finding. Either way the dashboard and the JSON API read the same records.

Bodies are not kept unless asked (``keep_bodies``): a record holds hashes, sizes, breakpoint
locations, usage, cost, timing and, for a miss, excerpts of at most 200 characters around the
first divergence. The previous body of each session stays in memory only, to cut those
excerpts from. Memory is bounded: at most ``max_sessions`` sessions and ``max_bytes`` of them
by their estimated size (least recently used out) and ``max_records`` records per session
(totals keep counting).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import re
import textwrap
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec
import xxhash

from ...base.errors import CacheCompactError, InvalidSessionIdError, MalformedMessageError, UnknownModelError
from ...base.events import summary_cost
from ...base.pricing import OwnPrices, priced
from ...base.tokens import TokenCounter
from ...cache.forensics import Finding, Forensics, snapshot_from_sim
from ...cache.simulator import SimRequest, request_from_body
from ...engine.identity import RequestHistory, decide, family_key, family_order, in_family, new_id, session_hint
from ...store import DeferredSync, Store

__all__ = ["ObservedSession", "Observer", "conversation_title"]

log = logging.getLogger("cachecompact")


@dataclass(eq=False)
class ObservedSession:
    sid: str
    name: str  # the base name (a hint) or the family key of the opening message
    mode: str
    preamble: bytes = b""  # tools + system (`identity.preamble_key`)
    hashes: list[bytes] = field(default_factory=list)  # identities of the last request's messages
    link: dict[str, Any] | None = None  # the session this one continues (`sessions.Decision`)
    forensics: Forensics = field(default_factory=Forensics)
    memo: dict[tuple[bytes, int], Any] = field(default_factory=dict)
    records: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=2000))
    compactions: list[dict[str, Any]] = field(default_factory=list)
    requests: int = 0
    cost_usd: float = 0.0  # everything billed: its requests and cachecompact's own summary calls for it
    summaries_usd: float = 0.0  # of which the summary calls (compact mode: `base.events.summary_cost`)
    wasted_usd: float = 0.0
    read: int = 0
    total_in: int = 0
    misses: dict[str, int] = field(default_factory=dict)
    api_agree: int = 0
    api_conclusive: int = 0
    errors: int = 0  # requests not answered 200: the upstream's errors and the proxy's own refusals
    refused: int = 0  # of which the proxy answered itself (compact mode: the context is full)
    rewrites: int = 0
    rewrite_usd: float = 0.0
    last_time: float = 0.0
    first_time: float = 0.0
    model: str = ""  # the newest request's
    title: str = ""  # what a reader knows it by: the project folder and the first prompt (`conversation_title`)
    # preserved thinking (compact mode): the turns whose thinking our edits invalidated, the tokens of it that
    # requests left out (summed), and the requests that asked the API to drop a tool-loop turn's
    thinking_turns: set[int] = field(default_factory=set)
    thinking_left_out_tokens: int = 0
    thinking_drop_requests: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    stored: Any = None  # the session in the proxy's store, once opened
    nbytes: int = 0  # estimated memory held (`Observer` caps the sum): see `Observer._add`
    body_bytes: int = 0  # the newest request body's size (observe mode keeps that body for excerpts)

    def summary(self) -> dict[str, Any]:
        return {"id": self.sid, "name": self.name, "mode": self.mode, "requests": self.requests,
                "cost_usd": round(self.cost_usd, 6), "summaries_usd": round(self.summaries_usd, 6),
                "wasted_usd": round(self.wasted_usd, 6), "refused": self.refused,
                "hit_rate": round(self.read / self.total_in, 4) if self.total_in else 0.0,
                "misses": dict(self.misses), "errors": self.errors, "last_time": self.last_time,
                "first_time": self.first_time, "duration_s": round(self.last_time - self.first_time, 3),
                "read_tokens": self.read, "prompt_tokens": self.total_in,
                "model": self.model, "title": self.title,
                "thinking": {"turns": len(self.thinking_turns), "left_out_tokens": self.thinking_left_out_tokens,
                             "drop_block_requests": self.thinking_drop_requests},
                "api_agree": self.api_agree, "api_conclusive": self.api_conclusive,
                "compactions": len(self.compactions), "compaction_rewrites": self.rewrites,
                "compaction_rewrite_usd": round(self.rewrite_usd, 6), "link": self.link}

    @property
    def identities(self) -> list[bytes]:
        return self.hashes


_WORKDIR = re.compile(r"(?:Primary )?[Ww]orking directory: *([^\s<]+)")
_TAGGED = re.compile(r"<(system-reminder|command-[a-z-]+|local-command-[a-z-]+)>.*?</\1>", re.S)


def _texts(content: Any) -> list[str]:
    """The text of a message's content (or a system prompt): a string, or the text blocks of a
    list; nothing for any other value (a number or a boolean a client sent, issue 56)."""
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        return []
    return [str(b.get("text") or "") for b in content if isinstance(b, dict) and b.get("type") == "text"]


def conversation_title(body: dict[str, Any]) -> str:
    """What a person calls a conversation: the project folder (Claude Code's system prompt names its
    working directory) and the first thing they asked, without the reminders and command markup
    Claude Code wraps around it; empty when neither is there (a session is then shown by its id)."""
    first_user = next((m for m in body.get("messages") or [] if isinstance(m, dict) and m.get("role") == "user"), None)
    asked = _texts(first_user.get("content")) if first_user is not None else []
    where = ""
    for text in [*_texts(body.get("system")), *asked]:
        found = _WORKDIR.search(text)
        if found:
            where = found.group(1).rstrip("/.").rsplit("/", 1)[-1]
            break
    prompt = next((c for c in (" ".join(_TAGGED.sub(" ", t).split()) for t in asked) if c), "")
    prompt = textwrap.shorten(prompt, 80, placeholder=" ...") if prompt else ""
    return f"{where}: {prompt}" if where and prompt else where or prompt


# what fills a request's context, by part (the dashboard's context view)
CONTEXT_PARTS = ("system", "tools", "mcp_tools", "user", "assistant", "tool_use", "tool_result", "thinking", "image")
_KIND_PART = {"tool_use": "tool_use", "tool_result": "tool_result", "thinking": "thinking",
              "redacted_thinking": "thinking", "image": "image", "document": "image"}


def context_parts(req: SimRequest, body: dict[str, Any], total: int) -> dict[str, int]:
    """The request's tokens by part (system prompt, tools, MCP tools, the messages by kind),
    scaled so that they sum to ``total``, the tokens the API counted."""
    parts = dict.fromkeys(CONTEXT_PARTS, 0)
    tools: list[Any] = body["tools"] if isinstance(body.get("tools"), list) else []
    msgs: list[Any] = body["messages"] if isinstance(body.get("messages"), list) else []
    for b in req.blocks:
        w = b.where
        if w.startswith("tools["):
            i = int(w[6:w.index("]")])
            name = tools[i].get("name") if i < len(tools) and isinstance(tools[i], dict) else ""
            key = "mcp_tools" if str(name).startswith("mcp__") else "tools"
        elif w.startswith("system"):
            key = "system"
        elif b.kind in _KIND_PART:
            key = _KIND_PART[b.kind]
        else:
            k = int(w[9:w.index("]")]) if w.startswith("messages[") else -1
            role = msgs[k].get("role") if 0 <= k < len(msgs) and isinstance(msgs[k], dict) else "user"
            key = "assistant" if role == "assistant" else "user"
        parts[key] += b.tokens
    est = sum(parts.values())
    return {k: round(v * total / est) if est else 0 for k, v in parts.items()}


# the usage fields, by the kind /metrics names them
TOKEN_KINDS = {"input_tokens": "input", "cache_read_input_tokens": "cache_read",
               "cache_creation_input_tokens": "cache_write", "output_tokens": "output"}


@dataclass
class Totals:
    """Counters over every request since the proxy started, never lowered when a session is let
    go from memory: what ``/metrics`` reports (Prometheus counters must only rise)."""

    requests: int = 0
    errors: int = 0  # answered with a status other than 200
    refused: int = 0  # of which the proxy answered itself (compact mode: the context is full)
    tokens: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TOKEN_KINDS.values(), 0))
    cost_usd: float = 0.0  # the requests and cachecompact's own summary calls (`summary_usd`)
    summary_usd: float = 0.0  # what the summary calls cost (compact mode), as `report` counts them
    wasted_usd: float = 0.0  # the misses' cost (forensics), compaction's deliberate re-writes apart
    rewrites: int = 0  # requests that re-wrote the cache after our own compaction (compact mode): not misses
    rewrite_usd: float = 0.0  # what those re-writes cost over reading: written tokens x (write - read)
    misses: dict[str, int] = field(default_factory=dict)  # by forensics class


class Observer:
    """The proxy's session records (thread-safe); optionally persisted as events in a `Store`."""

    def __init__(self, *, store: Store | None = None, keep_bodies: bool = False, max_sessions: int = 256,
                 max_records: int = 2000, id_prefix: str = "", max_bytes: int | None = None) -> None:
        self.store = store
        self.max_bytes = max_bytes  # the sessions' estimated memory (`ObservedSession.nbytes`), LRU out
        # compact mode records what it forwarded unchanged under ids of their own
        # (``passthrough-<name>``), so they never share a name with the engine's sessions in the store
        self.id_prefix = id_prefix
        self.keep_bodies = keep_bodies
        self.max_sessions = max_sessions
        self.max_records = max_records
        self.counter = TokenCounter()
        self._sessions: OrderedDict[str, ObservedSession] = OrderedDict()
        self._lock = threading.Lock()
        # the ids given out per family: an evicted session's id is never handed to another conversation
        self._issued: OrderedDict[str, set[str]] = OrderedDict()
        self.version = 0  # bumped on every record: the dashboard polls it
        self.totals = Totals()  # under _lock
        self.prices: OwnPrices | None = None  # compact mode: the engine's, so a request costs what `report` says
        # the stores written to in the batch under way (`batch`), and the thread that opened it
        self._batch: set[DeferredSync] | None = None
        self._batch_owner: int | None = None
        if store is not None:
            self._restore(store)

    def _restore(self, store: Store) -> None:
        """The sessions a proxy on this store recorded before (a restart): each rebuilt from its
        stored observation records, newest ``max_sessions`` first, so the dashboard lists them
        again (issue 50: 0 of 15 after a restart). They resume counting when the engine names them
        again (compact mode); forensics restart with the next request (no body is kept). A
        session that cannot be read is left out with a warning, never fatal."""
        found: list[ObservedSession] = []
        for sid in store.list():
            try:
                st = store.open(sid)
                meta = st.read_meta()
                events = st.read_events()
                recs = [e for e in events if e.get("kind") == "observation"]
            except (OSError, CacheCompactError, ValueError) as err:
                log.warning("cachecompact proxy: session %s not listed again: %s", sid, str(err)[:200])
                continue
            if not recs:
                continue
            mode = str(meta.get("mode") or ("observe" if meta.get("observed") else "compact"))
            x = ObservedSession(sid, str(meta.get("name") or sid.split(".")[0]), mode, stored=st,
                                link=meta.get("link") if isinstance(meta.get("link"), dict) else None)
            x.summaries_usd = sum(summary_cost(e) for e in events)  # the engine's own events, as `report` adds them
            x.cost_usd = x.summaries_usd
            for rec in recs:
                x.records.append({k: v for k, v in rec.items() if k != "kind"})
                x.requests += 1
                x.last_time = float(rec.get("time") or 0.0)
                x.first_time = x.first_time or x.last_time
                x.model = str(rec.get("model") or x.model)
                if rec.get("status") not in (None, 200):
                    x.errors += 1
                    x.refused += int(bool(rec.get("refused")))
                usage, f = rec.get("usage") or {}, rec.get("finding") or {}
                x.cost_usd += float(rec.get("cost_usd") or 0.0)
                x.read += int(usage.get("cache_read_input_tokens") or 0)
                x.total_in += _prompt_tokens(usage)
                cls = f.get("cls")
                if cls == "compaction_rewrite":
                    x.rewrites += 1
                    x.rewrite_usd += float(f.get("wasted_usd") or 0.0)
                elif cls not in (None, "read_as_expected"):
                    x.misses[cls] = x.misses.get(cls, 0) + 1
                    x.wasted_usd += float(f.get("wasted_usd") or 0.0)
            x.nbytes = 600 * len(x.records)
            found.append(x)
        for x in sorted(found, key=lambda y: y.last_time)[-self.max_sessions:]:
            self._issue(x.name, x.sid)  # its id is never given to another conversation
            self._remember(x)

    # -- reading (the dashboard and the API) -----------------------------------------------------

    def totals_now(self) -> Totals:
        """A copy of the counters, taken at one moment (``/metrics``)."""
        with self._lock:
            return copy.deepcopy(self.totals)

    def sessions(self) -> list[ObservedSession]:
        with self._lock:
            return list(self._sessions.values())

    def get(self, sid: str) -> ObservedSession | None:
        with self._lock:
            return self._sessions.get(sid)

    # -- sessions ----------------------------------------------------------------------------------

    def _remember(self, s: ObservedSession) -> ObservedSession:
        self._sessions[s.sid] = s
        self._sessions.move_to_end(s.sid)
        self._trim()
        return s

    def _trim(self) -> None:
        """At most ``max_sessions`` sessions, and ``max_bytes`` of them, in memory; the least
        recently used go first, never the newest (totals keep counting). Under ``_lock``."""
        while len(self._sessions) > self.max_sessions:
            self._sessions.popitem(last=False)
        if self.max_bytes is None:
            return
        total = sum(x.nbytes for x in self._sessions.values())
        while total > self.max_bytes and len(self._sessions) > 1:
            _, gone = self._sessions.popitem(last=False)
            total -= gone.nbytes

    def _resolve(self, hint: str | None, req: RequestHistory, mode: str) -> ObservedSession:
        """The session this request continues, by the one rule (`sessions.decide`, the same as
        `wrap()` and compact mode use), among the sessions in memory of its family. These
        records hold no immutable prefix, so a changed system prompt continues the session (and
        is reported there as prefix churn). A new one (a segment after a rewrite, another agent
        under the name) starts from the forensics of the session it continues, so its first
        request is compared with the request before it and classified."""
        with self._lock:
            named = hint is not None
            base = self.id_prefix + (hint if hint is not None else family_key(req.ids[0]))
            members = sorted((x for x in self._sessions.values() if in_family(x.sid, base)),
                             key=lambda x: family_order(x.sid))
            # a session whose every request was answered with an error (the analysis thread takes
            # requests in order, so an earlier attempt's outcome is known here): the client's
            # retry of that turn takes it over (`decide`), and is no new segment (issue 62)
            failed = frozenset(x.sid for x in members if x.requests and x.errors == x.requests)
            d = decide(req, members, named=named, fixed_preamble=False, failed=failed)
            if d.kind in ("continue", "retry"):
                assert d.target is not None
                s = self._sessions[d.target]
                self._sessions.move_to_end(s.sid)
            else:
                taken = {x.sid for x in members} | set(self._issued.get(base, ()))
                sid = new_id(base, d.kind, named, taken)
                parent = self._sessions.get(d.target) if d.target is not None else None
                link = {"session": d.target, "reason": d.reason, "at": d.at} if d.target is not None else None
                s = ObservedSession(sid, base, mode, link=link)
                if parent is not None and d.kind == "segment":
                    s.forensics, s.memo = parent.forensics.fork(), parent.memo
                self._issue(base, sid)
                self._remember(s)
            s.hashes, s.preamble = req.ids, req.preamble  # under the lock: the next request decides on these
            return s

    def _issue(self, base: str, sid: str) -> None:
        """Remember that ``sid`` was given out, so an evicted session's id never goes to another
        conversation (bounded; a name forgotten here is long gone from memory too). Under ``_lock``."""
        self._issued.setdefault(base, set()).add(sid)
        self._issued.move_to_end(base)
        while len(self._issued) > 16 * self.max_sessions:
            self._issued.popitem(last=False)

    def session_for_engine(self, sid: str, link: dict[str, Any] | None = None) -> ObservedSession:
        """The record of a session the compaction engine named (compact mode)."""
        with self._lock:
            s = self._sessions.get(sid)
            if s is None:
                return self._remember(ObservedSession(sid, sid.split(".")[0], "compact", link=link))
            if s.link is None and link is not None:  # made by a summary's cost before its first request's record
                s.link = link
            return s

    def spent(self, sid: str, events: list[Any], link: dict[str, Any] | None = None) -> None:
        """The engine kept these events of session ``sid`` (compact mode): what its own summary
        calls in them cost (`base.events.summary_cost`, the rule `report` adds them by) is added
        to the session's cost and to the totals, so the dashboard, ``/metrics`` and `report`
        agree (issue 62: they left the summaries out)."""
        cost = sum(summary_cost(e) for e in events)
        if not cost:
            return
        s = self.session_for_engine(sid, link)
        with s.lock:
            s.summaries_usd += cost
            s.cost_usd += cost
        with self._lock:
            self.totals.cost_usd += cost
            self.totals.summary_usd += cost
            self.version += 1

    # -- recording ----------------------------------------------------------------------------------

    def observe(self, raw: bytes, headers: Mapping[str, str], *, status: int, usage: dict[str, Any] | None,
                message_id: str | None, cache_miss_reason: dict[str, Any] | None, now: float,
                timing: dict[str, float], stream: bool) -> dict[str, Any] | None:
        """Analyse one forwarded request (observe mode). Never raises: a body we cannot read is
        counted and skipped."""
        try:
            body = msgspec.json.decode(raw)  # about twice as fast as json.loads, per request
            if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or not body["messages"]:
                return None
            hint = session_hint(headers, body)
            history = RequestHistory.of_bytes(raw, body)
            hashes = history.ids
            s = self._resolve(hint, history, "observe")
        except (ValueError, MalformedMessageError, InvalidSessionIdError, TypeError, RecursionError) as err:
            log.debug("cachecompact proxy: request not analysed: %s", str(err)[:200])
            return None
        with s.lock:
            s.body_bytes = len(raw)
            if not s.title:
                s.title = conversation_title(body)
            kept = {"body_ref": self._put_body(s, raw)} if self.keep_bodies and self.store is not None else {}
            if status != 200 or not usage:
                s.errors += 1
                return self._add(s, {"time": now, "status": status, "stream": stream, **timing, **kept})
            try:
                req = request_from_body(body, now, self.counter, s.memo, keys=hashes)
                snap = snapshot_from_sim(req, body)  # keeps this body until the next request's excerpts
                finding = s.forensics.observe(snap, usage, cache_miss_reason)
                if len(s.memo) > 20_000:
                    s.memo.clear()
            except (MalformedMessageError, UnknownModelError, CacheCompactError, ValueError) as err:
                log.debug("cachecompact proxy: request not analysed: %s", err)
                s.errors += 1
                return self._add(s, {"time": now, "status": status, "stream": stream, "error": str(err)[:200],
                                     **timing, **kept})
            rec = {"time": now, "status": status, "stream": stream, "model": req.model, "message_id": message_id,
                   "blocks": len(req.blocks), "est_tokens": snap.total,
                   "chain_head": snap.chain[-1].hex() if len(snap.chain) else None,
                   "breakpoints": [req.blocks[k].where for k, _ in snap.breakpoints],
                   "ttl": "1h" if any(t == "1h" for _, t in snap.breakpoints) else "5m",
                   "context": context_parts(req, body, _prompt_tokens(usage)),
                   "bytes": len(raw), **timing, **kept}
            return self._finish(s, rec, usage, finding)

    def note(self, sid: str, *, usage: dict[str, Any] | None, finding: Finding | None, model: str, now: float,
             status: int, timing: dict[str, float], stream: bool, compactions: list[dict[str, Any]] | None = None,
             link: dict[str, Any] | None = None, raw: bytes | None = None,
             sent: dict[str, Any] | None = None, thinking: dict[str, Any] | None = None,
             sent_keys: list[bytes] | None = None) -> dict[str, Any]:
        """Record a request the compaction engine prepared and analysed (compact mode); ``raw``
        is the body the client sent, kept when ``keep_bodies`` is on; ``sent`` the body the
        engine sent, whose parts the context view shows; ``sent_keys`` the memo key of each of
        its messages when the caller has them (`request_from_body`'s ``keys``)."""
        s = self.session_for_engine(sid, link)
        with s.lock:
            if compactions is not None:
                s.compactions = compactions
            if sent is not None and not s.title:
                s.title = conversation_title(sent)  # its system and first message are what the caller sent
            if thinking:
                s.thinking_turns.update(thinking.get("left_out") or ())
                s.thinking_left_out_tokens += int(thinking.get("left_out_tokens") or 0)
                if thinking.get("drop_block") is not None:
                    s.thinking_turns.add(int(thinking["drop_block"]))
                    s.thinking_drop_requests += 1
            rec: dict[str, Any] = {"time": now, "status": status, "stream": stream, "model": model,
                                   "compactions_so_far": len(s.compactions), **timing}
            if sent is not None and usage:
                try:
                    req = request_from_body(sent, now, self.counter, s.memo, keys=sent_keys)
                    rec["context"] = context_parts(req, sent, _prompt_tokens(usage))
                    rec["ttl"] = "1h" if "1h" in (req.auto_ttl, *(b.ttl for b in req.blocks)) else "5m"
                    if len(s.memo) > 20_000:
                        s.memo.clear()
                except (MalformedMessageError, CacheCompactError, ValueError) as err:
                    log.debug("cachecompact proxy: no context view of a request: %s", err)
            if raw is not None and self.keep_bodies and self.store is not None:
                rec["body_ref"] = self._put_body(s, raw)
            if status != 200 or not usage or finding is None:
                s.errors += int(status != 200)
                return self._add(s, rec)
            return self._finish(s, rec, usage, finding)

    def _finish(self, s: ObservedSession, rec: dict[str, Any], usage: dict[str, Any], f: Finding) -> dict[str, Any]:
        cost = priced(str(rec.get("model") or ""), self.prices).cost(usage)
        read = int(usage.get("cache_read_input_tokens") or 0)
        total = read + int(usage.get("cache_creation_input_tokens") or 0) + int(usage.get("input_tokens") or 0)
        s.cost_usd += cost
        s.read += read
        s.total_in += total
        if f.cls == "compaction_rewrite":
            s.rewrites += 1  # our own compaction: a deliberate re-write, not waste
            s.rewrite_usd += f.wasted_usd
        elif f.cls != "read_as_expected":
            s.misses[f.cls] = s.misses.get(f.cls, 0) + 1
            s.wasted_usd += f.wasted_usd
        if f.agrees is not None:
            s.api_conclusive += 1
            s.api_agree += int(f.agrees)
        with self._lock:
            t = self.totals
            t.cost_usd += cost
            for field_name, kind in TOKEN_KINDS.items():
                t.tokens[kind] += int(usage.get(field_name) or 0)
            if f.cls == "compaction_rewrite":
                t.rewrites += 1
                t.rewrite_usd += f.wasted_usd
            elif f.cls != "read_as_expected":
                t.misses[f.cls] = t.misses.get(f.cls, 0) + 1
                t.wasted_usd += f.wasted_usd
        kept = {k: usage.get(k) for k in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens",
                                          "output_tokens")}
        if isinstance(usage.get("iterations"), list):  # a compaction call's tokens are there alone (`billed_tokens`)
            kept["iterations"] = usage["iterations"]
        rec.update({"usage": kept, "cost_usd": round(cost, 8), "finding": f.to_dict()})
        return self._add(s, rec)

    def refused(self, sid: str | None = None, *, status: int = 400, message: str = "", now: float | None = None,
                model: str = "", link: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """A request the proxy answered itself (compact mode: the context is full, before sending
        or after the one retry): a request and an error in the totals and ``/metrics``, and, when
        the engine named its session ``sid``, a record of that session (``refused``: the message),
        so the dashboard counts it in its conversation (issue 62: it was in ``/metrics`` alone,
        and a conversation whose every request was refused was not listed)."""
        if sid is None:
            with self._lock:
                self.version += 1
                self.totals.requests += 1
                self.totals.errors += 1
                self.totals.refused += 1
            return None
        s = self.session_for_engine(sid, link)
        with s.lock:
            s.errors += 1
            s.refused += 1
            with self._lock:
                self.totals.refused += 1
            rec = {"time": time.time() if now is None else now, "status": status, "model": model or s.model,
                   "refused": message[:300]}
            return self._add(s, rec)

    def _add(self, s: ObservedSession, rec: dict[str, Any]) -> dict[str, Any]:
        rec["i"] = s.requests
        s.requests += 1
        s.last_time = float(rec.get("time") or time.time())
        s.first_time = s.first_time or s.last_time
        s.model = str(rec.get("model") or s.model)
        s.records.append(rec)
        # estimated bytes held: the newest body as parsed (kept for the next request's excerpts), the
        # memoised blocks and the records (benchmarks/proxy_memory.py measures what is held against it)
        s.nbytes = 4 * s.body_bytes + 200 * len(s.memo) + 600 * len(s.records)
        with self._lock:
            self.version += 1
            self.totals.requests += 1
            self.totals.errors += int(rec.get("status") not in (None, 200))
            if self.max_bytes is not None:
                self._trim()
        if self.store is not None:
            self._persist(s, rec)
        return rec

    def _stored(self, s: ObservedSession) -> Any:
        """The session's stored counterpart, opened or created on first use."""
        if s.stored is None:
            assert self.store is not None
            s.stored = (self.store.open(s.sid) if self.store.exists(s.sid)
                        else self.store.create(s.sid, {"session_id": s.sid, "observed": True, "name": s.name,
                                                       "mode": s.mode}))
        return s.stored

    def _persist(self, s: ObservedSession, rec: dict[str, Any]) -> None:
        try:
            stored = self._stored(s)
            batch = self._batch
            if batch is not None and self._batch_owner == threading.get_ident() and isinstance(stored, DeferredSync):
                stored.append_event_deferred({"kind": "observation", **rec})
                batch.add(stored)
            else:
                stored.append_event({"kind": "observation", **rec})
        except (OSError, CacheCompactError) as err:
            log.warning("cachecompact proxy: could not store a record of %s: %s", s.sid, err)

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Records this thread stores in the block are written at once and synced when it ends,
        one fsync per session file for the batch instead of one per record (the analysis thread
        takes what is queued in one batch: its fsyncs made it fall behind, issue 57)."""
        self._batch, self._batch_owner = set(), threading.get_ident()
        try:
            yield
        finally:
            stores, self._batch, self._batch_owner = self._batch, None, None
            for st in stores:
                try:
                    st.flush()
                except (OSError, CacheCompactError) as err:
                    log.warning("cachecompact proxy: could not sync records to disk: %s", err)

    def _put_body(self, s: ObservedSession, raw: bytes) -> str | None:
        ref = "body_" + xxhash.xxh3_128_hexdigest(raw)
        try:
            self._stored(s).put_blob(ref, raw)
            return ref
        except (OSError, CacheCompactError) as err:
            log.warning("cachecompact proxy: could not keep a request body of %s: %s", s.sid, err)
            return None


def _prompt_tokens(usage: dict[str, Any]) -> int:
    return sum(int(usage.get(k) or 0) for k in ("input_tokens", "cache_read_input_tokens",
                                                 "cache_creation_input_tokens"))
