"""Summaries on the caller's credentials: which headers carry them, and the summarizer that
reads them while `state.ProxyState.holding` holds them for the request being compacted. Its
summaries go upstream on the caller's key, never on the operator's, and nothing is stored."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from ...base.headers import INTERNAL_HEADER

if TYPE_CHECKING:
    from ...compaction.summarize.llm import SummaryRequest, SummaryResult

__all__ = ["CREDENTIALS", "UpstreamSummarizer"]

log = logging.getLogger("cachecompact")

CREDENTIALS = ("x-api-key", "authorization")


class UpstreamSummarizer:
    """Summaries through the upstream with the credentials of the request being compacted
    (held for the duration of that request only, in a thread-local)."""

    def __init__(self, upstream: str, model: str, mode: str, creds: threading.local) -> None:
        self.upstream, self.model, self.mode, self.creds = upstream, model, mode, creds

    def summarize(self, req: SummaryRequest) -> SummaryResult:
        import anthropic

        from ...compaction.summarize.llm import ExtractiveSummarizer, LLMSummarizer

        h: dict[str, str] = getattr(self.creds, "headers", {})
        key = h.get("x-api-key")
        bearer = h.get("authorization", "")
        token = bearer[7:] if bearer.lower().startswith("bearer ") else None
        if not key and not token:
            # no credential of the caller's: an SDK client would fall back to the operator's own
            # (environment, profile), so a stranger's request could spend the operator's money
            log.info("cachecompact proxy: a request without credentials; its summary is extractive")
            return ExtractiveSummarizer().summarize(req)
        # the caller's own credential, in the form it came (the SDK takes one or the other;
        # an explicit one means it reads no environment credential)
        client = (anthropic.Anthropic(base_url=self.upstream, api_key=key, max_retries=2) if key or not token
                  else anthropic.Anthropic(base_url=self.upstream, auth_token=token, api_key=None, max_retries=2))
        extra = {INTERNAL_HEADER: "1", **({"anthropic-beta": h["anthropic-beta"]} if "anthropic-beta" in h else {})}
        return LLMSummarizer(client, model=self.model, mode=self.mode, extra_headers=extra).summarize(req)
