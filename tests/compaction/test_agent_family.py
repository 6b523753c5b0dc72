"""A family of closed-loop agents generated from seeds (issue 47): each acts on what its request
shows, and re-reads a file when the value it needs from it is not in view.

A seed draws the agent's shape: the window (40k, 80k, 120k, or the model's own 1M), the model
(claude-opus-5-5 with adaptive thinking, or claude-sonnet-4-6 without), file sizes from 500
tokens to a quarter of what the window holds before it compacts (at most 16,000), a session
that runs 1.6-2.6 times past that point, short actions with one-word results between the reads,
calls made in parallel, a large first result, and "use" steps that need one ordinary line (an
indented body line, not a key line that compaction keeps anyway) from a file read 1 to 9 reads
back, placed in the middle of the output. A use is counted where the needed fact fits: where
the history from the needed result to the end of the request, beside the fixed prefix and a
summary, is within 60% of the window (a share fixed here, not read from the policy, so a policy
that keeps less cannot shrink what is counted); beyond it a compactor may need the room, and a
re-read is a fair answer. (Issue 63 corrected what "fits" counts: the fixed prefix is the whole
immutable prefix, the first three messages, whose first result is the large one in 40% of the
shapes, and the sizes are the model's own tokens, 1.3x cl100k on Opus 5.5; before, a use was
counted where the large first result and the history left the window no room for it.)

No parameter of cachecompact is fitted here: the seeds were split before any fix was measured,
half A (even seeds, the development half) and half B (odd seeds, held out); the bar (at most 10%
of counted uses re-read) is asserted on B, and both halves are reported. Measured at the
commit before issue 47's fixes (48ab74e): half A 17.3% (27 of 156), half B 27.4% (26 of 95);
after them: A 3.0% (5 of 164), B 9.0% (9 of 100).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import anthropic
import pytest

import cachecompact
from cachecompact.base.headers import CLOCK_HEADER
from cachecompact.base.pricing import get_model
from cachecompact.base.tokens import TokenCounter
from cachecompact.compaction.policy import PolicyConfig, limits
from cachecompact.tools.bench._recall import request_text
from cachecompact.tools.emulator import Emulator, Reply, ScriptedResponder, SummarizingResponder

TOOLS = [{"name": "read_file", "description": "Read a file.",
          "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}},
         {"name": "act", "description": "Do a short action.",
          "input_schema": {"type": "object", "properties": {"key": {"type": "string"}, "value": {"type": "string"}},
                           "required": ["key"]}}]
SYSTEM = "You are a careful coding agent. Read files and act on the exact values you read. " * 15
WORDS = ["cache", "ledger", "parser", "session", "window", "budget", "render", "token", "policy", "stream", "queue",
         "shard", "index", "lease"]
COUNTER = TokenCounter()
FITS = 0.6  # the share of the window a needed fact's history must fit in to be counted


@dataclass
class Shape:
    """What a seed draws."""

    seed: int
    window: int | None  # None: the model's own
    model: str
    files: dict[str, str]
    facts: dict[str, tuple[str, str]]  # fact -> (its line, the file it is in)
    steps: list[tuple[str, Any]]  # ("read", [paths] read in one turn), ("act", None), ("use", fact)


def _file(rng: random.Random, path: str, tokens: int, fact: str) -> str:
    lines = [f'"""{path}"""']
    n = 0
    while COUNTER.count_text("\n".join(lines)) < tokens:
        for _ in range(40):
            lines.append(f"    {rng.choice(WORDS)}_{n} = {rng.choice(WORDS)}.get({rng.randint(0, 999)})  "
                         f"# {rng.choice(WORDS)}")
            n += 1
    lines.insert(len(lines) // 2, fact)  # in the middle of the output, an ordinary indented line
    return "\n".join(lines)


def _trigger(window: int) -> int:
    """Where compaction first fires at this window (the policy's soft threshold or its cost-derived
    hard one), so a shape can run past it several times."""
    lim = limits(PolicyConfig(), window, 4096, prefix_tokens=0)
    return min(lim.soft, lim.hard)


def shape(seed: int) -> Shape:
    rng = random.Random(4700 + seed)
    window = rng.choice([40_000, 80_000, 120_000, None])
    model = rng.choice(["claude-opus-5-5", "claude-sonnet-4-6"])
    size = window or get_model(model).context_window
    cap = max(1_000, min(16_000, _trigger(size) // 4))  # files: up to a quarter of what fits before compacting
    # the session runs past the trigger, where compaction may happen (a thinking agent's tool loop defers
    # it to the forced threshold: an edit would invalidate the thinking its latest turn must keep)
    total = rng.uniform(1.6, 2.6) * _trigger(size)
    files, facts, reads = {}, {}, []
    k, tokens = 0, 0
    while tokens < total:
        path = f"src/mod_{k:02d}.py"
        first_big = k == 0 and rng.random() < 0.4  # a large first result
        n = int(rng.uniform(cap, 2 * cap) if first_big else rng.uniform(500, cap))
        value = f"{rng.getrandbits(36):09x}"
        line = f"    setting_{k} = '{value}'  # the value step {k} needs"
        files[path] = _file(rng, path, n, line)
        facts[f"F{k}"] = (line.strip(), path)
        reads.append(path)
        tokens += n
        k += 1
    steps: list[tuple[str, Any]] = []
    done: list[str] = []
    i = 0
    while i < len(reads):
        width = 2 if rng.random() < 0.2 and i + 1 < len(reads) else 1  # calls in parallel
        group = reads[i:i + width]
        steps.append(("read", group))
        done += group
        i += width
        for _ in range(rng.randint(0, 2)):
            steps.append(("act", None))  # a short action: a one-word result
        if len(done) > 1 and rng.random() < 0.9:
            back = min(len(done) - 1, rng.randint(1, 9))
            steps.append(("use", f"F{reads.index(done[-1 - back])}"))
    return Shape(seed, window, model, files, facts, steps)


@dataclass
class Agent:
    """The model: it plays the steps, and before a use it looks for the fact in its request."""

    shape: Shape
    i: int = 0
    n: int = 0
    tries: int = 0
    fits: dict[str, bool] = field(default_factory=dict)  # path -> its newest result fits (set by the runner)
    counted: int = 0  # uses whose fact fits the window
    rereads: int = 0  # those whose fact was not in view (the agent re-read the file)
    all_rereads: int = 0
    shown: int = 0  # characters of the last request's text
    compacted: bool = False  # a request showed much less than the history

    def _call(self, calls: list[tuple[str, dict[str, Any]]]) -> Reply:
        blocks: list[dict[str, Any]] = [{"type": "text", "text": "Next."}]
        for name, inp in calls:
            self.n += 1
            blocks.append({"type": "tool_use", "id": f"toolu_{self.n:05d}", "name": name, "input": inp})
        return Reply(blocks, "tool_use")

    def __call__(self, body: dict[str, Any]) -> Reply:
        self.shown = len(request_text(body))
        if self.i >= len(self.shape.steps):
            return Reply([{"type": "text", "text": "done"}])
        kind, arg = self.shape.steps[self.i]
        if kind == "read":
            self.i += 1
            return self._call([("read_file", {"path": p}) for p in arg])
        if kind == "act":
            self.i += 1
            return self._call([("act", {"key": "step"})])
        line, path = self.shape.facts[arg]
        seen = line in request_text(body)
        if self.tries == 0 and self.fits.get(path, False):
            self.counted += 1
            self.rereads += not seen
        if seen or self.tries >= 3:
            self.i += 1
            self.tries = 0
            return self._call([("act", {"key": arg, "value": line.split("'")[1]})])
        self.tries += 1
        self.all_rereads += 1
        return self._call([("read_file", {"path": path})])


def run(shape: Shape) -> Agent:
    agent = Agent(shape)
    model = get_model(shape.model)
    window = shape.window or model.context_window
    with Emulator(SummarizingResponder(ScriptedResponder(agent))) as emu:
        client = cachecompact.wrap(anthropic.Anthropic(base_url=emu.url, api_key="k", max_retries=0), store=None,
                                   summarizer=None, window_tokens=shape.window)
        hist: list[dict[str, Any]] = [{"role": "user", "content": "Audit the project and act on its settings."}]
        sizes: list[int] = [COUNTER.count_text(str(hist[0]))]
        read_at: dict[str, int] = {}
        clock = 1_800_000_000.0
        prefix = COUNTER.count_text(SYSTEM)
        ratio = model.token_ratio  # API tokens per cl100k token (Opus 5.5 counts about 1.3x)
        thinks = shape.model == "claude-opus-5-5"
        thinking: dict[str, Any] = {"thinking": {"type": "adaptive"}} if thinks else {}
        for _ in range(400):
            # what each file's newest result needs: the history from it to the end, the fixed part, a summary
            # in the model's own tokens, and beside the whole immutable prefix: the first three messages, whose
            # first result may be the large one (a fact in it is always in view)
            fixed = prefix + sum(sizes[:3])
            agent.fits = {p: (fixed + sum(sizes[max(k, 3):]) + 1500) * ratio <= FITS * window
                          for p, k in read_at.items()}
            clock += 15.0
            r = client.messages.create(model=shape.model, max_tokens=4096, system=SYSTEM, tools=TOOLS, messages=hist,
                                       extra_headers={CLOCK_HEADER: repr(clock)}, **thinking)
            agent.compacted |= agent.shown < 0.7 * len(request_text({"system": SYSTEM, "messages": hist}))
            content = [b.model_dump(exclude_none=True) for b in r.content]
            calls = [b for b in content if b.get("type") == "tool_use"]
            hist.append({"role": "assistant", "content": content})
            sizes.append(COUNTER.count_text(str(calls)))
            if not calls:
                break
            results = []
            for c in calls:
                path = c["input"].get("path")
                text = shape.files.get(path, "no such file") if c["name"] == "read_file" else "ok"
                results.append({"type": "tool_result", "tool_use_id": c["id"], "content": text})
                if c["name"] == "read_file":
                    read_at[path] = len(hist)
            hist.append({"role": "user", "content": results})
            sizes.append(sum(COUNTER.count_text(x["content"]) for x in results))
        client.close()
    assert agent.i >= len(shape.steps), f"seed {shape.seed}: the agent did not finish"
    return agent


SEEDS = range(16)


@pytest.mark.slow
def test_the_generated_agents_keep_their_facts_where_the_window_holds_them() -> None:
    rows = {seed: run(shape(seed)) for seed in SEEDS}
    for half, seeds in (("A", [s for s in SEEDS if s % 2 == 0]), ("B", [s for s in SEEDS if s % 2 == 1])):
        uses = sum(rows[s].counted for s in seeds)
        rereads = sum(rows[s].rereads for s in seeds)
        print(f"half {half}: {rereads} re-reads of facts that fit, in {uses} uses "
              f"({rereads / max(1, uses):.1%}); all re-reads {sum(rows[s].all_rereads for s in seeds)}; "
              f"compacted in {sum(rows[s].compacted for s in seeds)} of {len(seeds)} sessions")
        # the test tests something: most sessions were compacted (a thinking agent's may not be)
        assert sum(rows[s].compacted for s in seeds) >= len(seeds) // 2
    b = [s for s in SEEDS if s % 2 == 1]
    share = sum(rows[s].rereads for s in b) / max(1, sum(rows[s].counted for s in b))
    assert share <= 0.10, {s: (rows[s].rereads, rows[s].counted, shape(s).window, shape(s).model) for s in b}


def test_a_large_file_read_again_at_1m_comes_back_whole() -> None:
    """The new user's report: a ~26k-token file at a 35k context on the 1M window was shortened each
    time it was read again. Read whole the first time, it is whole on the second read too, and a
    result too big to carry through a compaction is the only one shortened on arrival."""
    rng = random.Random(47)
    big = _file(rng, "src/big.py", 26_000, "    magic = 'x'")
    assert COUNTER.count_text(big) > 25_000
    seen: list[str] = []

    def model(body: dict[str, Any]) -> Reply:
        n = sum(1 for m in body["messages"] if m["role"] == "assistant")
        seen.append(request_text(body))
        if n >= 4:
            return Reply([{"type": "text", "text": "done"}])
        return Reply([{"type": "tool_use", "id": f"toolu_{n}", "name": "read_file",
                       "input": {"path": "src/big.py" if n in (1, 3) else "src/other.py"}}], "tool_use")

    with Emulator(ScriptedResponder(model)) as emu:
        client = cachecompact.wrap(anthropic.Anthropic(base_url=emu.url, api_key="k", max_retries=0), store=None,
                                   summarizer=None)
        hist: list[dict[str, Any]] = [{"role": "user", "content": "Look at the code."}]
        for _ in range(6):
            r = client.messages.create(model="claude-opus-5-5", max_tokens=4096, tools=TOOLS, messages=hist)
            content = [b.model_dump(exclude_none=True) for b in r.content]
            hist.append({"role": "assistant", "content": content})
            calls = [b for b in content if b.get("type") == "tool_use"]
            if not calls:
                break
            hist.append({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": c["id"],
                 "content": big if c["input"]["path"] == "src/big.py" else "small file\n" * 30} for c in calls]})
    assert len(seen) >= 5 and "shortened to save context" not in seen[-1]
    assert seen[-1].count("magic = 'x'") == 2  # both reads whole
