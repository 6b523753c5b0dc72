"""`cachecompact ledger verify` and a verifier written only from docs/ledger-format.md
(tests/spec_verifier.py, which imports nothing of cachecompact) agree on every tamper case of
benchmarks/tamper.py, the two the spec check once missed included: a space added inside a
stored record, and a CR before a line's newline; and they give the same verdict (invalid,
unconfirmed or ok) on each, a `summary` or `compaction` appended at the tail included."""

from __future__ import annotations

import contextlib
import io
import json
import random
import shutil
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from cachecompact.tools.cli import main as cli

from ..conftest import load_benchmark
from ..spec_verifier import check, verify as spec_verify

ROOT = Path(__file__).resolve().parents[2]
TRIALS = 240


def _tamper() -> ModuleType:
    return load_benchmark("tamper")


def _ours(d: Path) -> int:
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        return cli(["ledger", "verify", str(d)])


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[ModuleType, Path]:
    tamper = _tamper()
    d = tmp_path_factory.mktemp("spec") / "session"
    tamper.build(d)
    return tamper, d


def test_both_verifiers_pass_an_untouched_session(built: tuple[ModuleType, Path]) -> None:
    _, d = built
    assert _ours(d) == 0
    assert spec_verify(d) == []


@pytest.mark.slow
def test_both_verifiers_agree_on_every_tamper_case(built: tuple[ModuleType, Path], tmp_path: Path) -> None:
    tamper, d = built
    rng = random.Random(2026)
    disagree, kinds = [], set()
    for k in range(TRIALS):
        trial = tmp_path / f"t{k}"
        shutil.copytree(d, trial)
        what = tamper.mutate(trial, rng)
        kinds.add(what.split(" of ")[0].split(" in ")[0])
        ours = _ours(trial)
        report = check(trial)
        # one verdict each: invalid (exit 1, or 2 for a session that does not open), unconfirmed
        # (exit 3: docs/ledger-format.md, *Unconfirmed entries*), or ok
        theirs = "invalid" if report.problems else "unconfirmed" if report.unconfirmed else "ok"
        if {0: "ok", 3: "unconfirmed"}.get(ours, "invalid") != theirs:
            disagree.append((what, ours, theirs, report.problems[:2]))
        shutil.rmtree(trial)
    assert {"add a space inside a record", "add a CR before a newline", "append a forged summary entry at the tail",
            "append a forged compaction entry at the tail"} <= kinds
    assert disagree == []


def test_a_session_whose_prefix_is_empty_verifies_from_its_creation(tmp_path: Path) -> None:
    """prefix_messages=0 wrote prefix_end 0 with a null prefix_hash, which both verifiers
    refused until the first sync (found by the verifier written from the document)."""
    from cachecompact import Session

    d = tmp_path / "s"
    Session.create(d, system="You are careful.", prefix_messages=0)
    assert _ours(d) == 0 and spec_verify(d) == []


# -- issue 37: the cases the two verifiers disagreed on, the scratchpad, a torn first request ----------------

def _session_with_a_blob(d: Path) -> str:
    """A file session whose ledger names one scratchpad blob, as an L2 edit does."""
    from cachecompact import Session
    from cachecompact.history.ledger import ReplaceWithSummary
    from cachecompact.history.scratchpad import Scratchpad

    from ..conftest import history

    s = Session.create(d, system="You are careful.", prefix_messages=1)
    s.sync(history(4))
    ref = Scratchpad.for_session(s).put("the whole output\n" * 50)
    tid = s.messages()[2]["content"][0]["tool_use_id"]
    s.edit(ReplaceWithSummary(2, 2, f"[shortened; the full output is in the scratchpad as {ref}]", "L2", tid),
           level="L2")
    s.record_request(s.render(), {})  # the request that carried it (docs/ledger-format.md, *Unconfirmed entries*)
    return ref


def _verdicts(d: Path) -> tuple[int, list[str], str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        ours = cli(["ledger", "verify", str(d)])
    return ours, spec_verify(d), err.getvalue()


def test_a_changed_or_deleted_scratchpad_blob_is_caught_by_both_verifiers_and_never_served(tmp_path: Path) -> None:
    """An edited ``sp_<sha256>.txt`` was served to the model as a normal result, and a deleted
    one went unnoticed: the name is the content's hash, so every side now checks it."""
    from cachecompact import Session
    from cachecompact.history.scratchpad import Scratchpad

    d = tmp_path / "s"
    ref = _session_with_a_blob(d)
    assert _verdicts(d)[:2] == (0, [])
    blob = d / "scratchpad" / f"{ref}.txt"
    blob.write_bytes(blob.read_bytes().replace(b"whole", b"forged"))
    ours, theirs, err = _verdicts(d)
    assert ours == 1 and ref in err and "does not hash" in err
    assert theirs and "does not match its name" in theirs[0]
    text, is_error = Scratchpad.for_session(Session.open(d, readonly=True, verify=False)).handle_tool_call({"ref": ref})
    assert is_error and "forged" not in text and "does not match" in text
    blob.unlink()
    ours, theirs, err = _verdicts(d)
    assert ours == 1 and "deleted" in err and ref in err
    assert theirs and "missing (deleted)" in theirs[0]
    text, is_error = Scratchpad.for_session(Session.open(d, readonly=True, verify=False)).handle_tool_call({"ref": ref})
    assert is_error and "unknown" in text


def test_a_pretty_printed_session_json_and_a_deleted_log_are_invalid_for_both(tmp_path: Path) -> None:
    """The two cases `ledger verify` and the spec verifier disagreed on; the format now settles
    both (docs/ledger-format.md: *session.json*, *Verifying a session*)."""

    d = tmp_path / "s"
    _session_with_a_blob(d)
    meta = d / "session.json"
    original = meta.read_bytes()
    meta.write_text(json.dumps(json.loads(original), indent=2, sort_keys=True))
    ours, theirs, err = _verdicts(d)
    assert ours == 1 and "canonical" in err and theirs
    meta.write_bytes(original.rstrip(b"\n"))  # without the newline: accepted by both
    assert _verdicts(d)[:2] == (0, [])
    meta.write_bytes(original)
    (d / "requests.jsonl").unlink()
    ours, theirs, err = _verdicts(d)
    assert ours == 1 and "requests.jsonl" in err and "missing" in err
    assert any("requests.jsonl: missing" in t for t in theirs)


def test_a_torn_first_request_is_reported_as_torn_and_repaired(tmp_path: Path) -> None:
    """A kill between appending the message that completes the prefix and writing the prefix
    fields left both null: `ledger verify` called that INVALID and did not offer `--repair`."""

    from cachecompact import Session

    from ..conftest import history

    d = tmp_path / "s"
    s = Session.create(d, system="You are careful.", prefix_messages=3)
    meta_before = (d / "session.json").read_bytes()
    s.sync(history(3))
    (d / "session.json").write_bytes(meta_before)  # as if the process died before writing the prefix fields
    ours, theirs, err = _verdicts(d)
    assert ours == 0 and theirs == [] and "torn first request" in err and "--repair" in err
    assert json.loads((d / "session.json").read_bytes())["prefix_hash"] is None  # verify never writes
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        assert cli(["ledger", "verify", "--repair", str(d)]) == 0
    assert json.loads((d / "session.json").read_bytes())["prefix_hash"] == s.prefix_hash
    ours, theirs, err = _verdicts(d)
    assert ours == 0 and theirs == [] and "torn" not in err


def test_the_thinking_rule_is_exact_enough_for_the_spec_verifier(tmp_path: Path) -> None:
    """docs/ledger-format.md, *Thinking blocks*: a second program that knows only the document
    leaves out the same thinking blocks, so every recorded breakpoint's chained hash matches,
    with blocks left out (rules 1-3) and with a tool loop's latest turn sent whole (rule 4)."""
    from cachecompact import Session
    from cachecompact.history.ledger import ReplaceWithSummary

    def turn(k: int) -> list[dict[str, Any]]:
        return [{"role": "assistant", "content": [{"type": "thinking", "thinking": "", "signature": f"sig{k}"},
                                                  {"type": "tool_use", "id": f"t{k}", "name": "read",
                                                   "input": {"path": f"f{k}.py"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{k}",
                                              "content": f"contents of f{k}\n" * 40}]}]

    d = tmp_path / "s"
    s = Session.create(d, system="You are careful.", prefix_messages=1)
    h: list[dict[str, Any]] = [{"role": "user", "content": "Read the files."}]
    for k in range(6):
        h += turn(k)
        s.sync(h)
        s.record_request(s.render(model="claude-opus-5-5", max_tokens=100), {})
    s.edit(ReplaceWithSummary(1, 4, "read f0 and f1", "L3"), level="L3")  # made after messages 5-12
    r = s.render(model="claude-opus-5-5", max_tokens=100)  # answers message 11's call: rule 4
    assert r.thinking.drop_block and r.thinking.kept_invalid == 11
    assert set(r.thinking.strip) == {3, 5, 7, 9}  # 3 is summarized anyway
    s.record_request(r, {})
    h += turn(6)
    s.sync(h)
    r = s.render(model="claude-opus-5-5", max_tokens=100)
    assert not r.thinking.drop_block and set(r.thinking.strip) == {3, 5, 7, 9, 11}  # 13 came after the edit
    s.record_request(r, {})
    # a turn of nothing but thinking, invalidated by a later edit, is not rendered at all
    h += [{"role": "assistant", "content": [{"type": "thinking", "thinking": "", "signature": "sig-alone"}]},
          {"role": "user", "content": "go on"}]
    s.sync(h)
    s.record_request(s.render(model="claude-opus-5-5", max_tokens=100), {})
    s.edit(ReplaceWithSummary(5, 8, "read f2 and f3", "L3"), level="L3")
    r = s.render(model="claude-opus-5-5", max_tokens=100)
    assert 15 in r.thinking.strip and "sig-alone" not in json.dumps(r.body)
    assert [m["role"] for m in r.body["messages"]][-2:] == ["user", "user"]
    s.record_request(r, {})
    ours, theirs, err = _verdicts(d)
    assert (ours, theirs) == (0, []), (theirs, err)


def _heads(d: Path, head: str | None = None) -> tuple[tuple[int, str | None], tuple[bool, str | None]]:
    """Each verifier's verdict and printed head (``--head`` given to both when ``head``)."""
    from ..spec_verifier import check, extends

    out = io.StringIO()
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(out):
        rc = cli(["ledger", "verify", *(["--head", head] if head else []), str(d)])
    ours = next((line.split()[1] for line in out.getvalue().splitlines() if line.startswith("head ")), None)
    report = check(d)
    ok = not report.problems and (head is None or extends(report, head))
    return (rc, ours), (ok, report.head)


def test_the_verifiers_print_one_head_and_take_each_others(tmp_path: Path) -> None:
    """One definition of the head (docs/ledger-format.md, *The head*). A torn first request (the
    prefix fields not written) gave two heads, each refused by the other verifier; a head taken
    while the prefix formed was refused by `ledger verify` once the prefix completed (issue 46)."""
    from cachecompact import Session

    from ..conftest import history

    torn = tmp_path / "torn"
    s = Session.create(torn, system="You are careful.", prefix_messages=3)
    meta_before = (torn / "session.json").read_bytes()
    s.sync(history(3))
    s.record_request(s.render(), {"n": 1})
    (torn / "session.json").write_bytes(meta_before)
    (ours_rc, ours), (spec_ok, spec) = _heads(torn)
    assert ours_rc == 0 and spec_ok and ours == spec and ours is not None
    assert _heads(torn, spec)[0][0] == 0 and _heads(torn, ours)[1][0]

    forming = tmp_path / "forming"
    s2 = Session.create(forming, system="You are careful.", prefix_messages=3)
    s2.sync(history(0))
    (_, early), (_, early_spec) = _heads(forming)
    assert early == early_spec and early is not None
    s2.sync(history(3))
    s2.record_request(s2.render(), {"n": 1})
    (rc, later), (ok, later_spec) = _heads(forming, early)
    assert rc == 0 and ok and later == later_spec and later != early


def _reseal(d: Path, forge: Any) -> None:
    """Apply ``forge`` to the stored records, then recompute every hash, chain and commitment
    after it, as a forger who can write the store would (docs/ledger-format.md, *What the chains
    prove*): only the recorded breakpoints, which commit to the rendered bytes, still differ."""
    import hashlib

    import xxhash

    from cachecompact import Session
    from cachecompact.base.wire import canonical_bytes

    def rd(name: str) -> list[Any]:
        return [json.loads(line) for line in (d / name).read_bytes().split(b"\n")[:-1]]

    def wr(name: str, recs: list[Any]) -> None:
        (d / name).write_bytes(b"".join(canonical_bytes(r) + b"\n" for r in recs))

    tr, led, req = rd("transcript.jsonl"), rd("ledger.jsonl"), rd("requests.jsonl")
    forge(tr, led)
    chain = ["0" * 64]
    for r in tr:
        mb = canonical_bytes(r["m"])
        r["h"] = xxhash.xxh3_128_hexdigest(mb)
        r["c"] = hashlib.sha256(bytes.fromhex(chain[-1]) + mb).hexdigest()
        chain.append(r["c"])
    prev, heads = "0" * 64, ["0" * 64]
    for e in led:
        e["transcript_head"], e["prev_hash"] = chain[e["transcript_len"]], prev
        e.pop("hash")
        e["hash"] = prev = hashlib.sha256(canonical_bytes(e)).hexdigest()
        heads.append(prev)
    prev = "0" * 64
    for q in req:
        q["transcript_head"], q["ledger_head"] = chain[q["transcript_len"]], heads[q["ledger_len"]]
        q["prev_hash"] = prev
        q.pop("hash")
        q["hash"] = prev = hashlib.sha256(canonical_bytes(q)).hexdigest()
    wr("transcript.jsonl", tr)
    wr("ledger.jsonl", led)
    wr("requests.jsonl", req)
    meta = json.loads((d / "session.json").read_bytes())
    pe = meta["prefix_end"]
    meta["prefix_end"] = meta["prefix_hash"] = None
    (d / "session.json").write_bytes(canonical_bytes(meta) + b"\n")
    # recomputed too
    meta["prefix_end"], meta["prefix_hash"] = pe, Session.open(d, readonly=True, verify=False).prefix_hash
    (d / "session.json").write_bytes(canonical_bytes(meta) + b"\n")


def _forge_leaf(m: dict[str, Any]) -> None:
    if isinstance(m["content"], str):
        m["content"] += " FORGED"
        return
    for b in m["content"]:
        for key in ("text", "content", "thinking"):
            if isinstance(b.get(key), str):
                b[key] += " FORGED"
                return
            if isinstance(b.get(key), list):
                for x in b[key]:
                    if isinstance(x.get("text"), str):
                        x["text"] += " FORGED"
                        return
        if b.get("type") == "tool_use":
            b["input"] = {**b["input"], "forged": True}
            return
    raise AssertionError("nothing to forge")


def test_both_verifiers_catch_a_forgery_that_recomputes_every_chain(built: tuple[ModuleType, Path],
                                                                    tmp_path: Path) -> None:
    """A forger rewrites one message (each in turn) or a ledger entry's summary, and recomputes
    every hash, chain, commitment and the prefix hash after it. `ledger verify` caught 0 such
    cases and the spec verifier 13 of 31 (it stopped at the first cleared placeholder, whose
    ``~N tokens`` the document did not define; issue 46). Both now re-render every request from
    the state it commits to and compare its breakpoints, N included (*Token estimates*)."""
    _, base = built
    n = len((base / "transcript.jsonl").read_bytes().splitlines())
    cases: list[tuple[str, Any]] = [(f"message {i}", lambda tr, led, i=i: _forge_leaf(tr[i]["m"])) for i in range(n)]
    cases.append(("a summary", lambda tr, led: next(e for e in led if e.get("summary")).update(summary="FORGED")))
    missed = []
    for name, forge in cases:
        d = tmp_path / name.replace(" ", "_")
        shutil.copytree(base, d)
        _reseal(d, forge)
        ours, theirs, _ = _verdicts(d)
        if ours != 1 or not theirs:
            missed.append((name, ours, theirs[:1]))
    assert missed == []


def test_both_verifiers_refuse_a_mark_past_the_transcript_a_request_was_rendered_from(
        built: tuple[ModuleType, Path], tmp_path: Path) -> None:
    """A record's ``stable_before`` lies within the ``transcript_len`` it commits to. Only the spec
    verifier checked it; a request recorded after a lost race wrote another writer's larger mark."""
    import hashlib

    from cachecompact.base.wire import canonical_bytes

    _, base = built
    d = tmp_path / "s"
    shutil.copytree(base, d)
    recs = [json.loads(line) for line in (d / "requests.jsonl").read_bytes().split(b"\n")[:-1]]
    last = recs[-1]
    last["stable_before"] = last["transcript_len"] + 1
    last.pop("hash")
    last["hash"] = hashlib.sha256(canonical_bytes(last)).hexdigest()
    (d / "requests.jsonl").write_bytes(b"".join(canonical_bytes(r) + b"\n" for r in recs))
    ours, theirs, said = _verdicts(d)
    assert ours == 1 and "stable_before" in said and any("stable_before" in t for t in theirs), (said, theirs)


def test_requests_sent_before_the_prefix_was_complete_verify(tmp_path: Path) -> None:
    """A request rendered from fewer messages than the immutable prefix holds (an agent's first
    turn) is re-rendered from that state to check its breakpoints; the renderer compared such a
    state's partial prefix with the whole prefix's hash and refused it."""
    from cachecompact import Session

    from ..conftest import history

    d = tmp_path / "s"
    s = Session.create(d, system="You are careful. " * 200, prefix_messages=3)
    for n in (0, 1, 2, 4):
        s.sync(history(n))
        s.record_request(s.render(), {"n": n})
    assert _verdicts(d)[:2] == (0, [])


def test_an_unknown_field_in_an_entry_past_the_last_request_record_is_invalid_for_both(tmp_path: Path) -> None:
    """Issue 56: the two verifiers disagreed on an entry no request record commits to (made after
    the last request) that carries a field the format does not have, every hash recomputed: the
    spec verifier, reading the record as closed, said invalid, and ours, which ignored the
    field, said ok. Both read ledger lines as closed records now."""
    import hashlib

    from cachecompact import Session, SkipRange

    tamper = _tamper()
    d = tmp_path / "session"
    tamper.build(d)
    s = Session.open(d)
    s.edit(tamper._valid(s, [SkipRange(i, i, "old output") for i in range(len(s))])[0], level="L1")
    lines = (d / "ledger.jsonl").read_bytes().splitlines()
    assert _ours(d) == 0 and spec_verify(d) == []  # the genuine entry past the last record verifies
    rec = json.loads(lines[-1])
    del rec["hash"]
    rec["note"] = "an extra field"
    rec["hash"] = hashlib.sha256(tamper.canon(rec)).hexdigest()
    (d / "ledger.jsonl").write_bytes(b"\n".join([*lines[:-1], tamper.canon(rec)]) + b"\n")
    ours, theirs, err = _verdicts(d)
    assert ours == 1 and "unknown field 'note'" in err, err
    assert any("unknown field 'note'" in p for p in theirs), theirs
