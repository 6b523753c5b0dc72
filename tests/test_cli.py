from __future__ import annotations

import json
from pathlib import Path

import pytest

from cachecompact import ReplaceWithSummary, Session, SkipRange
from cachecompact.cli import main

from .conftest import SYSTEM, TOOLS, history


@pytest.fixture
def session_dir(tmp_path: Path) -> Path:
    s = Session.create(tmp_path / "s", system=SYSTEM, tools=TOOLS)
    s.sync(history(8))
    s.edit(SkipRange(4, 4, "old output"), level="L1")
    s.sync(history(10))
    s.edit(ReplaceWithSummary(3, 12, "did things"), level="L4")
    return tmp_path / "s"


def test_ledger_show(session_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ledger", "show", str(session_dir)]) == 0
    out = capsys.readouterr().out
    assert "summary" in out and "3..12" in out and "L4" in out and "old output" in out


def test_ledger_verify_ok_and_names_first_bad_line(session_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ledger", "verify", str(session_dir)]) == 0
    assert "2 ledger entries" in capsys.readouterr().out
    p = session_dir / "ledger.jsonl"
    lines = p.read_bytes().split(b"\n")
    rec = json.loads(lines[1])
    rec["summary"] = "tampered"
    lines[1] = json.dumps(rec).encode()
    p.write_bytes(b"\n".join(lines))
    assert main(["ledger", "verify", str(session_dir)]) == 1
    err = capsys.readouterr().err
    assert "ledger.jsonl:2" in err


def test_render_at_entry(session_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render", str(session_dir), "--at-entry", "0", "--model", "claude-haiku-4-5"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["model"] == "claude-haiku-4-5"
    assert len(body["messages"]) == 17  # transcript length 17 when entry 0 was made
    assert "cleared to save context" in json.dumps(body)
    assert main(["render", str(session_dir), "--at-entry", "9"]) == 2


def test_missing_dir_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ledger", "show", str(tmp_path / "nope")]) == 2
    assert "not a cachecompact session directory" in capsys.readouterr().err


def test_demo_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--out", str(tmp_path / "d")]) == 0
    out = capsys.readouterr().out
    assert "explained by ledger entry" in out
    assert main(["ledger", "verify", str(tmp_path / "d")]) == 0


def test_serve_starts_an_emulator_the_sdk_can_use(tmp_path: Path) -> None:
    import re
    import subprocess
    import sys

    import anthropic

    log = tmp_path / "req.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "cachecompact.cli", "serve", "--port", "0", "--log", str(log)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        m = re.search(r"listening on (http://[\d.]+:\d+)", line)
        assert m, line
        client = anthropic.Anthropic(base_url=m.group(1), api_key="test", max_retries=0)
        out = client.messages.create(model="claude-haiku-4-5", max_tokens=5,
                                     messages=[{"role": "user", "content": "hi"}])
        assert out.content[0].type == "text"
    finally:
        proc.terminate()
        proc.wait(10)
    assert json.loads(log.read_text().splitlines()[0])["status"] == 200
