"""Real clients through the proxy into the emulator: curl, the TypeScript SDK, the Claude Code
CLI (observe mode, and compact mode at a small window), and the dashboard in a headless
Chromium. Each test skips, saying why, only when its client is not installed; `.ci/run`
installs them all (see there)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx2
import pytest

from cachecompact.adapters.proxy import Proxy, ProxyConfig
from cachecompact.tools.emulator import Emulator, ScriptedResponder, SummarizingResponder
from cachecompact.tools.emulator.responders import Reply

ROOT = Path(__file__).resolve().parents[2]
NODE_MODULES = Path(os.environ.get("CACHECOMPACT_NODE_MODULES", ROOT / ".ci" / "node" / "node_modules"))
CLAUDE = NODE_MODULES / ".bin" / "claude"
CHROMIUM = os.environ.get("CACHECOMPACT_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(os.environ.get("CACHECOMPACT_TEST_ARTIFACTS", ROOT / "test-artifacts"))
MODEL = "claude-sonnet-4-6"
pytestmark = pytest.mark.integration  # curl, Node, the TypeScript SDK, the Claude Code CLI, Chromium


def _need(ok: bool, why: str) -> None:
    if not ok:
        pytest.skip(why)


# -- curl -----------------------------------------------------------------------------------------


def test_curl_no_buffer_streams_through_the_proxy() -> None:
    curl = shutil.which("curl")
    _need(curl is not None, "curl is not installed")
    body = {"model": MODEL, "max_tokens": 30, "stream": True, "messages": [{"role": "user", "content": "hi curl"}]}
    with Emulator() as emu, Proxy(ProxyConfig(upstream=emu.url, port=0)) as px:
        out = subprocess.run([str(curl), "-sS", "--no-buffer", "-X", "POST", px.url + "/v1/messages",
                              "-H", "content-type: application/json", "-H", "x-api-key: sk-curl",
                              "-H", "anthropic-version: 2023-06-01", "-d", json.dumps(body)],
                             capture_output=True, text=True, timeout=60, check=True).stdout
        px.wait_idle()
        (s,) = px.state.observer.sessions()
    events = re.findall(r"^event: (\w+)", out, re.M)
    assert events[0] == "message_start" and events[-1] == "message_stop" and "content_block_delta" in events
    assert s.requests == 1 and s.records[0]["stream"] and s.records[0]["usage"]["output_tokens"] > 0


# -- the TypeScript SDK ---------------------------------------------------------------------------------


def test_typescript_sdk_through_the_proxy() -> None:
    node = shutil.which("node")
    _need(node is not None, "node is not installed")
    _need((NODE_MODULES / "@anthropic-ai" / "sdk").is_dir(),
          f"@anthropic-ai/sdk is not installed in {NODE_MODULES} (.ci/run installs it)")
    with Emulator() as emu, Proxy(ProxyConfig(upstream=emu.url, port=0)) as px:
        r = subprocess.run([str(node), str(ROOT / "tests" / "clients" / "ts_sdk.mjs"), str(NODE_MODULES)],
                           env={**os.environ, "PROXY_URL": px.url}, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        px.wait_idle()
        s = px.state.observer.get("ts-sdk")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["create"] and out["stream"]["deltas"] >= 1 and out["stream"]["read"] > 0
    assert out["raw"][0] == "message_start" and out["raw"][-1] == "message_stop" and out["count"] > 0
    assert s is not None and s.requests == 3  # count_tokens is forwarded, not recorded
    assert [r["finding"]["cls"] for r in s.records] == ["read_as_expected"] * 3


# -- the Claude Code CLI ------------------------------------------------------------------------------------


def _bash_model(steps: int, lines: int) -> Any:
    """A scripted model that asks Claude Code to run ``steps`` Bash commands, then says done.
    It numbers steps by the highest ``line N`` it can still see, so compaction cannot loop it."""

    def respond(body: dict[str, Any]) -> Reply:
        seen = [int(x) for x in re.findall(r"line (\d+) ", json.dumps(body["messages"]))]
        n = max(seen) + 1 if seen else 0
        if n >= steps:
            return Reply([{"type": "text", "text": "done"}], "end_turn")
        return Reply([{"type": "text", "text": f"Running step {n}."},
                      {"type": "tool_use", "id": f"toolu_cc_{n:03d}", "name": "Bash",
                       "input": {"command": f"seq 1 {lines} | sed 's/^/line {n} /'", "description": f"step {n}"}}],
                     "tool_use")
    return respond


def _run_claude(proxy_url: str, tmp: Path) -> dict[str, Any]:
    # pinned at 4096 so these tests count requests and re-runs exactly: at the CLI's default (128,000 on
    # Opus 5.5) every turn first meets the API's "exceed context limit" 400 and a retry. The default
    # itself is covered by test_client_defaults.py, which unsets this and asserts the default is in force.
    # At 40k the re-run test below does not pass at the default (128,000 on Opus 5.5): the policy plans for
    # a quarter of the window as the reserve such a client lowers to (`OWN_RESERVE_SHARE`), which beside
    # Claude Code's 19.8k prefix leaves no room to bring the 5.5k re-run back whole, so it comes back
    # shortened and the model answers "lost" (measured 2026-12-07; docs/policy.md, *Safety*)
    env = {**os.environ, "ANTHROPIC_BASE_URL": proxy_url, "ANTHROPIC_API_KEY": "sk-claude-code-test",
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "CLAUDE_CONFIG_DIR": str(tmp / "cfg"),
           "CLAUDE_CODE_MAX_RETRIES": "1", "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "4096"}
    env.pop("ANTHROPIC_AUTH_TOKEN", None)
    work = tmp / "work"
    work.mkdir(exist_ok=True)
    r = subprocess.run([str(CLAUDE), "-p", "run the steps", "--allowedTools", "Bash", "--output-format", "json"],
                       env=env, capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL, cwd=work)
    assert r.returncode == 0, (r.stdout[-1500:], r.stderr[-1500:])
    out: dict[str, Any] = json.loads(r.stdout)
    return out


@pytest.mark.parametrize("mode", ["observe", "compact"])
def test_claude_code_through_the_proxy(tmp_path: Path, mode: str) -> None:
    _need(CLAUDE.exists(), f"the Claude Code CLI is not installed at {CLAUDE} (.ci/run installs it)")
    window = 40_000 if mode == "compact" else None
    steps, lines = (12, 500) if mode == "compact" else (4, 50)
    with Emulator(SummarizingResponder(ScriptedResponder(_bash_model(steps, lines))), context_window=window) as emu, \
            Proxy(ProxyConfig(upstream=emu.url, port=0, mode=mode, window_tokens=window,
                              store=str(tmp_path / "store"))) as px:
        result = _run_claude(px.url, tmp_path)
        px.wait_idle()
        served = [r for r in emu.requests if r.get("status") == 200 and not r.get("internal")]
        sessions = px.state.observer.sessions()
    assert result["result"] == "done" and not result["is_error"]
    assert result["num_turns"] == steps + 1
    # the findings account for every request Claude Code made
    assert sum(s.requests for s in sessions) == len(served) == steps + 1
    (s,) = [x for x in sessions if x.sid.startswith("cc-")]
    assert s.sid == f"cc-{result['session_id']}"
    assert all("finding" in r for r in s.records)
    if mode == "observe":
        assert s.misses == {} and s.read > 0
        assert [r["usage"]["cache_read_input_tokens"] for r in s.records] == \
            [r["usage"]["cache_read_input_tokens"] for r in served]
    else:
        assert window is not None and max(r["total_input_tokens"] for r in served) <= window
        assert s.compactions  # the ledger did the work, and Claude Code never noticed
        churn = [r["finding"] for r in s.records if r["finding"]["cls"] == "prefix_churn"]
        assert all(f["explained_by"] is not None for f in churn)  # our own edits, each named


def _rereading_model(steps: int, lines: int, bodies: list[str]) -> Any:
    """A closed-loop model through Claude Code: it runs ``steps`` Bash commands, then needs a line
    of step 2's output (the first after the immutable prefix, which no edit touches). If
    compaction has hidden it, it runs that command again, exactly (issue 47: the re-run must come
    back whole), and says whether it found the line."""
    def call(n: int) -> dict[str, str]:
        return {"command": f"seq 1 {lines} | sed 's/^/line {n} /'", "description": f"step {n}"}

    needed = f"line 2 {lines // 2}"
    issued = [0, 0]  # steps run, re-runs asked for (the model remembers what it did, not what it sees)

    def respond(body: dict[str, Any]) -> Reply:
        text = json.dumps(body["messages"])
        bodies.append(text)
        seen = [int(x) for x in re.findall(r"line (\d+) ", text)]
        n = issued[0] = max([issued[0], *(x + 1 for x in seen)])
        if n < steps:
            return Reply([{"type": "text", "text": f"Running step {n}."},
                          {"type": "tool_use", "id": f"toolu_rr_{n:03d}", "name": "Bash", "input": call(n)}],
                         "tool_use")
        if needed + "\\n" in text:
            return Reply([{"type": "text", "text": f"found {needed}"}], "end_turn")
        asked = issued[1]
        if asked >= 2:
            return Reply([{"type": "text", "text": "lost"}], "end_turn")
        issued[1] += 1
        return Reply([{"type": "text", "text": "I need step 2's output again."},
                      {"type": "tool_use", "id": f"toolu_rr_again_{asked}", "name": "Bash", "input": call(2)}],
                     "tool_use")
    return respond


def test_claude_code_gets_a_shortened_bash_output_back_when_it_runs_it_again(tmp_path: Path) -> None:
    """Through the compact proxy, a Claude Code Bash output that compaction hid comes back whole
    when the model runs the same command again."""
    _need(CLAUDE.exists(), f"the Claude Code CLI is not installed at {CLAUDE} (.ci/run installs it)")
    window, steps, lines = 40_000, 9, 700
    bodies: list[str] = []
    with Emulator(SummarizingResponder(ScriptedResponder(_rereading_model(steps, lines, bodies))),
                  context_window=window) as emu, \
            Proxy(ProxyConfig(upstream=emu.url, port=0, mode="compact", window_tokens=window,
                              store=str(tmp_path / "store"))) as px:
        result = _run_claude(px.url, tmp_path)
        px.wait_idle()
    # hidden: the line the model needs is out of view (a summary may still quote other lines of
    # that output, such as its last, which the summary's verbatim lines keep)
    hidden = [k for k, b in enumerate(bodies) if k > 3 and f"line 2 {lines // 2}\\n" not in b]
    assert hidden, ("step 2's output was never hidden: the test tested nothing", [len(b) for b in bodies])
    assert result["result"] == f"found line 2 {lines // 2}", (result["result"], [len(b) for b in bodies])
    again = bodies[-1].split("toolu_rr_again_0")[-1]  # the re-run and its result
    assert f"line 2 {lines}" in again and "shortened" not in again and "cleared" not in again


def _prompt_model(body: dict[str, Any]) -> Reply:
    """One Bash step per prompt: a tool call for the newest prompt, then "done N" once its result
    is in."""
    last = json.dumps(body["messages"][-1])
    prompts = re.findall(r"prompt (\d+) please", json.dumps(body["messages"]))
    n = prompts[-1] if prompts else "?"
    if "tool_result" in last:
        return Reply([{"type": "text", "text": f"done {n}"}], "end_turn")
    return Reply([{"type": "tool_use", "id": f"toolu_p{n}_{len(body['messages']):03d}", "name": "Bash",
                   "input": {"command": f"seq 1 300 | sed 's/^/prompt {n} output /'", "description": f"step {n}"}}],
                 "tool_use")


@pytest.mark.parametrize("mode", ["observe", "compact"])
def test_claude_code_ten_continued_prompts_are_one_session(tmp_path: Path, mode: str) -> None:
    """`claude -p` then nine `claude -c -p` through the proxy: one session in /api/sessions (Claude
    Code sends the newest prompt as a marked block list and, on the next request, as a plain
    string: one message), and in compact mode no prompt after the first re-writes the cache."""
    _need(CLAUDE.exists(), f"the Claude Code CLI is not installed at {CLAUDE} (.ci/run installs it)")
    window = 60_000 if mode == "compact" else None
    env = {**os.environ, "ANTHROPIC_API_KEY": "sk-claude-code-test", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
           "CLAUDE_CONFIG_DIR": str(tmp_path / "cfg"), "CLAUDE_CODE_MAX_RETRIES": "1",
           "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "4096"}
    env.pop("ANTHROPIC_AUTH_TOKEN", None)
    work = tmp_path / "work"
    work.mkdir()
    with Emulator(SummarizingResponder(ScriptedResponder(_prompt_model)), context_window=window) as emu, \
            Proxy(ProxyConfig(upstream=emu.url, port=0, mode=mode, window_tokens=window,
                              store=str(tmp_path / "store"))) as px:
        env["ANTHROPIC_BASE_URL"] = px.url
        ids = []
        for k in range(10):
            # the model named: left to itself, this CLI asks for "claude-opus-4-8[1m]" on its first
            # prompt and "claude-opus-4-8" (another system prompt: a true prefix churn) after -c
            args = [str(CLAUDE), *(["-c"] if k else []), "-p", f"prompt {k} please", "--allowedTools", "Bash",
                    "--model", MODEL, "--output-format", "json"]
            r = subprocess.run(args, env=env, capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL,
                               cwd=work)
            assert r.returncode == 0, (k, r.stdout[-1500:], r.stderr[-1500:])
            out = json.loads(r.stdout)
            assert out["result"] == f"done {k}" and not out["is_error"], out
            ids.append(out["session_id"])
        px.wait_idle()
        listed = httpx2.get(px.url + "/api/sessions").json()["sessions"]
        page = httpx2.get(px.url + "/ui").text
        served = [r for r in emu.requests if r.get("status") == 200 and not r.get("internal")]
    assert len(set(ids)) == 1
    assert [x["id"] for x in listed] == [f"cc-{ids[0]}"], [x["id"] for x in listed]
    assert listed[0]["requests"] == len(served) == 20
    assert "<html" in page.lower()
    if mode == "compact":
        for k in range(1, 10):  # each prompt's first request reads what the one before it cached
            u = served[2 * k]["usage"]
            assert u["cache_read_input_tokens"] > u["cache_creation_input_tokens"], (k, u)


def _delegating_model(body: dict[str, Any]) -> Reply:
    """The main agent hands one task to a sub-agent (Claude Code's Agent tool), then says done;
    the sub-agent, whose first message holds the task, answers at once. (Claude Code 2.1.3xx
    runs a sub-agent in the background and tells the main agent with a later user message, so
    "the main agent delegated" is read from the whole conversation, not from its last message.)"""
    if "SUBTASK" in json.dumps(body["messages"][0]):
        return Reply([{"type": "text", "text": "sub done"}], "end_turn")
    if any(m["role"] == "assistant" and "toolu_agent_1" in json.dumps(m["content"]) for m in body["messages"]):
        return Reply([{"type": "text", "text": "done"}], "end_turn")
    return Reply([{"type": "tool_use", "id": "toolu_agent_1", "name": "Agent",
                   "input": {"description": "count things", "prompt": "SUBTASK: count to three",
                             "subagent_type": "general-purpose"}}], "tool_use")


@pytest.mark.parametrize("mode", ["observe", "compact"])
def test_claude_code_sub_agents_get_their_own_linked_session(tmp_path: Path, mode: str) -> None:
    """A sub-agent sends its parent's session id with its own system prompt, tools and first
    message: its requests go to a session of its own, linked to the parent, listed under the
    parent's conversation; never to a segment of the parent."""
    _need(CLAUDE.exists(), f"the Claude Code CLI is not installed at {CLAUDE} (.ci/run installs it)")
    env = {**os.environ, "ANTHROPIC_API_KEY": "sk-claude-code-test", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
           "CLAUDE_CONFIG_DIR": str(tmp_path / "cfg"), "CLAUDE_CODE_MAX_RETRIES": "1"}
    env.pop("ANTHROPIC_AUTH_TOKEN", None)
    (tmp_path / "work").mkdir()
    with Emulator(ScriptedResponder(_delegating_model)) as emu, \
            Proxy(ProxyConfig(upstream=emu.url, port=0, mode=mode, store=str(tmp_path / "store"))) as px:
        env["ANTHROPIC_BASE_URL"] = px.url
        r = subprocess.run([str(CLAUDE), "-p", "delegate please", "--model", MODEL, "--allowedTools", "Agent",
                            "--output-format", "json"], env=env, capture_output=True, text=True, timeout=240,
                           stdin=subprocess.DEVNULL, cwd=tmp_path / "work")
        assert r.returncode == 0, (r.stdout[-1500:], r.stderr[-1500:])
        out = json.loads(r.stdout)
        px.wait_idle()
        listed = httpx2.get(px.url + "/api/sessions").json()["sessions"]
    assert out["result"] == "done"
    parent = f"cc-{out['session_id']}"
    assert [c["id"] for c in listed] == [parent]
    (sub,) = listed[0]["segments"]
    assert sub["id"] == f"{parent}.a2" and sub["link"]["session"] == parent and sub["requests"] >= 1
    # the parent's own: the call, the answer after the result, and (Claude Code 2.1.3xx, whose sub-agents run
    # in the background) the answer after the notice that the sub-agent finished
    assert listed[0]["requests"] in (2, 3)


# -- the dashboard in a real browser ---------------------------------------------------------------------------------


def test_dashboard_in_headless_chromium(tmp_path: Path) -> None:
    """Every page of the dashboard in a real browser while a scripted Claude Code session (a
    main agent that hands a task to a sub-agent) runs through the proxy: the list fills in by
    itself, with totals and the sub-agent under its conversation; the session page has its
    three charts with labelled axes, a value on hover and what fills the context; a miss page
    shows hostile text as text. No console error, no failed request (the favicon included).
    Screenshots go to the test's temporary folder, and to CACHECOMPACT_TEST_ARTIFACTS for CI."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the dev extra)")
    _need(Path(CHROMIUM).exists(), f"chromium is not installed at {CHROMIUM}")
    _need(CLAUDE.exists(), f"the Claude Code CLI is not installed at {CLAUDE} (.ci/run installs it)")
    import anthropic

    shots = tmp_path / "screenshots"
    shots.mkdir()
    env = {**os.environ, "ANTHROPIC_API_KEY": "sk-claude-code-test", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
           "CLAUDE_CONFIG_DIR": str(tmp_path / "cfg"), "CLAUDE_CODE_MAX_RETRIES": "1"}
    env.pop("ANTHROPIC_AUTH_TOKEN", None)
    (tmp_path / "work").mkdir()

    def model(body: dict[str, Any]) -> Reply:  # Claude Code's sub-agent scenario; any other request: a short text
        return _delegating_model(body) if body.get("tools") else Reply([{"type": "text", "text": "ok"}], "end_turn")

    hostile = '<img src=x onerror="window.pwned=1"><script>window.pwned=2</script>'
    cc = {"type": "ephemeral"}
    system = [{"type": "text", "text": "You are careful. " * 400, "cache_control": cc}]
    with Emulator(ScriptedResponder(model)) as emu, \
            Proxy(ProxyConfig(upstream=emu.url, port=0, store=str(tmp_path / "s"), keep_bodies=True)) as px:
        env["ANTHROPIC_BASE_URL"] = px.url
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                        args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                errors: list[str] = []
                page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
                page.on("console", lambda m: errors.append(f"console {m.type}: {m.text}")
                        if m.type in ("error", "warning") else None)
                # a full navigation cancels what the page was still fetching: a cancelled data fetch is
                # moot (the new page fetches its own), a cancelled file (the favicon, say) counts only if
                # its address was never served, and any other failure counts at once
                aborted: set[str] = set()
                served: set[str] = set()

                def failed(r: Any) -> None:
                    if r.failure != "net::ERR_ABORTED":
                        errors.append(f"request failed: {r.url} ({r.failure})")
                    elif "/api/" not in r.url:
                        aborted.add(r.url)

                page.on("requestfailed", failed)
                page.on("response", lambda r: errors.append(f"HTTP {r.status}: {r.url}") if r.status >= 400
                        else served.add(r.url))
                page.goto(px.url + "/ui")
                sync_api.expect(page.locator("#no-sessions")).to_be_visible()
                # the Claude Code session starts with the page open: the list must follow by itself
                run = subprocess.Popen([str(CLAUDE), "-p", "delegate please", "--model", MODEL, "--allowedTools",
                                        "Agent", "--output-format", "json"], env=env, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
                                       cwd=tmp_path / "work")
                try:
                    out, err = run.communicate(timeout=240)
                finally:
                    run.kill()
                assert run.returncode == 0, (out[-1500:], err[-1500:])
                sid = f"cc-{json.loads(out)['session_id']}"
                px.wait_idle()
                top = page.locator(f'#sessions tbody tr[data-sid="{sid}"]')
                sync_api.expect(top).to_have_count(1, timeout=15_000)  # no reload: the poll brought it
                sub = page.locator("#sessions tbody tr.segment")
                sync_api.expect(sub).to_have_count(1, timeout=15_000)
                sync_api.expect(sub).to_contain_text(f"{sid}.a2")
                assert page.locator("#sessions tbody tr").nth(1).get_attribute("data-sid") == f"{sid}.a2"
                listed = httpx2.get(px.url + "/api/sessions").json()["sessions"]
                total = sum(s["requests"] for c in listed for s in [c, *c.get("segments", [])])
                sync_api.expect(page.locator("#totals")).to_contain_text(f"{total}")
                sync_api.expect(page.locator("#totals")).to_contain_text("1 conversations, 2 sessions")
                sync_api.expect(top).to_contain_text(MODEL)
                (conv,) = [c for c in listed if c["id"] == sid]  # the first row says the conversation's total too
                sync_api.expect(top).to_contain_text(f"(all {conv['conversation']['requests']})")
                page.goto(px.url + f"/ui#/session/{sid}")  # the session page links to its sub-agent
                sync_api.expect(page.locator(f'#session-related a[href="#/session/{sid}.a2"]')).to_have_count(1)
                page.goto(px.url + "/ui")
                # named by its project folder and first prompt, not by a UUID alone
                sync_api.expect(top).to_contain_text("work: delegate please")
                page.fill("#filter", "no-such-session")
                sync_api.expect(page.locator("#sessions tbody tr")).to_have_count(1)  # says the table is empty
                sync_api.expect(page.locator("#sessions tbody")).to_contain_text('no session matches "no-such-session"')
                page.fill("#filter", "delegate")  # the title is searched too
                sync_api.expect(top).to_have_count(1)
                page.fill("#filter", "")
                page.click('#sessions th[data-key="requests"]')
                sync_api.expect(page.locator('#sessions th[data-key="requests"]')).to_have_class(re.compile("sorted"))
                page.screenshot(path=str(shots / "dashboard-list.png"), full_page=True)
                # a request the API rejects, of no conversation yet: a line under the table, not an empty row
                rows = page.locator("#sessions tbody tr").count()
                stray = {"model": MODEL, "max_tokens": 10, "temperature": 7, "messages": [{"role": "user",
                                                                                            "content": "stray"}]}
                assert httpx2.post(px.url + "/v1/messages", json=stray,
                                   headers={"x-api-key": "k", "anthropic-version": "2023-06-01"}).status_code == 400
                px.wait_idle()
                said = "1 request of conversations that got no answer"
                sync_api.expect(page.locator("#rejected-only")).to_contain_text(said, timeout=15_000)
                assert page.locator("#sessions tbody tr").count() == rows

                # a second client, through the SDK, whose changed system prompt is a miss with hostile text
                c = anthropic.Anthropic(base_url=px.url, api_key="k", max_retries=0)
                msgs: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": "start " * 600}]}]
                for k in range(4):
                    last = {"role": "user", "content": [{**msgs[-1]["content"][0], "cache_control": cc}]}
                    marked = [*msgs[:-1], last]
                    sysk = system if k != 2 else [{"type": "text", "text": hostile + system[0]["text"],
                                                   "cache_control": cc}]
                    r = c.messages.create(model=MODEL, max_tokens=20, system=sysk, messages=marked,
                                          extra_headers={"x-cachecompact-session": "web"})
                    msgs += [{"role": "assistant", "content": r.content[0].text},
                             {"role": "user", "content": [{"type": "text", "text": f"tool output {k} " * 300}]}]
                px.wait_idle()
                row = page.locator('#sessions tbody tr[data-sid="web"]')
                sync_api.expect(row).to_have_count(1, timeout=10_000)  # the list followed again
                row.click()
                sync_api.expect(page.locator("#session-title")).to_contain_text("session web")
                assert page.url.endswith("/ui#/session/web")  # every view has its address
                sync_api.expect(page.locator("#window-note")).to_contain_text("the model's context window")
                sync_api.expect(page.locator("#compactions tbody")).to_contain_text("no compactions in this session")
                for chart, y_label in (("cost", "cumulative cost ($)"), ("context", "tokens"),
                                       ("idle", "idle before (s, log)")):
                    svg = page.locator(f"#chart-{chart} svg")
                    sync_api.expect(svg.locator("text.x-label")).to_have_text("request")
                    sync_api.expect(svg.locator("text.y-label")).to_have_text(y_label)
                    assert svg.locator("text").count() >= 6  # tick values on both axes
                page.locator("#chart-cost circle.point").nth(3).hover()
                sync_api.expect(page.locator("#readout-cost")).to_contain_text("request #3")
                page.locator("#chart-context rect.bar.write").first.hover()
                sync_api.expect(page.locator("#readout-context")).to_contain_text("tokens")
                assert page.locator("#chart-idle line.ttl").count() == 2
                assert "TTL 5m" in (page.locator("#chart-idle rect.idle-bar title").first.text_content() or "")

                def part(name: str) -> int:  # the tokens the context view shows for one part
                    cells = page.locator("#context-parts tbody tr", has_text=name).first.locator("td")
                    return int((cells.nth(1).text_content() or "0").replace(",", ""))

                assert part("system prompt") > 1_000 and part("user messages") > 1_000 and part("free space") > 0
                assert part("tool results") == 0  # this client sent none
                assert page.locator("#context-bar div").count() >= 3
                page.screenshot(path=str(shots / "dashboard-session.png"), full_page=True)
                miss = page.locator("#misses tbody tr").first
                sync_api.expect(miss).to_contain_text("prefix_churn")
                miss.click()
                sync_api.expect(page.locator("#miss-title")).to_contain_text("prefix_churn")
                after = page.locator("#miss-after").inner_text()
                assert "<script>window.pwned=2</script>" in after  # shown as text ...
                assert page.evaluate("() => window.pwned") is None  # ... never run
                assert page.locator("#miss-body").inner_text().startswith("{")  # --keep-bodies: the body
                page.screenshot(path=str(shots / "dashboard-miss.png"), full_page=True)
                miss_url = page.url
                assert re.search(r"/ui#/session/web/request/\d+$", miss_url)
                # a deep link opens the miss in a fresh page, and the back button returns to the session
                other = browser.new_page(viewport={"width": 1280, "height": 900})
                other.goto(miss_url)
                sync_api.expect(other.locator("#miss-title")).to_contain_text("prefix_churn")
                other.close()
                page.go_back()
                sync_api.expect(page.locator("#session-title")).to_contain_text("session web")
                page.go_forward()
                sync_api.expect(page.locator("#miss-title")).to_contain_text("prefix_churn")
                page.click("#back-session")
                page.click("#back")
                sync_api.expect(page.locator(f'#sessions tbody tr[data-sid="{sid}"]')).to_have_count(1)
                page.locator(f'#sessions tbody tr[data-sid="{sid}"]').click()  # the Claude Code session's page
                sync_api.expect(page.locator("#session-title")).to_have_text(f"work: delegate please (session {sid})")
                sync_api.expect(page.locator("#context-parts tbody")).to_contain_text("tools")
                assert part("tools") > 0 and part("tool calls") > 0  # Claude Code's tools, and its Agent call
                page.screenshot(path=str(shots / "dashboard-claude-code.png"), full_page=True)
                errors += [f"request cancelled and never served: {u}" for u in sorted(aborted - served)]
                assert not errors, errors
                assert any(u.endswith("/ui/favicon.svg") for u in served), sorted(served)
            finally:
                browser.close()
    for shot in shots.iterdir():
        assert shot.stat().st_size > 5_000, shot
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for shot in shots.iterdir():
        shutil.copy(shot, ARTIFACTS / shot.name)
