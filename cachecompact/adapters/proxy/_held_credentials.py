"""The one credential the proxy keeps after a request has ended: each session's last, for its
idle compaction (``--idle-compaction``), in memory only and only until that session's cache
expires.

A summary made while the client is quiet goes upstream on the caller's key, as every summary of
the compact proxy does (`compaction.summarize.caller_key`), but by then the caller's request is
over. So the credential headers of a session's last answered request are held here, in a dict
in this process, until the moment its cache expires (after which an idle summary can no longer
read that cache, so it is never needed), or until the one idle decision of that quiet period
takes it. They are never written to the store, an event, a log line or the dashboard: this class
has no way to list them, and its ``repr`` counts sessions only.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterator, Mapping

from ...base.headers import CREDENTIALS

__all__ = ["HeldCredentials"]


class HeldCredentials:
    """Each session's last credential headers, until a given time; thread-safe."""

    def __init__(self, creds: threading.local) -> None:
        self._creds = creds  # the thread-local a caller-key summarizer reads
        self._held: dict[str, tuple[dict[str, str], float]] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"HeldCredentials({len(self)} sessions)"

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)

    def hold(self, session_id: str, headers: Mapping[str, str], until: float) -> None:
        """Keep the credential (and ``anthropic-beta``) of ``headers`` for ``session_id`` until ``until``."""
        kept = {k: v for k, v in headers.items() if k in (*CREDENTIALS, "anthropic-beta")}
        with self._lock:
            if any(k in CREDENTIALS for k in kept):
                self._held[session_id] = (kept, until)
            else:
                self._held.pop(session_id, None)

    def forget(self, session_id: str) -> None:
        with self._lock:
            self._held.pop(session_id, None)

    def forget_expired(self, now: float) -> float:
        """Drop what is held past its time; the next such time (inf when nothing is held)."""
        with self._lock:
            for sid in [s for s, (_, until) in self._held.items() if until <= now]:
                del self._held[sid]
            return min((until for _, until in self._held.values()), default=math.inf)

    @contextlib.contextmanager
    def around(self, session_id: str, now: float) -> Iterator[bool]:
        """Take the session's credential (it is used once) into the summarizers' thread-local
        for the block; yields False when none is held or it is past its time."""
        with self._lock:
            got = self._held.pop(session_id, None)
        if got is None or got[1] <= now:
            yield False
            return
        self._creds.headers = got[0]
        try:
            yield True
        finally:
            self._creds.headers = {}
