"""Typed records that cross the layers: what one layer hands another as a value, never a bag of
keys or an exception.

* `ContextFull`: the decision that a request cannot fit even after every compaction level. The
  compactor returns it (`TurnReport.context_full`), the engine passes it on, and each adapter
  gives it as its transport's error (`wrap()`: `ContextFullError`, the proxy: a 400).
"""

from __future__ import annotations

import msgspec

__all__ = ["ContextFull"]


class ContextFull(msgspec.Struct, frozen=True):
    """The request cannot fit; ``message`` says what fills it and what to do."""

    message: str
