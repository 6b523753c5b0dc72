"""How far back the agent looks, and whether placeholders would have served it: the recent budget, learnt.

The recent budget (`LevelSettings.keep_recent_tokens`) keeps the newest tool output verbatim
because a cleared result keeps only its key lines, and an agent may need another line of it.
Whether it does is visible in the agent's own calls: when a call uses an identifier that an
earlier tool result showed, that is a *look-back*, at a distance (the tool tokens from that
result to now) and either **served** (a line naming it is one of the result's key lines, which
a placeholder keeps) or not. An agent whose look-backs are all served (one that looks up
definitions and settings) pays for a recent budget it does not need; one that quotes ordinary
lines (most coding agents) needs it.

`LookbackMeter` follows the transcript after the immutable prefix (never cleared, so never
at risk) and answers one question: by how much may the configured budget shrink? Each
assistant turn whose calls reached back is one look-back; for a smaller budget only the
look-backs that reached farther than it count, and of those the ones that reached an
unserved line that far would have lost their evidence. The share is estimated with Jeffreys'
prior, (lost + 1/2) / (far look-backs + 1), so a handful proves nothing: with none lost it
takes 16 before a budget may shrink at a 3% share. A call that repeats an earlier one (a
re-read) reached back to output no placeholder keeps whole. The meter only ever shrinks the
configured budget, and everything it knows is derived from the transcript, so a restarted
process or another replica computes the same answer. docs/policy.md has the rules.
"""

from __future__ import annotations

from bisect import bisect_right, insort
from typing import TYPE_CHECKING

from ..base.identifiers import identifiers, identifiers_in_input
from ..base.keylines import key_lines
from ..base.wire import ToolResultBlock, ToolUseBlock, call_key, content_blocks, result_text

if TYPE_CHECKING:
    from ..history.session import Session

__all__ = ["BUDGET_STEPS", "LookbackMeter"]

BUDGET_STEPS = (4, 2)  # candidate budgets: the configured one divided by these, smallest first


class LookbackMeter:
    """The agent's look-backs in one session, observed incrementally from its transcript."""

    def __init__(self, key_fraction: float, key_max_chars: int, min_clear_tokens: int = 0) -> None:
        self.key_fraction = key_fraction
        self.key_max_chars = key_max_chars
        self.min_clear_tokens = min_clear_tokens  # a smaller result is never cleared: repeating its call lost nothing
        self._seen = 0
        self._tool_tokens = 0  # tool calls and results after the immutable prefix so far, raw tokens
        # identifier -> (tool tokens before the newest result showing it, served); None: the prefix shows it
        self._where: dict[str, tuple[int, bool] | None] = {}
        self._calls: dict[bytes, int] = {}  # a call (name and input) -> tool tokens before its newest result
        self._pending: dict[str, bytes] = {}  # tool_use id -> its call, until its result arrives
        # one look-back per assistant turn that reached past the prefix: (farthest reach, farthest
        # unserved reach or -1), in tool tokens
        self.lookbacks: list[tuple[int, int]] = []
        self._reach: list[int] = []  # the farthest reaches, sorted
        self._unserved: list[int] = []  # the farthest unserved reaches, sorted

    def observe(self, session: Session) -> None:
        """Take in the messages appended since the last call (none until the prefix is complete)."""
        pe = session.prefix_end
        if pe is None:
            return
        t = session.transcript
        for i in range(self._seen, len(t)):
            blocks = content_blocks(t[i])
            if i < pe:  # the prefix: only what its results show (never at risk)
                for blk in blocks:
                    if isinstance(blk, ToolResultBlock):
                        self._index(result_text(blk), None)
                continue
            uses = [b for b in blocks if isinstance(b, ToolUseBlock)]
            if uses:
                self._look(identifiers_in_input([b.input for b in uses]), [self._call(b) for b in uses])
            plain = session.renderer.plain_message(i)
            for j, blk in enumerate(blocks):
                tokens = plain.blocks[j].tokens
                if isinstance(blk, ToolUseBlock):
                    self._tool_tokens += tokens
                elif isinstance(blk, ToolResultBlock):
                    start, self._tool_tokens = self._tool_tokens, self._tool_tokens + tokens
                    call = self._pending.pop(blk.tool_use_id, None)
                    if call is not None:
                        if tokens >= self.min_clear_tokens:
                            self._calls[call] = start
                        else:
                            self._calls.pop(call, None)
                    self._index(result_text(blk), start)
        self._seen = len(t)

    def _call(self, use: ToolUseBlock) -> int:
        """Remember a call until its result; if the same call ran before with a result big enough
        to be cleared, how far back that result lies (a re-run: the agent wanted that output
        again), else -1."""
        key = call_key(use)
        self._pending[use.id] = key
        before = self._calls.get(key)
        return self._tool_tokens - before if before is not None else -1

    def _look(self, idents: list[str], reruns: list[int]) -> None:
        """One look-back for a turn's calls: how far they reached, and how far to a line no
        placeholder keeps (a re-run reached its earlier output, which no placeholder keeps whole)."""
        reach = unserved = max(reruns, default=-1)
        for x in idents:
            at = self._where.get(x)
            if at is None:  # never shown, or shown in the immutable prefix, which is never cleared
                continue
            d = self._tool_tokens - at[0]
            reach = max(reach, d)
            if not at[1]:
                unserved = max(unserved, d)
        if reach >= 0:
            self.lookbacks.append((reach, unserved))
            insort(self._reach, reach)
            insort(self._unserved, unserved)

    def _index(self, text: str, start: int | None) -> None:
        """Where each identifier of a new result was last seen, and whether a placeholder surely
        keeps a line naming it there or in an earlier result (any visible line is evidence). An
        identifier the immutable prefix shows is never lost: it is not tracked."""
        if start is None:
            for x in identifiers(text):
                self._where[x] = None
            return
        here: dict[str, bool] = {}
        # half the placeholder's line budget: what it keeps whatever working set takes the other half
        budget = min(self.key_max_chars, int(self.key_fraction * len(text))) // 2
        kept = set(key_lines(text, budget)) if budget > 0 else set()
        for line in text.split("\n"):
            served = line.rstrip() in kept
            for x in identifiers(line):
                here[x] = here.get(x, False) or served
        for x, served in here.items():
            if x in self._where:
                was = self._where[x]
                if was is None:
                    continue  # the prefix shows it
                served = served or was[1]
            self._where[x] = (start, served)  # the newest result is what a look-back reaches first

    def far_and_lost(self, budget: int) -> tuple[int, int]:
        """Look-backs that reached farther than ``budget``, and those of them that reached an
        unserved line that far (their evidence would be gone at that budget)."""
        return (len(self._reach) - bisect_right(self._reach, budget),
                len(self._unserved) - bisect_right(self._unserved, budget))

    def divisor(self, configured: int, miss_share: float, *, at_entry: bool = False) -> int:
        """The largest of `BUDGET_STEPS` by which ``configured`` may be divided: among the agent's
        look-backs farther than the smaller budget, the estimated share that would lose their
        evidence is at most ``miss_share``; 1 if none qualifies (or the meter is off).

        ``at_entry``: may results also be shortened on arrival by the smaller budget? Such a
        result is shortened at any distance, so every look-back counts, near ones included."""
        if miss_share <= 0 or configured <= 0:
            return 1
        for div in BUDGET_STEPS:
            far, lost = self.far_and_lost(0 if at_entry else configured // div)
            if (lost + 0.5) / (far + 1) <= miss_share:
                return div
        return 1

