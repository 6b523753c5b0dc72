"""`engine.sessions.SessionRegistry` through the engine: which live session a request lands in,
what a new segment inherits, and what a second engine on the same store finds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cachecompact.engine.core import CompactionEngine
from cachecompact.store import FileStore

from ..conftest import SYSTEM


def body(*turns: str) -> dict[str, Any]:
    """A request whose history alternates user and assistant text, ending on a user turn."""
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]
    return {"model": "claude-sonnet-4-6", "max_tokens": 100, "system": SYSTEM, "messages": msgs}


def record(eng: CompactionEngine, b: dict[str, Any], now: float) -> str:
    p = eng.prepare(b, explicit=None, now=now)
    eng.record(p, {"input_tokens": 10, "output_tokens": 5}, f"msg_{now}", None, False)
    return p.live.session.session_id


def test_a_history_that_extends_continues_and_one_that_parts_gets_its_own(tmp_path: Path) -> None:
    eng = CompactionEngine(FileStore(tmp_path), summarizer=None)
    first = record(eng, body("task: fix the parser"), 1)
    assert record(eng, body("task: fix the parser", "reading it", "go on"), 2) == first
    other = record(eng, body("task: fix the parser", "something else", "then?"), 3)
    assert other != first  # same opening, different history: never mixed
    assert record(eng, body("task: fix the parser", "reading it", "go on", "done", "thanks"), 4) == first
    assert sorted(s.session_id for s in eng.sessions()) == sorted({first, other})


def test_a_new_segment_gets_a_fork_of_its_parents_forensics(tmp_path: Path) -> None:
    """A rewritten history (an agent's own compaction) starts a linked segment; its first
    request is compared with the one before it, on a copy of the parent's forensics."""
    eng = CompactionEngine(FileStore(tmp_path), summarizer=None)
    turns = ["task", "a1", "u2", "a2", "u3"]
    parent = eng.prepare(body(*turns), explicit="conv", now=1)
    eng.record(parent, {"input_tokens": 10, "output_tokens": 5}, "m1", None, False)
    seg = eng.prepare(body("task", "a summary of what happened", "u3"), explicit="conv", now=2)
    assert seg.live.session.session_id != "conv" and seg.live.session.link is not None
    assert seg.live.forensics is not parent.live.forensics


def test_a_second_engine_on_the_store_finds_the_conversation(tmp_path: Path) -> None:
    """A restarted process (or a replica) continues the stored session, appending nothing twice."""
    store = FileStore(tmp_path)
    sid = record(CompactionEngine(store, summarizer=None), body("task", "a1", "u2"), 1)
    again = CompactionEngine(FileStore(tmp_path), summarizer=None)
    p = again.prepare(body("task", "a1", "u2", "a2", "u3"), explicit=None, now=2)
    assert p.live.session.session_id == sid and len(p.live.session) == 5
