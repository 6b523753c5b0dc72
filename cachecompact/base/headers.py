"""Names shared by the runtime and the tools that talk to it (headers), in a neutral module so
the middleware and the proxy never import the emulator, and the emulator never imports them."""

from __future__ import annotations

__all__ = ["CLOCK_HEADER", "CREDENTIALS", "INTERNAL_HEADER", "SESSION_HEADER"]

SESSION_HEADER = "x-cachecompact-session"  # names the session a request belongs to
CLOCK_HEADER = "x-cachecompact-clock"  # simulated request time (unix seconds) for replays
CREDENTIALS = ("x-api-key", "authorization")  # the headers that carry a caller's credential
INTERNAL_HEADER = "x-cachecompact-internal"  # marks cachecompact's own calls (summaries)
