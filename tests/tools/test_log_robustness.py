"""`cachecompact forensics` and `whatif` on malformed logs (issue 46): each bad file gets one line
saying why and is skipped, the good ones are still reported, and nothing hangs on a special file.

A seeded family of damaged copies of a small valid Claude Code log: every field the loader reads
given a wrong value (deep nesting, 5,000-digit and overflowing numbers, NaN, lone surrogates,
wrong types), lines cut and garbled, binary and non-UTF-8 files, and files that are not files (a
FIFO, a folder named ``.jsonl``, a dangling link). Before, forensics failed 9 of 129 such logs and
whatif 8 with an "internal error" (RecursionError, OverflowError, ValueError, UnicodeEncodeError,
TypeError), a folder run stopped at the first, and both hung on a FIFO.
"""

from __future__ import annotations

import copy
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cachecompact.tools.cli import main

MODEL = "claude-sonnet-4-6"
SEED = 46


def _usage(read: int, write: int) -> dict[str, Any]:
    return {"input_tokens": 3, "cache_read_input_tokens": read, "cache_creation_input_tokens": write,
            "output_tokens": 40, "cache_creation": {"ephemeral_5m_input_tokens": write, "ephemeral_1h_input_tokens": 0}}


def base_log(tag: str = "s1") -> list[dict[str, Any]]:
    """A valid log of five calls, a tool loop and a person's turn, with recorded usage."""
    def entry(kind: str, minute: int, content: Any, **msg: Any) -> dict[str, Any]:
        return {"type": kind, "sessionId": tag, "uuid": f"{tag}-{kind}-{minute}",
                "timestamp": f"2026-02-01T10:{minute:02d}:00Z", "message": {"role": kind, "content": content, **msg}}

    out = [entry("user", 0, "fix the failing test")]
    read = 0
    for k in range(5):
        call = [{"type": "text", "text": f"step {k}"},
                {"type": "tool_use", "id": f"toolu_{tag}_{k}", "name": "Bash", "input": {"command": f"cat f{k}.py"}}]
        out.append(entry("assistant", 2 * k + 1, call, model=MODEL, id=f"msg_{tag}_{k}", usage=_usage(read, 2_000)))
        read += 2_000
        out.append(entry("user", 2 * k + 2, [{"type": "tool_result", "tool_use_id": f"toolu_{tag}_{k}",
                                               "content": f"contents of f{k}.py\n" * 80}]))
    out.append(entry("assistant", 12, [{"type": "text", "text": "all green"}], model=MODEL, id=f"msg_{tag}_end",
                     usage=_usage(read, 300)))
    return out


def _lines(entries: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(e) + "\n" for e in entries)


WRONG: tuple[Any, ...] = (None, True, -1, 2.5, "x", "", [], [1], {}, {"a": 1}, 10**400)
RAW = {"nan": "NaN", "inf": "1e400", "digits": "9" * 5000, "surrogate": '"\\ud800 text"',
       "deep": "[" * 5000 + "]" * 5000, "deep_object": '{"a":' * 3000 + "1" + "}" * 3000}
PATHS = [("message", "content"), ("message", "model"), ("message", "id"), ("message", "usage"),
         ("message", "usage", "input_tokens"), ("message", "usage", "cache_creation"),
         ("message", "usage", "cache_creation", "ephemeral_5m_input_tokens"), ("message", "content", 1, "id"),
         ("message", "content", 1, "input"), ("message",), ("timestamp",), ("type",), ("sessionId",),
         ("message", "role")]


def family(seed: int = SEED) -> dict[str, bytes]:
    """The damaged logs, by name: a seeded sample of field mutations, then the targeted cases."""
    rng = random.Random(seed)
    base = base_log()
    out: dict[str, bytes] = {}
    for path in PATHS:
        for v in rng.sample(WRONG, 4):
            es = copy.deepcopy(base)
            at = es[3]  # an assistant entry with usage and a tool call
            for k in path[:-1]:
                at = at[k]
            at[path[-1]] = v
            out[f"{'.'.join(map(str, path))}={json.dumps(v)[:12]}"] = _lines(es).encode()
        for name, raw in RAW.items():
            es = copy.deepcopy(base)
            at = es[3]
            for k in path[:-1]:
                at = at[k]
            at[path[-1]] = "__RAW__"
            out[f"{'.'.join(map(str, path))}={name}"] = _lines(es).replace('"__RAW__"', raw, 1).encode()
    text = _lines(base)
    out.update({
        "empty": b"", "blank lines": b"\n\n\n", "one cut line": text[:200].encode(),
        "cut in the middle": (text[: len(text) // 2] + "\n" + text[len(text) // 2:]).encode(),
        "garbage line": (text + "this is not json\n" + _lines(base_log("s2"))).encode(),
        "not utf-8": text.encode().replace(b"step 1", b"step \xff\xfe"), "utf-16": text.encode("utf-16"),
        "gzip": b"\x1f\x8b\x08\x00" + os.urandom(64), "png": b"\x89PNG\r\n\x1a\n" + os.urandom(128),
        "a readme": b"# My project\n\nSome words.\n", "a json object": b'{"hello": "world"}',
        "an array of numbers": b"[1, 2, 3]", "null": b"null", "bom": b"\xef\xbb\xbf" + text.encode(),
        "two entries on a line": (json.dumps(base[0]) + json.dumps(base[1]) + "\n" + _lines(base[2:])).encode(),
    })
    return out


def _write(folder: Path, cases: dict[str, bytes]) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for k, (name, data) in enumerate(cases.items()):
        p = folder / f"case{k:03d}.jsonl"
        p.write_bytes(data)
        paths[name] = p
    return paths


def _one_line_each(err: str, paths: list[Path]) -> None:
    for p in paths:
        said = [line for line in err.splitlines() if str(p) in line]
        assert len(said) >= 1, (p, err[-400:])


def test_every_damaged_log_is_one_line_or_a_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Forensics on each file alone: exit 0 with a report (a log whose damage the loader can live
    with: an unknown field, a time it cannot read), or exit 2 with one line naming the file and
    why. Never an "internal error"."""
    cases = _write(tmp_path, family())
    assert len(cases) > 120
    internal, bad_exit = [], []
    for name, p in cases.items():
        rc = main(["forensics", str(p)])
        out, err = capsys.readouterr()
        if "internal error" in err or "Traceback" in err:
            internal.append((name, err[-200:]))
        elif rc == 2:
            assert f"skipped {p}: " in err and len([x for x in err.splitlines() if str(p) in x]) == 1, (name, err)
            assert "calls" not in out  # no empty report
        elif rc != 0:
            bad_exit.append((name, rc))
    assert internal == [] and bad_exit == []


def test_a_folder_run_reports_the_good_logs_and_names_each_bad_one(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Good logs beside every kind of bad file, a FIFO and a dangling link included: the run
    reports the good ones and lists every bad one with why, for both commands."""
    folder = tmp_path / "logs"
    bad = _write(folder / "bad", {k: v for k, v in family().items() if k in (
        "message.usage.input_tokens=inf", "message.model={}", "message.content=deep", "png", "not utf-8",
        "message.usage.input_tokens=digits", "message.content=surrogate", "timestamp=inf", "empty")})
    for k in range(2):
        (folder / f"good{k}.jsonl").write_text(_lines(base_log(f"good{k}")))
    os.mkfifo(folder / "pipe.jsonl")
    (folder / "gone.jsonl").symlink_to(tmp_path / "nowhere.jsonl")
    (folder / "dir.jsonl").mkdir()
    assert main(["forensics", str(folder)]) == 0
    out, err = capsys.readouterr()
    assert "logs/good0: 6 calls" in out and "logs/good1: 6 calls" in out  # reported, whatever sits beside them
    assert f"skipped {folder / 'pipe.jsonl'}: not a regular file" in out
    assert f"skipped {folder / 'gone.jsonl'}: a dangling link" in out
    for name in ("message.usage.input_tokens=inf", "message.model={}", "message.content=deep", "png", "not utf-8",
                 "message.usage.input_tokens=digits", "message.content=surrogate", "empty"):
        assert f"skipped {bad[name]}: " in out, name
    assert f"skipped {bad['timestamp=inf']}" not in out  # a time no date has is read as unknown: still a log
    assert "internal error" not in err
    assert main(["whatif", str(folder), "--option", "none", "--out", str(tmp_path / "w")]) == 0
    out, err = capsys.readouterr()
    assert "internal error" not in err and "Traceback" not in err
    for p in [*(v for k, v in bad.items() if k != "timestamp=inf"), folder / "pipe.jsonl"]:
        assert f"skipped {p}: " in out, p


def test_no_command_hangs_on_a_special_file(tmp_path: Path) -> None:
    """A FIFO given by name is refused before it is opened (opening one blocks until a writer
    comes); so is a character device."""
    fifo = tmp_path / "named.jsonl"
    os.mkfifo(fifo)
    for args in (["forensics", str(fifo)], ["forensics", "/dev/zero"], ["whatif", str(fifo), "--option", "none",
                                                                         "--out", str(tmp_path / "w")]):
        r = subprocess.run([sys.executable, "-m", "cachecompact.tools.cli", *args], capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 2 and "internal error" not in r.stderr, (args, r.stderr)
        assert "not a regular file" in r.stderr or "named pipe" in r.stderr or "character device" in r.stderr, \
            r.stderr


def test_whatif_names_every_file_when_none_loads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cases = _write(tmp_path, {k: v for k, v in family().items() if k in ("png", "empty", "message.content=deep")})
    assert main(["whatif", str(tmp_path), "--option", "none", "--out", str(tmp_path / "w")]) == 2
    err = capsys.readouterr().err
    _one_line_each(err, list(cases.values()))
    assert "no session could be loaded" in err and "internal error" not in err


def test_a_missing_path_among_good_ones_is_skipped_not_fatal(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "good.jsonl"
    good.write_text(_lines(base_log()))
    assert main(["forensics", str(good), str(tmp_path / "missing.jsonl")]) == 0
    out = capsys.readouterr().out
    assert "1 logs" in out and f"skipped {tmp_path / 'missing.jsonl'}: no such file or folder" in out
