"""The block cache: every rendered block and message is built once and then shared by identity.

A transcript message renders the same way until a ledger edit covers it, so its blocks
(dict, canonical bytes, key, token estimate) are built on first use and reused by every
later render. Edited forms (a cleared or summarised tool result, a summary message) are
cached per (message, edits) the same way. Identity is what lets the chain carry over: two
renders share a block exactly when they share the object.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...base.tokens import BLOCK_OVERHEAD, TokenCounter, block_tokens
from ...base.wire import (
    Block,
    TextBlock,
    ToolDef,
    ToolResultBlock,
    ToolUseBlock,
    UnknownBlock,
    block_to_dict,
    canonical_bytes,
    content_blocks,
)
from ...cache.cache_keys import block_key, is_cacheable, tool_key
from ..ledger import LedgerEntry
from ..transcript import Transcript

__all__ = ["BlockCache", "RenderedBlock", "RenderedMessage", "cleared_input", "cleared_placeholder", "summary_text"]


@dataclass(slots=True, eq=False)
class RenderedBlock:
    """One block as sent: its dict, canonical bytes, cache key, raw token estimate and origin."""

    d: dict[str, Any]
    raw: bytes
    key: bytes
    tokens: int
    kind: str
    cacheable: bool
    transcript_index: int | None
    entry_seq: int | None


@dataclass(slots=True, eq=False)
class RenderedMessage:
    role: str
    blocks: list[RenderedBlock]
    d: dict[str, Any]
    raw: bytes | None = None  # canonical bytes, filled on first use

    def canonical(self) -> bytes:
        """The message's canonical bytes, spliced from its blocks' cached bytes."""
        if self.raw is None:
            if len(self.d) == 2:  # only role and content
                inner = b",".join(b.raw for b in self.blocks)
                self.raw = b'{"content":[' + inner + b'],"role":' + canonical_bytes(self.role) + b"}"
            else:
                self.raw = canonical_bytes(self.d)
        return self.raw


def cleared_placeholder(e: LedgerEntry, message: int, tokens: int) -> str:
    """What a tool result cleared by a ``skip`` edit shows (see docs/ledger-format.md)."""
    return (f"[cachecompact: this tool result was cleared to save context (ledger entry #{e.seq}, {e.level}, "
            f"~{tokens} tokens). The original is kept in the session transcript as message {message}; run the "
            "tool again if you need it.]")


def cleared_input(e: LedgerEntry, tokens: int) -> dict[str, str]:
    """What a tool call's ``input`` becomes when an edit targets it (see docs/ledger-format.md)."""
    if e.kind == "summary":
        return {"cachecompact": e.summary or ""}
    return {"cachecompact": f"input cleared to save context (ledger entry #{e.seq}, {e.level}, ~{tokens} tokens); "
                            "the call's result shows what it did"}


def summary_text(e: LedgerEntry) -> str:
    """The single text block a whole-range ``summary`` edit renders as."""
    return (f"[cachecompact summary of messages {e.start}-{e.end} (ledger entry #{e.seq}, {e.level}). "
            f"The full messages are kept in the session transcript.]\n{e.summary}")


class BlockCache:
    """Rendered blocks and messages for one session, built once and reused by identity."""

    def __init__(self, transcript: Transcript, counter: TokenCounter) -> None:
        self.t = transcript
        self.counter = counter
        self._plain: dict[int, RenderedMessage] = {}
        self._edited: dict[tuple[int, tuple[int, ...]], RenderedMessage] = {}

    def block(self, b: Block, ti: int | None, seq: int | None, first: bool) -> RenderedBlock:
        d = block_to_dict(b, strip_cache_control=True)
        raw = canonical_bytes(d)
        key = block_key(d) if any(v is None for v in d.values()) else block_key(d, raw)
        kind = d["type"]
        return RenderedBlock(d, raw, key, block_tokens(self.counter, key, b, first), kind, is_cacheable(kind, d),
                             ti, seq)

    def tool(self, tool: ToolDef) -> RenderedBlock:
        d, raw, key = tool_key(tool.raw)
        tokens = self.counter.count_cached(key, raw.decode(), BLOCK_OVERHEAD)
        return RenderedBlock(d, raw, key, tokens, "tool", True, None, None)

    @staticmethod
    def _message(role: str, blocks: list[RenderedBlock], extra: dict[str, Any] | None = None) -> RenderedMessage:
        return RenderedMessage(role, blocks, {"role": role, "content": [b.d for b in blocks], **(extra or {})})

    def plain(self, i: int) -> RenderedMessage:
        """Transcript message ``i`` as the caller sent it (cache markers removed)."""
        m = self._plain.get(i)
        if m is None:
            msg = self.t[i]
            # a mid-conversation system message's blocks take a marker like any text block: its
            # content is text blocks (SDK `SystemMessageParam`: `str | Iterable[TextBlockParam]`,
            # which carry `cache_control`), and Claude Code marks the one it sends at messages[1].
            # Left unmarked, the first request of each of its conversations wrote none of that
            # message's ~2,800 tokens to the cache (issue 62's trial: compact mode 0.4-2.3% dearer
            # than direct at 1M, where it edited nothing)
            blocks = [self.block(b, i, None, j == 0) for j, b in enumerate(content_blocks(msg))]
            m = self._plain[i] = self._message(msg.role, blocks, msg.extra)
        return m

    def results(self, i: int, by_id: dict[str, LedgerEntry], whole: LedgerEntry | None,
                cache: bool = True) -> RenderedMessage:
        """Message ``i`` with edited tool results; every tool_use/tool_result pair stays.

        ``whole`` clears every result of the message; otherwise ``by_id`` maps a tool_use_id
        to the entry that clears it or replaces its content with a summary.
        """
        key = (i, (whole.seq,) if whole is not None else tuple(sorted(e.seq for e in by_id.values())))
        m = self._edited.get(key) if cache else None
        if m is None:
            src = self.plain(i)
            blocks = []
            for j, b in enumerate(content_blocks(self.t[i])):
                e = (whole or by_id.get(b.tool_use_id)) if isinstance(b, ToolResultBlock) else None
                if e is None or not isinstance(b, ToolResultBlock):
                    blocks.append(src.blocks[j])
                    continue
                text = (e.summary or "") if e.kind == "summary" else cleared_placeholder(e, i, src.blocks[j].tokens)
                edited = ToolResultBlock(tool_use_id=b.tool_use_id, content=text, is_error=b.is_error)
                blocks.append(self.block(edited, i, e.seq, j == 0))
            m = self._message("user", blocks)
            if cache:
                self._edited[key] = m
        return m

    def inputs(self, i: int, by_id: dict[str, LedgerEntry], cache: bool = True) -> RenderedMessage:
        """Assistant message ``i`` with the inputs of some tool calls cleared or summarised; every
        other block (thinking included) is the original, shared."""
        key = (i, tuple(sorted(e.seq for e in by_id.values())))
        m = self._edited.get(key) if cache else None
        if m is None:
            src = self.plain(i)
            msg = self.t[i]
            blocks = []
            for j, b in enumerate(content_blocks(msg)):
                e = by_id.get(b.id) if isinstance(b, ToolUseBlock) else None
                if e is None or not isinstance(b, ToolUseBlock):
                    blocks.append(src.blocks[j])
                    continue
                edited = ToolUseBlock(id=b.id, name=b.name, input=cleared_input(e, src.blocks[j].tokens),
                                      extra=b.extra)
                blocks.append(self.block(edited, i, e.seq, j == 0))
            m = self._message(msg.role, blocks, msg.extra)
            if cache:
                self._edited[key] = m
        return m

    def targeted(self, i: int, by_id: dict[str, LedgerEntry], cache: bool = True) -> RenderedMessage:
        """Message ``i`` with its targeted edits: tool results of a user message, tool inputs of an
        assistant message."""
        if self.t[i].role == "assistant":
            return self.inputs(i, by_id, cache)
        return self.results(i, by_id, None, cache)

    def without_thinking(self, i: int, m: RenderedMessage, drop: frozenset[int]) -> RenderedMessage | None:
        """Message ``i`` as rendered (``m``), without the thinking blocks at ``drop`` (an edit before
        them invalidated them: `history.thinking`); every other block is shared. A message of
        nothing but such blocks is not rendered at all (None): the API refuses an empty message, and
        sending the invalid blocks would be refused too. Its neighbours then are turns of one role,
        which the API combines."""
        key = (i, (-2, *sorted(drop), id(m)))
        out = self._edited.get(key)
        if out is None:
            blocks = [b for j, b in enumerate(m.blocks) if j not in drop]
            if not blocks:
                return None
            extra = {k: v for k, v in m.d.items() if k not in ("role", "content")}
            out = self._edited[key] = self._message(m.role, blocks, extra)
        return out

    def summary(self, e: LedgerEntry, cache: bool = True) -> RenderedMessage:
        """One user message, clearly marked, standing for messages e.start..e.end."""
        key = (-1, (e.seq,))
        m = self._edited.get(key) if cache else None
        if m is None:
            m = self._message("user", [self.block(TextBlock(text=summary_text(e)), None, e.seq, True)])
            if cache:
                self._edited[key] = m
        return m

    def compaction(self, e: LedgerEntry, cache: bool = True) -> RenderedMessage:
        """The API's signed block, alone in an assistant message (the form the on-demand docs show),
        byte for byte as returned: standing for messages 0..e.end."""
        key = (-3, (e.seq,))
        m = self._edited.get(key) if cache else None
        if m is None:
            raw = {"type": "compaction", "content": e.summary or "", "signature": e.signature or ""}
            m = self._message("assistant", [self.block(UnknownBlock(type="compaction", raw=raw), None, e.seq, True)])
            if cache:
                self._edited[key] = m
        return m

    def entry_messages(self, e: LedgerEntry, cache: bool = True) -> list[RenderedMessage]:
        """What a whole-message entry renders as: a summary (ours or the API's), cleared results,
        or nothing."""
        if e.kind == "compaction":
            return [self.compaction(e, cache)]
        if e.kind == "summary":
            return [self.summary(e, cache)]
        if all(self.t.is_tool_result_message(i) for i in range(e.start, e.end + 1)):
            return [self.results(i, {}, e, cache) for i in range(e.start, e.end + 1)]
        return []
