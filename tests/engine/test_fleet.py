"""A fleet on one machine, with real processes: three `cachecompact proxy` replicas in compact mode
on one PostgreSQL database, 50 concurrent conversations of 20 turns sent round-robin across
them, compared with one process on the file store; then again with a replica killed mid-run."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from cachecompact import Session
from cachecompact.adapters.httpserver import spawn_cli_server
from cachecompact.base.headers import CLOCK_HEADER, SESSION_HEADER
from cachecompact.store import open_store

from ..conftest import API_VERSION

pytest.importorskip("psycopg", reason="the postgres extra is not installed")

CONVERSATIONS = 50
TURNS = 20
WINDOW = 12_000  # small, so that every conversation compacts


def _user(c: int, t: int) -> dict[str, Any]:
    lines = "\n".join(f"conversation {c} turn {t} line {k}: value_{c}_{t}_{k} = {(c * 31 + t * 7 + k) % 997}"
                      for k in range(60))
    return {"role": "user", "content": [{"type": "text", "text": lines}]}


async def _drive(urls: list[str], tag: str, kill_at: tuple[int, subprocess.Popen[str]] | None = None
                 ) -> dict[str, list[dict[str, Any]]]:
    """Every conversation's turns, round-robin over ``urls``; returns each conversation's history."""
    sent = 0
    alive = list(urls)
    out: dict[str, list[dict[str, Any]]] = {}

    async def conversation(http: aiohttp.ClientSession, c: int) -> None:
        nonlocal sent
        sid = f"{tag}{c:02d}"
        msgs: list[dict[str, Any]] = [_user(c, 0)]
        for t in range(TURNS):
            body = {"model": "claude-haiku-4-5", "max_tokens": 200, "system": "You audit configuration files.",
                    "messages": msgs}
            headers = {**API_VERSION, SESSION_HEADER: sid, CLOCK_HEADER: str(1_800_000_000 + c * 1000 + t * 20),
                       "x-api-key": "fleet", "content-type": "application/json"}
            for attempt in range(len(urls) + 2):
                url = alive[(c + t + attempt) % len(alive)]
                try:
                    async with http.post(url + "/v1/messages", data=json.dumps(body), headers=headers) as r:
                        assert r.status == 200, await r.text()
                        reply = await r.json()
                    break
                except aiohttp.ClientConnectionError:  # a killed replica: its traffic goes to the others
                    if url in alive and len(alive) > 1:
                        alive.remove(url)
            else:
                raise AssertionError(f"{sid} turn {t}: no replica answered")
            sent += 1
            if kill_at is not None and sent == kill_at[0]:
                kill_at[1].send_signal(signal.SIGKILL)
            msgs = [*msgs, {"role": "assistant", "content": reply["content"]}, _user(c, t + 1)]
        out[sid] = msgs[:-2]  # what was sent: the last reply and the next user turn never were

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=CONVERSATIONS)) as http:
        await asyncio.gather(*(conversation(http, c) for c in range(CONVERSATIONS)))
    return out


def _requests(log: Path, tag: str) -> dict[str, list[str]]:
    """The body hashes the upstream received per conversation, in order (the summarizer's excluded)."""
    per: dict[str, list[str]] = {}
    for line in log.read_text().splitlines():
        r = json.loads(line)
        if r.get("status") == 200 and not r.get("internal") and str(r.get("session", "")).startswith(tag):
            per.setdefault(r["session"][len(tag):], []).append(r["body_hash"])
    return per


def _check_sessions(store_url: str, tag: str, histories: dict[str, list[dict[str, Any]]]) -> None:
    store = open_store(store_url)
    try:
        ids = store.list(tag)
        assert sorted(ids) == sorted(histories), "one session per conversation, no segments or branches"
        for sid in ids:
            s = Session.open(store, sid, readonly=True)  # verifies every chain
            assert s.messages() == histories[sid], sid
            seqs = [e.seq for e in s.ledger.entries]
            assert seqs == list(range(len(seqs))) and seqs, sid
    finally:
        store.close()


@pytest.mark.parametrize("kill", [False, True], ids=["three-replicas", "one-killed"])
def test_replicas_on_postgres_behave_as_one_process(pg_url: str, tmp_path: Path, kill: bool) -> None:
    tag = f"fleet{uuid.uuid4().hex[:6]}-"
    log = tmp_path / "upstream.jsonl"
    emu, emu_url = spawn_cli_server(["serve", "--port", "0", "--log", str(log)], quiet=True)
    procs: list[subprocess.Popen[str]] = [emu]
    try:
        # the reference: one process, the file store
        single, single_url = spawn_cli_server(["proxy", "--port", "0", "--upstream", emu_url, "--mode", "compact",
                                               "--store", str(tmp_path / "files"), "--window", str(WINDOW)], quiet=True)
        procs.append(single)
        ref = asyncio.run(_drive([single_url], tag + "ref-"))
        # the fleet: three replicas on PostgreSQL
        urls = []
        for _ in range(3):
            p, u = spawn_cli_server(["proxy", "--port", "0", "--upstream", emu_url, "--mode", "compact",
                                     "--store", pg_url, "--window", str(WINDOW)], quiet=True)
            procs.append(p)
            urls.append(u)
        victim = (CONVERSATIONS * TURNS // 3, procs[-2]) if kill else None
        got = asyncio.run(_drive(urls, tag + "pg-", victim))
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            p.wait(20)
    assert len(got) == len(ref) == CONVERSATIONS
    _check_sessions(pg_url, tag + "pg-", got)
    _check_sessions(str(tmp_path / "files"), tag + "ref-", ref)
    if not kill:  # the same conversations, and every request the upstream saw byte for byte the single process's
        for sid, msgs in got.items():
            assert msgs == ref[sid.replace("pg-", "ref-", 1)]
        assert _requests(log, tag + "pg-") == _requests(log, tag + "ref-")
    assert os.path.getsize(log) > 0
