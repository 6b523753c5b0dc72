"""How far back the agent looks: the recent budget, learnt from the agent's own calls.

A compaction keeps the newest history verbatim (the recent budget) because the agent comes
back to what it read. How far back it comes shows in its own calls: when a call uses an
identifier (a path, a symbol, an id) that earlier tool output showed, that is a **look-back**,
and its **distance** is the tokens of history from that output to the end of the context the
call was made from. One coding agent edits the file it read three turns ago; another cites a
setting it read a hundred turns back. A budget that serves the second wastes money on the
first, and one that suits the first loses the second's evidence.

`LookbackMeter` follows the transcript after the immutable prefix (never cleared, so never at
risk; a call that names what a result in the prefix showed is still a look-back, as far back as
the history after the prefix: issue 63, where the first read sat in the prefix and the meter's
first evidence came a submission late) and answers: how much recent history covers a share ``coverage`` of this agent's
look-backs? For a budget K, only the look-backs made when more than K tokens of history lay
behind the call could have reached past it (the others are *censored*: early in a session
every look-back is short). The share that did reach past K is taken at the upper end of its
Wilson interval (one standard error, as the TTL rule takes its shares), so a handful proves
nothing, and the budget is the smallest of a geometric ladder whose share is at most
``1 - coverage``. Until some budget qualifies, the configured one stands.

A call that repeats an earlier call exactly (a re-read, a re-run) reached back to that call's
output. The meter also keeps, per identifier, the newest tool-output lines that named it, for
`compaction.restore`. Everything it knows is derived from the transcript, so a restarted
process or another replica computes the same budget.
"""

from __future__ import annotations

import math
from bisect import bisect_right, insort
from collections import deque
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from ..base.identifiers import identifiers, identifiers_in_input
from ..base.keylines import MAX_LINE
from ..base.shares import wilson_upper
from ..base.wire import ToolResultBlock, ToolUseBlock, call_key, content_blocks, result_text
from ..history.ledger import GIVEN_BACK_LEVEL, LedgerEntry, split_effective

if TYPE_CHECKING:
    from ..history.draft import Draft

__all__ = ["LADDER_FLOOR", "LADDER_RATIO", "LINES_PER_IDENTIFIER", "MIN_EXPECTED", "InView",
           "LookbackMeter"]

LADDER_RATIO = 1.25  # candidate budgets: a geometric ladder with this ratio
LADDER_FLOOR = 2_000  # tokens: the smallest candidate (L3 keeps its last rounds whatever the budget)
MIN_EXPECTED = 5  # look-backs expected past a budget before its share is trusted (the binomial's n*p >= 5)
LINES_PER_IDENTIFIER = 4  # the newest tool-output lines kept per identifier, for `compaction.restore`


class InView:
    """Which tool-output lines a request showed, given the ledger edits in force for it: a line
    of a result is in view when its result is not edited, or when the edit's text holds it
    (a placeholder's kept lines, a summary's verbatim lines); a line given back to a later
    result (`compaction.restore`) is in view there."""

    def __init__(self, entries: Sequence[LedgerEntry]) -> None:
        self.whole, self.targeted = split_effective(entries)
        self._starts = [e.start for e in self.whole]
        self.given_back = {x.strip() for e in entries if e.level == GIVEN_BACK_LEVEL
                           for x in (e.summary or "").split("\n")}

    def shows(self, message: int, tool_use_id: str, line: str) -> bool:
        """Whether ``line`` of the result ``tool_use_id`` in ``message`` is in view there."""
        k = bisect_right(self._starts, message) - 1
        if k >= 0 and self.whole[k].start <= message <= self.whole[k].end:
            e = self.whole[k]
            return e.kind in ("summary", "compaction") and line in (e.summary or "")  # ours, or the API's text
        t = self.targeted.get(message, {}).get(tool_use_id)
        return t is None or (t.kind == "summary" and line in (t.summary or ""))

    def any(self, lines: Iterable[tuple[int, str, str]]) -> bool:
        """Whether any of these (message, tool_use_id, line) is in view, where it was or given back."""
        return any(line in self.given_back or self.shows(m, tid, line) for m, tid, line in lines)


class LookbackMeter:
    """The agent's look-backs in one session, observed incrementally from its transcript."""

    def __init__(self, min_clear_tokens: int = 0) -> None:
        self.min_clear_tokens = min_clear_tokens  # a smaller result is never cleared: repeating its call lost nothing
        self._seen = 0
        self.turns = 0  # the agent's turns after the prefix (assistant messages)
        self._pos = 0  # raw tokens of history after the immutable prefix so far
        self._round_start = 0  # where the newest assistant message after the prefix starts
        # identifier -> position of the newest result after the prefix that showed it
        self._where: dict[str, int] = {}
        self.pinned: set[str] = set()  # identifiers the immutable prefix shows: never at risk
        # identifier -> the newest lines naming it, as (message, tool_use_id, line)
        self.lines: dict[str, deque[tuple[int, str, str]]] = {}
        self._calls: dict[bytes, int] = {}  # a call (name and input) -> position of its newest result
        self._pending: dict[str, bytes] = {}  # tool_use id -> its call, until its result arrives
        # one entry per look-back: (distance, history behind the call), raw tokens
        self.lookbacks: list[tuple[int, int]] = []
        self._distance: list[int] = []  # in the order observed
        self._span: list[int] = []  # in the order observed, which is ascending: history only grows
        # look-backs whose newest evidence compaction had hidden, and those that found no line of it in view
        self.exposed = 0
        self.missed = 0
        self._by_distance: list[int] = []  # the distances, sorted
        # the ledger's effective edits after its first ``_applied`` entries, kept up to date as the
        # meter moves forward (entries are made in transcript order), and the view they give
        self._applied = 0
        self._effective: list[LedgerEntry] = []
        self._in_view: InView | None = None

    def observe(self, session: Draft) -> None:
        """Take in the messages appended since the last call (none until the prefix is complete)."""
        pe = session.prefix_end
        if pe is None:
            return
        t = session.transcript
        for i in range(self._seen, len(t)):
            blocks = content_blocks(t[i])
            if i < pe:  # the prefix: what its results show is never at risk, but reaching it is a look-back
                for blk in blocks:
                    if isinstance(blk, ToolResultBlock):
                        shown = identifiers(result_text(blk))
                        self.pinned.update(shown)
                        self._where.update((x, 0) for x in shown)  # 0: where the history after the prefix starts
                continue
            self.turns += t[i].role == "assistant"
            # a result is kept only with the round that asked for it (compaction cuts between rounds, and
            # a parallel call's sibling results come along): its distance is measured from the call
            origin = self._round_start if i - 1 >= pe and t[i - 1].role == "assistant" else self._pos
            if t[i].role == "assistant":
                self._round_start = self._pos
            uses = [b for b in blocks if isinstance(b, ToolUseBlock)]
            if uses:
                self._look(identifiers_in_input([b.input for b in uses]), [self._call(b) for b in uses],
                           i, session)
            plain = session.plain_message(i)
            for j, blk in enumerate(blocks):
                tokens = plain.blocks[j].tokens
                self._pos += tokens
                if not isinstance(blk, ToolResultBlock):
                    continue
                call = self._pending.pop(blk.tool_use_id, None)
                if call is not None:
                    if tokens >= self.min_clear_tokens:
                        self._calls[call] = origin
                    else:
                        self._calls.pop(call, None)
                self._index(i, blk.tool_use_id, result_text(blk), origin)
        self._seen = len(t)

    def _call(self, use: ToolUseBlock) -> int:
        """Remember a call until its result; if the same call ran before with a result big enough
        to be cleared, how far back that result lies (a re-run: the agent wanted that output
        again), else -1."""
        key = call_key(use)
        self._pending[use.id] = key
        before = self._calls.get(key)
        return self._pos - before if before is not None else -1

    def _look(self, idents: list[str], reruns: list[int], message: int, session: Draft) -> None:
        """A look-back for each re-run and for each identifier the calls use that output after
        the prefix showed; for those, whether compaction had hidden the newest line naming it
        from the request the call was made from, and whether it hid every line. The identifier
        is then where the agent last met it: in its own call, whose result carries its line
        back if it was hidden (`compaction.restore`)."""
        for d in reruns:
            if d >= 0:
                self._add(d)
        view: InView | None = None
        for x in idents:
            at = self._where.get(x)
            if at is None:
                continue
            self._add(self._pos - at)
            self._where[x] = self._pos
            if x in self.pinned:
                continue  # the prefix shows it: in view on every request
            seen = [e for e in self.lines.get(x, ()) if e[0] < message]
            if not seen:
                continue
            if view is None:
                view = self.view_at(session, message)
            if view is None:
                continue
            newest = seen[-1]
            if newest[2] in view.given_back or view.shows(*newest):
                continue
            self.exposed += 1
            self.missed += not view.any(seen)

    def view_at(self, session: Draft, message: int) -> InView | None:
        """What the request that produced assistant ``message`` showed: the edits made before it
        (entries made while the transcript had at most ``message`` messages); None when none
        were. Advanced incrementally: the meter and `compaction.restore` only ever ask about
        messages in transcript order, so each entry is applied once."""
        entries = session.ledger.entries
        if self._applied > len(entries):  # another history under this meter: start over
            self._applied, self._effective, self._in_view = 0, [], None
        while self._applied < len(entries) and entries[self._applied].transcript_len <= message:
            entry = entries[self._applied]
            self._effective = [x for x in self._effective if not entry.contains(x)] + [entry]
            self._applied += 1
            self._in_view = None
        if not self._effective:
            return None
        if self._in_view is None:
            self._in_view = InView(sorted(self._effective, key=lambda e: e.start))
        return self._in_view

    def _add(self, distance: int) -> None:
        self.lookbacks.append((distance, self._pos))
        self._distance.append(distance)
        insort(self._by_distance, distance)
        self._span.append(self._pos)

    def _index(self, message: int, tool_use_id: str, text: str, start: int) -> None:
        for raw in text.split("\n"):
            line = raw.strip()
            if not line:
                continue
            for x in identifiers(line):
                self._where[x] = start
                if len(line) <= MAX_LINE:
                    q = self.lines.get(x)
                    if q is None:
                        q = self.lines[x] = deque(maxlen=LINES_PER_IDENTIFIER)
                    if not q or q[-1][2] != line:
                        q.append((message, tool_use_id, line))

    def coverage_for(self, coverage: float, miss_rate: float) -> float:
        """The share of look-backs to cover, from what this session's own look-backs found: where
        more than ``miss_rate`` of the agent's turns made a look-back that found none of its lines
        in view (`missed`), the share left uncovered shrinks in proportion, so the budget grows
        until the misses fall back to that rate. Never less than ``coverage``, and never more
        than the look-backs seen so far can certify (``1 - MIN_EXPECTED / look-backs``: five
        expected past the budget, as `budget` asks)."""
        n = len(self.lookbacks)
        if miss_rate <= 0 or not n or not self.missed:
            return coverage
        realized = self.missed / max(1, self.turns)
        allowed = (1.0 - coverage) * min(1.0, miss_rate / realized)
        return max(coverage, min(1.0 - MIN_EXPECTED / n, 1.0 - allowed))

    def beyond(self, budget: int) -> tuple[int, int]:
        """Look-backs that reached farther than ``budget``, and those that could have: made with
        more than ``budget`` tokens of history behind them (a look-back never reaches farther
        than the history behind it, so the first are among the second)."""
        return (len(self._by_distance) - bisect_right(self._by_distance, budget),
                len(self._span) - bisect_right(self._span, budget))

    def provisional(self, coverage: float, configured: int, cap: int) -> int | None:
        """Before `budget` can certify one: a budget above ``configured`` when this agent's own
        look-backs already show it is too small. The ``coverage`` quantile of the distances seen
        so far (so one outlier among many short look-backs moves nothing), with a tenth more room,
        up to ``cap``; None when that is within ``configured``. Growing the budget on
        what the agent did needs no long run of samples; shrinking it below the configured one
        still waits for `budget` (issue 47: at a 120k window an agent lost every fact nine reads
        back until 72 look-backs had been seen)."""
        if coverage <= 0 or not self._by_distance:
            return None
        n = len(self._by_distance)
        want = int(self._by_distance[min(n - 1, math.ceil(coverage * n) - 1)] * 1.1)
        if want <= configured:
            return None
        return min(cap, want)

    def reach(self, coverage: float) -> int:
        """How far back this agent has shown it looks: the ``coverage`` quantile of the distances
        seen so far, with a tenth more room (raw tokens); 0 before any look-back (or with the
        meter off). What a cut made only to stop thrashing must still keep: below it, the agent
        has already shown it would lose what it comes back to."""
        if coverage <= 0 or not self._by_distance:
            return 0
        n = len(self._by_distance)
        return int(self._by_distance[min(n - 1, math.ceil(coverage * n) - 1)] * 1.1)

    def budget(self, coverage: float, cap: int) -> int | None:
        """The smallest budget of the ladder (up to ``cap``) past which at most ``1 - coverage`` of
        the look-backs that could reach it did, at the upper end of the Wilson interval, judged
        on at least 5 / (1 - coverage) of them (so that five would be expected past it: fewer say
        nothing about a tail); None when no budget qualifies yet (or ``coverage`` is 0: the
        meter is off)."""
        if coverage <= 0 or cap <= 0:
            return None
        allowed = 1.0 - coverage
        if allowed <= 0:
            return None
        enough = math.ceil(MIN_EXPECTED / allowed - 1e-9)  # 5 / 0.1 is 50, not 50.000000000000001
        k = float(LADDER_FLOOR)
        while k <= cap:
            far, at_risk = self.beyond(int(k))
            if at_risk >= enough and wilson_upper(far / at_risk, at_risk) <= allowed:
                return int(k)
            k *= LADDER_RATIO
        return None
