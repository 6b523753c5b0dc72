"""``cachecompact proxy``: cache forensics and compaction for any Messages API client."""

from .app import Proxy, ProxyConfig, make_app
from .observe import Observer, session_hint

__all__ = ["Observer", "Proxy", "ProxyConfig", "make_app", "session_hint"]
