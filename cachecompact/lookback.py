"""How far back the agent looks, and whether placeholders would have served it: the recent budget, learnt.

The recent budget (`LevelSettings.keep_recent_tokens`) keeps the newest tool output verbatim
because a cleared result keeps only its key lines, and an agent may need another line of it.
Whether it does is visible in the agent's own calls: when a call uses an identifier that an
earlier tool result showed, that is a *look-back*, at a distance (the tool tokens from that
result to now) and either **served** (a line naming it is one of the result's key lines, which
a placeholder keeps) or not. An agent whose look-backs are all served (one that looks up
definitions and settings) pays for a recent budget it does not need; one that quotes ordinary
lines (most coding agents) needs it.

`LookbackMeter` follows the transcript and answers one question: the smallest candidate
budget that would have lost the evidence of at most `miss_share` of the look-backs that could
have been lost at that budget. The share is estimated with Jeffreys' prior, (lost + 1/2) /
(look-backs + 1), so a handful of look-backs proves nothing: with none lost it takes 16 before
a budget may shrink at a 3% share. It only ever shrinks the configured budget, and everything it knows is derived from
the transcript, so a restarted process or another replica computes the same answer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .identifiers import candidate_tokens, identifiers_in_input
from .keylines import key_lines
from .wire import ToolResultBlock, ToolUseBlock, content_blocks

if TYPE_CHECKING:
    from .session import Session

__all__ = ["BUDGET_STEPS", "LookbackMeter"]

BUDGET_STEPS = (4, 2)  # candidate budgets: the configured one divided by these, smallest first


class LookbackMeter:
    """The agent's look-backs in one session, observed incrementally from its transcript."""

    def __init__(self, key_fraction: float, key_max_chars: int) -> None:
        self.key_fraction = key_fraction
        self.key_max_chars = key_max_chars
        self._seen = 0
        self._tool_tokens = 0  # tool calls and results so far, raw tokens
        self._where: dict[str, tuple[int, bool]] = {}  # identifier -> (tool tokens before its newest result, served)
        # look-backs: (distance in tool tokens, served, tool tokens of history when it was made)
        self.lookbacks: list[tuple[int, bool, int]] = []

    def observe(self, session: Session) -> None:
        """Take in the messages appended since the last call."""
        t = session.transcript
        pe = session.prefix_end or 0
        for i in range(self._seen, len(t)):
            plain = session.renderer.plain_message(i)
            for j, blk in enumerate(content_blocks(t[i])):
                if isinstance(blk, ToolUseBlock):
                    if i >= pe:
                        self._look(identifiers_in_input([blk.input]))
                    self._tool_tokens += plain.blocks[j].tokens
                elif isinstance(blk, ToolResultBlock):
                    start = self._tool_tokens
                    self._tool_tokens += plain.blocks[j].tokens
                    self._index(_text(blk), start, always=i < pe)
        self._seen = len(t)

    def _look(self, idents: list[str]) -> None:
        for x in idents:
            at = self._where.get(x)
            if at is not None:
                self.lookbacks.append((self._tool_tokens - at[0], at[1], self._tool_tokens))

    def _index(self, text: str, start: int, *, always: bool) -> None:
        """Where each identifier of a new result was last seen, and whether a placeholder keeps a line naming it."""
        budget = min(self.key_max_chars, int(self.key_fraction * len(text)))
        kept = set(key_lines(text, budget)) if budget > 0 and not always else set()
        here: dict[str, bool] = {}
        for line in text.split("\n"):
            served = always or line.rstrip() in kept
            for x in candidate_tokens(line):
                here[x] = here.get(x, False) or served
        for x, served in here.items():
            self._where[x] = (start, served)  # the newest result is what a look-back reaches first

    def served_share(self) -> float:
        """The share of look-backs so far that a placeholder would have served."""
        return sum(1 for _, served, _ in self.lookbacks if served) / len(self.lookbacks) if self.lookbacks else 0.0

    def budget(self, configured: int, miss_share: float) -> int:
        """The smallest candidate budget whose estimated share of lost look-backs is at most
        ``miss_share``, else ``configured``. A look-back counts for a candidate only if the
        history was longer than it when the call was made (else it could not have been lost)."""
        if miss_share <= 0 or configured <= 0:
            return configured
        for div in BUDGET_STEPS:
            b = configured // div
            eligible = [(d, served) for d, served, hist in self.lookbacks if hist > b]
            lost = sum(1 for d, served in eligible if d > b and not served)
            if (lost + 0.5) / (len(eligible) + 1) <= miss_share:
                return b
        return configured


def _text(blk: ToolResultBlock) -> str:
    c = blk.content
    if isinstance(c, str):
        return c
    if isinstance(c, list):
        return "\n".join(getattr(x, "text", "") for x in c)
    return ""
