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
