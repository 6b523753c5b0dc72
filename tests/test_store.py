from __future__ import annotations

import json
import multiprocessing as mp
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from cachecompact import LedgerCorruptError, Session, SkipRange, StoreError

from .conftest import SYSTEM, TOOLS, history, turn


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_files_are_private(tmp_path: Path) -> None:
    s = Session.create(tmp_path / "s", system=SYSTEM, tools=TOOLS)
    s.sync(history(3))
    s.edit(SkipRange(4, 4), level="L1")
    for name in ("session.json", "transcript.jsonl", "ledger.jsonl"):
        assert _mode(tmp_path / "s" / name) == 0o600, name
    assert _mode(tmp_path / "s") == 0o700


def test_create_refuses_non_empty_dir(tmp_path: Path) -> None:
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "f").write_text("hi")
    with pytest.raises(StoreError):
        Session.create(tmp_path / "x")
    with pytest.raises(StoreError, match="not a cachecompact session"):
        Session.open(tmp_path / "x")


def test_torn_transcript_tail_is_reported_kept_and_set_aside(tmp_path: Path) -> None:
    s = Session.create(tmp_path / "s")
    h = history(4)
    s.sync(h)
    p = tmp_path / "s" / "transcript.jsonl"
    full = p.read_bytes()
    last_start = full.rstrip(b"\n").rfind(b"\n") + 1
    p.write_bytes(full[:-25])  # crash in the middle of the last append
    s2 = Session.open(tmp_path / "s")
    assert s2.torn and s2.torn[0].path == str(p) and s2.torn[0].line == len(h)
    assert len(s2) == len(h) - 1  # the records before the torn line are kept
    s2.sync(h + turn(4))  # the agent re-sends everything: the lost message is appended again
    assert p.read_bytes().startswith(full)
    aside = list(p.parent.glob("transcript.jsonl.torn.*"))
    assert len(aside) == 1 and aside[0].read_bytes() == full[last_start:-25]
    assert Session.open(tmp_path / "s").messages() == h + turn(4)


def test_torn_ledger_tail_then_new_edit_repairs_file(tmp_path: Path) -> None:
    s = Session.create(tmp_path / "s")
    s.sync(history(4))
    s.edit(SkipRange(4, 4), level="L1")
    p = tmp_path / "s" / "ledger.jsonl"
    good = p.read_bytes()
    p.write_bytes(good + b'{"seq":1,"kind":"sk')
    s2 = Session.open(tmp_path / "s")
    assert s2.torn[0].line == 2
    s2.edit(SkipRange(6, 6), level="L1")
    assert p.read_bytes().startswith(good) and len(p.read_bytes().splitlines()) == 2
    assert next(p.parent.glob("ledger.jsonl.torn.*")).read_bytes() == b'{"seq":1,"kind":"sk'
    assert len(Session.open(tmp_path / "s").ledger) == 2


def test_tampered_entry_names_the_line(tmp_path: Path) -> None:
    s = Session.create(tmp_path / "s")
    s.sync(history(5))
    s.edit(SkipRange(4, 4), level="L1")
    s.edit(SkipRange(6, 6), level="L1")
    s.edit(SkipRange(8, 8), level="L1")
    p = tmp_path / "s" / "ledger.jsonl"
    lines = p.read_bytes().split(b"\n")
    rec = json.loads(lines[1])
    rec["end"] = 7
    lines[1] = json.dumps(rec).encode()
    p.write_bytes(b"\n".join(lines))
    with pytest.raises(LedgerCorruptError) as ei:
        Session.open(tmp_path / "s")
    assert ei.value.line == 2 and ei.value.path.endswith("ledger.jsonl")


def test_broken_chain_and_bad_json_in_the_middle(tmp_path: Path) -> None:
    s = Session.create(tmp_path / "s")
    s.sync(history(5))
    for i in (4, 6, 8):
        s.edit(SkipRange(i, i), level="L1")
    p = tmp_path / "s" / "ledger.jsonl"
    lines = p.read_bytes().split(b"\n")
    p.write_bytes(b"\n".join([lines[0], lines[2], lines[1], b""]))
    with pytest.raises(LedgerCorruptError) as ei:
        Session.open(tmp_path / "s")
    assert ei.value.line == 2
    p.write_bytes(b"\n".join([lines[0], b"{not json", lines[2], b""]))
    with pytest.raises(LedgerCorruptError, match="not valid JSON") as ei:
        Session.open(tmp_path / "s")
    assert ei.value.line == 2


def test_transcript_tampering_is_detected(tmp_path: Path) -> None:
    s = Session.create(tmp_path / "s")
    s.sync(history(3))
    p = tmp_path / "s" / "transcript.jsonl"
    lines = p.read_text().split("\n")
    lines[4] = lines[4].replace("output of", "OUTPUT OF")
    p.write_text("\n".join(lines))
    with pytest.raises(LedgerCorruptError) as ei:
        Session.open(tmp_path / "s")
    assert ei.value.line == 5 and "transcript.jsonl" in ei.value.path


def _worker(path: str, worker: int, n: int) -> None:
    s = Session.open(path, lock_timeout=30)
    for k in range(n):
        # every worker appends whole turns after whatever is there now
        with s.store.lock():  # type: ignore[union-attr]
            s._refresh()
            base = s.messages()
        tid = f"w{worker}_{k}"
        t = [{"role": "assistant", "content": [{"type": "tool_use", "id": tid, "name": "bash", "input": {}}]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tid, "content": f"r{worker}{k}"}]}]
        try:
            s.sync(base + t)
        except Exception:
            s.append(t)


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
    assert out.stdout.startswith("LOCKED") and "another process holds the session lock" in out.stdout, out.stderr
    s.sync(history(1))  # and the lock is usable again afterwards
