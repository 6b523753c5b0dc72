"""Results that the same call superseded: the agent ran it again, and the newer result is shown whole.

A coding agent re-reads a file after editing it and re-runs a test after a fix. The older
result is then a stale copy: every line it shares with the newer one is still in view. It is
cleared only when the lines the newer result lacks fit in its placeholder whole, verbatim, so
clearing it loses no line. In the shared 2026 Claude Code sessions 9.6% of tool-result tokens
are superseded by a later identical call, most of them `Read`s (docs/policy.md, "Superseded
results").

Clearing one is never worth a cache break of its own: it rides on a break another edit makes.
Everything after a break is written again anyway, so a superseded result after it costs
nothing more to clear and is read less on every later turn. `superseded_edits` plans those
edits for the compactor to add to an L1-L4 proposal; the recent budget does not protect them,
since nothing is lost.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from ...base.tokens import TokenCounter
from ...base.wire import canonical_bytes
from ...history.ledger import ReplaceWithSummary
from .l1_micro import is_write_op
from .view import PLACEHOLDER_TOKENS, ResultInfo, View

__all__ = ["SUPERSEDED_REASON", "missing_lines", "superseded_edits", "superseded_text"]

SUPERSEDED_REASON = "superseded tool output"  # the edits' reason: not the level's own clearing


def _call(r: ResultInfo) -> bytes:
    return canonical_bytes([r.name, r.input])


def missing_lines(old: ResultInfo, newer: ResultInfo) -> str:
    """The lines of ``old`` that ``newer`` does not show (trailing whitespace aside), in order."""
    shown = {x.rstrip() for x in newer.text.split("\n")}
    return "\n".join(x for x in old.text.split("\n") if x.rstrip() not in shown and x.strip())


def superseded_text(old: ResultInfo, newer: ResultInfo, missing: str) -> str:
    """The placeholder: which later result supersedes this one (by its call's id, which every
    rendering keeps, unlike a message index), and every line of this one it does not show."""
    head = (f"[cachecompact: superseded {old.name} result cleared (~{old.tokens} tokens): the same call ran again "
            f"(tool_use_id {newer.tool_use_id}) and that result is shown whole; "
            + ("the lines it lacks follow]" if missing else "it shows every line of this one]"))
    return head + ("\n" + missing if missing else "")


def superseded_edits(view: View, *, after: int, skip_ids: Collection[str], write_tools: frozenset[str],
                     exempt_tools: frozenset[str], min_tokens: int,
                     is_write: Callable[[str, dict[str, Any]], bool] | None = None, key_fraction: float = 0.0,
                     key_max_chars: int = 0, counter: TokenCounter | None = None
                     ) -> tuple[list[ReplaceWithSummary], int]:
    """Edits clearing every superseded result in a message after ``after`` (so after a break
    already planned), and the raw tokens they remove. A result is superseded when a later call
    with the same name and input has a result that is visible, unedited and not in ``skip_ids``
    (the proposal's own edits), and the lines it lacks fit in ``key_fraction`` of the result
    and ``key_max_chars``; writes, exempt tools, results under ``min_tokens``, results with an
    image or document (their text does not show all of them), edited ones and those in
    ``skip_ids`` are left alone."""
    newest: dict[bytes, ResultInfo] = {}
    for r in view.results:
        newest[_call(r)] = r
    edits: list[ReplaceWithSummary] = []
    removed = 0
    for r in view.results:
        kept = r.name in exempt_tools or is_write_op(r, write_tools, is_write)
        if kept or r.message <= after or not r.visible or r.edited or r.media or r.tool_use_id in skip_ids \
                or r.tokens < min_tokens:
            continue
        n = newest[_call(r)]
        if n is r or n.message <= r.message or not n.visible or n.edited or n.tool_use_id in skip_ids:
            continue
        missing = missing_lines(r, n)
        if len(missing) > min(key_max_chars, int(key_fraction * r.chars)):
            continue  # the placeholder could not keep every line the newer result lacks
        text = superseded_text(r, n, missing)
        size = counter.count_text(text) if counter is not None else PLACEHOLDER_TOKENS + len(text) // 4
        if size >= r.tokens:
            continue
        edits.append(ReplaceWithSummary(r.message, r.message, text, SUPERSEDED_REASON,
                                        tool_use_id=r.tool_use_id))
        removed += r.tokens - size
    return edits, removed
