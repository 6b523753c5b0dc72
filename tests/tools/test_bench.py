"""Benchmark pieces: evidence recall on a hand-checked trace, the re-read charge, the oracle
against `none`, every registered strategy at both windows, the closed-loop tasks, the halves,
and `cachecompact bench` end to end."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from cachecompact.base.identifiers import digest, identifiers
from cachecompact.base.pricing import get_model
from cachecompact.compaction.catalog import strategy_names
from cachecompact.tools.bench._oracle import oracle_cost
from cachecompact.tools.bench._recall import REREAD_OUTPUT_TOKENS, RecallProbe, reread_cost
from cachecompact.tools.bench._tasks import STEP_ATTEMPTS, TaskScript, make_task, run_task
from cachecompact.tools.bench.bench_report import TRACE_LEGEND, WIDTH
from cachecompact.tools.bench.harness import replay
from cachecompact.tools.bench.run import load_corpus, split_halves
from cachecompact.tools.cli import main
from cachecompact.tools.emulator import ReplayResponder
from cachecompact.tools.traces import Trace, synthetic_trace

MODEL = "claude-sonnet-4-6"


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


def test_evidence_recall_is_counted_by_hand_and_a_name_is_not_evidence() -> None:
    tr = small_trace()
    probe = RecallProbe(ReplayResponder(tr.messages))
    probe.respond({"messages": tr.messages[:1]})  # grep(parse_args): no earlier tool result -> no reference
    probe.respond({"messages": tr.messages[:3]})  # read src/cli/util.py: its grep line is visible
    # third request: both results hidden, but a digest still *names* the identifiers
    hidden = [tr.messages[0], tr.messages[1], _result(0, "[cleared: src/cli/util.py parse_args]"),
              tr.messages[3], _result(1, "[cleared: strict_mode ArgParser]")]
    probe.respond({"messages": hidden})  # edit src/cli/util.py with strict_mode
    # call 3 refers to src/cli/util.py and strict_mode; both were named, neither evidence line is visible
    assert probe.per_request == [(0, 0), (1, 1), (2, 0)]
    assert probe.references == 3 and probe.recalled == 1 and probe.recall == pytest.approx(1 / 3)
    assert probe.named == 3 and probe.name_recall == 1.0
    # one re-read charged per lost tool result, at the request where it was first lost
    assert sorted(src for _, src in probe.rereads) == sorted({tok for _, tok in probe.rereads})
    assert [k for k, _ in probe.rereads] == [2, 2]


def test_reread_turn_is_priced_as_documented() -> None:
    p = get_model(MODEL)
    got = reread_cost(p, context_tokens=100_000, evidence_tokens=3_000)
    assert got == pytest.approx((100_000 * p.read + 3_000 * p.write_5m + REREAD_OUTPUT_TOKENS * p.output) / 1e6)


@pytest.mark.parametrize("seed", [1, 2])
def test_oracle_is_never_above_none_under_the_emulators_billing(seed: int) -> None:
    tr = synthetic_trace(seed)
    none = replay(tr, "none", model=MODEL, window=200_000)
    o = oracle_cost(tr, get_model(MODEL), 200_000, 4096)
    assert o.feasible and none.completed
    # the DP's schedule is billed as the emulator bills; `none` is in the family
    assert min(o.cost_usd, none.cost_usd) <= none.cost_usd
    assert o.cost_usd == pytest.approx(none.cost_usd, rel=1e-9) or o.compactions > 0


def test_oracle_is_infeasible_when_nothing_fits() -> None:
    assert not oracle_cost(synthetic_trace(1), get_model(MODEL), 1_000, 10).feasible


@pytest.mark.slow
@pytest.mark.parametrize("window", [200_000, 50_000])
@pytest.mark.parametrize("strategy", strategy_names())
def test_every_registered_strategy_replays_at_both_windows(strategy: str, window: int) -> None:
    tr = synthetic_trace(4)
    r = replay(tr, strategy, model=MODEL, window=window)
    assert r.completed or r.failure, "a failed trace carries its reason"
    if strategy == "cachecompact" or window == 200_000:
        assert r.completed, r.failure
    if r.completed:  # the recorded calls, and the closed loop's re-runs (one call a request)
        assert len(r.token_series) == tr.turns + r.reruns == r.requests and r.cost_usd > 0
        assert max(r.token_series) + 4096 <= window or strategy == "none"
    assert r.cost_series == sorted(r.cost_series)
    assert 0 <= r.evidence_recall <= 1 and 0 <= r.name_recall <= 1 and 0 <= r.hit_rate <= 1
    assert r.adjusted_cost_usd >= r.cost_usd


def test_tasks_are_deterministic_and_the_script_acts_on_what_it_sees() -> None:
    a, b = make_task(3), make_task(3)
    assert a.files == b.files and a.steps == b.steps and a.quotes > 0
    assert make_task(4).steps != a.steps
    script = TaskScript(a)
    key = next(arg for kind, arg in a.steps if kind == "quote")
    fact = a.facts[key]
    script.step = a.steps.index(("quote", key))
    # the fact line is not in the request: the model re-runs the tool that produced it
    r = script.respond({"messages": [{"role": "user", "content": "nothing here"}]})
    assert script.rereads == 1 and r.content[-1]["input"] == {"path": fact.path}
    # visible verbatim (in a result, a summary or a preview): the step proceeds
    r = script.respond({"messages": [{"role": "user", "content": f"summary: {fact.line}"}]})
    assert r.content[-1]["name"] == "record" and r.content[-1]["input"]["value"] == fact.value
    # hidden for every attempt: the task fails with its reason
    s2 = TaskScript(a)
    s2.step = script.step
    for _ in range(STEP_ATTEMPTS):
        s2.respond({"messages": [{"role": "user", "content": "nothing"}]})
    assert s2.failed and "re-reads" in s2.failed


def test_a_task_passes_with_room_and_loses_facts_without_it() -> None:
    task = make_task(1)
    roomy = run_task(task, "none", model=MODEL, window=1_000_000)
    assert roomy.passed and roomy.rereads == 0 and roomy.turns >= len(task.steps)
    tight = run_task(task, "window-20", model=MODEL, window=50_000)
    assert tight.rereads > 0 and tight.cost_usd > 0


def test_halves_are_deterministic_and_keep_groups_together() -> None:
    traces = [synthetic_trace(s) for s in range(8)]
    h = split_halves(traces)
    assert h == split_halves(list(reversed(traces)))
    assert set(h.values()) == {"A", "B"}
    # a resumed session shares its long messages with the original: same half
    t = traces[0]
    resumed = Trace(name="resumed", source=t.source, format=t.format, system=t.system, tools=t.tools,
                    messages=t.messages[:41], timestamps=t.timestamps[:41], usage=t.usage[:41])
    assert any(len(str(m)) > 400 for m in resumed.messages)
    h2 = split_halves([*traces, resumed])
    assert h2["resumed"] == h2[t.name]


def test_bench_cli_end_to_end_and_bad_traces(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "traces"
    good.mkdir()
    for seed in (3, 10):
        t = synthetic_trace(seed)
        (good / f"s{seed}.json").write_text(json.dumps({"system": t.system, "tools": t.tools,
                                                        "messages": t.messages}))
    (good / "broken.json").write_text('{"messages": [{"role": "user", "content": "x"}')  # truncated
    (good / "weird.json").write_text('{"hello": 1}')
    hostile = {"messages": [{"role": "user", "content": "go"}, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "../../../tmp/pwned", "name": "bash", "input": {}}]}]}
    (good / "pathid.json").write_text(json.dumps(hostile))
    (good / "nocontent.json").write_text(json.dumps({"messages": [{"role": "user", "content": "go"},
                                                                  {"role": "assistant"}]}))
    out = tmp_path / "out"
    rc = main(["bench", str(good), "--strategy", "none", "--strategy", "cachecompact", "--out", str(out),
               "--workers", "1", "--window", "60000", "--no-tasks", "--strategy", "none", "--window", "60000"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "skipped" in printed and "broken.json" in printed and "weird.json" in printed
    assert "pathid.json: not a valid conversation: messages[1].content[0].id" in printed
    assert "all traces (none has 50+ turns), all (2 traces)" in printed  # short traces still get a table
    assert "nocontent.json: not a valid conversation: messages[1].content: missing" in printed
    data = json.loads((out / "results.json").read_text())
    assert {r["strategy"] for r in data["results"]} == {"none", "cachecompact"}
    assert len(data["results"]) == 4 and data["windows"] == [60_000]  # repeated flags add, each once
    assert len(data["skipped"]) == 4 and all(s["reason"] for s in data["skipped"])
    assert all(r["completed"] for r in data["results"] if r["strategy"] == "cachecompact")
    report = (out / "report.md").read_text()
    assert "## Skipped files" in report and "cachecompact bench" in report
    # the terminal table fits 120 columns with its legend under it; report.md keeps every column
    table = [ln for ln in printed.splitlines() if ln.startswith(("strategy ", "none ", "cachecompact ", "--------"))]
    assert len(table) >= 4 and max(map(len, table)) <= WIDTH
    assert printed.count(TRACE_LEGEND) >= 1 and len(TRACE_LEGEND) <= WIDTH
    assert "| vs oracle |" in report and "| peak tok |" in report and TRACE_LEGEND in report
    # the last screen ends with the verdict and one short line of where the files went (issue 50)
    last = printed.rstrip().splitlines()
    assert last[-1] == f"wrote results.json, report.md and 2 plots to {out}/"
    assert last[-3] == "verdict (adjusted cost, long traces):"
    assert last[-2].startswith("window 60,000: cachecompact ") and "x 'none' at recall " in last[-2]
    # bad arguments are one-line errors before any work
    assert main(["bench", str(good), "--strategy", "magic", "--out", str(out)]) == 2
    assert main(["bench", str(good), "--window", "-5", "--out", str(out)]) == 2
    assert main(["bench", str(good), "--out", "/proc/x/y"]) == 2
    err = capsys.readouterr().err
    assert "magic" in err and "window" in err and "/proc/x/y" in err and "Traceback" not in err
    # nothing loadable, or nothing there: one line naming why, before any run (no task suite first)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["bench", str(empty), "--out", str(tmp_path / "o2"), "--strategy", "none"]) == 2
    assert "no .json or .jsonl files there" in capsys.readouterr().err
    (empty / "bad.json").write_text("{")
    assert main(["bench", str(empty), "--out", str(tmp_path / "o2"), "--strategy", "none"]) == 2
    err = capsys.readouterr().err
    assert "bad.json: not valid JSON" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o2" / "results.json").exists()
    assert main(["bench", str(tmp_path / "missing"), "--out", str(tmp_path / "o2")]) == 2
    assert "no such file or folder" in capsys.readouterr().err


def test_synthetic_corpus_is_chosen_explicitly() -> None:
    traces, skipped, label = load_corpus([], synthetic=3)
    assert [t.name for t in traces] == ["synthetic-0000", "synthetic-0001", "synthetic-0002"]
    assert not skipped and "synthetic corpus (3 traces" in label


def test_cheaper_than_ours_is_paired_over_the_traces_both_finished() -> None:
    # a peer that fails the expensive trace looks cheaper in totals; paired, it is not
    from cachecompact.tools.bench.bench_report import aggregate, cheaper_than_ours, dominated_by
    from cachecompact.tools.bench.harness import TraceResult
    from cachecompact.tools.bench.run import BenchResult

    def res(trace: str, strategy: str, cost: float, recall: float, done: bool = True) -> TraceResult:
        return TraceResult(trace=trace, strategy=strategy, window=50_000, turns=60, completed=done,
                           cost_usd=cost, adjusted_cost_usd=cost, evidence_recall=recall, references=100)

    results = [res("a", "none", 1.0, 1.0), res("b", "none", 9.0, 1.0, done=False),
               res("a", "cachecompact", 1.0, 0.95), res("b", "cachecompact", 9.0, 0.95),
               res("a", "peer", 1.1, 0.99), res("b", "peer", 0.0, 0.0, done=False),
               res("a", "cheap", 0.8, 0.5), res("b", "cheap", 7.0, 0.5)]
    b = BenchResult(model=MODEL, windows=[50_000], strategies=["none", "cachecompact", "peer", "cheap"],
                    traces=[{"name": n, "turns": 60} for n in ("a", "b")], results=results, oracle={})
    rows = {r["strategy"]: r for r in aggregate(b, 50_000)}
    assert rows["peer"]["adjusted_cost_usd"] < rows["cachecompact"]["adjusted_cost_usd"]  # totals mislead
    assert rows["peer"]["adjusted_vs_ours"] == pytest.approx(1.1)
    assert rows["cheap"]["adjusted_vs_ours"] == pytest.approx(7.8 / 10.0)
    assert cheaper_than_ours(list(rows.values())) == ["cheap (2 traces)"]
    assert dominated_by(list(rows.values())) == []  # cheap recalls less; peer costs more and finished fewer
    for r in results:  # no references at all: recall is 1.0 for everyone, and nothing breaks
        r.references = 0
    rows = {r["strategy"]: r for r in aggregate(b, 50_000)}
    assert rows["cheap"]["paired_recall"] == rows["cheap"]["paired_recall_ours"] == 1.0
    assert dominated_by(list(rows.values())) == []


def test_every_error_crosses_a_process_pool_intact() -> None:
    """bench runs traces in worker processes: an error raised there must arrive as itself."""
    import inspect
    import pickle

    from cachecompact.base import errors

    made = 0
    for _, cls in inspect.getmembers(errors, inspect.isclass):
        if not issubclass(cls, errors.CacheCompactError):
            continue
        params = [p for p in list(inspect.signature(cls.__init__).parameters.values())[1:]
                  if p.default is p.empty and p.kind is p.POSITIONAL_OR_KEYWORD]
        err = cls(*[3 if p.annotation in (int, "int") else f"<{p.name}>" for p in params])
        back = pickle.loads(pickle.dumps(err))
        def fields(e: BaseException) -> dict[str, object]:
            return {k: v for k, v in vars(e).items() if isinstance(v, (str, int, float, type(None)))}

        assert type(back) is cls and str(back) == str(err) and fields(back) == fields(err), cls.__name__
        made += 1
    assert made >= 15


def test_the_recall_frontier_bounds_what_recency_can_reach(monkeypatch: pytest.MonkeyPatch) -> None:
    """benchmarks/recall_frontier.py: showing all history, the ideal recalls what `none` recalls
    and costs no more than `none` as the emulator bills it; a cycle shows a superset of the ideal's
    tail, so it recalls at least as much and costs at least as much; a larger budget recalls more."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "recall_frontier.py"
    spec = importlib.util.spec_from_file_location("recall_frontier", path)
    assert spec is not None and spec.loader is not None
    frontier = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, frontier)  # its dataclass looks itself up there
    spec.loader.exec_module(frontier)
    trace = synthetic_trace(3)
    # what real traces carry: thinking the replay never sends, and a clock that steps back
    for m in trace.messages:
        if m["role"] == "assistant" and isinstance(m["content"], list):
            m["content"] = [{"type": "thinking", "thinking": "Let me think. " * 200, "signature": "sig"},
                            *m["content"]]
    trace.timestamps[20] = (trace.timestamps[19] or 0.0) - 1_000.0
    runs = frontier.ideal_runs(trace, 200_000)
    none = replay(trace, "none", window=200_000, model=MODEL)
    everything = runs[(10**9, "ideal")]
    assert everything.references == none.references > 0
    assert everything.recalled == round(none.evidence_recall * none.references)
    assert everything.cost <= none.cost_usd
    budgets = sorted(b for b, v in runs if v == "ideal")
    recalls = [runs[(b, "ideal")].recalled for b in budgets]
    assert recalls == sorted(recalls) and recalls[0] < recalls[-1]
    cycles = [b for b, v in runs if v == "cycle"]
    assert cycles
    for b in cycles:
        assert runs[(b, "cycle")].recalled >= runs[(b, "ideal")].recalled
        assert runs[(b, "cycle")].cost >= runs[(b, "ideal")].cost


@pytest.mark.slow
def test_each_trace_is_priced_by_its_recorded_model_and_runs_at_its_own_window() -> None:
    from msgspec.structs import replace

    from cachecompact.tools.bench.bench_report import aggregate
    from cachecompact.tools.bench.run import OWN_WINDOW, run_bench, trace_model
    from cachecompact.tools.traces import synthetic_trace

    t = synthetic_trace(0)
    assert trace_model(t) == "claude-sonnet-4-6"  # nothing recorded: the fallback
    assert trace_model(replace(t, model="claude-opus-4-6")) == "claude-opus-4-6"
    assert trace_model(replace(t, model="claude-opus-4-5-20251101")) == "claude-opus-4-5"
    assert trace_model(replace(t, model="deepseek-reasoner")) == "claude-sonnet-4-6"
    opus = replace(t, name="opus", model="claude-opus-4-6")  # a 1M window
    haiku = replace(t, name="haiku", model="claude-haiku-4-5")  # a 200k window, run once for both tables
    res = run_bench([], ["none"], windows=[OWN_WINDOW, 200_000], tasks=False, progress=False, workers=1,
                    corpus=[opus, haiku])
    by = {(r.trace, r.window_key): r for r in res.results}
    assert by[("opus", OWN_WINDOW)].window == 1_000_000 and by[("opus", OWN_WINDOW)].model == "claude-opus-4-6"
    assert by[("haiku", OWN_WINDOW)].window == 200_000 and by[("haiku", 200_000)].cost_usd == \
        by[("haiku", OWN_WINDOW)].cost_usd
    assert sum(1 for r in res.results if r.trace == "haiku") == 2  # one run, shown in both tables
    assert {t["name"]: t["model"] for t in res.traces} == {"opus": "claude-opus-4-6", "haiku": "claude-haiku-4-5"}
    rows = {r["strategy"]: r for r in aggregate(res, OWN_WINDOW, long_only=False)}
    assert rows["none"]["completed"] == 2 and 0 <= rows["none"]["rewrite_share"] < 1


def test_runs_that_do_not_finish_are_listed_with_their_whole_reason(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 37: the terminal said only "done 0/4", and results.json cut the reason at 160
    characters ("... must b"). Every run that did not finish is now listed, once, with the
    request it stopped at and the whole reason, on the terminal and in report.md."""
    d = tmp_path / "traces"
    d.mkdir()
    t = synthetic_trace(3)
    (d / "s3.json").write_text(json.dumps({"system": t.system, "tools": t.tools, "messages": t.messages}))
    out = tmp_path / "out"
    assert main(["bench", str(d), "--strategy", "none", "--strategy", "cachecompact", "--out", str(out),
                 "--workers", "1", "--window", "8000", "--no-tasks"]) == 0
    printed = capsys.readouterr().out
    data = json.loads((out / "results.json").read_text())
    (failed,) = [r for r in data["results"] if not r["completed"]]
    assert failed["strategy"] == "none" and failed["failure"].startswith("request ")
    why = failed["failure"].rstrip()
    # whole: our refusal, or (the prompt fits, its max_tokens does not: issue 62) the API's own 400 as it came
    assert ("context full" in why and why.endswith("start a new session")) or \
        ("exceed context limit" in why and why.endswith("try again")), why
    flat = " ".join(printed.split())
    line = f"none at 8,000 tokens on {failed['trace']}: {failed['failure']}"
    assert "runs that did not finish" in flat and line in flat
    assert f"- {line}" in (out / "report.md").read_text()


def _thinking_trace(seed: int) -> Trace:
    """A synthetic session whose assistant turns carry recorded thinking, as 2026 logs do: omitted
    text, a signature the emulator cannot verify, tokens only in the recorded usage."""
    from msgspec.structs import replace

    t = synthetic_trace(seed)
    msgs, usage = [], []
    for k, m in enumerate(t.messages):
        if m["role"] == "assistant":
            blocks = m["content"] if isinstance(m["content"], list) else [{"type": "text", "text": m["content"]}]
            m = {**m, "content": [{"type": "thinking", "thinking": "", "signature": f"EqRec{seed}x{k}"}, *blocks]}
            usage.append({"output_tokens": 400, "input_tokens": 10})
        else:
            usage.append(None)
        msgs.append(m)
    return replace(t, name=f"thinking{seed}", messages=msgs, usage=usage)


def test_as_model_replays_recorded_thinking_under_todays_rules(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 38: recorded thinking goes back into the replay, bound where it is first sent and
    billed from the recorded usage; every strategy runs under the same rules; the new columns
    are measured by the emulator, not by the product's own accounting."""
    from cachecompact.tools.bench.bench_report import THINKING_LEGEND
    from cachecompact.tools.bench.run import run_bench

    corpus = [_thinking_trace(s) for s in (1, 2)]
    res = run_bench([], ["cachecompact", "none", "anthropic-ondemand", "openhands"], windows=[40_000],
                    tasks=False, progress=False, workers=1, corpus=corpus, model="claude-opus-5-5")
    by = {(r.trace, r.strategy): r for r in res.results}
    for t in corpus:
        ours, none = by[(t.name, "cachecompact")], by[(t.name, "none")]
        assert ours.completed and ours.refused == 0
        # a drop only where the window forced an edit mid tool loop: the loop's latest turn goes back whole
        # under drop_block (the documented escape hatch; leaving its thinking out is not documented as valid)
        assert ours.thinking_dropped == ours.thinking_dropped_latest <= 3
        assert ours.model == "claude-opus-5-5" and ours.thinking_issued_tokens > 0
        # it compacted, and the API wrote its summaries (Opus 5.5 supports on-demand compaction): the kept
        # turns' thinking stays valid; only an edit of ours (L1/L2) before a turn costs that turn's reasoning
        assert sum(ours.compactions.values()) > 0 and ours.summary_cost_usd > 0
        assert ours.reasoning_kept >= 0.95, ours.reasoning_kept
        if none.completed:  # the whole history: every recorded block goes back valid
            assert none.reasoning_kept == 1.0 and none.thinking_stripped == 0
        od = by[(t.name, "anthropic-ondemand")]
        assert od.refused == 0 and od.thinking_dropped == 0
        if od.completed:
            assert od.summary_cost_usd > 0  # the API wrote the summaries, billed as such
            assert od.reasoning_kept == 1.0  # "the thinking in kept turns can stay valid"
    # the terminal defines each new column
    d = tmp_path / "traces"
    d.mkdir()
    for t in corpus:
        (d / f"{t.name}.json").write_text(json.dumps({"system": t.system, "tools": t.tools, "messages": t.messages}))
    assert main(["bench", str(d), "--strategy", "cachecompact", "--as-model", "claude-opus-5-5", "--out",
                 str(tmp_path / "out"), "--workers", "1", "--window", "40000", "--no-tasks"]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "reasoning" in printed and " ".join(THINKING_LEGEND.split()) in printed
    assert "claude-opus-5-5" in printed


def _hiding_trace() -> Trace:
    """A grep whose result a later edit names, after enough large reads that a small window
    must hide the grep's result: the closed-loop agent has to run the grep again."""
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "Fix the crash in the parser"},
                                  _call(0, "grep", {"pattern": "parse_args"}),
                                  _result(0, "src/cli/util.py:3: def parse_args(argv, strict_mode_flag_x9):")]
    for k in range(1, 13):  # more reads than masking keeps verbatim (10)
        msgs += [_call(k, "read_file", {"path": f"src/big_{k}.py"}), _result(k, f"line of big file {k}\n" * 300)]
    msgs += [_call(13, "edit_file", {"path": "src/cli/util.py", "old": "strict_mode_flag_x9", "new": "x"}),
             _result(13, "ok"), {"role": "assistant", "content": "Done."}]
    return Trace(name="hand/hiding", source="test", format="anthropic", messages=msgs,
                 timestamps=[float(i) for i in range(len(msgs))], usage=[None] * len(msgs))


def test_the_closed_loop_reruns_what_a_strategy_hid_and_the_open_loop_only_charges_it() -> None:
    """Issue 47: the replayed agent acts on what each request shows. Where a strategy hid the
    grep result the final edit needs, the closed-loop agent runs the grep again (billed, and
    seen through the strategy) before it edits; the open loop goes on blind and charges a
    notional re-read turn. A strategy that hides nothing makes no re-run, and a replay is
    deterministic."""
    tr = _hiding_trace()
    closed = replay(tr, "masking", model=MODEL, window=40_000)
    again = replay(tr, "masking", model=MODEL, window=40_000)
    opened = replay(tr, "masking", model=MODEL, window=40_000, closed=False)
    assert closed.completed and closed.closed_loop and not opened.closed_loop
    assert closed.reruns >= 1 and closed.requests == tr.turns + closed.reruns and closed.loops == 0
    assert closed.evidence_recall == opened.evidence_recall < 1.0  # first sight: the same measure
    assert closed.cost_usd > opened.cost_usd  # the re-run is billed for real
    assert opened.rereads >= 1 and opened.adjusted_cost_usd > opened.cost_usd and opened.reruns == 0
    assert (closed.cost_usd, closed.reruns, closed.requests) == (again.cost_usd, again.reruns, again.requests)
    none = replay(tr, "none", model=MODEL, window=200_000)
    assert none.reruns == 0 and none.requests == tr.turns and none.evidence_recall == 1.0


def test_a_rerun_that_comes_back_hidden_is_a_loop() -> None:
    """A strategy that shortens every new large result as it arrives shows a re-run no better than
    the first result: each re-run that comes back hidden is a loop, counted, and after the
    attempts for one result the agent goes on without it (charged as lost)."""
    from cachecompact.tools.bench._agent import ATTEMPTS, ClosedLoopAgent

    tr = _hiding_trace()
    agent = ClosedLoopAgent(ReplayResponder(tr.messages, tr.usage))
    hidden = {"messages": [tr.messages[0], {"role": "user", "content": "nothing of the grep here"}]}
    replies = []
    for _ in range(ATTEMPTS + 2):  # the edit is due; its evidence never shows
        agent.inner._cursor = len(tr.messages) - 4  # the recorded edit is next
        replies.append(agent.respond(hidden))
    kinds = [r.content[0]["name"] for r in replies[:ATTEMPTS + 1]]
    assert kinds[:ATTEMPTS] == ["grep"] * ATTEMPTS and kinds[ATTEMPTS] == "edit_file"
    assert agent.reruns == ATTEMPTS and agent.loops >= ATTEMPTS - 1 and len(agent.lost) >= 1


def test_the_verdict_quotes_strategy_names_so_none_is_not_no_peer() -> None:
    """Issue 50: "Cheaper in adjusted cost alone: none (3 traces)" named the strategy `none` and
    read as "no peer"."""
    from cachecompact.tools.bench.bench_report import _quoted

    assert _quoted(["none (3 traces)", "claude-code (5 traces)"]) == "'none' (3 traces), 'claude-code' (5 traces)"
    assert _quoted(["openhands"]) == "'openhands'"
    assert _quoted([]) == "no peer"


def test_bench_refuses_an_unknown_as_model_before_any_replay(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                             ) -> None:
    """Issue 56: ``bench --as-model`` with an id the price table does not list ran every replay
    and exited 0, where `wrap()` refuses the same id. It is refused up front, exit 2, with the
    one-line nearest-id hint, and nothing is written."""
    out = tmp_path / "out"
    assert main(["bench", "--as-model", "claude-opus-9", "--out", str(out), "--no-tasks"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "unknown model 'claude-opus-9'" in err and "nearest: claude-opus-5" in err
    assert "Traceback" not in err and not (out.exists() and any(out.iterdir()))


def test_prefix_intact_compares_the_first_messages_as_the_caller_sent_them() -> None:
    from cachecompact.tools.bench._recall import prefix_intact

    rec = [{"role": "user", "content": "fix the bug"},
           {"role": "assistant", "content": [{"type": "text", "text": "ok"}]}, {"role": "user", "content": "go on"},
           {"role": "assistant", "content": "later"}]
    marked = [{"role": "user", "content": [{"type": "text", "text": "fix the bug",
                                            "cache_control": {"type": "ephemeral"}}]}, *rec[1:]]
    assert prefix_intact({"messages": marked}, rec)  # a cache marker and the block form change nothing
    assert prefix_intact({"messages": rec[:1]}, rec)  # as many as the request has so far
    summary = {"role": "assistant", "content": [{"type": "compaction", "content": "the user asked to fix a bug"}]}
    assert not prefix_intact({"messages": [summary, *rec[2:]]}, rec)  # an API-written summary stands in for them
    assert not prefix_intact({"messages": [{"role": "user", "content": "fix the bug!"}, *rec[1:]]}, rec)


@pytest.mark.slow
def test_the_bench_counts_requests_whose_first_messages_an_api_summary_replaced() -> None:
    """Issue 56, item 1: the closed-loop bench measures how often the task reached the model as
    the person gave it. Our own summaries never touch the immutable prefix; an API-written one
    stands in for it from the first summary on."""
    tr = synthetic_trace(4)
    own = replay(tr, "cachecompact-own-summaries", model="claude-opus-5-5", window=50_000)
    api = replay(tr, "cachecompact-api-summaries", model="claude-opus-5-5", window=50_000)
    assert own.completed and api.completed, (own.failure, api.failure)
    assert own.prefix_kept == 1.0 and own.compactions
    # no edit, 1.0: the prefix is what the caller sent, whose assistant turns are the replay's replies (a
    # recorded thinking block comes back with the emulator's signature), not the trace's
    msgs = [dict(m) for m in tr.messages]
    msgs[1] = {**msgs[1], "content": [{"type": "thinking", "thinking": "let me look",
                                       "signature": "EqQBCkgIARABGAIiQ" + "A" * 40}, *msgs[1]["content"]]}
    thinks = copy.copy(tr)
    thinks.messages = msgs
    assert replay(thinks, "none", model="claude-opus-5-5", window=200_000).prefix_kept == 1.0
    assert api.compactions and 0 < api.prefix_kept < 1.0, (api.compactions, api.prefix_kept)
