"""``GET /metrics``: the proxy's totals in the Prometheus text format (version 0.0.4), so a
Prometheus server, or any agent that scrapes it, charts requests, tokens, spend and cache misses
beside the rest of a fleet. The counters only rise (`observe.Totals`); the gauges are what the
proxy holds now. Served under the same auth rule as ``/api``."""

from __future__ import annotations

from collections.abc import Iterable

from ._observe import Totals

__all__ = ["CONTENT_TYPE", "render"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _label(value: str) -> str:
    """A label value, escaped as the text format requires (backslash, quote, newline)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _family(name: str, kind: str, help_text: str, samples: Iterable[tuple[str, float]]) -> list[str]:
    out = [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
    out += [f"{name}{labels} {value!r}" if isinstance(value, float) else f"{name}{labels} {value}"
            for labels, value in samples]
    return out


def render(totals: Totals, *, mode: str, sessions: int, unanalysed: int, pending: int) -> str:
    """The exposition of one proxy: ``totals`` (taken under the observer's lock by the caller),
    the sessions it holds, the requests forwarded without analysis, and those awaiting it."""
    m = f'mode="{_label(mode)}"'
    lines: list[str] = []
    lines += _family("cachecompact_requests_total", "counter", "Messages API requests recorded.",
                     [(f"{{{m}}}", totals.requests)])
    lines += _family("cachecompact_request_errors_total", "counter", "Requests answered with a status other than 200.",
                     [(f"{{{m}}}", totals.errors)])
    lines += _family("cachecompact_requests_refused_total", "counter",
                     "Of the errors, the requests the proxy answered itself (compact mode: the context is full).",
                     [(f"{{{m}}}", totals.refused)])
    lines += _family("cachecompact_tokens_total", "counter", "Tokens by kind, as the API reported them.",
                     [(f'{{{m},kind="{_label(k)}"}}', v) for k, v in sorted(totals.tokens.items())])
    lines += _family("cachecompact_cost_usd_total", "counter",
                     "What was billed, in US dollars: the recorded requests and cachecompact's own summary calls.",
                     [(f"{{{m}}}", float(round(totals.cost_usd, 8)))])
    lines += _family("cachecompact_summary_cost_usd_total", "counter",
                     "Of the cost, cachecompact's own summary calls (compact mode), in US dollars.",
                     [(f"{{{m}}}", float(round(totals.summary_usd, 8)))])
    lines += _family("cachecompact_cache_wasted_usd_total", "counter",
                     "What cache misses cost beyond a warm cache, in US dollars (forensics).",
                     [(f"{{{m}}}", float(round(totals.wasted_usd, 8)))])
    lines += _family("cachecompact_compaction_rewrites_total", "counter",
                     "Requests that re-wrote the cache after cachecompact's own compaction (not misses).",
                     [(f"{{{m}}}", totals.rewrites)])
    lines += _family("cachecompact_compaction_rewrite_usd_total", "counter",
                     "What compaction's deliberate cache re-writes cost over reading, in US dollars.",
                     [(f"{{{m}}}", float(round(totals.rewrite_usd, 8)))])
    misses = [(f'{{{m},class="{_label(c)}"}}', n) for c, n in sorted(totals.misses.items())]
    lines += _family("cachecompact_cache_misses_total", "counter",
                     "Requests that read less cache than they could, by forensics class.", misses)
    lines += _family("cachecompact_sessions", "gauge", "Sessions the proxy holds in memory.", [(f"{{{m}}}", sessions)])
    lines += _family("cachecompact_unanalysed_requests_total", "counter",
                     "Requests forwarded without analysis because analysis was behind.", [(f"{{{m}}}", unanalysed)])
    lines += _family("cachecompact_analysis_pending", "gauge", "Responses waiting for their analysis.",
                     [(f"{{{m}}}", pending)])
    return "\n".join(lines) + "\n"
