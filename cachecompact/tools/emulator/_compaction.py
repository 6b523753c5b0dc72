"""Server-side compaction in the emulator: the ``compact_20260112`` edit.

What the docs say (anthropic-cache-facts.md §3.1-3.4), and what the emulator does with it:

* the edit goes in ``context_management.edits`` under the beta header ``compact-2026-01-12``;
  ``trigger`` is ``{"type": "input_tokens", "value": N}`` with N >= 50,000 (default 150,000),
  ``pause_after_compaction`` a boolean, ``instructions`` a string that replaces the default
  summarization prompt;
* a request whose messages hold a ``compaction`` block is read from the last such block on:
  every content block before it is dropped (a block with null content is a no-op);
* when the input reaches the trigger, the server writes a summary in an extra sampling step,
  billed as a ``compaction`` entry of ``usage.iterations`` (not in the top-level usage), and
  puts a ``compaction`` block at the start of the response; without a pause the model then
  answers from the summary (a ``message`` iteration, which the top-level usage reports);
  with ``pause_after_compaction`` the response ends there, ``stop_reason: "compaction"``.

**Model (our choice), where the docs are silent:** the summarization step sees the whole
prompt, so it is billed like the request itself would be (its cache reads and writes
included) plus the summarization prompt, with the summary as output; the summary is the
emulator's offline extractive one, in ``<summary>`` tags, so its cost is real and its quality
extractive, like every other summarizing peer's. The message step's prompt is the tools, the
system prompt and the compaction block. With a pause the top-level usage is that of no
message step (zero input and output tokens).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ...base.errors import MalformedMessageError
from ...compaction.summarize.extractive import summary_facts

__all__ = ["BETA", "DEFAULT_TRIGGER", "MIN_TRIGGER", "CompactEdit", "after_last_compaction", "compact_edit",
           "summary_block", "summary_prompt"]

BETA = "compact-2026-01-12"
EDIT = "compact_20260112"
DEFAULT_TRIGGER = 150_000
MIN_TRIGGER = 50_000
# the default prompt is not published; this one asks what the docs say it asks for
DEFAULT_INSTRUCTIONS = ("Summarize the conversation so far so that the work can continue from the summary alone: the "
                        "task, what was done, what was found, what is open. Answer inside <summary></summary> tags.")


@dataclass(frozen=True, slots=True)
class CompactEdit:
    """A validated ``compact_20260112`` edit."""

    trigger: int = DEFAULT_TRIGGER
    pause: bool = False
    instructions: str | None = None

    @property
    def prompt(self) -> str:
        return self.instructions if self.instructions is not None else DEFAULT_INSTRUCTIONS


def _bad(where: str, problem: str) -> MalformedMessageError:
    return MalformedMessageError(where, problem)


def compact_edit(body: dict[str, Any], betas: str) -> CompactEdit | None:
    """The request's ``compact_20260112`` edit, validated, or None; 400s name the field."""
    cm = body.get("context_management")
    edits = cm.get("edits") if isinstance(cm, dict) else None
    if not isinstance(edits, list):
        return None
    found: CompactEdit | None = None
    for k, e in enumerate(edits):
        if not isinstance(e, dict) or e.get("type") != EDIT:
            continue
        where = f"context_management.edits[{k}]"
        if BETA not in {b.strip() for b in betas.split(",")}:
            raise _bad(f"{where}.type", f"'{EDIT}' requires the beta header 'anthropic-beta: {BETA}'")
        if found is not None:
            raise _bad(where, f"at most one '{EDIT}' edit may be given")
        extra = sorted(set(e) - {"type", "trigger", "pause_after_compaction", "instructions"})
        if extra:
            raise _bad(f"{where}.{extra[0]}", "Extra inputs are not permitted")
        trigger = DEFAULT_TRIGGER
        if e.get("trigger") is not None:
            t = e["trigger"]
            if not isinstance(t, dict) or t.get("type") != "input_tokens" or set(t) - {"type", "value"}:
                raise _bad(f"{where}.trigger", "'input_tokens' is the only supported trigger type: "
                                               "{'type': 'input_tokens', 'value': N}")
            v = t.get("value")
            if not isinstance(v, int) or isinstance(v, bool):
                raise _bad(f"{where}.trigger.value", "must be an integer")
            if v < MIN_TRIGGER:
                raise _bad(f"{where}.trigger.value", f"must be at least {MIN_TRIGGER} tokens, got {v}")
            trigger = v
        pause = e.get("pause_after_compaction", False)
        if not isinstance(pause, bool):
            raise _bad(f"{where}.pause_after_compaction", "must be a boolean")
        instr = e.get("instructions")
        if instr is not None and (not isinstance(instr, str) or not instr.strip()):
            raise _bad(f"{where}.instructions", "must be a non-empty string or null")
        found = CompactEdit(trigger, pause, instr)
    return found


def after_last_compaction(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the model sees of ``messages``: from the last compaction block with content on,
    every content block before it dropped; the messages themselves when there is none."""
    for i in range(len(messages) - 1, -1, -1):
        content = messages[i].get("content")
        if not isinstance(content, list):
            continue
        for j in range(len(content) - 1, -1, -1):
            b = content[j]
            if isinstance(b, dict) and b.get("type") == "compaction" and isinstance(b.get("content"), str):
                return [{**messages[i], "content": content[j:]}, *messages[i + 1:]]
    return messages


def summary_prompt(edit: CompactEdit) -> dict[str, Any]:
    """The user turn the summarization step adds to the prompt (billed with it)."""
    return {"role": "user", "content": [{"type": "text", "text": edit.prompt}]}


_HEADS = ("Done:", "Found:", "Open:", "Files: ", "Latest request: ", "(summarized as instructed")


def _earlier(messages: list[dict[str, Any]]) -> tuple[str, str]:
    """The task and the latest request an earlier block of this emulator's carried, when the
    messages start with one: a new block "summarizes the old summary and everything after it"
    (build-with-claude/compaction-on-demand), so what the old one said of the task goes on."""
    first = messages[0].get("content") if messages and isinstance(messages[0], dict) else None
    block = first[0] if isinstance(first, list) and first and isinstance(first[0], dict) else {}
    if block.get("type") != "compaction" or not isinstance(block.get("content"), str):
        return "", ""
    text = str(block["content"]).removeprefix("<summary>\n").removesuffix("\n</summary>")

    def field(head: str) -> str:
        at = text.find(head)
        if at < 0:
            return ""
        rest = text[at + len(head):]
        stops = [i for h in _HEADS if (i := rest.find("\n" + h)) >= 0]
        return rest[:min(stops)] if stops else rest

    return field("Task: "), field("Latest request: ")


def summary_block(messages: list[dict[str, Any]], edit: CompactEdit) -> dict[str, Any]:
    """The ``compaction`` block: an extractive summary of ``messages`` in ``<summary>`` tags."""
    task, latest = _earlier(messages)
    facts = summary_facts(messages, goal=task)
    lines = [f"Task: {facts['task_goal']}"[:8000]]  # the goal as a summary repeats it (its first 300 words)
    for name, label in (("completed_steps", "Done"), ("key_findings", "Found"), ("open_issues", "Open")):
        if facts[name]:
            lines.append(f"{label}:")
            lines += [f"- {x}" for x in facts[name]]
    if facts["file_refs"]:
        lines.append("Files: " + ", ".join(f["path"] for f in facts["file_refs"]))
    latest = facts["latest_request"] or latest  # a summary made to continue the work ends with what was asked last
    if latest:
        lines.append(f"Latest request: {latest}")
    if edit.instructions is not None:  # an instruction-following model would say what it followed
        lines.append("(summarized as instructed: " + json.dumps(edit.instructions[:200]) + ")")
    return {"type": "compaction", "content": "<summary>\n" + "\n".join(lines) + "\n</summary>"}
