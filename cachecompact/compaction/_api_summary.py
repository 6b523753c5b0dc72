"""L3/L4 summaries in the background: the API's (when they may be used, and the recipe), and ours.

The policy decides when to summarize and which range, as for its own summaries; where the
model supports on-demand compaction and the summarizer has a client, the API writes the summary
(`summarize.api_compaction`), so the kept turns' thinking stays valid (reasoning a client summary
would remove). The range becomes messages 0..end, the immutable prefix's first turns included:
the block must come first in ``messages`` (history/ledger.py, `ApiCompaction`). Elsewhere, and
after the API refuses, the policy's own summary stands.

"Compaction in the background" (build-with-claude/compaction-background): the compaction
request goes with the history as it stands and the conversation goes on whole; the block
replaces exactly the messages it covered on the first request after it arrives; no second one
starts before. Here the call is bound when the policy decides (the caller's credentials are in
that thread), sent once that request's response is in (while the agent runs its tools), and
swapped in at the first later request it is ready for. Our own summaries made by a call
(`OwnRequest`, a summarizer with ``bind``) go the same way. A request waits for a summary call
only when it cannot be sent without the compaction: its prompt is at the critical threshold or
over it (docs/policy.md, "Summaries in the background"); it then waits for the one under way, or
makes its summary at once.
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ..base.values import Level
from ..history.ledger import ApiCompaction
from ..history.transcript import TranscriptReader
from .levels import Proposal
from .summarize.api_compaction import OnDemandCall, OnDemandResult, OnDemandSummarizer, Verbatim, supports_ondemand
from .summarize.llm import SummaryRequest, SummaryResult

__all__ = ["ApiRequest", "OwnRequest", "api_range_end", "bound_call", "usable"]

_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    """One small pool for every session's background compactions (a call is seconds of waiting
    on the network, not work)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=4, thread_name_prefix="cachecompact-compaction")
            atexit.register(_POOL.shutdown, wait=False, cancel_futures=True)
        return _POOL


def usable(summarizer: Any, model: str, enabled: bool) -> bool:
    """Whether the API may write this session's summaries now."""
    return enabled and isinstance(summarizer, OnDemandSummarizer) and supports_ondemand(model)


def api_range_end(t: TranscriptReader, end: int) -> int | None:
    """The end of the API-written range for a summary the policy planned to end at ``end``:
    the same end when the kept turns start with an assistant message after a user one (the
    change of role the docs require), else None (the policy's own summary then)."""
    n = len(t)
    if end < 0 or end >= n or t[end].role != "user":
        return None
    if end + 1 < n and t[end + 1].role != "assistant":
        return None
    return end


@dataclass(slots=True)
class ApiRequest:
    """A compaction the policy asked the API for: what it covers, and the call under way."""

    level: Level
    reason: str
    end: int  # the last message the block will stand for
    body: dict[str, Any]  # the compaction request (the conversation's own, messages 0..end)
    call: OnDemandCall
    tokens: int  # the request's tokens when it was decided
    future: Future[OnDemandResult] | None = None
    keep: Verbatim | None = None  # what the summary must quote: the person's first request, and the newest
    weighed: dict[str, Any] = field(default_factory=dict)  # what decided it (the writers' prices), for its event

    def send(self, at: float | None) -> None:
        """Start the call in the background (once)."""
        if self.future is None:
            self.future = _pool().submit(self.call, self.body, at, self.keep)

    def ready(self) -> bool:
        """Whether the call has come back (`result` would not wait)."""
        return self.future is not None and self.future.done()

    def result(self, at: float | None) -> OnDemandResult:
        """The block; waits for a call still running, and makes one never started."""
        if self.future is None:
            return self.call(self.body, at, self.keep)
        return self.future.result()

    def edit(self, res: OnDemandResult) -> ApiCompaction:
        return ApiCompaction(0, self.end, res.content, res.signature, f"{self.level}: {self.reason}")



def bound_call(summarizer: Any) -> Callable[[SummaryRequest], SummaryResult] | None:
    """The summarizer's call, bound in this thread (the proxy's caller key is here) for the pool
    to make; None for a summarizer that makes no call (extractive, or a proxy request without a
    credential) or cannot be bound (one without ``bind``): it summarizes in the foreground."""
    bind = getattr(summarizer, "bind", None)
    call = bind() if callable(bind) else None
    return call if callable(call) else None


@dataclass(slots=True)
class OwnRequest:
    """One of our own summaries under way in the background: the plan it is for (its other
    edits land with it), what the summarizer was asked, and the call."""

    plan: Proposal
    reason: str
    req: SummaryRequest
    call: Callable[[SummaryRequest], SummaryResult]
    tokens: int  # the request's tokens when it was decided
    verbatim: list[str]  # the working-set lines the summary keeps beside it
    future: Future[SummaryResult] | None = None

    @property
    def level(self) -> Level:
        return self.plan.level

    def send(self) -> None:
        """Start the call in the background (once)."""
        if self.future is None:
            self.future = _pool().submit(self.call, self.req)

    def ready(self) -> bool:
        return self.future is not None and self.future.done()

    def result(self) -> SummaryResult:
        """The summary; waits for a call still running, and makes one never started."""
        if self.future is None:
            return self.call(self.req)
        return self.future.result()
