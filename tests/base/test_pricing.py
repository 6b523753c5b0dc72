"""The price table: lookups, aliases and a client's own entries."""

from __future__ import annotations

import pytest

from cachecompact.base import pricing
from cachecompact.base.errors import ConfigError, UnknownModelError
from cachecompact.base.pricing import get_model, own_prices, priced, register_model


def test_an_alias_registered_after_a_failed_lookup_takes_effect() -> None:
    """The id lookup was cached with its alias resolved, so an alias registered after one failed
    lookup of it was ignored for the life of the process."""
    name = "claude-sonnet-lab-alias"
    with pytest.raises(UnknownModelError):
        get_model(name)
    try:
        register_model(get_model("claude-sonnet-4-6"), name)
        assert get_model(name).name == "claude-sonnet-4-6"
        assert get_model(name + "-20261001").name == "claude-sonnet-4-6"
    finally:
        pricing._ALIASES.pop(name, None)


def test_own_prices_come_first_and_leave_the_table_alone() -> None:
    own = own_prices({"claude-sonnet-4-6": {"input": 300, "output": 1500}, "Claude-Lab-2": {"input": 1, "output": 2}})
    assert get_model("claude-sonnet-4-6", own).input == 300
    assert get_model("claude-sonnet-4-6").input == 3.0
    assert priced("claude-lab-2-20261001", own).output == 2
    with pytest.raises(UnknownModelError):
        get_model("claude-lab-2")
    with pytest.raises(ConfigError, match="input and output"):
        own_prices({"x": {"in": 1}})
    with pytest.raises(ConfigError, match="must map"):
        own_prices([("x", {})])  # type: ignore[arg-type]
