"""The hindsight oracle: the cheapest masking schedule that never hides a needed result.

Knowing the whole trace, a tool result r is *needed* up to the last request whose reply
calls a tool with an identifier found in r; after that it may be masked (replaced by a
placeholder). The oracle chooses the turns at which to compact; at a compaction turn it
masks every result that is no longer needed (and bigger than a placeholder). That family is
parameterised by the last compaction turn j alone, because the masked set M(j) only grows
with j, so dynamic programming over (turn, last compaction) is exact for it:

    dp[k][j] = dp[k-1][j] + stay(k, j)                       (no compaction at request k)
    dp[k][k] = min_j dp[k-1][j] + compact(k, j -> k)         (compaction at request k)

on the same cost model the emulator bills: with a warm cache (gap <= TTL) a request reads
the previous request's tokens up to the first byte that changed and writes the rest; a cold
one writes everything; output is billed the same for every schedule. A request must fit the
window (tokens + max_tokens). This is the optimum *of that family* under an idealised cache
(every previous end is found): a strategy that summarises can beat it, and one that masks
differently cannot do better on masking alone, except through the cache idealisation.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Any

from ..cache_sim import TTL_SECONDS, message_blocks, request_from_body
from ..identifiers import identifiers, identifiers_in_input
from ..levels.view import PLACEHOLDER_TOKENS
from ..pricing import ModelInfo
from ..tokens import TokenCounter
from ..traces import Trace

__all__ = ["OracleResult", "oracle_cost", "schedule_cost"]


@dataclass(frozen=True, slots=True)
class OracleResult:
    cost_usd: float
    compactions: int
    masked_results: int
    feasible: bool


def _reply_output_tokens(counter: TokenCounter, m: dict[str, Any]) -> int:
    import json

    c = m.get("content")
    blocks = c if isinstance(c, list) else [{"type": "text", "text": c}]
    blocks = [b for b in blocks if b.get("type") not in ("thinking", "redacted_thinking")] or blocks
    return sum(counter.count_text(json.dumps(b.get("input")) if b.get("type") == "tool_use"
                                  else str(b.get("text", ""))) for b in blocks)


class _Model:
    """Precomputed token sums and prices for one trace; the DP and `schedule_cost` share it."""

    def __init__(self, trace: Trace, price: ModelInfo, window: int, max_tokens: int, counter: TokenCounter) -> None:
        msgs = trace.messages
        self.calls = calls = [i for i in range(1, len(msgs)) if msgs[i]["role"] == "assistant"]
        self.head = sum(b.tokens for b in request_from_body({"model": "x", "max_tokens": 1, "system": trace.system,
                                                             "tools": trace.tools, "messages": []}, 0.0,
                                                            counter).blocks)
        self.cum = [0]
        for i, m in enumerate(msgs):
            self.cum.append(self.cum[-1] + sum(b.tokens for b in message_blocks(m, i, counter)[0]))
        needs = [identifiers_in_input([b.get("input", {}) for b in msgs[i]["content"] if isinstance(b, dict)
                                       and b.get("type") == "tool_use"]) if isinstance(msgs[i]["content"], list)
                 else [] for i in calls]
        # (message index, tokens saved when masked, first request at which it may be masked)
        self.results: list[tuple[int, int, int]] = []
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
                self.results.append((mi, saving, max(present, last_need + 1)))
        self.K = K = len(calls)
        self.by_j: list[tuple[list[int], list[int]]] = []
        for j in range(K):
            masked = sorted((mi, sv) for mi, sv, jr in self.results if jr <= j)
            idx, sums = [mi for mi, _ in masked], [0]
            for _, sv in masked:
                sums.append(sums[-1] + sv)
            self.by_j.append((idx, sums))
        self.first_new = [10**9] * (K + 1)  # min message index of the results maskable from request j on
        for mi, _, jr in self.results:
            if jr < K:
                self.first_new[jr] = min(self.first_new[jr], mi)
        times = [trace.timestamps[i - 1] or float(i) for i in calls]
        self.warm = [False] + [times[k] - times[k - 1] <= TTL_SECONDS["5m"] for k in range(1, K)]
        self.out = [_reply_output_tokens(counter, msgs[i]) * price.output / 1e6 for i in calls]
        self.r, self.w = price.read / 1e6, price.write_5m / 1e6
        self.window, self.max_tokens = window, max_tokens

    def saved(self, j: int, x: int) -> int:
        """Tokens saved by the masks of state j before message index x."""
        idx, sums = self.by_j[j]
        return sums[bisect.bisect_left(idx, x)]

    def tokens(self, k: int, j: int) -> int:
        return self.head + self.cum[self.calls[k]] - self.saved(j, self.calls[k])

    def fits(self, k: int, j: int) -> bool:
        return self.tokens(k, j) + self.max_tokens <= self.window

    def stay(self, k: int, j: int) -> float:
        tk = self.tokens(k, j)
        if k == 0 or not self.warm[k]:
            return tk * self.w + self.out[k]
        before = self.tokens(k - 1, j)
        return before * self.r + (tk - before) * self.w + self.out[k]

    def compact(self, k: int, j: int, p: int) -> float:
        """Request k right after masking M(k) \\ M(j), whose earliest message is p."""
        tk = self.tokens(k, k)
        if not self.warm[k]:
            return tk * self.w + self.out[k]
        kept = self.head + self.cum[p] - self.saved(j, p)
        return kept * self.r + (tk - kept) * self.w + self.out[k]


def schedule_cost(trace: Trace, price: ModelInfo, window: int, max_tokens: int, compact_at: list[int],
                  counter: TokenCounter | None = None) -> float:
    """Cost of one schedule of the oracle's family (compactions at these request indices)."""
    m = _Model(trace, price, window, max_tokens, counter or TokenCounter())
    j, cost = 0, 0.0
    at = set(compact_at)
    for k in range(m.K):
        if k in at and k > 0:
            p = min(m.first_new[j + 1: k + 1], default=10**9)
            if p < 10**9:
                if not m.fits(k, k):
                    return math.inf
                cost += m.compact(k, j, p)
                j = k
                continue
        if not m.fits(k, j):
            return math.inf
        cost += m.stay(k, j)
    return cost


def oracle_cost(trace: Trace, price: ModelInfo, window: int, max_tokens: int,
                counter: TokenCounter | None = None) -> OracleResult:
    m = _Model(trace, price, window, max_tokens, counter or TokenCounter())
    K = m.K
    if K == 0:
        return OracleResult(0.0, 0, 0, True)
    inf = math.inf
    prev = [inf] * K
    prev[0] = m.stay(0, 0) if m.fits(0, 0) else inf
    came: list[list[int]] = [[-1] * K for _ in range(K)]
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
        return OracleResult(inf, 0, 0, False)
    j = final = prev.index(best)
    compactions = 0
    for k in range(K - 1, 0, -1):
        if j == k:
            compactions += 1
            j = came[k][k]
    return OracleResult(best, compactions, sum(1 for r in m.results if r[2] <= final), True)
