"""``cachecompact proxy``: cache forensics and compaction for any Messages API client.

An Anthropic-compatible reverse proxy with cache forensics, optional compaction and a live
dashboard, on the same aiohttp server stack as the emulator. Every path is forwarded with the
caller's method, query, headers (hop-by-hop ones dropped) and body, and the response comes back
unchanged, streamed chunk by chunk (compressed or not: neither side decompresses). Credentials
are forwarded and never stored or logged.

``POST /v1/messages`` is also recorded. In ``observe`` mode the request bytes are forwarded
untouched and analysed after the response, off the request path, in one worker thread. In
``compact`` mode the body is first run through the engine (the same code as ``wrap()``), and a
prompt-too-long 400 triggers reactive compaction and one retry. ``/ui`` serves the dashboard and
``/api/...`` its JSON; bound beyond loopback, both require the ``--auth-token``.

The modules, in the order a request meets them: `config` (the flags), `server` (the app),
`auth` (the dashboard's gate), `handlers` (the routes), `credentials` (the caller's key for its
summaries), `tap` (usage from the passing bytes), `state` (what the app holds, and the analysis
after the response), `observe` (per-session records), `upstream` (the pooled client),
`dashboard` (the UI's JSON).
"""

from ...engine.identity import session_hint
from ._config import ProxyConfig
from ._observe import Observer
from ._proxy_app import Proxy, make_app
from ._state import ProxyState

__all__ = ["Observer", "Proxy", "ProxyConfig", "ProxyState", "make_app", "session_hint"]
