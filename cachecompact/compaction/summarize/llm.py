"""Structured summaries for L3/L4: a schema, its validation, and two summarizers.

`LLMSummarizer` calls a model through the anthropic SDK in one of two ways:

* ``forced-tool``: a small model (default `DEFAULT_SUMMARY_MODEL`, ``claude-haiku-5-5``) gets the range to summarise as
  text, with ``tool_choice`` forcing the ``emit_summary`` tool;
* ``prefix-reuse``: the session's own request (same model, tools, system and messages, so its
  cached prefix is read at the cache price) with one instruction appended, answering with the
  same JSON inside ``<summary>`` tags. Changing ``tools`` or ``tool_choice`` would invalidate
  that cache, so this mode cannot force the tool; an answer that is not valid JSON falls back
  to ``forced-tool``.

``auto`` picks the cheaper of the two from their estimated cost. `ExtractiveSummarizer` builds
the same schema offline from the text. Every result is validated: a summary that is not
valid, loses the task goal, or drops an open issue of the summary it replaces is refused
(`SummaryRejected`) and never enters the ledger.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import msgspec

from ...base.errors import SummaryRejected
from ...base.headers import CLOCK_HEADER
from ...base.pricing import DEFAULT_SUMMARY_MODEL, OwnPrices, get_model, model_prices
from ...base.refs import REF_PATTERN
from ...base.values import SummaryMode
from ...base.wire import ToolResultBlock, block_from_dict, canonical_bytes, result_text
from .api_compaction import (
    COMPACTION_BETA,
    OnDemandCall,
    OnDemandResult,
    Verbatim,
    call_ondemand,
    opens_with_compaction,
    with_beta,
)
from .extractive import GOAL_WORDS, block_texts, summary_facts

__all__ = [
    "EMIT_SUMMARY_TOOL",
    "LATEST_REQUEST_HEADER",
    "STORED_HEADER",
    "SUMMARY_MARKER",
    "ExtractiveSummarizer",
    "FileRef",
    "LLMSummarizer",
    "PricedSummarizer",
    "Summarizer",
    "Summary",
    "SummaryRejected",
    "SummaryRequest",
    "SummaryResult",
    "check_summary",
    "format_summary",
    "open_issues_of",
    "parse_summary",
    "stored_outputs",
]

SUMMARY_MARKER = "<cachecompact:summarize>"
# the heading of the person's newest request in a summary's text, word for word after it
LATEST_REQUEST_HEADER = "Latest request (the person's words, verbatim):"

SUMMARY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "task_goal": {"type": "string", "description": "The user's original goal, repeated verbatim (its first "
                                                       f"{GOAL_WORDS} words when it is longer)."},
        "latest_request": {"type": "string", "description": "The person's newest request, when the conversation "
                                                            "holds one after the goal, repeated verbatim."},
        "completed_steps": {"type": "array", "items": {"type": "string"}},
        "key_findings": {"type": "array", "items": {"type": "string"}},
        "open_issues": {"type": "array", "items": {"type": "string"},
                        "description": "Everything not resolved yet, including open issues of earlier summaries."},
        "file_refs": {"type": "array", "items": {"type": "object", "properties": {
            "path": {"type": "string"}, "relevance": {"type": "string"}}, "required": ["path"]}},
        "discarded": {"type": "string", "description": "What was dropped as no longer useful, in one sentence."},
    },
    "required": ["task_goal", "completed_steps", "key_findings", "open_issues"],
}
EMIT_SUMMARY_TOOL: dict[str, Any] = {
    "name": "emit_summary",
    "description": "Emit the structured summary of the conversation range you were asked to compact.",
    "input_schema": SUMMARY_SCHEMA,
}


class FileRef(msgspec.Struct, frozen=True):
    path: str
    relevance: str = ""


class Summary(msgspec.Struct, frozen=True):
    task_goal: str
    completed_steps: list[str]
    key_findings: list[str]
    open_issues: list[str]
    file_refs: list[FileRef] = []
    discarded: str | list[str] = ""
    # the person's newest request after the goal, word for word: what the agent works on now
    # (`summarize_range` puts the transcript's own words here, whatever the summarizer wrote)
    latest_request: str = ""


@dataclass(slots=True)
class SummaryRequest:
    """What to summarise. ``messages`` is the rendered view of the range (plain dicts);
    ``latest_request``: the person's newest request when the range covers it (kept verbatim)."""

    messages: list[dict[str, Any]]
    goal: str
    previous_open_issues: list[str] = field(default_factory=list)
    range: tuple[int, int] = (0, 0)
    body: dict[str, Any] | None = None  # the session's current request, for prefix reuse
    cache_warm: bool = False
    at: float | None = None  # when the compaction runs (the session's clock; simulated in replays and tests)
    latest_request: str = ""


@dataclass(slots=True)
class SummaryResult:
    summary: Summary
    cost_usd: float = 0.0
    usage: dict[str, Any] = field(default_factory=dict)
    mode: SummaryMode = "extractive"
    duration_s: float = 0.0


@runtime_checkable
class Summarizer(Protocol):
    def summarize(self, req: SummaryRequest) -> SummaryResult: ...


@runtime_checkable
class PricedSummarizer(Summarizer, Protocol):
    """A summarizer that can say what a summary will cost before making it: what idle compaction
    weighs (`compaction.idle`). One that cannot is never used for it."""

    def estimate_usd(self, req: SummaryRequest) -> float: ...


# -- validation and formatting -------------------------------------------------------------------

def parse_summary(obj: Any) -> Summary:
    """A `Summary` from a tool input dict or a JSON string; garbage raises `SummaryRejected`."""
    if isinstance(obj, str):
        try:
            obj = json.loads(obj)
        except json.JSONDecodeError as err:
            raise SummaryRejected(f"summary is not JSON: {err}") from None
    try:
        s = msgspec.convert(obj, Summary)
    except msgspec.ValidationError as err:
        raise SummaryRejected(f"summary does not match the schema: {err}") from None
    if not s.task_goal.strip():
        raise SummaryRejected("summary has an empty task_goal")
    return s


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def _covered(needle: str, hay: str, share: float) -> bool:
    need = _words(needle)
    if not need:
        return True
    have = set(_words(hay))
    return sum(1 for w in need if w in have) / len(need) >= share


def check_summary(s: Summary, goal: str, previous_open_issues: Sequence[str] = ()) -> None:
    """Refuse a summary that lost the task goal (90% of its first 300 words must be in
    ``task_goal``) or an open issue of the summary it replaces (60% of the issue's words in one
    open issue, completed step or finding)."""
    if goal.strip() and not _covered(" ".join(_words(goal)[:GOAL_WORDS]), s.task_goal, 0.9):
        raise SummaryRejected("summary lost the task goal")
    pool = [*s.open_issues, *s.completed_steps, *s.key_findings]
    for issue in previous_open_issues:
        if not any(_covered(issue, p, 0.6) for p in pool):
            raise SummaryRejected(f"summary dropped the open issue {issue[:80]!r}")


def format_summary(s: Summary) -> str:
    """Deterministic text for the ledger and the rendered summary message."""
    def bullets(items: Sequence[str]) -> str:
        return "\n".join(f"- {x}" for x in items) if items else "- (none)"

    parts = [f"Goal: {s.task_goal}", "Completed:\n" + bullets(s.completed_steps),
             "Key findings:\n" + bullets(s.key_findings), "Open issues:\n" + bullets(s.open_issues)]
    if s.file_refs:
        parts.append("Files:\n" + bullets([f"{f.path}" + (f" ({f.relevance})" if f.relevance else "")
                                           for f in s.file_refs]))
    discarded = "; ".join(s.discarded) if isinstance(s.discarded, list) else s.discarded
    if discarded:
        parts.append(f"Discarded: {discarded}")
    if s.latest_request:  # last, as it came last: the request the work goes on with
        parts.append(f"{LATEST_REQUEST_HEADER}\n{s.latest_request}")
    return "\n".join(parts)


STORED_HEADER = "Stored outputs (read_scratchpad):"
MAX_STORED = 12  # the newest scratchpad references a summary carries on
_REF = re.compile(rf"\b{REF_PATTERN}\b")
_CARRIED = re.compile(rf"^- ({REF_PATTERN}): (.*)$", re.M)


def stored_outputs(messages: Sequence[dict[str, Any]]) -> list[str]:
    """The scratchpad references shown in ``messages`` (placeholders of shortened results, and
    those an earlier summary carried), each with the call that produced the output, newest last.

    A summary keeps them so the agent can still reach what was externalized; the list is
    built here, not by the summarizing model, so no reference is ever lost or made up."""
    calls: dict[str, str] = {}
    found: dict[str, str] = {}
    for m in messages:
        content = m.get("content")
        for b in content if isinstance(content, list) else [{"type": "text", "text": content or ""}]:
            if not isinstance(b, dict):
                continue
            if b.get("type") == "tool_use":
                inp = json.dumps(b.get("input", {}), sort_keys=True, ensure_ascii=False)
                calls[str(b.get("id"))] = f"{b.get('name')}({inp if len(inp) <= 160 else inp[:157] + '...'})"
            elif b.get("type") == "tool_result":
                blk = block_from_dict(b, "a summarised tool result")  # rendered, so already valid
                for ref in _REF.findall(result_text(blk) if isinstance(blk, ToolResultBlock) else ""):
                    found.pop(ref, None)
                    found[ref] = calls.get(str(b.get("tool_use_id")), "a tool result")
            elif b.get("type") == "text":
                for ref, what in _CARRIED.findall(str(b.get("text", ""))):
                    found.pop(ref, None)
                    found[ref] = what
    return [f"{ref}: {what}" for ref, what in list(found.items())[-MAX_STORED:]]


def open_issues_of(text: str) -> list[str]:
    """The open issues listed in a `format_summary` text (for the next summary's check)."""
    m = re.search(r"^Open issues:\n((?:- .*\n?)*)", text, re.M)
    if not m:
        return []
    return [x[2:].strip() for x in m.group(1).splitlines() if x.startswith("- ") and x[2:].strip() != "(none)"]


# -- extractive -------------------------------------------------------------------------------------

class ExtractiveSummarizer:
    """Offline fallback with the same schema: no model call, no cost."""

    @staticmethod
    def estimate_usd(req: SummaryRequest) -> float:
        """Nothing: no model is called."""
        return 0.0

    def summarize(self, req: SummaryRequest) -> SummaryResult:
        t0 = time.perf_counter()
        facts = summary_facts(req.messages, req.goal, req.previous_open_issues, skip_prefixes=("[cachecompact",
                                                                                               SUMMARY_MARKER))
        s = parse_summary(facts)
        check_summary(s, req.goal, req.previous_open_issues)
        return SummaryResult(s, 0.0, {}, "extractive", time.perf_counter() - t0)


# -- LLM ----------------------------------------------------------------------------------------------

def _serialize(messages: Sequence[dict[str, Any]], limit: int = 20_000) -> str:
    """The range as ``role: text`` lines for a forced-tool summary (each block cut at ``limit``
    characters, so one huge output cannot crowd out the rest)."""
    lines = []
    for m in messages:
        for _, t in block_texts(m):
            t = t if len(t) <= limit else t[:limit] + f" [... {len(t) - limit} more characters]"
            lines.append(f"{m.get('role')}: {t}")
    return "\n".join(lines)


def _instructions(req: SummaryRequest, how: str) -> str:
    prev = "\n".join(f"- {x}" for x in req.previous_open_issues) or "- (none)"
    return (f"{SUMMARY_MARKER} Compact the conversation range (messages {req.range[0]}-{req.range[1]}) into a "
            f"structured summary so the work can continue without it. {how}\n"
            f"<goal>{req.goal}</goal>\ntask_goal repeats the goal above verbatim (at most its first {GOAL_WORDS} "
            "words). Keep every open issue below "
            f"unless the conversation resolved it (then list it as a completed step):\n<open_issues>\n{prev}\n"
            "</open_issues>\nKeep exact identifiers: file paths, function names, ids, numbers, commands.")


@dataclass
class LLMSummarizer:
    """Summaries from a model through the anthropic SDK; see the module docstring for modes."""

    client: Any  # anthropic.Anthropic
    model: str = DEFAULT_SUMMARY_MODEL
    mode: SummaryMode = "auto"
    max_tokens: int = 2000
    extra_headers: dict[str, str] | None = None  # e.g. to mark the call as cachecompact's own
    prices: OwnPrices | None = None  # the wrapped client's own price entries (wrap(pricing=...))
    # the session's clock, when it is not the wall's (wrap(clock=...), a replay): each call then
    # carries its time in the clock header (`SummaryRequest.at`, else this clock's reading), so an
    # emulator on that clock bills the summary against the cache as it is at that moment
    clock: Callable[[], float] | None = None

    def summarize(self, req: SummaryRequest) -> SummaryResult:
        t0 = time.perf_counter()
        mode = self._choose(req)
        spent = 0.0
        if mode == "prefix-reuse":
            try:
                res = self._prefix_reuse(req)
                res.duration_s = time.perf_counter() - t0
                return res
            except SummaryRejected as err:
                spent = err.cost_usd  # the model answered with something else: fall back to the forced tool
        try:
            res = self._forced(req)
        except SummaryRejected as err:
            err.cost_usd += spent
            raise
        res.cost_usd += spent
        res.duration_s = time.perf_counter() - t0
        return res

    def _choose(self, req: SummaryRequest) -> str:
        if self.mode != "auto":
            return self.mode if req.body is not None or self.mode == "forced-tool" else "forced-tool"
        if req.body is None or not req.cache_warm or req.body["messages"][-1].get("role") != "user":
            return "forced-tool"  # nothing to reuse: no price needed
        costs = self._estimates(req)
        reuse = costs.get("prefix-reuse")
        return "prefix-reuse" if req.cache_warm and reuse is not None and reuse < costs["forced-tool"] \
            else "forced-tool"

    def _estimates(self, req: SummaryRequest) -> dict[str, float]:
        """Each mode's expected price in dollars ($ per MTok times tokens, by 4 characters a
        token): forced-tool reads the range at the small model's input price; prefix reuse reads the
        session's request at the cache price when it is warm, or writes it when it is not."""
        small = get_model(self.model, self.prices)
        range_tokens = sum(len(_serialize([m])) for m in req.messages) / 4
        out = {"forced-tool": range_tokens * small.input + self.max_tokens * small.output}
        if req.body is not None and req.body["messages"][-1].get("role") == "user":
            big = get_model(req.body["model"], self.prices)
            total_tokens = len(canonical_bytes(req.body["messages"])) / 4
            out["prefix-reuse"] = (total_tokens * (big.read if req.cache_warm else big.write_5m)
                                   + 300 * big.write_5m + self.max_tokens * big.output)
        return {k: v / 1e6 for k, v in out.items()}

    def estimate_usd(self, req: SummaryRequest) -> float:
        """What `summarize` is expected to cost for ``req``, in the mode it would choose."""
        costs = self._estimates(req)
        return costs.get(self._choose(req), costs["forced-tool"])

    def _headers(self, req: SummaryRequest) -> dict[str, str] | None:
        out = dict(self.extra_headers or {})
        if req.body is not None and opens_with_compaction(req.body):
            # the session's own request, opened by an API-written summary: the block needs its beta
            out["anthropic-beta"] = with_beta(out.get("anthropic-beta"), COMPACTION_BETA)
        if self.clock is not None:
            out[CLOCK_HEADER] = repr(req.at if req.at is not None else self.clock())
        return out or None

    def bind(self) -> Callable[[SummaryRequest], SummaryResult] | None:
        """This summarizer's call, for a thread of the background pool to make (the compactor
        then never holds a request for it: docs/policy.md, "Summaries in the background"); None
        without a client (nothing to wait for)."""
        return self.summarize if self.client is not None else None

    def ondemand(self) -> OnDemandCall | None:
        """An API-written summary through this client (`summarize.api_compaction`): on the
        conversation's own model, whatever ``model`` this summarizer uses for its own."""
        if self.client is None:
            return None
        client, headers, prices = self.client, dict(self.extra_headers or {}), self.prices
        headers.pop(CLOCK_HEADER, None)
        clocked = self.clock is not None

        def call(body: dict[str, Any], at: float | None, keep: Verbatim | None = None) -> OnDemandResult:
            return call_ondemand(client, body, headers=headers, at=at if clocked else None, prices=prices, keep=keep)
        return call

    def _usage_cost(self, model: str, usage: Any) -> tuple[dict[str, Any], float]:
        u = usage.model_dump() if hasattr(usage, "model_dump") else dict(usage)
        return u, model_prices(model, own=self.prices).cost(u)

    def _forced(self, req: SummaryRequest) -> SummaryResult:
        """The forced-tool form, or the in-text form for a model that refuses forced tool use
        (by the price table's ``forced_tool_ok``, or by the API's 400 saying so)."""
        import anthropic

        if not model_prices(self.model, own=self.prices).forced_tool_ok:
            return self._in_text(req)
        text = _instructions(req, "Call emit_summary.") + "\n<conversation>\n" + _serialize(req.messages) + \
            "\n</conversation>"
        try:
            resp = self.client.messages.create(
                model=self.model, max_tokens=self.max_tokens, tools=[EMIT_SUMMARY_TOOL],
                tool_choice={"type": "tool", "name": "emit_summary"}, messages=[{"role": "user", "content": text}],
                extra_headers=self._headers(req))
        except anthropic.BadRequestError as err:
            if "tool_choice" not in str(err.message):
                raise
            return self._in_text(req)
        usage, cost = self._usage_cost(self.model, resp.usage)
        block = next((b for b in resp.content if getattr(b, "type", None) == "tool_use"), None)
        try:
            if block is None:
                raise SummaryRejected("the summarizer did not call emit_summary")
            s = parse_summary(block.input)
            check_summary(s, req.goal, req.previous_open_issues)
        except SummaryRejected as err:
            err.cost_usd += cost
            raise
        return SummaryResult(s, cost, usage, "forced-tool")

    def _in_text(self, req: SummaryRequest) -> SummaryResult:
        """The range as text, the schema in the instructions, the JSON answer in <summary> tags."""
        ask = _instructions(req, "Answer with only the JSON object for the emit_summary schema "
                                 f"{json.dumps(SUMMARY_SCHEMA)} inside <summary></summary> tags; call no tool.")
        text = ask + "\n<conversation>\n" + _serialize(req.messages) + "\n</conversation>"
        resp = self.client.messages.create(model=self.model, max_tokens=self.max_tokens,
                                           messages=[{"role": "user", "content": text}],
                                           extra_headers=self._headers(req))
        usage, cost = self._usage_cost(self.model, resp.usage)
        return self._from_text(req, resp, usage, cost, "in-text")

    def _from_text(self, req: SummaryRequest, resp: Any, usage: dict[str, Any], cost: float,
                   mode: SummaryMode) -> SummaryResult:
        text = "".join(getattr(b, "text", "") for b in resp.content)
        m = re.search(r"<summary>(.*?)</summary>", text, re.S)
        try:
            if not m:
                raise SummaryRejected("no <summary> in the answer")
            s = parse_summary(m.group(1).strip())
            check_summary(s, req.goal, req.previous_open_issues)
        except SummaryRejected as err:
            err.cost_usd += cost
            raise
        return SummaryResult(s, cost, usage, mode)

    def _prefix_reuse(self, req: SummaryRequest) -> SummaryResult:
        assert req.body is not None
        body = dict(req.body)
        ask = _instructions(req, "Answer with only the JSON object for the emit_summary schema "
                                 f"{json.dumps(SUMMARY_SCHEMA)} inside <summary></summary> tags; call no tool.")
        body["messages"] = [*body["messages"], {"role": "user", "content": ask}]
        body["max_tokens"] = self.max_tokens
        body.pop("stream", None)  # the agent's request may stream; the summary is read whole
        resp = self.client.messages.create(**body, extra_headers=self._headers(req))
        usage, cost = self._usage_cost(body["model"], resp.usage)
        return self._from_text(req, resp, usage, cost, "prefix-reuse")
