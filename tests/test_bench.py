"""Benchmark pieces: recall on a hand-checked trace, the oracle against brute force, the
strategies' validity, and `cachecompact bench` end to end."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import pytest

from cachecompact.bench.harness import STRATEGIES, replay
from cachecompact.bench.oracle import oracle_cost, schedule_cost
from cachecompact.bench.peers import window
from cachecompact.bench.recall import RecallProbe
from cachecompact.cli import main
from cachecompact.emulator import ReplayResponder
from cachecompact.identifiers import digest, identifiers
from cachecompact.pricing import get_model
from cachecompact.traces import Trace, synthetic_trace
from cachecompact.validate import validate_messages


def _call(k: int, name: str, inp: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": [{"type": "tool_use", "id": f"toolu_{k}", "name": name, "input": inp}]}


def _result(k: int, text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{k}", "content": text}]}


def small_trace() -> Trace:
    """grep finds two files; the agent then reads one of them, then edits a symbol it saw."""
    msgs = [
        {"role": "user", "content": "Fix the crash in the parser"},
        _call(0, "grep", {"pattern": "parse_args"}),
        _result(0, "src/cli/main.py:10: parse_args()\nsrc/cli/util.py:3: def parse_args(argv):"),
        _call(1, "read_file", {"path": "src/cli/util.py"}),
        _result(1, "def parse_args(argv):\n    return ArgParser(strict_mode=True).run(argv)"),
        _call(2, "edit_file", {"path": "src/cli/util.py", "old": "strict_mode=True", "new": "strict_mode=False"}),
        _result(2, "ok"),
        {"role": "assistant", "content": "Done."},
    ]
    return Trace(name="hand/small", source="test", format="anthropic", messages=msgs,
                 timestamps=[float(i) for i in range(len(msgs))], usage=[None] * len(msgs))


def test_identifiers_and_digest() -> None:
    ids = identifiers("see src/cli/util.py:3 def parse_args(argv) ArgParser strict_mode=True 42 1234")
    assert ids == ["src/cli/util.py", "parse_args", "ArgParser", "strict_mode", "1234"]
    assert digest("a_b c_d src/x.py", 12) == "src/x.py"  # paths first, within the budget


def test_recall_is_counted_by_hand() -> None:
    tr = small_trace()
    probe = RecallProbe(ReplayResponder(tr.messages))
    full = lambda n: {"messages": tr.messages[:n]}  # noqa: E731 - the request the agent sends at each turn
    probe.respond(full(1))  # reply: grep(parse_args): "parse_args" first appears in the task? no -> not a reference
    probe.respond(full(3))  # reply: read src/cli/util.py: seen in the grep result -> 1 reference, visible
    # third request: the grep and read results were hidden (as a too-aggressive compaction would)
    hidden = [tr.messages[0], tr.messages[1], _result(0, "[cleared]"), tr.messages[3], _result(1, "[cleared]")]
    probe.respond({"messages": hidden})  # reply: edit src/cli/util.py, strict_mode=True, strict_mode=False
    # references in call 3: src/cli/util.py (visible in call 2's input), strict_mode (hidden: only in the read result)
    assert probe.per_request == [(0, 0), (1, 1), (2, 1)]
    assert probe.references == 3 and probe.recalled == 2 and probe.recall == pytest.approx(2 / 3)


def _brute_force(tr: Trace, window_tokens: int) -> float:
    """The oracle's family by enumeration: every subset of compaction turns."""
    best = math.inf
    k = tr.turns
    for bits in itertools.product([0, 1], repeat=k):
        cost = _schedule_cost(tr, [i for i, b in enumerate(bits) if b], window_tokens)
        best = min(best, cost)
    return best


def _schedule_cost(tr: Trace, compact_at: list[int], window_tokens: int) -> float:
    return schedule_cost(tr, get_model("claude-opus-5"), window_tokens, 10, compact_at)


def test_oracle_matches_brute_force_on_small_traces() -> None:
    for seed in range(3):
        tr = synthetic_trace(seed)
        tr = Trace(name=tr.name, source=tr.source, format=tr.format, system=tr.system, tools=tr.tools,
                   messages=tr.messages[: 2 * 7 + 1], timestamps=tr.timestamps[: 2 * 7 + 1],
                   usage=tr.usage[: 2 * 7 + 1])
        res = oracle_cost(tr, get_model("claude-opus-5"), 200_000, 10)
        assert res.feasible
        assert res.cost_usd == pytest.approx(_brute_force(tr, 200_000), rel=1e-9)


def test_oracle_is_infeasible_when_nothing_fits() -> None:
    tr = synthetic_trace(1)
    assert not oracle_cost(tr, get_model("claude-opus-5"), 1_000, 10).feasible


def test_window_20_requests_are_always_valid() -> None:
    tr = synthetic_trace(2)
    transform = window(20)
    for n in range(1, len(tr.messages) + 1, 2):
        validate_messages(transform({"messages": tr.messages[:n]})["messages"])


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_every_strategy_replays_a_synthetic_trace(strategy: str) -> None:
    tr = synthetic_trace(4)
    r = replay(tr, strategy)
    assert r.completed, r.failure
    assert len(r.token_series) == tr.turns and r.cost_usd > 0
    assert r.cost_series == sorted(r.cost_series)
    assert 0 <= r.recall <= 1 and 0 <= r.hit_rate <= 1


def test_bench_cli_end_to_end_and_bad_traces(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "traces"
    good.mkdir()
    for seed in (3, 10):
        t = synthetic_trace(seed)
        (good / f"s{seed}.json").write_text(json.dumps({"system": t.system, "tools": t.tools,
                                                        "messages": t.messages}))
    (good / "broken.json").write_text('{"messages": [{"role": "user", "content": "x"}')  # truncated
    (good / "weird.json").write_text('{"hello": 1}')
    out = tmp_path / "out"
    rc = main(["bench", str(good), "--strategy", "none", "--strategy", "cachecompact", "--out", str(out),
               "--workers", "1", "--window", "60000"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "skipped" in printed and "broken.json" in printed and "weird.json" in printed
    data = json.loads((out / "results.json").read_text())
    assert {r["strategy"] for r in data["results"]} == {"none", "cachecompact"}
    assert len(data["skipped"]) == 2 and all(s["reason"] for s in data["skipped"])
    assert all(r["completed"] for r in data["results"])
    report = (out / "report.md").read_text()
    assert "## Skipped files" in report and "cachecompact bench" in report
    assert list(out.glob("*.png"))
    assert main(["bench", str(good), "--strategy", "magic", "--out", str(out)]) == 2


def test_synthetic_corpus_is_chosen_explicitly() -> None:
    from cachecompact.bench.run import load_corpus

    traces, skipped, label = load_corpus([], synthetic=3)
    assert [t.name for t in traces] == ["synthetic-0000", "synthetic-0001", "synthetic-0002"]
    assert not skipped and "synthetic corpus (3 traces" in label
