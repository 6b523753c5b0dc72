"""The in-memory form every loader produces: Anthropic messages plus what was recorded."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec

from ...base.errors import TraceFormatError

__all__ = ["Trace", "TraceFormatError", "parse_time"]


class Trace(msgspec.Struct, kw_only=True):
    """One agent session in Messages API form.

    ``timestamps[i]`` is when message i happened (unix seconds) or None when unknown;
    ``usage[i]`` is the usage the real API reported for assistant message i, if recorded.
    """

    name: str
    source: str
    format: str
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] = []
    messages: list[dict[str, Any]] = []
    timestamps: list[float | None] = []
    usage: list[dict[str, Any] | None] = []
    model: str | None = None
    notes: list[str] = []
    # message indices where the recording agent compacted its own context: requests made at or
    # after such an index did not carry the full history shown in ``messages``
    compactions: list[int] = []
    # with ``compactions`` when the loader knows it: what made each cut ("compact", "microcompact")
    compaction_kinds: list[str] = []
    # per message: the API's message id, when recorded (a response a resumed log copied has its original id)
    message_ids: list[str | None] = []
    # per message: the model that produced it, when recorded (assistant messages of real logs)
    models: list[str | None] = []
    # the recording agent's own compaction records (Claude Code's compact_boundary and
    # microcompact_boundary): kind, index (the first message after it), trigger, and
    # pre_tokens / tool_ids / tokens_saved as logged
    boundaries: list[dict[str, Any]] = []
    # sub-agent conversations the session ran (Claude Code's Agent tool), each a trace of its own
    subagents: list[Trace] = []

    @property
    def turns(self) -> int:
        """Assistant messages, i.e. model calls."""
        return sum(1 for m in self.messages if m["role"] == "assistant")

    def recorded_usage(self) -> list[tuple[str | None, dict[str, Any]]]:
        """(model, usage) of every recorded call, the sub-agents' included."""
        out = [(self.models[i] if i < len(self.models) and self.models[i] else self.model, u)
               for i, u in enumerate(self.usage) if u]
        for s in self.subagents:
            out += s.recorded_usage()
        return out


_TIME_RANGE = (0.0, 253402300799.0)  # 1970 to the end of year 9999: what a date can be shown as


def parse_time(value: Any) -> float | None:
    """ISO-8601 strings and unix numbers to unix seconds; anything else, and a number no date
    has (NaN, infinite, before 1970 or after 9999), to None."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            t = float(value)
        except OverflowError:
            return None
        return t if _TIME_RANGE[0] <= t <= _TIME_RANGE[1] else None  # False for NaN
    if isinstance(value, str) and value:
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except (ValueError, OverflowError):
            return None
    return None
