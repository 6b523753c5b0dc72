"""Quality signals: does compaction make the agent worse?

`compaction_regression_suite` runs the same tasks with and without compaction and reports
the pass-rate delta, alerting past 5 points. (Repeated identical tool calls are counted by
the `CacheAwareCompactor` itself: a ``repeated_tool_calls`` event once a session passes 2.)
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["RegressionReport", "compaction_regression_suite"]


@dataclass(frozen=True, slots=True)
class RegressionReport:
    tasks: int
    baseline_pass_rate: float
    compact_pass_rate: float
    delta: float  # compacted - baseline, in rate units (0.05 = 5 points)
    alert: bool
    failures_only_with_compaction: list[int]


def _passed(result: Any) -> bool:
    if isinstance(result, bool):
        return result
    if isinstance(result, dict):
        return bool(result.get("success", result.get("passed", False)))
    return bool(getattr(result, "success", getattr(result, "passed", False)))


async def compaction_regression_suite(
    agent_fn: Callable[..., Any | Awaitable[Any]], tasks: Sequence[Any], threshold: float = 0.05
) -> RegressionReport:
    """``agent_fn(task, compact=bool)`` returns (or awaits) a result with ``success``/``passed``
    (attribute or key) or a bool. Alerts when compaction costs more than ``threshold``."""
    if not tasks:
        raise ValueError("compaction_regression_suite needs at least one task")

    async def run(task: Any, compact: bool) -> bool:
        out = agent_fn(task, compact=compact)
        if inspect.isawaitable(out):
            out = await out
        return _passed(out)

    base = [await run(t, False) for t in tasks]
    comp = [await run(t, True) for t in tasks]
    b, c = sum(base) / len(tasks), sum(comp) / len(tasks)
    return RegressionReport(len(tasks), b, c, c - b, c < b - threshold,
                            [i for i, (x, y) in enumerate(zip(base, comp, strict=True)) if x and not y])
