"""The forensics engine class by class (on request bodies, billed by the emulator), the log
levels of its findings, the in-text summaries for models that refuse forced tools, and
`cachecompact forensics` on recorded logs."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import anthropic
import pytest

from cachecompact.base.tokens import TokenCounter
from cachecompact.cache.forensics import Finding, Forensics, snapshot_from_sim
from cachecompact.cache.simulator import request_from_body
from cachecompact.compaction.summarize.llm import LLMSummarizer, SummaryRequest
from cachecompact.tools.cli import main
from cachecompact.tools.emulator import CLOCK_HEADER, Emulator

MODEL = "claude-sonnet-4-6"
CC = {"type": "ephemeral"}
SYSTEM = [{"type": "text", "text": "You are a careful agent. " * 300, "cache_control": CC}]


def _msgs(n: int, mark: bool = True) -> list[dict[str, Any]]:
    """n user turns with replies between them; each call extends the previous one, as an agent's do."""
    out: list[dict[str, Any]] = []
    for k in range(n):
        if k:
            out.append({"role": "assistant", "content": [{"type": "text", "text": f"ok {k - 1}"}]})
        out.append({"role": "user", "content": [{"type": "text", "text": f"step {k} " + "output line\n" * 150}]})
    if mark:
        out[-1] = {"role": "user", "content": [{**out[-1]["content"][0], "cache_control": CC}]}
    return out


class Run:
    """Bodies through the emulator, and the same bodies through `Forensics` with the usage billed."""

    def __init__(self, emu: Emulator) -> None:
        self.client = anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0)
        self.f = Forensics()
        self.counter = TokenCounter()

    def send(self, t: float, **body: Any) -> Finding:
        body = {"model": MODEL, "max_tokens": 10, "system": SYSTEM, **body}
        resp = self.client.messages.create(**body, extra_headers={CLOCK_HEADER: str(t)})
        req = request_from_body(body, t, self.counter)
        return self.f.observe(snapshot_from_sim(req, body), resp.usage.model_dump())


@pytest.fixture
def run() -> Any:
    with Emulator() as emu:
        yield Run(emu)


def test_read_as_expected_then_every_class(run: Run) -> None:
    assert run.send(0, messages=_msgs(3)).cls == "read_as_expected"
    assert run.send(10, messages=_msgs(4)).cls == "read_as_expected"
    # a changed earlier message: churn, named, with excerpts
    edited = _msgs(5)
    edited[2]["content"][0]["text"] = "step 1 EDITED " + edited[2]["content"][0]["text"]
    f = run.send(20, messages=edited)
    assert f.cls == "prefix_churn" and f.location == "messages[2].content[0]" and f.actionable
    assert "EDITED" in (f.after or "") and f.wasted_usd > 0
    # idle longer than the TTL
    assert run.send(30, messages=_msgs(6)).cls in ("prefix_churn", "read_as_expected")
    assert run.send(400, messages=_msgs(6)).cls == "ttl_expiry"
    # another model
    assert run.send(410, model="claude-opus-4-8", messages=_msgs(6)).cls == "invalidation"


def test_an_image_added_to_the_conversation_is_an_invalidation(run: Run) -> None:
    """The presence of images is part of the messages' cache key (the documented invalidation
    table). The simulator knew, but a snapshot of a plain request body never asked it: a person
    pasting a screenshot into a Claude Code session (one 2026 log) was `provider_suspected`."""
    png = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==")
    assert run.send(0, messages=_msgs(3)).cls == "read_as_expected"
    shot = _msgs(4, mark=False)
    shot[-1] = {"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                          "data": png}},
                                            {**shot[-1]["content"][0], "cache_control": CC}]}
    f = run.send(10, messages=shot)
    assert f.cls == "invalidation" and f.read < f.expected, f


def test_mixed_ttls_a_1h_prefix_outliving_its_5m_tail_is_ttl_expiry(run: Run) -> None:
    # a 1h breakpoint on the system prompt, 5m on the messages: after 10 idle minutes only the
    # 5m entry is gone, the 1h one is read, and that is the TTL at work, not the provider
    system = [{**SYSTEM[0], "cache_control": {"type": "ephemeral", "ttl": "1h"}}]
    assert run.send(0, system=system, messages=_msgs(3)).cls == "read_as_expected"
    f = run.send(600, system=system, messages=_msgs(4))
    assert f.cls == "ttl_expiry" and "the 1h entry" in f.detail and f.read > 0, f.detail
    assert run.send(610, system=system, messages=_msgs(5)).cls == "read_as_expected"


def test_lookback_miss_when_the_only_breakpoint_moved_too_far(run: Run) -> None:
    run.send(0, messages=_msgs(2))
    far = _msgs(16)  # 28 new blocks after the cached end, and the marker only at the end
    f = run.send(10, messages=far)
    assert f.cls == "lookback_miss" and f.actionable and "positions behind" in f.detail


def test_below_minimum_and_tools_reordered(run: Run) -> None:
    short = [{"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": CC}]}]
    run.send(0, system="s", messages=short)
    assert run.send(5, system="s", messages=short).cls in ("read_as_expected", "below_minimum")
    tools = [{"name": n, "description": "x " * 400, "input_schema": {"type": "object"}} for n in "abc"]
    run.send(20, tools=tools, messages=_msgs(2))
    f = run.send(30, tools=list(reversed(tools)), messages=_msgs(3))
    assert f.cls == "prefix_churn" and f.location == "tools[0]" and "reordered" in f.detail


def test_provider_suspected_when_nothing_explains_a_miss() -> None:
    f = Forensics()
    counter = TokenCounter()
    body = {"model": MODEL, "max_tokens": 10, "system": SYSTEM, "messages": _msgs(3)}
    total = sum(b.tokens for b in request_from_body(body, 0, counter).blocks)
    f.observe(snapshot_from_sim(request_from_body(body, 0, counter), body),
              {"input_tokens": 0, "cache_creation_input_tokens": total, "cache_read_input_tokens": 0})
    again = f.observe(snapshot_from_sim(request_from_body(body, 10, counter), body),  # same body, 10 s later
                      {"input_tokens": 0, "cache_creation_input_tokens": total, "cache_read_input_tokens": 0})
    assert again.cls == "provider_suspected" and not again.actionable and again.wasted_usd > 0


def test_findings_are_logged_at_the_level_they_deserve(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from cachecompact import wrap

    with Emulator() as emu, caplog.at_level(logging.DEBUG, logger="cachecompact"):
        c = wrap(anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0), store=tmp_path, summarizer=None)
        sys_a = "You are careful. " * 300
        for k, system in enumerate([sys_a, sys_a, "Date: today. " + sys_a]):
            c.messages.create(model=MODEL, max_tokens=10, system=system, messages=_msgs(2 + k, mark=False),
                              extra_headers={"x-cachecompact-session": "levels", CLOCK_HEADER: str(10 * k)})
    misses = [r for r in caplog.records if "cache_miss" in r.getMessage()]
    assert misses and all(r.levelno == logging.WARNING for r in misses if "prefix_churn" in r.getMessage())


def test_in_text_summaries_for_models_that_refuse_forced_tools() -> None:
    req = SummaryRequest(messages=[{"role": "user", "content": "Fix the bug in parser.py"},
                                   {"role": "assistant", "content": "The bug is in parse_args; fixed it."}],
                         goal="Fix the bug in parser.py", previous_open_issues=[])
    with Emulator() as emu:
        c = anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0)
        with pytest.raises(anthropic.BadRequestError, match="tool_choice"):  # the emulator refuses, as the API does
            c.messages.create(model="claude-sonnet-5-5", max_tokens=100, messages=[{"role": "user", "content": "x"}],
                              tools=[{"name": "t", "input_schema": {"type": "object"}}],
                              tool_choice={"type": "tool", "name": "t"})
        res = LLMSummarizer(c, model="claude-sonnet-5-5", mode="forced-tool").summarize(req)
        assert res.mode == "in-text" and res.summary.task_goal.startswith("Fix the bug") and res.cost_usd > 0
        assert LLMSummarizer(c, model="claude-haiku-4-5", mode="forced-tool").summarize(req).mode == "forced-tool"
        assert all(r.get("status") == 200 for r in emu.requests[1:])


def test_forensics_command_on_recorded_logs(shared_traces: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["forensics", str(shared_traces / "claude-code")]) == 0
    out = capsys.readouterr().out
    assert "calls with usage" in out and "provider_suspected" in out and "ttl_expiry" in out
    # no Claude Code log there: one line per file and why, then exit 2 (no report of nothing)
    assert main(["forensics", str(shared_traces / "mini-swe-agent")]) == 2


def test_our_own_compactions_are_their_own_class_never_a_cache_miss(tmp_path: Path) -> None:
    """Issue 37: each deliberate compaction arrived at ``on_event`` as a ``cache_miss`` of class
    ``prefix_churn`` (46 in one run), and the report priced its re-write as if the previous,
    uncompacted prompt had been re-written. Now it is a ``compaction_rewrite`` event and class,
    priced at what the request actually paid: its written tokens x (write - read)."""
    import cachecompact
    from cachecompact.base.events import Event
    from cachecompact.base.pricing import priced
    from cachecompact.cache.forensics import is_compaction_rewrite, rewrite_cost
    from cachecompact.store import FileStore
    from cachecompact.tools.session_report import session_data, session_report

    events: list[Event] = []
    system = "You are a careful agent. " * 300
    with Emulator() as emu:
        client = cachecompact.wrap(anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0), store=tmp_path,
                                   summarizer=None, session_id="job", window_tokens=40_000, on_event=events.append)
        msgs: list[dict[str, Any]] = [{"role": "user", "content": "Audit every file."}]
        for t in range(40):
            client.messages.create(model=MODEL, max_tokens=200, system=system, messages=msgs,
                                   extra_headers={CLOCK_HEADER: str(10.0 * t)})
            tid = f"toolu_{t:03d}"
            msgs += [{"role": "assistant", "content": [{"type": "tool_use", "id": tid, "name": "read_file",
                                                        "input": {"path": f"f{t}.py"}}]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tid, "content": "\n".join(
                         f"line {t}.{j}: value = {j * t}" for j in range(200))}]}]
    rewrites = [e for e in events if e.kind == "compaction_rewrite"]
    assert rewrites, [e.kind for e in events]
    assert [e for e in events if e.kind == "cache_miss" and e.detail.get("explained_by") is not None] == []
    session = cachecompact.Session.open(FileStore(tmp_path), "job", readonly=True)
    recs = [r for _, r in session.store.read_all("requests")] if session.store else []
    ours = [r for r in recs if is_compaction_rewrite(r.get("finding") or {})]
    assert len(ours) == len(rewrites) and all(r["finding"]["cls"] == "compaction_rewrite" for r in ours)
    paid = 0.0
    for r in ours:
        u = r["usage"]
        p = priced(MODEL).at(sum(int(u.get(k) or 0) for k in ("input_tokens", "cache_read_input_tokens",
                                                              "cache_creation_input_tokens")))
        expected = int(u["cache_creation_input_tokens"]) * (p.write_5m - p.read) / 1e6
        assert r["finding"]["wasted_usd"] == pytest.approx(expected, rel=1e-9)
        assert rewrite_cost(priced(MODEL), u)[1] == pytest.approx(expected, rel=1e-9)
        paid += expected
    d = session_data(session)
    assert d["compaction_rewrites"]["requests"] == len(ours)
    assert d["compaction_rewrites"]["usd"] == pytest.approx(paid, rel=1e-9)
    assert "compaction_rewrite" not in d["misses"]
    text = session_report(session)
    assert "compaction re-write (ledger entry #" in text and "prefix_churn" not in text


def test_an_image_pasted_into_a_wrapped_session_is_an_invalidation() -> None:
    """The same rule for a request cachecompact rendered: its snapshot said "no image" always, so a
    replayed 2026 session that pasted a screenshot logged a `provider_suspected` warning ("nothing
    changed ... yet 0 of 39862 expected tokens were read") where the image had flipped the key."""
    import cachecompact

    png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
    events: list[Any] = []
    with Emulator() as emu:
        client = cachecompact.wrap(anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0), store=None,
                                   on_event=events.append)
        msgs = _msgs(3, mark=False)
        for k in range(3):
            if k == 2:  # a screenshot in the person's next message
                msgs[-1] = {"role": "user", "content": [
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png}},
                    *msgs[-1]["content"]]}
            r = client.messages.create(model=MODEL, max_tokens=10, system=SYSTEM, messages=msgs,
                                       extra_headers={CLOCK_HEADER: str(10 * k)})
            msgs += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]},
                     {"role": "user", "content": [{"type": "text", "text": f"next {k} " + "line\n" * 100}]}]
    misses = [e for e in events if e.kind == "cache_miss"]
    assert [e.detail.get("cls") for e in misses] == ["invalidation"], [(e.reason, e.detail) for e in misses]
