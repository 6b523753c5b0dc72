"""API-written summaries in the ledger (issue 48): the `compaction` entry's rules, its rendering,
the thinking it keeps valid, and that `ledger verify`, the spec verifier (written from
docs/ledger-format.md alone), `render --at-entry` and a restarted process agree on its bytes.

The end-to-end path (the policy asking the API, in the background, through wrap() and the proxy,
with the emulator checking every thinking block) is tests/adapters/test_preserved_thinking.py and
tests/compaction/test_api_summary_policy.py."""

from __future__ import annotations

import contextlib
import io
import json
import random
from pathlib import Path
from typing import Any

import pytest

from cachecompact import Session
from cachecompact.base.errors import EditTouchesPrefixError, InvalidEditError
from cachecompact.history.ledger import ApiCompaction, ReplaceWithSummary, SkipRange
from cachecompact.tools.cli import main as cli

from ..spec_verifier import check

MODEL = "claude-opus-5-5"


def _turn(k: int, thinks: bool = True) -> list[dict[str, Any]]:
    head = [{"type": "thinking", "thinking": "", "signature": f"sig{k}"}] if thinks else []
    return [{"role": "assistant", "content": [*head, {"type": "tool_use", "id": f"t{k}", "name": "read",
                                                     "input": {"path": f"f{k}.py"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{k}",
                                          "content": f"contents of f{k}\n" * 40}]}]


def _session(d: Path, turns: int = 8) -> tuple[Session, list[dict[str, Any]]]:
    s = Session.create(d, system="You are careful.", prefix_messages=1)
    h: list[dict[str, Any]] = [{"role": "user", "content": "Read the files."}]
    for k in range(turns):
        h += _turn(k)
        s.sync(h)
        s.record_request(s.render(model=MODEL, max_tokens=100), {})
    return s, h


def _block(k: int) -> ApiCompaction:
    return ApiCompaction(0, 0, f"summary {k}: read files", f"emucp.{k:024x}.sig", "L3: test")


def _verdicts(d: Path) -> tuple[int, list[str]]:
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        rc = cli(["ledger", "verify", str(d)])
    return rc, check(d).problems


def test_the_block_opens_the_request_and_the_kept_turns_keep_their_thinking(tmp_path: Path) -> None:
    s, h = _session(tmp_path / "s")
    b = _block(1)
    s.edit(ApiCompaction(0, 6, b.content, b.signature, b.reason), level="L3")  # messages 0..6; 7 is an assistant
    r = s.render(model=MODEL, max_tokens=100)
    first = r.body["messages"][0]
    assert first == {"role": "assistant", "content": [{"type": "compaction", "content": b.content,
                                                       "signature": b.signature}]}
    plain = s.render(model=MODEL, max_tokens=100, breakpoints=False)
    assert plain.body["messages"][1:] == [
        {"role": m["role"], "content": m["content"]} for m in h[7:]]  # verbatim, thinking included
    assert not r.thinking.strip and not r.thinking.drop_block
    assert "compact-2026-09-04" in r.betas
    assert r.prefix_hash == s.prefix_hash  # the first messages' hash, from the transcript
    s.record_request(r, {})
    # rendered before the entry, the first messages are there again
    before = s.render(model=MODEL, max_tokens=100, uncompacted=True)
    assert before.body["messages"][0]["content"] == "Read the files." or \
        before.body["messages"][0]["content"][0]["text"] == "Read the files."
    assert _verdicts(tmp_path / "s") == (0, [])


def test_an_edit_after_the_block_strips_thinking_after_it_only(tmp_path: Path) -> None:
    s, h = _session(tmp_path / "s")
    b = _block(2)
    s.edit(ApiCompaction(0, 4, b.content, b.signature, b.reason), level="L3")
    s.record_request(s.render(model=MODEL, max_tokens=100), {})
    h += [{"role": "assistant", "content": [{"type": "text", "text": "done"}]}, {"role": "user", "content": "more"}]
    s.sync(h)
    s.edit(SkipRange(8, 8, "L1: old output"), level="L1")  # clears message 8's result in place
    r = s.render(model=MODEL, max_tokens=100)
    assert set(r.thinking.strip) == {9, 11, 13, 15}  # after the clear; 5 and 7 stay valid
    s.record_request(r, {})
    assert _verdicts(tmp_path / "s") == (0, [])


def test_the_ledger_refuses_a_compaction_that_does_not_fit_the_docs(tmp_path: Path) -> None:
    s, _ = _session(tmp_path / "s")
    b = _block(3)
    with pytest.raises(InvalidEditError, match="start at message 0"):
        s.edit(ApiCompaction(1, 6, b.content, b.signature), level="L3")
    with pytest.raises(InvalidEditError, match="end on a user message"):
        s.edit(ApiCompaction(0, 5, b.content, b.signature), level="L3")
    with pytest.raises(InvalidEditError, match="signature"):
        s.edit(ApiCompaction(0, 6, b.content, ""), level="L3")
    s.edit(ApiCompaction(0, 6, b.content, b.signature), level="L3")
    with pytest.raises(EditTouchesPrefixError, match="start after message 6"):
        s.edit(ReplaceWithSummary(1, 8, "x", "L3"), level="L3")
    s.edit(SkipRange(8, 8, "L1"), level="L1")  # after it: fine
    s.edit(ApiCompaction(0, 10, "summary 4", "emucp.sig4", "L3"), level="L3")  # contains both
    assert [e.start for e in s.ledger.effective()] == [0]
    s.record_request(s.render(model=MODEL, max_tokens=100), {})  # the request that carried them
    assert _verdicts(tmp_path / "s") == (0, [])


def test_an_unconfirmed_compaction_is_rendered_only_by_the_session_that_made_it(tmp_path: Path) -> None:
    """docs/ledger-format.md, *Unconfirmed entries*: the process that made an
    API-written summary renders it (its request failed, say, and is tried again); one that opens
    the store finds no request record committing to it and refuses every render that would apply
    it, naming it, until a request of the process that made it is recorded; then both agree."""
    from cachecompact.base.errors import UnconfirmedEntryError

    d = tmp_path / "s"
    s, _ = _session(d)
    b = _block(6)
    entry = s.edit(ApiCompaction(0, 6, b.content, b.signature, b.reason), level="L3")
    s.edit(SkipRange(8, 8, "L1: old output"), level="L1")  # an entry after it, as a plan makes
    assert s.unconfirmed() == []  # its own
    mine = s.render(model=MODEL, max_tokens=100)
    assert mine.body["messages"][0]["content"][0]["type"] == "compaction"
    other = Session.open(d, readonly=True)  # opens fine: shown and reported on, never rendered with it
    assert other.unconfirmed() == [entry.seq] and other.confirmed_entries == entry.seq
    with pytest.raises(UnconfirmedEntryError, match=f"#{entry.seq}") as err:
        other.render(model=MODEL, max_tokens=100)
    assert err.value.session_id == s.session_id and err.value.entries == [entry.seq]
    with pytest.raises(UnconfirmedEntryError):
        other.render(at_entry=entry.seq + 1)
    assert other.render(uncompacted=True).body["messages"][0]["role"] == "user"
    with contextlib.redirect_stderr(io.StringIO()) as err_out, contextlib.redirect_stdout(io.StringIO()) as out:
        rc = cli(["render", str(d)])
    assert rc == 2 and "unconfirmed" in err_out.getvalue() and out.getvalue() == ""
    assert _verdicts(d)[0] == 3 and check(d).unconfirmed == [entry.seq]
    s.record_request(mine, {})  # its request was answered: confirmed for everyone
    again = Session.open(d, readonly=True)
    assert again.unconfirmed() == []
    assert again.render(model=MODEL, max_tokens=100).to_json() == s.render(model=MODEL, max_tokens=100).to_json()
    assert _verdicts(d) == (0, []) and check(d).unconfirmed == []


@pytest.mark.parametrize("seed", range(6))
def test_a_seeded_family_of_ledgers_verifies_alike_and_renders_alike_after_a_restart(
        seed: int, tmp_path: Path) -> None:
    """Random sessions (turns with and without thinking, people's turns), random edits of all
    three kinds where the rules allow them: the ledger and the spec verifier agree on every
    entry, every recorded request verifies, and a restarted process renders the same bytes."""
    rng = random.Random(seed)
    d = tmp_path / "s"
    s = Session.create(d, system="You are careful.", prefix_messages=rng.choice([1, 3]))
    h: list[dict[str, Any]] = [{"role": "user", "content": "Go."}]
    made = 0
    for k in range(30):
        if rng.random() < 0.2:
            h += [{"role": "assistant", "content": [{"type": "text", "text": f"step {k} done"}]},
                  {"role": "user", "content": f"next {k}"}]
        else:
            h += _turn(k, thinks=rng.random() < 0.7)
        s.sync(h)
        if s.prefix_end is not None and rng.random() < 0.3:
            n = len(s.transcript)
            floor = s.edit_floor or 0
            ends = [i for i in range(max(floor, (s.prefix_end or 1) - 1), n - 1)
                    if s.transcript[i].role == "user" and s.transcript[i + 1].role == "assistant"]
            if ends and rng.random() < 0.5:
                s.edit(ApiCompaction(0, rng.choice(ends), f"summary {k}", f"emucp.{k}", "L3"), level="L3")
                made += 1
            elif n - 1 > floor:
                i = rng.randrange(floor, n - 1)
                if s.transcript.is_tool_result_message(i):
                    with contextlib.suppress(InvalidEditError):
                        s.edit(SkipRange(i, i, "L1"), level="L1")
        s.record_request(s.render(model=MODEL, max_tokens=100), {})
    body = s.render(model=MODEL, max_tokens=100).to_json()
    assert _verdicts(d) == (0, [])
    again = Session.open(d)
    assert again.render(model=MODEL, max_tokens=100).to_json() == body
    for k in range(len(s.ledger)):  # render --at-entry K is the same in both processes
        assert again.render(at_entry=k, model=MODEL, max_tokens=100).to_json() == \
            s.render(at_entry=k, model=MODEL, max_tokens=100).to_json()
    if made:
        assert json.loads(body)["messages"][0]["content"][0]["type"] == "compaction"


def test_a_changed_signature_is_caught_by_both_verifiers(tmp_path: Path) -> None:
    d = tmp_path / "s"
    s, _ = _session(d)
    b = _block(5)
    s.edit(ApiCompaction(0, 6, b.content, b.signature, b.reason), level="L3")
    s.record_request(s.render(model=MODEL, max_tokens=100), {})
    led = d / "ledger.jsonl"
    lines = led.read_bytes().split(b"\n")
    rec = json.loads(lines[0])
    rec["signature"] = "emucp.forged"
    # a forger who recomputes the entry's hash: the chain after it and the request's breakpoints catch it
    import hashlib

    from cachecompact.base.wire import canonical_bytes
    rec.pop("hash")
    rec["hash"] = hashlib.sha256(canonical_bytes(rec)).hexdigest()
    lines[0] = canonical_bytes(rec)
    led.write_bytes(b"\n".join(lines))
    rc, problems = _verdicts(d)
    assert rc == 1 and problems
