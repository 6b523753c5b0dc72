"""What the levels plan against: per-message tokens and state in the current rendered view,
tool calls and results, and round boundaries. Read-only; built once per policy run."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ...base.identifiers import identifiers_in_input
from ...base.keylines import Focus
from ...base.values import Level
from ...base.wire import TextBlock, ToolResultBlock, ToolUseBlock, content_blocks, result_text
from ...history.ledger import GIVEN_BACK_LEVEL, LedgerEntry, ReplaceWithSummary, SkipRange, split_effective

if TYPE_CHECKING:
    from ...history.draft import Draft

__all__ = ["PLACEHOLDER_TOKENS", "InputInfo", "LaterIdentifiers", "Proposal", "ResultInfo", "View",
           "build_view", "message_results", "older_results", "older_tool_blocks", "results_since"]

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
    media: bool = False  # the result carries an image or document, which ``text`` does not show


@dataclass(slots=True)
class InputInfo:
    """One tool_use block's input (the arguments of a call) in an assistant message."""

    message: int
    block: int
    tool_use_id: str
    name: str
    tokens: int  # raw tokens of the original tool_use block
    edited: bool
    visible: bool


@dataclass(slots=True)
class View:
    n: int
    prefix_end: int
    total_tokens: int  # raw tokens of the current render
    msg_tokens: list[int]  # raw tokens each transcript message contributes now (summary: at its start)
    covered_by: list[LedgerEntry | None]  # whole-message effective edit covering each message
    results: list[ResultInfo]
    tool_result_tokens: int  # raw tokens of visible tool_result blocks in the render
    round_ends: list[int]  # indices e where a whole API round ends and no edit straddles e (valid range ends)
    cumulative_before: list[int] = field(default_factory=list)  # raw tokens before message i in the render
    inputs: list[InputInfo] = field(default_factory=list)  # tool calls after the prefix

    def editable_start(self) -> tuple[int, LedgerEntry | None]:
        """First editable index, and the summary starting there that a new summary would subsume."""
        pe = self.prefix_end
        e = self.covered_by[pe] if pe < self.n else None
        return pe, (e if e is not None and e.kind == "summary" and e.start == pe else None)

    def rounds_within(self, tokens: int) -> int:
        """How many of the newest whole rounds fit together in ``tokens`` (raw): a level that keeps
        rounds keeps at least these, so a round of a one-word result and one of a long file read do
        not count alike."""
        last = self.n - 1
        k = 0
        for e in reversed([e for e in self.round_ends if e < last]):
            if self.suffix_tokens(e + 1) > tokens:  # from e + 1 to the end, O(1): called once per deeper cut
                break
            k += 1
        return k

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

    level: Level
    reason: str
    edits: list[SkipRange | ReplaceWithSummary] = field(default_factory=list)
    summarize: tuple[int, int] | None = None
    tokens_removed: int = 0  # estimated raw tokens the plan removes from the request
    break_at: int | None = None  # earliest transcript index whose rendered bytes change (None: nothing sent yet)
    previous_summary: LedgerEntry | None = None  # a summary the new one subsumes
    # scratchpad content its placeholders name (reference -> text): kept with the plan only when
    # the proposal is applied (`Draft.keep`), so a proposal weighed and dropped stores nothing
    blobs: dict[str, str] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not self.edits and self.summarize is None


def message_results(session: Draft, i: int, *, edited_ids: Collection[str] = (), whole: bool = False,
                    visible: bool = True) -> list[ResultInfo]:
    """The tool results of transcript message ``i`` with the calls (in message i-1) they answer."""
    t = session.transcript
    uses = {b.id: b for b in content_blocks(t[i - 1]) if isinstance(b, ToolUseBlock)} if i else {}
    plain = session.plain_message(i)
    out = []
    for j, blk in enumerate(content_blocks(t[i])):
        if not isinstance(blk, ToolResultBlock):
            continue
        use = uses.get(blk.tool_use_id)
        text = result_text(blk)
        out.append(ResultInfo(
            message=i, block=j, tool_use_id=blk.tool_use_id, name=use.name if use else "?",
            input=use.input if use else {}, tokens=plain.blocks[j].tokens, chars=len(text), text=text,
            edited=whole or blk.tool_use_id in edited_ids, visible=visible,
            is_error=bool(blk.is_error) if blk.is_error is not None else False,
            media=isinstance(blk.content, list) and any(not isinstance(x, TextBlock) for x in blk.content)))
    return out


def results_since(session: Draft, since: int) -> list[ResultInfo]:
    """Tool results of messages ``since..`` (new ones, never edited yet): no full view needed."""
    t = session.transcript
    out: list[ResultInfo] = []
    for i in range(max(since, session.prefix_end or 0), len(t)):
        if t.is_tool_result_message(i):
            out += message_results(session, i)
    return out


def _ends_at(e: LedgerEntry | None, i: int) -> bool:
    return e is None or e.end == i


def older_tool_blocks(view: View, keep_recent: int, keep_recent_tokens: int) -> tuple[list[ResultInfo],
                                                                                     list[InputInfo]]:
    """Visible tool results and tool calls after the prefix, minus the recent ones every level
    keeps verbatim: the last ``keep_recent`` results, and the newest calls and results that fit
    together in ``keep_recent_tokens``."""
    results = [r for r in view.results if r.visible and r.message >= view.prefix_end]
    inputs = [c for c in view.inputs if c.visible and c.message >= view.prefix_end]
    kept: set[int] = {id(r) for r in results[-keep_recent:]} if keep_recent > 0 else set()
    blocks: list[ResultInfo | InputInfo] = sorted([*results, *inputs], key=lambda b: (b.message, b.block))
    used = 0
    for b in reversed(blocks):  # the newest fill the budget first
        if used + b.tokens > keep_recent_tokens:
            break
        used += b.tokens
        kept.add(id(b))
    return [r for r in results if id(r) not in kept], [c for c in inputs if id(c) not in kept]


class LaterIdentifiers:
    """The `Focus` of any message of a view (the identifiers the agent's calls used after it),
    built on first use in one pass over its calls: one map, shared by every message."""

    def __init__(self, view: View) -> None:
        self.view = view
        self._last: dict[str, int] | None = None
        self._newest = -1

    def after(self, message: int) -> Focus | None:
        """The focus after ``message``; None when no call came after it."""
        if self._last is None:
            last: dict[str, int] = {}
            for r in self.view.results:  # in message order: later uses overwrite earlier ones
                for x in identifiers_in_input([r.input]):
                    last[x] = r.message
                self._newest = max(self._newest, r.message)
            self._last = last
        return Focus(self._last, message) if self._newest > message else None


def older_results(view: View, keep_recent: int, keep_recent_tokens: int) -> list[ResultInfo]:
    """The old results of `older_tool_blocks`."""
    return older_tool_blocks(view, keep_recent, keep_recent_tokens)[0]


def build_view(session: Draft) -> View:
    """Snapshot the session's current render as a `View` (through the render's public read API)."""
    r = session.render(breakpoints=False)
    t = session.transcript
    n = len(t)
    pe = session.edit_floor or 0  # after the prefix, and after an API-written summary (its block opens the request)
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
    for b in r.blocks()[r.preamble_blocks:]:
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
    inputs: list[InputInfo] = []
    for i in range(pe, n):
        cov = covered[i]
        if t.is_tool_result_message(i):
            visible = cov is None or (cov.kind == "skip" and all(
                t.is_tool_result_message(x) for x in range(cov.start, cov.end + 1)))
            # lines given back beside a result add to it: the result stays as clearable as it was
            edited = {tid for tid, e in targeted.get(i, {}).items() if e.level != GIVEN_BACK_LEVEL}
            results += message_results(session, i, edited_ids=edited, whole=cov is not None, visible=visible)
        elif t.has_tool_use(i):
            plain = session.plain_message(i)
            tmap = targeted.get(i, {})
            inputs += [InputInfo(i, j, b.id, b.name, plain.blocks[j].tokens, b.id in tmap or cov is not None,
                                 cov is None)
                       for j, b in enumerate(content_blocks(t[i])) if isinstance(b, ToolUseBlock)]
    # a range may end after message i only where a whole API round ends and no earlier edit
    # straddles i (a new edit must contain every edit it overlaps)
    round_ends = [i for i in range(pe, n) if t[i].role == "user" and (i + 1 == n or t[i + 1].role == "assistant")
                  and not t.has_tool_use(i) and _ends_at(covered[i], i)]
    return View(n=n, prefix_end=pe, total_tokens=r.raw_tokens, msg_tokens=msg_tokens, covered_by=covered,
                results=results, tool_result_tokens=tool_tokens, round_ends=round_ends,
                cumulative_before=cum_before, inputs=inputs)
