"""``anthropic-ondemand``: let the API write the summary, as the preserved-thinking docs advise.

Anthropic's on-demand compaction (the top-level ``compaction`` parameter, beta
``compact-2026-09-04``; build-with-claude/compaction-on-demand, anthropic-cache-facts.md §3.5)
summarizes the messages of a request into one signed ``compaction`` block, and "the check
accepts the swap when the API wrote the summary, so the thinking in kept turns can stay valid".
It is what the docs tell code that trims or summarizes earlier turns to do, so the bench runs it
beside cachecompact to answer the question a user now asks: why not just follow the docs?

What this peer does: the two recipes the docs give, on the conversation's own model.

* **When: a trigger derived from prices and the session's figures.** A compaction cycle pays
  once for the swap (the next request writes the block and the kept turns again, at w - r more
  than reading them, and the compaction request reads the context and writes the summary) and
  every turn reads the context. Over a cycle from B tokens (after the swap) to T, growing g a
  turn, the cost per turn is about r (B + T) / 2 + g C / (T - B), least at
  T = B + sqrt(2 g C / r), with C = B (w - r) + T r + S o (S the summary's tokens, o the output
  price). B, g and S come from the session itself (B: system, tools, the block and the turns
  the cut keeps, at four bytes a token; g: the median growth of its turns by usage; S: the last
  block's size, 2,000 tokens before the first), the prices from the model's.
  T is held below the window's usable limit less the largest turn seen (the request that starts
  a compaction in the background still goes whole). (The old ``trigger_fraction`` of the
  window, 0.75, stays as the ``-scaled`` extra.)
* **What: the recipe "Compaction that keeps recent turns".** The client picks the cut: everything
  but the newest ``keep_tokens`` (50k, cachecompact's configured recent budget, at most a quarter
  of the window, so a small one still leaves room to grow between compactions) and at least the
  newest ``keep_rounds`` (2) rounds, cut where a round starts (an assistant turn after a user
  message), so the kept turns follow the summarized messages directly with a change of role, and
  the compaction request never ends in an unanswered tool call. The kept turns go verbatim,
  thinking included. A later compaction summarizes the old block and what follows it.
* **How: the recipe "Compaction in the background".** The compaction request is sent with the
  history as it stands, remembering how many messages it covers; the conversation goes on with
  the full history; no second compaction starts until this one is swapped in or has failed; the
  block replaces exactly those messages on the first request after it arrives. (In a replay the
  call returns before the agent's next request, as it would in the background: the request that
  started it goes uncompacted, the next one carries the block.)
* **Cache.** Every request carries the top-level ``cache_control`` of automatic caching, as
  ``none`` does, so the difference between the two is the compaction alone.
* **Then.** Every request sends the block first, as an assistant message of its own, followed by
  the caller's messages after the cut, unchanged, under the beta header. The compaction call is
  the session's (its summarizer's client, marked as cachecompact's own), on the request's model,
  billed as a summary.

It keeps no ledger: its record is the block and the index of the first kept message.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import anthropic

from ...base.errors import SummaryRejected
from ...base.pricing import priced
from ...base.values import SummaryMode
from ...base.wire import canonical_bytes
from ..strategy import Plan, Strategy, StrategyContext
from ..summarize.api_compaction import call_ondemand, compaction_max_tokens
from .body import AUTO_CACHE

__all__ = ["BETA", "OnDemandConfig", "OnDemandStrategy"]

BETA = "compact-2026-09-04"
log = logging.getLogger("cachecompact")


class OnDemandStrategy:
    """Summarizes through the API when the request is large; sends the signed block after that."""

    def __init__(self, ctx: StrategyContext, cfg: OnDemandConfig) -> None:
        self.ctx, self.cfg = ctx, cfg
        self.block: dict[str, Any] | None = None
        self.covered = 0  # caller messages the block stands for
        self.ready: tuple[dict[str, Any], int] | None = None  # a block that arrived, swapped in next request
        self.summary_cost = 0.0
        self.summary_tokens = 2_000  # the last block's size (an estimate before the first)
        self.reported = 0  # the prompt's size in the last response's usage
        self.reported_bytes = 0  # the size of the messages that request sent, to add what came since
        self.sizes: list[int] = []  # each response's prompt size, for the session's growth a turn
        self.last_trigger = 0  # the trigger in force at the last request (for the report)

    def before_request(self, now: float, model: str, max_tokens: int = 0,
                       params: dict[str, Any] | None = None) -> Plan:
        # a block in hand, or one that arrived and `shape` swaps in now, opens the messages: its
        # type needs the beta (without it, "`compaction` is not one of the expected content block types")
        return Plan(0, 0, betas=(BETA,) if self.block is not None or self.ready is not None else ())

    def after_response(self, now: float, usage: dict[str, Any] | None = None) -> None:
        if usage:
            self.reported = sum(int(usage.get(k) or 0) for k in
                                ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"))
            self.sizes.append(self.reported)

    def reactive(self, reported_tokens: int, limit: int, now: float, model: str, max_tokens: int = 0) -> bool:
        return False

    def _messages(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if self.block is None:
            return messages
        return [{"role": "assistant", "content": [self.block]}, *messages[self.covered:]]

    def _cut(self, messages: list[dict[str, Any]]) -> int | None:
        """The index of the first caller message to keep: the start of a round (an assistant
        message after a user one), after what the block already covers, keeping at least the
        newest ``keep_rounds`` rounds and at least ``keep_tokens`` of the newest history (at four
        bytes a token), so what the agent just read survives the summary."""
        starts = [i for i in range(max(1, self.covered + 1), len(messages))
                  if messages[i].get("role") == "assistant" and messages[i - 1].get("role") == "user"]
        if len(starts) <= self.cfg.keep_rounds:
            return None
        cands = starts[:len(starts) - self.cfg.keep_rounds + 1]
        allowed = set(cands)
        keep = min(self.cfg.keep_tokens, self.ctx.window_tokens // 4)  # a small window must leave room to grow
        kept = 0
        for k in range(len(messages) - 1, cands[0] - 1, -1):
            kept += len(canonical_bytes(messages[k])) // 4
            if kept >= keep and k in allowed:
                return k
        return None  # nothing older than what it keeps: no compaction yet

    def trigger(self, model: str, kept_tokens: int, max_tokens: int) -> int:
        """Where a compaction cycle costs least (the module docstring derives it), or the
        ``-scaled`` extra's share of the window."""
        window = self.ctx.window_tokens
        limit = max(window // 4, window - max(0, max_tokens) - window // 20)
        growth = sorted(b - a for a, b in zip(self.sizes, self.sizes[1:], strict=False) if b > a)
        g = max(1, growth[len(growth) // 2] if growth else limit // 100)
        if self.cfg.trigger_fraction is not None:
            return int(self.cfg.trigger_fraction * window)
        price = priced(model, self.ctx.prices)  # an unknown name is priced as the default model, never an error
        r, w, o = price.read, price.write_5m, price.output
        after = self.summary_tokens + kept_tokens
        t = after + g
        for _ in range(3):  # C depends on T through the compaction request's read: a few rounds settle it
            cycle = after * (w - r) + t * r + self.summary_tokens * o
            t = after + int(math.sqrt(2 * g * cycle / max(r, 1e-9)))
        # the request that starts it goes whole (the background recipe): it must fit after the largest turn seen
        room = max(growth) if growth else g
        return max(after + g, min(limit - room, t))

    def shape(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body["messages"]
        if self.ready is not None:  # arrived since the last request: swapped in now (the background recipe)
            (self.block, self.covered), self.ready = self.ready, None
            self.reported, self.reported_bytes = 0, 0  # the next response counts afresh
        out = {**body, "messages": self._messages(messages)}
        size = len(canonical_bytes(out["messages"]))
        # The last response's count plus the new messages at 4 bytes a token: what a client knows
        # without a count_tokens call (the estimate is for the growth alone, a turn or two).
        tokens = self.reported + max(0, size - self.reported_bytes) // 4 if self.reported else size // 4
        self.reported_bytes = size
        cut = self._cut(messages) if messages[-1].get("role") == "user" else None
        if cut is not None:  # what a swap leaves: system and tools, the block, the kept turns (at 4 bytes a token)
            kept = len(canonical_bytes([body.get("system"), body.get("tools"), messages[cut:]])) // 4
            self.last_trigger = self.trigger(str(body.get("model")), kept, int(body.get("max_tokens") or 0))
            client = getattr(self.ctx.summarizer, "client", None)
            if tokens >= self.last_trigger and client is not None:
                self._compact(client, body, messages, cut)
        return {**out, "cache_control": AUTO_CACHE}  # automatic caching, as ``none`` does

    def _compact(self, client: Any, body: dict[str, Any], messages: list[dict[str, Any]], cut: int) -> None:
        """Ask the API, on the request's own model, for a block standing for the caller's messages
        before ``cut`` (the old block and what follows it, once there is one); it is swapped in on
        the next request."""
        head = self._messages(messages[:cut])
        kw: dict[str, Any] = {k: body[k] for k in ("system", "tools", "thinking") if k in body}
        caller = int(body.get("max_tokens") or 0)
        size = len(canonical_bytes([body.get("system"), body.get("tools"), head])) // 4  # 4 bytes a token
        req = {"model": body["model"], "messages": head, **kw,
               "max_tokens": compaction_max_tokens(caller, self.ctx.window_tokens, size, body.get("thinking"))}
        try:  # streamed, so the caller's max_tokens (Claude Code's 128,000) is never refused by the SDK
            r = call_ondemand(client, req)
        except (anthropic.APIError, SummaryRejected) as err:  # failed: the conversation goes on whole, may try again
            log.warning("anthropic-ondemand: the compaction request failed (%s); the conversation goes on "
                        "uncompacted", str(err)[:300])
            return
        self.ready = ({"type": "compaction", "content": r.content, "signature": r.signature}, cut)
        steps = [it for it in r.usage.get("iterations") or [] if isinstance(it, dict)]
        self.summary_tokens = sum(int(it.get("output_tokens") or 0) for it in steps) or self.summary_tokens


@dataclass(frozen=True)
class OnDemandConfig:
    """On-demand compaction by the API; see the module docstring."""

    name: ClassVar[str] = "anthropic-ondemand"
    trigger_fraction: float | None = None  # None: the derived trigger; 0.75: the ``-scaled`` extra
    keep_rounds: int = 2
    # the recent history kept verbatim, in tokens: cachecompact's own configured recent budget
    # (LevelSettings.keep_recent_tokens), so the two keep alike and differ in who writes the summary
    keep_tokens: int = 50_000
    prefix_messages: int = 3
    summary_model: str | None = None
    summary_mode: SummaryMode = "forced-tool"

    def build(self, ctx: StrategyContext) -> Strategy:
        return OnDemandStrategy(ctx, self)
