from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from cachecompact import (
    EditOverlapError,
    EditSplitsToolPairError,
    EditTouchesPrefixError,
    InvalidEditError,
    ReplaceWithSummary,
    Session,
    SkipRange,
)
from cachecompact.history.ledger import GENESIS_HASH, entry_hash, widen_to_pairs

from ..conftest import SYSTEM, TOOLS, history, turn


@pytest.fixture
def sess(tmp_path: Path) -> Session:
    s = Session.create(tmp_path / "s", system=SYSTEM, tools=TOOLS, prefix_messages=3)
    s.sync(history(10))  # 21 messages: 0 user, odd = assistant(tool_use), even = results
    return s


def _ledger_size(s: Session) -> int:
    assert s.path is not None
    return (s.path / "ledger.jsonl").stat().st_size


@pytest.mark.parametrize(("edit", "err"), [
    (SkipRange(1, 2), EditTouchesPrefixError),
    (SkipRange(2, 6), EditTouchesPrefixError),
    (SkipRange(5, 6), InvalidEditError),  # message 5 assistant(tool_use) answered by 6... 5..6 is fine, see below
    (SkipRange(4, 5), EditSplitsToolPairError),  # 4 holds results for 3
    (SkipRange(3, 5), EditSplitsToolPairError),  # 5 calls tools answered in 6
    (SkipRange(10, 30), InvalidEditError),
    (SkipRange(7, 6), InvalidEditError),
    (ReplaceWithSummary(3, 4, "   "), InvalidEditError),
])
def test_invalid_edits_raise_typed_errors_and_write_nothing(sess: Session, edit: SkipRange, err: type) -> None:
    size = _ledger_size(sess)
    if edit == SkipRange(5, 6):
        sess.edit(edit)  # a whole exchange is fine
        return
    with pytest.raises(err):
        sess.edit(edit)
    assert _ledger_size(sess) == size
    assert len(sess.ledger) == 0


def test_split_error_suggests_widened_range(sess: Session) -> None:
    with pytest.raises(EditSplitsToolPairError) as ei:
        sess.edit(SkipRange(4, 5))
    assert ei.value.suggested == (3, 6)
    assert widen_to_pairs(sess.transcript, 4, 5) == (3, 6)


def test_clear_in_place_range_of_tool_results_is_allowed(sess: Session) -> None:
    e = sess.edit(SkipRange(4, 4, "old output"), level="L1")
    assert e.kind == "skip" and e.tokens_after < e.tokens_before


def test_overlap_must_contain(sess: Session) -> None:
    sess.edit(ReplaceWithSummary(5, 8, "s1"), level="L3")
    with pytest.raises(EditOverlapError):
        sess.edit(ReplaceWithSummary(7, 10, "s2"))
    with pytest.raises(EditOverlapError):
        sess.edit(SkipRange(6, 6))  # inside the earlier edit but does not contain it
    sess.edit(ReplaceWithSummary(3, 12, "s3 subsumes s1"), level="L4")
    assert [e.seq for e in sess.ledger.effective()] == [1]


def test_entries_are_hash_chained_and_verifiable_with_stdlib_json(sess: Session) -> None:
    sess.edit(SkipRange(4, 4), level="L1")
    sess.edit(ReplaceWithSummary(3, 8, "résumé \u2028 \x00 \"quoted\""), level="L3")
    assert sess.path is not None
    prev = GENESIS_HASH
    for line in (sess.path / "ledger.jsonl").read_bytes().split(b"\n")[:-1]:  # 0x0A only: U+2028 may be raw
        rec = json.loads(line)
        body = {k: v for k, v in rec.items() if k != "hash"}
        canon = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
        assert hashlib.sha256(canon).hexdigest() == rec["hash"] == entry_hash(rec)
        assert rec["prev_hash"] == prev
        prev = rec["hash"]


def test_level_must_be_known(sess: Session) -> None:
    with pytest.raises(InvalidEditError):
        sess.edit(SkipRange(4, 4), level="L9")


def test_edit_before_prefix_complete_is_rejected() -> None:
    s = Session.create(None, prefix_messages=3)
    s.sync(history(0))
    with pytest.raises(EditTouchesPrefixError):
        s.edit(SkipRange(0, 0))


def test_skip_at_start_with_empty_prefix_must_leave_user_first() -> None:
    s = Session.create(None, prefix_messages=0)
    s.sync(history(0) + turn(0, n_calls=0) + turn(1))  # user, assistant, user, assistant(tool), results
    with pytest.raises(InvalidEditError):
        s.edit(SkipRange(0, 0))  # would leave an assistant message first
    s.edit(SkipRange(0, 1))
    assert s.render().body["messages"][0]["role"] == "user"


def test_targeted_edits_change_one_result_and_compose(tmp_path: Path) -> None:
    s = Session.create(tmp_path / "s", prefix_messages=1)
    s.sync(history(0) + turn(0, n_calls=3) + turn(1))
    # message 2 answers three calls: clear one, summarise another, keep the third
    s.edit(SkipRange(2, 2, "old", tool_use_id="toolu_0_0"), level="L1")
    s.edit(ReplaceWithSummary(2, 2, "[externalized: 20 lines]", "big", tool_use_id="toolu_0_1"), level="L2")
    res = s.render().body["messages"][2]["content"]
    assert [b["tool_use_id"] for b in res] == ["toolu_0_0", "toolu_0_1", "toolu_0_2"]
    assert "cleared to save context" in res[0]["content"] and res[1]["content"] == "[externalized: 20 lines]"
    assert res[2]["content"].startswith("output of toolu_0_2")
    with pytest.raises(InvalidEditError, match="no tool result"):
        s.edit(SkipRange(2, 2, tool_use_id="toolu_nope"))
    with pytest.raises(InvalidEditError, match="exactly one message"):
        s.edit(SkipRange(2, 4, tool_use_id="toolu_0_2"))
    # a later whole-range summary contains the targeted edits; a targeted edit inside it is refused
    s.edit(ReplaceWithSummary(1, 4, "did three reads"), level="L3")
    with pytest.raises(EditOverlapError):
        s.edit(SkipRange(2, 2, tool_use_id="toolu_0_2"))
    s.record_request(s.render(), {})  # the request they were made for: confirmed (docs/ledger-format.md)
    reopened = Session.open(tmp_path / "s")
    assert reopened.render().to_json() == s.render().to_json()
    assert json.loads((tmp_path / "s" / "ledger.jsonl").read_text().splitlines()[0])["tool_use_id"] == "toolu_0_0"


def _doc_verifier() -> Any:
    """The standalone verifier from docs/ledger-format.md, exactly as printed there."""
    import re

    doc = (Path(__file__).resolve().parents[2] / "docs" / "ledger-format.md").read_text()
    code = next(b for b in re.findall(r"```python\n(.*?)```", doc, re.S) if "def verify(d)" in b)
    ns: dict[str, Any] = {"__name__": "doc_verifier"}
    exec(compile(code, "docs/ledger-format.md", "exec"), ns)
    return ns["verify"]


def test_the_documented_verifier_accepts_sessions_and_catches_tampering(tmp_path: Path) -> None:
    from cachecompact import ReplaceWithSummary as Summary, Session, SkipRange as Skip

    from ..conftest import SYSTEM, TOOLS

    verify = _doc_verifier()
    s = Session.create(tmp_path / "s", system=SYSTEM, tools=TOOLS)
    for n in range(3, 12):
        s.sync(history(n, n_calls=2))
        if n == 6:
            s.edit(Skip(4, 4, "old"), level="L1")
        if n == 9:
            s.edit(Summary(5, 12, "explored"), level="L3")
        s.record_request(s.render(), {"n": n, "cost_usd": 1.234e-05, "t": 1e-7})  # floats msgspec writes its way
    assert verify(tmp_path / "s") == (s.head, [])
    for name, old, new in [("transcript.jsonl", b"step 2", b"STEP 2"), ("ledger.jsonl", b'"old"', b'"new"'),
                           ("requests.jsonl", b'"n":5', b'"n":6'), ("session.json", SYSTEM.encode(), b"x")]:
        d = tmp_path / f"t-{name}"
        import shutil

        shutil.copytree(tmp_path / "s", d)
        p = d / name
        data = p.read_bytes()
        assert old in data
        p.write_bytes(data.replace(old, new, 1))
        with pytest.raises(AssertionError, match=name.split(".")[0]):
            verify(d)
