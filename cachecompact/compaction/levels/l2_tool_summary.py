"""L2 tool summary: big tool output is shortened to a rule-based summary and a verbatim preview.

Applied when a result *enters* the transcript (before it was ever sent, so no cached byte
changes), for a result over the per-result budget, or when one message's results exceed
the per-turn budget (largest first). It can also be applied to old big results when tool
output dominates the context; then it breaks the cache like any edit.

On entry a result is shortened only when it could not stay whole through the next compaction
(bigger than what a collapse keeps), and its placeholder says so with the numbers. Where the
rest of the output can be had again depends on the agent: when its requests carry the
``read_scratchpad`` tool (``wrap(client, scratchpad_tool=True)``), the full output is kept in
the scratchpad and the placeholder names its reference; otherwise the placeholder says to run
the tool again (or re-read the file), which works: a re-run of a call whose result compaction
hid comes back whole when the window has room for it; when it has not, the placeholder says
that too and asks for a part. It never mentions a tool the agent lacks.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ...base.keylines import Focus, key_lines
from ...base.refs import text_ref
from ...base.tokens import TokenCounter
from ...history.ledger import ReplaceWithSummary
from .view import LaterIdentifiers, Proposal, ResultInfo, View, older_results

__all__ = ["ON_ENTRY", "externalized_text", "propose_entry_summary", "propose_tool_summary", "rule_summary"]

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


def externalized_text(r: ResultInfo, ref: str | None, preview_chars: int, key_chars: int = 0,
                      focus: Focus | None = None, why: str = "", rerun_fits: int | None = None) -> str:
    """The tool result the model sees instead of the full output: why it is shortened (``why``:
    the numbers that require it), how to get the rest in a way that works, a rule-based summary,
    the first lines (``preview_chars``), and the key lines after them (``key_chars``), all
    verbatim. A re-run comes back whole when the output fits in ``rerun_fits`` tokens (None: the
    window is not the bound, as for an old result cleared to save reads); a bigger one is said to
    be too big for that, so the agent asks for a part instead of looping."""
    preview = r.text[:preview_chars]
    cut = preview.rfind("\n") + 1 if "\n" in preview and len(r.text) > preview_chars else len(preview)
    preview = preview[:cut]  # whole lines only
    more = len(r.text) - len(preview)
    keep = key_lines(r.text[len(preview):], key_chars, focus=focus) if more > 0 and key_chars > 0 else []
    if ref is not None:
        how = (f"the full output is in the scratchpad as {ref}; call read_scratchpad(ref=\"{ref}\", offset, limit) "
               "to read it")
    elif rerun_fits is not None and r.tokens > rerun_fits:
        how = (f"it is too large to show whole here (it would take more than the ~{rerun_fits} tokens the window has "
               "room for), so running the tool again shows this again: ask for the part you need (a narrower "
               "command, or a range of lines)")
    else:
        how = "run the tool again (or re-read the file) to see it whole"
    said = f"; {why}" if why else ""
    return (f"[cachecompact: {r.name} output shortened to save context ({len(r.text)} characters, ~{r.tokens} tokens"
            f"{said}); {how}. {rule_summary(r)}]\nFirst {len(preview)} characters:\n{preview}"
            + (f"\n[... {more} more characters not shown" + ("; their key lines:]\n" + "\n".join(keep) if keep
                                                              else "]") if more > 0 else ""))


ON_ENTRY = "L2 on entry"  # the ledger reason of entry-time edits (they are not compactions of old context)


def _edits(chosen: Sequence[ResultInfo], externalize: bool, counter: TokenCounter,
           preview_chars: int, key_chars: int, p: Proposal, tag: str,
           later: LaterIdentifiers | None = None, why: str = "", rerun_fits: int | None = None) -> None:
    for r in sorted(chosen, key=lambda x: (x.message, x.block)):
        ref = text_ref(r.text) if externalize else None
        text = externalized_text(r, ref, preview_chars, key_chars,
                                 later.after(r.message) if later is not None else None, why, rerun_fits)
        saved = r.tokens - counter.count_text(text)
        if saved <= 0:
            # an output whose lines are nearly all key lines (definitions, grep hits, listings)
            # would come back whole plus a header: longer, and telling the agent to re-run for a
            # rest that is not missing. It stays as it is (an old one would break the cache for nothing).
            continue
        if ref is not None:
            p.blobs[ref] = r.text  # kept with the plan if the proposal is applied
        p.edits.append(ReplaceWithSummary(r.message, r.message, text, f"{tag}: {rule_summary(r)}",
                                          tool_use_id=r.tool_use_id))
        p.tokens_removed += saved


def propose_entry_summary(new: Sequence[ResultInfo], externalize: bool, counter: TokenCounter, *,
                          big_tokens: int, turn_tokens: int, preview_chars: int, key_chars: int = 0,
                          exempt_tools: frozenset[str] = frozenset(), whole: frozenset[str] = frozenset(),
                          why: str = "", rerun_fits: int | None = None) -> Proposal:
    """L2 on entry: new results over ``big_tokens``, then per message the largest ones until the
    message's results fit ``turn_tokens``. Free: nothing of them was ever sent. ``externalize``:
    the agent has the ``read_scratchpad`` tool, so the full output goes to the scratchpad with the
    plan (`Proposal.blobs`) and the placeholder names it. ``whole`` names
    results (tool_use ids) that come back whole whatever their size: re-runs of a call whose
    earlier result compaction hid. ``why`` and ``rerun_fits`` go into the placeholder
    (`externalized_text`)."""
    fresh = [r for r in new if not r.edited and r.name not in exempt_tools and r.tool_use_id not in whole]
    preview_tokens = preview_chars // 4
    chosen = [r for r in fresh if r.tokens > max(big_tokens, 2 * preview_tokens)]
    for msg in sorted({r.message for r in fresh}):
        rest = [r for r in fresh if r.message == msg and r not in chosen]
        total = sum(r.tokens for r in rest) + sum(min(r.tokens, preview_tokens) for r in chosen if r.message == msg)
        for r in sorted(rest, key=lambda x: -x.tokens):
            if total <= turn_tokens:
                break
            if r.tokens > 2 * preview_tokens:
                chosen.append(r)
                total -= r.tokens - preview_tokens
    p = Proposal("L2", f"shorten {len(chosen)} large new tool result(s)")
    _edits(chosen, externalize, counter, preview_chars, key_chars, p, ON_ENTRY, why=why, rerun_fits=rerun_fits)
    return p


def propose_tool_summary(view: View, externalize: bool, counter: TokenCounter, *, old_min_tokens: int,
                         preview_chars: int, key_chars: int = 0, keep_recent: int = 0, keep_recent_tokens: int = 0,
                         exempt_tools: frozenset[str] = frozenset()) -> Proposal:
    """L2 on old results: visible, unedited results after the immutable prefix of at least
    ``old_min_tokens``, except the most recent ones (``keep_recent`` of them, and those within
    the newest ``keep_recent_tokens`` of tool output). Breaks the cache."""
    old = older_results(view, keep_recent, keep_recent_tokens)
    chosen = [r for r in old if not r.edited and r.tokens >= max(old_min_tokens, 2 * preview_chars // 4)
              and r.name not in exempt_tools]
    p = Proposal("L2", f"shorten {len(chosen)} large old tool result(s)")
    _edits(chosen, externalize, counter, preview_chars, key_chars, p, "L2", LaterIdentifiers(view))
    if p.edits:
        p.break_at = min(e.start for e in p.edits)
    return p
