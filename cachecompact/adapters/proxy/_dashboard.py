"""The proxy's dashboard (``/ui``) and its JSON API (``/api/...``).

Every view has an address: ``/ui#/session/<id>`` and ``/ui#/session/<id>/request/<i>`` open a
session or a miss directly (a link to share, a bookmark, the back button).

The page is four static files shipped in the package (no CDN, no build step); it polls
``/api/version`` every second and re-reads what changed, so it follows requests as they arrive.
The session list has totals, sorting and a filter, with segments and sub-agents under their
conversation; a session has three charts with labelled axes and a value on hover (cumulative
cost; context size per request, compactions marked; idle time against the TTL) and what fills
the latest request's context. Everything it shows is inserted as text nodes,
never as HTML, and the responses carry a strict Content-Security-Policy, so hostile tool
output in an excerpt stays text.

API:

* ``GET /api/version`` — a counter that grows with every change (a recorded request, a summary's
  cost), and the requests recorded (``requests``, as ``/metrics`` counts them);
* ``GET /api/sessions`` — every conversation that had an answer or that the proxy refused: its
  sessions' titles (project folder and first prompt), requests, those not answered 200
  (``errors``) and of them the proxy's own refusals (``refused``), cost (the requests and
  cachecompact's own summary calls, ``summaries_usd``, as ``report`` and ``/metrics`` count them),
  hit rate, wasted dollars, misses, and the re-writes our own compactions caused (not misses); the
  sessions of conversations the upstream answered only with errors are counted in
  ``rejected_only``;
* ``GET /api/sessions/{id}`` — one session: its summary, its requests (usage split into
  read, written and uncached, cost, timing, the finding of each) and its compactions, and the
  window its context view is drawn against (``--window`` when given, else the model's);
* ``GET /api/sessions/{id}/requests/{i}`` — one request, with the finding's excerpts and, with
  ``--keep-bodies``, the stored body.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import TYPE_CHECKING, Any

from aiohttp import web

from ...base.pricing import billed_tokens, model_window
from ...cache.forensics import is_compaction_rewrite
from ...store.contract import blob_matches
from ..httpserver import api_error
from ._metrics import CONTENT_TYPE as METRICS_TYPE, render as render_metrics

if TYPE_CHECKING:
    from ._state import ProxyState

__all__ = ["add_routes"]

_CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
_SECURE = {"Content-Security-Policy": _CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
           "Cache-Control": "no-store", "X-Frame-Options": "DENY"}
_STATIC = {"index.html": "text/html", "app.js": "text/javascript", "app.css": "text/css",
           "favicon.svg": "image/svg+xml"}


def _json(data: Any) -> web.Response:
    return web.Response(body=json.dumps(data, ensure_ascii=True, default=str).encode(),
                        content_type="application/json", headers=_SECURE)


def conversations(summaries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per conversation, newest first: a session linked to another (a segment after a
    rewrite or a changed system prompt, another agent under the same name) is listed under
    ``segments`` of the conversation's first session, whose ``conversation`` sums them all."""
    by_id = {d["id"]: d for d in summaries}

    def root(d: dict[str, Any]) -> dict[str, Any]:
        seen = {d["id"]}
        while d.get("link") and d["link"].get("session") in by_id and d["link"]["session"] not in seen:
            d = by_id[d["link"]["session"]]
            seen.add(d["id"])
        return d

    top: list[dict[str, Any]] = []
    for d in summaries:
        r = root(d)
        if r is d:
            top.append(d)
        else:
            r.setdefault("segments", []).append(d)
    for d in top:
        parts = [d, *d.get("segments", [])]
        d["conversation"] = {"sessions": len(parts), "requests": sum(p["requests"] for p in parts),
                             "errors": sum(int(p.get("errors") or 0) for p in parts),
                             "refused": sum(int(p.get("refused") or 0) for p in parts),
                             "cost_usd": round(sum(p["cost_usd"] for p in parts), 6),
                             "summaries_usd": round(sum(float(p.get("summaries_usd") or 0.0) for p in parts), 6),
                             "wasted_usd": round(sum(p["wasted_usd"] for p in parts), 6),
                             "last_time": max(float(p["last_time"]) for p in parts)}
    top.sort(key=lambda d: -float(d["conversation"]["last_time"]))
    return top


def listing(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """``/api/sessions``: the conversations that had an answer, or that the proxy itself refused
    (compact mode: the context is full; issue 62: a conversation whose every request it refused
    was listed nowhere). A conversation none of whose requests was answered by the upstream
    (rejected, failed or cut off) is no row (issue 50: each stray request made an empty one); its
    sessions are counted in ``rejected_only``, and stay in the store and in ``/metrics``.
    Conversations are formed first, so an answered segment stays under its first session whatever
    that one got."""
    shown: list[dict[str, Any]] = []
    hidden: list[dict[str, Any]] = []  # the sessions of the conversations not shown
    for c in conversations(summaries):
        parts = [c, *c.get("segments", [])]
        if any(d["requests"] > d["errors"] or d.get("refused") for d in parts):
            shown.append(c)
        else:
            hidden += parts
    return {"sessions": shown,
            "rejected_only": {"sessions": len(hidden), "requests": sum(d["requests"] for d in hidden),
                              "ids": [d["id"] for d in hidden][:20]}}


def related(sid: str, summaries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The sessions of ``sid``'s conversation, its first one first (one entry, itself, when it
    stands alone): what the session page links to (issue 50: it did not link to its sub-agents)."""
    for c in conversations(summaries):
        parts = [c, *c.get("segments", [])]
        if any(p["id"] == sid for p in parts):
            return [{"id": p["id"], "reason": (p.get("link") or {}).get("reason"), "requests": p["requests"]}
                    for p in parts]
    return [{"id": sid, "reason": None, "requests": 0}]


def static_file(name: str) -> bytes:
    """One of the dashboard's files shipped in the package (``static/``)."""
    return resources.files(__package__ or "cachecompact.adapters.proxy").joinpath("static", name).read_bytes()


def add_routes(app: web.Application, state: ProxyState) -> None:
    files = {name: static_file(name) for name in _STATIC}

    async def page(request: web.Request) -> web.Response:
        name = request.match_info.get("name") or "index.html"
        if name not in files:
            return api_error(404, f"no such dashboard file: {name[:60]}")
        return web.Response(body=files[name], content_type=_STATIC[name], headers=_SECURE)

    async def version(_: web.Request) -> web.Response:
        return _json({"version": state.observer.version, "requests": state.observer.totals_now().requests,
                      "mode": state.cfg.mode, "upstream": state.cfg.upstream,
                      "unanalysed": state.dropped,
                      "keep_bodies": state.cfg.keep_bodies})

    async def sessions(_: web.Request) -> web.Response:
        return _json(listing([s.summary() for s in state.observer.sessions()]))

    async def session(request: web.Request) -> web.Response:
        s = state.observer.get(request.match_info["sid"])
        if s is None:
            return api_error(404, "no such session")
        with s.lock:
            recs = [_brief(r) for r in s.records]
            comps = list(s.compactions)
            summary = s.summary()
        # the context view's whole bar: the window compaction works to, the engine's own (--window, or
        # a policy's window_tokens in engine_options), else the model's own
        own = model_window(str(summary.get("model") or ""))
        planned = state.engine.window_tokens if state.engine is not None else None
        window = min(own, planned) if planned else own
        source = ("--window" if state.cfg.window_tokens else "the policy's window_tokens") if planned else \
            "the model's context window"
        return _json({"session": summary, "requests": recs, "compactions": comps, "window": window,
                      "window_source": source,
                      "conversation": related(summary["id"], [x.summary() for x in state.observer.sessions()])})

    async def one(request: web.Request) -> web.Response:
        s = state.observer.get(request.match_info["sid"])
        if s is None:
            return api_error(404, "no such session")
        try:
            i = int(request.match_info["i"])
        except ValueError:
            return api_error(400, "the request index must be an integer")
        with s.lock:
            rec = next((r for r in s.records if r.get("i") == i), None)
        if rec is None:
            return api_error(404, "no such request (or no longer in memory)")
        out = dict(rec)
        ref = rec.get("body_ref")
        if ref and state.store is not None:
            try:
                st = state.store.open(s.sid)
                blob = st.get_blob(ref)
                if blob is not None and not blob_matches(ref, blob):  # the name is the content's hash
                    out["body_error"] = "the stored body does not match its reference (changed or damaged)"
                    blob = None
                out["body"] = blob.decode("utf-8", "replace")[:200_000] if blob else None
            except Exception:  # a missing or unreadable body is shown as missing
                out["body"] = None
        return _json(out)

    async def metrics(_: web.Request) -> web.Response:
        obs = state.observer
        text = render_metrics(obs.totals_now(), mode=state.cfg.mode, sessions=len(obs.sessions()),
                              unanalysed=state.dropped, pending=state.pending)
        return web.Response(body=text.encode(), headers={**_SECURE, "Content-Type": METRICS_TYPE})

    app.router.add_get("/metrics", metrics)
    app.router.add_get("/ui", page)
    app.router.add_get("/ui/", page)
    app.router.add_get("/ui/{name}", page)
    app.router.add_get("/api/version", version)
    app.router.add_get("/api/sessions", sessions)
    app.router.add_get("/api/sessions/{sid}", session)
    app.router.add_get("/api/sessions/{sid}/requests/{i}", one)


def _brief(r: dict[str, Any]) -> dict[str, Any]:
    """A request for the timeline: usage split, cost, timing and the finding without excerpts."""
    u = billed_tokens(r.get("usage") or {})  # a compaction call's are in usage.iterations, its top level zeros
    f = r.get("finding") or {}
    return {"i": r.get("i"), "time": r.get("time"), "status": r.get("status"), "stream": r.get("stream"),
            "model": r.get("model"), "read": u["cache_read_input_tokens"],
            "write": u["cache_creation_input_tokens"], "input": u["input_tokens"],
            "cost_usd": r.get("cost_usd"), "ttfb_ms": r.get("ttfb_ms"), "total_ms": r.get("total_ms"),
            "cls": f.get("cls"), "location": f.get("location"), "wasted_usd": f.get("wasted_usd"),
            "ours": is_compaction_rewrite(f), "explained_by": f.get("explained_by"),
            "api_reason": f.get("api_reason"), "idle_s": f.get("idle_s"), "ttl": r.get("ttl"),
            "compactions_so_far": r.get("compactions_so_far"), "context": r.get("context")}
