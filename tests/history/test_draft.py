"""Draft in, plan out (issue 49): a strategy plans against a `Draft` and returns data; the
session stores what it proposed, scratchpad content and ledger edits together."""

from __future__ import annotations

import ast
import dataclasses
import random
import warnings
from pathlib import Path
from typing import Any, ClassVar

import pytest

import cachecompact
from cachecompact.base.errors import StagedEditsConflictError
from cachecompact.base.events import EventBus
from cachecompact.base.refs import text_ref
from cachecompact.compaction.peers.openhands import OpenHandsCondenser, OpenHandsConfig
from cachecompact.compaction.strategy import LedgerStrategy, Plan, StrategyContext
from cachecompact.compaction.summarize.llm import ExtractiveSummarizer
from cachecompact.engine.request_cycle import CompactionEngine
from cachecompact.history.draft import Draft
from cachecompact.history.ledger import ReplaceWithSummary, SkipRange
from cachecompact.history.scratchpad import Scratchpad
from cachecompact.history.session import Session
from cachecompact.store import FileStore

from ..spec_verifier import verify as spec_verify

PKG = Path(cachecompact.__file__).parent
MODEL = "claude-sonnet-4-6"

# what writes: the session's own mutators and its store; a draft has none of them
WRITERS = {"store", "edit", "commit", "append", "sync", "record_request", "note_sent", "log_event", "put_blob",
           "repair_meta", "refresh", "renderer"}


def _history(rng: random.Random, turns: int) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "Fix the failing test in parser.py."}]
    for k in range(turns):
        tid = f"toolu_{k}"
        out = "\n".join(f"line {k}.{j} {rng.random():.6f}" for j in range(rng.randint(5, 400)))
        msgs += [{"role": "assistant", "content": [{"type": "tool_use", "id": tid, "name": "bash",
                                                    "input": {"command": f"step {k}"}}]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tid, "content": out}]}]
    return msgs


def test_a_draft_reads_and_proposes_but_cannot_write() -> None:
    """Nothing on a `Draft` writes: no store, no edit or commit, no transcript append; and the
    context a strategy is built with carries no `Session`."""
    public = {n for n in dir(Draft) if not n.startswith("_")}
    assert public.isdisjoint(WRITERS), public & WRITERS
    assert {"stage", "keep", "render", "transcript", "ledger", "counter"} <= public
    assert [f.name for f in dataclasses.fields(StrategyContext) if "Session" in str(f.type)] == []
    s = Session.create(None, prefix_messages=1)
    s.sync(_history(random.Random(1), 3))
    d = Draft(s)
    for name in WRITERS:
        assert not hasattr(d, name), name
    # nor through what it hands out: the views have no appending method, and their lists are copies
    assert not hasattr(d.ledger, "append") and not hasattr(d.ledger, "make_entry")
    assert not any(hasattr(d.transcript, m) for m in ("commit", "prepare", "prepare_new", "messages"))
    d.transcript.identities.clear()
    assert len(d.transcript.identities) == len(s)
    # the entries' tuple is made once per change of the ledger, not per read
    assert d.ledger.entries is d.ledger.entries
    e = d.stage(SkipRange(3, 4), level="L1")
    assert d.ledger.entries[-1] is e and d.ledger.entries is d.ledger.entries
    with pytest.raises(AttributeError, match=r"Draft\.edit: a strategy does not write; propose with draft\.stage"):
        d.edit(SkipRange(1, 2))  # type: ignore[attr-defined]


def test_no_compaction_module_names_a_store() -> None:
    """The other half of "no module under compaction/ reaches a store" (import-linter's ``plans``
    contract forbids the imports): no ``store`` attribute, and none of the session's storing
    calls, is named in compaction/."""
    found = []
    for path in sorted((PKG / "compaction").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr in ("store", "put_blob", "stage_blob", "commit"):
                found.append(f"{path.relative_to(PKG)}:{node.lineno}: .{node.attr}")
    assert found == []


@pytest.mark.parametrize("seed", range(6))
def test_staged_content_and_edits_are_stored_together(tmp_path: Path, seed: int) -> None:
    """A family of sessions from seeds: what a draft proposed is in memory at once (renders see
    it) and in the store only after `commit`, content and entries both; a reopened session
    serves the content and names no missing blob."""
    rng = random.Random(seed)
    store = FileStore(tmp_path / "store")
    s = Session.create(store, session_id=f"s{seed}", prefix_messages=1)
    s.sync(_history(rng, rng.randint(4, 9)))
    d = Draft(s)
    i = 2 * rng.randint(1, (len(s) - 1) // 2)  # a tool_result message
    text = s.transcript[i].content[0].content  # type: ignore[union-attr,index]
    full = text if isinstance(text, str) else "".join(b.text for b in text)  # type: ignore[union-attr]
    ref = d.keep(full)
    assert ref == text_ref(full) and d.keep(full) == ref  # the same content, the same name
    e = d.stage(ReplaceWithSummary(i, i, f"[moved to {ref}]", "test", tool_use_id=f"toolu_{i // 2 - 1}"),
                level="L2")
    assert ref in d.render().to_json().decode()  # renders see the proposal at once
    reopened = Session.open(store, f"s{seed}", readonly=True)
    assert len(reopened.ledger) == 0 and store.open(f"s{seed}").get_blob(ref) is None  # nothing stored yet
    assert s.commit() == [e]
    again = Session.open(store, f"s{seed}", readonly=True)
    assert [x.hash for x in again.ledger.entries] == [e.hash]
    assert Scratchpad.for_session(again).read(ref, 0, 10**6)[:200] == full[:200]
    assert again.blob_problems() == []


def test_a_plan_that_lost_the_race_stores_no_entry(tmp_path: Path) -> None:
    """Another writer appended first: no entry of the plan is stored, and the session refuses to
    go on from its memory (the engine opens it again)."""
    store = FileStore(tmp_path / "store")
    s = Session.create(store, session_id="raced", prefix_messages=1)
    s.sync(_history(random.Random(7), 6))
    d = Draft(s)
    d.keep("kept output")
    d.stage(SkipRange(3, 4), level="L1")
    Session.open(store, "raced").edit(SkipRange(5, 6), level="L1")  # another process, first
    with pytest.raises(StagedEditsConflictError):
        s.commit()
    theirs = Session.open(store, "raced", readonly=True)
    assert [(x.start, x.end) for x in theirs.ledger.entries] == [(5, 6)]
    with pytest.raises(StagedEditsConflictError):
        d.keep("more")


def test_content_alone_is_stored_whatever_another_writer_did(tmp_path: Path) -> None:
    """Kept content names nothing, so another writer's entries are no conflict for it: it is
    stored, and the session stays usable (review of issue 49)."""
    store = FileStore(tmp_path / "store")
    s = Session.create(store, session_id="alone", prefix_messages=1)
    s.sync(_history(random.Random(11), 4))
    ref = Draft(s).keep("only content")
    Session.open(store, "alone").edit(SkipRange(3, 4), level="L1")  # another process
    assert s.commit() == [] and not s.stale
    assert store.open("alone").get_blob(ref) == b"only content"


def test_an_in_memory_session_keeps_its_content_in_memory() -> None:
    """No temporary folder: the content an in-memory session's plan kept is served from memory."""
    s = Session.create(None, prefix_messages=1)
    s.sync(_history(random.Random(3), 2))
    ref = Draft(s).keep("the whole output")
    assert Scratchpad.for_session(s).handle_tool_call({"ref": ref})[1] is True  # staged, not yet stored
    s.commit()
    assert Scratchpad.for_session(s).handle_tool_call({"ref": ref}) == ("the whole output", False)


class _Planned(OpenHandsCondenser):
    """A user's strategy whose plan names a TTL for the prefix and a beta header."""

    def before_request(self, now: float, model: str, max_tokens: int = 0,
                       params: dict[str, Any] | None = None) -> Plan:
        plan = super().before_request(now, model, max_tokens, params)
        plan.prefix_ttl, plan.betas = "1h", ("my-beta-2026-12-01",)
        return plan


@dataclasses.dataclass(frozen=True)
class _PlannedConfig(OpenHandsConfig):
    name: ClassVar[str] = "planned"

    def build(self, ctx: StrategyContext) -> _Planned:
        return _Planned(ctx, self)


def test_the_request_is_rendered_and_sent_with_what_the_plan_says() -> None:
    """TTLs and betas travel in the plan: no protocol is asked of the strategy object."""
    eng = CompactionEngine(None, strategy=_PlannedConfig(), summarizer=None)
    body = {"model": MODEL, "max_tokens": 50, "system": "You are careful. " * 400,
            "messages": [{"role": "user", "content": "fix the bug " * 300}]}
    p = eng.prepare(body, explicit=None, now=1.0)
    assert not isinstance(p, type(None)) and hasattr(p, "betas")
    assert "my-beta-2026-12-01" in p.betas  # type: ignore[union-attr]
    system = p.body["system"]  # type: ignore[union-attr]
    assert system[-1]["cache_control"] == {"type": "ephemeral", "ttl": "1h"}


class _Carries(OpenHandsCondenser):
    """A strategy that puts content in its plan itself, not through `Draft.keep`."""

    def before_request(self, now: float, model: str, max_tokens: int = 0,
                       params: dict[str, Any] | None = None) -> Plan:
        plan = super().before_request(now, model, max_tokens, params)
        plan.blobs = {text_ref("carried output"): b"carried output"}
        return plan


@dataclasses.dataclass(frozen=True)
class _CarriesConfig(OpenHandsConfig):
    def build(self, ctx: StrategyContext) -> _Carries:
        return _Carries(ctx, self)


def test_content_a_plan_carries_is_stored(tmp_path: Path) -> None:
    eng = CompactionEngine(tmp_path / "store", strategy=_CarriesConfig(), summarizer=None, session_id="carried")
    body = {"model": MODEL, "max_tokens": 50, "messages": [{"role": "user", "content": "go"}]}
    eng.prepare(body, explicit=None, now=1.0)
    assert eng.read_scratchpad({"ref": text_ref("carried output")}) == ("carried output", False)


class _Misnames(OpenHandsCondenser):
    """A strategy that stages an edit naming content it files under a name not its hash."""

    def before_request(self, now: float, model: str, max_tokens: int = 0,
                       params: dict[str, Any] | None = None) -> Plan:
        plan = super().before_request(now, model, max_tokens, params)
        if self.draft.prefix_end is not None and len(self.draft) > 3:
            wrong = "sp_" + "ab" * 16
            plan.entries.append(self.draft.stage(SkipRange(3, 4, f"moved to {wrong}"), level="L1"))
            plan.blobs = {wrong: b"the output"}
        return plan


@dataclasses.dataclass(frozen=True)
class _MisnamesConfig(OpenHandsConfig):
    def build(self, ctx: StrategyContext) -> _Misnames:
        return _Misnames(ctx, self)


def test_a_plan_that_misnames_its_content_stores_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Refused whole: the ledger never names content the store lacks, and the request goes out
    as the caller sent it (fail open), the log saying why; the session stays verifiable."""
    eng = CompactionEngine(tmp_path / "store", strategy=_MisnamesConfig(prefix_messages=1), summarizer=None,
                           session_id="misnamed")
    msgs = _history(random.Random(5), 4)
    body = {"model": MODEL, "max_tokens": 50, "messages": msgs}
    assert eng.prepare_or_fail_open(body, explicit=None, now=1.0) is None  # sent unchanged
    assert "is not the reference of the bytes it carries" in caplog.text
    stored = Session.open(FileStore(tmp_path / "store"), "misnamed", readonly=True)
    assert len(stored.ledger) == 0 and stored.blob_problems() == [] and stored.store is not None
    assert stored.store.blob_refs() == []


class _OldAttributes(OpenHandsCondenser):
    """A 0.3-development strategy: its TTL and betas on itself, not in its plan."""

    ttl = "1h"
    betas = ("my-beta-2026-12-01",)


@dataclasses.dataclass(frozen=True)
class _OldAttributesConfig(OpenHandsConfig):
    def build(self, ctx: StrategyContext) -> _OldAttributes:
        return _OldAttributes(ctx, self)


def test_ttl_and_betas_on_the_strategy_are_read_until_0_4() -> None:
    """Not silently dropped: the API would refuse a body without its beta."""
    eng = CompactionEngine(None, strategy=_OldAttributesConfig(), summarizer=None)
    body = {"model": MODEL, "max_tokens": 50, "system": "You are careful. " * 400,
            "messages": [{"role": "user", "content": "fix the bug " * 300}]}
    with pytest.warns(DeprecationWarning, match="until 0.4"):
        p = eng.prepare(body, explicit=None, now=1.0)
    assert "my-beta-2026-12-01" in p.betas  # type: ignore[union-attr]
    assert p.body["system"][-1]["cache_control"] == {"type": "ephemeral", "ttl": "1h"}  # type: ignore[union-attr]


def test_the_0_2_spellings_still_work_until_0_4() -> None:
    """``StrategyContext(session, ...)`` and ``ctx.session`` are read until 0.4, with a warning;
    both give the draft, never the session."""
    s = Session.create(None, prefix_messages=1)
    with pytest.warns(DeprecationWarning, match="until 0.4"):
        ctx = StrategyContext(s, ExtractiveSummarizer(), EventBus(), 200_000)  # type: ignore[arg-type]
    assert isinstance(ctx.draft, Draft)
    with pytest.warns(DeprecationWarning, match="until 0.4"):
        assert ctx.session is ctx.draft
    with pytest.warns(DeprecationWarning, match="until 0.4"):
        by_name = StrategyContext(session=s, summarizer=ExtractiveSummarizer(), events=EventBus(),
                                  window_tokens=200_000)
    assert isinstance(by_name.draft, Draft)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ctx = StrategyContext(Draft(s), ExtractiveSummarizer(), EventBus(), 200_000)
    with pytest.raises(TypeError, match="window_tokens"):
        StrategyContext(Draft(s), ExtractiveSummarizer(), EventBus())

    class Old02(LedgerStrategy):  # a 0.2 subclass that set its session itself
        def __init__(self, ctx: StrategyContext) -> None:
            super().__init__(ctx)
            self.session = ctx.session  # type: ignore[assignment]

    with pytest.warns(DeprecationWarning, match="until 0.4"):
        old = Old02(ctx)
    assert isinstance(old.draft, Draft)


class _Incomplete:
    def __init__(self, ctx: StrategyContext) -> None:
        self.draft = ctx.draft


@dataclasses.dataclass(frozen=True)
class _IncompleteConfig(OpenHandsConfig):
    def build(self, ctx: StrategyContext) -> Any:
        return _Incomplete(ctx)


def test_a_strategy_missing_its_methods_is_named(caplog: pytest.LogCaptureFixture) -> None:
    """Refused when its session is made, naming what it lacks; the request still goes out."""
    eng = CompactionEngine(None, strategy=_IncompleteConfig(), summarizer=None)
    body = {"model": MODEL, "max_tokens": 50, "messages": [{"role": "user", "content": "go"}]}
    assert eng.prepare_or_fail_open(body, explicit=None, now=1.0) is None
    assert "without before_request, after_response, reactive" in caplog.text


class _Late(OpenHandsCondenser):
    """Stages an edit after a response (a draft allows it): stored like a plan. It marks the
    part it will not edit next (``stable_before``), which each request record keeps."""

    marks: ClassVar[list[int | None]] = []

    def before_request(self, now: float, model: str, max_tokens: int = 0,
                       params: dict[str, Any] | None = None) -> Plan:
        plan = super().before_request(now, model, max_tokens, params=params)
        self.draft.stable_before = len(self.draft) - 1
        self.marks.append(self.draft.stable_before)
        return plan

    def after_response(self, now: float, usage: dict[str, Any] | None = None) -> None:
        super().after_response(now, usage)
        d = self.draft
        if d.prefix_end is not None and len(d) >= 5 and not d.ledger.entries:
            d.stage(SkipRange(d.prefix_end, d.prefix_end), level="manual")


@dataclasses.dataclass(frozen=True)
class _LateConfig(OpenHandsConfig):
    def build(self, ctx: StrategyContext) -> _Late:
        return _Late(ctx, self)


def test_a_failed_write_after_a_response_lets_the_session_go(tmp_path: Path) -> None:
    """Another writer appended while a request was out; what the strategy staged after its
    response could not be stored. The session is let go and opened again from the store, so the
    conversation goes on compacted and recorded (a review found it stuck: 2 of 8 recorded), and
    the request whose late write failed is recorded too, in the session as stored."""
    import anthropic

    from cachecompact import wrap
    from cachecompact.tools.emulator import Emulator, ScriptedResponder
    from cachecompact.tools.emulator.responders import Reply

    store = tmp_path / "store"
    calls = [0]
    _Late.marks.clear()

    def reply(body: dict[str, Any]) -> Reply:
        calls[0] += 1
        if calls[0] == 3:  # a replica appends while request 3 is out
            Session.open(FileStore(store), "s1").edit(SkipRange(1, 1, "replica"), level="manual")
        return Reply([{"type": "text", "text": "ok"}], "end_turn")

    with Emulator(ScriptedResponder(reply)) as emu:
        c = wrap(anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0), store=store,
                 strategy=_LateConfig(prefix_messages=1), session_id="s1")
        msgs: list[dict[str, Any]] = [{"role": "user", "content": "task"}]
        for i in range(8):
            c.messages.create(model=MODEL, max_tokens=50, messages=msgs)
            msgs += [{"role": "assistant", "content": f"a{i}"}, {"role": "user", "content": f"u{i}"}]
    stored = Session.open(FileStore(store), "s1", readonly=True)
    assert stored.requests_recorded == 8  # the one whose late write failed too, in the session as stored
    assert stored.request_problems() == [] and stored.blob_problems() == []
    assert spec_verify(store / "s1") == []
    # each record keeps the mark its request was rendered with, the one after the lost race too
    assert [r.stable_before for r in stored.request_records()] == _Late.marks[-8:]
    assert len(stored) == len(msgs) - 2


def test_a_reopened_session_keeps_the_tools_it_was_made_with(tmp_path: Path) -> None:
    """Made without read_scratchpad, reopened by an engine that adds it to new sessions: its
    placeholders still never name the tool, which its requests do not carry."""
    import anthropic

    from cachecompact import wrap, wrapped_sessions
    from cachecompact.adapters.middleware import _middleware_of
    from cachecompact.tools.emulator import Emulator

    with Emulator() as emu:
        msgs: list[dict[str, Any]] = [{"role": "user", "content": "task"}]
        first = wrap(anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0), store=tmp_path,
                     scratchpad_tool=False)
        for i in range(3):
            first.messages.create(model=MODEL, max_tokens=50, messages=msgs)
            msgs += [{"role": "assistant", "content": f"a{i}"}, {"role": "user", "content": f"u{i}"}]
        made = {s.session_id for s in wrapped_sessions(first)}
        again = wrap(anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0), store=tmp_path,
                     scratchpad_tool=True)
        again.messages.create(model=MODEL, max_tokens=50, messages=msgs)
        (live,) = _middleware_of(again).engine.registry.sessions()
    assert live.sid in made and live.session.tools_param == []
    assert live.strategy.externalize is False  # type: ignore[attr-defined]
