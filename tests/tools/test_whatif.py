"""`cachecompact whatif` (`cachecompact.tools._whatif`): a user's own Claude Code sessions replayed
under each option, priced by their recorded model, with the table, the JSON and the plot."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from cachecompact.base.pricing import model_prices
from cachecompact.tools._whatif import BASELINE, BASELINE_IDLE, OPTIONS, recorded_cost
from cachecompact.tools.cli import main
from cachecompact.tools.traces.claude_code_logs import load_claude_code

MODEL = "claude-sonnet-4-6"


def _session(path: Path, seed: int, turns: int = 14) -> None:
    """A small Claude Code log: a task, then tool calls whose results are a few thousand tokens
    each, with two 20-minute pauses (the person away)."""
    t = 1_767_000_000.0 + seed * 86_400
    entries: list[dict[str, Any]] = []

    def put(kind: str, content: Any, **extra: Any) -> None:
        nonlocal t
        iso = f"{__import__('datetime').datetime.fromtimestamp(t, __import__('datetime').UTC).isoformat()}"
        msg: dict[str, Any] = {"role": kind, "content": content, **extra}
        entries.append({"type": kind, "sessionId": f"s{seed}", "timestamp": iso.replace("+00:00", "Z"),
                        "message": msg})

    put("user", f"task {seed}: find why test_parse_{seed} fails")
    written = 0
    for k in range(turns):
        t += 4
        tid = f"toolu_{seed}_{k}"
        usage = {"input_tokens": 3, "cache_read_input_tokens": written, "cache_creation_input_tokens": 3_000,
                 "output_tokens": 60}
        written += 3_000
        put("assistant", [{"type": "text", "text": f"step {k}: reading part {k}"},
                          {"type": "tool_use", "id": tid, "name": "Read", "input": {"file_path": f"src/m{k}.py"}}],
            model=MODEL, id=f"msg_{seed}_{k}", usage=usage)
        t += 1_200 if k in (5, 10) else 2
        body = "\n".join(f"def f_{seed}_{k}_{i}(x): return x * {i}  # line {i}" for i in range(250))
        put("user", [{"type": "tool_result", "tool_use_id": tid, "content": body}])
    t += 3
    put("assistant", [{"type": "text", "text": f"found it: f_{seed}_3_7"}], model=MODEL, id=f"msg_{seed}_end",
        usage={"input_tokens": 3, "cache_read_input_tokens": written, "cache_creation_input_tokens": 200,
               "output_tokens": 30})
    path.write_text("\n".join(json.dumps(e) for e in entries) + "\n")


@pytest.fixture
def logs(tmp_path: Path) -> Path:
    d = tmp_path / "projects" / "-home-me-parser"
    d.mkdir(parents=True)
    for seed in (1, 2):
        _session(d / f"session-{seed}.jsonl", seed)
    return d


def test_whatif_on_two_sessions_prints_its_table_and_writes_json_and_plot(
        logs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert main(["whatif", str(logs), "--out", str(out), "--workers", "1"]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert lines[-1].startswith("wrote ")  # the files' paths, as long as the folder's
    assert max(len(line) for line in lines[:-1]) <= 120 and len(lines) <= 24  # one screen
    assert "2 sessions" in text and "Claude Code's way, its own TTL" in text
    data = json.loads((out / "whatif.json").read_text())
    assert (out / "whatif.png").stat().st_size > 10_000
    got = {o["name"]: o for o in data["options"]}
    assert list(got) == [BASELINE, *OPTIONS, "claude-code+idle", "claude-code@5m+idle"]  # the last two make a baseline
    assert data["paired"] == 2 and all(o["failed"] == 0 for o in got.values())
    # the same with idle compaction: Claude Code's never fires below 200k tokens, so it costs the same
    assert got[BASELINE_IDLE]["cost_usd"] == pytest.approx(got[BASELINE]["cost_usd"])
    assert "claude-code+idle" not in text.split("-----")[1]  # run for the baseline, not a row of its own
    # the plot draws the table's rows, not the options run only for a baseline (issue 50: 13 bars, 11 rows)
    from cachecompact.tools._whatif import Option, WhatIf, table_options

    w = WhatIf(sessions=[], window=0, paired=2, hidden=["claude-code+idle", "claude-code@5m+idle"],
               options=[Option(**{k: v for k, v in o.items() if k != "label"}) for o in data["options"]])
    assert [o.name for o in table_options(w)] == [BASELINE, *OPTIONS]
    # the logs wrote with 5 minutes, so the baseline is Claude Code's way at 5 minutes, session by session
    assert [s["recorded_ttl"] for s in data["sessions"]] == ["5m", "5m"]
    assert got[BASELINE]["cost_usd"] == pytest.approx(got["claude-code@5m"]["cost_usd"])
    # the 20-minute pauses expire a 5-minute cache and not a 1-hour one (dearer writes, fewer of them)
    assert got["none@1h"]["cost_usd"] < got["none"]["cost_usd"]
    assert all(o["cost_usd"] > 0 and 0 <= o["recall"] <= 1 for o in got.values())
    p = model_prices(MODEL)
    for s in data["sessions"]:
        trace = load_claude_code(logs / (s["name"].split("/")[-1] + ".jsonl"))
        billed = sum(p.as_of(trace.timestamps[0]).cost(u) for u in trace.usage if u)
        assert s["model"] == MODEL and math.isclose(s["recorded_usd"], billed)
        assert recorded_cost(trace) == pytest.approx(billed)


def test_whatif_refuses_a_strategy_with_no_ttl_to_choose_and_a_folder_with_no_session(
        logs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["whatif", str(logs), "--option", "openhands@1h", "--out", str(tmp_path / "o")]) == 2
    assert "has no cache TTL to choose" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["whatif", str(empty), "--out", str(tmp_path / "o")]) == 2
    assert "no session could be loaded" in capsys.readouterr().err
    assert BASELINE not in OPTIONS  # composed per session, not a strategy


def test_a_session_an_option_cannot_finish_is_listed_with_its_whole_reason(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 37: whatif left out sessions without a word ("12 replayed to the end under every
    option"). At a window too small for ``none``, the long session is listed under that option
    with the whole reason, the options that did finish are reported for it, and the recorded
    bill is split into what the rows cover and what they do not."""
    d = tmp_path / "projects" / "-home-me-parser"
    d.mkdir(parents=True)
    _session(d / "short.jsonl", 1, turns=3)
    _session(d / "long.jsonl", 2, turns=14)
    out = tmp_path / "out"
    assert main(["whatif", str(d), "--out", str(out), "--workers", "1", "--window", "20000",
                 "--option", "none", "--option", "cachecompact"]) == 0
    text = " ".join(capsys.readouterr().out.split())  # folded at 120 columns
    data = json.loads((out / "whatif.json").read_text())
    assert data["paired"] == 1 and "1 replayed to the end under every option" in text and "1 left out" in text
    (fail,) = [f for f in data["failures"] if f["option"] == "none"]
    assert fail["session"].endswith("long") and "context full" in fail["reason"]
    assert fail["reason"].startswith("request ") and fail["reason"].endswith("start a new session)")  # whole
    assert "not finished by no compaction, 5 min TTL: request" in text
    assert "cachecompact (TTL it chooses) $" in text.split("left out of the sums")[1]
    rec = data["recorded"]
    assert rec["total_usd"] == pytest.approx(rec["replayed_usd"] + rec["left_out_usd"] + rec["subagents_usd"])
    assert rec["left_out_usd"] > 0 and rec["replayed_usd"] > 0
