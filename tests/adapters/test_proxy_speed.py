"""The compact proxy's per-request shortcuts (issue 57) give exactly what the long way gives."""

from __future__ import annotations

from typing import Any

from cachecompact import Session
from cachecompact.adapters.proxy._state import encoded, sent_keys
from cachecompact.base.tokens import TokenCounter
from cachecompact.base.values import Refuse, Send
from cachecompact.base.wire import bytes_as_is
from cachecompact.cache.simulator import request_from_body
from cachecompact.history.ledger import SkipRange


def _rendered(n: int) -> dict[str, Any]:
    s = Session.create(None, system="You are terse. " * 50)
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "start"}]
    for t in range(n):
        msgs += [{"role": "assistant", "content": [{"type": "text", "text": f"reply {t}"}]},
                 {"role": "user", "content": f"turn {t} " + "output " * 40}]
    s.sync(msgs)
    return s.render(model="claude-haiku-4-5", max_tokens=16).body


def test_sent_keys_give_the_analysis_the_canonical_keys_give() -> None:
    body = _rendered(12)
    sent = bytes_as_is(body)
    keys = sent_keys(sent, body)
    assert keys is not None and len(keys) == len(body["messages"])
    counter = TokenCounter()
    memo: dict[Any, Any] = {}
    fast = request_from_body(body, 1.0, counter, memo, keys=keys)
    again = request_from_body(body, 2.0, counter, memo, keys=keys)  # from the memo
    slow = request_from_body(body, 1.0, counter)
    assert fast.blocks == slow.blocks == again.blocks
    # a marker moved is other bytes, so another key: the memo never serves the old marker's block
    moved = {**body, "messages": [*body["messages"][:-1], {**body["messages"][-1], "content": [
        {**body["messages"][-1]["content"][0], "cache_control": {"type": "ephemeral", "ttl": "1h"}}]}]}
    moved_keys = sent_keys(bytes_as_is(moved), moved)
    assert moved_keys is not None and moved_keys[-1] != keys[-1] and moved_keys[:-1] == keys[:-1]
    assert request_from_body(moved, 3.0, counter, memo, keys=moved_keys).blocks == \
        request_from_body(moved, 3.0, counter).blocks


def test_sent_keys_refuse_bytes_that_are_not_the_body() -> None:
    body = _rendered(3)
    assert sent_keys(b"", body) is None
    assert sent_keys(b"not json", body) is None
    assert sent_keys(bytes_as_is({**body, "messages": body["messages"][:-1]}), body) is None


def test_encoded_is_the_send_bodys_bytes() -> None:
    body = _rendered(2)
    assert encoded(Send(body, ())) == bytes_as_is(body)
    assert encoded(Refuse("full", None)) == b"" and encoded(None) == b""


def test_blocks_are_block_of_each_index() -> None:
    s = Session.create(None, system="You are terse.", tools=[{"name": "read", "description": "Read.",
                                                              "input_schema": {"type": "object"}}])
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "start"}]
    for t in range(6):
        msgs += [{"role": "assistant", "content": [{"type": "text", "text": f"reading {t}"},
                                                   {"type": "tool_use", "id": f"t{t}", "name": "read",
                                                    "input": {"path": f"f{t}"}}]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{t}",
                                               "content": f"file {t} " * 30}]}]
    s.sync(msgs)
    s.edit(SkipRange(start=3, end=6))
    for r in (s.render(), s.render(transcript_len=5), s.render(at_entry=0)):
        assert r.blocks() == [r.block(k) for k in range(r.n_blocks)]
        assert [b.location for b in r.blocks()] == [r.location(k) for k in range(r.n_blocks)]


def _scan_from_scratch(t: Any, n: int) -> tuple[bool, list[int], list[int]]:
    """`CacheAwareCompactor._loop_ahead`'s reading of the transcript, as it was: all of it."""
    from itertools import pairwise

    from cachecompact.base.wire import RedactedThinkingBlock, ThinkingBlock, content_blocks

    thinks = any(t[i].role == "assistant" and any(isinstance(b, (ThinkingBlock, RedactedThinkingBlock))
                                                  for b in content_blocks(t[i])) for i in range(n - 1, -1, -1))
    people = [i for i in range(n) if t[i].role == "user" and not t.is_tool_result_message(i)]
    loops = [sum(1 for k in range(a + 1, b) if t[k].role == "assistant") for a, b in pairwise(people)]
    return thinks, people, loops


def test_loop_ahead_scan_extends_as_the_scan_from_scratch() -> None:
    from itertools import pairwise

    from cachecompact.base.events import EventBus
    from cachecompact.compaction.cache_aware import CacheAwareCompactor
    from cachecompact.compaction.strategy import StrategyContext
    from cachecompact.compaction.summarize.llm import ExtractiveSummarizer
    from cachecompact.history.draft import Draft

    s = Session.create(None, system="sys")
    c = CacheAwareCompactor(StrategyContext(Draft(s), ExtractiveSummarizer(), EventBus(), 100_000))
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "start"}]
    s.sync(msgs)
    for t in range(12):
        calls = t % 3  # a person's turn, then 0-2 tool calls answered
        for k in range(calls):
            think = [{"type": "thinking", "thinking": "hm", "signature": "sig"}] if t >= 7 and k == 0 else []
            msgs += [{"role": "assistant", "content": [*think, {"type": "tool_use", "id": f"u{t}_{k}", "name": "read",
                                                               "input": {}}]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"u{t}_{k}",
                                                   "content": "out"}]}]
        msgs += [{"role": "assistant", "content": f"done {t}"}, {"role": "user", "content": f"next {t}"}]
        s.sync(msgs)
        n = len(s.transcript)
        thinks, people, assistants = c._scanned(n)
        assert (thinks, people, [assistants[b] - assistants[a + 1] for a, b in pairwise(people)]) == \
            _scan_from_scratch(c.draft.transcript, n)
        assert thinks == (t >= 7 and any(t2 % 3 for t2 in range(7, t + 1)))
    # an earlier length (never asked for by the policy) is read again, not served from the longer scan
    thinks, people, assistants = c._scanned(5)
    assert (thinks, people, [assistants[b] - assistants[a + 1] for a, b in pairwise(people)]) == \
        _scan_from_scratch(c.draft.transcript, 5)


def test_caller_key_clients_share_connections_never_credentials() -> None:
    import threading

    from cachecompact.compaction.summarize.caller_key import CallerKeySummarizer, _http

    summ = CallerKeySummarizer("http://127.0.0.1:9", "claude-haiku-4-5", "forced-tool", threading.local())
    a, b = summ._client("sk-A", None), summ._client("sk-B", None)
    c = summ._client(None, "tok-C")
    assert a._client is b._client is c._client is _http()  # one pool: the CA store is loaded once
    assert (a.api_key, b.api_key, c.api_key, c.auth_token) == ("sk-A", "sk-B", None, "tok-C")
    assert a.timeout == b.timeout and a.max_retries == 2  # the SDK's own defaults, as before
