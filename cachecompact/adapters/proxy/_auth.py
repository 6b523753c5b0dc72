"""Who may open the dashboard and its API: this machine only (by the name it is asked by), or,
bound beyond loopback, whoever holds the ``--auth-token``."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable, Callable

from aiohttp import web

from ..httpserver import api_error
from ._config import ProxyConfig, is_loopback

__all__ = ["cookie_value", "loopback_host_only", "token_auth"]

_COOKIE = "cachecompact_token"


def _dashboard_path(path: str) -> bool:
    """The dashboard, its JSON API and ``/metrics``: what shows request contents or totals."""
    return path in ("/ui", "/metrics") or path.startswith(("/ui/", "/api/"))


@web.middleware
async def loopback_host_only(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                             ) -> web.StreamResponse:
    """Without a token the dashboard is for this machine only, and so is the name it is asked
    by: a page whose own host name was re-pointed at 127.0.0.1 (DNS rebinding) sends that name
    in ``Host`` and is refused."""
    if _dashboard_path(request.path):
        given = request.host or ""
        host = given.split("]", 1)[0] + "]" if given.startswith("[") else given.rsplit(":", 1)[0]
        if not is_loopback(host):
            return api_error(403, f"the dashboard without --auth-token answers only to a loopback host name, not "
                                  f"{host[:100]!r}", kind="permission_error")
    return await handler(request)


def cookie_value(token: str) -> str:
    """What the login cookie holds: a value derived from the token, never the token itself, so a
    cookie that leaks (a browser profile, a proxy's log) does not give away the credential that
    ``Authorization: Bearer`` accepts."""
    return hmac.new(token.encode(), b"cachecompact dashboard cookie v1", hashlib.sha256).hexdigest()


def _over_https(request: web.Request) -> bool:
    """Whether the browser reached us over TLS: directly, or through a terminating proxy that says
    so in ``X-Forwarded-Proto``; then the cookie is ``Secure``."""
    return request.secure or request.headers.get("x-forwarded-proto", "").split(",")[0].strip().lower() == "https"


def token_auth(cfg: ProxyConfig) -> Callable[..., Awaitable[web.StreamResponse]]:
    token = cfg.auth_token
    cookie = cookie_value(token) if token is not None else ""

    @web.middleware
    async def check(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                    ) -> web.StreamResponse:
        path = request.path
        if token is None or not _dashboard_path(path):
            return await handler(request)
        header = request.headers.get("authorization", "")
        query = request.query.get("token")
        if query is not None and hmac.compare_digest(query.encode(), token.encode()):
            resp = web.HTTPFound(path)  # the token leaves the address bar; a cookie carries the proof from now on
            resp.set_cookie(_COOKIE, cookie, httponly=True, samesite="Strict", path="/", secure=_over_https(request))
            raise resp
        if header.lower().startswith("bearer "):
            ok = hmac.compare_digest(header[7:].encode(), token.encode())
        else:
            given = request.cookies.get(_COOKIE, "")
            ok = bool(given) and hmac.compare_digest(given.encode(), cookie.encode())
        if not ok:
            return api_error(401, "this proxy's dashboard and API need the auth token: an 'Authorization: Bearer' "
                                  "header, or open /ui?token=... once", kind="authentication_error")
        return await handler(request)
    return check
