"""Which session a request belongs to: one conversation, one session.

Requests name their session explicitly (the ``x-cachecompact-session`` header, a configured
id, or a client's own session metadata) or not at all. Without a name, a conversation is
keyed by its **opening** (a hash of tools, system prompt and first message) and then by
**extension**: among the stored sessions with that opening, the request belongs to the one
with the longest transcript that its history extends. Many agents with identical openings
therefore get one session each, and a session branches only on a true rewrite: a history
that extends none of them starts a new session ``<opening>.<n>``. With a name, a rewrite
(or changed tools or system prompt) starts a new *segment* ``<name>.s<n>`` of that session.

The registry keeps live sessions in memory (least recently used first out) and reads the
store for the rest, so it serves one process or many replicas over a shared store alike.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import xxhash

from .errors import HistoryRewrittenError, SessionExistsError, SessionNotFoundError
from .session import Session
from .store import Store, check_session_id
from .transcript import message_hash
from .wire import canonical_bytes

__all__ = ["Live", "SessionRegistry", "opening_key"]


def opening_key(tools: Any, system: Any, first: Any) -> str:
    """``s_`` + 24 hex digits of xxh3-128 over tools, system and the first message."""
    return "s_" + xxhash.xxh3_128_hexdigest(canonical_bytes([tools, system, first]))[:24]


def head_key(tools: Any, system: Any) -> bytes:
    return xxhash.xxh3_128_digest(canonical_bytes([tools, system]))


@dataclass(slots=True, eq=False)
class Live:
    """A session in memory with what its adapter keeps alongside it."""

    session: Session
    strategy: Any
    head: bytes  # hash of the caller's tools and system the session was made for
    lock: threading.Lock = field(default_factory=threading.Lock)
    extra: dict[str, Any] = field(default_factory=dict)


Factory = Callable[[str, dict[str, Any]], Live]  # (session id, request body) -> a new live session
Opener = Callable[[str], Live]  # session id -> the stored session, live


class SessionRegistry:
    """Resolves requests to sessions and keeps them live; thread-safe."""

    def __init__(self, store: Store | None, *, create: Factory, open_: Opener, keep: int = 512) -> None:
        self.store = store
        self._create = create
        self._open = open_
        self._keep = keep
        self._live: OrderedDict[str, Live] = OrderedDict()
        self._lock = threading.Lock()

    def sessions(self) -> list[Live]:
        with self._lock:
            return list(self._live.values())

    def get(self, sid: str) -> Live | None:
        with self._lock:
            return self._live.get(sid)

    def _remember(self, sid: str, live: Live) -> Live:
        self._live[sid] = live
        self._live.move_to_end(sid)
        while len(self._live) > self._keep:
            self._live.popitem(last=False)
        return live

    def _load(self, sid: str) -> Live | None:
        live = self._live.get(sid)
        if live is not None:
            self._live.move_to_end(sid)
            return live
        if self.store is None:
            return None
        try:
            return self._remember(sid, self._open(sid))
        except SessionNotFoundError:
            return None

    def _ids(self, prefix: str, stored: bool) -> list[str]:
        """Ids of ``prefix`` and its numbered siblings: live ones, and with ``stored`` the store's too."""
        ids = {k for k in self._live if k == prefix or k.startswith(prefix + ".")}
        if stored and self.store is not None:
            ids |= {k for k in self.store.list(prefix) if k == prefix or k.startswith(prefix + ".")}
        return sorted(ids, key=_order)

    def _new(self, base: str, sep: str, body: dict[str, Any]) -> Live:
        taken = set(self._ids(base, stored=True))
        n = 1
        sid = base
        while sid in taken:
            n += 1
            sid = f"{base}{sep}{n}"
        for _ in range(100):
            try:
                return self._remember(sid, self._create(sid, body))
            except SessionExistsError:  # another process took it: the next number
                n += 1
                sid = f"{base}{sep}{n}"
        raise SessionExistsError(f"could not find a free session id after {base}{sep}{n}")

    # -- resolution ----------------------------------------------------------------------------------

    def resolve(self, body: dict[str, Any], explicit: str | None = None) -> tuple[Live, list[int]]:
        """The live session for this request, synced with its history; returns the new indices.

        Retries on a race (another writer extended the chosen session first) by resolving again.
        """
        messages = body["messages"]
        head = head_key(body.get("tools"), body.get("system"))
        for _ in range(8):
            with self._lock:
                live = (self._named(explicit, head, body) if explicit is not None
                        else self._by_extension(head, body))
            with live.lock:
                try:
                    return live, live.session.sync(messages)
                except HistoryRewrittenError:
                    live.extra["stale"] = True  # re-resolve: another conversation or a rewrite
        raise HistoryRewrittenError(0, "could not settle on a session after repeated concurrent rewrites")

    def _named(self, name: str, head: bytes, body: dict[str, Any]) -> Live:
        """The segment of ``name`` this request continues (same tools and system, and it extends
        the history), newest first: another agent under the same name (Claude Code's sub-agents
        share its session id) alternates with the main one without starting a segment per turn.
        None continues: a rewrite, so the next segment."""
        check_session_id(name)
        newest: Live | None = None
        seen: set[str] = set()
        for stored in (False, True):  # memory first; the store only when memory has no answer
            # from the store only the newest few segments: each one not in memory is a full load
            fresh = [sid for sid in reversed(self._ids(name, stored)) if sid not in seen]
            for sid in fresh[:STORED_SEGMENTS_LOOKED_AT] if stored else fresh:
                seen.add(sid)
                live = self._load(sid)
                if live is None:
                    continue
                newest = newest or live
                if live.head == head and not live.extra.pop("stale", False) and _extends(live.session,
                                                                                        body["messages"]):
                    return live
        seg = self._new(name, ".s", body)
        if newest is not None and "forensics" in newest.extra:  # the cache analysis compares with the last request
            seg.extra["forensics"] = newest.extra["forensics"].fork()
        return seg

    def _by_extension(self, head: bytes, body: dict[str, Any]) -> Live:
        msgs = body["messages"]
        key = opening_key(body.get("tools"), body.get("system"), msgs[0] if msgs else None)
        for stored in (False, True):
            best: Live | None = None
            for sid in self._ids(key, stored):
                live = self._load(sid)
                if live is None:
                    continue
                if live.extra.pop("stale", False) and live.session.store is not None:
                    live.session.refresh()
                if live.head != head or not _extends(live.session, msgs):
                    continue
                if best is None or len(live.session) > len(best.session):
                    best = live
            if best is not None:
                return best
        return self._new(key, ".", body)


STORED_SEGMENTS_LOOKED_AT = 4  # a named session's agents (main, sub-agents) are its newest segments


def _order(sid: str) -> tuple[int, str]:
    """Numbered siblings in number order (``x``, ``x.2``, ``x.10``; ``x.s2``, ``x.s10``)."""
    tail = sid.rsplit(".", 1)[-1].lstrip("s") if "." in sid else ""
    return (int(tail) if tail.isdigit() else 0, sid)


def _extends(s: Session, msgs: list[Any]) -> bool:
    """Whether ``msgs`` extends the session's transcript: length, first and last stored message."""
    n = len(s)
    if n > len(msgs):
        return False
    if n == 0:
        return True
    t = s.transcript
    return message_hash(msgs[n - 1]) == t.hash_of(n - 1) and (n == 1 or message_hash(msgs[0]) == t.hash_of(0))
