"""L2 tool summary: move big tool output to the scratchpad; keep a preview, a rule-based
summary and the reference in the tool result.

Applied when a result *enters* the transcript (before it was ever sent, so no cached byte
changes), for results over the token threshold, over the per-result character budget, or
past the per-turn budget (largest first). It can also be applied to old big results when
tool output dominates the context; then it breaks the cache like any edit.
"""

from __future__ import annotations

import re

from ..identifiers import digest
from ..ledger import ReplaceWithSummary
from ..scratchpad import Scratchpad
from ..tokens import TokenCounter
from .view import Proposal, ResultInfo, View

__all__ = ["externalized_text", "propose_tool_summary", "rule_summary"]

_GREP_HIT = re.compile(r"^(?:\./)?([^\s:]+):\d+[:-]", re.M)
_PYTEST = re.compile(r"=+ (.*(?:passed|failed|error).*?) in [\d.]+s", re.I)


def _command(r: ResultInfo) -> str:
    for key in ("command", "cmd", "pattern", "path", "file_path", "query"):
        v = r.input.get(key)
        if isinstance(v, str):
            return v
    return ""


def rule_summary(r: ResultInfo) -> str:
    """A one-line, tool-aware description of the output (no model call)."""
    text, name, cmd = r.text, r.name.lower(), _command(r)
    lines = text.count("\n") + (1 if text and not text.endswith("\n") else 0)
    if "grep" in name or "search" in name or re.match(r"\s*(grep|rg|ag|git grep)\b", cmd):
        hits = _GREP_HIT.findall(text)
        if hits:
            return f"grep: {len(hits)} matches in {len(set(hits))} files"
        return f"search: {lines} lines of matches"
    if name in ("read", "read_file", "view", "cat") or re.match(r"\s*(cat|sed -n|head|tail|nl)\b", cmd):
        return f"file contents: {lines} lines of {cmd or 'the file'}"
    if re.match(r"\s*(ls|find|tree)\b", cmd) or name in ("glob", "ls", "list_files"):
        return f"listing: {lines} entries"
    m = _PYTEST.search(text)
    if m:
        return f"test run: {m.group(1).strip()}"
    return f"{r.name} output: {lines} lines, {len(text)} characters"


def externalized_text(r: ResultInfo, ref: str, preview_chars: int, digest_chars: int = 1500) -> str:
    """The tool result the model sees instead of the full output: summary, preview, and the
    identifiers that appear only after the preview."""
    preview = r.text[:preview_chars]
    more = len(r.text) - len(preview)
    rest = digest(r.text[preview_chars:], digest_chars, skip=preview) if more > 0 else ""
    return (f"[cachecompact: {r.name} output moved to the scratchpad as {ref} ({len(r.text)} characters, "
            f"~{r.tokens} tokens) to save context; call read_scratchpad(ref=\"{ref}\", offset, limit) to read it. "
            f"{rule_summary(r)}]\nPreview (first {len(preview)} characters):\n{preview}"
            + (f"\n[... {more} more characters in {ref}" + (f"; they mention: {rest}" if rest else "") + "]"
               if more > 0 else ""))


def propose_tool_summary(view: View, scratchpad: Scratchpad, counter: TokenCounter, *, since: int,
                         big_tokens: int, result_chars: int, turn_chars: int, preview_chars: int,
                         old_min_tokens: int | None = None, exempt_tools: frozenset[str] = frozenset()) -> Proposal:
    """Externalize new results (messages >= ``since``) over the budgets; with ``old_min_tokens``
    also old visible results at least that big. Writes the scratchpad files it refers to."""
    chosen: list[ResultInfo] = []
    fresh = [r for r in view.results if r.message >= since and r.visible and not r.edited
             and r.name not in exempt_tools]
    for r in fresh:
        if r.tokens > big_tokens or r.chars > result_chars:
            chosen.append(r)
    for msg in sorted({r.message for r in fresh}):
        turn = [r for r in fresh if r.message == msg and r not in chosen]
        total = sum(r.chars for r in turn) + sum(min(r.chars, preview_chars) for r in chosen if r.message == msg)
        for r in sorted(turn, key=lambda x: -x.chars):
            if total <= turn_chars:
                break
            if r.chars > min(result_chars, preview_chars * 2):
                chosen.append(r)
                total -= r.chars - preview_chars
    breaks = False
    if old_min_tokens is not None:
        for r in view.results:
            if (r.message < since and r.visible and not r.edited and r.tokens >= old_min_tokens
                    and r.name not in exempt_tools and r not in chosen):
                chosen.append(r)
                breaks = True
    p = Proposal("L2", f"externalize {len(chosen)} large tool result(s) to the scratchpad")
    for r in sorted(chosen, key=lambda x: (x.message, x.block)):
        ref = scratchpad.put(r.text)
        text = externalized_text(r, ref, preview_chars)
        p.edits.append(ReplaceWithSummary(r.message, r.message, text, f"L2: {rule_summary(r)}",
                                          tool_use_id=r.tool_use_id))
        p.tokens_removed += max(0, r.tokens - counter.count_text(text))
    if breaks and p.edits:
        p.break_at = min(e.start for e in p.edits)
    return p
