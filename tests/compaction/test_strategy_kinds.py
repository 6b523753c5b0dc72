"""Which of the two protocols a strategy is follows from its type, once per session
(`compaction.strategy.shaper_of`); the 0.3 ``renders`` flag is read for one release, with a warning."""

from __future__ import annotations

from typing import Any

import pytest

from cachecompact.compaction.strategy import BodyShaper, Plan, Strategy, shaper_of


class _Ledger:
    def before_request(self, now: float, model: str, max_tokens: int = 0,
                       params: dict[str, Any] | None = None) -> Plan:
        return Plan(0, 0)

    def after_response(self, now: float, usage: dict[str, Any] | None = None) -> None:
        return None

    def reactive(self, reported_tokens: int, limit: int, now: float, model: str, max_tokens: int = 0) -> bool:
        return False


class _Shaper(_Ledger):
    def shape(self, body: dict[str, Any]) -> dict[str, Any]:
        return {**body, "messages": body["messages"][-2:]}


class _OldRenders(_Shaper):
    renders = True  # 0.3: a ledger strategy with an identity shape()


class _OldShaper(_Shaper):
    renders = False


def test_a_strategy_with_shape_is_a_body_shaper_and_one_without_renders() -> None:
    ledger, shaper = _Ledger(), _Shaper()
    assert isinstance(ledger, Strategy) and not isinstance(ledger, BodyShaper)
    assert shaper_of(ledger) is None
    assert shaper_of(shaper) is shaper


@pytest.mark.parametrize(("cls", "shapes"), [(_OldRenders, False), (_OldShaper, True)])
def test_the_old_renders_flag_still_decides_for_one_release(cls: type[_Shaper], shapes: bool) -> None:
    s = cls()
    with pytest.warns(DeprecationWarning, match="renders is read until 0.4"):
        got = shaper_of(s)
    assert (got is s) is shapes


class _OldLedgerNoShape(_Ledger):
    renders = False  # 0.3: it inherited LedgerStrategy's pass-through shape


def test_an_old_non_rendering_strategy_without_shape_passes_the_body_through() -> None:
    with pytest.warns(DeprecationWarning):
        got = shaper_of(_OldLedgerNoShape())
    assert got is not None
    body = {"messages": [{"role": "user", "content": "a"}] * 3}
    assert got.shape(body) is body


def test_a_ledger_strategy_with_its_own_shape_still_renders_as_in_0_3() -> None:
    """`LedgerStrategy` rendered in 0.3 whatever ``shape`` said; a subclass that overrode it
    keeps rendering (with a warning), rather than silently becoming a body shaper."""
    from cachecompact.compaction.strategy import LedgerStrategy

    class Mine(LedgerStrategy):
        def before_request(self, now: float, model: str, max_tokens: int = 0,
                           params: dict[str, Any] | None = None) -> Plan:
            return Plan(0, 0)

        def reactive(self, reported_tokens: int, limit: int, now: float, model: str, max_tokens: int = 0) -> bool:
            return False

        def shape(self, body: dict[str, Any]) -> dict[str, Any]:
            return {}

    from cachecompact.base.events import EventBus
    from cachecompact.compaction.strategy import StrategyContext
    from cachecompact.compaction.summarize.llm import ExtractiveSummarizer
    from cachecompact.history.draft import Draft
    from cachecompact.history.session import Session

    ctx = StrategyContext(draft=Draft(Session.create(None, session_id="s_mine", system="sys", tools=[],
                                                       prefix_messages=1)),
                          summarizer=ExtractiveSummarizer(), events=EventBus(), window_tokens=200_000)
    with pytest.warns(DeprecationWarning, match="shape is ignored"):
        assert shaper_of(Mine(ctx)) is None


def test_every_shipped_strategy_is_one_kind_or_the_other() -> None:
    """Ours and the ledger peers render; the body peers shape; none carries the old flag."""
    from cachecompact.base.events import EventBus
    from cachecompact.compaction.catalog import get_strategy, strategy_names
    from cachecompact.compaction.strategy import StrategyContext
    from cachecompact.compaction.summarize.llm import ExtractiveSummarizer
    from cachecompact.history.draft import Draft
    from cachecompact.history.session import Session

    kinds = {}
    for name in strategy_names():
        session = Session.create(None, session_id=f"s_{name}", system="sys", tools=[], prefix_messages=1)
        ctx = StrategyContext(draft=Draft(session), summarizer=ExtractiveSummarizer(), events=EventBus(),
                              window_tokens=200_000)
        s = get_strategy(name).build(ctx)
        assert not hasattr(s, "renders"), name
        kinds[name] = shaper_of(s) is not None
    assert kinds["cachecompact"] is False and kinds["openhands"] is False
    assert kinds["window-20"] is True and kinds["masking"] is True
