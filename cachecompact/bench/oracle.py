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

__all__ = ["OracleResult", "oracle_cost"]


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


def oracle_cost(trace: Trace, price: ModelInfo, window: int, max_tokens: int,
                counter: TokenCounter | None = None) -> OracleResult:
    counter = counter or TokenCounter()
    msgs = trace.messages
    calls = [i for i in range(1, len(msgs)) if msgs[i]["role"] == "assistant"]  # request k answers msgs[i_k]
    if not calls:
        return OracleResult(0.0, 0, 0, True)
    head = sum(b.tokens for b in request_from_body({"model": "x", "max_tokens": 1, "system": trace.system,
                                                    "tools": trace.tools, "messages": []}, 0.0, counter).blocks)
    msg_tok = [sum(b.tokens for b in message_blocks(m, i, counter)[0]) for i, m in enumerate(msgs)]
    cum = [0]
    for t in msg_tok:
        cum.append(cum[-1] + t)
    # tool results, their savings when masked, and the first request at which they may be masked
    needs = [identifiers_in_input([b.get("input", {}) for b in msgs[i]["content"] if isinstance(b, dict)
                                   and b.get("type") == "tool_use"]) if isinstance(msgs[i]["content"], list) else []
             for i in calls]
    results: list[tuple[int, int, int]] = []  # (message index, saving, earliest request it may be masked)
    for mi, m in enumerate(msgs):
        if m["role"] != "user" or not isinstance(m["content"], list):
            continue
        for bi, b in enumerate(m["content"]):
            if not isinstance(b, dict) or b.get("type") != "tool_result":
                continue
            c = b.get("content")
            text = c if isinstance(c, str) else " ".join(str(x.get("text", "")) for x in c or [] if isinstance(x, dict))
            blocks = message_blocks(m, mi, counter)[0]
            saving = blocks[bi].tokens - PLACEHOLDER_TOKENS if bi < len(blocks) else 0
            if saving <= 0:
                continue
            ids = set(identifiers(text))
            present = next((k for k, i in enumerate(calls) if i > mi), len(calls))
            last_need = max((k for k, used in enumerate(needs) if k >= present and ids.intersection(used)), default=-1)
            results.append((mi, saving, max(present, last_need + 1)))
    K = len(calls)
    # per state j: masked results sorted by message index, with prefix sums of savings
    by_j: list[tuple[list[int], list[int]]] = []
    for j in range(K):
        masked = sorted((mi, s) for mi, s, jr in results if jr <= j)
        idx, sums = [mi for mi, _ in masked], [0]
        for _, s in masked:
            sums.append(sums[-1] + s)
        by_j.append((idx, sums))
    first_new: list[int] = [10**9] * (K + 1)  # min message index of results that become maskable at j
    for mi, _, jr in results:
        if jr < K:
            first_new[jr] = min(first_new[jr], mi)

    def saved(j: int, x: int) -> int:  # savings of M(j) before message index x
        idx, sums = by_j[j]
        return sums[bisect.bisect_left(idx, x)]

    def tokens(k: int, j: int) -> int:
        return head + cum[calls[k]] - saved(j, calls[k])

    times = [trace.timestamps[i - 1] or float(i) for i in calls]
    out = [_reply_output_tokens(counter, msgs[i]) * price.output / 1e6 for i in calls]
    r, w = price.read / 1e6, price.write_5m / 1e6
    ttl = TTL_SECONDS["5m"]
    inf = math.inf
    prev = [inf] * K
    t0 = tokens(0, 0)
    prev[0] = t0 * w + out[0] if t0 + max_tokens <= window else inf
    best_from: list[list[int]] = [[-1] * K for _ in range(K)]
    for k in range(1, K):
        warm = times[k] - times[k - 1] <= ttl
        cur = [inf] * K
        for j in range(k):
            if prev[j] == inf:
                continue
            tk = tokens(k, j)
            if tk + max_tokens > window:
                continue
            before = tokens(k - 1, j)
            cur[j] = prev[j] + ((before * r + (tk - before) * w) if warm else tk * w) + out[k]
            best_from[k][j] = j
        tk = tokens(k, k)
        if tk + max_tokens <= window:
            p = 10**9
            for j in range(k - 1, -1, -1):  # M(k) \\ M(j) = results with j < j_r <= k
                p = min(p, first_new[j + 1])
                if prev[j] == inf or p >= 10**9:
                    continue
                kept = head + cum[p] - saved(j, p)  # the cached prefix that survives the new masks
                cost = prev[j] + ((kept * r + (tk - kept) * w) if warm else tk * w) + out[k]
                if cost < cur[k]:
                    cur[k] = cost
                    best_from[k][k] = j
        prev = cur
    best = min(prev)
    if best == inf:
        return OracleResult(inf, 0, 0, False)
    # walk back for the number of compactions and masked results
    j = prev.index(best)
    compactions = 0
    final_j = j
    for k in range(K - 1, 0, -1):
        if j == k:
            compactions += 1
            j = best_from[k][k]
    n_masked = sum(1 for r in results if r[2] <= final_j)
    return OracleResult(best, compactions, n_masked, True)
