"""The five compaction levels, cheapest first. Each one only plans ledger edits (L2's proposals
also carry the scratchpad content they name); the policy decides which to use and the compactor
stages them."""

from .l1_micro import DEFAULT_WRITE_TOOLS, cleared_text, is_write_op, propose_micro
from .l2_tool_summary import externalized_text, propose_entry_summary, propose_tool_summary, rule_summary
from .l3_turn_collapse import propose_turn_collapse
from .l4_full import propose_full
from .l5_truncate import propose_truncate
from .superseded import superseded_edits
from .view import PLACEHOLDER_TOKENS, Proposal, ResultInfo, View, build_view, message_results, results_since

__all__ = [
    "DEFAULT_WRITE_TOOLS",
    "PLACEHOLDER_TOKENS",
    "Proposal",
    "ResultInfo",
    "View",
    "build_view",
    "cleared_text",
    "externalized_text",
    "is_write_op",
    "message_results",
    "propose_entry_summary",
    "propose_full",
    "propose_micro",
    "propose_tool_summary",
    "propose_truncate",
    "propose_turn_collapse",
    "results_since",
    "rule_summary",
    "superseded_edits",
]
