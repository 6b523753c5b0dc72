"""Idle compaction for `wrap()`: the scheduler that decides, for each quiet session, just before
its cache expires, and the clocks it runs on.

The decision itself is the engine's (`CompactionEngine.compact_idle`, priced by
`compaction.idle`); this module only says *when* to ask. A session is due `DECIDE_BEFORE_S`
before the cache of its last request expires, and only after a response that ended the turn.
One daemon thread per wrapped client, started at the first answered request, so a client that
never turns it on, or never sends, has none. It stops with the client: when the client is
closed (checked every `CLOSED_POLL_S` seconds) or garbage-collected, or with `stop()`.

The clock is injectable. `WallClock` waits in real time. `SimulatedClock` is time that a test
or a replay moves by hand (`advance`), the same time it sends the emulator in the clock header:
``advance`` steps through the deadlines the scheduler waits for, lets it act at each, and
returns only once it waits again, so a test at simulated time is deterministic.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ..base.values import IdleDecision

if TYPE_CHECKING:  # the proxy's state imports this module in observe mode too: it loads no engine
    from ..engine.request_cycle import CompactionEngine

__all__ = ["CLOSED_POLL_S", "Clock", "CredentialKeeper", "IdleScheduler", "SimulatedClock", "WallClock"]

log = logging.getLogger("cachecompact")

CLOSED_POLL_S = 30.0  # how often a waiting scheduler looks whether its client was closed


@runtime_checkable
class Clock(Protocol):
    """What the scheduler needs of time: the present, and waiting for a moment or a nudge."""

    def __call__(self) -> float: ...

    def wait_until(self, t: float) -> None:
        """Return at time ``t`` or, earlier, at an `interrupt`."""
        ...

    def interrupt(self) -> None: ...

    def enter(self) -> None:
        """The calling thread will wait on this clock (a simulated clock waits for it)."""
        ...

    def leave(self) -> None: ...


class WallClock:
    """Real time (``time.time``), or any callable clock, waited for in real seconds."""

    def __init__(self, now: Callable[[], float] = time.time) -> None:
        self._now = now
        self._wake = threading.Event()

    def __call__(self) -> float:
        return self._now()

    def wait_until(self, t: float) -> None:
        left = t - self._now()
        if left > 0:
            self._wake.wait(None if math.isinf(left) else left)
        self._wake.clear()

    def interrupt(self) -> None:
        self._wake.set()

    def enter(self) -> None:
        pass

    def leave(self) -> None:
        pass


class SimulatedClock:
    """Time moved by hand, for tests and replays against the emulator (pass it as
    ``wrap(clock=...)`` and send its reading in ``x-cachecompact-clock``).

    Threads that `enter` it are waited for: `advance` moves time to each deadline they wait for
    in turn, and goes on only when every one of them waits again for a later moment."""

    def __init__(self, start: float = 0.0, *, timeout_s: float = 60.0) -> None:
        self._t = float(start)
        self._cv = threading.Condition()
        self._members: set[int] = set()
        self._waiting: dict[int, float] = {}
        self._kicked: set[int] = set()
        self.timeout_s = timeout_s

    def __call__(self) -> float:
        with self._cv:
            return self._t

    def enter(self) -> None:
        with self._cv:
            self._members.add(threading.get_ident())

    def leave(self) -> None:
        with self._cv:
            me = threading.get_ident()
            self._members.discard(me)
            self._kicked.discard(me)
            self._waiting.pop(me, None)
            self._cv.notify_all()

    def wait_until(self, t: float) -> None:
        me = threading.get_ident()
        with self._cv:
            self._members.add(me)
            if me in self._kicked:  # interrupted while it was not waiting: the nudge is not lost
                self._kicked.discard(me)
                return
            self._waiting[me] = t
            self._cv.notify_all()
            self._cv.wait_for(lambda: self._t >= t or me in self._kicked)
            self._kicked.discard(me)
            self._waiting.pop(me, None)
            self._cv.notify_all()

    def interrupt(self) -> None:
        with self._cv:
            self._kicked |= self._members  # each member returns once, now or at its next wait
            self._waiting.clear()  # nobody counts as waiting until it waits again
            self._cv.notify_all()

    def _settled(self) -> bool:
        return all(self._waiting.get(m, -math.inf) > self._t for m in self._members)

    def _settle(self) -> None:
        if not self._cv.wait_for(self._settled, self.timeout_s):
            raise TimeoutError(f"a thread on the simulated clock did not wait again within {self.timeout_s}s "
                               f"of real time (at simulated {self._t})")

    def advance(self, seconds: float) -> float:
        """Move time on by ``seconds``, stopping at each deadline a thread waits for so it acts at
        its moment; returns the new time."""
        if not seconds >= 0:
            raise ValueError(f"SimulatedClock.advance: seconds must be >= 0, got {seconds!r}")
        with self._cv:
            end = self._t + seconds
            while True:
                self._settle()
                due = [d for d in self._waiting.values() if d <= end]
                if not due:
                    break
                self._t = max(self._t, min(due))
                self._cv.notify_all()
            self._t = end
            return end


class CredentialKeeper(Protocol):
    """What a scheduler that summarizes on callers' keys needs (the proxy's `HeldCredentials`):
    a session's credential for the duration of its decision, and the time the next one expires."""

    def around(self, session_id: str, now: float) -> AbstractContextManager[bool]: ...

    def forget_expired(self, now: float) -> float: ...


def clock_of(clock: Callable[[], float]) -> Clock:
    """``clock`` if it can be waited on, else a `WallClock` reading it."""
    return clock if isinstance(clock, Clock) else WallClock(clock)


class IdleScheduler:
    """Decides for quiet sessions of one engine as their caches near expiry; thread-safe."""

    def __init__(self, engine: CompactionEngine, clock: Clock, *, keeper: CredentialKeeper | None = None) -> None:
        """``keeper``: decide only for a session whose credential it holds, with that credential
        in place (the proxy); it is also told when time passes, to drop what expired."""
        self.engine, self.clock, self.keeper = engine, clock, keeper
        self.decisions: deque[IdleDecision] = deque(maxlen=1000)  # the decisions made, newest last
        self._decided: dict[str, float] = {}  # session -> the due time already decided
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._owner: weakref.ref[Any] | None = None

    def owned_by(self, client: Any) -> None:
        """Stop when ``client`` is closed or garbage-collected."""
        self._owner = weakref.ref(client)
        weakref.finalize(client, self.stop)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def poke(self) -> None:
        """A request was answered: deadlines moved. Starts the thread on the first call."""
        if self._stop.is_set():
            return
        with self._lock:
            if self._thread is None:
                ready = threading.Event()
                self._thread = threading.Thread(target=self._run, args=(ready,), name="cachecompact-idle",
                                                daemon=True)
                self._thread.start()
                ready.wait()
                return
        self.clock.interrupt()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self.clock.interrupt()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout)

    def _closed(self) -> bool:
        if self._owner is None:
            return False
        client = self._owner()
        return client is None or bool(client.is_closed())

    def _run(self, ready: threading.Event) -> None:
        self.clock.enter()
        ready.set()
        try:
            while not self._stop.is_set() and not self._closed():
                try:
                    nxt = self._pass()
                except Exception:  # one bad pass must not end the thread (held credentials expire in it)
                    log.exception("cachecompact: idle scheduler pass failed")
                    nxt = self.clock() + CLOSED_POLL_S
                if self._stop.is_set():
                    break
                now = self.clock()
                self.clock.wait_until(min(nxt, now + CLOSED_POLL_S) if self._owner is not None else nxt)
        finally:
            self.clock.leave()

    def _pass(self) -> float:
        """Decide for every session that is due; the next moment one will be."""
        nxt = math.inf
        due = self.engine.idle_due()
        alive = {sid for sid, _ in due}
        self._decided = {sid: t for sid, t in self._decided.items() if sid in alive}  # forget the gone
        for sid, at in due:
            if self._decided.get(sid) == at:
                continue
            now = self.clock()  # afresh: a summary before this one took time
            if at > now:
                nxt = min(nxt, at)
                continue
            self._decided[sid] = at
            self._decide(sid, now)
        if self.keeper is not None:
            nxt = min(nxt, self.keeper.forget_expired(self.clock()))
        return nxt

    def _decide(self, sid: str, now: float) -> None:
        try:
            if self.keeper is None:
                got = self.engine.compact_idle(sid, now=now)
            else:
                with self.keeper.around(sid, now) as held:
                    if not held:  # nobody's key to summarize on: no request of our own
                        log.debug("cachecompact: session %s idle: no credential held", sid)
                        return
                    got = self.engine.compact_idle(sid, now=now)
        except Exception:  # a store or summarizer failure must not end the thread
            log.exception("cachecompact: idle compaction of session %s failed", sid)
            return
        for d in got:
            self.decisions.append(d)
            log.log(logging.INFO if d.fired else logging.DEBUG, "cachecompact: session %s idle: %s%s", sid,
                    "summarized; " if d.fired else "", d.reason)
