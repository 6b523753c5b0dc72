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
