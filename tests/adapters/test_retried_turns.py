"""A client's retry of a turn that got no answer is never a new session (issue 62, item 5).

Claude Code, refused a turn as too long, sends it again rewritten by its own compaction, and
again, until one fits; at a 30k window each failed attempt was a linked segment of its own with
one error in it (observe mode: one conversation in 21 sessions). The rule (`identity.decide`):
a request that opens like a session whose every request ended in an error takes that session
over. Here the failing attempt is a request whose ``max_tokens`` the window cannot hold (the
emulator's 400, as the API's), and its retry a different rewrite with a smaller ``max_tokens``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anthropic
import pytest

from cachecompact.adapters.proxy import Proxy, ProxyConfig
from cachecompact.engine.identity import RequestHistory, decide
from cachecompact.history.transcript import message_hash
from cachecompact.store import open_store
from cachecompact.tools.emulator import Emulator

from ..conftest import API_VERSION

MODEL = "claude-sonnet-4-6"
WINDOW = 16_000


def _user(t: str) -> dict[str, Any]:
    return {"role": "user", "content": t}


def _said(t: str) -> dict[str, Any]:
    return {"role": "assistant", "content": t}


class C:
    def __init__(self, sid: str, msgs: list[Any]) -> None:
        self.sid, self.preamble, self.identities = sid, b"h", [message_hash(m) for m in msgs]


def test_a_request_opening_like_a_failed_session_retries_it() -> None:
    task, done = _user("the task " * 40), _said("ok")
    base = C("job", [task, done, _user("go on")])
    failed = C("job.a2", [task, _user("summary one"), _user("go on")])
    req = RequestHistory(b"h", [message_hash(m) for m in [task, _user("summary two"), _user("go on")]])
    d = decide(req, [base, failed], named=True, failed=frozenset({"job.a2"}))
    assert (d.kind, d.target, d.at) == ("retry", "job.a2", 1)
    # without the failure known (the attempt still under way, or answered): another session, as before
    assert decide(req, [base, failed], named=True).kind in ("segment", "agent")
    # a request that opens otherwise is not a retry of it
    other = RequestHistory(b"h", [message_hash(_user("another task"))])
    assert decide(other, [base, failed], named=True, failed=frozenset({"job.a2"})).kind != "retry"
    # a request that continues a session is no retry, whatever failed
    more = RequestHistory(b"h", [*base.identities, message_hash(_said("more"))])
    assert decide(more, [base, failed], named=True, failed=frozenset({"job.a2"})).kind == "continue"


@pytest.mark.parametrize("mode", ["observe", "compact"])
def test_a_retried_rewrite_is_one_session_with_its_failed_attempt(tmp_path: Path, mode: str) -> None:
    task = _user("Read the project and fix the bug. " * 60)
    with Emulator(context_window=WINDOW) as emu, \
            Proxy(ProxyConfig(upstream=emu.url, port=0, mode=mode, store=str(tmp_path / "s"))) as px:
        client = anthropic.Anthropic(base_url=px.url, api_key="sk-test", max_retries=0,
                                     default_headers={**API_VERSION, "x-cachecompact-session": "job"})

        def send(messages: list[dict[str, Any]], max_tokens: int = 1000) -> int:
            try:
                client.messages.create(model=MODEL, max_tokens=max_tokens, messages=messages)
                return 200
            except anthropic.BadRequestError as err:
                return err.status_code

        first = [task]
        assert send(first) == 200
        reply = {"role": "assistant", "content": [{"type": "text", "text": "Looking."}]}
        assert send([*first, reply, _user("go on")]) == 200
        # the client's own compaction, sent with a reserve the window cannot hold: the API's 400
        assert send([task, _said("summary, first try"), _user("go on")], max_tokens=WINDOW) == 400
        if mode == "compact":  # stored before the client has the error: the retry that takes it over keeps it
            stored = open_store(str(tmp_path / "s")).open("job.s2").read_events()
            assert [e["status"] for e in stored if e["kind"] == "observation"] == [400], stored
        # ... and again, rewritten otherwise, with a reserve it can: answered
        assert send([task, _said("summary, second try"), _user("go on")]) == 200
        px.wait_idle()
        sessions = {s.sid: s for s in px.state.observer.sessions()}
    assert sorted(sessions) == ["job", "job.s2"], sorted(sessions)  # a rewrite; not job.s3 for its retry
    retried = sessions["job.s2"]
    assert (retried.requests, retried.errors) == (2, 1)  # the failed attempt is counted where its retry is
    store = open_store(str(tmp_path / "s"))
    assert sorted(store.list("job")) == ["job", "job.s2"]
    events = store.open("job.s2").read_events()
    assert [e["status"] for e in events if e["kind"] == "observation"] == [400, 200], events  # both kept
    if mode == "compact":
        assert any(e["kind"] == "retried" and e["detail"]["unanswered"] == 1 for e in events), events
