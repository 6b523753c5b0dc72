"""The file store: atomic creation, private files, torn tails, tamper evidence, safe paths, locking."""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cachecompact import (
    InvalidSessionIdError,
    LedgerCorruptError,
    Session,
    SessionExistsError,
    SessionNotFoundError,
    SkipRange,
    StoreError,
)
from cachecompact.store import BlobOwners, FileStore, Store, check_session_id

from ..conftest import SYSTEM, TOOLS, history, turn


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def _record(s: Session) -> None:
    """Acknowledge a request of the current state (what the middleware does after a response)."""
    r = s.render()
    s.record_request(r, {"time": 0.0, "model": "m", "usage": {}})


def test_files_are_private_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        s = Session.create(tmp_path / "deep" / "er" / "s", system=SYSTEM, tools=TOOLS)
        s.sync(history(3))
        s.edit(SkipRange(4, 4), level="L1")
        _record(s)
        s.log_event({"kind": "x"})
    finally:
        os.umask(old)
    for name in ("session.json", "transcript.jsonl", "ledger.jsonl", "requests.jsonl", "events.jsonl"):
        assert _mode(tmp_path / "deep" / "er" / "s" / name) == 0o600, name
    for d in (tmp_path / "deep", tmp_path / "deep" / "er", tmp_path / "deep" / "er" / "s"):
        assert _mode(d) == 0o700, d


def test_create_never_overwrites(tmp_path: Path) -> None:
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "f").write_text("hi")
    with pytest.raises(SessionExistsError):
        Session.create(tmp_path / "x")
    with pytest.raises(StoreError, match="not a cachecompact session"):
        Session.open(tmp_path / "x")
    Session.create(tmp_path / "y")
    with pytest.raises(SessionExistsError):
        Session.create(tmp_path / "y")


@pytest.mark.parametrize("leftover", ["old-crash", "meta-only"])
def test_a_half_made_directory_is_recognised_and_rebuilt(tmp_path: Path, leftover: str,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    d = tmp_path / "s"
    d.mkdir()
    if leftover == "old-crash":  # what 0.1 left when killed inside Session.create
        (d / ".lock").write_text("")
        (d / f".session.json.{os.getpid()}.tmp").write_text('{"format":')
    else:
        (d / "session.json").write_text('{"format": "cachecompact-session", "version": 2}')
    with pytest.raises(SessionNotFoundError, match="half-made"):
        Session.open(d)
    with caplog.at_level(logging.WARNING, "cachecompact"):
        s = Session.create(d, system=SYSTEM)
    assert "half-made" in caplog.text
    s.sync(history(2))
    assert len(Session.open(d)) == len(history(2))
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".s.broken")]  # set aside, not deleted


def test_torn_transcript_tail_is_reported_kept_and_set_aside(tmp_path: Path) -> None:
    s = Session.create(tmp_path / "s")
    h = history(4)
    s.sync(h)
    p = tmp_path / "s" / "transcript.jsonl"
    full = p.read_bytes()
    last_start = full.rstrip(b"\n").rfind(b"\n") + 1
    p.write_bytes(full[:-25])  # crash in the middle of the last append: no newline
    s2 = Session.open(tmp_path / "s")
    assert s2.torn and s2.torn[0].path == str(p) and s2.torn[0].line == len(h)
    assert len(s2) == len(h) - 1  # the records before the torn line are kept
    s2.sync(h + turn(4))  # the agent re-sends everything: the lost message is appended again
    assert p.read_bytes().startswith(full)
    aside = list(p.parent.glob("transcript.jsonl.torn.*"))
    assert len(aside) == 1 and aside[0].read_bytes() == full[last_start:-25]
    assert Session.open(tmp_path / "s").messages() == h + turn(4)


def test_a_complete_line_that_does_not_parse_is_corruption_never_a_torn_tail(tmp_path: Path) -> None:
    s = Session.create(tmp_path / "s")
    s.sync(history(4))
    s.edit(SkipRange(4, 4), level="L1")
    s.edit(SkipRange(6, 6), level="L1")
    p = tmp_path / "s" / "ledger.jsonl"
    data = bytearray(p.read_bytes())
    data[-20] ^= 0x01  # one flipped byte in the last line, which still ends in a newline
    p.write_bytes(bytes(data))
    with pytest.raises(LedgerCorruptError) as ei:
        Session.open(tmp_path / "s")
    assert ei.value.line == 2


def test_tampered_entry_names_the_line(tmp_path: Path) -> None:
    s = Session.create(tmp_path / "s")
    s.sync(history(5))
    for i in (4, 6, 8):
        s.edit(SkipRange(i, i), level="L1")
    p = tmp_path / "s" / "ledger.jsonl"
    lines = p.read_bytes().split(b"\n")
    rec = json.loads(lines[1])
    rec["end"] = 7
    lines[1] = json.dumps(rec).encode()
    p.write_bytes(b"\n".join(lines))
    with pytest.raises(LedgerCorruptError) as ei:
        Session.open(tmp_path / "s")
    assert ei.value.line == 2 and ei.value.path.endswith("ledger.jsonl")
    lines[1] = b"{not json"
    p.write_bytes(b"\n".join(lines))
    with pytest.raises(LedgerCorruptError, match="not valid JSON"):
        Session.open(tmp_path / "s")


def test_forged_transcript_message_with_recomputed_hash_is_detected(tmp_path: Path) -> None:
    import xxhash

    from cachecompact.base.wire import canonical_bytes

    s = Session.create(tmp_path / "s")
    s.sync(history(3))
    p = tmp_path / "s" / "transcript.jsonl"
    lines = p.read_text().split("\n")
    rec = json.loads(lines[4])
    rec["m"]["content"][0]["content"] = "a forged tool result"
    rec["h"] = xxhash.xxh3_128_hexdigest(canonical_bytes(rec["m"]))  # the old format's only check: recomputed
    lines[4] = canonical_bytes(rec).decode()  # written as the store writes: only the chain can tell
    p.write_text("\n".join(lines))
    with pytest.raises(LedgerCorruptError, match="chain value") as ei:
        Session.open(tmp_path / "s")
    assert ei.value.line == 5 and "transcript.jsonl" in ei.value.path


@pytest.mark.parametrize("name", ["transcript.jsonl", "ledger.jsonl", "requests.jsonl"])
def test_truncation_below_an_acknowledged_request_is_detected(tmp_path: Path, name: str) -> None:
    s = Session.create(tmp_path / "s")
    s.sync(history(4))
    s.edit(SkipRange(4, 4), level="L1")
    s.edit(SkipRange(6, 6), level="L1")
    _record(s)
    _record(s)
    p = tmp_path / "s" / name
    lines = p.read_bytes().split(b"\n")
    p.write_bytes(b"\n".join(lines[:-2]) + b"\n")  # drop the last whole line
    if name == "requests.jsonl":
        # dropping the newest record is a consistent rollback: only an anchor (the head) can tell
        s2 = Session.open(tmp_path / "s")
        assert s2.head != s.head and s2.extends(s.head) is False
        return
    with pytest.raises(LedgerCorruptError) as ei:  # a later record committed to what was removed
        Session.open(tmp_path / "s")
    assert ei.value.path.endswith(("ledger.jsonl", "requests.jsonl")) and ei.value.line == 1


@pytest.mark.parametrize(("field", "value", "match"), [
    ("prefix_hash", None, "prefix_hash is null"),
    ("prefix_end", 99, "prefix_end"),
    ("prefix_hash", "0" * 32, "prefix_hash"),
])
def test_session_json_fields_are_checked_and_verify_never_writes(tmp_path: Path, field: str, value: Any,
                                                                   match: str) -> None:
    s = Session.create(tmp_path / "s")
    s.sync(history(3))
    meta_p = tmp_path / "s" / "session.json"
    meta = json.loads(meta_p.read_text())
    meta[field] = value
    meta_p.write_text(json.dumps(meta, sort_keys=True, separators=(",", ":"), ensure_ascii=False) + "\n")
    before = meta_p.read_bytes()
    with pytest.raises(Exception, match=match):
        Session.open(tmp_path / "s", readonly=True)
    assert meta_p.read_bytes() == before


@pytest.mark.parametrize("bad", [".", "..", "abc\n", "a/b", "", "-x", ".hidden", "x" * 129, "a\x00b", 5])
def test_session_ids_that_could_name_a_path_are_refused(tmp_path: Path, bad: Any) -> None:
    with pytest.raises(InvalidSessionIdError):
        check_session_id(bad)
    with pytest.raises(InvalidSessionIdError):
        FileStore(tmp_path).create(bad, {})
    assert check_session_id("s_0af.2-x") == "s_0af.2-x"
    assert list(tmp_path.iterdir()) == []


def test_planted_symlinks_never_lead_outside_the_store(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    root = tmp_path / "store"
    store = FileStore(root)
    s = Session.create(store, session_id="s1", system=SYSTEM)
    d = root / "s1"
    # a symlink where an append would go, and one where the lock lives
    (d / "transcript.jsonl").unlink()
    (d / "transcript.jsonl").symlink_to(victim)
    with pytest.raises(StoreError, match="symbolic link"):
        s.sync(history(1))
    (d / "transcript.jsonl").unlink()
    (d / "transcript.jsonl").write_bytes(b"")
    (d / ".lock").unlink(missing_ok=True)
    (d / ".lock").symlink_to(victim)
    with pytest.raises(StoreError, match="symbolic link"):
        Session.open(d)
    # a symlinked session directory is refused, and metadata replacement replaces the link itself
    (root / "s2").symlink_to(tmp_path)
    with pytest.raises(StoreError, match="symbolic link"):
        Session.open(root / "s2")
    (d / ".lock").unlink()
    (d / "session.json.tmp").symlink_to(victim)
    s3 = Session.create(store, session_id="s3", system=SYSTEM)
    s3.sync(history(2))  # the prefix completes: session.json is rewritten through a fresh temp file
    assert not (root / "s3" / "session.json").is_symlink()
    assert victim.read_text() == "keep me"


def _worker(path: str, worker: int, n: int) -> None:
    s = Session.open(path, lock_timeout=30)
    for k in range(n):
        s.refresh()
        tid = f"w{worker}_{k}"
        t = [{"role": "assistant", "content": [{"type": "tool_use", "id": tid, "name": "bash", "input": {}}]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tid, "content": f"r{worker}{k}"}]}]
        s.append(t)


@pytest.mark.slow
def test_two_processes_never_interleave(tmp_path: Path) -> None:
    path = tmp_path / "s"
    s = Session.create(path, prefix_messages=1)
    s.sync([{"role": "user", "content": "go"}])
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_worker, args=(str(path), w, 15)) for w in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    final = Session.open(path)
    assert len(final) == 1 + 2 * 2 * 15
    msgs = final.messages()
    for i in range(1, len(msgs), 2):  # every tool_use is directly followed by its own result
        assert msgs[i + 1]["content"][0]["tool_use_id"] == msgs[i]["content"][0]["id"]


def test_lock_timeout_gives_clear_error(tmp_path: Path) -> None:
    s = Session.create(tmp_path / "s")
    code = ("import sys\nfrom cachecompact import Session, SessionLockedError\n"
            "try:\n    Session.open(sys.argv[1], lock_timeout=0.3)\nexcept SessionLockedError as e:\n"
            "    print('LOCKED', e)\n")
    assert s.store is not None
    with s.store.lock():  # this process holds the lock; a second process must give up cleanly
        out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "s")], capture_output=True, text=True,
                             timeout=60)
    assert out.stdout.startswith("LOCKED") and "another writer holds the session lock" in out.stdout, out.stderr
    s.sync(history(1))  # and the lock is usable again afterwards


def test_head_anchors_a_rollback(tmp_path: Path) -> None:
    s = Session.create(tmp_path / "s")
    s.sync(history(3))
    _record(s)
    head = s.head
    s.sync(history(4))
    _record(s)
    again = Session.open(tmp_path / "s", readonly=True)
    assert again.extends(head) and again.extends(again.head)
    assert not again.extends("1:0:0:" + "0" * 64)


def test_a_restarted_process_reads_scratchpad_content_past_broken_copies(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """After a restart `read_scratchpad` reads the caller's own conversation from the store (here
    named by ``session_id=``). A copied folder whose name is no session id, and a session whose
    scratchpad folder is a planted link to content outside the store, are both passed over; the
    genuine copy answers."""
    import shutil

    import anthropic

    from cachecompact import scratchpad_handler, wrap
    from cachecompact.history.scratchpad import Scratchpad

    root = tmp_path / "store"
    store = FileStore(root)
    text = "CONFIG_A = 1\n" + "filler line\n" * 400
    Session.create(store, session_id="b-good", system=SYSTEM)
    ref = Scratchpad(store.open("b-good")).put(text)
    shutil.copytree(root / "b-good", root / "a copy")  # sorts first; not a valid session id
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / f"{ref}.txt").write_text("FORGED")
    Session.create(store, session_id="b-good.a2", system=SYSTEM,  # its sub-agent
                   link={"session": "b-good", "reason": "agent", "at": 0})
    (root / "b-good.a2" / "scratchpad").symlink_to(outside, target_is_directory=True)
    assert store.blob_owners(ref) == ["b-good"]
    assert store.open("b-good.a2").get_blob(ref) is None  # the link is not followed either way
    client = wrap(anthropic.Anthropic(base_url="http://127.0.0.1:9", api_key="t", max_retries=0), store=root,
                  session_id="b-good")
    out, is_error = scratchpad_handler(client)({"ref": ref, "limit": 50})
    assert not is_error and out.startswith("CONFIG_A = 1") and "FORGED" not in out
    class WithoutBlobOwners:  # a store written without the optional fast path: every session is asked
        def __init__(self, inner: FileStore) -> None:
            self.inner = inner

        def __getattr__(self, name: str) -> Any:
            if name == "blob_owners":
                raise AttributeError(name)
            return getattr(self.inner, name)

    plain = WithoutBlobOwners(FileStore(root))
    assert isinstance(plain, Store) and not isinstance(plain, BlobOwners)
    other = wrap(anthropic.Anthropic(base_url="http://127.0.0.1:9", api_key="t", max_retries=0), store=plain,
                 session_id="b-good")
    assert scratchpad_handler(other)({"ref": ref, "limit": 50}) == (out, False)
    with monkeypatch.context() as m:  # a store that cannot be read: an error result for the agent, not a crash

        def unreadable(self: FileStore, prefix: str = "") -> list[str]:
            raise StoreError("the database is down")

        m.setattr(FileStore, "list", unreadable)
        out2, is_error = scratchpad_handler(client)({"ref": ref})
        assert is_error and "the session store cannot be read" in out2 and "database is down" in out2
    shutil.rmtree(root / "b-good")
    out, is_error = scratchpad_handler(client)({"ref": ref})
    assert is_error and "unknown scratchpad reference" in out


def test_listing_passes_over_a_session_deleted_meanwhile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process may delete a session between the directory scan and the look at it."""
    store = FileStore(tmp_path)
    for sid in ("a", "b"):
        Session.create(store, session_id=sid, system=SYSTEM)
    real = os.lstat

    def gone(p: Any, *a: Any, **k: Any) -> os.stat_result:
        if Path(p).name == "a":
            raise FileNotFoundError(p)
        return real(p, *a, **k)

    monkeypatch.setattr(os, "lstat", gone)
    assert store.list() == ["b"]
