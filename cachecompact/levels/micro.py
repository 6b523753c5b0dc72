"""L1 micro: clear old tool results in place, keeping every tool_use/tool_result pair.

Results beyond the most recent ``keep_recent`` are cleared, except write operations (their
results are the model's only evidence that the action ran; clearing them invites a repeat)
and exempt tools. All eligible results are cleared in one batch, so one cache break removes
as much as possible.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..identifiers import digest
from ..ledger import ReplaceWithSummary
from .view import PLACEHOLDER_TOKENS, Proposal, ResultInfo, View

__all__ = ["DEFAULT_WRITE_TOOLS", "cleared_text", "is_write_op", "propose_micro"]

DEFAULT_WRITE_TOOLS = frozenset({
    "Write", "Edit", "MultiEdit", "NotebookEdit", "create_file", "write_file", "edit_file", "str_replace_editor",
    "str_replace_based_edit_tool", "apply_patch", "run_sql", "execute_sql", "delete_file", "move_file",
})


def is_write_op(r: ResultInfo, write_tools: frozenset[str],
                predicate: Callable[[str, dict[str, Any]], bool] | None = None) -> bool:
    """A write: a configured tool name, or the caller's predicate says so."""
    return r.name in write_tools or (predicate is not None and predicate(r.name, r.input))


def cleared_text(r: ResultInfo, digest_share: float = 0.25, digest_max_chars: int = 1200) -> str:
    """The placeholder: what was cleared, how to get it back, and the identifiers it mentioned
    (within ``digest_share`` of the result's own size), so later references stay resolvable."""
    ids = digest(r.text, min(digest_max_chars, int(r.chars * digest_share)))
    return (f"[cachecompact: old {r.name} result cleared to save context (~{r.tokens} tokens); run the tool again "
            f"for the full output." + (f" It mentioned: {ids}" if ids else "") + "]")


def propose_micro(view: View, *, keep_recent: int, write_tools: frozenset[str], exempt_tools: frozenset[str],
                  min_tokens: int, is_write: Callable[[str, dict[str, Any]], bool] | None = None,
                  keep_after: int | None = None) -> Proposal:
    """Clear every eligible old result. ``keep_after``: never touch messages at or after it."""
    visible = [r for r in view.results if r.visible and r.message >= view.prefix_end]
    old = visible[:-keep_recent] if keep_recent > 0 else visible
    chosen = [r for r in old if not r.edited and r.tokens >= min_tokens and r.name not in exempt_tools
              and not is_write_op(r, write_tools, is_write) and (keep_after is None or r.message < keep_after)]
    p = Proposal("L1", f"clear {len(chosen)} old tool result(s), keeping the last {keep_recent}")
    if not chosen:
        return p
    by_msg: dict[int, list[ResultInfo]] = {}
    for r in chosen:
        by_msg.setdefault(r.message, []).append(r)
    for i in sorted(by_msg):
        p.edits += [ReplaceWithSummary(i, i, cleared_text(r), "L1: old tool output", tool_use_id=r.tool_use_id)
                    for r in by_msg[i]]
    p.tokens_removed = sum(max(0, r.tokens - PLACEHOLDER_TOKENS - r.chars // 16) for r in chosen)
    p.break_at = min(by_msg)
    return p
