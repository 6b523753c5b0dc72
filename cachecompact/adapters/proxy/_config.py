"""The proxy's settings (``cachecompact proxy`` flags), checked before anything listens."""

from __future__ import annotations

import dataclasses
import ipaddress
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...base.errors import ConfigError
from ...base.pricing import get_model
from ...base.values import ProxyMode
from ...store import Store
from ._upstream import upstream_base

if TYPE_CHECKING:  # type-only: observe mode never loads the compaction runtime (the `observe` contract)
    from ...engine.options import EngineOptions

__all__ = ["ProxyConfig", "is_loopback"]


@dataclass
class ProxyConfig:
    upstream: str = "https://api.anthropic.com"
    host: str = "127.0.0.1"
    port: int = 8787
    mode: ProxyMode = "observe"  # or "compact"
    store: str | Store | None = None
    keep_bodies: bool = False
    auth_token: str | None = None
    strategy: str = "cachecompact"
    window_tokens: int | None = None
    max_connections: int = 200
    # megabytes of session state kept in memory (estimated), least recently used out first; in
    # compact mode half for the engine's sessions and half for the dashboard's records
    max_memory_mb: int = 1024
    # compact mode's other engine settings (``recent_tokens``, ``lookback_coverage``, ``ttl``, ...);
    # the proxy's own fields set its strategy, window and clock. A dict of them is read until 0.4.
    engine_options: EngineOptions | Mapping[str, Any] | None = None
    # compact mode: summarize a quiet session before its cache expires when it pays, on the
    # session's last credential, held in memory until then (`held_credentials`); off by default
    idle_compaction: bool = False
    summary_model: str | None = None  # compact mode's summaries (default: the strategy's, claude-haiku-5-5)
    # the time source, for tests and replays on simulated time (a `SimulatedClock`); a request's
    # x-cachecompact-clock header still wins for that request
    clock: Callable[[], float] | None = None

    def check(self) -> None:
        """Refuse a configuration that would run unsafely or not at all; ``upstream`` becomes the
        base URL it names (`upstream_base`: a trailing ``/`` or ``/v1`` dropped)."""
        if self.mode not in ("observe", "compact"):
            raise ConfigError(f"--mode must be 'observe' or 'compact', got {self.mode!r}")
        self.upstream = upstream_base(self.upstream)  # checked, and a trailing /v1 dropped
        mm = self.max_memory_mb
        if not isinstance(mm, int) or isinstance(mm, bool) or mm < 2:
            raise ConfigError(f"--max-memory must be a whole number of megabytes, at least 2, got {mm!r}")
        if not is_loopback(self.host) and not self.auth_token:
            raise ConfigError(f"binding to {self.host} (beyond loopback) needs --auth-token: the dashboard and its API "
                              "show request contents")
        if self.keep_bodies and self.store is None:
            raise ConfigError("--keep-bodies needs --store (bodies are kept in the store)")
        if self.mode == "observe" and self.strategy != "cachecompact":
            raise ConfigError(f"--strategy {self.strategy} applies only with --mode compact")
        knobs = [f"--{k.replace('_', '-')}" for k in self.engine_settings()]
        knobs += ["--window"] if self.window_tokens is not None else []
        knobs += ["--idle-compaction"] if self.idle_compaction else []
        knobs += ["--summary-model"] if self.summary_model is not None else []
        if self.summary_model is not None:
            if "claude-" not in self.summary_model.lower():
                raise ConfigError(f"--summary-model {self.summary_model!r} is not a Claude model id (for example "
                                  "'claude-haiku-5-5')")
            get_model(self.summary_model)  # an unlisted id: one line naming the nearest ones
        if self.mode == "observe" and knobs:
            # observe mode forwards every request untouched: a compaction knob there would be
            # silently ignored, and the user would believe it took effect
            raise ConfigError(f"{', '.join(knobs)} {'applies' if len(knobs) == 1 else 'apply'} only with --mode "
                              "compact (observe mode changes nothing)")

    def engine_settings(self) -> list[str]:
        """The names of the engine settings ``engine_options`` sets (its fields that differ from
        their defaults), read without importing the engine: observe mode checks them too."""
        o = self.engine_options
        if o is None:
            return []
        if isinstance(o, Mapping):
            warnings.warn("ProxyConfig.engine_options as a dict is read until 0.4; pass "
                          "cachecompact.EngineOptions(...) instead", DeprecationWarning, stacklevel=3)
            return list(o)
        if not dataclasses.is_dataclass(o):
            raise ConfigError(f"engine_options must be an EngineOptions, got {type(o).__name__}")
        return [f.name for f in dataclasses.fields(o)
                if f.default is not dataclasses.MISSING and getattr(o, f.name) != f.default]


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
