"""The dashboard's sentences (issue 62: "1 requests", and a sentence cut at "drop a tool-loop
turn's"): the shipped app.js run in Node on what the dashboard's API answered for a real session.
The page's own `document` is a stand-in with nothing but `addEventListener`, so the script loads
outside a browser; the browser test (tests/adapters/test_clients.py) needs Chromium."""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import Any

import anthropic
import httpx2
import pytest

from cachecompact.adapters.proxy import Proxy, ProxyConfig
from cachecompact.adapters.proxy._dashboard import static_file
from cachecompact.tools.emulator import Emulator

_RUN = """
const vm = require("vm");
const ctx = { document: { addEventListener() {} } };
vm.createContext(ctx);
vm.runInContext(require("fs").readFileSync(0, "utf8"), ctx);
const arg = JSON.parse(process.argv[1]);
process.stdout.write(JSON.stringify(vm.runInContext(arg.call, Object.assign(ctx, { arg: arg.value }))));
"""


def _js(call: str, value: Any = None) -> Any:
    """``call`` evaluated in app.js's scope, ``arg`` bound to ``value``."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    out = subprocess.run([node, "-e", _RUN, json.dumps({"call": call, "value": value})], input=static_file("app.js"),
                         capture_output=True, timeout=60, check=True)
    return json.loads(out.stdout)


def test_the_session_sentence_counts_in_the_right_number_and_ends_whole() -> None:
    with Emulator() as emu, Proxy(ProxyConfig(upstream=emu.url, port=0)) as px:
        c = anthropic.Anthropic(base_url=px.url, api_key="k", max_retries=0)
        c.messages.create(model="claude-sonnet-4-6", max_tokens=10, messages=[{"role": "user", "content": "hi"}],
                          extra_headers={"x-cachecompact-session": "one"})
        px.wait_idle()
        s = httpx2.get(f"{px.url}/api/sessions/one").json()["session"]
    assert s["requests"] == 1
    said = _js("sessionSummary(arg)", s)
    assert "claude-sonnet-4-6: 1 request over" in said and "requests" not in said
    # a session whose edits invalidated thinking: the sentence ends on what the requests asked for
    said = _js("sessionSummary(arg)", {**s, "requests": 3, "thinking": {"turns": 1, "left_out_tokens": 1200,
                                                                         "drop_block_requests": 1}})
    assert ": 3 requests over" in said
    assert said.endswith("; thinking: the blocks of 1 turn invalidated by our edits, 1,200 tokens of them left out "
                         "of requests; 1 request asked the API to drop a tool-loop turn's thinking it could not "
                         "leave out"), said
    assert _js("[plural(1, 'request'), plural(2, 'request'), plural(0, 'entry', 'entries')]") == [
        "1 request", "2 requests", "0 entries"]
