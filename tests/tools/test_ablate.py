"""benchmarks/ablate.py: a variant is the default policy with exactly the one setting it names
changed, and a spec that names no setting is refused before anything runs."""

from __future__ import annotations

import pytest

from cachecompact.compaction.policy import PolicyConfig

from ..conftest import load_benchmark


def test_a_variant_changes_the_one_setting_it_names() -> None:
    ablate = load_benchmark("ablate")
    base = PolicyConfig()
    v = ablate.variant_policy("levels.working_set_chars=0", base)
    assert v.levels.working_set_chars == 0 and base.levels.working_set_chars > 0
    assert v.economics == base.economics and v.triggers == base.triggers
    assert v == PolicyConfig(levels=type(base.levels)(**{**vars(base.levels), "working_set_chars": 0}))
    off = ablate.variant_policy("economics.mark_compacted=False", base)
    assert off.economics.mark_compacted is False and off.levels == base.levels


@pytest.mark.parametrize("spec", ["levels.no_such_field=1", "nowhere.x=1", "levels.miss_rate", "miss_rate=0"])
def test_a_spec_that_names_no_setting_is_refused(spec: str) -> None:
    ablate = load_benchmark("ablate")
    with pytest.raises(SystemExit, match=r"SECTION\.FIELD=VALUE"):
        ablate.variant_policy(spec, PolicyConfig())
