"""Deferred syncs of the file store (issue 57): a record is written at once and made durable
later, and nothing that names it is written before it is durable."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from cachecompact import Session
from cachecompact.history.ledger import SkipRange
from cachecompact.store import DeferredSync, FileSessionStore, FileStore


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the files fsynced, in order."""
    out: list[str] = []
    real = os.fsync

    def spy(fd: int) -> None:
        out.append(Path(os.readlink(f"/proc/self/fd/{fd}")).name)
        real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    return out


def _msgs(n: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(n):
        out.append({"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}"})
    return out


def _store(tmp_path: Path) -> FileSessionStore:
    st = FileStore(tmp_path).create("s1", {"session_id": "s1"})
    assert isinstance(st, FileSessionStore) and isinstance(st, DeferredSync)
    return st


def test_a_deferred_append_is_read_at_once_and_synced_by_flush(tmp_path: Path, synced: list[str]) -> None:
    st = _store(tmp_path)
    synced.clear()
    st.append_deferred("transcript", [{"i": 0}], 0)
    assert synced == []
    assert [r for _, r in FileSessionStore.open(tmp_path / "s1").read_new("transcript")[0]] == [{"i": 0}]
    st.flush()
    assert synced == ["transcript.jsonl"]
    st.flush()  # nothing left to sync
    assert synced == ["transcript.jsonl"]


def test_what_names_a_deferred_record_waits_until_it_is_durable(tmp_path: Path, synced: list[str]) -> None:
    st = _store(tmp_path)
    synced.clear()
    st.append_deferred("transcript", [{"i": 0}], 0)
    st.append_deferred("transcript", [{"i": 1}], 1)  # the same log: no sync between
    assert synced == []
    st.append_deferred("requests", [{"r": 0}], 0)  # names the transcript: it is synced first
    assert synced == ["transcript.jsonl"]
    st.append("ledger", [{"e": 0}], 0)  # a plain append: every deferred log first, then itself
    assert synced == ["transcript.jsonl", "requests.jsonl", "ledger.jsonl"]
    st.append_deferred("transcript", [{"i": 2}], 2)
    st.write_meta(st.read_meta())  # the metadata names transcript messages too
    assert synced[3] == "transcript.jsonl"


def test_a_deferring_session_syncs_the_transcript_before_a_ledger_entry(tmp_path: Path, synced: list[str]) -> None:
    s = Session.create(FileStore(tmp_path), session_id="s2", system="sys", prefix_messages=1)
    s.defer_fsync = True
    s.sync(_msgs(7))
    synced.clear()
    s.sync(_msgs(9))
    assert synced == []  # written, not yet synced
    s.edit(SkipRange(start=2, end=3))
    assert synced[:2] == ["transcript.jsonl", "ledger.jsonl"]
    s.sync(_msgs(11))
    s.flush()
    again = Session.open(FileStore(tmp_path), "s2")
    assert len(again.transcript) == 11 and len(again.ledger) == 1


def test_sessions_sync_every_append_unless_told(tmp_path: Path, synced: list[str]) -> None:
    s = Session.create(FileStore(tmp_path), session_id="s3", system="sys")
    synced.clear()
    s.sync(_msgs(3))
    assert synced[0] == "transcript.jsonl"  # then the metadata, the prefix complete


def test_records_read_from_another_writer_are_synced_before_ours(tmp_path: Path, synced: list[str]) -> None:
    a = _store(tmp_path)
    a.append_deferred("transcript", [{"i": 0}], 0)  # another process, say, that has not flushed yet
    b = FileSessionStore.open(tmp_path / "s1")
    assert [r for _, r in b.read_new("transcript")[0]] == [{"i": 0}]
    b.read_new("requests")  # nothing new: nothing to sync
    synced.clear()
    b.append("requests", [{"r": 0}], 0)  # names the transcript b read: its file is synced first
    assert synced == ["transcript.jsonl", "requests.jsonl"]


def test_events_deferred_are_synced_by_a_whole_flush(tmp_path: Path, synced: list[str]) -> None:
    st = _store(tmp_path)
    synced.clear()
    st.append_event_deferred({"kind": "observation", "i": 0})
    st.append_event_deferred({"kind": "observation", "i": 1})
    assert synced == [] and [e["i"] for e in st.read_events()] == [0, 1]
    st.append_deferred("transcript", [{"i": 0}], 0)  # the other logs' flush leaves events alone
    st.flush(but="requests")
    assert synced == ["transcript.jsonl"]
    st.flush()
    assert synced == ["transcript.jsonl", "events.jsonl"]


def test_an_observer_batch_syncs_each_session_once(tmp_path: Path, synced: list[str]) -> None:
    import threading

    from cachecompact.adapters.proxy._observe import Observer

    obs = Observer(store=FileStore(tmp_path))
    body = b'{"model":"claude-haiku-4-5","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}'

    def one(k: int) -> None:
        obs.observe(body, {}, status=500, usage=None, message_id=None, cache_miss_reason=None, now=1.0 + k,
                    timing={}, stream=False)

    one(0)  # outside a batch: synced as it is written
    synced.clear()
    with obs.batch():
        for k in range(1, 4):
            one(k)
        other = threading.Thread(target=one, args=(9,))  # another thread's record is not the batch's
        other.start()
        other.join()
        assert synced == ["events.jsonl"]
    assert synced == ["events.jsonl", "events.jsonl"]
    (sid,) = [s.sid for s in obs.sessions()]
    assert [e["i"] for e in FileStore(tmp_path).open(sid).read_events()] == [0, 1, 2, 3, 4]
