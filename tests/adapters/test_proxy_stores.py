"""Proxy stores are first-class (issue 50): `report` and `ledger verify` work on what the proxy
stored in either mode, and a proxy restarted on the same store lists the sessions it recorded
before. Each of these failed before: `report` exited 2 and `ledger verify` printed INVALID on an
untouched observe-mode store, and the dashboard of a restarted proxy showed none of them."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import pytest

from cachecompact.adapters.proxy import Proxy, ProxyConfig
from cachecompact.tools.cli import main as cli
from cachecompact.tools.emulator import Emulator

MODEL = "claude-sonnet-4-6"


def _conversations(url: str, n: int) -> None:
    client = anthropic.Anthropic(base_url=url, api_key="k", max_retries=0)
    for c in range(n):
        msgs: list[dict[str, Any]] = [{"role": "user", "content": f"conversation {c}: read the code " * 50}]
        for k in range(3):
            r = client.messages.create(model=MODEL, max_tokens=100, messages=msgs)
            msgs += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]},
                     {"role": "user", "content": f"more {k}"}]


def _cli(*argv: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli(list(argv))
    return rc, out.getvalue() + err.getvalue()


@pytest.mark.parametrize("mode", ["observe", "compact"])
def test_report_verify_and_the_dashboard_work_on_a_proxy_store_across_a_restart(mode: str, tmp_path: Path) -> None:
    store = tmp_path / "store"
    with Emulator() as emu:
        with Proxy(ProxyConfig(upstream=emu.url, port=0, mode=mode, store=str(store))) as px:
            _conversations(px.url, 3)
            px.wait_idle()
            before = {s["id"]: s["requests"] for s in httpx2.get(f"{px.url}/api/sessions").json()["sessions"]}
        assert len(before) == 3 and set(before.values()) == {3}
        for sid in before:
            rc, text = _cli("report", "--store", str(store), sid)
            assert rc == 0 and "requests: 3" in text, text
            rc, text = _cli("report", str(store / sid))  # by its folder as well
            assert rc == 0, text
            rc, text = _cli("ledger", "verify", "--store", str(store), sid)
            assert rc == 0 and text.startswith("ok"), text  # an untouched store is never called tampered
        with Proxy(ProxyConfig(upstream=emu.url, port=0, mode=mode, store=str(store))) as px:
            listed = {s["id"]: s for s in httpx2.get(f"{px.url}/api/sessions").json()["sessions"]}
            assert {k: v["requests"] for k, v in listed.items()} == before  # all of them, after the restart
            assert all(v["cost_usd"] > 0 for v in listed.values())
            _conversations(px.url, 1)  # and it goes on recording
            px.wait_idle()
            assert len(httpx2.get(f"{px.url}/api/sessions").json()["sessions"]) >= 3


def test_a_changed_observation_record_is_reported_with_its_place(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with Emulator() as emu, Proxy(ProxyConfig(upstream=emu.url, port=0, mode="observe", store=str(store))) as px:
        _conversations(px.url, 1)
        px.wait_idle()
    (sid,) = [p.name for p in store.iterdir() if p.is_dir() and not p.name.startswith(".")]
    events = store / sid / "events.jsonl"
    lines = events.read_text().splitlines()
    rec = json.loads(lines[1])
    rec["i"] = 7
    lines[1] = json.dumps(rec)
    events.write_text("\n".join(lines) + "\n")
    rc, text = _cli("ledger", "verify", "--store", str(store), sid)
    assert rc == 1 and "observation 1 is numbered 7" in text, text


def test_the_compact_proxy_names_the_nearest_ids_of_an_unknown_model(caplog: pytest.LogCaptureFixture) -> None:
    """Issue 50: wrap() refuses an unlisted id naming the nearest ones; the compact proxy forwards
    it (the API decides) and now says the same, once per id."""
    import logging

    caplog.set_level(logging.WARNING, logger="cachecompact")
    with Emulator() as emu, Proxy(ProxyConfig(upstream=emu.url, port=0, mode="compact")) as px:
        client = anthropic.Anthropic(base_url=px.url, api_key="k", max_retries=0)
        for _ in range(2):
            with contextlib.suppress(anthropic.APIStatusError):  # the API's answer to the id is its own
                client.messages.create(model="claude-sonnet-4.6", max_tokens=10,
                                       messages=[{"role": "user", "content": "hi"}])
    said = [r.getMessage() for r in caplog.records if "nearest" in r.getMessage()]
    assert len(said) == 1 and "claude-sonnet-4.6" in said[0] and "claude-sonnet-4-6" in said[0], said


@pytest.mark.parametrize("mode", ["observe", "compact"])
def test_a_bad_session_header_gets_the_same_400_in_both_modes(mode: str) -> None:
    """Issue 50: compact mode refused a session header that could name a path; observe mode
    forwarded the request unanalysed. Both now answer 400 naming the header, before upstream."""
    from cachecompact.base.headers import SESSION_HEADER

    with Emulator() as emu, Proxy(ProxyConfig(upstream=emu.url, port=0, mode=mode)) as px:
        client = anthropic.Anthropic(base_url=px.url, api_key="k", max_retries=0)
        with pytest.raises(anthropic.BadRequestError, match=SESSION_HEADER):
            client.messages.create(model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "hi"}],
                                   extra_headers={SESSION_HEADER: "../../etc"})
        assert not [r for r in emu.requests if r.get("status") == 200]


def test_a_session_page_names_the_other_sessions_of_its_conversation() -> None:
    """Issue 50: the session page did not link to its sub-agents. The session's API answer now
    lists its conversation's sessions, the first one first, each with why it is linked."""
    from cachecompact.base.headers import SESSION_HEADER

    with Emulator() as emu, Proxy(ProxyConfig(upstream=emu.url, port=0, mode="compact")) as px:
        client = anthropic.Anthropic(base_url=px.url, api_key="k", max_retries=0)
        for system in ("You lead.", "You are a sub-agent."):  # one name, two agents (Claude Code's sub-agents)
            client.messages.create(model=MODEL, max_tokens=10, system=system, extra_headers={SESSION_HEADER: "conv"},
                                   messages=[{"role": "user", "content": f"{system} Start."}])
        px.wait_idle()
        first = httpx2.get(f"{px.url}/api/sessions/conv").json()["conversation"]
        sub = httpx2.get(f"{px.url}/api/sessions/conv.a2").json()["conversation"]
    assert [x["id"] for x in first] == [x["id"] for x in sub] == ["conv", "conv.a2"]
    assert first[0]["reason"] is None and first[1]["reason"]


@pytest.mark.parametrize("mode", ["observe", "compact"])
def test_rejected_requests_leave_no_empty_session_rows(mode: str, tmp_path: Path) -> None:
    """Issue 50: each request the API rejected started a session of its own, an empty row on the
    dashboard. A session of rejected requests alone is counted (``rejected_only``, and errors in
    ``/metrics``) but is no row; one that continues a conversation is that row's error."""
    headers = {"x-api-key": "k", "anthropic-version": "2023-06-01"}
    bad = [{"model": MODEL, "max_tokens": 100, "temperature": 7,  # the API accepts 0..1
            "messages": [{"role": "user", "content": f"stray request {i} " * 40}]} for i in range(4)]
    with Emulator() as emu, Proxy(ProxyConfig(upstream=emu.url, port=0, mode=mode,
                                               store=str(tmp_path / "store"))) as px:
        for body in bad:
            assert httpx2.post(f"{px.url}/v1/messages", json=body, headers=headers).status_code == 400
        px.wait_idle()
        listed = httpx2.get(f"{px.url}/api/sessions").json()
        assert listed["sessions"] == [] and listed["rejected_only"]["requests"] == 4, listed
        metrics = httpx2.get(f"{px.url}/metrics").text
        assert 'cachecompact_request_errors_total{mode="' + mode + '"} 4' in metrics, metrics
        _conversations(px.url, 1)
        convo = [{"role": "user", "content": "conversation 0: read the code " * 50}]
        again = {"model": MODEL, "max_tokens": 100, "temperature": 7, "messages": convo}
        assert httpx2.post(f"{px.url}/v1/messages", json=again, headers=headers).status_code == 400
        px.wait_idle()
        rows = httpx2.get(f"{px.url}/api/sessions").json()["sessions"]
        assert len(rows) == 1 and rows[0]["requests"] >= 3, rows


def test_a_conversation_is_hidden_only_when_none_of_its_sessions_had_an_answer() -> None:
    """Review of issue 50's dashboard fix: sessions were filtered before conversations were formed,
    so an answered segment of a conversation whose first session got no answer came up as a
    conversation of its own, and its totals left the first out. Whole conversations are kept or
    hidden now."""
    from cachecompact.adapters.proxy._dashboard import listing

    def row(sid: str, requests: int, errors: int, link: str | None = None) -> dict[str, Any]:
        return {"id": sid, "requests": requests, "errors": errors, "cost_usd": 0.1 * (requests - errors),
                "wasted_usd": 0.0, "last_time": 1.0, "link": {"session": link, "reason": "rewrite"} if link else None}

    out = listing([row("a", 2, 2), row("a.s2", 3, 0, "a"), row("b", 1, 1), row("c", 4, 1)])
    assert [c["id"] for c in out["sessions"]] == ["a", "c"]
    a = out["sessions"][0]
    assert [s["id"] for s in a["segments"]] == ["a.s2"] and a["conversation"]["requests"] == 5
    assert out["rejected_only"] == {"sessions": 1, "requests": 1, "ids": ["b"]}


@pytest.mark.parametrize("mode", ["observe", "compact"])
def test_a_compaction_calls_row_shows_the_tokens_it_was_billed_for(mode: str, tmp_path: Path) -> None:
    """Issue 62: an on-demand compaction call answers with a top-level usage of zeros and its cost
    in a ``compaction`` entry of ``usage.iterations``; its row in `report` and on the dashboard
    showed no tokens beside a nonzero cost. It shows the entry's tokens."""
    store = tmp_path / "store"
    with Emulator() as emu, Proxy(ProxyConfig(upstream=emu.url, port=0, mode=mode, store=str(store))) as px:
        c = anthropic.Anthropic(base_url=px.url, api_key="k", max_retries=0)
        msgs: list[dict[str, Any]] = [{"role": "user", "content": "read this " * 3000},
                                      {"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]
        c.messages.create(model="claude-opus-5-5", max_tokens=100, messages=msgs,
                          extra_headers={"x-cachecompact-session": "od"})
        r = c.messages.create(model="claude-opus-5-5", max_tokens=100, messages=msgs, extra_body={
            "compaction": {"type": "summarize"}}, extra_headers={"x-cachecompact-session": "od",
                                                                 "anthropic-beta": "compact-2026-09-04"})
        px.wait_idle()
        rows = httpx2.get(f"{px.url}/api/sessions/od").json()["requests"]
    assert r.stop_reason == "compaction" and r.usage.input_tokens == 0 and r.usage.cache_read_input_tokens == 0
    (step,) = r.usage.iterations  # type: ignore[attr-defined]
    billed = (int(step["cache_read_input_tokens"]), int(step["cache_creation_input_tokens"]),
              int(step["input_tokens"]))
    assert sum(billed) > 7_000
    assert (rows[1]["read"], rows[1]["write"], rows[1]["input"]) == billed  # the dashboard's row
    rc, text = _cli("report", "--store", str(store), "od")
    assert rc == 0, text
    (row,) = [ln.split() for ln in text.splitlines() if ln.lstrip().startswith("1 ")]
    if mode == "compact":  # #  read  write  input  cost
        assert tuple(int(x) for x in row[1:4]) == billed, text
    else:  # #  date time  model  prompt  read  written  cost
        assert (int(row[5].replace(",", "")), int(row[6].replace(",", ""))) == billed[:2], text
        assert int(row[4].replace(",", "")) == sum(billed), text
