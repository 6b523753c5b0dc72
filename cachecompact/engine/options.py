"""The engine's settings in one validated object: `wrap()`, `CompactionMiddleware` and the
proxy's flags all build an `EngineOptions`, so each setting is spelled, checked and explained
in one place, and every adapter refuses a bad value with the same one-line message."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace as dc_replace
from typing import Any

from ..base.errors import ConfigError, PolicyConfigError
from ..base.events import Event
from ..base.pricing import ModelInfo
from ..base.values import TTL
from ..compaction.catalog import get_strategy, with_policy
from ..compaction.policy import PolicyConfig, window_problem
from ..compaction.strategy import StrategyConfig
from ..store import check_session_id

__all__ = ["EngineOptions"]

EventHooks = Callable[[Event], None] | list[Callable[[Event], None]] | None


@dataclass(frozen=True, slots=True)
class EngineOptions:
    """Every setting of `CompactionEngine` but its store and summarizer, checked when made.

    ``session_id`` names the conversation (else it is found by content); ``strategy`` is a
    registered name or a config, and ``config`` replaces its policy; ``window_tokens`` caps the
    context (default: the model's own window); ``prefix_messages`` sizes the immutable prefix;
    ``scratchpad_tool`` adds ``read_scratchpad`` to new sessions; ``diagnostics`` asks the API
    for its cache-miss diagnostics; ``ttl`` / ``prefix_ttl`` fix the cache TTL (default: the
    policy chooses); ``on_event`` receives every `Event`; ``clock`` is the time source;
    ``strict_models`` refuses a model the price table does not list; ``lookback_coverage`` is
    the one knob for cost against recall: the recent budget is learnt to cover that share of the
    agent's own look-backs; ``recent_tokens`` fixes the budget instead (docs/policy.md);
    ``max_memory_mb`` caps the sessions kept in memory by their estimated size."""

    session_id: str | None = None
    strategy: str | StrategyConfig = "cachecompact"
    config: PolicyConfig | None = None
    window_tokens: int | None = None
    prefix_messages: int | None = None
    scratchpad_tool: bool = False
    diagnostics: bool = False
    ttl: TTL | None = None
    prefix_ttl: TTL | None = None
    on_event: EventHooks = None
    clock: Callable[[], float] = time.time
    strict_models: bool = False
    recent_tokens: int | None = None
    lookback_coverage: float | None = None
    # this engine's own price entries (``wrap(pricing=...)``), keyed by canonical id, looked up
    # before the process-wide table; they never change that table
    prices: Mapping[str, ModelInfo] | None = None
    # megabytes of sessions kept in memory (estimated, `Live.nbytes`), least recently used out
    # first; None: up to 512 sessions whatever their size
    max_memory_mb: int | None = None

    def __post_init__(self) -> None:
        if self.session_id is not None:
            check_session_id(self.session_id, "session_id")
        for name, v in (("ttl", self.ttl), ("prefix_ttl", self.prefix_ttl)):
            if v not in (None, "5m", "1h"):
                raise ConfigError(f"{name} must be '5m', '1h' or None, got {v!r}")
        if self.prefix_ttl == "5m" and self.ttl == "1h":  # the prefix's breakpoint comes first in every request
            raise ConfigError("ttl='1h' with prefix_ttl='5m' puts a 1-hour breakpoint after a 5-minute one, which "
                              "the API refuses; use prefix_ttl='1h' (or leave it unset)")
        w = self.window_tokens
        why = window_problem(w)
        if why is not None:
            raise PolicyConfigError(why)
        p = self.prefix_messages
        if p is not None and (not isinstance(p, int) or p < 0):
            raise ConfigError(f"prefix_messages must be a non-negative integer, got {p!r}")
        for name, flag in (("scratchpad_tool", self.scratchpad_tool), ("diagnostics", self.diagnostics),
                           ("strict_models", self.strict_models)):
            if not isinstance(flag, bool):
                raise ConfigError(f"{name} must be True or False, got {flag!r}")
        if not all(callable(h) for h in self.hooks) or not callable(self.clock):
            raise ConfigError(f"on_event must be a callable or a list of callables and clock a callable, got "
                              f"on_event={self.on_event!r}, clock={self.clock!r}")
        mm = self.max_memory_mb
        if mm is not None and (not isinstance(mm, int) or isinstance(mm, bool) or mm < 1):
            raise ConfigError(f"max_memory_mb must be a positive integer of megabytes, got {mm!r}")
        r = self.recent_tokens
        if r is not None and (not isinstance(r, int) or isinstance(r, bool) or r < 0):
            raise ConfigError(f"recent_tokens must be a non-negative integer of tokens, got {r!r}")
        c = self.lookback_coverage
        if c is not None and (isinstance(c, bool) or not isinstance(c, (int, float)) or not 0 < c < 1):
            raise ConfigError(f"lookback_coverage must be a share between 0 and 1 (exclusive), got {c!r}")
        if r is not None and c is not None:
            raise ConfigError("give recent_tokens (a fixed recent budget) or lookback_coverage (a budget learnt from "
                              "the agent's look-backs), not both")
        # an unknown strategy, or a knob its strategy does not have, fails now; and the window has one home
        pol = getattr(self.strategy_config(), "policy", None)
        pw = pol.window_tokens if isinstance(pol, PolicyConfig) else None
        if w is not None and pw is not None and w != pw:
            raise ConfigError(f"window_tokens={w} and the policy's window_tokens={pw} (config=PolicyConfig(...) or "
                              "the strategy's own policy) disagree; give the window once: keep window_tokens= and drop "
                              "window_tokens from the PolicyConfig")
        # the TTL too: the engine renders with ``ttl=`` while the policy prices and times the cache by
        # its own (Economics.ttl), so two fixed values that differ would price one TTL and send the other
        pt = pol.economics.ttl if isinstance(pol, PolicyConfig) else None
        if self.ttl is not None and pt not in (None, "auto") and pt != self.ttl:
            raise ConfigError(f"ttl={self.ttl!r} and the policy's Economics(ttl={pt!r}) disagree; give the TTL once: "
                              "keep ttl= and leave the policy's at 'auto' (it then prices with yours)")

    @classmethod
    def of(cls, options: EngineOptions | None, settings: Mapping[str, Any]) -> EngineOptions:
        """``options``, or one made from ``settings`` (an adapter's keywords); not both."""
        if options is not None:
            if settings:
                raise ConfigError(f"give options= or its settings as keywords ({', '.join(sorted(settings))}), "
                                  "not both")
            return options
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(settings) - known)
        if unknown:
            raise ConfigError(f"unknown setting {unknown[0]!r}; the engine's settings are: {', '.join(sorted(known))}")
        return cls(**settings)

    def window(self) -> int | None:
        """The one window every part plans against (issue 49: the engine and the compactor read
        two settings in opposite order, and a 30k ``window_tokens`` under a 100k policy sent
        68,682-token prompts): ``window_tokens``, else the policy's (``config``, or the strategy
        config's own); None: each request's model's own window. Two that differ are refused
        when the options are made."""
        if self.window_tokens is not None:
            return self.window_tokens
        pol = getattr(self.strategy_config(), "policy", None)
        return pol.window_tokens if isinstance(pol, PolicyConfig) else None

    @property
    def hooks(self) -> list[Callable[[Event], None]]:
        """``on_event`` as a list."""
        h = self.on_event
        return list(h) if isinstance(h, list) else ([] if h is None else [h])

    def strategy_config(self) -> StrategyConfig:
        """The strategy's config with these options applied: ``config`` as its policy, the recent
        budget (``lookback_coverage`` learns it, ``recent_tokens`` fixes it), and a fixed ``ttl``
        as the TTL the policy prices with."""
        cfg = get_strategy(self.strategy) if isinstance(self.strategy, str) else self.strategy
        if not callable(getattr(cfg, "build", None)):
            raise ConfigError(f"strategy must be a registered name or a strategy config, got {self.strategy!r}")
        out = with_policy(cfg, self.config)
        pol = getattr(out, "policy", None)
        knob = ("recent_tokens" if self.recent_tokens is not None else
                "lookback_coverage" if self.lookback_coverage is not None else None)
        if knob is not None:
            if not isinstance(pol, PolicyConfig):
                raise ConfigError(f"{knob} sets the cachecompact policy's recent budget; strategy "
                                  f"{getattr(cfg, 'name', cfg)!r} has no such policy")
            # the cost-versus-recall knob (docs/policy.md, "The one knob"): a coverage to learn the
            # budget by, or a budget fixed in tokens (learning off)
            levels = (dc_replace(pol.levels, keep_recent_tokens=self.recent_tokens, lookback_coverage=0.0)
                      if self.recent_tokens is not None else
                      dc_replace(pol.levels, lookback_coverage=float(self.lookback_coverage or 0.0)))
            pol = dc_replace(pol, levels=levels)
            out = with_policy(out, pol)
        if self.ttl is not None and isinstance(pol, PolicyConfig) and pol.economics.ttl == "auto":
            # the caller fixed the TTL: the policy prices its decisions with that one
            out = with_policy(out, dc_replace(pol, economics=dc_replace(pol.economics, ttl=self.ttl)))
        return out
