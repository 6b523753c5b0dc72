"""When to compact, how far, and whether it pays: triggers and cache economics (pure).

`PolicyConfig` groups the settings (`Triggers`, `Economics`, `LevelSettings`, `Safety`).
Token thresholds are fractions of the window, so one config serves an 8k and a 1M window
alike; `limits` turns a config into token numbers for one request. docs/policy.md derives
every default.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from ..base.errors import PolicyConfigError
from ..base.pricing import UNKNOWN_MODEL_WINDOW, ModelInfo
from ..base.values import Level
from .levels.l1_micro import DEFAULT_WRITE_TOOLS
from .levels.view import PLACEHOLDER_TOKENS

__all__ = [
    "LEVEL_ORDER",
    "MIN_WINDOW_TOKENS",
    "Economics",
    "Economy",
    "LevelSettings",
    "Limits",
    "PolicyConfig",
    "Safety",
    "Trigger",
    "Triggers",
    "TtlChoice",
    "choose_ttls",
    "collapse_hard",
    "economics",
    "evaluate",
    "limits",
    "reach_cap",
    "window_problem",
]

LEVEL_ORDER: tuple[Level, ...] = ("L1", "L2", "L3", "L4", "L5")  # cheapest first
MIN_WINDOW_TOKENS = 8_000
DEFAULT_WRITE_OVER_READ = 12.5  # 5-minute cache write (1.25x input) over cache read (0.1x input)


def _bad(msg: str) -> None:
    raise PolicyConfigError(f"invalid PolicyConfig: {msg}")


def window_problem(w: object) -> str | None:
    """What is wrong with a ``window_tokens`` setting, or None: the one check of every home it is
    given in (wrap(), EngineOptions, PolicyConfig)."""
    if w is not None and (not isinstance(w, int) or isinstance(w, bool) or w < MIN_WINDOW_TOKENS):
        return f"window_tokens must be an integer of at least {MIN_WINDOW_TOKENS}, got {w!r}"
    return None


@dataclass(frozen=True)
class Triggers:
    """Utilization thresholds, as fractions of the usable input (`Limits.limit`).

    ``soft`` is fitted (half A, benchmarks/fit_policy.py); ``hard`` and ``critical`` are derived
    unless set: ``critical`` leaves room for one typical turn of the session (the median growth
    of the recent turns, at least 1% of the limit), and ``hard`` is where a collapse cycle costs
    least by the cache prices (docs/policy.md, "When a collapse fires"), between ``soft`` and one
    typical turn before ``critical``.
    """

    soft: float = 0.80  # L1 from here on; also the target after compacting
    hard: float | None = None  # L3 from here on
    critical: float | None = None  # the window forces L4 (then L5) from here on

    def __post_init__(self) -> None:
        hard = self.hard if self.hard is not None else self.soft + 1e-9
        crit = self.critical if self.critical is not None else max(hard, self.soft) + 1e-9
        if not 0 < self.soft < 1 or not self.soft < hard < crit <= 1:
            _bad(f"need 0 < soft < hard < critical <= 1 (got {self.soft}, {self.hard}, {self.critical})")


@dataclass(frozen=True)
class Economics:
    """The cache-economic gate (see `economics`)."""

    cache_aware: bool = True  # False: apply whatever the triggers ask, ignoring cache economics (and place
    # L3's trigger midway between soft and critical instead of by the prices)
    cache_ttl_s: float = 300.0  # TTL the agent's requests use; an idle gap beyond it means a cold cache
    # (with ``ttl="auto"`` the TTL each request was sent with is used instead)
    ttl: str = "auto"  # "auto": each request's breakpoints get the TTL that pays (`choose_ttls`); or "5m" / "1h"
    min_remaining_turns: int = 5  # expected remaining turns = steps so far, clamped to these bounds
    max_remaining_turns: int = 50
    min_batch_fraction: float = 0.08  # of the window: an edit that breaks a warm cache removes at least this
    mark_compacted: bool = True  # a breakpoint after the part already compacted: the next edit re-writes what follows

    def __post_init__(self) -> None:
        if self.cache_ttl_s <= 0:
            _bad("cache_ttl_s must be positive")
        if self.ttl not in ("auto", "5m", "1h"):
            _bad(f"ttl must be 'auto', '5m' or '1h', got {self.ttl!r}")
        if not 0 <= self.min_remaining_turns <= self.max_remaining_turns:
            _bad("need 0 <= min_remaining_turns <= max_remaining_turns")
        if not 0 <= self.min_batch_fraction < 1:
            _bad("min_batch_fraction must be in [0, 1)")


@dataclass(frozen=True)
class LevelSettings:
    """What each level may touch. Sizes in tokens are fractions of the window."""

    keep_recent_results: int = 3  # every level keeps this many most recent results verbatim ...
    keep_recent_tokens: int = 50_000  # ... and the newest history up to the recent budget: this many tokens
    # until it is learnt from the agent's look-backs (`lookback_coverage`), or always when that is 0 (fitted)
    # a new result is shortened on entry only when it could not stay whole through the next collapse: when it
    # is bigger than this share of what a collapse keeps (the configured recent budget, at most its share of the
    # window). 1.0 is that rule exactly (issue 47: at 0.25 of the budget, fixed 12,500 tokens at any window from
    # 68k up, a 26k-token file was shortened at a 1M window with 3% of it used, on every re-read too)
    big_result_share: float = 1.0
    key_fraction: float = 0.25  # a cleared or shortened result keeps key lines up to this share of its size (fit) ...
    key_max_chars: int = 16_000  # ... and at most this many characters of them (fitted with keep_recent_tokens)
    keep_rounds_l3: int = 8
    keep_rounds_l4: int = 4
    preview_chars: int = 2_000  # L2 keeps this much of the output verbatim
    summary_tokens: int = 1_500  # planning estimate of a summary's size (3/4 of the summarizer's max_tokens)
    working_set_chars: int = 3000  # verbatim lines of old output the agent used: a summary keeps this many
    # characters of them, and a turn gets back at most this many of the hidden ones its calls name (fitted; 0: off)
    lookback_coverage: float = 0.93  # the one knob: the recent budget is learnt to cover this share of the
    # agent's own look-backs (`cachecompact.compaction._lookback`); 0 keeps the configured budget
    miss_rate: float = 0.02  # ... and more where the agent looks back often: at most this share of its turns may
    # look back past the budget (issue 47's bar is 3% of turns re-run; 0: coverage alone)
    write_tools: frozenset[str] = DEFAULT_WRITE_TOOLS
    exempt_tools: frozenset[str] = frozenset()
    is_write: Callable[[str, dict[str, Any]], bool] | None = None
    # L3/L4 summaries written by the API (on-demand compaction) where the model supports it and the
    # summarizer has a client: the kept turns' thinking stays valid (docs/policy.md, "API-written
    # summaries"). "priced": the API's where it costs less than ours plus the reasoning ours throws
    # away (`CacheAwareCompactor._writer_prices`); True: the API's wherever it may; False: always
    # our own summary, with the thinking after it removed
    api_summaries: bool | Literal["priced"] = "priced"
    # L3/L4 summary calls (ours, and the API's) run in the background and land on a later request;
    # only a request at the critical threshold or over it waits for one (docs/policy.md, "Summaries
    # in the background"); False: ours in the foreground, and the next request waits for the API's
    background_summaries: bool = True

    def __post_init__(self) -> None:
        for name in ("keep_recent_results", "keep_rounds_l3", "keep_rounds_l4", "preview_chars", "summary_tokens",
                     "working_set_chars"):
            if getattr(self, name) < 0:
                _bad(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.keep_recent_tokens < 0:
            _bad("keep_recent_tokens must be >= 0")
        if self.api_summaries not in (True, False, "priced"):
            _bad(f"api_summaries must be True, False or 'priced', got {self.api_summaries!r}")
        for name in ("big_result_share", "key_fraction", "lookback_coverage", "miss_rate"):
            if not 0 <= getattr(self, name) <= 1:
                _bad(f"{name} must be in [0, 1], got {getattr(self, name)}")

    @property
    def min_clear_tokens(self) -> int:
        """L1 clears a result only if it is at least 5 placeholders big (the notice costs at most a fifth)."""
        return 5 * PLACEHOLDER_TOKENS

    @property
    def old_result_tokens(self) -> int:
        """L2 shortens an old result only if it is at least 4 previews big (it then saves >= 75%)."""
        return self.preview_chars  # 4 previews of preview_chars / 4 tokens each


@dataclass(frozen=True)
class Safety:
    failure_limit: int = 3  # consecutive failures before the breaker stops summaries
    estimate_error: float = 0.05  # of the window, kept free for token-estimate error

    def __post_init__(self) -> None:
        if self.failure_limit < 1:
            _bad("failure_limit must be at least 1")
        if not 0 <= self.estimate_error < 0.5:
            _bad("estimate_error must be in [0, 0.5)")


@dataclass(frozen=True)
class PolicyConfig:
    """Every setting of the default policy. ``window_tokens=None``: the model's own window."""

    window_tokens: int | None = None
    triggers: Triggers = field(default_factory=Triggers)
    economics: Economics = field(default_factory=Economics)
    levels: LevelSettings = field(default_factory=LevelSettings)
    safety: Safety = field(default_factory=Safety)

    def __post_init__(self) -> None:
        why = window_problem(self.window_tokens)
        if why is not None:
            _bad(why)

    def window_for(self, model: ModelInfo | None) -> int:
        """The window in force: the configured one, else the model's."""
        if self.window_tokens is not None:
            return self.window_tokens
        return model.context_window if model is not None else UNKNOWN_MODEL_WINDOW


@dataclass(frozen=True, slots=True)
class Limits:
    """A config turned into tokens for one request (all API-calibrated estimates)."""

    window: int
    limit: int  # usable input: window - max_tokens - estimate error
    soft: int
    hard: int
    critical: int
    keep_recent: int  # the recent budget every level keeps verbatim: learnt, or configured, within the room
    configured_recent: int  # the configured budget within the room (before the agent's look-backs are known)
    collapse_keep: int  # what L3 keeps after its summary: the recent budget (`keep_recent`)
    big_result: int  # a new result over this is shortened on entry: it could not stay whole through a collapse
    old_result: int
    min_batch: int
    room: int = 0  # what the window holds below ``soft`` beside the prefix and a summary: a re-run fits in it
    max_tokens: int = 0  # the output the request reserves
    estimate_error: float = 0.0  # the share of the window kept for estimate error
    target: int = 0  # what compacting aims under: soft, or the bottom of a collapse cycle that fits below it

    def aim(self) -> int:
        return self.target or self.soft

    def window_for(self, tokens: int) -> int:
        """The smallest window in which ``tokens`` of input fit beside this request's output
        reserve and estimate margin."""
        return -(-(tokens + max(0, self.max_tokens)) * 1000 // max(1, round(1000 * (1 - self.estimate_error))))


def limits(cfg: PolicyConfig, window: int, max_tokens: int, prefix_tokens: int = 0, growth: int = 0,
           recent_tokens: int | None = None, write_over_read: float = DEFAULT_WRITE_OVER_READ,
           estimate_error: float | None = None) -> Limits:
    """Token thresholds for a request with this window and ``max_tokens`` (the output must fit too);
    ``prefix_tokens`` is what the immutable prefix takes, which no compaction can free,
    ``growth`` the most one turn has added lately, and ``recent_tokens`` the recent budget learnt
    from the agent's look-backs (`cachecompact.compaction._lookback`; None: the configured one),
    which every level keeps verbatim. ``write_over_read`` is the model's cache-write price over
    its cache-read price, which places ``hard``. ``estimate_error`` is the share of the window kept
    free for the token estimate's error (None: the configured one, `Safety.estimate_error`)."""
    margin = cfg.safety.estimate_error if estimate_error is None else estimate_error
    reserve = int(margin * window) + max(0, max_tokens)
    limit = max(window // 4, window - reserve)  # a max_tokens near the window leaves a quarter for input
    t, lv = cfg.triggers, cfg.levels
    soft = int(t.soft * limit)
    step = max(growth, limit // 100)  # one typical turn
    critical = max(soft + 2, int(t.critical * limit) if t.critical is not None else limit - step)
    room = max(0, soft - prefix_tokens - lv.summary_tokens)  # after compacting to the target: prefix, summary, tail
    configured = min(lv.keep_recent_tokens, room)
    cap = reach_cap(critical, prefix_tokens, lv.summary_tokens, step)
    if recent_tokens is not None:  # what the agent has shown it comes back to: capped by the window only (issue 63)
        keep = collapse_keep = min(recent_tokens, cap)
    elif lv.lookback_coverage <= 0:  # a budget the user fixed (`recent_tokens`): kept as given, up to the window
        keep = collapse_keep = min(lv.keep_recent_tokens, cap)
    else:  # the configured budget before any look-back: a guess, within the room below soft (no share
        # of the window caps it further: `collapse_keep_share` did, and measured nothing, issue 63)
        keep = collapse_keep = configured
    if t.hard is not None:  # as set, but strictly between soft and critical after rounding
        hard = min(critical - 1, max(soft + 1, int(t.hard * limit)))
    elif not cfg.economics.cache_aware:
        hard = (soft + critical) // 2  # the price-blind rule, for the ablation
    else:
        kept = collapse_keep + lv.summary_tokens
        turn = growth or step  # the session's own growth once it has shown one: the window is a cap
        hard = collapse_hard(prefix_tokens, kept, turn, write_over_read,
                             low=min(soft + 1, prefix_tokens + kept + turn), high=critical - step)
    # one break must remove at least a fraction of the window, and never more than a collapse
    # cycle's growth (else at a large window nothing could ever be cleared before L3)
    min_batch = int(cfg.economics.min_batch_fraction * window)
    if cfg.economics.cache_aware and t.hard is None:
        min_batch = min(min_batch, max(0, hard - prefix_tokens - collapse_keep - lv.summary_tokens))
    # a collapse cycle that fits below soft (a large window): compacting aims at its bottom, what
    # a collapse keeps plus one turn; else at soft, as the window decides
    bottom = prefix_tokens + collapse_keep + lv.summary_tokens + (growth or step)
    target = soft if hard > soft else min(soft, bottom)
    return Limits(window=window, limit=limit, soft=soft, hard=hard, critical=critical, target=target,
                  keep_recent=keep, configured_recent=configured, collapse_keep=collapse_keep,
                  # a result too big to carry whole through a collapse is judged by the configured budget: the
                  # learnt one says how far back the agent looks, not what it must see once
                  big_result=max(lv.old_result_tokens,
                                 int(lv.big_result_share * configured)),
                  room=room,
                  old_result=lv.old_result_tokens, min_batch=min_batch,
                  max_tokens=max_tokens, estimate_error=margin)


def reach_cap(critical: int, prefix: int, summary: int, turn: int) -> int:
    """The most a compaction can keep verbatim: what the window holds below ``critical`` beside
    the prefix, a summary and one turn. Only this caps a budget the agent's look-backs asked for
    (issue 63: capping it at the room below ``soft``, 18k at 40k where the agent needed 21.6k, or
    at half the window, 100k at 200k where it needed 101k, hid its working set although the
    window held it)."""
    return max(0, critical - prefix - summary - turn)


def collapse_hard(prefix: int, kept: int, step: int, write_over_read: float, *, low: int, high: int) -> int:
    """Where L3 should fire. A collapse re-writes what it keeps after the prefix (``kept``:
    summary and tail) once per cycle, at w - r more than reading it; every turn reads the
    context. Over a cycle of ``c`` tokens of growth at ``step`` tokens a turn, the cost per turn
    is about r*(prefix + kept + c/2) + (w - r)*kept*step/c, least at
    c = sqrt(2*(w/r - 1)*kept*step). Clamped to [``low``, ``high``]: not before L1 may act, and
    one turn before the window forces L4."""
    premium = write_over_read - 1 if math.isfinite(write_over_read) else DEFAULT_WRITE_OVER_READ - 1
    cycle = math.sqrt(2 * max(0.0, premium) * max(0, kept) * max(1, step))
    return max(low, min(high, prefix + kept + int(cycle)))


@dataclass(frozen=True, slots=True)
class Trigger:
    """Why compaction runs this turn, and the highest level it may use."""

    max_level: str | None
    reason: str
    forced: bool = False  # the window forces it: cache economics do not apply
    cold: bool = False  # the cache expired: the next request re-writes everything anyway, so cut the most
    fallback: str | None = None  # for a cold cut: the level the thresholds alone allow, if no cut is a batch
    min_removed: int = 0  # a plan that removes fewer tokens is not worth it now (a look-ahead, not a need)


def evaluate(lim: Limits, *, tokens: int, old_tool_tokens: int) -> Trigger:
    """The triggers; ``tokens`` is the API-calibrated estimate of the next request and
    ``old_tool_tokens`` the tool calls and output beyond the recent budget (what L1/L2 could clear)."""
    u = tokens / lim.limit
    if tokens >= lim.critical:
        return Trigger("L4", f"utilization {u:.2f} >= critical {lim.critical / lim.limit:.2f}", forced=True)
    if tokens >= lim.hard:
        return Trigger("L3", f"utilization {u:.2f} >= hard {lim.hard / lim.limit:.2f}")
    if tokens >= lim.soft:
        return Trigger("L1", f"utilization {u:.2f} >= soft {lim.soft / lim.limit:.2f}")
    if old_tool_tokens >= max(1, lim.min_batch):
        return Trigger("L2", f"{old_tool_tokens} tokens of tool calls and output older than the recent budget "
                             f"({lim.keep_recent} tokens)")
    return Trigger(None, f"utilization {u:.2f}: nothing to do")


@dataclass(frozen=True, slots=True)
class Economy:
    """Dollars: what an edit costs now (cache re-write, summary call) and saves later."""

    rewrite_cost: float
    saving_per_turn: float
    remaining_turns: int
    summary_cost: float = 0.0
    # the reasoning the edit throws away: the thinking of the turns of the task under way that it
    # invalidates (preserved thinking), priced as producing it again, at the output price
    reasoning_cost: float = 0.0

    @property
    def net(self) -> float:
        return (self.saving_per_turn * self.remaining_turns - self.rewrite_cost - self.summary_cost
                - self.reasoning_cost)

    @property
    def pays(self) -> bool:
        return self.net > 0

    @property
    def cost_now(self) -> float:
        """What making the edit costs at once, its later savings apart: the re-write, the summary
        and the reasoning it throws away (what an idle edit costs on an early return, `compaction.idle`)."""
        return self.rewrite_cost + self.summary_cost + self.reasoning_cost


def economics(cfg: PolicyConfig, price: ModelInfo, *, removed: int, suffix: int, steps: int, cold: bool,
              summary_cost: float = 0.0, ttl: str = "5m", reasoning_tokens: int = 0) -> Economy:
    """The cache model of docs/policy.md.

    Without the edit the next request reads the ``suffix`` (tokens from the edit point to the
    end) from cache; with it, ``suffix - removed`` is written instead. From then on every turn
    reads ``removed`` fewer tokens. A cold cache is re-written anyway, so the edit is free of
    re-writes. ``reasoning_tokens`` is the thinking the edit invalidates in the turns of the task under
    way (preserved thinking: docs/policy.md, *The reasoning an edit throws away*), priced at the output
    price, cold or not.
    """
    write = price.write_1h if ttl == "1h" else price.write_5m
    rewrite = 0.0 if cold else max(0.0, ((suffix - removed) * write - suffix * price.read) / 1e6)
    e = cfg.economics
    remaining = max(e.min_remaining_turns, min(e.max_remaining_turns, steps))
    # a cold cache is re-written anyway, but the reasoning is lost all the same
    return Economy(rewrite, removed * price.read / 1e6, remaining, summary_cost, reasoning_tokens * price.output / 1e6)


@dataclass(frozen=True, slots=True)
class TtlChoice:
    """The TTL of the prefix's breakpoint and of the others, and what the choice is worth."""

    prefix: str
    rest: str
    net_usd: float  # expected saving against every breakpoint at 5 minutes (>= 0)


def choose_ttls(price: ModelInfo, *, p_between: float, prefix_tokens: int, total_tokens: int,
                prefix_written: int, rest_written: int) -> TtlChoice:
    """Which breakpoints get the 1-hour TTL (docs/policy.md, "Which TTL").

    A breakpoint at 1 hour costs ``write_1h - write_5m`` more on each token this request writes
    up to it. It pays when the next gap outlives five minutes but not an hour (``p_between``,
    from `cachecompact.compaction._gaps.GapMeter`): the next request then reads those tokens instead of
    writing them again, ``write_5m - read`` less each. A 1-hour breakpoint may not follow a
    5-minute one, so there are three choices: none, the prefix's alone, or all of them.
    ``prefix_written`` and ``rest_written`` are what this request writes before and after the
    prefix's breakpoint. Prices are the model's own, for a prompt of this size."""
    p = price.at(total_tokens)
    extra = max(0.0, p.write_1h - p.write_5m) / 1e6
    saved = max(0.0, p.write_5m - p.read) / 1e6
    q = min(1.0, max(0.0, p_between))
    net_prefix = q * prefix_tokens * saved - extra * prefix_written
    net_all = q * total_tokens * saved - extra * (prefix_written + rest_written)
    if net_all > 0 and net_all >= net_prefix:
        return TtlChoice("1h", "1h", net_all)
    if net_prefix > 0:
        return TtlChoice("1h", "5m", net_prefix)
    return TtlChoice("5m", "5m", 0.0)
