"""The Wilson interval's two ends: the policy's safe side of a share seen a few times."""

from __future__ import annotations

import pytest

from cachecompact.base.shares import wilson_lower, wilson_upper


@pytest.mark.parametrize(("share", "n"), [(0.0, 1), (0.0, 9), (0.05, 40), (0.5, 10), (1.0, 3), (0.97, 2000)])
def test_the_ends_bracket_the_share_and_close_in_as_trials_grow(share: float, n: int) -> None:
    lo, hi = wilson_lower(share, n), wilson_upper(share, n)
    assert 0.0 <= lo <= share <= hi <= 1.0
    assert wilson_upper(share, 100 * n) - wilson_lower(share, 100 * n) < hi - lo


def test_no_trials_say_nothing() -> None:
    assert wilson_lower(0.3, 0) == 0.0 and wilson_upper(0.3, 0) == 1.0


def test_none_in_n_has_the_upper_end_one_in_n_plus_one() -> None:
    """At one standard error, 0 of n is at most 1/(n + 1): nine clean trials bound a share by 10%."""
    for n in (1, 9, 99):
        assert wilson_upper(0.0, n) == pytest.approx(1 / (n + 1))


def test_the_ends_mirror_each_other() -> None:
    assert wilson_lower(0.2, 30) == pytest.approx(1 - wilson_upper(0.8, 30))
