"""The live sessions of one engine, and the request-to-session step that acts on the one rule.

`resolution.decide` says which stored history a request continues, comparing every message;
the registry keeps the candidates (sessions in memory, least recently used first out, and
the store's for the rest, so it serves one process or many replicas over a shared store
alike) and acts on the decision: it syncs the chosen session, or creates the new one, syncs
it before any other request can see it, and links it to the session it continues.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from ..base.errors import HistoryRewrittenError, MalformedMessageError, SessionExistsError, SessionNotFoundError
from ..store import Store, check_session_id
from .live import Live, LiveMaker
from .resolution import Decision, RequestHistory, decide, family_key, family_order, in_family, new_id

__all__ = ["Live", "Resolved", "SessionRegistry"]  # Live: from .live, where it is made


@dataclass(frozen=True, slots=True)
class Resolved:
    """A request's session, the transcript indices its sync appended, and the decision taken."""

    live: Live
    new: list[int]
    decision: Decision


class SessionRegistry:
    """Resolves requests to sessions and keeps them live; thread-safe."""

    def __init__(self, store: Store | None, maker: LiveMaker, *, keep: int = 512) -> None:
        self.store = store
        self.maker = maker  # new and stored sessions come from it, already live
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
            return self._remember(sid, self.maker.open(sid))
        except SessionNotFoundError:
            return None

    def _family(self, base: str, stored: bool) -> list[str]:
        """Ids of ``base``'s family in number order: live ones, and with ``stored`` the store's too."""
        ids = {k for k in self._live if in_family(k, base)}
        if stored and self.store is not None:
            ids |= {k for k in self.store.list(base) if in_family(k, base)}
        return sorted(ids, key=family_order)

    # -- resolution ----------------------------------------------------------------------------------

    def resolve(self, body: dict[str, Any], explicit: str | None = None,
                req: RequestHistory | None = None) -> Resolved:
        """The live session this request continues (`resolution.decide`), synced with its history.

        A sync that finds the session moved on (another thread or process appended first)
        decides again with what it now holds; after repeated races the request gets a session
        of its own rather than an error.
        """
        messages = body["messages"]
        req = req or RequestHistory.of(body)
        if not req.ids:
            raise MalformedMessageError("messages", "must be a non-empty list")
        named = explicit is not None
        base = check_session_id(explicit) if explicit is not None else family_key(req.ids[0])
        for _ in range(8):
            with self._lock:
                chosen = self._choose(base, named, req)
                if isinstance(chosen, Decision):
                    return self._start(base, named, req, chosen, body)
            with chosen.lock:
                try:
                    new = chosen.session.sync(messages, identities=req.ids)
                except HistoryRewrittenError:
                    continue  # it moved on under us; what it holds now is decided on again
                return Resolved(chosen, new, Decision("continue", chosen.sid, "extends", len(chosen.session)))
        with self._lock:
            return self._start(base, named, req, Decision("new", None, "no stored history settled after repeated "
                                                                       "concurrent appends"), body)

    def _choose(self, base: str, named: bool, req: RequestHistory) -> Live | Decision:
        """The live session to continue, or the decision to start one. Memory first; the store's
        members of the family (another process's, or ones this process let go) when memory has
        no session to continue. Caller holds ``_lock``."""
        members = [self._live[k] for k in self._family(base, stored=False)]
        d = decide(req, members, named=named)
        if d.kind != "continue" and self.store is not None:
            unloaded = [k for k in self._family(base, stored=True) if k not in self._live]
            if unloaded:
                for sid in unloaded:
                    self._load(sid)
                members = [x for k in self._family(base, stored=False) if (x := self._live.get(k)) is not None]
                d = decide(req, members, named=named)
        if d.kind == "continue":
            assert d.target is not None
            live = self._live[d.target]
            self._live.move_to_end(d.target)
            return live
        return d

    def _start(self, base: str, named: bool, req: RequestHistory, d: Decision, body: dict[str, Any]) -> Resolved:
        """Create the session ``d`` asks for and sync it before anyone else can see it. Caller
        holds ``_lock``."""
        link = {"session": d.target, "reason": d.reason, "at": d.at} if d.target is not None else None
        taken = set(self._family(base, stored=True))
        for _ in range(100):
            sid = new_id(base, d.kind, named, taken)
            try:
                live = self.maker.create(sid, body, link)
                break
            except SessionExistsError:  # another process took it: the next number
                taken.add(sid)
        else:
            raise SessionExistsError(f"could not find a free session id in the family of {base}")
        parent = self._live.get(d.target) if d.target is not None else None
        if parent is not None and d.kind == "segment":
            live.forensics = parent.forensics.fork()  # compared with the request before it
        with live.lock:
            new = live.session.sync(body["messages"], identities=req.ids)
        self._remember(sid, live)
        return Resolved(live, new, d)
