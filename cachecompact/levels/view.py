"""What the levels plan against: per-message tokens and state in the current rendered view,
tool calls and results, and round boundaries. Read-only; built once per policy run."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..ledger import LedgerEntry, ReplaceWithSummary, SkipRange, split_effective
from ..wire import ToolResultBlock, ToolUseBlock, content_blocks

if TYPE_CHECKING:
    from ..session import Session

__all__ = ["PLACEHOLDER_TOKENS", "Proposal", "ResultInfo", "View", "build_view"]

PLACEHOLDER_TOKENS = 60  # what a cleared result still costs (its placeholder text)


@dataclass(slots=True)
class ResultInfo:
    """One tool_result block and the call it answers."""

    message: int
    block: int
    tool_use_id: str
    name: str
    input: dict[str, Any]
    tokens: int  # raw tokens of the original result block
    chars: int
    text: str
    edited: bool  # already cleared/summarised by a targeted or whole-message edit
    visible: bool  # rendered at all (not inside a summary or skipped range)
    is_error: bool


@dataclass(slots=True)
class View:
    n: int
    prefix_end: int
    total_tokens: int  # raw tokens of the current render
    msg_tokens: list[int]  # raw tokens each transcript message contributes now (summary: at its start)
    covered_by: list[LedgerEntry | None]  # whole-message effective edit covering each message
    results: list[ResultInfo]
    tool_result_tokens: int  # raw tokens of visible tool_result blocks in the render
    round_ends: list[int]  # indices e where a whole API round ends (e+1 starts with an assistant or is the end)
    cumulative_before: list[int] = field(default_factory=list)  # raw tokens before message i in the render

    def editable_start(self) -> tuple[int, LedgerEntry | None]:
        """First editable index, and the summary starting there that a new summary would subsume."""
        pe = self.prefix_end
        e = self.covered_by[pe] if pe < self.n else None
        return pe, (e if e is not None and e.kind == "summary" and e.start == pe else None)

    def tokens_between(self, start: int, end: int) -> int:
        return sum(self.msg_tokens[start:end + 1])

    def suffix_tokens(self, index: int) -> int:
        """Raw tokens from the first block of transcript message ``index`` to the end."""
        if index >= self.n:
            return 0
        return self.total_tokens - self.cumulative_before[index]

    def tail_start(self, keep_rounds: int) -> int:
        """Index where the last ``keep_rounds`` complete rounds begin (n if none)."""
        ends = [e for e in self.round_ends if e < self.n - 1]
        if keep_rounds <= 0:
            return self.n
        if len(ends) < keep_rounds:
            return self.prefix_end
        return ends[-keep_rounds] + 1


@dataclass(slots=True)
class Proposal:
    """A level's plan: edits ready to append, or a range that still needs a summary."""

    level: str
    reason: str
    edits: list[SkipRange | ReplaceWithSummary] = field(default_factory=list)
    summarize: tuple[int, int] | None = None
    tokens_removed: int = 0  # estimated raw tokens the plan removes from the request
    break_at: int | None = None  # earliest transcript index whose rendered bytes change (None: nothing sent yet)
    previous_summary: LedgerEntry | None = None  # a summary the new one subsumes

    @property
    def empty(self) -> bool:
        return not self.edits and self.summarize is None


def build_view(session: Session) -> View:
    """Snapshot the session's current render as a `View` (through the render's public read API)."""
    r = session.render(breakpoints=False)
    t = session.transcript
    n = len(t)
    pe = session.prefix_end or 0
    whole, targeted = split_effective(session.ledger.effective())
    covered: list[LedgerEntry | None] = [None] * n
    for e in whole:
        for i in range(e.start, e.end + 1):
            covered[i] = e
    msg_tokens = [0] * n
    cum_before = [0] * (n + 1)
    tool_tokens = 0
    # walk the rendered blocks once: attribute each block's tokens to its source message
    seen_first: set[int] = set()
    for b in r.blocks()[r.head_blocks:]:
        loc = b.location
        src = loc.transcript_index
        if src is None and loc.entry_seq is not None:
            src = session.ledger.entries[loc.entry_seq].start
        if src is not None:
            msg_tokens[src] += b.tokens
            if src not in seen_first:
                seen_first.add(src)
                cum_before[src] = b.cumulative_tokens - b.tokens
        if b.kind == "tool_result":
            tool_tokens += b.tokens
    # messages with no rendered block (skipped) start where the next rendered one starts
    nxt = r.raw_tokens
    for i in range(n - 1, -1, -1):
        if i in seen_first:
            nxt = cum_before[i]
        else:
            cum_before[i] = nxt
    results: list[ResultInfo] = []
    uses: dict[str, ToolUseBlock] = {}
    for i in range(n):
        m = t[i]
        if m.role == "assistant":
            for blk in content_blocks(m):
                if isinstance(blk, ToolUseBlock):
                    uses[blk.id] = blk
            continue
        if not t.is_tool_result_message(i):
            continue
        plain = session.renderer.plain_message(i)
        tmap = targeted.get(i, {})
        for j, blk in enumerate(content_blocks(m)):
            if not isinstance(blk, ToolResultBlock):
                continue
            use = uses.get(blk.tool_use_id)
            cov = covered[i]
            text = blk.content if isinstance(blk.content, str) else (
                "\n".join(getattr(x, "text", "") for x in blk.content) if isinstance(blk.content, list) else "")
            results.append(ResultInfo(
                message=i, block=j, tool_use_id=blk.tool_use_id, name=use.name if use else "?",
                input=use.input if use else {}, tokens=plain.blocks[j].tokens, chars=len(text), text=text,
                edited=blk.tool_use_id in tmap or covered[i] is not None,
                visible=cov is None or (cov.kind == "skip" and all(
                    t.is_tool_result_message(x) for x in range(cov.start, cov.end + 1))),
                is_error=bool(blk.is_error) if blk.is_error is not None else False,
            ))
    round_ends = [i for i in range(pe, n) if t[i].role == "user" and (i + 1 == n or t[i + 1].role == "assistant")
                  and not t.has_tool_use(i)]
    return View(n=n, prefix_end=pe, total_tokens=r.raw_tokens, msg_tokens=msg_tokens, covered_by=covered,
                results=results, tool_result_tokens=tool_tokens, round_ends=round_ends,
                cumulative_before=cum_before)
