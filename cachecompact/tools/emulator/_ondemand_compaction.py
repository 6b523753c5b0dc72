"""On-demand compaction in the emulator: the top-level ``compaction`` parameter (beta
``compact-2026-09-04``) and the signed block it returns.

What the docs say (build-with-claude/compaction-on-demand and compaction-thinking-blocks;
anthropic-cache-facts.md §3.5), and what the emulator does:

* **The request.** ``"compaction": {"type": "summarize", "instructions"?: str}`` with the beta
  header. "The API summarizes every message in the request once, generates no reply after it,
  and returns the block alone with `stop_reason` `"compaction"`." ``instructions`` (up to 16,384
  characters; blank counts as absent) replaces the prompt. It cannot be combined with
  ``context_management``; ``stop_sequences``, ``output_config.format`` and a ``tool_choice`` of
  type ``any`` or ``tool`` are refused; a last assistant turn that ends in a tool call without its
  result is ``compaction_incomplete_turn``; nothing to summarize is
  ``compaction_nothing_to_summarize``. Token counting ignores the parameter.
* **The response.** One ``compaction`` block with ``content`` and ``signature``; the top-level
  ``input_tokens`` and ``output_tokens`` are 0 and the cost is the ``compaction`` entry of
  ``usage.iterations``. A stream carries the block whole in ``content_block_start``, no delta.
* **Using the block.** First in ``messages`` (its own assistant message, or the first block of
  the first message); summarized messages left in front of it are ``compaction_block_misplaced``;
  more than one block with content is ``compaction_block_ambiguous``; a changed signature is
  ``compaction_signature_invalid`` and changed content ``compaction_content_mismatch``; a request
  carrying one without the beta header gets "a validation error that says `compaction` is not one
  of the expected content block types".
* **Thinking.** "The check accepts the swap when the API wrote the summary": the block records the
  prefix of the messages it replaced, and the thinking in the kept turns that directly follow is
  checked against that prefix (`thinking.ThinkingCheck.prefixes`).

The summary is the emulator's offline extractive one (as for ``compact_20260112``). Model support
follows the supported-model list of the live compaction-thinking-blocks page; Fable 5.2 and
Mythos 5.2, on no list we can read, are taken as supported (our choice).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...base.errors import MalformedMessageError
from ...base.pricing import ONDEMAND_COMPACTION_MODELS
from ._compaction import CompactEdit, summary_block

__all__ = ["BETA", "MAX_INSTRUCTIONS", "SUPPORTED", "CodedError", "OnDemand", "check_blocks", "request_of",
           "sign_block"]

BETA = "compact-2026-09-04"
MAX_INSTRUCTIONS = 16_384
SUPPORTED = ONDEMAND_COMPACTION_MODELS  # the one list (base.pricing), cited there


class CodedError(MalformedMessageError):
    """A 400 that also carries ``error.details.error_code`` (the SDK's error classes key on it)."""

    def __init__(self, where: str, problem: str, code: str) -> None:
        super().__init__(where, problem)
        self.code = code

    def __reduce__(self) -> tuple[type, tuple[str, str, str]]:  # type: ignore[override]
        return type(self), (self.where, self.problem, self.code)


@dataclass(frozen=True, slots=True)
class OnDemand:
    instructions: str | None


def request_of(body: Mapping[str, Any], betas: set[str], model: str) -> OnDemand | None:
    """The request's ``compaction`` parameter, checked; None when absent."""
    if "compaction" not in body:
        return None
    c = body["compaction"]
    if BETA not in betas:
        raise MalformedMessageError("compaction", f"the compaction parameter requires anthropic-beta: {BETA}")
    if not isinstance(c, dict) or c.get("type") != "summarize" or set(c) - {"type", "instructions"}:
        raise MalformedMessageError("compaction", "must be {'type': 'summarize', 'instructions'?: string}")
    instr = c.get("instructions")
    if instr is not None and not isinstance(instr, str):
        raise MalformedMessageError("compaction.instructions", "must be a string")
    if isinstance(instr, str) and len(instr) > MAX_INSTRUCTIONS:
        raise MalformedMessageError("compaction.instructions", f"must be at most {MAX_INSTRUCTIONS} characters")
    if model not in SUPPORTED:
        raise MalformedMessageError("compaction", f"on-demand compaction is not supported for {model}")
    if body.get("context_management") is not None:
        raise MalformedMessageError("compaction", "cannot be combined with context_management")
    if body.get("stop_sequences"):
        raise MalformedMessageError("stop_sequences", "is not accepted with compaction")
    oc = body.get("output_config")
    if isinstance(oc, dict) and oc.get("format") is not None:
        raise MalformedMessageError("output_config.format", "is not accepted with compaction")
    tc = body.get("tool_choice")
    if isinstance(tc, dict) and tc.get("type") in ("any", "tool"):
        raise MalformedMessageError("tool_choice", f"type {tc['type']!r} is not accepted with compaction")
    msgs = body.get("messages") or []
    if not any(isinstance(m, dict) and m.get("role") in ("user", "assistant") for m in msgs):
        raise CodedError("messages", "there is nothing to summarize", "compaction_nothing_to_summarize")
    last = msgs[-1] if msgs else None
    if isinstance(last, dict) and last.get("role") == "assistant" and isinstance(last.get("content"), list) and any(
            isinstance(b, dict) and b.get("type") == "tool_use" for b in last["content"]):
        raise CodedError(f"messages.{len(msgs) - 1}", "the last assistant turn ends in a tool call with no result",
                         "compaction_incomplete_turn")
    return OnDemand(instr if isinstance(instr, str) and instr.strip() else None)


def _digest(content: str) -> str:
    return hashlib.sha256(content.encode()).hexdigest()[:24]


def _mac(secret: bytes, prefix: str, digest: str) -> str:
    return hmac.new(secret, f"{prefix}.{digest}".encode(), hashlib.sha256).hexdigest()[:40]


def sign_block(secret: bytes, messages: list[dict[str, Any]], od: OnDemand, prefix: str) -> dict[str, Any]:
    """The signed block summarizing ``messages``. The signature records the prefix digest those
    messages leave (what the kept turns' thinking is checked against) and the summary's digest."""
    block = summary_block(messages, CompactEdit(instructions=od.instructions))
    digest = _digest(block["content"])
    return {"type": "compaction", "content": block["content"],
            "signature": f"emucp.{prefix}.{digest}.{_mac(secret, prefix, digest)}"}


def block_prefix(secret: bytes, b: Mapping[str, Any], where: str) -> str:
    """The prefix digest a signed block records, after checking its signature, then its content."""
    sig = b.get("signature")
    parts = sig.split(".") if isinstance(sig, str) else []
    if len(parts) != 4 or parts[0] != "emucp" or not hmac.compare_digest(parts[3], _mac(secret, parts[1], parts[2])):
        raise CodedError(f"{where}.signature", "the compaction block's signature does not verify",
                         "compaction_signature_invalid")
    content = b.get("content")
    if not isinstance(content, str) or _digest(content) != parts[2]:
        raise CodedError(f"{where}.content", "the compaction block's content differs from the text its signature "
                                             "recorded", "compaction_content_mismatch")
    return parts[1]


def check_blocks(body: Mapping[str, Any], betas: set[str], secret: bytes) -> str | None:
    """Signed ``compaction`` blocks sent back: where they may be, how many, and whether they
    verify; the prefix digest of the one in force (None when there is none)."""
    found: list[tuple[int, int, Mapping[str, Any]]] = []
    for i, m in enumerate(body.get("messages") or []):
        c = m.get("content") if isinstance(m, dict) else None
        for j, b in enumerate(c if isinstance(c, list) else []):
            if isinstance(b, dict) and b.get("type") == "compaction" and b.get("signature") is not None:
                found.append((i, j, b))
    if not found:
        return None
    if BETA not in betas:
        i, j, _ = found[0]
        raise MalformedMessageError(f"messages.{i}.content.{j}.type", "Input tag 'compaction' found using 'type' does "
                                                                      "not match any of the expected tags")
    with_content = [x for x in found if isinstance(x[2].get("content"), str)]
    if len(with_content) > 1:
        i, j, _ = with_content[1]
        raise CodedError(f"messages.{i}.content.{j}", "messages holds more than one compaction block with content; "
                                                      "send only the block the conversation returned last",
                         "compaction_block_ambiguous")
    i, j, b = found[0]
    msgs = body.get("messages") or []
    if j != 0 or i != 0 or (isinstance(msgs[0], dict) and msgs[0].get("role") == "system"):
        raise CodedError(f"messages.{i}.content.{j}", "the compaction block must come first in messages: remove "
                                                      "the summarized messages in front of it",
                         "compaction_block_misplaced")
    return block_prefix(secret, b, f"messages.{i}.content.{j}")
