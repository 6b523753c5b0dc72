"""The one error `wrap()` adds to the SDK's: the context is full.

The engine returns "context full" as a record (`base.values.ContextFull`, from the compactor's
`Plan.context_full` or the reactive path's `Retry`); the SDK middleware raises it as this
error, and the proxy answers a 400 instead. It is an `anthropic.APIError`, so
``except anthropic.APIError`` around ``messages.create`` catches it, and a `CacheCompactError`.
"""

from __future__ import annotations

import anthropic
import httpx2

from ..base.errors import CacheCompactError

__all__ = ["ContextFullError"]

_PLACEHOLDER_REQUEST = httpx2.Request("POST", "http://cachecompact.invalid/v1/messages")


class ContextFullError(CacheCompactError, anthropic.APIError):
    """The context is still too full after every compaction level, L5 included.

    Start a new session. ``request`` is the HTTP request when one was made, else a
    placeholder, and ``body`` is None.
    """

    def __init__(self, message: str, request: httpx2.Request | None = None) -> None:
        anthropic.APIError.__init__(self, message, request if request is not None else _PLACEHOLDER_REQUEST,
                                    body=None)
