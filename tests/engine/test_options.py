"""`engine.options.EngineOptions`: the engine's settings, validated once, whichever adapter builds them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import anthropic
import pytest

from cachecompact import CompactionMiddleware, EngineOptions, wrap
from cachecompact.adapters.proxy import ProxyConfig, make_app
from cachecompact.base.errors import CacheCompactError, ConfigError, PolicyConfigError, UnknownStrategyError
from cachecompact.compaction.catalog import CachecompactConfig
from cachecompact.compaction.peers.openhands import OpenHandsCondenser, OpenHandsConfig
from cachecompact.compaction.policy import PolicyConfig
from cachecompact.compaction.strategy import Plan, Strategy, StrategyContext

BAD: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"ttl": "2h"}, ConfigError, "ttl must be '5m', '1h' or None"),
    ({"ttl": "1h", "prefix_ttl": "5m"}, ConfigError, "1-hour breakpoint after a 5-minute one"),
    ({"window_tokens": 100}, PolicyConfigError, "window_tokens must be an integer of at least"),
    ({"prefix_messages": -1}, ConfigError, "prefix_messages must be a non-negative integer"),
    ({"diagnostics": "yes"}, ConfigError, "diagnostics must be True or False"),
    ({"on_event": 3}, ConfigError, "on_event must be a callable"),
    ({"recent_tokens": -5}, ConfigError, "recent_tokens must be a non-negative integer"),
    ({"strategy": "nope"}, UnknownStrategyError, "unknown strategy 'nope'"),
    ({"strategy": "openhands", "recent_tokens": 10}, ConfigError, "has no such policy"),
    ({"lookback_coverage": 1.0}, ConfigError, "lookback_coverage must be a share between 0 and 1"),
    ({"lookback_coverage": "high"}, ConfigError, "lookback_coverage must be a share between 0 and 1"),
    ({"lookback_coverage": 0.9, "recent_tokens": 10}, ConfigError, "not both"),
    ({"strategy": "openhands", "lookback_coverage": 0.9}, ConfigError, "has no such policy"),
    ({"session_id": "../x"}, CacheCompactError, "session_id"),
    # issue 49: one window, one home; two that differ are refused naming both
    ({"window_tokens": 30_000, "config": PolicyConfig(window_tokens=100_000)}, ConfigError,
     "window_tokens=30000 and the policy's window_tokens=100000"),
    ({"window_tokens": 30_000, "strategy": CachecompactConfig(policy=PolicyConfig(window_tokens=90_000))},
     ConfigError, "window_tokens=30000 and the policy's window_tokens=90000"),
]


@pytest.mark.parametrize(("settings", "error", "message"), BAD)
def test_every_adapter_refuses_a_bad_setting_with_the_same_line(settings: dict[str, Any], error: type[Exception],
                                                                message: str) -> None:
    """The options object, the middleware, wrap() and the proxy in compact mode give one message."""
    with pytest.raises(error, match=None) as direct:
        EngineOptions(**settings)
    assert message in str(direct.value) and "\n" not in str(direct.value)
    with pytest.raises(error) as mw:
        CompactionMiddleware(None, **settings)
    client = anthropic.Anthropic(base_url="http://127.0.0.1:9", api_key="t", max_retries=0)
    with pytest.raises(error) as wrapped:
        wrap(client, store=None, **settings)
    proxy_settings = {k: v for k, v in settings.items() if k not in ("strategy", "session_id", "window_tokens")}
    if proxy_settings == settings:  # --strategy and --window-tokens are the proxy's own flags; no session id
        with pytest.raises(error) as proxied:
            make_app(ProxyConfig(upstream="http://127.0.0.1:9", mode="compact",
                                 engine_options=EngineOptions(**proxy_settings)))
        assert str(proxied.value) == str(direct.value)
    assert str(mw.value) == str(wrapped.value) == str(direct.value)


def test_settings_or_options_not_both_and_no_unknown_name() -> None:
    with pytest.raises(ConfigError, match="not both"):
        EngineOptions.of(EngineOptions(), {"ttl": "1h"})
    with pytest.raises(ConfigError, match="unknown setting 'windw_tokens'; the engine's settings are: clock, config"):
        CompactionMiddleware(None, windw_tokens=50_000)
    opts = EngineOptions(ttl="1h")
    assert EngineOptions.of(opts, {}) is opts


def test_the_strategy_config_carries_the_knob_and_a_fixed_ttl() -> None:
    """``lookback_coverage`` becomes the share the policy learns its recent budget for,
    ``recent_tokens`` a fixed budget, and a fixed ``ttl`` the TTL it prices with; an explicit
    ``config`` replaces the policy and keeps these rules."""
    cfg: Any = EngineOptions(recent_tokens=12_345, ttl="1h").strategy_config()
    assert cfg.policy.levels.keep_recent_tokens == 12_345 and cfg.policy.economics.ttl == "1h"
    assert cfg.policy.levels.lookback_coverage == 0.0  # a budget in tokens is fixed: nothing is learnt
    mine = PolicyConfig(window_tokens=80_000)
    cfg = EngineOptions(config=mine, recent_tokens=1_000).strategy_config()
    assert cfg.policy.window_tokens == 80_000 and cfg.policy.levels.keep_recent_tokens == 1_000
    cfg = EngineOptions(config=mine, lookback_coverage=0.8).strategy_config()
    assert cfg.policy.levels.lookback_coverage == 0.8 and cfg.policy.window_tokens == 80_000
    assert cfg.policy.levels.keep_recent_tokens == PolicyConfig().levels.keep_recent_tokens
    assert not hasattr(EngineOptions(strategy="openhands").strategy_config(), "policy")


def test_the_proxy_refuses_engine_options_that_its_own_flags_set() -> None:
    with pytest.raises(ConfigError, match="engine_options must not set strategy, window_tokens"):
        make_app(ProxyConfig(upstream="http://127.0.0.1:9", mode="compact",
                             engine_options=EngineOptions(strategy="none", window_tokens=50_000)))


def test_the_proxy_builds_its_engine_from_typed_options() -> None:
    """`ProxyConfig.engine_options` is an `EngineOptions`; the proxy's own fields set the
    strategy, window and clock, and the rest reach the engine as given. Observe mode refuses
    them, naming each one, without loading the compaction runtime to read them."""
    from cachecompact.adapters.proxy._state import ProxyState

    state = ProxyState(ProxyConfig(upstream="http://127.0.0.1:9", mode="compact", window_tokens=60_000,
                                   engine_options=EngineOptions(recent_tokens=4_000, ttl="1h")))
    try:
        assert state.engine is not None
        got = state.engine.options
        assert (got.recent_tokens, got.ttl, got.window_tokens, got.strategy) == (4_000, "1h", 60_000, "cachecompact")
    finally:
        state.close()
    with pytest.raises(ConfigError, match="--ttl, --recent-tokens apply only with --mode compact"):
        ProxyConfig(engine_options=EngineOptions(recent_tokens=4_000, ttl="1h")).check()
    with pytest.raises(ConfigError, match="engine_options must be an EngineOptions, got int"):
        ProxyConfig(mode="compact", engine_options=3).check()  # type: ignore[arg-type]


def test_a_dict_of_engine_options_still_works_with_a_warning() -> None:
    """The 0.3 form, read until 0.4."""
    with (pytest.warns(DeprecationWarning, match="engine_options as a dict is read until 0.4"),
          pytest.raises(ConfigError, match="engine_options must not set strategy")):
        make_app(ProxyConfig(upstream="http://127.0.0.1:9", mode="compact", engine_options={"strategy": "none"}))
    with pytest.warns(DeprecationWarning):
        make_app(ProxyConfig(upstream="http://127.0.0.1:9", mode="compact", engine_options={"recent_tokens": 10}))


class _OneHour(OpenHandsCondenser):
    """A strategy of a user's own whose plan names only its TTL (no ``prefix_ttl``)."""

    def before_request(self, now: float, model: str, max_tokens: int = 0,
                       params: dict[str, Any] | None = None) -> Plan:
        plan = super().before_request(now, model, max_tokens, params)
        plan.ttl = "1h"
        return plan


@dataclass(frozen=True)
class _OneHourConfig(OpenHandsConfig):
    def build(self, ctx: StrategyContext) -> Strategy:
        return _OneHour(ctx, self)


def test_a_strategy_that_names_only_its_ttl_gets_it() -> None:
    """A plan's ``ttl`` and ``prefix_ttl`` are separate: a ``ttl`` alone is honoured, for every breakpoint."""
    from cachecompact.engine.request_cycle import CompactionEngine

    eng = CompactionEngine(None, strategy=_OneHourConfig(), summarizer=None)
    body = {"model": "claude-sonnet-4-6", "max_tokens": 50, "system": "You are careful. " * 400,
            "messages": [{"role": "user", "content": "fix the bug " * 300}]}
    p = eng.prepare(body, explicit=None, now=1.0)
    marks = [m for m in _cache_controls(p.body)]
    assert marks and all(m.get("ttl") == "1h" for m in marks)


def _cache_controls(x: Any) -> list[dict[str, Any]]:
    if isinstance(x, dict):
        own = [x["cache_control"]] if isinstance(x.get("cache_control"), dict) else []
        return own + [c for v in x.values() for c in _cache_controls(v)]
    if isinstance(x, list):
        return [c for v in x for c in _cache_controls(v)]
    return []


@pytest.mark.parametrize("given", [{"window_tokens": 30_000}, {"config": PolicyConfig(window_tokens=30_000)},
                                   {"window_tokens": 30_000, "config": PolicyConfig(window_tokens=30_000)}])
def test_the_window_given_in_any_one_place_is_the_window_every_request_keeps(given: dict[str, Any]) -> None:
    """Issue 49: wrap(window_tokens=30_000, config=PolicyConfig(window_tokens=100_000)) sent
    prompts of 68,682 tokens to a 30k window (the engine read one setting, the compactor the
    other). Now two that differ are refused (above), and one given anywhere is what every
    request keeps under, through the real SDK against the emulator."""
    from cachecompact.tools.emulator import Emulator, ScriptedResponder
    from cachecompact.tools.emulator.responders import Reply

    k = iter(range(1000))

    def reply(body: dict[str, Any]) -> Reply:
        n = next(k)
        return Reply([{"type": "tool_use", "id": f"toolu_{n}", "name": "read", "input": {"path": f"f{n}.py"}}],
                     "tool_use")

    with Emulator(ScriptedResponder(reply)) as emu:
        client = wrap(anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0), store=None, **given)
        assert EngineOptions(**given).window() == 30_000
        msgs: list[dict[str, Any]] = [{"role": "user", "content": "read them all"}]
        for _ in range(25):
            r = client.messages.create(model="claude-sonnet-4-6", max_tokens=1000, messages=msgs)
            use = next(b for b in r.content if b.type == "tool_use")
            msgs += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                   "content": "x = compute(1)\n" * 600}]}]
        sent = [r["total_input_tokens"] for r in emu.requests if r.get("status") == 200 and not r["internal"]]
    assert len(sent) == 25 and max(sent) <= 30_000 - 1000


@pytest.mark.parametrize(("ttl", "policy_ttl", "refused"), [("5m", "1h", True), ("1h", "5m", True),
                                                            ("1h", "1h", False), ("1h", "auto", False)])
def test_the_ttl_has_one_home_too(ttl: str, policy_ttl: str, refused: bool) -> None:
    """The engine renders with ``ttl=``, the policy prices and times the cache by its own: two fixed
    values that differ are refused naming both (a review found 5m sent while 1h was priced); the
    policy's 'auto' takes the caller's."""
    from cachecompact.compaction.policy import Economics

    opts = {"ttl": ttl, "config": PolicyConfig(economics=Economics(ttl=policy_ttl))}
    if refused:
        with pytest.raises(ConfigError, match=rf"ttl='{ttl}' and the policy's Economics\(ttl='{policy_ttl}'\)"):
            EngineOptions(**opts)
    else:
        pol = EngineOptions(**opts).strategy_config().policy  # type: ignore[attr-defined]
        assert pol.economics.ttl == ttl
