"""What the proxy knows of the clients that send to it, read from their ``User-Agent``.

One fact so far, and only where a client's own code shows it: whether the client lowers
``max_tokens`` when the API answers 400 "input length and `max_tokens` exceed context limit:
N + K > M" (``compaction.strategy.KnowsClient``). A client that does can be planned for a
smaller output reserve than it asks, and lets its context grow as far as it does without us; one
that does not would fail the turn on that 400, so it is planned for what it asks.

* **Claude Code** (``claude-cli/<version>``) does. In 2.1.337 (npm ``@anthropic-ai/claude-code``)
  its request loop parses that message and retries the same request with ``max_tokens =
  M - N - 1000`` (at least 3,000, else it gives up), an override of that one request
  (``tengu_max_tokens_context_overflow_adjustment``). The next turn asks its full reserve again.
  ../shared/docs/anthropic-cache-facts.md records the same behaviour.

Any other client is not known (None): the compactor learns it from the session, the first time a
request goes out over its reserve (`CacheAwareCompactor._reserve_lowered`).
"""

from __future__ import annotations

__all__ = ["lowers_reserve"]

_LOWERS = ("claude-cli/",)  # User-Agent prefixes of the clients shown to lower max_tokens on the 400


def lowers_reserve(user_agent: str | None) -> bool | None:
    """True for a client known to lower max_tokens on the API's 400 for it, else None (not known)."""
    ua = (user_agent or "").strip().lower()
    return True if ua.startswith(_LOWERS) else None
