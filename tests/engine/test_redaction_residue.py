"""A redaction leaves no copy (issue 46): an agent that redacts an old tool result starts a new
segment of its session, and the redacted text must not reach any record, excerpt or event made
after it. Before the fix, the new segment's first cache finding quoted the parent's last request
as its "before" excerpt, secret included, into the hash-chained requests log and the events.

Every file of the store (and every row of every PostgreSQL table) is searched afterwards; the
secret may stay only where it was before the redaction: the parent session's transcript (what
the agent sent then) and, with ``--keep-bodies``, the parent's kept request bodies."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import pytest

import cachecompact
from cachecompact import Session
from cachecompact.adapters.proxy import Proxy, ProxyConfig
from cachecompact.base.headers import SESSION_HEADER
from cachecompact.store import open_store
from cachecompact.tools.emulator import Emulator, Reply, ScriptedResponder

from ..conftest import API_VERSION

MODEL = "claude-sonnet-4-6"
SYSTEM = "You are a careful agent. " * 300
SECRET = "hunter2-s3cr3t-a91f"
REDACT_AT = 6


def _reply(body: dict[str, Any]) -> Reply:
    return Reply([{"type": "text", "text": f"ok {len(body['messages'])}"}], "end_turn")


def _agent(send: Any, turns: int = 12, pad: int = 2000) -> None:
    """Tool results with a secret in the first; at turn ``REDACT_AT`` the agent redacts it."""
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "Audit the environment."}]
    for t in range(turns):
        if t == REDACT_AT:
            res = msgs[2]["content"][0]
            res["content"] = res["content"].replace(f"SECRET={SECRET}", "SECRET=[REDACTED]")
        send(msgs)
        tid = f"toolu_{t:03d}"
        msgs += [{"role": "assistant", "content": [{"type": "tool_use", "id": tid, "name": "env", "input": {"n": t}}]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tid, "content":
                                               "x" * pad + f"PATH=/bin\nTURN={t}" +
                                               (f"\nSECRET={SECRET}" if t == 0 else "")}]}]


def _hits(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                  if p.is_file() and SECRET.encode() in p.read_bytes())


def _findings(root: Path, sid: str) -> list[dict[str, Any]]:
    """Every finding stored for a session: its request records' and its events' (both modes)."""
    out = []
    for name in ("requests.jsonl", "events.jsonl"):
        p = root / sid / name
        for line in p.read_text().splitlines() if p.exists() else []:
            rec = json.loads(line)
            f = rec.get("finding") or rec.get("detail")
            if isinstance(f, dict) and f.get("cls"):
                out.append(f)
    return out


def _check(root: Path, allowed: set[str]) -> None:
    sessions = sorted(p.name for p in root.iterdir() if p.is_dir())
    segments = [s for s in sessions if s.endswith(".s2") or s.endswith(".2")]
    assert segments, f"the redaction started no segment: {sessions}"
    churn = [f for s in segments for f in _findings(root, s) if f["cls"] == "prefix_churn"]
    assert churn, "the segment's first request was not found as prefix churn: the test would pass vacuously"
    assert all(f["before"] is None and "[REDACTED]" in (f["after"] or "") for f in churn), churn
    leaked = [h for h in _hits(root) if not any(h.startswith(a) for a in allowed)]
    assert leaked == [], leaked


@pytest.mark.parametrize("named", [False, True], ids=["unnamed", "named"])
def test_wrap_redaction_leaves_no_copy(tmp_path: Path, named: bool) -> None:
    root = tmp_path / "sessions"
    with Emulator(ScriptedResponder(_reply)) as emu:
        client = cachecompact.wrap(anthropic.Anthropic(base_url=emu.url, api_key="k", max_retries=0), store=root,
                                   summarizer=None, session_id="job-redact" if named else None)
        _agent(lambda msgs: client.messages.create(model=MODEL, max_tokens=20, system=SYSTEM, messages=msgs))
        client.close()
    first = min((p.name for p in root.iterdir() if p.is_dir()), key=len)
    _check(root, {f"{first}/transcript.jsonl"})


@pytest.mark.parametrize("mode", ["compact", "observe"])
def test_proxy_redaction_leaves_no_copy(tmp_path: Path, mode: str) -> None:
    """The proxy, in both modes, keeping request bodies: the parent's kept bodies hold what was
    sent then; nothing made after the redaction holds the secret, the dashboard's API included."""
    root = tmp_path / "sessions"
    cc = {"type": "ephemeral"}
    with Emulator(ScriptedResponder(_reply)) as emu, \
            Proxy(ProxyConfig(upstream=emu.url, port=0, mode=mode, store=str(root), keep_bodies=True)) as px, \
            httpx2.Client(base_url=px.url, timeout=30,
                          headers={**API_VERSION, "x-api-key": "k", SESSION_HEADER: "job-redact"}) as c:
        def send(msgs: list[dict[str, Any]]) -> None:
            last = msgs[-1]
            content = last["content"] if isinstance(last["content"], list) else [{"type": "text",
                                                                                   "text": last["content"]}]
            marked = [*msgs[:-1], {**last, "content": [*content[:-1], {**content[-1], "cache_control": cc}]}]
            r = c.post("/v1/messages", json={"model": MODEL, "max_tokens": 20,
                                             "system": [{"type": "text", "text": SYSTEM, "cache_control": cc}],
                                             "messages": marked})
            assert r.status_code == 200, r.text

        _agent(send)
        px.wait_idle()
        api: list[tuple[str, Any]] = []
        for s in [x for top in c.get("/api/sessions").json()["sessions"] for x in [top, *top.get("segments", [])]]:
            sid = s["id"]
            api.append((sid, c.get(f"/api/sessions/{sid}").json()))
            api += [(sid, c.get(f"/api/sessions/{sid}/requests/{i}").json()) for i in range(s.get("requests", 0))]
    first = "job-redact"
    parent_bodies = {f"{first}/scratchpad/"}  # the requests as sent before the redaction
    _check(root, {f"{first}/transcript.jsonl", *parent_bodies})
    # the dashboard serves the parent's kept bodies (what was sent then); no other answer carries the secret
    assert len(api) > 12
    shown = [(sid, {k: v for k, v in a.items() if not (sid == first and k == "body")}) for sid, a in api]
    assert [sid for sid, a in shown if SECRET in json.dumps(a)] == []


def test_postgres_redaction_leaves_no_copy(pg_url: str) -> None:
    """The same through wrap() on PostgreSQL: every row of every table is searched."""
    import uuid

    import psycopg

    name = f"job-redact-{uuid.uuid4().hex[:8]}"
    with Emulator(ScriptedResponder(_reply)) as emu:
        client = cachecompact.wrap(anthropic.Anthropic(base_url=emu.url, api_key="k", max_retries=0), store=pg_url,
                                   summarizer=None, session_id=name)
        _agent(lambda msgs: client.messages.create(model=MODEL, max_tokens=20, system=SYSTEM, messages=msgs))
        client.close()
    store = open_store(pg_url)
    try:
        sids = store.list(name)
        assert f"{name}.s2" in sids, sids
        findings = [rec["finding"] for _, rec in store.open(f"{name}.s2").read_all("requests")]
        assert any(f["cls"] == "prefix_churn" and f["before"] is None for f in findings), findings
        assert Session.open(store, name).requests_recorded == REDACT_AT
    finally:
        store.close()
    hits = []
    with psycopg.connect(pg_url) as conn:
        tables = [r[0] for r in conn.execute("SELECT table_name FROM information_schema.tables "
                                             "WHERE table_schema = 'public' AND table_name LIKE 'cachecompact%'")]
        for t in tables:
            cols = [r[0] for r in conn.execute("SELECT column_name FROM information_schema.columns "
                                               "WHERE table_name = %s", (t,))]
            for row in conn.execute(f"SELECT * FROM {t}"):  # table names from the catalog
                rec = dict(zip(cols, row, strict=True))
                if str(rec.get("session_id", "")).startswith(name):
                    blob = b"".join(bytes(v) if isinstance(v, (bytes, memoryview)) else str(v).encode()
                                    for v in rec.values())
                    if SECRET.encode() in blob:
                        hits.append((t, rec.get("session_id"), rec.get("log"), rec.get("seq")))
    # only the parent's transcript rows (log 0) hold it: what the agent sent before it redacted
    assert [h for h in hits if not (h[1] == name and h[2] == 0)] == [], hits
