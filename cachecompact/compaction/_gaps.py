"""How long a session waits between requests, and so which cache TTL pays (see `policy.choose_ttls`).

A cache entry written with the 5-minute TTL is gone after an idle gap of more than five minutes;
one written with the 1-hour TTL survives it, for a higher write price. Whether that pays depends on
how often the next gap falls between the two, and that depends on who speaks next:

* after a response that calls a tool, the agent answers as soon as the tool returns (seconds,
  sometimes minutes for a build or a test run);
* after a response that calls no tool, the turn is over and the next request waits for a person,
  who may read, think or be away.

`GapMeter` keeps both kinds of gap apart, as the session shows them, and estimates the chance that
the next gap outlives the short TTL but not the long one. The share of gaps of a kind in that
range is taken at the lower end of its Wilson interval (one standard error): the dearer 1-hour
write is paid only once the session has shown such gaps, so an agent loop whose gaps are all
seconds never pays it, and one mid gap among a person's replies is enough to start. The share
of responses that end the turn is (k + 1/2) / (n + 1). Nothing is fitted.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

import msgspec

from ..base.shares import wilson_lower

__all__ = ["LONG_TTL_S", "SHORT_TTL_S", "Bounded", "GapMeter", "Gaps", "dec_hook", "enc_hook", "wilson_lower"]

SHORT_TTL_S = 300.0
LONG_TTL_S = 3600.0

T = TypeVar("T")


# -- bounded windows, stored as JSON lists ---------------------------------------------------------
# The meter keeps its newest gaps, and the compactor's state (`_compactor_state.CompactorState`) its
# newest turns and calls, in deques with a maximum length. msgspec stores no deque, and a deque read
# back by `msgspec.convert` would lose its bound: each bounded field gets a subclass that carries its
# bound and its stored form, and `enc_hook`/`dec_hook` convert it, so those structures are converted
# whole (never field by field by hand) and a stored window never grows past its bound.

class Bounded(deque[T]):
    """The newest `MAXLEN` items; stored as a list of `ITEMS` (a list type: ``list[int]``)."""

    MAXLEN: ClassVar[int]
    ITEMS: ClassVar[Any]

    # ``maxlen`` is accepted and ignored so that `copy` and `pickle` (which pass it) rebuild one
    def __init__(self, items: Iterable[T] = (), maxlen: int | None = None) -> None:
        super().__init__(items, maxlen=self.MAXLEN)


def enc_hook(obj: Any) -> Any:
    """A deque as the list of its items (oldest first)."""
    if isinstance(obj, deque):
        return list(obj)
    # msgspec's contract for a hook given a type it does not handle, not a stub: "raise
    # NotImplementedError(f'Objects of type {type(obj)} are not supported')"
    # (https://jcristharif.com/msgspec/extending.html, "Mapping to/from native types")
    raise NotImplementedError(f"cannot store a {type(obj).__name__}")


def dec_hook(tp: Any, obj: Any) -> Any:
    """A `Bounded` from its stored list, each item converted and checked as ``tp.ITEMS`` says."""
    if isinstance(tp, type) and issubclass(tp, Bounded):
        return tp(msgspec.convert(obj, tp.ITEMS, strict=False))
    # as `enc_hook`: the documented answer for a type this hook does not convert (only `Bounded`
    # fields reach it; any other is a field type added without its conversion)
    raise NotImplementedError(f"cannot read a {tp!r}")



class Gaps(Bounded[float]):
    """The newest gaps of one kind, in seconds."""

    MAXLEN: ClassVar[int] = 200
    ITEMS: ClassVar[Any] = list[float]


def _share(hits: int, n: int) -> float:
    return (hits + 0.5) / (n + 1)


def _lower(hits: int, n: int) -> float:
    return wilson_lower(hits / n, n) if n else 0.0


@dataclass
class GapMeter:
    """Gaps between a session's requests, by who spoke next. Part of the compactor's stored state
    (`_state.CompactorState.gaps`), converted with it."""

    tool: Gaps = field(default_factory=Gaps)  # after a tool call
    person: Gaps = field(default_factory=Gaps)  # after a turn ended
    turn_ends: int = 0  # responses that called no tool
    responses: int = 0

    def observe(self, gap_s: float, after_tool_call: bool) -> None:
        """One gap, from a request to the next, and whether the response between called a tool."""
        if gap_s < 0:  # a clock step backwards is no gap
            return
        (self.tool if after_tool_call else self.person).append(gap_s)
        self.responses += 1
        self.turn_ends += not after_tool_call

    def between(self, lo: float = SHORT_TTL_S, hi: float = LONG_TTL_S) -> float:
        """The chance that the gap after the coming response is longer than ``lo`` and at most
        ``hi``: the share of turn ends among responses, times the share of person gaps in that
        range (its lower end), plus the same for tool calls."""
        end = _share(self.turn_ends, self.responses)
        in_person = _lower(sum(1 for g in self.person if lo < g <= hi), len(self.person))
        in_tool = _lower(sum(1 for g in self.tool if lo < g <= hi), len(self.tool))
        return end * in_person + (1 - end) * in_tool

    def returns_after(self, quiet_s: float, ttl_s: float, *, person: bool = True) -> tuple[float, int]:
        """The chance that a session already quiet for ``quiet_s`` seconds stays quiet past
        ``ttl_s``: among its gaps of the kind (a person's, or a tool's) that outlasted ``quiet_s``,
        the share that outlasted ``ttl_s``, as (k + q) / (n + 1), with ``n`` (how many gaps it is
        told by). The one pseudo-gap ``q`` is the share of all its gaps of the kind that outlasted
        ``ttl_s``, (K + 1/2) / (N + 1): half when the session has shown none, nothing assumed either
        way; small when every gap so far was shorter than the TTL, though none was as long as this
        quiet (issue 50: at a flat 1/2 an Opus summary was made for a person who always came back
        in time)."""
        gaps = self.person if person else self.tool
        q = _share(sum(1 for g in gaps if g > ttl_s), len(gaps))
        longer = [g for g in gaps if g > quiet_s]
        return (sum(1 for g in longer if g > ttl_s) + q) / (len(longer) + 1), len(longer)
