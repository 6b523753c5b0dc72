"""Extractive summaries: what a diligent summarizer keeps of a stretch of conversation, with no
model call. The product's offline `ExtractiveSummarizer` and the emulator's stand-in for a
summarizing model both use it, so the benchmark's summaries are the same whoever asks.

Kept: the goal, the first line of each assistant step, the key lines of tool output
(definitions, assignments, errors, search hits; verbatim, newest first within a budget),
lines that report problems as open issues, and the files mentioned.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from ...base.keylines import key_lines
from ...base.person import person_text

__all__ = ["FINDINGS_BUDGET", "block_texts", "first_words", "request_head", "summary_facts"]

FINDINGS_BUDGET = 6000  # characters of key lines (a 2,000-token summary has room for them)
_PATH = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)+[\w.-]+\.[A-Za-z0-9]{1,6}|[\w-]+\.(?:py|ts|js|go|rs|md|json|toml|yaml|"
                   r"yml|txt|cfg|ini|sh|c|h|cpp|java|rb))(?![\w/])")
_ISSUE = re.compile(r"\b(\w*error|\w*exception|fail(?:s|ed|ing|ure)?|traceback|todo|not yet|still|remaining|bug)\b",
                    re.I)


def block_texts(m: dict[str, Any]) -> list[tuple[str, str]]:
    """(kind, text) of a message's blocks; kind is ``text``, ``result`` or ``call``."""
    content = m.get("content")
    if isinstance(content, str):
        return [("text", content)]
    out: list[tuple[str, str]] = []
    for b in content or []:
        if not isinstance(b, dict):
            continue
        if b.get("type") == "text":
            out.append(("text", str(b.get("text", ""))))
        elif b.get("type") == "tool_result":
            c = b.get("content")
            out.append(("result", c if isinstance(c, str) else "\n".join(
                str(x.get("text", "")) for x in c or [] if isinstance(x, dict))))
        elif b.get("type") == "tool_use":
            out.append(("call", f"{b.get('name')}({json.dumps(b.get('input', {}), sort_keys=True)})"))
    return out


def _first_line(s: str, limit: int = 160) -> str:
    """The first non-blank line, cut at a space within ``limit``: a reference, path or id is kept
    whole or dropped, never cut into a wrong one."""
    line = next((x.strip() for x in s.splitlines() if x.strip()), "")
    if len(line) <= limit:
        return line
    cut = line.rfind(" ", 0, limit + 1)
    if cut > 0:
        return line[:cut].rstrip() + " ..."
    return line if len(line) <= 2 * limit else ""  # one long token: whole, or not at all


GOAL_WORDS = 300  # of the task goal a summary must keep (summarize.check_summary)
_WORD = re.compile(r"\w+")


def first_words(text: str, n: int = GOAL_WORDS) -> str:
    """``text`` up to the end of its ``n``-th word (whole when it has no more)."""
    for k, m in enumerate(_WORD.finditer(text), 1):
        if k == n:
            return text[:m.end()] if _WORD.search(text[m.end():]) else text
    return text


def goal_head(goal: str) -> str:
    """The goal as a summary repeats it: whole, or its first `GOAL_WORDS` words and a pointer.
    A task longer than that (a pasted spec) stays whole in the first message, which the
    immutable prefix keeps; repeating it would make every summary bigger than what it replaces."""
    head = first_words(goal)
    return goal if head == goal else head + " [... the task continues in the first message]"


def request_head(text: str) -> str:
    """The person's newest request as a summary quotes it: whole, or its first `GOAL_WORDS`
    words and how much was left out. A request that long is a paste (a log, a spec): quoting it
    whole would make the summary as big as what it replaces, and L5, which keeps no summary,
    keeps the message itself whole."""
    head = first_words(text)
    if head == text:
        return text
    more = len(_WORD.findall(text)) - GOAL_WORDS
    return head + f" [... {more} more words of this request, left out of the summary]"


def summary_facts(messages: Sequence[dict[str, Any]], goal: str = "", keep_issues: Sequence[str] = (),
                  skip_prefixes: tuple[str, ...] = ()) -> dict[str, Any]:
    """The fields of a structured summary of ``messages``. ``goal``: the task goal (else the first
    user text); ``keep_issues``: open issues of an earlier summary that must survive; texts
    starting with one of ``skip_prefixes`` (e.g. earlier summaries' markers) are not steps."""
    steps: list[str] = []
    results: list[str] = []
    issues: list[str] = []
    files: dict[str, str] = {}
    # what people wrote (`base.person`: not tool output, not a client's injected reminders): the
    # goal is the first of it, and the newest, when it is another, is the request under way
    people = [t for m in messages if (t := person_text(m))]
    goal = goal or (people[0] if people else "")
    latest = request_head(people[-1]) if people and people[-1].strip() != goal.strip() else ""
    for m in messages:
        for kind, t in block_texts(m):
            if skip_prefixes and t.startswith(skip_prefixes):
                continue
            if not goal and m.get("role") == "user" and kind == "text" and t.strip():
                goal = t.strip()
            for p in _PATH.findall(t):
                files.setdefault(p, "mentioned" if m.get("role") == "user" else "used")
            if m.get("role") == "assistant":
                if kind == "text" and t.strip() and not t.startswith("["):
                    steps.append(_first_line(t))
                continue
            if kind == "result":
                results.append(t)
            hit = next((x for x in t.splitlines() if _ISSUE.search(x)), None)
            if hit:
                issues.append(_first_line(hit))
    findings: list[str] = []
    budget = FINDINGS_BUDGET
    for t in reversed(results):  # the newest output first: it is the most likely to matter next
        lines = key_lines(t, budget)
        budget -= sum(len(x) + 1 for x in lines)
        findings = lines + findings
        if budget <= 0:
            break
    return {"task_goal": goal_head(goal), "completed_steps": steps[-12:], "key_findings": findings,
            "open_issues": list(dict.fromkeys([*keep_issues, *issues[-6:]])),
            "file_refs": [{"path": p, "relevance": r} for p, r in list(files.items())[-20:]],
            "latest_request": latest}
