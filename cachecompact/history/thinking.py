"""Which thinking blocks a request may carry, decided from the ledger alone.

Models with preserved thinking bind each thinking block to everything before it: "A thinking
block sent back is valid only if `system`, `tools` and every message before it are unchanged
since the model produced it" (build-with-claude/preserved-thinking; docs/cache-model.md). Every
ledger edit changes what a later request shows before the blocks that follow it, so:

* **The rule.** Assistant message ``i`` was produced by the request rendered from the first ``i``
  messages, under the ledger entries made by then (``transcript_len <= i``). A thinking block of
  it is *invalidated* by an entry made later (``transcript_len > i``) that changes something
  before the block: a whole-message edit starting before ``i``, or an edit of a tool call of
  message ``i`` itself that comes before the block (an earlier ``tool_use`` whose input a targeted
  edit replaced).
* **What the renderer does with them.** It leaves them out: "remove the thinking in the turns it
  keeps" is the docs' own advice for code that collapses or summarizes earlier turns (a turn of
  nothing but such blocks is left out whole: the API refuses an empty message). Removed this
  way, the blocks a request keeps are always an unbroken run of the original sequence ("You can
  remove thinking blocks from the start of the history, from the end, or all of them. What fails
  is a gap"): a block is invalidated only by an edit before it, and that edit invalidates every
  block between it and the edit's request too, while a block produced after an edit was made after
  the blocks the edit invalidated were already gone, so it follows the last block that stays.
* **API-written summaries.** An `ApiCompaction` entry invalidates nothing: the docs' other
  option for code that edits history is to "let the API write the summary", after which the
  kept turns' thinking stays valid (build-with-claude/compaction-thinking-blocks).
* **The one exception: a tool loop's latest assistant turn.** "With tool use, every `thinking` and
  `redacted_thinking` block from the assistant turn must be passed back exactly as received": when
  an edit is made on the request that answers a tool call, the calling turn's thinking is
  invalidated and may not be removed. It is sent as it is, and the request asks the API to drop it
  (``thinking.block_binding.prefix_mismatch_behavior: "drop_block"``, the documented escape hatch,
  with the ``thinking-binding-controls-2026-08-01`` beta). From the next request on that turn is no
  longer the latest, and its thinking is left out like any other. The latest turn is the one the
  API sees: an assistant message of thinking alone that the render leaves out (Claude Code's log
  of a reply cut off after its thinking) does not count (`latest_tool_turn`).

Only the ledger and the transcript decide this, so ``render --at-entry``, ``ledger verify`` and a
restarted process give the same bytes (docs/ledger-format.md, *Thinking blocks*). The transcript
keeps every block as received; ``render --uncompacted`` shows them all.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..base.wire import RedactedThinkingBlock, ThinkingBlock, ToolUseBlock, content_blocks
from .ledger import LedgerEntry
from .transcript import Transcript, TranscriptReader

__all__ = ["BINDING_BETA", "COMPACTION_BETA", "DROP_BLOCK", "ThinkingPlan", "plan_thinking"]

BINDING_BETA = "thinking-binding-controls-2026-08-01"
COMPACTION_BETA = "compact-2026-09-04"  # on-demand compaction (build-with-claude/compaction-on-demand)
DROP_BLOCK = {"prefix_mismatch_behavior": "drop_block"}


@dataclass(frozen=True, slots=True)
class ThinkingPlan:
    """For one render: the thinking blocks to leave out, per message, and whether the request
    must ask the API to drop the latest tool-loop turn's (``drop_block``)."""

    strip: dict[int, frozenset[int]]
    drop_block: bool = False
    kept_invalid: int | None = None  # the latest tool-loop turn whose invalidated thinking is sent

    @property
    def blocks(self) -> int:
        return sum(len(v) for v in self.strip.values())


def _is_thinking(b: object) -> bool:
    return isinstance(b, (ThinkingBlock, RedactedThinkingBlock))


def latest_tool_turn(t: TranscriptReader, n: int, left_out: Callable[[int], bool] = lambda i: True) -> int | None:
    """The assistant message the API sees as the latest of a request rendered from ``n``
    messages, when it calls tools (its results follow), else None: the turn whose thinking "must
    be passed back exactly as received". An assistant message of thinking alone that the render
    leaves out (``left_out``; by default any) is skipped: Claude Code logs a reply cut off after
    its thinking (an interruption, a streaming retry) as such a message, and when an edit strips
    that thinking the message goes and the tool call before it is the latest again (issue 48: a
    400 at request 125 of a 2.1.25 session). A request that ends with an assistant message (a
    prefill) has no such turn."""
    i = n - 1
    if i < 0 or t[i].role == "assistant":
        return None
    while i >= 0:
        if t[i].role == "assistant":
            blocks = content_blocks(t[i])
            if blocks and all(_is_thinking(b) for b in blocks) and left_out(i):
                i -= 1
                continue
            return i if any(isinstance(b, ToolUseBlock) for b in blocks) else None
        i -= 1
    return None


def plan_thinking(t: Transcript, entries: Sequence[LedgerEntry], n: int) -> ThinkingPlan:
    """The thinking plan of a request rendered from the first ``n`` messages under ``entries``
    (see the module docstring)."""
    # an API-written summary invalidates nothing after it: "the check accepts the swap when the API
    # wrote the summary", so the kept turns' thinking stays valid (build-with-claude/compaction-thinking-
    # blocks; the entry's rules in history/ledger.py keep its three conditions). Edits it contains still
    # count: a kept turn produced before one of them was bound to messages the block no longer matches.
    late = [e for e in entries if e.transcript_len > e.start and e.kind != "compaction"]
    if not late:
        return ThinkingPlan({})
    # messages strictly after an entry's start and before the request it was made for: every thinking
    # block there is invalidated (the entry's own first message only after the call it edits, below)
    spans = sorted((e.start + 1, min(e.transcript_len, n) - 1) for e in late)
    merged: list[list[int]] = []
    for lo, hi in spans:
        if lo > hi:
            continue
        if merged and lo <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    strip: dict[int, frozenset[int]] = {}
    for lo, hi in merged:
        for i in range(lo, hi + 1):
            if t[i].role != "assistant":
                continue
            js = frozenset(j for j, b in enumerate(content_blocks(t[i])) if _is_thinking(b))
            if js:
                strip[i] = js
    for e in late:  # an edit of a tool call's input: the thinking after that call, in the same message
        if e.tool_use_id is None or e.start >= n or t[e.start].role != "assistant":
            continue
        blocks = content_blocks(t[e.start])
        at = next((j for j, b in enumerate(blocks) if isinstance(b, ToolUseBlock) and b.id == e.tool_use_id), None)
        if at is not None:
            after = frozenset(j for j, b in enumerate(blocks) if j > at and _is_thinking(b))
            if after:
                strip[e.start] = strip.get(e.start, frozenset()) | after
    def stripped_whole(i: int) -> bool:  # the render leaves out a message whose every block it strips
        return len(strip.get(i, ())) == len(content_blocks(t[i]))

    latest = latest_tool_turn(t, n, stripped_whole)
    if latest is not None and latest in strip:
        del strip[latest]
        return ThinkingPlan(strip, drop_block=True, kept_invalid=latest)
    return ThinkingPlan(strip)
