"""Typed records that cross the layers: what one layer hands another as a value, never a bag of
keys or an exception.

* `ContextFull`: the decision that a request cannot fit even after every compaction level. The
  compactor returns it (`TurnReport.context_full`), the engine passes it on, and each adapter
  gives it as its transport's error (`wrap()`: `ContextFullError`, the proxy: a 400).
* `Answer`: what one response told us that the engine records. The SDK middleware and the
  proxy's tap each read it from their transport (a parsed message, an SSE stream, a JSON body)
  and hand the engine this one value; whether it was a stream is set by the reader that saw the
  stream, so it cannot be mislabelled on the way (it once was, as the third of a positional
  tuple).
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["Answer", "ContextFull"]


class ContextFull(msgspec.Struct, frozen=True):
    """The request cannot fit; ``message`` says what fills it and what to do."""

    message: str


class Answer(msgspec.Struct, frozen=True):
    """One response as the engine records it.

    ``usage`` is the response's usage object exactly as the API sent it: it is billed, stored in
    the session's request record and compared by forensics, and a field the API adds tomorrow
    must survive the trip, so it stays the API's own mapping rather than a Struct of today's
    fields. ``cache_miss_reason`` is the API's ``diagnostics.cache_miss_reason``, if any."""

    usage: dict[str, Any]
    message_id: str | None = None
    cache_miss_reason: dict[str, Any] | None = None
    stream: bool = False
