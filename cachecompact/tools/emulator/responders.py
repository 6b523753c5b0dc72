"""The emulator's pluggable "model": what it answers, not how it bills.

* `ScriptedResponder`: deterministic replies for tests (a list, a function, or an echo).
* `ReplayResponder`: answers with the recorded next assistant message of a trace, so a real
  agent loop can be replayed request by request.
* `SummarizingResponder`: when ``tool_choice`` forces a named tool (a summarization call),
  fills that tool's ``input_schema`` extractively from the conversation; answers cachecompact's
  in-text summary requests the same way; otherwise delegates.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import xxhash

from ...base.tokens import TokenCounter
from ...base.wire import canonical_bytes
from ...compaction.summarize.extractive import block_texts, summary_facts

__all__ = ["ReplayResponder", "Reply", "Responder", "ScriptedResponder", "SummarizingResponder", "fill_schema",
           "replayed_blocks"]


def _blocks(m: dict[str, Any]) -> list[dict[str, Any]]:
    content = m["content"]
    return content if isinstance(content, list) else [{"type": "text", "text": content}]


_COUNTER: list[TokenCounter] = []


def _counter() -> TokenCounter:
    if not _COUNTER:
        _COUNTER.append(TokenCounter())
    return _COUNTER[0]


def replayed_blocks(m: dict[str, Any]) -> list[dict[str, Any]]:
    """A recorded assistant message's blocks without its thinking, unless thinking is all it has
    (how traces were replayed before the emulator re-signed replayed thinking: `ReplayResponder`
    with ``thinking=False``)."""
    content = m["content"]
    blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
    return [b for b in blocks if b.get("type") not in ("thinking", "redacted_thinking")] or blocks


@dataclass(slots=True)
class Reply:
    """A model's answer. With thinking on, a model with preserved thinking thinks before it answers
    unless ``thinks`` is False (a recorded turn that had no thinking); ``thinking_tokens`` gives,
    per thinking block of ``content`` in order, the tokens it stands for (a recorded block whose
    text was omitted: its tokens come from the recorded usage)."""

    content: list[dict[str, Any]]
    stop_reason: str = "end_turn"
    thinks: bool | None = None
    thinking_tokens: list[int] | None = None


class Responder(Protocol):
    def respond(self, body: dict[str, Any]) -> Reply: ...


# what a bare function given as a responder may be: the request body to a reply
ResponderFn = Callable[[dict[str, Any]], "Reply | str | dict[str, Any]"]


def _text_reply(text: str) -> Reply:
    return Reply([{"type": "text", "text": text}])


@dataclass
class ScriptedResponder:
    """Replies from ``script`` in order (cycling), or from a function of the request body.

    A reply (a script item or what the function returns) is a `Reply`, a string (one text
    block), or a dict ``{"content": [...blocks...], "stop_reason": ...}`` (the stop reason
    defaults to ``tool_use`` when a block is a tool call). With no script it answers
    ``"ok (N messages)"``, which is deterministic for a given request.
    """

    script: Sequence[Reply | str | dict[str, Any]] | Callable[[dict[str, Any]], Reply | str | dict[str, Any]] \
        | None = None
    _i: int = 0

    def respond(self, body: dict[str, Any]) -> Reply:
        if callable(self.script):
            return _as_reply(self.script(body))
        if not self.script:
            return _text_reply(f"ok ({len(body.get('messages') or [])} messages)")
        item = self.script[self._i % len(self.script)]
        self._i += 1
        return _as_reply(item)


def _as_reply(item: Reply | str | dict[str, Any]) -> Reply:
    if isinstance(item, Reply):
        return item
    if isinstance(item, str):
        return _text_reply(item)
    if not isinstance(item, dict):
        raise TypeError(f"a scripted reply must be a Reply, a str or a dict, not {type(item).__name__}")
    content = item.get("content")
    blocks = content if isinstance(content, list) else [{"type": "text", "text": str(content)}]
    stop = "tool_use" if any(b.get("type") == "tool_use" for b in blocks) else "end_turn"
    return Reply(blocks, item.get("stop_reason", stop))


def _user_key(m: dict[str, Any]) -> bytes:
    """Identity of a user message for replay lookup (cache_control ignored)."""
    content = m.get("content")
    if isinstance(content, str):
        content = [{"type": "text", "text": content}]
    blocks = [{k: v for k, v in b.items() if k != "cache_control"} for b in content or [] if isinstance(b, dict)]
    return xxhash.xxh3_128_digest(canonical_bytes(blocks))


@dataclass
class ReplayResponder:
    """Answer each request with the trace's next assistant message.

    A cursor walks the trace: the next unused assistant message answers, as long as the
    request's last user message is the one before it (or cannot be recognised, e.g. because
    compaction changed it). If the request clearly belongs elsewhere in the trace, the
    assistant message that followed that user message answers instead. Sessions that repeat
    an identical user message therefore still replay in order.
    """

    messages: Sequence[dict[str, Any]]
    # the recorded usage of each message (a trace's ``usage``): a replayed thinking block whose text was
    # omitted is billed as the tokens its turn thought, the turn's output less what it shows
    usage: Sequence[dict[str, Any] | None] = ()
    thinking: bool = True  # replay the recorded thinking blocks (False: leave them out, as before 2026-12)
    _by_user: dict[bytes, int] = field(default_factory=dict)
    _cursor: int = 0

    def __post_init__(self) -> None:
        for i, m in enumerate(self.messages[:-1]):
            if m.get("role") == "user" and self.messages[i + 1].get("role") == "assistant":
                self._by_user.setdefault(_user_key(m), i + 1)

    @property
    def cursor(self) -> int:
        """Trace index just after the assistant message last returned."""
        return self._cursor

    def respond(self, body: dict[str, Any]) -> Reply:
        return self.answer(self.select(body))

    def select(self, body: dict[str, Any]) -> int | None:
        """The trace index of the assistant message that answers ``body`` (None: the trace is
        over), without moving the cursor: a closed-loop agent looks before it answers."""
        msgs = body.get("messages") or []
        last_user = next((m for m in reversed(msgs) if m.get("role") == "user"), None)
        key = _user_key(last_user) if last_user else None
        idx = next((i for i in range(self._cursor, len(self.messages))
                    if self.messages[i].get("role") == "assistant"), None)
        expected = self.messages[idx - 1] if idx else None
        if key is not None and (expected is None or _user_key(expected) != key):
            idx = self._by_user.get(key, idx)
        return idx

    def answer(self, idx: int | None) -> Reply:
        """The recorded assistant message ``idx`` as a reply; the cursor moves past it."""
        if idx is None:
            return _text_reply("[replay finished: the trace has no further assistant message]")
        self._cursor = idx + 1
        m = self.messages[idx]
        blocks = _blocks(m) if self.thinking else replayed_blocks(m)
        if self.thinking and any(b.get("type") in ("thinking", "redacted_thinking") for b in blocks):
            # a response that thinks starts with its thinking; a log may keep a whitespace-only text block
            # before it (a 2026 Claude Code session: "\n\n"), which the API never returns and refuses when the
            # turn comes back as the tool loop's last assistant message ("a final `assistant` message must
            # start with a thinking block")
            first = next(k for k, b in enumerate(blocks) if b.get("type") in ("thinking", "redacted_thinking"))
            blocks = [b for k, b in enumerate(blocks)
                      if k >= first or b.get("type") != "text" or str(b.get("text", "")).strip()]
        stop = "tool_use" if any(b.get("type") == "tool_use" for b in blocks) else "end_turn"
        thought = [b for b in blocks if b.get("type") in ("thinking", "redacted_thinking")]
        if not self.thinking:
            return Reply([dict(b) for b in blocks], stop)
        return Reply([dict(b) for b in blocks], stop, thinks=bool(thought),
                     thinking_tokens=self._thought(idx, blocks) if thought else None)

    def _thought(self, idx: int, blocks: list[dict[str, Any]]) -> list[int]:
        """The tokens of each recorded thinking block: its text's, or, omitted, an equal share of
        what the turn's recorded output spent beyond its visible blocks."""
        counter = _counter()
        shown = sum(counter.count_text(json.dumps(b.get("input")) if b.get("type") == "tool_use" else
                                       str(b.get("text", ""))) for b in blocks
                    if b.get("type") not in ("thinking", "redacted_thinking"))
        u = self.usage[idx] if idx < len(self.usage) else None
        out = int((u or {}).get("output_tokens") or 0)
        empty = [b for b in blocks if b.get("type") == "redacted_thinking" or
                 (b.get("type") == "thinking" and not b.get("thinking"))]
        share = max(0, out - shown) // max(1, len(empty))
        return [share if (b.get("type") == "redacted_thinking" or not b.get("thinking")) else
                counter.count_text(str(b.get("thinking"))) for b in blocks
                if b.get("type") in ("thinking", "redacted_thinking")]


# -- an offline summarizer, standing in for a model -------------------------------------------------

_TAG = r"<{0}>\n?(.*?)\n?</{0}>"
def summary_request_facts(messages: Sequence[dict[str, Any]], ask: str) -> dict[str, Any]:
    """Facts for a summary of ``messages``, following ``ask`` where it names the goal
    (``<goal>``) or issues to keep (``<open_issues>``), as an instruction-following model would."""
    goal_m = re.search(_TAG.format("goal"), ask, re.S)
    issues_m = re.search(_TAG.format("open_issues"), ask, re.S)
    keep = [x[2:].strip() for x in (issues_m.group(1).splitlines() if issues_m else [])
            if x.startswith("- ") and x[2:].strip() not in ("", "(none)")]
    return summary_facts(messages, goal_m.group(1).strip() if goal_m else "", keep)


def fill_schema(schema: dict[str, Any], facts: dict[str, Any], name: str = "") -> Any:
    """A value of JSON-schema ``schema`` built from ``facts`` (by property name, then by type)."""
    if name in facts:
        val = facts[name]
        t = schema.get("type")
        if t == "string" and not isinstance(val, str):
            return "; ".join(map(str, val)) if isinstance(val, list) else str(val)
        if t == "array" and isinstance(val, str):
            return [val] if val else []
        return val
    t = schema.get("type")
    if t == "object" or "properties" in schema:
        props = schema.get("properties") or {}
        return {k: fill_schema(v if isinstance(v, dict) else {}, facts, k) for k, v in props.items()}
    if t == "array":
        return []
    if t in ("integer", "number"):
        return 0
    if t == "boolean":
        return False
    if schema.get("enum"):
        return schema["enum"][0]
    return "; ".join(facts.get("completed_steps", [])[-3:]) if t == "string" else None


def _schema_in(text: str) -> dict[str, Any] | None:
    """The first JSON object in ``text`` that looks like a JSON schema (has ``properties``)."""
    i = text.find("{")
    while i >= 0:
        try:
            obj, _ = json.JSONDecoder().raw_decode(text[i:])
        except json.JSONDecodeError:
            i = text.find("{", i + 1)
            continue
        if isinstance(obj, dict) and "properties" in obj:
            return obj
        i = text.find("{", i + 1)
    return None


@dataclass
class SummarizingResponder:
    """Answers summary requests the way a model would; everything else goes to ``inner``.

    * a request whose ``tool_choice`` forces a tool gets a call of that tool, its
      ``input_schema`` filled from the conversation in the request (`summary_facts`);
    * a request whose last user message asks for an answer inside ``<summary></summary>`` tags
      by a JSON schema it gives (a summary on the conversation's own cached prefix) gets
      ``<summary>{json}</summary>`` filled from the messages before it, by that schema.
    """

    inner: Responder = field(default_factory=ScriptedResponder)

    def respond(self, body: dict[str, Any]) -> Reply:
        msgs = body.get("messages") or []
        choice = body.get("tool_choice") or {}
        if isinstance(choice, dict) and choice.get("type") == "tool":
            tool = next((t for t in body.get("tools") or [] if t.get("name") == choice.get("name")), None)
            if tool is not None:
                ask = "\n".join(t for m in msgs for _, t in block_texts(m))
                conv = re.search(_TAG.format("conversation"), ask, re.S)
                convo = _serialized(conv.group(1)) if conv else msgs
                facts = summary_request_facts(convo, ask)
                args = fill_schema(tool.get("input_schema") or {"type": "object"}, facts)
                n = sum(1 for m in msgs if m.get("role") == "assistant")
                return Reply([{"type": "tool_use", "id": f"toolu_emu_summary_{n:06d}", "name": tool["name"],
                               "input": args}], "tool_use")
        last = msgs[-1] if msgs else {}
        # a request written as text by the user (never a tool's output that happens to mention tags)
        ask = "\n".join(t for k, t in block_texts(last) if k == "text") if last.get("role") == "user" else ""
        # a summarizer's ask names the empty tags and gives a JSON schema; an agent's own text
        # that merely holds <summary> elements (Claude Code's task notifications, a user's
        # template) is a turn of the conversation, answered by ``inner``
        schema = _schema_in(ask) if "<summary></summary>" in ask else None
        if schema is not None:
            args = fill_schema(schema, summary_request_facts(msgs[:-1], ask))
            return Reply([{"type": "text", "text": f"<summary>{json.dumps(args)}</summary>"}])
        return self.inner.respond(body)


def _serialized(text: str) -> list[dict[str, Any]]:
    """A conversation given as ``role: text`` lines, back as messages (continuation lines kept)."""
    out: list[dict[str, Any]] = []
    for line in text.split("\n"):
        role, _, rest = line.partition(": ")
        if role in ("user", "assistant") and _:
            kind = "tool_result" if role == "user" else "text"
            block = {"type": "tool_result", "tool_use_id": "x", "content": rest} if kind == "tool_result" else \
                {"type": "text", "text": rest}
            out.append({"role": role, "content": [block]})
        elif out:
            b = out[-1]["content"][-1]
            key = "content" if b["type"] == "tool_result" else "text"
            b[key] += "\n" + line
    return out
