"""``anthropic-ondemand``: let the API write the summary, as the preserved-thinking docs advise.

Anthropic's on-demand compaction (the top-level ``compaction`` parameter, beta
``compact-2026-09-04``; build-with-claude/compaction-on-demand, anthropic-cache-facts.md §3.5)
summarizes the messages of a request into one signed ``compaction`` block, and "the check
accepts the swap when the API wrote the summary, so the thinking in kept turns can stay valid".
It is what the docs tell code that trims or summarizes earlier turns to do, so the bench runs it
beside cachecompact to answer the question a user now asks: why not just follow the docs?

What this peer does, the way a careful client would:

* **When.** Once the request reaches (by the last response's usage plus the new messages at
  four bytes a token) ``trigger_fraction`` of the window (0.75, the share the
  documented default trigger of threshold compaction, 150k, is of 200k), and only on a request that
  ends with a user message (the API refuses to compact "if the last assistant turn ends in a tool
  call with no result yet"), it asks for a summary first.
* **What.** Everything but the newest ``keep_rounds`` rounds, cut where a round starts (an assistant
  turn after a user message), so that "the kept turns directly follow the summarized messages"
  with a role that differs from the last summarized one. A later compaction summarizes the old
  block and what follows it ("From then on, send only the newest block").
* **Cache.** Every request carries the top-level ``cache_control`` of automatic caching, as
  ``none`` does, so the difference between the two is the compaction alone.
* **Then.** Every request sends the block first, as an assistant message of its own, followed by
  the caller's messages after the cut, unchanged, under the beta header. The summary call is the
  session's (its summarizer's client, marked as cachecompact's own), billed as a summary.

It keeps no ledger: its record is the block and the index of the first kept message.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, ClassVar

import anthropic

from ...base.headers import INTERNAL_HEADER
from ...base.values import SummaryMode
from ...base.wire import canonical_bytes
from ..strategy import Plan, Strategy, StrategyContext
from .body import AUTO_CACHE

__all__ = ["BETA", "OnDemandConfig", "OnDemandStrategy"]

BETA = "compact-2026-09-04"
log = logging.getLogger("cachecompact")


class OnDemandStrategy:
    """Summarizes through the API when the request is large; sends the signed block after that."""

    betas: tuple[str, ...] = ()

    def __init__(self, ctx: StrategyContext, cfg: OnDemandConfig) -> None:
        self.ctx, self.cfg = ctx, cfg
        self.block: dict[str, Any] | None = None
        self.covered = 0  # caller messages the block stands for
        self.summary_cost = 0.0
        self.reported = 0  # the prompt's size in the last response's usage
        self.reported_bytes = 0  # the size of the messages that request sent, to add what came since

    def before_request(self, now: float, model: str, max_tokens: int = 0,
                       params: dict[str, Any] | None = None) -> Plan:
        return Plan(0, 0)

    def after_response(self, now: float, usage: dict[str, Any] | None = None) -> None:
        if usage:
            self.reported = sum(int(usage.get(k) or 0) for k in
                                ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"))

    def reactive(self, reported_tokens: int, limit: int, now: float, model: str, max_tokens: int = 0) -> bool:
        return False

    def _messages(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if self.block is None:
            return messages
        return [{"role": "assistant", "content": [self.block]}, *messages[self.covered:]]

    def _cut(self, messages: list[dict[str, Any]]) -> int | None:
        """The index of the first caller message to keep: the start of the round ``keep_rounds``
        back (an assistant message after a user one), after what the block already covers."""
        starts = [i for i in range(max(1, self.covered + 1), len(messages))
                  if messages[i].get("role") == "assistant" and messages[i - 1].get("role") == "user"]
        if len(starts) <= self.cfg.keep_rounds:
            return None
        return starts[-self.cfg.keep_rounds]

    def shape(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body["messages"]
        out = {**body, "messages": self._messages(messages)}
        size = len(canonical_bytes(out["messages"]))
        # The last response's count plus the new messages at 4 bytes a token: what a client knows
        # without a count_tokens call (the estimate is for the growth alone, a turn or two).
        tokens = self.reported + max(0, size - self.reported_bytes) // 4 if self.reported else size // 4
        self.reported_bytes = size
        if tokens >= self.cfg.trigger_fraction * self.ctx.window_tokens and messages[-1].get("role") == "user":
            cut = self._cut(messages)
            client = getattr(self.ctx.summarizer, "client", None)
            if cut is not None and client is not None:
                self._compact(client, body, messages, cut)
                out = {**body, "messages": self._messages(messages)}
                self.reported, self.reported_bytes = 0, 0  # the next response counts afresh
        if self.block is not None:
            self.betas = (BETA,)
        return {**out, "cache_control": AUTO_CACHE}  # automatic caching, as ``none`` does

    def _compact(self, client: Any, body: dict[str, Any], messages: list[dict[str, Any]], cut: int) -> None:
        """Ask the API for a block standing for the caller's messages before ``cut`` (the old block
        and what follows it, once there is one)."""
        head = self._messages(messages[:cut])
        kw = {k: body[k] for k in ("system", "tools", "thinking") if k in body}
        try:
            r = client.messages.create(model=body["model"], max_tokens=body.get("max_tokens") or 4096,
                                       messages=head, extra_body={"compaction": {"type": "summarize"}},
                                       extra_headers={"anthropic-beta": BETA, INTERNAL_HEADER: "1"}, **kw)
        except anthropic.APIError as err:  # no summary this time: the request goes as it is
            log.warning("anthropic-ondemand: the compaction request failed (%s); sending the request uncompacted",
                        str(err)[:300])
            return
        blocks = [b.model_dump(exclude_none=True) for b in r.content]
        found = next((b for b in blocks if b.get("type") == "compaction" and b.get("content")), None)
        if found is not None:
            self.block, self.covered = found, cut


@dataclass(frozen=True)
class OnDemandConfig:
    """On-demand compaction by the API; see the module docstring."""

    name: ClassVar[str] = "anthropic-ondemand"
    trigger_fraction: float = 0.75
    keep_rounds: int = 2
    prefix_messages: int = 3
    summary_model: str | None = None
    summary_mode: SummaryMode = "forced-tool"

    def build(self, ctx: StrategyContext) -> Strategy:
        return OnDemandStrategy(ctx, self)
