"""No conversation ever carries another's messages (issue 46), whatever the concurrency, the
opening, the naming, the adapter or the store.

Agents run concurrently and begin alike: the same first message, or the same first 1-3 rounds
with the same tool-use ids (Claude Code's fork sub-agents). From the first message of its own
on, every message an agent writes, and every reply the model gives it, carries the agent's tag
(``AGENT<k>x``). The emulator's request handler is wrapped so that the bytes it receives are
kept with the credential or agent header they came with; after the run, every request is read
back from those bytes and must carry no tag but its sender's (a request with no known sender, a
summary call, at most one agent's), no tool-use id twice, and get a 200. Windows are small, so
sessions compact while it happens, and the test asserts that they did.

Adapters: `wrap()` with threads on one client, `wrap()` with one `AsyncAnthropic` under asyncio,
the compact proxy with a distinct API key per client, and two compact proxies (separate
processes) on one PostgreSQL database; the file store and PostgreSQL. Each case is generated
from a seed (agents, rounds in common, turns, result sizes, naming), so the family covers
shapes no one wrote by hand.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import random
import re
import subprocess
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anthropic
import pytest
import xxhash

import cachecompact
from cachecompact.adapters.httpserver import spawn_cli_server
from cachecompact.adapters.proxy import Proxy, ProxyConfig
from cachecompact.base.headers import SESSION_HEADER
from cachecompact.store import open_store
from cachecompact.tools.emulator import Emulator, HttpReply, Reply, ScriptedResponder, SummarizingResponder

pytestmark = pytest.mark.slow  # a few thousand requests per adapter

MODEL = "claude-sonnet-4-6"
AGENT_HEADER = "x-stress-agent"
TAG = re.compile(r"AGENT(\d+)x")
TOOLS = [{"name": "bash", "description": "Run a shell command.",
          "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}]
SYSTEM = "You are one of several agents working on the same repository. " * 20


# -- the family of cases ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    """One generated run: how many agents, how much of their history is the same, how long."""

    seed: int
    agents: int
    rounds: int  # rounds of history every agent begins with (1: the first message only)
    turns: int
    result_lines: int  # size of each tool result (lines of ~12 tokens)
    named: bool  # every agent under one session name (Claude Code's sub-agents share its id)
    nonce: str = ""  # per run, so runs on one database never meet

    @property
    def name(self) -> str:
        return f"job-{self.seed}{self.nonce}"

    def fresh(self) -> Case:
        return dataclasses.replace(self, nonce="-" + uuid.uuid4().hex[:8])

    @classmethod
    def of(cls, seed: int, rounds: int, named: bool, *, agents: int = 18, turns: int = 16) -> Case:
        rng = random.Random(seed)
        return cls(seed, agents + rng.randrange(0, 5), rounds, turns + rng.randrange(0, 4), rng.randrange(25, 70),
                   named)

    def opening(self) -> list[dict[str, Any]]:
        """What every agent's history begins with: the first message and ``rounds - 1`` rounds."""
        task = f"Shared task {self.seed}{self.nonce}: fix the failing tests."
        msgs: list[dict[str, Any]] = [{"role": "user", "content": task}]
        for r in range(self.rounds - 1):
            tid = f"toolu_shared_{self.seed}_{r}{self.nonce.replace('-', '_')}"
            msgs += [{"role": "assistant", "content": [
                         {"type": "text", "text": f"Looking around ({r})."},
                         {"type": "tool_use", "id": tid, "name": "bash", "input": {"command": f"ls dir{r}"}}]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tid,
                                                   "content": f"shared listing {r}\n" * 30}]}]
        return msgs

    def result(self, agent: int, turn: int) -> str:
        lines = [f"AGENT{agent}x turn {turn} line {k}: value_{agent}_{turn}_{k} = {(agent * 31 + turn * 7 + k) % 997}"
                 for k in range(self.result_lines)]
        return "\n".join(lines)


def _reply(body: dict[str, Any]) -> Reply:
    """The model: a tool call whose id is a function of the request (identical requests, as the
    agents' first ones are, get identical replies, so their histories stay alike), carrying the
    tags of the newest message (the agent's own)."""
    msgs = body.get("messages") or []
    last = json.dumps(msgs[-1].get("content") if msgs else "")
    tags = sorted(set(TAG.findall(last)))
    digest = xxhash.xxh3_64_hexdigest(json.dumps(msgs[-1:], sort_keys=True).encode())
    said = " ".join(f"AGENT{t}x" for t in tags) or "nobody yet"
    return Reply([{"type": "text", "text": f"Noted for {said}."},
                  {"type": "tool_use", "id": f"toolu_{digest}", "name": "bash",
                   "input": {"command": f"cat part_{digest[:4]}.py"}}], "tool_use")


# -- what the upstream received ---------------------------------------------------------------------------

@dataclass
class Received:
    sender: str | None  # the agent (its header, or its API key), None for a call with neither
    raw: bytes
    status: int = 0


@dataclass
class Upstream:
    """Wraps an emulator's request handler and keeps every ``/v1/messages`` body as received."""

    emu: Emulator
    got: list[Received] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        inner = self.emu.core.handle

        def handle(method: str, path: str, headers: Mapping[str, str], raw: bytes) -> HttpReply:
            reply = inner(method, path, headers, raw)
            if method.upper() == "POST" and path.split("?")[0] == "/v1/messages":
                with self._lock:
                    self.got.append(Received(_sender(headers), raw, reply.status))
            return reply

        self.emu.core.handle = handle  # type: ignore[method-assign]


def _sender(headers: Mapping[str, str]) -> str | None:
    agent = headers.get(AGENT_HEADER)
    if agent:
        return agent
    key = headers.get("x-api-key") or headers.get("authorization", "").removeprefix("Bearer ")
    return key.removeprefix("key-agent-") if key.startswith("key-agent-") else None


def foreign(received: list[Received]) -> list[str]:
    """Every way a received request carries what its sender never sent: another agent's tag, a
    tool-use id twice, or (a call with no known sender) the tags of more than one agent."""
    bad = []
    for k, r in enumerate(received):
        body = json.loads(r.raw)
        text = json.dumps([body.get("system"), body.get("messages")])
        tags = set(TAG.findall(text))
        if r.sender is not None and tags - {r.sender}:
            bad.append(f"request {k} from agent {r.sender} carries agents {sorted(tags - {r.sender})}")
        elif r.sender is None and len(tags) > 1:
            bad.append(f"request {k} (no sender) carries agents {sorted(tags)}")
        ids = [b["id"] for m in body.get("messages") or [] if isinstance(m.get("content"), list)
               for b in m["content"] if isinstance(b, dict) and b.get("type") == "tool_use"]
        if len(ids) != len(set(ids)):
            bad.append(f"request {k} from agent {r.sender} has a tool-use id twice")
    return bad


def test_the_check_sees_a_mixed_request() -> None:
    """The detector itself: a request with another agent's message, one with a duplicated
    tool-use id, and an unattributed one with two agents' text are each flagged; a clean one is not."""
    own = {"messages": [{"role": "user", "content": "AGENT3x hello"}]}
    mixed = {"messages": [{"role": "user", "content": "AGENT3x hello"}, {"role": "assistant", "content": "AGENT4x"}]}
    tu = {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {}}
    dup = {"messages": [{"role": "assistant", "content": [tu]}, {"role": "assistant", "content": [tu]}]}
    got = foreign([Received("3", json.dumps(own).encode()), Received("3", json.dumps(mixed).encode()),
                   Received("3", json.dumps(dup).encode()), Received(None, json.dumps(mixed).encode())])
    assert len(got) == 3 and "carries agents ['4']" in got[0] and "twice" in got[1] and "no sender" in got[2]


# -- the agents -------------------------------------------------------------------------------------------

def _next(case: Case, k: int, t: int, msgs: list[dict[str, Any]], content: list[dict[str, Any]]
          ) -> list[dict[str, Any]]:
    calls = [b for b in content if b.get("type") == "tool_use"]
    results = [{"type": "tool_result", "tool_use_id": c["id"], "content": case.result(k, t)} for c in calls]
    return [*msgs, {"role": "assistant", "content": content}, {"role": "user", "content": results}]


def _drive_threads(client: anthropic.Anthropic, case: Case, extra: Any) -> None:
    errors: list[BaseException] = []
    start = threading.Barrier(case.agents)

    def agent(k: int) -> None:
        try:
            msgs = case.opening()
            start.wait()
            for t in range(case.turns):
                r = client.messages.create(model=MODEL, max_tokens=200, system=SYSTEM, tools=TOOLS, messages=msgs,
                                           extra_headers=extra(k))
                msgs = _next(case, k, t, msgs, [b.model_dump(exclude_none=True) for b in r.content])
        except BaseException as err:  # reported below, with the agent
            errors.append(err)

    threads = [threading.Thread(target=agent, args=(k,)) for k in range(case.agents)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors[:3]


async def _drive_async(client: anthropic.AsyncAnthropic, case: Case, extra: Any) -> None:
    async def agent(k: int) -> None:
        msgs = case.opening()
        for t in range(case.turns):
            r = await client.messages.create(model=MODEL, max_tokens=200, system=SYSTEM, tools=TOOLS, messages=msgs,
                                             extra_headers=extra(k))
            msgs = _next(case, k, t, msgs, [b.model_dump(exclude_none=True) for b in r.content])

    await asyncio.gather(*(agent(k) for k in range(case.agents)))


def _agent_headers(case: Case) -> Any:
    def extra(k: int) -> dict[str, str]:
        h = {AGENT_HEADER: str(k)}
        if case.named:
            h[SESSION_HEADER] = case.name
        return h
    return extra


def _key_headers(case: Case) -> Any:
    def extra(k: int) -> dict[str, str]:
        return {SESSION_HEADER: case.name} if case.named else {}
    return extra


def _edits(store_url: str) -> int:
    """Ledger entries over every session of a store: the renders compacted while it ran."""
    store = open_store(store_url)
    try:
        return sum(len(cachecompact.Session.open(store, sid, readonly=True).ledger) for sid in store.list())
    finally:
        store.close()


def _verdict(up: Upstream, case: Case) -> None:
    agents = [r for r in up.got if r.sender is not None]
    assert len(agents) == case.agents * case.turns, (len(agents), case)
    assert all(r.status == 200 for r in up.got), [r.status for r in up.got if r.status != 200][:5]
    assert foreign(up.got) == []


CASES = [Case.of(seed, rounds, named) for seed, (rounds, named) in
         enumerate([(r, n) for r in (1, 2, 3) for n in (False, True)], start=4600)]
IDS = [f"rounds{c.rounds}-{'named' if c.named else 'unnamed'}-seed{c.seed}" for c in CASES]
WINDOW = 9_000  # small, so the sessions compact while the agents race
RUNS = 5  # wrap() threads on files and on PostgreSQL, wrap() async, the proxy, two proxies


def test_the_family_sends_at_least_ten_thousand_requests() -> None:
    """Issue 46's bar: 0 foreign messages in at least 10,000 agent requests across the adapters
    and stores below (the summaries the proxies make come on top)."""
    assert RUNS * sum(c.agents * c.turns for c in CASES) >= 10_000


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("store", ["files", "postgres"])
def test_wrap_threads_never_mix_conversations(case: Case, store: str, tmp_path: Path, request: Any) -> None:
    case = case.fresh()
    url = request.getfixturevalue("pg_url") if store == "postgres" else str(tmp_path / "sessions")
    with Emulator(ScriptedResponder(_reply)) as emu:
        up = Upstream(emu)
        client = cachecompact.wrap(anthropic.Anthropic(base_url=emu.url, api_key="k", max_retries=0), store=url,
                                   summarizer=None, window_tokens=WINDOW)
        try:
            _drive_threads(client, case, _agent_headers(case))
        finally:
            client.close()
    _verdict(up, case)
    if store == "files":
        assert _edits(url) > 0, "the sessions never compacted: the renders were the histories as sent"


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_wrap_async_never_mixes_conversations(case: Case, tmp_path: Path) -> None:
    case = case.fresh()
    url = str(tmp_path / "sessions")
    with Emulator(ScriptedResponder(_reply)) as emu:
        up = Upstream(emu)

        async def run() -> None:
            client = cachecompact.wrap(anthropic.AsyncAnthropic(base_url=emu.url, api_key="k", max_retries=0),
                                       store=url, summarizer=None, window_tokens=WINDOW)
            try:
                await _drive_async(client, case, _agent_headers(case))
            finally:
                await client.close()

        asyncio.run(run())
    _verdict(up, case)
    assert _edits(url) > 0


def _key_clients(url: str, case: Case) -> list[anthropic.Anthropic]:
    return [anthropic.Anthropic(base_url=url, api_key=f"key-agent-{k}", max_retries=0) for k in range(case.agents)]


class _PerKey:
    """One SDK client per agent, each with its own API key: the sender is the key."""

    def __init__(self, url: str, case: Case) -> None:
        self.clients = _key_clients(url, case)
        self.messages = self

    def create(self, *, extra_headers: dict[str, str], **kw: Any) -> Any:
        k = int(extra_headers.pop("_agent"))
        return self.clients[k].messages.create(extra_headers=extra_headers, **kw)

    def close(self) -> None:
        for c in self.clients:
            c.close()


def _per_key(case: Case) -> Any:
    base = _key_headers(case)
    return lambda k: {**base(k), "_agent": str(k)}


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_compact_proxy_never_mixes_clients(case: Case, tmp_path: Path) -> None:
    """Each client its own API key; the proxy's summaries go upstream with the key of the
    request they compact, and are checked like the agents' requests."""
    case = case.fresh()
    url = str(tmp_path / "sessions")
    with Emulator(SummarizingResponder(ScriptedResponder(_reply))) as emu:
        up = Upstream(emu)
        with Proxy(ProxyConfig(upstream=emu.url, port=0, mode="compact", store=url, window_tokens=WINDOW)) as px:
            clients = _PerKey(px.url, case)
            try:
                _drive_threads(clients, case, _per_key(case))  # type: ignore[arg-type]
            finally:
                clients.close()
            px.wait_idle()
    agents = [r for r in up.got if r.sender is not None]
    assert len(agents) >= case.agents * case.turns  # the agents' requests and the summaries made for them
    assert all(r.status == 200 for r in up.got)
    assert foreign(up.got) == []
    assert _edits(url) > 0


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_two_proxies_on_one_postgres_never_mix_clients(case: Case, pg_url: str) -> None:
    """Two compact proxies, separate processes, on one PostgreSQL database; each agent's turns
    alternate between them, so both replicas append to the sessions the agents share."""
    case = case.fresh()
    with Emulator(SummarizingResponder(ScriptedResponder(_reply))) as emu:
        up = Upstream(emu)
        procs: list[subprocess.Popen[str]] = []
        try:
            urls = []
            for _ in range(2):
                p, u = spawn_cli_server(["proxy", "--port", "0", "--upstream", emu.url, "--mode", "compact",
                                         "--store", pg_url, "--window", str(WINDOW)], quiet=True)
                procs.append(p)
                urls.append(u)
            pairs = [_key_clients(u, case) for u in urls]
            turn = [0] * case.agents

            class Alternating:
                messages = None

                def create(self, *, extra_headers: dict[str, str], **kw: Any) -> Any:
                    k = int(extra_headers.pop("_agent"))
                    turn[k] += 1
                    return pairs[(k + turn[k]) % 2][k].messages.create(extra_headers=extra_headers, **kw)

            alt = Alternating()
            alt.messages = alt  # type: ignore[assignment]
            try:
                _drive_threads(alt, case, _per_key(case))  # type: ignore[arg-type]
            finally:
                for cs in pairs:
                    for c in cs:
                        c.close()
        finally:
            for p in procs:
                with contextlib.suppress(Exception):
                    p.terminate()
                    p.wait(20)
    assert all(r.status == 200 for r in up.got)
    assert foreign(up.got) == []


