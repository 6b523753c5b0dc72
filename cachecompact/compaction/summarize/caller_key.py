"""Summaries on the caller's own credentials: an LLM summarizer built per summary from the
credential headers of the request being compacted, which the adapter that holds that request
(the compact proxy) puts in a thread-local for its duration. The summary goes upstream on the
caller's key, never on the operator's, and nothing is stored.

It lives on the compaction floor, beside the summarizers it chooses between, so a compacting
request calls only down the floors: the adapter hands the credentials down as data instead of
being called back (issue 39)."""

from __future__ import annotations

import atexit
import logging
import threading
from collections.abc import Callable

import anthropic

from ...base.headers import INTERNAL_HEADER
from ...base.values import SummaryMode
from .api_compaction import OnDemandCall
from .llm import ExtractiveSummarizer, LLMSummarizer, SummaryRequest, SummaryResult

__all__ = ["CallerKeySummarizer"]

log = logging.getLogger("cachecompact")

_HTTP: anthropic.DefaultHttpxClient | None = None
_HTTP_LOCK = threading.Lock()


def _http() -> anthropic.DefaultHttpxClient:
    """The HTTP client every caller-key summary's SDK client uses: the SDK's own defaults
    (`anthropic.DefaultHttpxClient`: its timeout, connection limits and redirects), made once."""
    global _HTTP
    with _HTTP_LOCK:
        if _HTTP is None or _HTTP.is_closed:
            _HTTP = anthropic.DefaultHttpxClient()
            atexit.register(_HTTP.close)  # its kept-alive connections closed, not left to the interpreter's exit
        return _HTTP


class CallerKeySummarizer:
    """Summaries through ``upstream`` with the credentials in ``creds.headers`` (a thread-local
    the adapter fills for the request being compacted only); extractive when the request
    carried none."""

    def __init__(self, upstream: str, model: str, mode: SummaryMode, creds: threading.local, *,
                 clock: Callable[[], float] | None = None) -> None:
        self.upstream, self.model, self.mode, self.creds = upstream, model, mode, creds
        self.clock = clock  # a proxy on simulated time: its summaries carry it (`LLMSummarizer.clock`)

    def _client(self, key: str | None, token: str | None) -> anthropic.Anthropic:
        """An SDK client on the caller's credential, in the form it came (the SDK takes one or the
        other; an explicit one means it reads no environment credential), made per summary so
        the credential lives no longer than the summary. Its connections are the process's one
        pool (`_http`): an SDK client of its own loads the CA store again (about 20 ms of CPU
        per summary, measured), and a connection carries no credential."""
        if key or not token:
            return anthropic.Anthropic(base_url=self.upstream, api_key=key, max_retries=2, http_client=_http())
        return anthropic.Anthropic(base_url=self.upstream, auth_token=token, api_key=None, max_retries=2,
                                   http_client=_http())

    def estimate_usd(self, req: SummaryRequest) -> float:
        """What the summary would cost on a caller's key (`LLMSummarizer.estimate_usd`); what an
        extractive one costs, nothing, when no credential is in place."""
        if not getattr(self.creds, "headers", {}):
            return 0.0
        return LLMSummarizer(None, model=self.model, mode=self.mode).estimate_usd(req)

    def ondemand(self) -> OnDemandCall | None:
        """An API-written summary on the caller's own key, bound now (the key is in this
        thread's ``creds``; the call may run in another); None without a credential."""
        h: dict[str, str] = dict(getattr(self.creds, "headers", {}))
        key = h.get("x-api-key")
        bearer = h.get("authorization", "")
        token = bearer[7:] if bearer.lower().startswith("bearer ") else None
        if not key and not token:
            return None
        client = self._client(key, token)
        extra = {"anthropic-beta": h["anthropic-beta"]} if "anthropic-beta" in h else {}
        return LLMSummarizer(client, model=self.model, mode=self.mode, extra_headers=extra,
                             clock=self.clock).ondemand()

    def bind(self) -> Callable[[SummaryRequest], SummaryResult] | None:
        """The summary call on the caller's own key, bound now (the key is in this thread's
        ``creds``; the call may run in another); None without a credential (the summary is
        then extractive: nothing to wait for)."""
        h: dict[str, str] = dict(getattr(self.creds, "headers", {}))
        if not h.get("x-api-key") and not h.get("authorization", "").lower().startswith("bearer "):
            return None
        return lambda req: self._summarize(h, req)

    def summarize(self, req: SummaryRequest) -> SummaryResult:
        return self._summarize(getattr(self.creds, "headers", {}), req)

    def _summarize(self, h: dict[str, str], req: SummaryRequest) -> SummaryResult:
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
        client = self._client(key, token)
        extra = {INTERNAL_HEADER: "1", **({"anthropic-beta": h["anthropic-beta"]} if "anthropic-beta" in h else {})}
        return LLMSummarizer(client, model=self.model, mode=self.mode, extra_headers=extra,
                             clock=self.clock).summarize(req)
