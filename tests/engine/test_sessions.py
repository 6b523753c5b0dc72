"""One conversation is one session (`cachecompact.engine.identity`: the one rule, acted on by the
registry and the proxy's observer): never mixed with another, never stale, never split, and a
changed system prompt reported. The end-to-end cases go through the real SDK into the emulator,
and what the emulator received is compared, message by message, with what the caller sent; the
last ones drive `SessionRegistry` through the engine: which live session a request lands in,
what a new segment inherits, and what a second engine on the same store finds."""

from __future__ import annotations

import copy
import logging
import multiprocessing
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest

import cachecompact
from cachecompact import Session
from cachecompact.adapters.middleware import SESSION_HEADER
from cachecompact.adapters.proxy import Proxy, ProxyConfig
from cachecompact.base.events import Event
from cachecompact.base.values import Answer, ContextFull
from cachecompact.engine.identity import RequestHistory, decide
from cachecompact.engine.request_cycle import CompactionEngine
from cachecompact.history.transcript import message_hash
from cachecompact.store import FileStore, open_store
from cachecompact.tools.emulator import Emulator, ScriptedResponder
from cachecompact.tools.emulator.responders import Reply

from ..conftest import SYSTEM as SHORT_SYSTEM

MODEL = "claude-sonnet-4-6"
SYSTEM = "You are a careful agent. " * 300  # over the minimum cacheable length


class Recorder:
    """A responder that keeps every request body the emulator answers (the summarizer's too)."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def __call__(self, body: dict[str, Any]) -> Reply:
        with self.lock:
            self.bodies.append(copy.deepcopy(body))
        return Reply([{"type": "text", "text": f"ok {len(body['messages'])}"}], "end_turn")


@pytest.fixture
def rec() -> Iterator[tuple[Recorder, Emulator]]:
    r = Recorder()
    with Emulator(ScriptedResponder(r)) as emu:
        yield r, emu


def ids(messages: list[Any]) -> list[bytes]:
    return [message_hash(m) for m in messages]


def convo(n: int, tag: str) -> list[dict[str, Any]]:
    """``n`` alternating text messages (user first and last for odd ``n``)."""
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"{tag} message {i}: " + "words " * 30}
            for i in range(n)]


# -- the rule itself ------------------------------------------------------------------------------------


class C:
    def __init__(self, sid: str, preamble: bytes, msgs: list[Any]) -> None:
        self.sid, self.preamble, self.identities = sid, preamble, ids(msgs)


def test_decide_compares_the_whole_history_not_a_sample() -> None:
    a = convo(9, "a")
    b = copy.deepcopy(a)
    b[4]["content"] = "private to b"
    req = RequestHistory(b"h", ids([*b, *convo(2, "z")]))
    d = decide(req, [C("x", b"h", a)], named=False)
    assert d.kind == "segment" and d.reason == "rewrite" and d.at == 4 and d.target == "x"
    assert decide(RequestHistory(b"h", ids([*a, *convo(2, "z")])), [C("x", b"h", a)], named=False).kind == "continue"
    # the longest extended history wins; a changed head is a segment, linked
    d = decide(RequestHistory(b"new", ids([*a, *convo(2, "z")])), [C("x", b"h", a[:3]), C("y", b"h", a)],
               named=True)
    assert (d.kind, d.target, d.reason) == ("segment", "y", "prefix_churn")
    # another agent under the name: nothing extended, no candidate with its head
    d = decide(RequestHistory(b"sub", ids(convo(3, "sub"))), [C("n", b"h", a)], named=True)
    assert (d.kind, d.target) == ("agent", "n")
    # observe mode holds no prefix: a changed head continues
    d = decide(RequestHistory(b"new", ids([*a, *convo(2, "z")])), [C("y", b"h", a)], named=True, fixed_preamble=False)
    assert d.kind == "continue"


def test_independent_agents_with_one_opening_are_separate_conversations() -> None:
    """Issue 37: agents that share only their first message (or the first reply too, when replies
    are deterministic) were linked as rewrites of one another, warned of edited history, and
    totalled as one conversation. A rewrite keeps the old history's newest message after the
    change; another agent never holds it."""
    a = convo(7, "a")
    other = [a[0], *convo(6, "b")[1:]]
    d = decide(RequestHistory(b"h", ids(other)), [C("s", b"h", a)], named=False)
    assert (d.kind, d.target) == ("new", None)
    same_reply = [a[0], a[1], *convo(5, "b")[2:]]  # a deterministic model's identical first reply
    assert decide(RequestHistory(b"h", ids(same_reply)), [C("s", b"h", a)], named=False).kind == "new"
    # a redaction that keeps the newest message is still the same conversation
    red = copy.deepcopy(a)
    red[2]["content"] = "[redacted]"
    d = decide(RequestHistory(b"h", ids([*red, *convo(2, "z")])), [C("s", b"h", a)], named=False)
    assert (d.kind, d.target, d.reason, d.at) == ("segment", "s", "rewrite", 2)
    # a framework that summarised the middle and kept the newest turns: the same conversation
    kept = [a[0], {"role": "assistant", "content": "summary of the middle"}, *a[4:], *convo(2, "z")]
    assert decide(RequestHistory(b"h", ids(kept)), [C("s", b"h", a)], named=False).reason == "rewrite"


def test_sub_agents_are_agents_however_many_and_however_nested() -> None:
    """Issue 37: a second sub-agent of the same kind as ``.a2`` (same tools and system, its own
    task) was a "rewrite at 0" of ``.a2``, named ``.s2``, ``.s3`` ... (625 segments for one
    delegating sub-agent). Under a name, only the owner's line is rewritten: Claude Code's own
    compaction (nothing in common) and a rewind (more than the opening in common)."""
    main, sub1 = C("n", b"main", convo(5, "main")), C("n.a2", b"sub", convo(3, "sub1"))
    for task in ("sub2", "sub3", "nested"):
        d = decide(RequestHistory(b"sub", ids(convo(1, task))), [main, sub1], named=True)
        assert (d.kind, d.target) == ("agent", "n"), task
    summary = [{"role": "user", "content": "This session is being continued from a previous conversation."}]
    d = decide(RequestHistory(b"main", ids(summary)), [main, sub1], named=True)
    assert (d.kind, d.target, d.reason) == ("segment", "n", "rewrite")
    rewind = [*convo(5, "main")[:3], {"role": "assistant", "content": "another answer"}]
    d = decide(RequestHistory(b"main", ids(rewind)), [main, sub1], named=True)
    assert (d.kind, d.target, d.reason, d.at) == ("segment", "n", "rewrite", 3)
    # another agent under the name that shares only the owner's opening
    d = decide(RequestHistory(b"main", ids([convo(5, "main")[0], *convo(3, "x")[1:]])), [main, sub1], named=True)
    assert (d.kind, d.target) == ("agent", "n")


@pytest.mark.parametrize("seed", range(8))
def test_sibling_sub_agents_sharing_a_trailing_system_message_are_agents(seed: int) -> None:
    """Issue 50: Claude Code 2.1.328 appends one identical ``role: "system"`` message to parallel
    sub-agents; 4 of 14 siblings became ``.sN`` rewrites of each other (the shared message was
    taken for "the newest message kept"). A family of siblings from seeds (their tasks, turns and
    reminders): each new sibling is another agent; a real rewrite of a sibling that keeps its newest
    turn is still a rewrite."""
    import random

    rng = random.Random(seed)
    reminder = {"role": "system", "content": f"<system-reminder>budget {rng.randint(1, 9)}</system-reminder>"}
    main = C("n", b"main", convo(5, "main"))
    siblings = [C(f"n.a{k + 1}", b"sub", [*convo(rng.randint(1, 4) * 2 - 1, f"task{seed}-{k}"), reminder])
                for k in range(rng.randint(1, 4))]
    new = [*convo(rng.randint(1, 4) * 2 - 1, f"task{seed}-new"), reminder]
    req = RequestHistory.of({"messages": new})
    req = RequestHistory(b"sub", req.ids, req.system_ids)
    d = decide(req, [main, *siblings], named=True)
    assert (d.kind, d.target) == ("agent", "n"), d
    # the sibling's own history, one old turn redacted, its newest turn kept: a rewrite of it
    own = [*convo(5, f"own{seed}"), reminder]
    red = copy.deepcopy(own)
    red[2]["content"] = "[redacted]"
    grown = RequestHistory.of({"messages": [*red[:-1], *convo(2, "z"), reminder]})
    d = decide(RequestHistory(b"sub", grown.ids, grown.system_ids), [main, C("n.a9", b"sub", own)], named=True)
    assert (d.kind, d.target, d.reason) == ("segment", "n.a9", "rewrite"), d


def test_three_async_agents_with_one_opening_get_three_unlinked_sessions(tmp_path: Path) -> None:
    """End to end, as the issue's trial ran it: three AsyncAnthropic agents through one wrapped
    client, no session name, the same opening message; no link, no rewrite warning, no waste,
    and the report counts three conversations."""
    import asyncio
    import uuid

    from cachecompact.tools.session_report import conversation_segments

    events: list[Event] = []

    def model(body: dict[str, Any]) -> Reply:
        return Reply([{"type": "text", "text": f"reply {uuid.uuid4().hex}"}], "end_turn")

    async def agent(client: Any, k: int) -> None:
        msgs: list[dict[str, Any]] = [{"role": "user", "content": "Summarise the repository. " * 200}]
        for t in range(4):
            r = await client.messages.create(model=MODEL, max_tokens=50, system=SYSTEM, messages=msgs)
            msgs += [{"role": "assistant", "content": r.content[0].text},
                     {"role": "user", "content": f"agent {k} step {t}: go on"}]

    async def run(url: str) -> None:
        client = cachecompact.wrap(anthropic.AsyncAnthropic(base_url=url, api_key="t", max_retries=0),
                                   store=tmp_path, summarizer=None, on_event=events.append)
        await agent(client, 0)  # the first finishes before the others start, as the trial's did
        await asyncio.gather(agent(client, 1), agent(client, 2))
        await client.close()

    with Emulator(ScriptedResponder(model)) as emu:
        asyncio.run(run(emu.url))
    store = FileStore(tmp_path)
    sids = store.list()
    assert len(sids) == 3, sids
    assert all(Session.open(store, sid, readonly=True).link is None for sid in sids)
    assert [e for e in events if e.kind == "cache_miss" and "prefix_churn" in e.reason] == []
    assert all(len(conversation_segments(store, sid)) == 1 for sid in sids)


# -- two conversations are never mixed -----------------------------------------------------------------------

SWEEP = [(n, k) for n in (4, 6, 9, 13) for k in range(1, n - 1)]  # 24 cases: every position between


@pytest.mark.parametrize("mode", ["wrap", "compact"])
def test_two_conversations_differing_in_one_middle_message_never_mix(tmp_path: Path, mode: str,
                                                                    rec: tuple[Recorder, Emulator]) -> None:
    """Two unnamed conversations share their opening and their last message and differ in one
    message between. Each request the emulator receives carries exactly its caller's messages:
    24 cases, histories of 4, 6, 9 and 13 messages, every middle position."""
    r, emu = rec
    assert len(SWEEP) == 24
    leaks = []
    for n, k in SWEEP:
        store = tmp_path / f"{mode}-{n}-{k}"
        if mode == "wrap":
            client = cachecompact.wrap(anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0),
                                       store=store, summarizer=None)
            ctx = None
        else:
            ctx = Proxy(ProxyConfig(upstream=emu.url, port=0, mode="compact", store=str(store)))
            px = ctx.__enter__()
            client = anthropic.Anthropic(base_url=px.url, api_key="t", max_retries=0)
        try:
            a = convo(n, f"case {n}/{k}")
            b = copy.deepcopy(a)
            b[k]["content"] = f"SECRET of conversation B at {k}"
            for sent in (a, b, [*a, {"role": "assistant", "content": "a reply"}, {"role": "user", "content": "go"}],
                         [*b, {"role": "assistant", "content": "b reply"}, {"role": "user", "content": "go"}]):
                r.bodies.clear()
                client.messages.create(model=MODEL, max_tokens=20, system=SYSTEM, messages=sent)
                (got,) = r.bodies
                if ids(got["messages"]) != ids(sent):
                    leaks.append((n, k, len(sent)))
        finally:
            if ctx is not None:
                ctx.__exit__(None, None, None)
    assert leaks == []


def test_a_redaction_reaches_the_very_next_request(rec: tuple[Recorder, Emulator], tmp_path: Path) -> None:
    """An agent redacts a secret from an old tool result at turn 20 of a 30-turn loop: every
    request from then on carries the redaction, none the secret (unnamed and named)."""
    r, emu = rec
    for name in (None, "job-redact"):
        client = cachecompact.wrap(anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0),
                                   store=tmp_path / str(name), summarizer=None, session_id=name)
        msgs: list[dict[str, Any]] = [{"role": "user", "content": "Audit the environment."}]
        for t in range(30):
            if t == 20:
                res = msgs[2]["content"][0]  # the first tool result, the only one with the secret
                assert "SECRET=hunter2" in res["content"]
                res["content"] = res["content"].replace("SECRET=hunter2", "SECRET=[REDACTED]")
            r.bodies.clear()
            client.messages.create(model=MODEL, max_tokens=20, system=SYSTEM, messages=msgs)
            (got,) = r.bodies
            text = str(got["messages"])
            assert ids(got["messages"]) == ids(msgs), t
            assert ("hunter2" in text) == (1 <= t < 20) and ("[REDACTED]" in text) == (t >= 20), t
            msgs += [{"role": "assistant", "content": [
                {"type": "tool_use", "id": f"toolu_{t:03d}", "name": "env", "input": {"n": t}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{t:03d}",
                                              "content": f"PATH=/bin\nTURN={t}" + ("\nSECRET=hunter2" if t == 0
                                                                                    else "")}]}]


# -- one conversation is never split --------------------------------------------------------------------------


def _cc_turns(client: anthropic.Anthropic, n: int, **kw: Any) -> list[dict[str, Any]]:
    """Claude Code's habit: the newest user message as a one-block list with cache_control, the
    same message as a plain string on the next request."""
    msgs: list[dict[str, Any]] = []
    for t in range(n):
        if msgs:
            msgs[-2]["content"] = msgs[-2]["content"][0]["text"]  # last turn's block list, now a string
        msgs.append({"role": "user", "content": [{"type": "text", "text": f"prompt {t}",
                                                  "cache_control": {"type": "ephemeral"}}]})
        reply = client.messages.create(model=MODEL, max_tokens=20, system=SYSTEM, messages=msgs, **kw)
        msgs.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]})
    return msgs


def test_a_string_and_one_text_block_are_one_session_in_wrap(rec: tuple[Recorder, Emulator], tmp_path: Path) -> None:
    _, emu = rec
    for name in (None, "cc-like"):
        store = tmp_path / str(name)
        client = cachecompact.wrap(anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0), store=store,
                                   summarizer=None, session_id=name)
        _cc_turns(client, 6)
        assert len(cachecompact.store.FileStore(store).list()) == 1


@pytest.mark.parametrize("mode", ["observe", "compact"])
def test_a_string_and_one_text_block_are_one_session_in_the_proxy(rec: tuple[Recorder, Emulator], tmp_path: Path,
                                                                 mode: str) -> None:
    _, emu = rec
    uid = '{"device_id":"d","account_uuid":"","session_id":"5b0e6c1e-0000-4000-8000-000000000001"}'
    with Proxy(ProxyConfig(upstream=emu.url, port=0, mode=mode, store=str(tmp_path))) as px:
        client = anthropic.Anthropic(base_url=px.url, api_key="t", max_retries=0)
        _cc_turns(client, 6, metadata={"user_id": uid})
        px.wait_idle()
        sids = [s.sid for s in px.state.observer.sessions()]
        records = px.state.observer.sessions()[0].records
    assert sids == ["cc-5b0e6c1e-0000-4000-8000-000000000001"]
    assert [r["finding"]["cls"] for r in records][1:] == ["read_as_expected"] * 5


def test_requests_under_the_owners_name_cannot_push_its_history_out_of_reach(rec: tuple[Recorder, Emulator],
                                                                             tmp_path: Path) -> None:
    """Four requests with other openings under the owner's session id make sessions of their own;
    the owner's next turn still continues its session, in this process and after a restart."""
    _, emu = rec

    def client() -> Any:
        return cachecompact.wrap(anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0), store=tmp_path,
                                 summarizer=None)

    c = client()
    owner = convo(5, "owner")
    c.messages.create(model=MODEL, max_tokens=20, system=SYSTEM, messages=owner,
                      extra_headers={SESSION_HEADER: "job"})
    for k in range(6):
        c.messages.create(model=MODEL, max_tokens=20, system=f"intruder {k}", messages=convo(3, f"intruder {k}"),
                          extra_headers={SESSION_HEADER: "job"})
    before = set(cachecompact.store.FileStore(tmp_path).list())
    for attempt, cl in enumerate((c, client())):  # the same process, then a restarted one
        owner = [*owner, {"role": "assistant", "content": f"done {attempt}"}, {"role": "user", "content": "more"}]
        cl.messages.create(model=MODEL, max_tokens=20, system=SYSTEM, messages=owner,
                           extra_headers={SESSION_HEADER: "job"})
        assert set(cachecompact.store.FileStore(tmp_path).list()) == before
        assert Session.open(tmp_path / "job").messages() == owner
    links = [Session.open(tmp_path / sid).link for sid in sorted(before - {"job"})]
    assert all(lk is not None and lk["session"] == "job" for lk in links)


def test_50_threads_with_identical_openings_all_compact_and_record(tmp_path: Path) -> None:
    """50 threads on one wrapped client, identical openings, 6 turns each: no failure event, every
    request prepared by cachecompact (none passed through) and every request recorded."""
    events: list[Event] = []
    with Emulator() as emu:
        client = cachecompact.wrap(anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=2),
                                   store=tmp_path, summarizer=None, on_event=events.append)

        def agent(k: int) -> None:
            msgs: list[dict[str, Any]] = [{"role": "user", "content": "Same task for everyone."}]
            for turn in range(6):
                reply = client.messages.create(model=MODEL, max_tokens=50, system=SYSTEM, messages=msgs)
                msgs = [*msgs, {"role": "assistant", "content": [b.model_dump(exclude_none=True)
                                                                 for b in reply.content]},
                        {"role": "user", "content": f"agent {k} step {turn}"}]

        threads = [threading.Thread(target=agent, args=(k,)) for k in range(50)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        served = [x for x in emu.requests if x.get("status") == 200 and not x.get("internal")]
    assert [e for e in events if e.kind == "failure"] == []
    assert len(served) == 300
    store = cachecompact.store.FileStore(tmp_path)
    recorded = sum(Session.open(store, sid, readonly=True).requests_recorded for sid in store.list())
    assert recorded == 300


def _append_turns(store: str, upstream: str, lo: int, hi: int, step: int, barrier: Any) -> None:
    """One process of the two: sends turns lo, lo+step, ... of the shared conversation "shared",
    each with the whole history up to it (the other process sent the turns between)."""
    client = cachecompact.wrap(anthropic.Anthropic(base_url=upstream, api_key="t", max_retries=0), store=store,
                               summarizer=None, session_id="shared")
    for t in range(hi):
        if t % step == lo:
            client.messages.create(model=MODEL, max_tokens=20, system=SYSTEM, messages=_shared_history(t))
        barrier.wait()  # turn t is recorded before either process sends turn t + 1


def _shared_history(t: int) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "turn 0"}]
    for k in range(1, t + 1):
        msgs += [{"role": "assistant", "content": f"answer {k - 1}"}, {"role": "user", "content": f"turn {k}"}]
    return msgs


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["file", "postgres"])
def test_two_processes_appending_to_one_named_session(tmp_path: Path, backend: str, request: Any) -> None:
    if backend == "postgres":
        url = request.getfixturevalue("pg_url")
        from cachecompact.store.postgres import migrate

        from ..conftest import fresh_database
        store = fresh_database(url, "two_processes")
        migrate(store)
    else:
        store = str(tmp_path / "store")
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    with Emulator() as emu:
        procs = [ctx.Process(target=_append_turns, args=(store, emu.url, lo, 12, 2, barrier)) for lo in (0, 1)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(120)
        assert [p.exitcode for p in procs] == [0, 0]
    st = open_store(store)
    try:
        assert st.list() == ["shared"]
        s = Session.open(st, "shared", readonly=True)
        assert len(s) == len(_shared_history(11)) and s.requests_recorded == 12
    finally:
        st.close()


# -- a changed system prompt is reported ----------------------------------------------------------------------


def test_a_timestamp_in_the_system_prompt_is_reported_in_wrap(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                             rec: tuple[Recorder, Emulator]) -> None:
    """An unnamed agent starts putting a timestamp in its system prompt at turn 6: that request
    gets a prefix_churn finding naming system[0] and the offset, a WARNING and a cache_miss
    event; the new segments are linked to the conversation and the report shows them as one."""
    r, emu = rec
    events: list[Event] = []
    client = cachecompact.wrap(anthropic.Anthropic(base_url=emu.url, api_key="t", max_retries=0), store=tmp_path,
                               summarizer=None, on_event=events.append)
    msgs = convo(1, "clock")
    caplog.set_level(logging.WARNING, logger="cachecompact")
    for t in range(10):
        system = SYSTEM if t < 6 else f"{SYSTEM}Now: 2026-12-01 10:{t:02d}:00"
        r.bodies.clear()
        client.messages.create(model=MODEL, max_tokens=20, system=system, messages=msgs)
        assert ids(r.bodies[0]["messages"]) == ids(msgs)
        msgs = [*msgs, {"role": "assistant", "content": f"answer {t}"}, {"role": "user", "content": f"next {t}"}]
    misses = [e for e in events if e.kind == "cache_miss" and e.detail.get("cls") == "prefix_churn"]
    assert misses, [e.kind for e in events]
    first = misses[0].detail
    assert first["location"] == "system[0]" and first["offset"] == len(SYSTEM)
    assert "Now: 2026" in first["after"]
    assert any("prefix_churn" in m.getMessage() for m in caplog.records if m.levelno == logging.WARNING)
    store = cachecompact.store.FileStore(tmp_path)
    sids = store.list()
    linked = [Session.open(store, s, readonly=True).link for s in sids]
    assert sum(lk is None for lk in linked) == 1  # one conversation: every other segment is linked
    from cachecompact.tools.session_report import conversation_data, conversation_segments, session_report
    root = next(s for s, lk in zip(sids, linked, strict=True) if lk is None)
    for sid in (root, sids[-1]):  # from the first session or the last one: the whole conversation
        data = conversation_data(conversation_segments(store, sid))
        assert len(data["requests"]) == 10 and len(data["segments"]) == len(sids)
        assert data["misses"].get("prefix_churn", 0) >= 1
    text = session_report(store, root)
    assert f"one conversation in {len(sids)} sessions" in text
    assert all(sid in text.split("read   write")[1] for sid in sids)  # each request names its session
    # issue 50: another session of it reports itself, and names the conversation's first
    last = next(s for s in sids if s != root)
    own = session_report(store, last)
    assert own.startswith(f"session {last}") and f"conversation {root}" in own
    assert "one conversation in" not in own


def test_the_proxy_lists_a_conversations_segments_under_it(rec: tuple[Recorder, Emulator], tmp_path: Path) -> None:
    """Compact mode: a changed system prompt needs a new segment (the immutable prefix never
    changes), and /api/sessions lists it under its conversation, with the conversation's totals."""
    import httpx2

    _, emu = rec
    with Proxy(ProxyConfig(upstream=emu.url, port=0, mode="compact", store=str(tmp_path))) as px:
        client = anthropic.Anthropic(base_url=px.url, api_key="t", max_retries=0)
        msgs = convo(1, "proxy")
        for t in range(5):
            client.messages.create(model=MODEL, max_tokens=20, system=SYSTEM if t < 3 else SYSTEM + " v2",
                                   messages=msgs, extra_headers={SESSION_HEADER: "conv"})
            msgs = [*msgs, {"role": "assistant", "content": f"a{t}"}, {"role": "user", "content": f"u{t}"}]
        px.wait_idle()
        listed = httpx2.get(px.url + "/api/sessions").json()["sessions"]
    assert [c["id"] for c in listed] == ["conv"]
    (seg,) = listed[0]["segments"]
    assert seg["id"] == "conv.s2" and seg["link"]["reason"] == "prefix_churn"
    assert listed[0]["conversation"]["requests"] == 5


# -- the registry through the engine -------------------------------------------------------------

def _body(*turns: str) -> dict[str, Any]:
    """A request whose history alternates user and assistant text, ending on a user turn."""
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]
    return {"model": "claude-sonnet-4-6", "max_tokens": 100, "system": SHORT_SYSTEM, "messages": msgs}


def record(eng: CompactionEngine, b: dict[str, Any], now: float) -> str:
    p = eng.prepare(b, explicit=None, now=now)
    eng.record(p, Answer({"input_tokens": 10, "output_tokens": 5}, f"msg_{now}"))
    return p.live.session.session_id


def test_a_history_that_extends_continues_and_one_that_parts_gets_its_own(tmp_path: Path) -> None:
    eng = CompactionEngine(FileStore(tmp_path), summarizer=None)
    first = record(eng, _body("task: fix the parser"), 1)
    assert record(eng, _body("task: fix the parser", "reading it", "go on"), 2) == first
    other = record(eng, _body("task: fix the parser", "something else", "then?"), 3)
    assert other != first  # same opening, different history: never mixed
    assert record(eng, _body("task: fix the parser", "reading it", "go on", "done", "thanks"), 4) == first
    assert sorted(s.session_id for s in eng.sessions()) == sorted({first, other})


def test_a_new_segment_gets_a_fork_of_its_parents_forensics(tmp_path: Path) -> None:
    """A rewritten history (an agent's own compaction) starts a linked segment; its first
    request is compared with the one before it, on a copy of the parent's forensics."""
    eng = CompactionEngine(FileStore(tmp_path), summarizer=None)
    turns = ["task", "a1", "u2", "a2", "u3"]
    parent = eng.prepare(_body(*turns), explicit="conv", now=1)
    eng.record(parent, Answer({"input_tokens": 10, "output_tokens": 5}, "m1"))
    seg = eng.prepare(_body("task", "a summary of what happened", "u3"), explicit="conv", now=2)
    assert seg.live.session.session_id != "conv" and seg.live.session.link is not None
    assert seg.live.forensics is not parent.live.forensics


def test_a_second_engine_on_the_store_finds_the_conversation(tmp_path: Path) -> None:
    """A restarted process (or a replica) continues the stored session, appending nothing twice."""
    store = FileStore(tmp_path)
    sid = record(CompactionEngine(store, summarizer=None), _body("task", "a1", "u2"), 1)
    again = CompactionEngine(FileStore(tmp_path), summarizer=None)
    p = again.prepare(_body("task", "a1", "u2", "a2", "u3"), explicit=None, now=2)
    assert p.live.session.session_id == sid and len(p.live.session) == 5


def test_the_typed_request_record_is_stored_key_for_key(tmp_path: Path) -> None:
    """The engine hands the session a `RequestRecord`; what is stored is its fields as 0.3 wrote
    them (docs/ledger-format.md; stored canonically, keys sorted), the unset optional ones left
    out, beside the session's own."""
    from cachecompact.history.session import Session

    eng = CompactionEngine(FileStore(tmp_path), summarizer=None)
    sid = record(eng, _body("task: fix the parser"), 1)
    rec = Session.open(FileStore(tmp_path), sid).last_request
    assert rec is not None
    ours = {"time", "model", "usage", "cost_usd", "est_tokens", "message_id", "stream", "sent_tokens", "finding",
            "strategy_state"}  # the default strategy is stateful; no thinking was left out
    session = {"meta", "transcript_len", "transcript_head", "ledger_len", "ledger_head", "breakpoints"}
    assert ours <= set(rec) and "thinking" not in rec
    assert set(rec) - ours - session <= {"seq", "prev_hash", "hash", "stable_before"}, set(rec) - ours - session
    assert rec["usage"] == {"input_tokens": 10, "output_tokens": 5} and rec["stream"] is False


# -- the plan: a strategy stages, the cycle stores -------------------------------------------------

def _racing_config(store_dir: Path) -> Any:
    """A strategy that plans one skip per call and says so in an event; on its first plan, and
    again on its first reactive compaction, "another replica" stores an edit on the same session
    first (the race a fleet on one store can run)."""
    from dataclasses import dataclass
    from typing import ClassVar

    from cachecompact.compaction.strategy import Plan, StrategyContext
    from cachecompact.history.ledger import SkipRange

    raced: set[str] = set()

    class Racing:
        def __init__(self, ctx: StrategyContext) -> None:
            self.session, self.events = ctx.draft, ctx.events

        def _race(self, when: str, theirs: SkipRange) -> None:
            if when not in raced:
                raced.add(when)
                Session.open(FileStore(store_dir), self.session.session_id).edit(theirs, level="L1")

        def before_request(self, now: float, model: str, max_tokens: int = 0,
                           params: dict[str, Any] | None = None) -> Plan:
            self._race("plan", SkipRange(7, 10))
            entry = self.session.stage(SkipRange(3, 6), level="L1")
            self.events.emit(Event("compaction", self.session.session_id, reason=f"planned entry {entry.seq}"))
            return Plan(0, 0, entries=[entry])

        def after_response(self, now: float, usage: dict[str, Any] | None = None) -> None:
            return None

        def reactive(self, reported_tokens: int, limit: int, now: float, model: str, max_tokens: int = 0) -> bool:
            self._race("reactive", SkipRange(15, 18))
            self.session.stage(SkipRange(11, 14), level="L1")
            return True

    @dataclass(frozen=True)
    class RacingConfig:
        name: ClassVar[str] = "racing"
        prefix_messages: int = 3
        summary_model: str | None = None
        summary_mode: str = "auto"

        def build(self, ctx: StrategyContext) -> Racing:
            return Racing(ctx)

    return RacingConfig()


def test_the_cycle_stores_the_plan_and_a_lost_race_is_decided_again(tmp_path: Path) -> None:
    """The strategy's staged edit reaches the store only through the cycle; when another writer
    stored an edit first, the cycle lets the session go, opens it from the store and plans again,
    so the request carries both edits, the store holds each once, in order, and only the plan
    that was stored left its event."""
    from cachecompact import EngineOptions

    from ..conftest import TOOLS, history

    msgs = history(10, n_calls=2)
    body = {"model": MODEL, "max_tokens": 100, "system": SHORT_SYSTEM, "tools": TOOLS, "messages": msgs}
    eng = CompactionEngine(FileStore(tmp_path), EngineOptions(strategy=_racing_config(tmp_path)), summarizer=None)
    p = eng.prepare(body, explicit="conv", now=1.0)
    assert not isinstance(p, ContextFull)
    stored = Session.open(FileStore(tmp_path), "conv")
    assert [(e.start, e.end) for e in stored.ledger.entries] == [(7, 10), (3, 6)]  # theirs, then the plan's
    assert p.live.session.ledger.entries == stored.ledger.entries and not p.live.session.stale
    assert p.body == stored.render(model=MODEL, max_tokens=100).body  # what goes out is what is stored
    events = FileStore(tmp_path).open("conv").read_events()
    said = [e["reason"] for e in events if e.get("kind") == "compaction"]
    assert said == ["planned entry 1"]  # the lost plan's "entry 0" named the other writer's entry: dropped
    (lost,) = [e for e in events if e.get("kind") == "failure"]
    assert lost["reason"].startswith("plan not stored (StagedEditsConflictError")
    assert "1 event(s) dropped" in lost["reason"]


def test_a_reactive_compaction_that_lost_a_race_gives_back_the_apis_error(tmp_path: Path) -> None:
    """Not "context full" (that would not be true): the 400 goes back, the session is let go,
    and the next request plans on what the store holds."""
    from cachecompact import EngineOptions

    from ..conftest import TOOLS, history

    msgs = history(10, n_calls=2)
    body = {"model": MODEL, "max_tokens": 100, "system": SHORT_SYSTEM, "tools": TOOLS, "messages": msgs}
    eng = CompactionEngine(FileStore(tmp_path), EngineOptions(strategy=_racing_config(tmp_path)), summarizer=None)
    p = eng.prepare(body, explicit="conv", now=1.0)
    assert not isinstance(p, ContextFull)
    too_long = {"type": "error", "error": {"type": "invalid_request_error",
                                           "message": "prompt is too long: 250000 tokens > 200000 maximum"}}
    assert eng.after_too_long(p, too_long) is None
    assert p.live.session.stale and eng.registry.get("conv") is not p.live
    stored = Session.open(FileStore(tmp_path), "conv")
    assert [(e.start, e.end) for e in stored.ledger.entries] == [(7, 10), (3, 6), (15, 18)]
    again = eng.prepare(body, explicit="conv", now=2.0)
    assert not isinstance(again, ContextFull) and not again.live.session.stale
    assert again.body == Session.open(FileStore(tmp_path), "conv").render(model=MODEL, max_tokens=100).body


def test_an_observe_record_in_a_family_is_no_candidate(tmp_path: Path) -> None:
    """A store written by an older compact proxy may hold an observe-mode record under an id of
    the engine's family (issue 46's "session metadata: fields mode, name, observed ... are unknown
    or missing"): the registry takes its id as used and never opens it as a session, so the
    family's next session is made and compacted, not failed open; a damaged session of its own
    still fails open with a `failure` event (test_middleware, the corrupt store)."""
    events: list[Event] = []
    store = FileStore(tmp_path)
    eng = CompactionEngine(store, summarizer=None, on_event=events.append)
    first = [{"role": "user", "content": "Fix the bug."}]
    p = eng.prepare({"model": MODEL, "max_tokens": 10, "messages": first}, explicit=None, now=1.0)
    assert not isinstance(p, ContextFull)
    sid = p.live.sid
    store.create(f"{sid}.2", {"session_id": f"{sid}.2", "observed": True, "name": sid, "mode": "compact"})
    fork = [*first, {"role": "assistant", "content": "A"}, {"role": "user", "content": "B"}]
    other = CompactionEngine(store, summarizer=None, on_event=events.append)  # a restart: nothing in memory
    for msgs in ([*first, {"role": "assistant", "content": "C"}, {"role": "user", "content": "D"}], fork):
        q = other.prepare({"model": MODEL, "max_tokens": 10, "messages": msgs}, explicit=None, now=2.0)
        assert not isinstance(q, ContextFull) and q.live.sid.startswith(sid)
    assert sorted(store.list()) == [sid, f"{sid}.2", f"{sid}.3"]  # the fork got the next free id
    assert not [e for e in events if e.kind == "failure"]


def test_the_exchange_is_one_sequence_without_io(tmp_path: Path) -> None:
    """Issue 49: prepare, send, the too-long retry and record were written three times (the sync
    middleware, the async middleware, the proxy). `RequestExchange` is the one sequence, driven
    here with no I/O at all: a 200 is the caller's, another 400 is the caller's, a prompt-too-long
    400 is compacted and sent once more, and a second one is refused as still too long."""
    from cachecompact import EngineOptions
    from cachecompact.base.http import too_long as parsed
    from cachecompact.base.values import Refuse, Send
    from cachecompact.engine.request_cycle import STILL_TOO_LONG

    from ..conftest import TOOLS, history

    too_long = {"type": "error", "error": {"type": "invalid_request_error",
                                           "message": "prompt is too long: 250000 tokens > 200000 maximum"}}
    other = {"type": "error", "error": {"type": "invalid_request_error", "message": "temperature: range 0..1"}}
    body = {"model": MODEL, "max_tokens": 100, "system": SHORT_SYSTEM, "tools": TOOLS, "messages": history(30, 2)}
    eng = CompactionEngine(FileStore(tmp_path), EngineOptions(), summarizer=None)
    ex = eng.exchange(body, explicit="conv", now=1.0)
    first = ex.start()
    assert isinstance(first, Send) and ex.prepared is not None and first.body == ex.prepared.body
    assert not ex.reads(200) and ex.reads(400)
    assert ex.received(200) is None and ex.received(400, other) is None  # relayed as they came
    again = ex.received(400, too_long)
    assert isinstance(again, Send) and again.body != first.body  # compacted, sent once more
    # and only once; the refusal names the session it is counted in (the proxy records it there)
    refused = ex.received(400, too_long)
    # in the API's words and numbers first, so a client that compacts on "prompt is too long"
    # (Claude Code) still does; ours follow
    assert isinstance(refused, Refuse) and refused.session_id == "conv"
    assert refused.message.startswith("prompt is too long: 250000 tokens > 200000 maximum (cachecompact: ")
    assert STILL_TOO_LONG in refused.message and parsed({"error": {"message": refused.message}}) == (250000, 200000, 0)
    # a retry that only max_tokens keeps out is the API's own 400, for the client to lower it
    ex2 = eng.exchange(body, explicit="conv2", now=2.0)
    assert isinstance(ex2.start(), Send) and isinstance(ex2.received(400, too_long), Send)
    over = {"type": "error", "error": {"type": "invalid_request_error", "message":
                                       "input length and `max_tokens` exceed context limit: 199950 + 100 > 200000"}}
    assert ex2.received(400, over) is None
    finding = ex.answered(Answer({"input_tokens": 10, "cache_creation_input_tokens": 0,
                                  "cache_read_input_tokens": 0, "output_tokens": 5}, "msg_1"))
    assert finding is not None and ex.prepared.live.session.requests_recorded == 1
    # a body the engine does not edit goes out unchanged: nothing to send but the caller's
    assert eng.exchange({"model": MODEL, "max_tokens": 1, "messages": []}, explicit=None, now=2.0).start() is None


def test_no_adapter_drives_the_retry_itself() -> None:
    """The too-long retry is driven from one place: no adapter calls the engine's ``prepare``,
    ``after_too_long`` or ``record`` but through `RequestExchange`."""
    import ast

    root = Path(cachecompact.__file__).parent / "adapters"
    # the steps only the exchange takes, called on anything; `prepare` and `record`, which other objects
    # have too (a response, the proxy's state), on anything named engine or eng
    only_exchange = {"prepare_or_fail_open", "after_too_long", "reactive"}
    calls = [f"{f.relative_to(root)}:{n.lineno} {n.func.attr}" for f in sorted(root.rglob("*.py"))
             for n in ast.walk(ast.parse(f.read_text())) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Attribute)
             and (n.func.attr in only_exchange or (n.func.attr in ("prepare", "record") and "eng" in ast.unparse(
                 n.func.value).rsplit(".", 1)[-1]))]
    assert calls == []


def test_a_renamed_session_folder_is_passed_over_with_one_warning(tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    """Issue 56: a session folder whose name is not its session.json's ``session_id`` (a copied or
    renamed folder) made every request of its family raise `KeyError` in the registry: a logged
    traceback, and the request went out uncompacted. It is passed over, with one warning naming
    the folder and the fix; the requests are the engine's as usual."""
    import shutil

    store = tmp_path / "s"
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "Count the modules."}]
    with Emulator() as emu:
        first = cachecompact.wrap(anthropic.Anthropic(base_url=emu.url, api_key="k", max_retries=0), store=store,
                                  session_id="job", summarizer=None)
        first.messages.create(model="claude-sonnet-4-6", max_tokens=64, system=SHORT_SYSTEM,
                              messages=msgs)  # type: ignore[arg-type]
        shutil.move(store / "job", store / "job.s7")  # renamed: its session.json still says "job"
        events: list[Event] = []
        again = cachecompact.wrap(anthropic.Anthropic(base_url=emu.url, api_key="k", max_retries=0), store=store,
                                  session_id="job", summarizer=None, on_event=events.append)
        with caplog.at_level(logging.WARNING, logger="cachecompact"):
            for _ in range(3):
                again.messages.create(model="claude-sonnet-4-6", max_tokens=64, system=SHORT_SYSTEM,
                                      messages=msgs)  # type: ignore[arg-type]
    assert not [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]
    said = [r.getMessage() for r in caplog.records if "job.s7" in r.getMessage()]
    assert len(said) == 1 and "holds session 'job'" in said[0] and "rename it back" in said[0]
    assert not [e for e in events if e.type == "failure"]
    stored = FileStore(store).open("job")  # the requests went through the engine, recorded
    assert len(stored.read_all("requests")) == 3
