"""`cachecompact ledger verify` and a verifier written only from docs/ledger-format.md
(tests/spec_verifier.py, which imports nothing of cachecompact) agree on every tamper case of
benchmarks/tamper.py, the two the spec check once missed included: a space added inside a
stored record, and a CR before a line's newline."""

from __future__ import annotations

import contextlib
import io
import random
import shutil
from pathlib import Path
from types import ModuleType

import pytest

from cachecompact.tools.cli import main as cli

from ..conftest import load_benchmark
from ..spec_verifier import verify as spec_verify

ROOT = Path(__file__).resolve().parents[2]
TRIALS = 240


def _tamper() -> ModuleType:
    return load_benchmark("tamper")


def _ours(d: Path) -> int:
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        return cli(["ledger", "verify", str(d)])


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[ModuleType, Path]:
    tamper = _tamper()
    d = tmp_path_factory.mktemp("spec") / "session"
    tamper.build(d)
    return tamper, d


def test_both_verifiers_pass_an_untouched_session(built: tuple[ModuleType, Path]) -> None:
    _, d = built
    assert _ours(d) == 0
    assert spec_verify(d) == []


@pytest.mark.slow
def test_both_verifiers_agree_on_every_tamper_case(built: tuple[ModuleType, Path], tmp_path: Path) -> None:
    tamper, d = built
    rng = random.Random(2026)
    disagree, kinds = [], set()
    for k in range(TRIALS):
        trial = tmp_path / f"t{k}"
        shutil.copytree(d, trial)
        what = tamper.mutate(trial, rng)
        kinds.add(what.split(" of ")[0].split(" in ")[0])
        ours = _ours(trial)
        theirs = spec_verify(trial)
        if (ours != 0) != bool(theirs):
            disagree.append((what, ours, theirs[:2]))
        shutil.rmtree(trial)
    assert {"add a space inside a record", "add a CR before a newline"} <= kinds
    assert disagree == []


def test_a_session_whose_prefix_is_empty_verifies_from_its_creation(tmp_path: Path) -> None:
    """prefix_messages=0 wrote prefix_end 0 with a null prefix_hash, which both verifiers
    refused until the first sync (found by the verifier written from the document)."""
    from cachecompact import Session

    d = tmp_path / "s"
    Session.create(d, system="You are careful.", prefix_messages=0)
    assert _ours(d) == 0 and spec_verify(d) == []
