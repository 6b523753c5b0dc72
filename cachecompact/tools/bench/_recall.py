"""What compaction hid from the agent, measured on the requests actually sent.

For each request the emulator answers, the probe looks at the recorded reply the replay is
about to return and the identifiers its tool calls use (paths, symbols, ids, numbers).

* **Evidence recall.** An identifier the call uses that earlier appeared in a tool result is
  a *reference*; its *evidence* is the earlier tool-result lines that contain it. It is
  recalled only when at least one of those lines is still visible verbatim in the request (in
  the original result, a preview or a summary). A line that is nothing but the identifier must
  appear as a whole line; a name in a digest or a file list of a summary does not count.
* **Name recall** (second column): the identifier appears anywhere in the request.
* **Prefix kept.** The share of requests that show the caller's first messages (the immutable
  prefix's, `PREFIX_MESSAGES`) as it sent them, by the engine's own message identity (cache
  markers and the string shorthand for one text block do not count): an API-written summary
  stands in for them (README guarantee 2).
* **Re-reads.** When a reference's evidence is not visible, a real agent would re-run the
  tool that produced the most recent evidence. The first time that happens for a given tool
  result, the probe charges one re-read turn (see `reread_cost`); the adjusted cost adds it.

Evidence is computed from the trace alone, once per trace, so every strategy is measured
against the same lines.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from ...base.identifiers import identifiers_in_input
from ...base.pricing import ModelInfo
from ...base.wire import canonical_bytes
from ...compaction.catalog import CachecompactConfig
from ...history.transcript import message_hash
from ..emulator.responders import ReplayResponder, Reply

__all__ = ["PREFIX_MESSAGES", "REREAD_OUTPUT_TOKENS", "Evidence", "RecallProbe", "evidence_table", "prefix_intact",
           "request_text", "reread_cost", "visible"]

PREFIX_MESSAGES = CachecompactConfig.prefix_messages  # the immutable prefix's messages by default

REREAD_OUTPUT_TOKENS = 150  # the tool call of a re-read turn
MAX_EVIDENCE_LINE = 400  # longer lines are cut at this many characters for matching


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


def prefix_intact(body: dict[str, Any], caller: Sequence[dict[str, Any]]) -> bool:
    """Whether the request shows the first `PREFIX_MESSAGES` messages of ``caller`` (the
    history the caller sent; as many as the request has so far) as the same messages
    (`message_hash`): the model reads the task as the person gave it, not a summary of it."""
    sent = body.get("messages") or []
    k = min(PREFIX_MESSAGES, len(caller), len(sent))
    return all(message_hash(a) == message_hash(b) for a, b in zip(sent[:k], caller[:k], strict=True))


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


def _result_text(block: dict[str, Any]) -> str:
    c = block.get("content")
    if isinstance(c, str):
        return c
    out: list[str] = []
    _texts(c, out)
    return "\n".join(out)


@dataclass(frozen=True, slots=True)
class Evidence:
    """One reference: an identifier, the lines that evidence it (newest first) and the tool result
    (trace message index) a re-read would re-run, with that result's size in characters."""

    identifier: str
    lines: tuple[str, ...]
    source: int
    source_tokens: int
    source_id: str = ""  # the tool_use id whose result holds the newest evidence line (what a re-run repeats)


def evidence_table(messages: Sequence[dict[str, Any]]) -> dict[int, list[Evidence]]:
    """For each assistant message index of the trace, the references its tool calls make."""
    return _evidence_cached(canonical_bytes(list(messages)))


@lru_cache(maxsize=8)
def _evidence_cached(raw: bytes) -> dict[int, list[Evidence]]:
    import msgspec

    from ...base.tokens import TokenCounter

    counter = TokenCounter()
    messages: list[dict[str, Any]] = msgspec.json.decode(raw)
    # every tool-result line of the trace, in order, with the message it came from
    text_parts: list[str] = []
    starts: list[int] = []  # offset of each line in `blob`
    line_msg: list[int] = []
    line_src: list[str] = []  # the tool_use id of the result each line is in
    sizes: dict[int, int] = {}
    offset = 0
    msg_end: dict[int, int] = {}  # message index -> blob offset after its lines
    for i, m in enumerate(messages):
        content = m.get("content")
        if m.get("role") == "user" and isinstance(content, list):
            for b in content:
                if isinstance(b, dict) and b.get("type") == "tool_result":
                    t = _result_text(b)
                    sizes[i] = sizes.get(i, 0) + counter.count_text(t)
                    for line in t.split("\n"):
                        text_parts.append(line)
                        starts.append(offset)
                        line_msg.append(i)
                        line_src.append(str(b.get("tool_use_id") or ""))
                        offset += len(line) + 1
        msg_end[i] = offset
    blob = "\n".join(text_parts)
    table: dict[int, list[Evidence]] = {}
    for i, m in enumerate(messages):
        content = m.get("content")
        if m.get("role") != "assistant" or not isinstance(content, list):
            continue
        inputs = [b.get("input", {}) for b in content if isinstance(b, dict) and b.get("type") == "tool_use"]
        idents = identifiers_in_input(inputs)
        if not idents:
            continue
        limit = msg_end.get(i - 1, 0)  # only results the agent had seen before this call
        refs: list[Evidence] = []
        for x in idents:
            lines: dict[str, None] = {}
            src, src_id = -1, ""
            pos = blob.rfind(x, 0, limit)
            while pos >= 0 and len(lines) < 64:
                k = bisect.bisect_right(starts, pos) - 1
                line = text_parts[k].strip()[:MAX_EVIDENCE_LINE]
                if line:
                    lines.setdefault(line, None)
                    if src < 0:
                        src, src_id = line_msg[k], line_src[k]
                pos = blob.rfind(x, 0, starts[k]) if starts[k] > 0 else -1
            if lines:
                refs.append(Evidence(x, tuple(lines), src, sizes.get(src, 0), src_id))
        if refs:
            table[i] = refs
    return table


def reread_cost(price: ModelInfo, context_tokens: int, evidence_tokens: int) -> float:
    """One re-read turn: the request's context read from cache, the re-run tool output written,
    and about `REREAD_OUTPUT_TOKENS` output tokens for the call."""
    return (context_tokens * price.read + evidence_tokens * price.write_5m
            + REREAD_OUTPUT_TOKENS * price.output) / 1e6


@dataclass
class RecallProbe:
    """A responder wrapping `ReplayResponder`: answers the same, measures recall on the way."""

    inner: ReplayResponder
    references: int = 0
    recalled: int = 0  # by evidence
    named: int = 0  # by name
    # (agent request ordinal, tokens of the tool result to re-run): one re-read turn each
    rereads: list[tuple[int, int]] = field(default_factory=list)
    per_request: list[tuple[int, int]] = field(default_factory=list)
    prefix_kept: int = 0  # requests that showed the caller's first messages as it sent them (`prefix_intact`)
    # the history the caller sends (the harness's); not the trace's, whose thinking the emulator signs anew
    caller: list[dict[str, Any]] | None = None
    _charged: set[int] = field(default_factory=set)
    _table: dict[int, list[Evidence]] | None = None

    def respond(self, body: dict[str, Any]) -> Reply:
        if self.caller is not None:
            self.prefix_kept += prefix_intact(body, self.caller)
        reply = self.inner.respond(body)
        if self._table is None:
            self._table = evidence_table(self.inner.messages)
        refs = self._table.get(self.inner.cursor - 1, [])
        if not refs:
            self.per_request.append((0, 0))
            return reply
        sent = "\n" + request_text(body) + "\n"
        ok = 0
        for ev in refs:
            self.references += 1
            self.named += ev.identifier in sent
            if _visible(ev, sent):
                ok += 1
                continue
            if ev.source not in self._charged:
                self._charged.add(ev.source)
                self.rereads.append((len(self.per_request), ev.source_tokens))
        self.recalled += ok
        self.per_request.append((len(refs), ok))
        return reply

    @property
    def recall(self) -> float:
        return self.recalled / self.references if self.references else 1.0

    @property
    def name_recall(self) -> float:
        return self.named / self.references if self.references else 1.0


def visible(ev: Evidence, sent: str) -> bool:
    """Whether one line of ``ev``'s evidence is in ``sent`` (the request's text with a newline at
    each end): verbatim, and as a whole line when the line is the identifier alone."""
    return _visible(ev, sent)


def _visible(ev: Evidence, sent: str) -> bool:
    for line in ev.lines:
        if line == ev.identifier:
            # a line that is the identifier alone must be a whole line of the request; the evidence line
            # was stripped, so the request's may carry the indentation and line end it had
            if f"\n{line}\n" in sent or (line in sent and re.search(
                    rf"(?m)^[ \t]*{re.escape(line)}[ \t\r]*$", sent) is not None):
                return True
        elif line in sent:
            return True
    return False
