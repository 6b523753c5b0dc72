"""The clients as they come (issue 62): Claude Code and opencode, each at its own defaults (its
own ``max_tokens``, thinking as it sends it: no override), hold multi-prompt conversations
(``claude -c``, ``opencode run -c``) through the proxy in observe and compact mode into the
emulator, at a small window, a middle one and the model's own.

The scripted model answers the newest prompt of the person it can see: prompt K gets S Bash
calls, then "done K"; with no prompt left in sight it says "LOST". A prompt answered with another
prompt's "done", or with "LOST", was summarized away. The proxy must never answer with its own
"context is full" where the API would have taken the request.

Each test skips, saying why, only when its client is not installed; `.ci/run` installs both into
.ci/node (CACHECOMPACT_NODE_MODULES elsewhere). opencode runs offline: its provider is the
built-in ``anthropic`` one (the bundled ``@ai-sdk/anthropic``) with ``options.baseURL`` at the
proxy, OPENCODE_DISABLE_MODELS_FETCH=1 (the bundled model list), npm_config_offline=true (no
background install of its plugin package from the npm registry), and HOME, PWD and the XDG
folders in the test's temporary folder. Claude Code reaches nothing but the proxy either
(CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from cachecompact.adapters.proxy import Proxy, ProxyConfig
from cachecompact.base.values import ProxyMode
from cachecompact.tools.emulator import Emulator, ScriptedResponder, SummarizingResponder
from cachecompact.tools.emulator.responders import Reply

ROOT = Path(__file__).resolve().parents[2]
NODE_MODULES = Path(os.environ.get("CACHECOMPACT_NODE_MODULES", ROOT / ".ci" / "node" / "node_modules"))
BIN = {"claude-code": NODE_MODULES / ".bin" / "claude", "opencode": NODE_MODULES / ".bin" / "opencode"}
MODEL = "claude-sonnet-4-6"  # a 1M window of its own
pytestmark = pytest.mark.integration  # Node and the two CLIs

_PROMPT = re.compile(r"prompt (\d+) please")


def _texts(m: dict[str, Any]) -> list[str]:
    """The text blocks of a message (not tool results or thinking)."""
    c = m.get("content")
    if isinstance(c, str):
        return [c]
    return [b.get("text") or "" for b in c or [] if isinstance(b, dict) and b.get("type") == "text"]


def person_prompts(messages: list[dict[str, Any]]) -> list[int]:
    """The numbers of the person's prompts the model can see, oldest first: "prompt K please" in a
    user message's own text (the person's, or a summary the client put there) or in an API-written
    summary (a compaction block); a tool's output that prints it does not count."""
    seen = []
    for m in messages:
        texts = _texts(m) if m.get("role") == "user" else []
        texts += [str(b.get("content") or "") for b in m.get("content") or []
                  if isinstance(b, dict) and b.get("type") == "compaction"]
        seen += [int(k) for t in texts for k in _PROMPT.findall(t)]
    return seen


@dataclass
class PromptModel:
    """Answers the newest person's prompt it can see: prompt K gets ``steps`` calls of the client's
    shell tool, each printing ``lines`` numbered lines, then "done K"; no prompt in sight: "LOST".
    It remembers the calls it made for each prompt (a compacted history hides their outputs), so
    it never loops. Asked for a summary by the client, it lists the person's prompts it can see,
    as a model does when told to keep every user message."""

    steps: int
    lines: int
    answers: list[str] = field(default_factory=list)  # every final answer, in order
    _issued: dict[int, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _ids: int = 0
    max_tokens: int = 0  # the largest max_tokens a request it answered asked for
    think: int = 0  # tokens of thinking before each answer of the work, when the request turns thinking on
    thought: int = 0  # the answers it thought before

    def __call__(self, body: dict[str, Any]) -> Reply:
        reply = self._answer(body)
        th = body.get("thinking")
        if self.think and reply.content[0].get("text", "").startswith(("Step", "done")) and isinstance(th, dict) \
                and th.get("type") in ("enabled", "adaptive"):
            self.thought += 1
            return Reply([{"type": "thinking", "thinking": ""}, *reply.content], reply.stop_reason, thinks=True,
                         thinking_tokens=[self.think])
        return reply

    def _answer(self, body: dict[str, Any]) -> Reply:
        msgs = body["messages"]
        with self._lock:
            self.max_tokens = max(self.max_tokens, int(body.get("max_tokens") or 0))
            seen = person_prompts(msgs)
            if _asks_for_a_summary(body):  # the client's own compaction, or opencode's title
                said = "; ".join(f"prompt {k} please" for k in dict.fromkeys(seen)) or "none"
                return Reply([{"type": "text", "text": f"<summary>The person's requests, oldest first: {said}. The "
                                                       "newest is the one being worked on.</summary>"}], "end_turn")
            tools = {t.get("name") for t in body.get("tools") or []}
            shell = "Bash" if "Bash" in tools else "bash"
            if not seen:
                self.answers.append("LOST")
                return Reply([{"type": "text", "text": "LOST"}], "end_turn")
            k = seen[-1]
            s = self._issued.get(k, 0)
            if s >= self.steps:
                self.answers.append(f"done {k}")
                return Reply([{"type": "text", "text": f"done {k}"}], "end_turn")
            self._issued[k] = s + 1
            self._ids += 1
            # ~28 characters a line: under both clients' limits on a tool output kept whole
            cmd = f"seq 1 {self.lines} | sed 's/^/p{k} s{s} line /;s/$/ ok/'"
            return Reply([{"type": "text", "text": f"Step {s} of prompt {k}."},
                          {"type": "tool_use", "id": f"toolu_cd_{self._ids:04d}", "name": shell,
                           "input": {"command": cmd, "description": f"step {s} of prompt {k}"}}], "tool_use")


def _asks_for_a_summary(body: dict[str, Any]) -> bool:
    """A request for a summary or a title, not a turn of the work: one without the shell tool
    (opencode's title and compaction agents), or one whose last message is the client's own ask
    to summarize (Claude Code's compaction: the message's last text asks for a summary, after the
    last tool result or the person's newest prompt, if any; role "system" notes after it skipped)."""
    tools = {t.get("name") for t in body.get("tools") or []}
    if not tools & {"Bash", "bash"}:
        return True
    # Claude Code 2.1.337 may end its compaction request with a role "system" note after its ask
    # (an independent trial's model, answering that with a tool call, lost prompts direct at 40k)
    last = next((m for m in reversed(body["messages"]) if m.get("role") != "system"), {})
    if last.get("role") != "user":
        return False
    texts = _texts(last)
    text = texts[-1] if texts else ""
    return not _PROMPT.search(text) and re.search(r"summar", text, re.I) is not None


# -- the clients ------------------------------------------------------------------------------------------


def _claude_code(url: str, tmp: Path, k: int, model: str | None = MODEL, paste: int = 0) -> tuple[str, str]:
    """``claude -p`` (``-c -p`` after the first): its answer, and its error text if any; with
    ``model`` None, on the model the CLI picks itself (Opus, with its 128,000 of output); with
    ``paste``, the first prompt carries that many lines of pasted log."""
    env = {**os.environ, "ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": "sk-claude-code-test",
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "CLAUDE_CONFIG_DIR": str(tmp / "cfg")}
    for var in ("ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_MAX_OUTPUT_TOKENS", "CLAUDE_CODE_MAX_RETRIES"):
        env.pop(var, None)
    # the model named: left to itself this CLI asks for "claude-opus-4-8[1m]" (test_clients.py)
    text = f"prompt {k} please" + ("".join(f"\nlog {i:05d} status nominal" for i in range(paste)) if not k else "")
    args = [str(BIN["claude-code"]), *(["-c"] if k else []), "-p", text, "--allowedTools", "Bash",
            *(["--model", model] if model else []), "--output-format", "json"]
    r = subprocess.run(args, env=env, capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL,
                       cwd=tmp / "work")
    try:
        out = json.loads(r.stdout)
    except json.JSONDecodeError:
        return "", f"exit {r.returncode}: {r.stdout[-800:]} {r.stderr[-800:]}"
    text = str(out.get("result") or "")
    return (text, "") if r.returncode == 0 and not out.get("is_error") else ("", text or r.stderr[-800:])


def _opencode_env(url: str, tmp: Path) -> dict[str, str]:
    home = tmp / "home"
    env = {**os.environ, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"),
           "XDG_DATA_HOME": str(home / ".local" / "share"), "XDG_CACHE_HOME": str(home / ".cache"),
           "XDG_STATE_HOME": str(home / ".local" / "state"), "OPENCODE_DISABLE_MODELS_FETCH": "1",
           "OPENCODE_DISABLE_AUTOUPDATE": "1",
           # each start installs @opencode-ai/plugin into its config folder in the background, from
           # the npm registry: npm's own offline switch keeps that (and the run) off the network
           "npm_config_offline": "true",
           # opencode takes its folder from $PWD, not from its working directory: an inherited PWD
           # (pytest's) and it reads the config elsewhere and falls back to its own "opencode" provider
           "PWD": str(tmp / "work")}
    for var in list(env):
        if var.startswith("ANTHROPIC_") or (var.startswith("OPENCODE_") and var not in (
                "OPENCODE_DISABLE_MODELS_FETCH", "OPENCODE_DISABLE_AUTOUPDATE")):
            env.pop(var)  # a developer's own settings would change what is tested
    config = {"$schema": "https://opencode.ai/config.json", "model": f"anthropic/{MODEL}", "autoupdate": False,
              "share": "disabled",
              "provider": {"anthropic": {"options": {"baseURL": url + "/v1", "apiKey": "sk-opencode-test"}}}}
    (tmp / "work" / "opencode.json").write_text(json.dumps(config, indent=2))
    return env


def _opencode(url: str, tmp: Path, k: int) -> tuple[str, str]:
    """``opencode run`` (``run -c`` after the first): its last answer, and its error text if any."""
    args = [str(BIN["opencode"]), "run", *(["-c"] if k else []), "--print-logs", "--format", "json",
            f"prompt {k} please"]
    log = tmp / f"opencode-{k}.log"  # its own log, for a failure's reader
    with log.open("w") as err:
        r = subprocess.run(args, env=_opencode_env(url, tmp), stdout=subprocess.PIPE, stderr=err, text=True,
                           timeout=180, stdin=subprocess.DEVNULL, cwd=tmp / "work")
    texts, errors = [], []
    for line in r.stdout.splitlines():
        try:
            ev = json.loads(line)
        except json.JSONDecodeError:
            continue
        if ev.get("type") == "text":
            texts.append(str((ev.get("part") or {}).get("text") or ""))
        elif ev.get("type") == "error":
            errors.append(json.dumps(ev.get("error"))[:800])
    if errors or r.returncode != 0:
        return "", "; ".join(errors) or f"exit {r.returncode}: {log.read_text()[-800:]}"
    return (texts[-1].strip() if texts else ""), ""


def _claude_code_own_model(url: str, tmp: Path, k: int) -> tuple[str, str]:
    return _claude_code(url, tmp, k, model=None)


def _claude_code_pasting(url: str, tmp: Path, k: int) -> tuple[str, str]:
    return _claude_code(url, tmp, k, paste=PASTE_LINES)


PASTE_LINES = 1_700  # about 15,000 tokens: with Claude Code's system prompt and tools, most of 40k
RUN = {"claude-code": _claude_code, "opencode": _opencode, "claude-code-own-model": _claude_code_own_model,
       "claude-code-pasting": _claude_code_pasting}

# window -> (prompts, shell calls a prompt, lines a call): enough output to fill the small window
# and the middle one more than once (a call adds about 6,400 tokens with Claude Code); the model's
# own (1M) is not filled, only held
WINDOWS = {"small": 40_000, "middle": 100_000, "own": None}
WORK = {"small": (3, 3, 700), "middle": (3, 5, 700), "own": (2, 1, 50)}
API_MAX_TOKENS_400 = "input length and `max_tokens` exceed context limit"

# What the API itself lets a client do, whatever the proxy does. opencode sends max_tokens 32,000
# and neither lowers it on the API's 400 (to it that is no context overflow, and no retry) nor
# compacts on its own (it takes claude-sonnet-4-6 for 1M): at 40k its ~13k prompt plus 32,000 never
# fits, and at 100k the conversation stops once its prompt passes 68k. Direct, so through the proxy
# in observe mode; in compact mode too at 40k, where no compaction gets below the ~8k of system
# prompt and tools. There the API's own 400 must reach it, word for word, and no refusal of ours.
API_REFUSES = {("opencode", "observe", "small"), ("opencode", "compact", "small"), ("opencode", "observe", "middle")}


@dataclass
class Outcome:
    answers: list[str]  # what the client printed for each prompt ("" when it failed)
    errors: list[str]  # its error for each prompt ("" when it answered)
    refused: int  # the proxy's own "context is full" answers
    api_400s: list[str]  # the emulator's refusals: what the API said
    lost: int  # the model's "LOST" answers (some a client may have retried past)
    compactions: int  # the proxy's compactions
    max_input: int  # the largest prompt the emulator answered
    max_tokens: int  # the largest max_tokens the client asked for: answered, or in the API's 400 ("N + K > M")
    thought: int = 0  # the model's answers that carried thinking

    def __str__(self) -> str:
        return (f"answers={self.answers} errors={[e[:160] for e in self.errors]} refused={self.refused} "
                f"api_400s={len(self.api_400s)} lost={self.lost} compactions={self.compactions} "
                f"max_input={self.max_input}")


def _converse(client: str, mode: ProxyMode, window: str, tmp: Path, think: int = 0) -> Outcome:
    """One conversation of the client through the proxy into the emulator; it stops at the first
    prompt the client could not answer (the rest would fail the same way)."""
    prompts, steps, lines = WORK[window]
    tokens = WINDOWS[window]
    model = PromptModel(steps, lines, think=think)
    (tmp / "work").mkdir()
    emu_log = tmp / "emulator.jsonl"
    with Emulator(SummarizingResponder(ScriptedResponder(model)), context_window=tokens, log=emu_log) as emu, \
            Proxy(ProxyConfig(upstream=emu.url, port=0, mode=mode, window_tokens=tokens if mode == "compact" else None,
                              store=str(tmp / "store"))) as px:
        answers, errors = [], []
        for k in range(prompts):
            a, e = RUN[client](px.url, tmp, k)
            answers.append(a)
            errors.append(e)
            if e:
                break
        px.wait_idle()
        served = [r for r in emu.requests if r.get("status") == 200 and not r.get("internal")]
        sessions = px.state.observer.sessions()
        refused = px.state.observer.totals.refused  # the proxy's own answers (compact mode: context full)
    logged = [json.loads(x) for x in emu_log.read_text().splitlines()] if emu_log.exists() else []
    api_400s = [str((r.get("error") or {}).get("message")) for r in logged if r.get("status", 200) >= 400]
    return Outcome(answers, errors, refused, api_400s,
                   model.answers.count("LOST"), sum(len(s.compactions) for s in sessions),
                   max((r.get("total_input_tokens") or 0 for r in served), default=0),
                   max([model.max_tokens, *(int(k) for m in api_400s for k in re.findall(r" \+ (\d+) > ", m))]),
                   model.thought)


CASES = [pytest.param(c, m, w, id=f"{c}-{m}-{w}") for c in BIN for m in ("observe", "compact") for w in WINDOWS]


@pytest.mark.parametrize(("client", "mode", "window"), CASES)
def test_a_client_at_its_defaults_gets_every_prompt_answered(tmp_path: Path, client: str, mode: ProxyMode,
                                                             window: str) -> None:
    """Every prompt answered as its own (or, where the API itself refuses the client's requests,
    the API's own 400 and nothing of ours), and never a "context is full" of the proxy's own."""
    if not BIN[client].exists():
        pytest.skip(f"{client} is not installed at {BIN[client]} (.ci/run installs it)")
    out = _converse(client, mode, window, tmp_path)
    print(f"{client} {mode} {window}: {out}")
    assert out.refused == 0, str(out)  # never "context is full" of the proxy's own
    # the client's own default output reserve is in force, as users run it (Claude Code: 32,000 on
    # Sonnet 4.6, 128,000 on Opus 5.5; opencode: 32,000), never an override such as test_clients.py's 4096
    assert out.max_tokens >= 32_000, str(out)
    if (client, mode, window) in API_REFUSES:
        assert out.errors[-1] and API_MAX_TOKENS_400 in out.errors[-1], str(out)  # the API's own words
        assert out.api_400s and all(API_MAX_TOKENS_400 in m for m in out.api_400s), str(out)
        return
    assert not any(out.errors), str(out)
    # each prompt answered as its own: before issue 62's fix, compact mode answered "done 0" to later
    # prompts at 40k and "LOST" at 100k (Claude Code), "done 0, done 0, done 2" (opencode at 100k)
    assert out.answers == [f"done {k}" for k in range(len(out.answers))], str(out)


@pytest.mark.parametrize("window", ["small", "middle"])
def test_claude_code_on_its_own_model_gets_every_prompt_answered_in_compact_mode(tmp_path: Path,
                                                                               window: str) -> None:
    """Claude Code as most users run it: no ``--model``, so the model it picks (Opus) with its own
    output reserve, 128,000 tokens, more than the window itself. The API's 400 ("input length and
    `max_tokens` exceed context limit") reaches it, it lowers max_tokens, and every prompt is
    answered as its own through compact mode, with no refusal of the proxy's own."""
    if not BIN["claude-code"].exists():
        pytest.skip(f"claude-code is not installed at {BIN['claude-code']} (.ci/run installs it)")
    out = _converse("claude-code-own-model", "compact", window, tmp_path)
    print(f"claude-code own model compact {window}: {out}")
    assert out.refused == 0 and not any(out.errors), str(out)
    assert out.max_tokens >= 128_000, str(out)  # the CLI's own default reserve, as users run it
    assert out.answers == [f"done {k}" for k in range(WORK[window][0])], str(out)


@pytest.mark.parametrize("mode", ["observe", "compact"])
def test_claude_code_compacts_itself_where_the_prefix_fills_the_window(tmp_path: Path, mode: ProxyMode) -> None:
    """A first prompt with a long paste, at 40k: the immutable prefix (Claude Code's system prompt
    and tools, and that prompt) is most of the window, so no compaction of ours makes room for the
    work after it. Direct, Claude Code compacts the conversation itself on the API's "prompt is too
    long" and goes on. Through compact mode it got the proxy's "context is full" instead, never
    compacted, and exited 1 at the first prompt ("automatic compaction failed: API Error: 400
    context is full", 6 refusals). Now a prompt that fits by our estimate goes to the API, and a
    refusal of ours starts with the API's words and numbers: it goes on as it does direct (here,
    observe mode), and the later prompts are answered as their own. The first answer is what
    Claude Code prints once it has compacted mid-prompt (its summary, in this scripted model), the
    same in both modes."""
    if not BIN["claude-code"].exists():
        pytest.skip(f"claude-code is not installed at {BIN['claude-code']} (.ci/run installs it)")
    out = _converse("claude-code-pasting", mode, "small", tmp_path)
    print(f"claude-code pasting {mode} small: {out}")
    assert not any(out.errors), str(out)
    assert out.answers[1:] == ["done 1", "done 2"] and out.lost == 0, str(out)
    assert out.api_400s, str(out)  # the window was reached: the API said so, and Claude Code acted on it


@pytest.mark.parametrize("mode", ["observe", "compact"])
def test_claude_code_thinking_at_a_small_window_gets_every_prompt_answered(tmp_path: Path, mode: ProxyMode) -> None:
    """Claude Code on the model it picks, thinking on as it sends it, and the model thinking 2,000
    tokens before each answer, at 40k: in compact mode the thinking an edit invalidates goes as
    the binding rules allow, and every prompt is answered as its own, as through observe mode."""
    if not BIN["claude-code"].exists():
        pytest.skip(f"claude-code is not installed at {BIN['claude-code']} (.ci/run installs it)")
    out = _converse("claude-code-own-model", mode, "small", tmp_path, think=2_000)
    print(f"claude-code own model thinking {mode} small: {out}")
    assert out.thought >= WORK["small"][0] * WORK["small"][1], str(out)  # it did think, turn after turn
    assert out.refused == 0 and not any(out.errors), str(out)
    assert out.answers == [f"done {k}" for k in range(WORK["small"][0])], str(out)
