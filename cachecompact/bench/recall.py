"""Reference recall: did compaction hide what the agent's later tool calls needed?

For every request the emulator answers, the probe looks at the recorded reply the replay is
about to return. The identifiers its tool calls use (paths, symbols, ids, numbers) that
already appeared earlier in the uncompacted conversation are *references*; those still
visible somewhere in the request actually sent (its text, a summary, a placeholder or a
preview) are *recalled*. Recall = recalled / references, summed over the session.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..emulator.responders import ReplayResponder, Reply
from ..identifiers import identifiers_in_input
from ..wire import canonical_bytes

__all__ = ["RecallProbe", "request_text"]


def _texts(obj: Any, out: list[str]) -> None:
    if isinstance(obj, str):
        out.append(obj)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            if k not in ("type", "cache_control", "id", "tool_use_id", "signature"):
                _texts(v, out)
    elif isinstance(obj, list):
        for v in obj:
            _texts(v, out)


def request_text(body: dict[str, Any]) -> str:
    """All the text a request shows the model: system, messages (tool inputs as JSON)."""
    out: list[str] = []
    _texts(body.get("system"), out)
    for m in body.get("messages") or []:
        for b in m.get("content") if isinstance(m.get("content"), list) else [m.get("content")]:
            if isinstance(b, dict) and b.get("type") == "tool_use":
                out.append(canonical_bytes(b.get("input", {})).decode())
            else:
                _texts(b, out)
    return "\n".join(out)


@dataclass
class RecallProbe:
    """A responder wrapping `ReplayResponder`: answers the same, measures recall on the way."""

    inner: ReplayResponder
    references: int = 0
    recalled: int = 0
    per_request: list[tuple[int, int]] = field(default_factory=list)
    _earlier: str = ""  # text of trace messages [0, _upto)
    _upto: int = 0

    def respond(self, body: dict[str, Any]) -> Reply:
        reply = self.inner.respond(body)
        idx = self.inner._cursor - 1  # the trace index of the reply just chosen
        idents = identifiers_in_input([b.get("input", {}) for b in reply.content if b.get("type") == "tool_use"])
        if not idents:
            self.per_request.append((0, 0))
            return reply
        if idx < self._upto:  # the replay jumped back: rebuild from the start
            self._earlier, self._upto = "", 0
        if self._upto < idx:
            self._earlier += "\n" + request_text({"messages": list(self.inner.messages[self._upto: idx])})
            self._upto = idx
        earlier = self._earlier
        sent = request_text(body)
        refs = [x for x in idents if x in earlier]
        ok = sum(1 for x in refs if x in sent)
        self.references += len(refs)
        self.recalled += ok
        self.per_request.append((len(refs), ok))
        return reply

    @property
    def recall(self) -> float:
        return self.recalled / self.references if self.references else 1.0
