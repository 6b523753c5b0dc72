"""L1 micro: clear old tool results in place, keeping every tool_use/tool_result pair.

Results older than the most recent ones (a count, and a budget of tool-output tokens) are
cleared, except write operations (their results are the model's only evidence that the
action ran; clearing them invites a repeat) and exempt tools. A placeholder keeps lines
verbatim (`keylines`): first those naming what the agent's later calls used (it acted on
them, so it may again), then definitions, assignments, errors, search hits. All
eligible results are cleared in one batch, so one cache break removes as much as possible.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...base.keylines import Focus, key_lines
from ...base.tokens import TokenCounter
from ...history.ledger import ReplaceWithSummary, SkipRange
from .view import PLACEHOLDER_TOKENS, LaterIdentifiers, Proposal, ResultInfo, View, older_tool_blocks

__all__ = ["DEFAULT_WRITE_TOOLS", "cleared_text", "is_write_op", "propose_micro"]

DEFAULT_WRITE_TOOLS = frozenset({
    "Write", "Edit", "MultiEdit", "NotebookEdit", "create_file", "write_file", "edit_file", "str_replace_editor",
    "str_replace_based_edit_tool", "apply_patch", "run_sql", "execute_sql", "delete_file", "move_file",
})


def is_write_op(r: ResultInfo, write_tools: frozenset[str],
                predicate: Callable[[str, dict[str, Any]], bool] | None = None) -> bool:
    """A write: a configured tool name, or the caller's predicate says so."""
    return r.name in write_tools or (predicate is not None and predicate(r.name, r.input))


def cleared_text(r: ResultInfo, key_budget: int = 0, focus: Focus | None = None) -> str:
    """The placeholder: what was cleared, its key lines (verbatim, within ``key_budget``
    characters; lines naming a ``focus`` identifier first), and how to get the rest back with
    the agent's own tools."""
    keep = key_lines(r.text, key_budget, focus=focus) if key_budget > 0 else []
    head = (f"[cachecompact: old {r.name} result cleared to save context (~{r.tokens} tokens); "
            + ("its key lines follow; " if keep else "") + "run the tool again if you need the rest.]")
    return head + ("\n" + "\n".join(keep) if keep else "")


def propose_micro(view: View, *, keep_recent: int, write_tools: frozenset[str], exempt_tools: frozenset[str],
                  min_tokens: int, is_write: Callable[[str, dict[str, Any]], bool] | None = None,
                  keep_recent_tokens: int = 0, key_fraction: float = 0.0, key_max_chars: int = 0,
                  counter: TokenCounter | None = None) -> Proposal:
    """Clear every eligible old result: all but the ``keep_recent`` most recent results and the
    results within the most recent ``keep_recent_tokens`` of tool output stay verbatim. A
    placeholder keeps up to ``key_fraction`` of the result's characters (at most
    ``key_max_chars``) of its key lines."""
    old, old_calls = older_tool_blocks(view, keep_recent, keep_recent_tokens)
    chosen = [r for r in old if not r.edited and r.tokens >= min_tokens and r.name not in exempt_tools
              and not is_write_op(r, write_tools, is_write)]
    # the inputs of old calls (a file write's content, a long command) go too: a call's result is
    # what tells the agent what it did, and a write's result is kept
    calls = [c for c in old_calls if not c.edited and c.tokens >= min_tokens and c.name not in exempt_tools]
    p = Proposal("L1", f"clear {len(chosen)} old tool result(s) and {len(calls)} old tool input(s), keeping the last "
                       f"{keep_recent} results and the newest {keep_recent_tokens} tokens of tool output")
    if not chosen and not calls:
        return p
    later = LaterIdentifiers(view)
    for r in chosen:
        text = cleared_text(r, min(key_max_chars, int(key_fraction * r.chars)), later.after(r.message))
        p.edits.append(ReplaceWithSummary(r.message, r.message, text, "L1: old tool output", tool_use_id=r.tool_use_id))
        after = counter.count_text(text) if counter is not None else PLACEHOLDER_TOKENS + len(text) // 4
        p.tokens_removed += max(0, r.tokens - after)
    for c in calls:
        p.edits.append(SkipRange(c.message, c.message, "L1: old tool input", tool_use_id=c.tool_use_id))
        p.tokens_removed += max(0, c.tokens - PLACEHOLDER_TOKENS)
    p.edits.sort(key=lambda e: e.start)
    p.break_at = min(e.start for e in p.edits)
    return p
