"""The masking oracle: the cheapest schedule of lossless masking found in hindsight, billed by the
emulator's own cache model.

Knowing the whole trace, a tool result r is *needed* up to the last request whose reply
calls a tool with an identifier found in r; after that it may be masked (its content replaced
by a placeholder). The oracle chooses the requests at which to compact; at a compaction it
masks every result that is no longer needed. That family is parameterised by the last
compaction request j alone (the masked set only grows with j), so a dynamic program over
(request, last compaction) finds its best schedule under an idealised cache (every earlier
write found, reads up to the first changed byte).

The chosen schedule is then **billed** the way the emulator bills: its requests are rendered
(masks as ledger edits, cachecompact's breakpoints) and run through `CacheSimulator` with the
trace's times, plus output tokens as the emulator counts them. Never compacting is in the
family; its billed cost is exactly ``none``'s, so the oracle reported is
``min(billed DP schedule, none)`` and is never above ``none``. It is a reference point for
*lossless masking*, not a floor for every strategy: summarising or shortening with previews
is outside the family and can beat it.
"""

from __future__ import annotations

import bisect
import json
import math
from dataclasses import dataclass
from typing import Any

from ...base.identifiers import identifiers, identifiers_in_input
from ...base.pricing import ModelInfo
from ...base.tokens import TokenCounter
from ...cache.simulator import TTL_SECONDS, CacheSimulator, message_blocks, request_from_body
from ...compaction.levels.view import PLACEHOLDER_TOKENS
from ...history.ledger import SkipRange
from ...history.session import Session
from ..traces import Trace

__all__ = ["OracleResult", "oracle_cost"]


@dataclass(frozen=True, slots=True)
class OracleResult:
    cost_usd: float  # billed cost of the DP's schedule (math.inf when infeasible)
    compactions: int
    masked_results: int
    feasible: bool


def _reply_output_tokens(counter: TokenCounter, m: dict[str, Any]) -> int:
    """Output tokens of a recorded reply, counted as the emulator counts the replay's answer."""
    c = m.get("content")
    blocks = c if isinstance(c, list) else [{"type": "text", "text": c}]
    blocks = [b for b in blocks if b.get("type") not in ("thinking", "redacted_thinking")] or blocks
    return sum(counter.count_text(json.dumps(b.get("input")) if b.get("type") == "tool_use"
                                  else str(b.get("text", ""))) for b in blocks)


class _Model:
    """Token sums per request and per masking state, for the dynamic program."""

    def __init__(self, trace: Trace, price: ModelInfo, window: int, max_tokens: int, counter: TokenCounter) -> None:
        msgs = trace.messages
        self.calls = calls = [i for i in range(1, len(msgs)) if msgs[i]["role"] == "assistant"]
        preamble = request_from_body({"model": "x", "max_tokens": 1, "system": trace.system, "tools": trace.tools,
                                      "messages": []}, 0.0, counter)
        self.preamble_tokens = sum(b.tokens for b in preamble.blocks)
        self.cum = [0]
        for i, m in enumerate(msgs):
            self.cum.append(self.cum[-1] + sum(b.tokens for b in message_blocks(m, i, counter)[0]))
        needs = [identifiers_in_input([b.get("input", {}) for b in msgs[i]["content"] if isinstance(b, dict)
                                       and b.get("type") == "tool_use"]) if isinstance(msgs[i]["content"], list)
                 else [] for i in calls]
        # (message index, tool_use_id, tokens saved when masked, first request at which it may be masked)
        self.results: list[tuple[int, str, int, int]] = []
        for mi, m in enumerate(msgs):
            if m["role"] != "user" or not isinstance(m["content"], list):
                continue
            blocks = message_blocks(m, mi, counter)[0]
            for bi, b in enumerate(m["content"]):
                if not isinstance(b, dict) or b.get("type") != "tool_result" or bi >= len(blocks):
                    continue
                saving = blocks[bi].tokens - PLACEHOLDER_TOKENS
                if saving <= 0:
                    continue
                c = b.get("content")
                text = c if isinstance(c, str) else " ".join(str(x.get("text", "")) for x in c or []
                                                             if isinstance(x, dict))
                ids = set(identifiers(text))
                present = next((k for k, i in enumerate(calls) if i > mi), len(calls))
                last_need = max((k for k, used in enumerate(needs) if k >= present and ids.intersection(used)),
                                default=-1)
                self.results.append((mi, str(b.get("tool_use_id")), saving, max(present, last_need + 1)))
        self.K = K = len(calls)
        self.by_j: list[tuple[list[int], list[int]]] = []
        for j in range(K):
            masked = sorted((mi, sv) for mi, _, sv, jr in self.results if jr <= j)
            idx, sums = [mi for mi, _ in masked], [0]
            for _, sv in masked:
                sums.append(sums[-1] + sv)
            self.by_j.append((idx, sums))
        self.first_new = [10**9] * (K + 1)  # min message index of the results maskable from request j on
        for mi, _, _, jr in self.results:
            if jr < K:
                self.first_new[jr] = min(self.first_new[jr], mi)
        times = [trace.timestamps[i - 1] or float(i) for i in calls]
        self.times = times
        self.warm = [False] + [times[k] - times[k - 1] <= TTL_SECONDS["5m"] for k in range(1, K)]
        self.out = [_reply_output_tokens(counter, msgs[i]) * price.output / 1e6 for i in calls]
        self.r, self.w = price.read / 1e6, price.write_5m / 1e6
        self.window, self.max_tokens = window, max_tokens

    def saved(self, j: int, x: int) -> int:
        idx, sums = self.by_j[j]
        return sums[bisect.bisect_left(idx, x)]

    def tokens(self, k: int, j: int) -> int:
        return self.preamble_tokens + self.cum[self.calls[k]] - self.saved(j, self.calls[k])

    def fits(self, k: int, j: int) -> bool:
        return self.tokens(k, j) + self.max_tokens <= self.window

    def stay(self, k: int, j: int) -> float:
        tk = self.tokens(k, j)
        if k == 0 or not self.warm[k]:
            return tk * self.w + self.out[k]
        before = self.tokens(k - 1, j)
        return before * self.r + (tk - before) * self.w + self.out[k]

    def compact(self, k: int, j: int, p: int) -> float:
        tk = self.tokens(k, k)
        if not self.warm[k]:
            return tk * self.w + self.out[k]
        kept = self.preamble_tokens + self.cum[p] - self.saved(j, p)
        return kept * self.r + (tk - kept) * self.w + self.out[k]


def _schedule(m: _Model) -> tuple[list[int], bool]:
    """The DP's best state per request (the last compaction at or before it), or infeasible."""
    K = m.K
    inf = math.inf
    prev = [inf] * K
    prev[0] = m.stay(0, 0) if m.fits(0, 0) else inf
    came: list[dict[int, int]] = [{} for _ in range(K)]
    for k in range(1, K):
        cur = [inf] * K
        for j in range(k):
            if prev[j] < inf and m.fits(k, j):
                cur[j] = prev[j] + m.stay(k, j)
        if m.fits(k, k):
            p = 10**9
            for j in range(k - 1, -1, -1):  # M(k) \\ M(j): results maskable from request j+1..k on
                p = min(p, m.first_new[j + 1])
                if prev[j] == inf or p >= 10**9:
                    continue
                cost = prev[j] + m.compact(k, j, p)
                if cost < cur[k]:
                    cur[k], came[k][k] = cost, j
        prev = cur
    best = min(prev)
    if best == inf:
        return [], False
    state = [0] * K
    j = prev.index(best)
    for k in range(K - 1, -1, -1):
        state[k] = j
        if j == k and k > 0:
            j = came[k][k]
    return state, True


def oracle_cost(trace: Trace, price: ModelInfo, window: int, max_tokens: int,
                counter: TokenCounter | None = None) -> OracleResult:
    """Bill the DP's masking schedule with the emulator's cache model (see the module docstring)."""
    counter = counter or TokenCounter()
    m = _Model(trace, price, window, max_tokens, counter)
    if m.K == 0:
        return OracleResult(0.0, 0, 0, True)
    state, feasible = _schedule(m)
    if not feasible:
        return OracleResult(math.inf, 0, 0, False)
    sess = Session.create(None, system=trace.system, tools=trace.tools, prefix_messages=0)
    sim = CacheSimulator(lambda _m: price.min_cacheable)
    memo: dict[tuple[bytes, int], Any] = {}
    masked: set[str] = set()
    total = 0.0
    compactions = 0
    for k, i in enumerate(m.calls):
        sess.append(trace.messages[len(sess):i])
        if k and state[k] == k:
            compactions += 1
            for mi, tid, _, jr in m.results:
                if jr <= k and tid not in masked and mi < i:
                    masked.add(tid)
                    sess.edit(SkipRange(mi, mi, "oracle mask", tool_use_id=tid), level="L1")
        r = sess.render(model=price.name, max_tokens=max_tokens)
        sess.note_sent(r)
        req = request_from_body(r.body, m.times[k], counter, memo)
        if sum(b.tokens for b in req.blocks) + max_tokens > window:
            return OracleResult(math.inf, compactions, len(masked), False)
        usage = sim.process(req).usage()
        total += price.cost({**usage, "output_tokens": 0}) + m.out[k]
    return OracleResult(total, compactions, len(masked), True)
