from __future__ import annotations

import json
from pathlib import Path

import pytest

from cachecompact import ReplaceWithSummary, Session, SkipRange
from cachecompact.tools.cli import UsageError, main

from ..conftest import SYSTEM, TOOLS, history


@pytest.fixture
def session_dir(tmp_path: Path) -> Path:
    s = Session.create(tmp_path / "s", system=SYSTEM, tools=TOOLS)
    s.sync(history(8))
    s.edit(SkipRange(4, 4, "old output"), level="L1")
    s.sync(history(10))
    s.edit(ReplaceWithSummary(3, 12, "did things"), level="L4")
    # the request the edits were made for, answered: a summary no record commits to is one no
    # other process renders (docs/ledger-format.md, *Unconfirmed entries*)
    s.record_request(s.render(), {})
    return tmp_path / "s"


def test_ledger_show(session_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ledger", "show", str(session_dir)]) == 0
    out = capsys.readouterr().out
    assert "summary" in out and "3..12" in out and "L4" in out and "old output" in out


def test_ledger_verify_ok_and_names_first_bad_line(session_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ledger", "verify", str(session_dir)]) == 0
    assert "2 ledger entries" in capsys.readouterr().out
    p = session_dir / "ledger.jsonl"
    lines = p.read_bytes().split(b"\n")
    rec = json.loads(lines[1])
    rec["summary"] = "tampered"
    lines[1] = json.dumps(rec).encode()
    p.write_bytes(b"\n".join(lines))
    assert main(["ledger", "verify", str(session_dir)]) == 1
    err = capsys.readouterr().err
    assert "ledger.jsonl:2" in err


def test_render_at_entry(session_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render", str(session_dir), "--at-entry", "0", "--model", "claude-haiku-4-5"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["model"] == "claude-haiku-4-5"
    assert len(body["messages"]) == 17  # transcript length 17 when entry 0 was made
    assert "cleared to save context" in json.dumps(body)
    assert main(["render", str(session_dir), "--at-entry", "9"]) == 2


def test_missing_dir_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ledger", "show", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert "no session" in err and str(tmp_path / "nope") in err and "--store" in err


def test_report_of_an_unknown_id_says_where_it_looked(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 37: ``report <id>`` without ``--store`` did not say where it had looked."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".cachecompact" / "sessions" / "job-42").mkdir(parents=True)
    assert main(["report", "job-41"]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path / "job-41") in err and str(tmp_path / ".cachecompact" / "sessions" / "job-41") in err
    assert "similar ids there: job-42" in err and "--store" in err


@pytest.mark.parametrize(("argv", "says"), [
    (["serve", "--port", "99999"], "--port must be between 0 and 65535"),
    (["serve", "--trace", "missing.json"], "missing.json: no such file"),
    (["serve", "--fault-rate", "2"], "--fault-rate must be between 0 and 1"),
    (["serve", "--log", "/nonexistent/dir/log.jsonl"], "/nonexistent/dir"),
    (["proxy", "--mode", "compact", "--lookback-coverage", "1.5"], "--lookback-coverage must be between 0 and 1"),
    (["proxy", "--mode", "compact", "--lookback-coverage", "0.9", "--recent-tokens", "5"],
     "--lookback-coverage and --recent-tokens exclude each other"),
    (["proxy", "--lookback-coverage", "0.9"], "--lookback-coverage applies only with --mode compact"),
    (["proxy", "--recent-tokens", "20000", "--window", "100000"],
     "--recent-tokens, --window apply only with --mode compact"),
    (["proxy", "--model-prices", "/nonexistent/prices.json"], "--model-prices /nonexistent/prices.json"),
    (["whatif", "/nonexistent/logs", "--model-prices", "/nonexistent/p.json"], "--model-prices /nonexistent/p.json"),
    (["bench", "--window", "-5"], "--window must be between 8000 and 10000000"),
    (["bench", "--window", "99999999999"], "--window must be between 8000 and 10000000"),
    (["bench", "--out", "/proc/x"], "--out /proc/x"),
    (["bench", "--strategy", "magic"], "unknown strategy 'magic'"),
    (["bench", "--model", "gpt-9"], "gpt-9"),
    (["report", "/nonexistent", "--plot", "/nonexistent/x.png"], "--plot"),
    (["render", "/nonexistent", "--at-entry", "-1"], "--at-entry must be at least 0"),
    (["forensics", "/nonexistent/logs"], "no such file or folder: /nonexistent/logs"),
    (["store", "list", "/nonexistent/store"], "no such store folder"),
    (["store", "list", "--store", "/nonexistent/store"], "no such store folder"),
    (["store", "list", "/a", "--store", "/b"], "two stores given"),
    # issue 62: a command without its SESSION says how to list a store's sessions
    (["report", "--store", "/nonexistent/store"], "`cachecompact store list [--store URL]` lists a store's sessions"),
    (["ledger", "verify"], "required: SESSION (a session folder or id; `cachecompact store list"),
    # issue 62: a missing --store folder is named, not read as a missing session
    (["ledger", "verify", "S", "--store", "/nonexistent/store"], "--store /nonexistent/store: no such store folder"),
    (["report", "S", "--store", "/nonexistent/store"], "--store /nonexistent/store: no such store folder"),
    (["frobnicate"], "invalid choice"),
    ([], "required"),
])
def test_every_error_is_one_line_before_any_work(argv: list[str], says: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cachecompact: error: ") and says in lines[0], cap.err
    assert "Traceback" not in cap.err and not cap.out


@pytest.mark.parametrize(("upstream", "says"), [
    ("http://", "names no host"),
    ("http://localhost:abc", "has port 'abc', not a number from 1 to 65535"),
    ("http://localhost:8080 ", "contains a space or control character; remove it"),
    ("http://[::1", "an IPv6 address goes in brackets: http://[::1]:8080"),
])
def test_a_mistyped_upstream_is_one_line_naming_the_flag(upstream: str, says: str,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 62: each of these was "internal error ValueError" from deep in urllib or the pool."""
    from cachecompact.base.errors import ConfigError

    assert main(["proxy", "--upstream", upstream, "--port", "0"]) == 2
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"cachecompact: error: --upstream {upstream!r} "), cap.err
    assert says in lines[0] and "internal error" not in cap.err and "Traceback" not in cap.err and not cap.out
    with pytest.raises(ConfigError, match=r"^--upstream "):  # typed: --debug shows the same error
        main(["proxy", "--upstream", upstream, "--port", "0", "--debug"])


def test_an_upstream_ending_in_v1_is_not_doubled(capsys: pytest.CaptureFixture[str]) -> None:
    """opencode's ``baseURL`` ends in /v1; given as ``--upstream`` it sent every request to
    /v1/v1/messages (a 404). The trailing /v1 is dropped, and --help says so."""
    import anthropic

    from cachecompact.adapters.httpserver import spawn_cli_server
    from cachecompact.tools.emulator import Emulator

    with pytest.raises(SystemExit):
        main(["proxy", "--help"])
    assert "trailing /v1" in " ".join(capsys.readouterr().out.split())
    with Emulator() as emu:
        proc, url = spawn_cli_server(["proxy", "--upstream", emu.url + "/v1/", "--port", "0"], quiet=True)
        try:
            client = anthropic.Anthropic(base_url=url, api_key="test", max_retries=0)
            out = client.messages.create(model="claude-haiku-4-5", max_tokens=5,
                                         messages=[{"role": "user", "content": "hi"}])
            assert out.content[0].type == "text"
        finally:
            proc.terminate()
            proc.wait(10)
        assert [r["status"] for r in emu.requests] == [200]


def test_store_list_takes_the_store_as_the_other_commands_do(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    from cachecompact import Session
    from cachecompact.store import FileStore

    Session.create(FileStore(tmp_path / "st"), session_id="job-1", system="s")
    assert main(["store", "list", str(tmp_path / "st")]) == 0
    assert main(["store", "list", "--store", str(tmp_path / "st")]) == 0
    assert capsys.readouterr().out == "job-1\njob-1\n"


def test_store_list_says_when_a_store_has_no_sessions(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 62: an empty store printed nothing. One line on stderr says so, stdout stays a list of ids."""
    from cachecompact import Session
    from cachecompact.store import FileStore

    (tmp_path / "empty").mkdir()
    assert main(["store", "list", str(tmp_path / "empty")]) == 0
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err == f"no sessions in {tmp_path / 'empty'}\n"
    Session.create(FileStore(tmp_path / "st"), session_id="job-1", system="s")
    assert main(["store", "list", str(tmp_path / "st"), "--prefix", "run-"]) == 0
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err == f"no sessions with prefix 'run-' in {tmp_path / 'st'}\n"


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    from cachecompact.base.errors import SessionNotFoundError

    with pytest.raises(SessionNotFoundError):
        main(["ledger", "show", str(tmp_path / "nope"), "--debug"])


def test_serve_on_a_port_in_use_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert main(["serve", "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot listen" in err and "--port 0 takes a free one" in err


def test_report_prints_its_text_even_when_the_plot_fails(session_dir: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib", reason="the [plot] extra is not installed")
    bad = tmp_path / "plot.nosuchformat"  # passes the up-front checks, fails in the plotter
    assert main(["report", str(session_dir), "--plot", str(bad)]) == 2
    cap = capsys.readouterr()
    assert "transcript:" in cap.out and "the plot was not written" in cap.err


def test_report_opens_with_the_summary_and_can_stop_there(session_dir: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(session_dir)]) == 0
    full = capsys.readouterr().out
    assert full.index("by level") < full.index("compactions:")  # the summary before the detail
    row = next(ln for ln in full.splitlines() if ln.startswith("L4 "))
    assert row.split()[1] == "1" and int(row.split()[2].replace(",", "")) > 0  # one edit, tokens it removed
    assert max(len(ln) for ln in full.splitlines()) <= 120
    assert main(["report", str(session_dir), "--summary"]) == 0
    short = capsys.readouterr().out
    assert "by level" in short and "compactions:" not in short and len(short.splitlines()) < len(full.splitlines())


def test_verify_never_writes_and_repair_sets_a_torn_tail_aside(session_dir: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    p = session_dir / "transcript.jsonl"
    with open(p, "ab") as f:
        f.write(b'{"h":"torn')  # a torn append: no newline
    before = {q.name: q.read_bytes() for q in session_dir.iterdir() if q.is_file()}
    assert main(["ledger", "verify", str(session_dir)]) == 0
    assert "torn" in capsys.readouterr().err
    assert {q.name: q.read_bytes() for q in session_dir.iterdir() if q.is_file()} == before
    assert main(["ledger", "verify", str(session_dir), "--repair"]) == 0
    assert "repaired" in capsys.readouterr().err
    assert not p.read_bytes().endswith(b"torn") and list(session_dir.glob("transcript.jsonl.torn.*"))
    assert main(["ledger", "verify", str(session_dir)]) == 0
    assert "torn" not in capsys.readouterr().err


def test_verify_creates_no_lock_file_and_an_edited_prefix_is_invalid(session_dir: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    (session_dir / ".lock").unlink(missing_ok=True)  # an archived copy, or a read-only mount
    names = sorted(q.name for q in session_dir.iterdir())
    assert main(["ledger", "verify", str(session_dir)]) == 0
    assert sorted(q.name for q in session_dir.iterdir()) == names
    meta_p = session_dir / "session.json"
    meta = json.loads(meta_p.read_text())
    meta["system"] = "You are a different assistant."  # the immutable prefix, edited
    meta_p.write_text(json.dumps(meta))
    capsys.readouterr()
    assert main(["ledger", "verify", str(session_dir)]) == 1
    assert "INVALID" in capsys.readouterr().err
    assert main(["ledger", "verify", str(session_dir.parent / "missing")]) == 2  # no verdict: no session


def test_verify_head_detects_a_rollback(session_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # an entry after the newest request record, so that dropping it leaves every commitment whole
    Session.open(session_dir).edit(SkipRange(20, 20, "old output"), level="L1")
    assert main(["ledger", "verify", str(session_dir)]) == 0
    head = capsys.readouterr().out.split("head ")[-1].strip()
    assert main(["ledger", "verify", str(session_dir), "--head", head]) == 0
    p = session_dir / "ledger.jsonl"
    p.write_bytes(b"".join(p.read_bytes().splitlines(keepends=True)[:-1]))  # drop the last entry whole
    assert main(["ledger", "verify", str(session_dir)]) == 0  # consistent on its own ...
    capsys.readouterr()
    assert main(["ledger", "verify", str(session_dir), "--head", head]) == 1  # ... but not what was acknowledged
    assert "does not extend head" in capsys.readouterr().err


def test_demo_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--out", str(tmp_path / "d")]) == 0
    out = capsys.readouterr().out
    assert "explained by ledger entry" in out
    # issue 56: the demo sends its compacted request to a local emulator and records it, so the
    # record commits to its summary and the session verifies (it was UNCONFIRMED, exit 3, when the
    # demo sent nothing)
    assert "sent to the local emulator" in out and "ledger verify" in out and "--uncompacted" in out
    assert main(["ledger", "verify", str(tmp_path / "d")]) == 0
    assert "UNCONFIRMED" not in capsys.readouterr().err
    assert main(["ledger", "show", str(tmp_path / "d")]) == 0
    assert main(["render", str(tmp_path / "d"), "--uncompacted"]) == 0


def test_serve_starts_an_emulator_the_sdk_can_use(tmp_path: Path) -> None:
    import anthropic

    from cachecompact.adapters.httpserver import spawn_cli_server

    log = tmp_path / "req.jsonl"
    proc, url = spawn_cli_server(["serve", "--port", "0", "--log", str(log)])
    try:
        client = anthropic.Anthropic(base_url=url, api_key="test", max_retries=0)
        out = client.messages.create(model="claude-haiku-4-5", max_tokens=5,
                                     messages=[{"role": "user", "content": "hi"}])
        assert out.content[0].type == "text"
        with pytest.raises(anthropic.BadRequestError):  # issue 62: a refused request is logged too
            client.messages.create(model="claude-haiku-4-5", max_tokens=5, messages=[])
    finally:
        proc.terminate()
        proc.wait(10)
    assert [json.loads(line)["status"] for line in log.read_text().splitlines()] == [200, 400]


def test_repair_says_what_it_cannot_mend(session_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A truncated transcript (a whole record gone, not a torn tail): --repair says it mends only
    a torn last line, and the verdict stays INVALID."""
    p = session_dir / "transcript.jsonl"
    lines = p.read_bytes().splitlines(keepends=True)
    p.write_bytes(b"".join(lines[:1] + lines[2:]))  # a record removed from the middle
    capsys.readouterr()
    assert main(["ledger", "verify", str(session_dir), "--repair"]) == 1
    err = capsys.readouterr().err
    assert "INVALID" in err and "mends only a torn last line" in err


def test_start_up_loads_only_what_a_command_uses() -> None:
    """`import cachecompact` and `cachecompact --help` load neither the SDK nor the engine (the
    help answered in about 6 s on a loaded machine); the CLI's defaults agree with the session's."""
    import subprocess
    import sys

    from cachecompact.history import session
    from cachecompact.tools import cli

    assert (cli.DEFAULT_MODEL, cli.DEFAULT_MAX_TOKENS) == (session.DEFAULT_MODEL, session.DEFAULT_MAX_TOKENS)
    probe = ("import sys, cachecompact, cachecompact.tools.cli\n"
             "try:\n    cachecompact.tools.cli.main(['--help'])\nexcept SystemExit:\n    pass\n"
             "mods = [m for m in sys.modules if m.startswith('cachecompact')]\n"
             "print(len(mods), 'anthropic' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    n, sdk = out.strip().splitlines()[-1].split()
    assert int(n) <= 3 and sdk == "False", out[-300:]
    import cachecompact

    assert cachecompact.wrap is not None and cachecompact.store.FileStore is not None  # loaded on first use


def test_an_unlisted_model_is_one_line_naming_the_nearest_ids(session_dir: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render", str(session_dir), "--model", "claude-sonnet-4.6"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nearest: claude-sonnet-4-6" in err
    prices = tmp_path / "prices.json"
    prices.write_text('{"claude-lab-cli": {"input": 3, "output": 15}}')  # registered for the process: a new name
    assert main(["render", str(session_dir), "--model", "claude-lab-cli", "--model-prices", str(prices)]) == 0


def test_the_dashboard_token_comes_from_a_file_or_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """``--auth-token`` shows in ``ps`` to every user of the machine (issue 46): a token file
    (not readable by others) or CACHECOMPACT_AUTH_TOKEN carries it instead; the flag still
    works, with a warning."""
    from cachecompact.tools.cli import _auth_token, build_parser

    def token(*argv: str) -> str | None:
        return _auth_token(build_parser().parse_args(["proxy", *argv]))

    f = tmp_path / "token"
    f.write_text("s3cret-token\n")
    f.chmod(0o600)
    assert token("--auth-token-file", str(f)) == "s3cret-token"
    f.chmod(0o644)
    with pytest.raises(UsageError, match=r"readable by others.*chmod 600"):
        token("--auth-token-file", str(f))
    with pytest.raises(UsageError, match="cannot be read"):
        token("--auth-token-file", str(tmp_path / "missing"))
    monkeypatch.setenv("CACHECOMPACT_AUTH_TOKEN", "from-env")
    assert token() == "from-env"
    capsys.readouterr()
    assert token("--auth-token", "on-argv") == "on-argv"
    assert "shows in `ps`" in capsys.readouterr().err
    f.chmod(0o600)
    with pytest.raises(UsageError, match="one way"):
        token("--auth-token", "x", "--auth-token-file", str(f))
    assert main(["proxy", "--host", "0.0.0.0", "--auth-token-file", str(tmp_path / "missing")]) == 2


def test_proxy_prefix_messages_is_a_compact_mode_flag(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 62: the refusal advised ``prefix_messages=1``, which a proxy user could not set.
    ``--prefix-messages`` sets it in compact mode; observe mode refuses it in one line."""
    from cachecompact.tools.cli import _proxy_engine_options, build_parser

    args = build_parser().parse_args(["proxy", "--mode", "compact", "--prefix-messages", "1"])
    opts = _proxy_engine_options(args)
    assert opts is not None and opts.prefix_messages == 1
    assert main(["proxy", "--upstream", "http://127.0.0.1:9", "--port", "0", "--prefix-messages", "1"]) == 2
    err = capsys.readouterr().err
    assert "--prefix-messages applies only with --mode compact" in err and len(err.strip().splitlines()) == 1, err
