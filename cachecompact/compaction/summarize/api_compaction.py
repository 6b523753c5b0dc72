"""API-written summaries: on-demand compaction (the top-level ``compaction`` parameter).

The docs give code that edits history two ways to keep earlier thinking usable: "let the API
write the summary", or remove the thinking in the turns it keeps (build-with-claude/preserved-
thinking; anthropic-cache-facts.md, addendum 2026-12-02). A summary the API writes keeps the kept
turns' thinking valid (build-with-claude/compaction-thinking-blocks) when

(a) the compaction request runs on the conversation's own model: the call here is made on the
    request's model, never the summary model;
(b) the kept turns follow the summarized messages unchanged, with a change of role: the ledger's
    rules for `ApiCompaction` (history/ledger.py);
(c) ``system`` and the tools are unchanged: the request here sends the conversation's own.

The request (build-with-claude/compaction-on-demand; §3.5): ``"compaction": {"type":
"summarize"}`` with the ``compact-2026-09-04`` beta, the messages to summarize (never ending in an
unanswered tool call), no ``context_management``, ``stop_sequences``, ``output_config.format`` or a
forcing ``tool_choice``. The response holds one signed ``compaction`` block with ``stop_reason``
``"compaction"``; its cost is the ``compaction`` entry of ``usage.iterations``. Anything else
(``max_tokens``, ``refusal``, an empty block, a 529 ``compaction_unavailable``) is a failure, and
the caller falls back to its own summary.

A call is *bound* in the request's thread (`OnDemandSummarizer.ondemand`: the proxy's caller key
lives in a thread-local there) and may run later in another: "compaction in the background"
(build-with-claude/compaction-background) sends it while the conversation goes on whole.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import msgspec

from ...base.errors import SummaryRejected
from ...base.headers import CLOCK_HEADER, INTERNAL_HEADER
from ...base.pricing import ONDEMAND_COMPACTION_MODELS, OwnPrices, canonical_id, model_prices
from ...history.thinking import BINDING_BETA, COMPACTION_BETA

__all__ = ["COMPACTION_BETA", "COMPACTION_MIN_OUTPUT", "OnDemandCall", "OnDemandResult", "OnDemandSummarizer",
           "Verbatim", "call_ondemand", "compaction_body", "compaction_max_tokens", "instructions_keeping",
           "kept_verbatim", "opens_with_compaction", "supports_ondemand", "with_beta"]

# what a compaction request's output may be lowered to at the least: "allow several thousand tokens"
# (build-with-claude/compaction-on-demand), for the model's thinking and the summary it writes
COMPACTION_MIN_OUTPUT = 8_192

MAX_INSTRUCTIONS = 16_384  # characters of `compaction.instructions` (build-with-claude/compaction-on-demand)
_KEEP_PROMPT = ("Write a summary of the conversation so far that lets the work go on from the summary alone, in "
                "place of the messages it stands for. Keep the person's original goal; what was done, with its "
                "results; what was found, with exact file paths, identifiers, numbers and commands; and what is still "
                "open. Do not call any tool. Write the summary inside <summary></summary> tags.")
_KEEP_GOAL = ("\nStart the summary with the person's original request, word for word, under the heading \"Original "
              "request:\". It is:\n<original_request>\n{text}\n</original_request>")
_KEEP_LATEST = ("\nEnd the summary with the person's latest request, word for word, under the heading \"Latest "
                "request:\". It is:\n<latest_request>\n{text}\n</latest_request>")

# what the compaction parameter may not be sent with (§3.5 Restrictions), dropped from the body
_REFUSED_WITH = ("context_management", "stop_sequences", "stream", "cache_control")


@dataclass(slots=True)
class OnDemandResult:
    """The block as the API returned it, and what the call cost."""

    content: str
    signature: str
    cost_usd: float = 0.0
    usage: dict[str, Any] = field(default_factory=dict)
    duration_s: float = 0.0


class OnDemandCall(Protocol):
    """A bound on-demand compaction call: the compaction request's body, the time it runs at
    (a replay's clock), and the person's words the summary must carry verbatim (`call_ondemand`)."""

    def __call__(self, body: dict[str, Any], at: float | None, keep: Verbatim | None = None) -> OnDemandResult: ...


@runtime_checkable
class OnDemandSummarizer(Protocol):
    """A summarizer that can also have the API write the summary: ``ondemand()`` binds a call
    (credentials, headers) in the request's thread, or returns None when it cannot (offline,
    no credentials)."""

    def ondemand(self) -> OnDemandCall | None: ...


def supports_ondemand(model: str) -> bool:
    """Whether the model is on the on-demand compaction page's list (`ONDEMAND_COMPACTION_MODELS`)."""
    return canonical_id(model) in ONDEMAND_COMPACTION_MODELS


def opens_with_compaction(body: Mapping[str, Any]) -> bool:
    """Whether the body's messages open with an API-written summary (a ``compaction`` block)."""
    msgs = body.get("messages") or []
    first = msgs[0].get("content") if msgs and isinstance(msgs[0], dict) else None
    return isinstance(first, list) and bool(first) and isinstance(first[0], dict) \
        and first[0].get("type") == "compaction"


def with_beta(header: str | None, beta: str) -> str:
    """An ``anthropic-beta`` value with ``beta`` added once, the others kept in order."""
    return ",".join(dict.fromkeys([*(x.strip() for x in (header or "").split(",") if x.strip()), beta]))


def compaction_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """The conversation's own request, as a compaction request: same model, system, tools and
    thinking (condition (c) and (a)), the messages to summarize, and none of the parameters the
    API refuses beside ``compaction``."""
    out = {k: v for k, v in body.items() if k not in _REFUSED_WITH}
    tc = out.get("tool_choice")
    if isinstance(tc, dict) and tc.get("type") in ("any", "tool"):
        out.pop("tool_choice")
    oc = out.get("output_config")
    if isinstance(oc, dict) and "format" in oc:
        out["output_config"] = {k: v for k, v in oc.items() if k != "format"}
    return out


def compaction_max_tokens(caller: int, window: int | None, input_tokens: int, thinking: Any = None) -> int:
    """The ``max_tokens`` of a compaction request made for a request that reserved ``caller``.

    The docs (build-with-claude/compaction-on-demand, *Request a summary*): "The summarization call
    uses the request's model, `system`, `tools`, thinking settings, and `max_tokens`", which "caps
    the whole call, including any thinking the model does before it writes the summary, so allow
    several thousand tokens"; and "The conversation must still fit the model's context window".
    So the caller's own value is kept, and lowered only as far as the window needs: the compaction
    request carries fewer messages than the caller's, but the caller's may itself not fit (Claude
    Code sends 128,000 and lowers it only after the API's 400). It never goes below
    `COMPACTION_MIN_OUTPUT` (several thousand, as the docs ask), nor to or below a thinking
    ``budget_tokens`` (which ``max_tokens`` must exceed), unless the caller asked for less."""
    out = caller if caller > 0 else COMPACTION_MIN_OUTPUT
    if window is not None and window > 0:
        out = min(out, window - max(0, input_tokens))
    floor = COMPACTION_MIN_OUTPUT
    if isinstance(thinking, Mapping) and isinstance(thinking.get("budget_tokens"), int):
        floor = max(floor, int(thinking["budget_tokens"]) + COMPACTION_MIN_OUTPUT)
    return max(out, min(floor, caller if caller > 0 else floor))


class Verbatim(msgspec.Struct, frozen=True):
    """What an API-written summary must quote word for word, checked when it comes back: the
    person's first request (the task: the block stands in for the immutable prefix's messages, so
    the summary is where the task reaches the model from then on) and their newest one, when the
    summarized messages cover it. Each as far as a summary quotes it (`extractive.first_words`)."""

    goal: str = ""
    latest: str = ""

    def __bool__(self) -> bool:
        return bool(self.goal or self.latest)

    def quoted(self) -> tuple[str, str]:
        """The goal and the latest request as the instructions quote them: together within the
        16,384 characters `instructions` may have, the latest request first served."""
        room = MAX_INSTRUCTIONS - len(_KEEP_PROMPT) - len(_KEEP_GOAL.format(text="")) \
            - len(_KEEP_LATEST.format(text=""))
        latest = self.latest[:room]
        return self.goal[:max(0, room - len(latest))], latest


def instructions_keeping(keep: Verbatim) -> str:
    """The ``instructions`` of a compaction request whose summary must quote ``keep`` word for
    word. "A non-blank `instructions` string (up to 16,384 characters) replaces that prompt
    entirely"; "In your `instructions`, say what the summary must retain and tell the model not to
    call tools" (build-with-claude/compaction-on-demand, *Write your own summarization prompt*)."""
    goal, latest = keep.quoted()
    return (_KEEP_PROMPT + (_KEEP_GOAL.format(text=goal) if goal else "")
            + (_KEEP_LATEST.format(text=latest) if latest else ""))


def kept_verbatim(keep: Verbatim, content: str) -> bool:
    """Whether a summary's ``content`` quotes what ``keep`` asked (as far as its instructions
    quoted it) word for word, whitespace aside."""
    have = " ".join(content.split())
    return all(" ".join(t.split()) in have for t in keep.quoted() if t.strip())


def call_ondemand(client: Any, body: dict[str, Any], *, headers: Mapping[str, str] | None = None,
                  at: float | None = None, prices: OwnPrices | None = None,
                  keep: Verbatim | None = None) -> OnDemandResult:
    """Ask the API for a signed block standing for ``body``'s messages. Raises `SummaryRejected`
    (with what it cost) when the answer is not one block with content, or, with ``keep`` (the
    person's first request, and their newest when the messages cover it), when the block does not
    quote them word for word: the summary is asked for them in its instructions
    (`instructions_keeping`), and checked when it comes back. The SDK's own errors pass through
    (the caller counts both as a failed summary, and makes its own, which carries the requests
    verbatim).

    The call streams, whatever ``max_tokens`` is: the SDK refuses a non-streaming call whose
    ``max_tokens`` could take over 10 minutes (above about 21,333; cli-sdks-libraries/sdks/python,
    *Long requests*), and the clients' defaults are above it (Claude Code 128,000, opencode
    32,000). Streamed, "the block arrives whole" in one ``content_block_start``
    (build-with-claude/compaction-on-demand), and the SDK's accumulated message carries it and
    the usage with its ``iterations``."""
    t0 = time.perf_counter()
    extra = {INTERNAL_HEADER: "1", **(headers or {})}
    extra["anthropic-beta"] = with_beta(extra.get("anthropic-beta"), COMPACTION_BETA)
    if at is not None:
        extra[CLOCK_HEADER] = repr(at)
    req = compaction_body(body)
    th = req.get("thinking")
    if isinstance(th, Mapping) and "block_binding" in th:
        # the body's own beta goes with it: the render asks `drop_block` for thinking an edit
        # invalidated, and without its beta the API refuses the field ("thinking.block_binding:
        # Extra inputs are not permitted"), which turned the summary into dropped rounds (issue 56)
        extra["anthropic-beta"] = with_beta(extra["anthropic-beta"], BINDING_BETA)
    ask: dict[str, Any] = {"type": "summarize"}
    if keep:
        ask["instructions"] = instructions_keeping(keep)
    with client.messages.stream(**{k: v for k, v in req.items() if k in _SDK_ARGS},
                                extra_body={"compaction": ask,
                                            **{k: v for k, v in req.items() if k not in _SDK_ARGS}},
                                extra_headers=extra) as stream:
        resp = stream.get_final_message()
    usage = resp.usage.model_dump(exclude_none=True) if hasattr(resp.usage, "model_dump") else dict(resp.usage)
    cost = model_prices(str(req["model"]), own=prices).cost(usage)
    blocks = [b.model_dump(exclude_none=True) if hasattr(b, "model_dump") else dict(b) for b in resp.content]
    found = next((b for b in blocks if b.get("type") == "compaction"), None)
    if resp.stop_reason != "compaction" or found is None or not str(found.get("content") or "").strip() \
            or not found.get("signature"):
        raise SummaryRejected(f"on-demand compaction answered with stop_reason {resp.stop_reason!r} and no signed "
                              "block with content", cost)
    if keep and not kept_verbatim(keep, str(found["content"])):
        raise SummaryRejected("the API-written summary does not quote the person's requests word for word, as its "
                              "instructions asked", cost)
    return OnDemandResult(str(found["content"]), str(found["signature"]), cost, usage, time.perf_counter() - t0)


# the parameters `messages.create` takes by name; the rest of a caller's body goes in extra_body
_SDK_ARGS = frozenset({"model", "max_tokens", "messages", "system", "tools", "thinking", "tool_choice", "metadata",
                       "service_tier", "output_config", "top_k", "top_p", "temperature"})
