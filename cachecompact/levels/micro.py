"""L1 micro: clear old tool results in place, keeping every tool_use/tool_result pair.

Results beyond the most recent ``keep_recent`` are cleared, except write operations (their
results are the model's only evidence that the action ran; clearing them invites a repeat)
and exempt tools. All eligible results are cleared in one batch, so one cache break removes
as much as possible.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..ledger import SkipRange
from .view import PLACEHOLDER_TOKENS, Proposal, ResultInfo, View

__all__ = ["DEFAULT_WRITE_TOOLS", "is_write_op", "propose_micro"]

DEFAULT_WRITE_TOOLS = frozenset({
    "Write", "Edit", "MultiEdit", "NotebookEdit", "create_file", "write_file", "edit_file", "str_replace_editor",
    "str_replace_based_edit_tool", "apply_patch", "run_sql", "execute_sql", "delete_file", "move_file",
})


def is_write_op(r: ResultInfo, write_tools: frozenset[str],
                predicate: Callable[[str, dict[str, Any]], bool] | None = None) -> bool:
    """A write: a configured tool name, or the caller's predicate says so."""
    return r.name in write_tools or (predicate is not None and predicate(r.name, r.input))


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
    all_in_msg: dict[int, int] = {}
    for r in view.results:
        all_in_msg[r.message] = all_in_msg.get(r.message, 0) + 1
    for i in sorted(by_msg):
        rs = by_msg[i]
        if len(rs) == all_in_msg[i] and view.covered_by[i] is None:
            p.edits.append(SkipRange(i, i, "L1: old tool output"))
        else:
            p.edits += [SkipRange(i, i, "L1: old tool output", tool_use_id=r.tool_use_id) for r in rs]
    p.tokens_removed = sum(max(0, r.tokens - PLACEHOLDER_TOKENS) for r in chosen)
    p.break_at = min(by_msg)
    return p
