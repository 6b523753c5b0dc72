"""Results that the same call superseded: the agent ran it again, and the newer result is shown whole.

A coding agent re-reads a file after editing it and re-runs a test after a fix. The older
result is then a stale copy: every line it shares with the newer one is still in view, so
clearing it loses only the lines the newer result lacks, and the placeholder keeps those (lines
naming what the agent used since come first). In the shared 2026 Claude Code sessions 9.6% of
tool-result tokens are superseded this way, most of them `Read`s (docs/policy.md, "Superseded
results").

Clearing one is never worth a cache break of its own: it rides on a break another edit makes.
Everything after a break is written again anyway, so a superseded result after it costs
nothing more to clear and is read less on every later turn. `superseded_edits` plans those
edits for the compactor to add to an L1 or L3 proposal; the recent budget does not protect
them, since nothing the newer result shows is lost.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Container
from typing import Any

from ...base.keylines import key_lines
from ...base.tokens import TokenCounter
from ...base.wire import canonical_bytes
from ...history.ledger import ReplaceWithSummary
from .view import PLACEHOLDER_TOKENS, LaterIdentifiers, ResultInfo, View

__all__ = ["superseded_edits", "superseded_text"]


def _call(r: ResultInfo) -> bytes:
    return canonical_bytes([r.name, r.input])


def superseded_text(old: ResultInfo, newer: ResultInfo, where: int, key_budget: int,
                    focus: Container[str] = frozenset()) -> str:
    """The placeholder: which later result supersedes this one, and the lines of this one that
    the newer result does not show (verbatim, within ``key_budget`` characters)."""
    shown = {x.rstrip() for x in newer.text.split("\n")}
    missing = "\n".join(x for x in old.text.split("\n") if x.rstrip() not in shown)
    keep = key_lines(missing, key_budget, focus=focus) if missing.strip() and key_budget > 0 else []
    head = (f"[cachecompact: superseded {old.name} result cleared (~{old.tokens} tokens): the same call ran again "
            f"and its result in messages[{where}] is shown whole"
            + ("; lines it lacks follow]" if keep else "; this one showed nothing more]"))
    return head + ("\n" + "\n".join(keep) if keep else "")


def superseded_edits(view: View, *, after: int, skip_ids: Collection[str], write_tools: frozenset[str],
                     exempt_tools: frozenset[str], min_tokens: int,
                     is_write: Callable[[str, dict[str, Any]], bool] | None = None, key_fraction: float = 0.0,
                     key_max_chars: int = 0, counter: TokenCounter | None = None
                     ) -> tuple[list[ReplaceWithSummary], int]:
    """Edits clearing every superseded result in a message after ``after`` (so after a break
    already planned), and the raw tokens they remove. A result is superseded when a later call
    with the same name and input has a result that is visible and unedited; writes, exempt
    tools, results under ``min_tokens``, edited ones and those in ``skip_ids`` are left alone."""
    newest: dict[bytes, ResultInfo] = {}
    for r in view.results:
        newest[_call(r)] = r
    later = LaterIdentifiers(view)
    edits: list[ReplaceWithSummary] = []
    removed = 0
    for r in view.results:
        kept = r.name in exempt_tools or r.name in write_tools or (is_write is not None and is_write(r.name, r.input))
        if kept or r.message <= after or not r.visible or r.edited or r.tool_use_id in skip_ids \
                or r.tokens < min_tokens:
            continue
        n = newest[_call(r)]
        if n is r or n.message <= r.message or not n.visible or n.edited:
            continue
        text = superseded_text(r, n, n.message, min(key_max_chars, int(key_fraction * r.chars)),
                               later.after(r.message))
        size = counter.count_text(text) if counter is not None else PLACEHOLDER_TOKENS + len(text) // 4
        if size >= r.tokens:
            continue
        edits.append(ReplaceWithSummary(r.message, r.message, text, "superseded tool output",
                                        tool_use_id=r.tool_use_id))
        removed += r.tokens - size
    return edits, removed
