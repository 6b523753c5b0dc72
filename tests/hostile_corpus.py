"""A seeded corpus of hostile Messages API request bodies: every path of four valid bases given a
wrong value or removed, and targeted mutations (bad enums, markers, content, roles, pairing,
``model`` and ``max_tokens`` variants...). `generate()` returns about 900 cases, the same for a
seed on every machine; the four valid bases come first.

Used by tests/adapters/test_passthrough.py, which sends each to the emulator directly and
through the proxy in both modes: what compact mode does not edit must get the API's own answer.
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Iterator
from typing import Any

MODEL = "claude-sonnet-4-6"

RICH: dict[str, Any] = {
    "model": MODEL, "max_tokens": 2048, "stream": False, "temperature": 0.5, "top_p": 0.9, "top_k": 5,
    "stop_sequences": ["STOP"], "metadata": {"user_id": "u-1"}, "service_tier": "auto",
    "system": [{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
    "tools": [{"name": "bash", "description": "Run a command.", "cache_control": {"type": "ephemeral", "ttl": "1h"},
               "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}],
    "tool_choice": {"type": "auto", "disable_parallel_tool_use": False},
    "thinking": {"type": "enabled", "budget_tokens": 1024},
    "output_config": {"effort": "high"},
    "diagnostics": {"previous_message_id": None},
    "context_management": {"edits": [{
        "type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens", "value": 100_000},
        "keep": {"type": "tool_uses", "value": 1}, "clear_at_least": {"type": "input_tokens", "value": 0},
        "exclude_tools": ["bash"], "clear_tool_inputs": False}]},
    "messages": [
        {"role": "user", "content": [
            {"type": "text", "text": "Look at this.", "citations": None},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
            {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "a document"},
             "title": "notes"}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "I will list files.", "signature": "c2lnbmF0dXJl"},
            {"type": "text", "text": "Listing."},
            {"type": "tool_use", "id": "toolu_01", "name": "bash", "input": {"command": "ls"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_01", "is_error": False,
             "cache_control": {"type": "ephemeral", "ttl": "5m"},
             "content": [{"type": "text", "text": "a.py"}, {"type": "tool_reference", "tool_name": "bash"}]},
            {"type": "text", "text": "Go on."}]},
    ],
}

SIMPLE: dict[str, Any] = {
    "model": "claude-haiku-4-5", "max_tokens": 64, "system": "Be brief.",
    "messages": [{"role": "user", "content": "Hello there."}],
}

TOOL_LOOP: dict[str, Any] = {
    "model": MODEL, "max_tokens": 512, "stream": True,
    "system": [{"type": "text", "text": "You are a coding agent."},
               {"type": "text", "text": "Use tools.", "cache_control": {"type": "ephemeral"}}],
    "tools": [
        {"name": "read", "description": "Read a file.",
         "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}},
        {"name": "grep", "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}}},
    ],
    "tool_choice": {"type": "any"},
    "messages": [
        {"role": "user", "content": "Find the bug."},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Reading two files."},
            {"type": "tool_use", "id": "toolu_a1", "name": "read", "input": {"path": "a.py"}},
            {"type": "tool_use", "id": "toolu_a2", "name": "grep", "input": {"q": "def"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_a1", "content": "print(1)"},
            {"type": "tool_result", "tool_use_id": "toolu_a2", "content": [{"type": "text", "text": "def f():"}],
             "is_error": False}]},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_a3", "name": "read", "input": {"path": "b.py"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_a3", "content": "x = 1",
             "cache_control": {"type": "ephemeral", "ttl": "5m"}}]},
    ],
}

THINKING: dict[str, Any] = {
    "model": "claude-opus-4-5", "max_tokens": 4096, "cache_control": {"type": "ephemeral"},
    "thinking": {"type": "adaptive"}, "metadata": {"user_id": None},
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Plan it."}]},
        {"role": "assistant", "content": [
            {"type": "redacted_thinking", "data": "ZW5jcnlwdGVk"},
            {"type": "text", "text": "Here is a plan."}]},
        {"role": "user", "content": [{"type": "text", "text": "Now do step one."}]},
    ],
}

BASES = {"rich": RICH, "simple": SIMPLE, "tool_loop": TOOL_LOOP, "thinking": THINKING}
WRONG: tuple[Any, ...] = (None, 0, -1, 2.5, True, False, "", "x", [], [1], {}, {"a": 1})


def _paths(value: Any, at: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield at
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*at, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, (*at, i))


def _set(body: Any, path: tuple[Any, ...], new: Any = None, delete: bool = False) -> Any:
    body = copy.deepcopy(body)
    parent = body
    for key in path[:-1]:
        parent = parent[key]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = new
    return body


def _name(path: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in path)


def walk(rng: random.Random, per_path: int) -> Iterator[tuple[str, str, str, Any]]:
    """Every path of every base: ``per_path`` wrong values (seeded sample) and, for a key, removal."""
    for bname, base in BASES.items():
        for path in _paths(base):
            if not path:
                continue
            for new in rng.sample(WRONG, per_path):
                yield bname, f"{_name(path)}={json.dumps(new)}", "walk", _set(base, path, new)
            if isinstance(path[-1], str):
                yield bname, f"{_name(path)} removed", "walk", _set(base, path, delete=True)


def targeted() -> Iterator[tuple[str, str, str, Any]]:
    R, S, T, H = RICH, SIMPLE, TOOL_LOOP, THINKING

    def m(base: dict[str, Any], name: str, kind: str, fn: Any) -> tuple[str, str, str, Any]:
        b = copy.deepcopy(base)
        fn(b)  # mutates b in place (its return value is ignored)
        bname = next(k for k, v in BASES.items() if v is base)
        return bname, name, kind, b

    # model
    for v in (None, 5, 4.5, True, [], {}, ["claude-sonnet-4-6"], {"id": MODEL}, "", "nope", "claude-unknown-9"):
        for base in (S, T):
            yield m(base, f"model={json.dumps(v)}", "model", lambda b, v=v: b.__setitem__("model", v))
    yield m(S, "model removed", "model", lambda b: b.pop("model"))
    # max_tokens
    for v in (None, 0, -1, 1, 10**9, 2**63, "64", 64.0, 64.5, True, False, [], {}):
        for base in (S, R, T):
            yield m(base, f"max_tokens={json.dumps(v)}", "max_tokens", lambda b, v=v: b.__setitem__("max_tokens", v))
    for base in (S, R, T):
        yield m(base, "max_tokens removed", "max_tokens", lambda b: b.pop("max_tokens"))
    # sampling params
    for k, vs in (("temperature", (-0.1, 1.5, "0.5", None, True)), ("top_p", (2, -1, "x", None)),
                  ("top_k", (-1, 1.5, "5", None)), ("stream", ("yes", 1, None, 0)),
                  ("stop_sequences", ([""], [" "], "STOP", [1], None, [])),
                  ("metadata", ({"user_id": 5}, "u", [], None, {"user_id": None}, {"other": 1})),
                  ("service_tier", ("bogus", 5, None)), ("output_config", ("high", [], None, {"effort": "x"})),
                  ("diagnostics", ({"previous_message_id": 5}, "x", None)),
                  ("context_management", ({"edits": "x"}, {"edits": [5]}, {"edits": [{"type": 1}]}, "x", None)),
                  ("container", (5, None, "c1")), ("mcp_servers", ("x", None)), ("unknown_param", (1, None))):
        for v in vs:
            yield m(S, f"{k}={json.dumps(v)}", "params", lambda b, k=k, v=v: b.__setitem__(k, v))
    # tools
    for v in (False, True, 0, 1, "", "bash", {}, {"name": "x"}, [], None, [None], [5], ["x"], [{}]):
        for base in (S, T):
            yield m(base, f"tools={json.dumps(v)}", "tools", lambda b, v=v: b.__setitem__("tools", v))
    yield m(T, "tools: duplicate names", "tools", lambda b: b["tools"].append(copy.deepcopy(b["tools"][0])))
    yield m(T, "tools[0].name='bad name!'", "tools", lambda b: b["tools"][0].__setitem__("name", "bad name!"))
    yield m(T, "tools[0].name=''", "tools", lambda b: b["tools"][0].__setitem__("name", ""))
    yield m(T, "tools[0].name='a'*200", "tools", lambda b: b["tools"][0].__setitem__("name", "a" * 200))
    yield m(T, "tools[0] no input_schema", "tools", lambda b: b["tools"][0].pop("input_schema"))
    yield m(T, "tools[0].type='custom' no schema", "tools",
            lambda b: b["tools"][0].update(type="custom") or b["tools"][0].pop("input_schema"))
    yield m(T, "tools[0].description=5", "tools", lambda b: b["tools"][0].__setitem__("description", 5))
    yield m(T, "tools: server tool", "tools",
            lambda b: b["tools"].append({"type": "web_search_20250305", "name": "web_search"}))
    # tool_choice
    for v in ({"type": "bogus"}, {"type": "tool"}, {"type": "tool", "name": "nope"}, {"type": "tool", "name": "read"},
              "auto", [], {}, {"type": "none"}, {"type": "auto", "disable_parallel_tool_use": "x"}, None):
        yield m(T, f"tool_choice={json.dumps(v)}", "tool_choice", lambda b, v=v: b.__setitem__("tool_choice", v))
    yield m(S, "tool_choice tool w/o tools", "tool_choice",
            lambda b: b.__setitem__("tool_choice", {"type": "tool", "name": "read"}))
    # thinking
    for v in ({"type": "bogus"}, {"type": "enabled"}, {"type": "enabled", "budget_tokens": 100},
              {"type": "enabled", "budget_tokens": 5000}, {"type": "enabled", "budget_tokens": "2000"},
              {"type": "disabled"}, {"type": "adaptive"}, "enabled", True, [], {}, None,
              {"type": "adaptive", "display": "x"}):
        for base in (R, H):
            yield m(base, f"thinking={json.dumps(v)}", "thinking", lambda b, v=v: b.__setitem__("thinking", v))
    # system
    for v in ("", [], [{"type": "text", "text": ""}], [{"type": "image"}], [{"type": "text"}], ["x"], 5, {},
              {"type": "text", "text": "x"}, [{"type": "text", "text": "x", "cache_control": {"type": "bogus"}}],
              [{"type": "text", "text": "x", "extra_field": 1}], None):
        for base in (S, T):
            yield m(base, f"system={json.dumps(v)}", "system", lambda b, v=v: b.__setitem__("system", v))
    # cache_control
    bad_cc = ({"type": "persistent"}, {"type": "ephemeral", "ttl": "2h"}, {"type": "ephemeral", "ttl": 300},
              {"type": "ephemeral", "ttl": None}, {}, "ephemeral", True, [], {"ttl": "5m"},
              {"type": "ephemeral", "ttl": "1h", "x": 1})
    for cc in bad_cc:
        yield m(T, f"system[1].cache_control={json.dumps(cc)}", "cache_control",
                lambda b, cc=cc: b["system"][1].__setitem__("cache_control", cc))
        yield m(R, f"tools[0].cache_control={json.dumps(cc)}", "cache_control",
                lambda b, cc=cc: b["tools"][0].__setitem__("cache_control", cc))
        yield m(R, f"messages[0].content[0].cache_control={json.dumps(cc)}", "cache_control",
                lambda b, cc=cc: b["messages"][0]["content"][0].__setitem__("cache_control", cc))
        yield m(H, f"top-level cache_control={json.dumps(cc)}", "cache_control",
                lambda b, cc=cc: b.__setitem__("cache_control", cc))
        yield m(R, f"tool_result inner text cache_control={json.dumps(cc)}", "cache_control",
                lambda b, cc=cc: b["messages"][2]["content"][0]["content"][0].__setitem__("cache_control", cc))
    yield m(R, "cache_control on thinking block", "cache_control",
            lambda b: b["messages"][1]["content"][0].__setitem__("cache_control", {"type": "ephemeral"}))
    yield m(H, "cache_control on redacted_thinking", "cache_control",
            lambda b: b["messages"][1]["content"][0].__setitem__("cache_control", {"type": "ephemeral"}))
    yield m(R, "5 breakpoints", "cache_control", lambda b: [x.__setitem__("cache_control", {"type": "ephemeral"})
                                                          for x in b["messages"][0]["content"]])
    yield m(T, "5 breakpoints in old messages", "cache_control",
            lambda b: [x.__setitem__("cache_control", {"type": "ephemeral"}) for x in b["messages"][1]["content"]]
            and b["messages"][0].__setitem__("content", [{"type": "text", "text": "Find the bug.",
                                                          "cache_control": {"type": "ephemeral"}}]))
    yield m(R, "1h after 5m", "cache_control",
            lambda b: b["messages"][2]["content"][1].__setitem__("cache_control", {"type": "ephemeral", "ttl": "1h"}))
    yield m(T, "1h after 5m (system then message)", "cache_control",
            lambda b: b["messages"][4]["content"][0].__setitem__("cache_control", {"type": "ephemeral", "ttl": "1h"}))
    yield m(H, "top-level cc + 4 block markers", "cache_control",
            lambda b: [b["messages"][i]["content"][-1].__setitem__("cache_control", {"type": "ephemeral"})
                       for i in range(3)] and b.__setitem__("system", [
                {"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}}]))
    yield m(T, "cache_control on a bad-cc deep old message", "cache_control",
            lambda b: b["messages"][1]["content"][0].__setitem__("cache_control", {"type": "bogus"}))
    # content: empty / wrong
    for v in ("", [], None, 5, {}, {"type": "text", "text": "x"}, [""], ["x"], [None], [[]]):
        yield m(S, f"messages[0].content={json.dumps(v)}", "content",
                lambda b, v=v: b["messages"][0].__setitem__("content", v))
        yield m(T, f"messages[2].content={json.dumps(v)}", "content",
                lambda b, v=v: b["messages"][2].__setitem__("content", v))
        yield m(H, f"messages[1].content={json.dumps(v)}", "content",
                lambda b, v=v: b["messages"][1].__setitem__("content", v))
    yield m(S, "messages[0] no content", "content", lambda b: b["messages"][0].pop("content"))
    yield m(H, "empty text block", "content", lambda b: b["messages"][2]["content"][0].__setitem__("text", ""))
    yield m(H, "whitespace text block", "content", lambda b: b["messages"][2]["content"][0].__setitem__("text", " "))
    yield m(T, "tool_result content ''", "content",
            lambda b: b["messages"][2]["content"][0].__setitem__("content", ""))
    yield m(T, "tool_result content []", "content",
            lambda b: b["messages"][2]["content"][0].__setitem__("content", []))
    yield m(T, "tool_result content None", "content",
            lambda b: b["messages"][2]["content"][0].__setitem__("content", None))
    yield m(T, "tool_result content 5", "content",
            lambda b: b["messages"][2]["content"][0].__setitem__("content", 5))
    yield m(T, "tool_result content [tool_use]", "content",
            lambda b: b["messages"][2]["content"][0].__setitem__("content", [
                {"type": "tool_use", "id": "toolu_x", "name": "read", "input": {}}]))
    yield m(T, "tool_result is_error='no'", "content",
            lambda b: b["messages"][2]["content"][1].__setitem__("is_error", "no"))
    yield m(T, "tool_use input=[]", "content", lambda b: b["messages"][1]["content"][1].__setitem__("input", []))
    yield m(T, "tool_use input='x'", "content", lambda b: b["messages"][1]["content"][1].__setitem__("input", "x"))
    yield m(T, "tool_use name=''", "content", lambda b: b["messages"][1]["content"][1].__setitem__("name", ""))
    yield m(T, "tool_use name=5", "content", lambda b: b["messages"][1]["content"][1].__setitem__("name", 5))
    yield m(R, "image bad base64", "content",
            lambda b: b["messages"][0]["content"][1]["source"].__setitem__("data", "!!!"))
    yield m(R, "image bad media_type", "content",
            lambda b: b["messages"][0]["content"][1]["source"].__setitem__("media_type", "image/bmp"))
    yield m(R, "image no source", "content", lambda b: b["messages"][0]["content"][1].pop("source"))
    yield m(R, "image in assistant", "content", lambda b: b["messages"][1]["content"].insert(
        1, copy.deepcopy(R["messages"][0]["content"][1])))
    yield m(R, "url image source w/o url", "content",
            lambda b: b["messages"][0]["content"][1].__setitem__("source", {"type": "url"}))
    yield m(R, "thinking.thinking=5", "content", lambda b: b["messages"][1]["content"][0].__setitem__("thinking", 5))
    yield m(R, "thinking.signature=5", "content",
            lambda b: b["messages"][1]["content"][0].__setitem__("signature", 5))
    yield m(R, "thinking in user message", "content", lambda b: b["messages"][0]["content"].append(
        {"type": "thinking", "thinking": "x", "signature": "c2ln"}))
    yield m(H, "redacted_thinking.data=5", "content", lambda b: b["messages"][1]["content"][0].__setitem__("data", 5))
    yield m(H, "redacted_thinking no data", "content", lambda b: b["messages"][1]["content"][0].pop("data"))
    yield m(R, "text.citations='x'", "content", lambda b: b["messages"][0]["content"][0].__setitem__("citations", "x"))
    yield m(R, "tool_reference no tool_name", "content",
            lambda b: b["messages"][2]["content"][0]["content"][1].pop("tool_name"))
    # unknown block types
    for t in ("x", "bogus_block", "", 5, None, "TEXT", "web_search_tool_result", "server_tool_use", "search_result",
              "compaction", "container_upload"):
        yield m(S, f"block type={json.dumps(t)} in user", "block_type",
                lambda b, t=t: b["messages"].__setitem__(0, {"role": "user", "content": [
                    {"type": "text", "text": "hi"}, {"type": t, "text": "y"}]}))
        yield m(H, f"block type={json.dumps(t)} in assistant", "block_type",
                lambda b, t=t: b["messages"][1]["content"].append({"type": t, "text": "y"}))
    yield m(S, "block without type", "block_type",
            lambda b: b["messages"].__setitem__(0, {"role": "user", "content": [{"text": "hi"}]}))
    # roles
    for r in ("assistant", "system", "x", "", None, 5, "USER", "tool"):
        yield m(S, f"messages[0].role={json.dumps(r)}", "role", lambda b, r=r: b["messages"][0].__setitem__("role", r))
        yield m(H, f"messages[1].role={json.dumps(r)}", "role", lambda b, r=r: b["messages"][1].__setitem__("role", r))
    yield m(S, "messages[0] no role", "role", lambda b: b["messages"][0].pop("role"))
    yield m(H, "two user turns in a row", "role", lambda b: b["messages"].pop(1))
    yield m(H, "ends with assistant (prefill)", "role", lambda b: b["messages"].pop())
    yield m(H, "system role mid-conversation", "role",
            lambda b: b["messages"].insert(2, {"role": "system", "content": "note"}))
    yield m(H, "system role mid-conversation with image", "role",
            lambda b: b["messages"].insert(2, {"role": "system", "content": [
                copy.deepcopy(R["messages"][0]["content"][1])]}))
    yield m(T, "tool_result in assistant", "role", lambda b: b["messages"][3]["content"].append(
        {"type": "tool_result", "tool_use_id": "toolu_a1", "content": "x"}))
    yield m(T, "tool_use in user", "role", lambda b: b["messages"][0].__setitem__("content", [
        {"type": "tool_use", "id": "toolu_u", "name": "read", "input": {}}]))
    yield m(S, "message extra field", "role", lambda b: b["messages"][0].__setitem__("name", "bob"))
    # messages container
    for v in ([], None, {}, "x", 5, [None], [5], ["hi"], [[]]):
        yield m(S, f"messages={json.dumps(v)}", "messages", lambda b, v=v: b.__setitem__("messages", v))
    yield m(S, "messages removed", "messages", lambda b: b.pop("messages"))
    # tool pairing
    yield m(T, "missing tool_result", "pairing", lambda b: b["messages"][2]["content"].pop(1))
    yield m(T, "stray tool_result", "pairing", lambda b: b["messages"][2]["content"].append(
        {"type": "tool_result", "tool_use_id": "toolu_zz", "content": "x"}))
    yield m(T, "duplicate tool_result", "pairing", lambda b: b["messages"][2]["content"].append(
        copy.deepcopy(b["messages"][2]["content"][0])))
    yield m(T, "duplicate tool_use id in one message", "pairing",
            lambda b: b["messages"][1]["content"][2].__setitem__("id", "toolu_a1"))
    yield m(T, "duplicate tool_use id across messages", "pairing",
            lambda b: (b["messages"][3]["content"][0].__setitem__("id", "toolu_a1"),
                       b["messages"][4]["content"][0].__setitem__("tool_use_id", "toolu_a1")) )
    yield m(T, "tool_result answers two turns back", "pairing",
            lambda b: b["messages"][4]["content"].append({"type": "tool_result", "tool_use_id": "toolu_a1",
                                                          "content": "x"}))
    yield m(T, "tool_use not answered (text reply)", "pairing",
            lambda b: b["messages"].__setitem__(2, {"role": "user", "content": "no results"}))
    yield m(T, "tool_use id bad chars", "pairing",
            lambda b: (b["messages"][3]["content"][0].__setitem__("id", "toolu a3!"),
                       b["messages"][4]["content"][0].__setitem__("tool_use_id", "toolu a3!")) )
    yield m(T, "tool_use id ''", "pairing",
            lambda b: (b["messages"][3]["content"][0].__setitem__("id", ""),
                       b["messages"][4]["content"][0].__setitem__("tool_use_id", "")) )
    yield m(T, "tool_result tool_use_id=5", "pairing",
            lambda b: b["messages"][4]["content"][0].__setitem__("tool_use_id", 5))
    yield m(T, "trailing assistant tool_use (allowed)", "pairing", lambda b: b["messages"].pop())
    yield m(T, "tool_result after text in user", "pairing",
            lambda b: b["messages"][2]["content"].insert(0, {"type": "text", "text": "results:"}))
    # top level not an object / odd JSON
    for v in ([], "x", 5, None, [SIMPLE]):
        yield "simple", f"body={json.dumps(v)[:40]}", "top", v
    yield m(S, "duplicate-ish: model and Model", "top", lambda b: b.__setitem__("Model", "x"))


def generate(seed: int = 20240611, per_path: int = 2, total: int = 900) -> list[dict[str, Any]]:
    """Every targeted mutation, then walk cases (a seeded sample, in walk order) up to ``total``."""
    rng = random.Random(seed)
    tgt = list(targeted())
    wk = list(walk(rng, per_path))
    keep = sorted(rng.sample(range(len(wk)), min(len(wk), max(0, total - len(tgt) + 40))))  # +40: dedup slack
    out = []
    seen: set[str] = set()
    for bname, name, kind, body in [*tgt, *(wk[i] for i in keep)]:
        if len(out) >= total:
            break
        key = json.dumps(body, sort_keys=True)
        if key in seen:  # identical bodies from different mutations: keep the first
            continue
        seen.add(key)
        out.append({"name": f"{bname}: {name}", "base": bname, "kind": kind, "body": body})
    return out
