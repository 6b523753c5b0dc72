"""`history.session.Session`: one conversation over a store, and the same request from it in any process."""

from __future__ import annotations

from pathlib import Path

import pytest

from cachecompact import Session, SkipRange
from cachecompact.base.errors import HistoryRewrittenError
from cachecompact.store import FileSessionStore, FileStore, SharedReadLock

from ..conftest import SYSTEM, TOOLS, history


def test_a_reopened_session_renders_the_same_bytes(tmp_path: Path) -> None:
    """Transcript and ledger replayed from the store give byte-identical requests, edits included."""
    store = FileStore(tmp_path)
    s = Session.create(store, session_id="s1", system=SYSTEM, tools=TOOLS)
    s.sync(history(8, n_calls=2))
    s.edit(SkipRange(start=3, end=6))
    before = s.render().to_json()
    again = Session.open(store, "s1")
    assert again.render().to_json() == before
    assert len(again.ledger.entries) == 1 and len(again) == len(s)


def test_a_rewritten_history_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    s = Session.create(store, session_id="s2", system=SYSTEM, tools=TOOLS)
    msgs = history(6, n_calls=2)
    s.sync(msgs)
    changed = [dict(m) for m in msgs]
    changed[4] = {"role": changed[4]["role"], "content": "something the agent never said"}
    with pytest.raises(HistoryRewrittenError) as err:
        s.sync(changed)
    assert err.value.index == 4
    assert Session.open(store, "s2").render().to_json() == s.render().to_json()


def test_a_read_only_open_takes_the_shared_lock(tmp_path: Path) -> None:
    """The file store offers a shared lock (`store.SharedReadLock`); a read-only open takes it,
    so a report never waits on, or creates, the writer's lock file."""
    store = FileStore(tmp_path)
    Session.create(store, session_id="s3", system=SYSTEM).sync(history(2))
    ss = store.open("s3")
    assert isinstance(ss, FileSessionStore) and isinstance(ss, SharedReadLock)
    lock_file = ss.path / ".lock"
    lock_file.unlink(missing_ok=True)
    ro = Session.open(ss, readonly=True)
    assert len(ro) > 0 and not lock_file.exists()


# -- a strategy's plan: staged, then stored by the request cycle --------------------------------

def test_staged_edits_render_at_once_and_are_stored_by_commit(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    s = Session.create(store, session_id="s3", system=SYSTEM, tools=TOOLS)
    s.sync(history(8, n_calls=2))
    before = s.render().to_json()
    entry = s.stage(SkipRange(start=3, end=6), level="L1")
    assert s.staged == [entry] and s.ledger.entries == [entry]
    assert s.render().to_json() != before  # renders and counts see the plan at once
    assert Session.open(store, "s3").ledger.entries == []  # nothing stored yet
    assert s.commit() == [entry] and s.staged == []
    again = Session.open(store, "s3")
    assert again.ledger.entries == [entry] and again.render().to_json() == s.render().to_json()


def test_a_manual_edit_stores_what_was_staged_before_it(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    s = Session.create(store, session_id="s4", system=SYSTEM, tools=TOOLS)
    s.sync(history(10, n_calls=2))
    staged = s.stage(SkipRange(start=3, end=6), level="L1")
    edited = s.edit(SkipRange(start=7, end=10))
    assert s.staged == [] and Session.open(store, "s4").ledger.entries == [staged, edited]


def test_a_plan_that_lost_a_race_is_not_stored_and_marks_the_session_stale(tmp_path: Path) -> None:
    """Another writer (a replica on the same store) appended an edit after this one staged its
    own: nothing of the plan is written, and the session says it must be opened again."""
    from cachecompact.base.errors import StagedEditsConflictError

    store = FileStore(tmp_path)
    mine = Session.create(store, session_id="s5", system=SYSTEM, tools=TOOLS)
    mine.sync(history(10, n_calls=2))
    other = Session.open(FileStore(tmp_path), "s5")
    mine.stage(SkipRange(start=3, end=6), level="L1")
    theirs = other.edit(SkipRange(start=7, end=10))
    assert not mine.stale
    with pytest.raises(StagedEditsConflictError, match="1 staged ledger edit"):
        mine.commit()
    assert mine.stale and mine.staged == []
    assert Session.open(store, "s5").ledger.entries == [theirs]


def test_a_commit_never_cuts_away_an_entry_another_writer_stored_over_a_torn_tail(tmp_path: Path) -> None:
    """A crashed writer left half a ledger line; this session saw it. Another writer then repaired
    the tail and stored its edit. The commit must find that entry and refuse, not "repair" it away."""
    from cachecompact.base.errors import StagedEditsConflictError

    store = FileStore(tmp_path)
    mine = Session.create(store, session_id="s6", system=SYSTEM, tools=TOOLS)
    mine.sync(history(10, n_calls=2))
    with open(tmp_path / "s6" / "ledger.jsonl", "ab") as f:
        f.write(b'{"seq":0,"kind":"sk')  # a torn tail: no newline
    mine.refresh()
    assert mine.torn
    theirs = Session.open(FileStore(tmp_path), "s6").edit(SkipRange(start=7, end=10))
    mine.stage(SkipRange(start=3, end=6), level="L1")
    with pytest.raises(StagedEditsConflictError):
        mine.commit()
    assert Session.open(store, "s6").ledger.entries == [theirs]


def test_a_commit_whose_write_fails_leaves_the_session_stale(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its memory holds an entry the store does not: every later use refuses it, so no request
    record can ever name that entry; the store keeps what it had."""
    from cachecompact.base.errors import StagedEditsConflictError

    store = FileStore(tmp_path)
    s = Session.create(store, session_id="s7", system=SYSTEM, tools=TOOLS)
    msgs = history(10, n_calls=2)
    s.sync(msgs)
    s.stage(SkipRange(start=3, end=6), level="L1")

    def disk_full(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(s.store, "append", disk_full)
    with pytest.raises(OSError, match="No space left"):
        s.commit()
    monkeypatch.undo()
    assert s.stale
    with pytest.raises(StagedEditsConflictError, match="open it again from the store"):
        s.sync(msgs)
    with pytest.raises(StagedEditsConflictError):
        s.record_request(s.render(), {"usage": {}})
    assert Session.open(store, "s7").ledger.entries == []


def test_request_records_read_back_typed_and_keep_what_the_api_added(tmp_path: Path) -> None:
    """Issue 49: a request record was typed when written and read back as a plain dict. Read back,
    it is a `StoredRequest` whose usage is typed where cachecompact reads it, with a field the
    API added kept as sent; a record that does not fit its type names its line."""
    import anthropic

    import cachecompact
    from cachecompact.base.errors import LedgerCorruptError
    from cachecompact.base.values import RequestRecord, StoredRequest, Usage
    from cachecompact.tools.emulator import Emulator

    store = FileStore(tmp_path)
    with Emulator() as emu:
        client = cachecompact.wrap(anthropic.Anthropic(base_url=emu.url, api_key="k", max_retries=0), store=store)
        msgs: list[dict[str, object]] = [{"role": "user", "content": "read the code " * 300}]
        for k in range(3):
            r = client.messages.create(model="claude-sonnet-4-6", max_tokens=50, messages=msgs)  # type: ignore[arg-type]
            msgs += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]},
                     {"role": "user", "content": f"go on {k}"}]
    (sid,) = store.list()
    s = Session.open(store, sid)
    stored = [rec for _, rec in store.open(sid).read_all("requests")]
    typed = s.request_records()
    assert [type(r) for r in typed] == [StoredRequest] * 3
    for raw, rec in zip(stored, typed, strict=True):
        assert isinstance(rec.usage, Usage) and rec.usage.to_dict() == raw["usage"]
        assert rec.usage.prompt_tokens == sum(int(raw["usage"].get(k) or 0) for k in (
            "input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"))
        assert rec.fields() == {k: v for k, v in raw.items() if k in rec.fields()}
    usage = {"input_tokens": 4, "output_tokens": 2, "cache_read_input_tokens": None, "inference_geo": "eu"}
    s.record_request(s.render(), RequestRecord(time=1.0, model="claude-sonnet-4-6", usage=usage, cost_usd=0.0,
                                               est_tokens=4, message_id=None, stream=False, sent_tokens=4, finding={}))
    last = s.request_records()[-1]
    assert last.usage.input_tokens == 4 and last.usage.extra == {"cache_read_input_tokens": None,
                                                                 "inference_geo": "eu"}
    assert last.usage.to_dict() == usage
    s.record_request(s.render(), {"usage": {"input_tokens": "many"}})
    with pytest.raises(LedgerCorruptError, match=r"requests.*:5: request record #4: .*input_tokens"):
        s.request_records()


def test_a_request_record_reads_as_leniently_as_the_loader_accepts_it(tmp_path: Path) -> None:
    """Review of issue 49's typed records: what `Session.open` accepts must not break the report.
    Nulls read as absent, a count written as 5.0 is 5, any value in ``cache_creation`` is kept;
    a usage that is no object is a `LedgerCorruptError` naming its line, and `request_problems`
    (``ledger verify``) reports it instead of raising."""
    from cachecompact.base.errors import LedgerCorruptError

    store = FileStore(tmp_path)
    s = Session.create(store, session_id="lenient", system=SYSTEM, tools=TOOLS)
    s.sync(history(2))
    usage = {"input_tokens": 5.0, "cache_creation": {"ephemeral_5m_input_tokens": None}}
    s.record_request(s.render(), {"model": None, "finding": None, "cost_usd": None, "usage": usage})
    (rec,) = Session.open(store, "lenient").request_records()
    assert rec.model == "" and rec.finding == {} and rec.cost_usd == 0.0 and rec.usage.input_tokens == 5
    assert rec.usage.cache_creation == {"ephemeral_5m_input_tokens": None}
    s.record_request(s.render(), {"usage": "lots"})
    from cachecompact.base.errors import SessionDamagedError

    with pytest.raises(SessionDamagedError, match="usage is str"):  # opening runs ledger verify's checks
        Session.open(store, "lenient")
    again = Session.open(store, "lenient", verify=False)
    with pytest.raises(LedgerCorruptError, match=r":2: request record #1: usage is str"):
        again.request_records()
    assert any("usage is str" in p for p in again.request_problems())
