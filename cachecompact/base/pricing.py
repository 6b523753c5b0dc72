"""Per-model prices, cache minimums, windows and tokenizer families (Anthropic's model pages).

Prices are dollars per million tokens. Every entry names its source. Model ids with a date
suffix (``claude-sonnet-4-20250514``) resolve to the same entry. `model_prices` is what the
runtime uses: a model missing from the table gets its family's newest entry (one warning per
id), so a new model id never disables compaction. Every value can be overridden with
`register_model` or `override`.

Tokenizers: from Opus 4.7 on (Sonnet 5.x, Fable and Mythos 5.x included) Claude uses a
tokenizer that counts about 30% more tokens for the same text [TC]. `ModelInfo.token_ratio`
is that family's ratio to tiktoken's cl100k, the starting point of token estimates before
calibration against reported usage refines them; the emulator bills with the same ratio.
"""

from __future__ import annotations

import difflib
import functools
import logging
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from datetime import UTC, datetime
from typing import Any

from .errors import ConfigError, UnknownModelError

__all__ = [
    "DEFAULT_PRICE_MODEL",
    "DEFAULT_SUMMARY_MODEL",
    "FAMILIES",
    "ONDEMAND_COMPACTION_MODELS",
    "UNKNOWN_MODEL_WINDOW",
    "ModelInfo",
    "OwnPrices",
    "billed_tokens",
    "get_model",
    "known_models",
    "model_prices",
    "model_window",
    "override",
    "own_prices",
    "priced",
    "register_model",
]

log = logging.getLogger("cachecompact")

NEW_TOKENIZER_RATIO = 1.3  # "approximately 30 percent more tokens than on earlier models" [TC]


@dataclass(frozen=True, slots=True)
class ModelInfo:
    name: str
    input: float  # $ / MTok
    write_5m: float
    write_1h: float
    read: float
    output: float
    min_cacheable: int  # tokens; shorter prefixes are not cached and no error is returned
    context_window: int
    max_output: int
    family: str  # opus | sonnet | haiku | fable | mythos
    token_ratio: float  # API tokens per cl100k token, before calibration
    forced_tool_ok: bool  # tool_choice {"type": "tool"|"any"} is accepted
    source: str  # where the numbers come from
    # a prompt (input + cache reads + cache writes) over ``long_prompt`` tokens pays every price
    # times ``long_scale``, on every token of that request, output included (Haiku 5.5's tiers)
    long_prompt: int = 0  # 0: one tier
    long_scale: float = 1.0
    # prices that changed: (ISO date, field, the value before that date), oldest first
    earlier: tuple[tuple[str, str, float], ...] = ()

    def __post_init__(self) -> None:
        for f in ("input", "write_5m", "write_1h", "read", "output"):
            if getattr(self, f) < 0:
                raise ValueError(f"{self.name}: {f} price must be >= 0")
        if self.min_cacheable < 0 or self.context_window <= 0 or self.max_output <= 0 or self.token_ratio <= 0:
            raise ValueError(f"{self.name}: token limits and the token ratio must be positive")
        if not self.source:
            raise ValueError(f"{self.name}: every price entry names its source")
        if self.long_prompt < 0 or self.long_scale <= 0:
            raise ValueError(f"{self.name}: long_prompt must be >= 0 and long_scale positive")

    @property
    def read_share(self) -> float:
        """The cache read's price as a share of the input price (0.1, 0.05, 0.025 ...)."""
        return self.read / self.input if self.input > 0 else 0.1

    def write_price(self, ttl: str = "5m") -> float:
        """$ per MTok of a cache write with this TTL ("5m" or "1h")."""
        return self.write_1h if ttl == "1h" else self.write_5m

    def write_over_read(self, ttl: str = "5m") -> float:
        """What a written token costs over a read one, for this TTL: every "does this edit pay"
        decision and the collapse cycle depend on it, and it differs by model (12.5 for a
        5-minute write at a 0.1x read, 50 at 0.025x; 20 and 80 for the 1-hour write)."""
        return self.write_price(ttl) / self.read if self.read > 0 else float("inf")

    def at(self, prompt_tokens: int) -> ModelInfo:
        """The prices in force for a prompt of this many tokens (the higher tier past
        ``long_prompt``)."""
        if not self.long_prompt or prompt_tokens <= self.long_prompt:
            return self
        k = self.long_scale
        return replace(self, input=self.input * k, write_5m=self.write_5m * k, write_1h=self.write_1h * k,
                       read=self.read * k, output=self.output * k, long_prompt=0)

    def as_of(self, when: float | None) -> ModelInfo:
        """The prices in force at a unix time (a recorded log's), by ``earlier``; now for None."""
        if when is None or not self.earlier:
            return self
        day = datetime.fromtimestamp(when, UTC).date().isoformat()
        changes: dict[str, Any] = {f: v for date, f, v in reversed(self.earlier) if day < date}
        return replace(self, **changes) if changes else self

    def cost(self, usage: dict[str, Any]) -> float:
        """Dollars for one response's usage (cache_creation split used when present). A response
        with ``iterations`` (server compaction: a summarization step before the answer) is billed
        as their sum: the top level reports the last message step alone (anthropic-cache-facts.md
        §3.4)."""
        its = usage.get("iterations")
        if isinstance(its, list) and its:
            return sum(self._one(it) for it in its if isinstance(it, dict))
        return self._one(usage)

    def _one(self, usage: dict[str, Any]) -> float:
        cc = usage.get("cache_creation") or {}
        w1h = int(cc.get("ephemeral_1h_input_tokens") or 0)
        w5m = int(cc.get("ephemeral_5m_input_tokens") or 0)
        total_w = int(usage.get("cache_creation_input_tokens") or 0)
        if not cc:
            w5m = total_w
        inp, read = int(usage.get("input_tokens") or 0), int(usage.get("cache_read_input_tokens") or 0)
        p = self.at(inp + read + max(total_w, w5m + w1h))
        return (inp * p.input + w5m * p.write_5m + w1h * p.write_1h + read * p.read
                + int(usage.get("output_tokens") or 0) * p.output) / 1e6


_BILLED = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "output_tokens")


def billed_tokens(usage: Mapping[str, Any]) -> dict[str, int]:
    """The tokens a response's usage was billed for, input, cache writes and reads, output: its top level, or, when
    the top level counts none and ``iterations`` does, the iterations summed. An on-demand
    compaction call (and a server compaction that paused) answers with a top level of zeros and
    its cost in a ``compaction`` entry of ``usage.iterations`` (anthropic-cache-facts.md §3.5):
    a report row shows these beside the cost, not the zeros."""
    top = {k: int(usage.get(k) or 0) for k in _BILLED}
    its = [it for it in usage.get("iterations") or () if isinstance(it, Mapping)]
    if any(top.values()) or not its:
        return top
    return {k: sum(int(it.get(k) or 0) for it in its) for k in _BILLED}


M, K = 1_000_000, 1000
# Sources, checked against the stored docs on 2026-12-01 (docs/cache-model.md, "Price table"):
PR = "platform.claude.com/docs/en/about-claude/pricing"
MP = "platform.claude.com/docs/{lang}/models/{model}/overview"
LL = "docs.litellm.ai/docs/completion/prompt_caching (2026-10-07), secondary"


def _m(name: str, base_in: float, out: float, minimum: int, window: int, max_out: int, family: str, *,
       read: float | None = None, new_tok: bool = False, forced_tool_ok: bool = True, source: str = PR,
       **more: Any) -> ModelInfo:
    """An entry whose writes follow the documented multipliers (5m 1.25x, 1h 2x of input); the
    read is 0.1x of input unless the model's own price is given (0.05x, 0.025x ...)."""
    return ModelInfo(name, base_in, base_in * 1.25, base_in * 2, base_in * 0.1 if read is None else read, out,
                     min_cacheable=minimum, context_window=window, max_output=max_out, family=family,
                     token_ratio=NEW_TOKENIZER_RATIO if new_tok else 1.0, forced_tool_ok=forced_tool_ok, source=source,
                     **more)


# (u) marks a value no source states: the minimum cacheable lengths of the 5.5 and 5.2 models
# (the family's nearest documented value is used) and Haiku 5.5's forced tool use (assumed
# accepted; the summarizer falls back to its in-text form on the API's 400).
_TABLE: dict[str, ModelInfo] = {m.name: m for m in [
    # current lineup
    _m("claude-sonnet-5-5", 2.0, 10.0, 1024, M, 128 * K, "sonnet", read=0.10, new_tok=True, forced_tool_ok=False,
       earlier=(("2026-10-07", "read", 0.20),),
       source=MP.format(lang="zh-CN", model="sonnet-5-5") + ": $2/$10, 5m $2.50, 1h $4, 1M/128K; whats-new-sonnet-"
              "5-5: forced tool use returns an error; read $0.20 until 2026-10-07, then $0.10 (0.05x): secondary, "
              "kurofune/claudit v1.9.2, TheKrush/PromptFuel v1.0.23, mahype/token-stats v0.3.2 (the stored model "
              "page predates the cut); minimum (u) = Sonnet 5's 1024"),
    _m("claude-opus-5-5", 4.0, 20.0, 512, M, 128 * K, "opus", read=0.20, new_tok=True, forced_tool_ok=False,
       source=MP.format(lang="zh-CN", model="opus-5-5") + ": $4/$20, 5m $5, 1h $8, read $0.20 (0.05x), 1M/128K; "
              "whats-new-opus-5-5: forced tool use returns an error; minimum (u) = Opus 5's 512"),
    _m("claude-haiku-5-5", 0.10, 0.50, 1024, M, 128 * K, "haiku", read=0.01, new_tok=True,
       long_prompt=100 * K, long_scale=5.0,
       source=MP.format(lang="zh-CN", model="haiku-5-5") + " and haiku-5-5/overview (released 2026-10-07, 1M/128K, "
              "the newer tokenizer): $0.10 in / $0.125 5m / $0.20 1h / $0.50 out up to 100,000 prompt tokens, "
              "$0.50 / $0.625 / $2.50 over; reads $0.01 / $0.05 and the 1h write over 100k ($1.00) secondary "
              "(claudit v1.9.2, archid21/rightsize v0.9.0); the higher tier bills every token of the request "
              "(secondary, same); minimum (u) = 1024; forced tool use (u)"),
    _m("claude-fable-5-2", 8.0, 40.0, 512, M, 128 * K, "fable", read=0.20, new_tok=True, forced_tool_ok=False,
       source="platform.claude.com/docs/id/models/sonnet-5/overview (lineup: $8/$40, 1M/128K); fable-5-2/whats-"
              "new; read $0.20 (0.025x), 5m $10, 1h $16: secondary (docs.laozhang.ai, docs.apiyi.com, rightsize "
              "v0.10.2); forced tool use refused as on 5.1 (secondary, qiita kai_kou); minimum (u) = 5.1's 512"),
    _m("claude-mythos-5-2", 8.0, 40.0, 512, M, 128 * K, "mythos", read=0.20, new_tok=True, forced_tool_ok=False,
       source="fable-5-2/whats-new: Mythos 5.2 at Fable 5.2's specs; prices as Fable 5.2 (secondary)"),
    _m("claude-haiku-4-5", 1.0, 5.0, 4096, 200 * K, 64 * K, "haiku",
       source=PR + "; " + MP.format(lang="en", model="opus-5") + " (lineup: 200K/64K); minimum: " + LL),
    # earlier models still served
    _m("claude-opus-5", 5.0, 25.0, 512, M, 128 * K, "opus", new_tok=True,
       source=PR + "; " + MP.format(lang="en", model="opus-5") + "; minimum: anthropic-cache-facts.md 1.4, " + LL),
    _m("claude-opus-4-8", 5.0, 25.0, 1024, M, 128 * K, "opus", new_tok=True,
       source=PR + "; " + MP.format(lang="de", model="opus-4-8")),
    _m("claude-opus-4-7", 5.0, 25.0, 2048, M, 128 * K, "opus", new_tok=True,
       source=PR + "; window: AWS Bedrock model card (secondary); minimum 2048 per anthropic-cache-facts.md 1.4 "
              "(LiteLLM's Bedrock row says 4096: disputed)"),
    _m("claude-opus-4-6", 5.0, 25.0, 4096, M, 128 * K, "opus",
       source=PR + "; " + MP.format(lang="en", model="opus-4-6")),
    _m("claude-opus-4-5", 5.0, 25.0, 4096, 200 * K, 64 * K, "opus"),
    _m("claude-opus-4-1", 15.0, 75.0, 1024, 200 * K, 32 * K, "opus"),
    _m("claude-opus-4", 15.0, 75.0, 1024, 200 * K, 32 * K, "opus"),
    _m("claude-sonnet-5", 2.0, 10.0, 1024, M, 128 * K, "sonnet", new_tok=True,
       source=PR + "; " + MP.format(lang="zh-CN", model="sonnet-5")),
    _m("claude-sonnet-4-6", 3.0, 15.0, 1024, M, 128 * K, "sonnet",
       source=PR + "; " + MP.format(lang="zh-CN", model="sonnet-4-6") + " (1M/128K)"),
    _m("claude-sonnet-4-5", 3.0, 15.0, 1024, 200 * K, 64 * K, "sonnet"),
    _m("claude-sonnet-4", 3.0, 15.0, 1024, 200 * K, 64 * K, "sonnet"),
    _m("claude-haiku-3-5", 0.80, 4.0, 2048, 200 * K, 8192, "haiku"),
    _m("claude-fable-5-1", 10.0, 50.0, 512, M, 128 * K, "fable", read=0.25, new_tok=True, forced_tool_ok=False,
       source=PR + " (read $0.25, 0.025x); fable-5-1/whats-new and migration-guide: forced tool use returns a 400"),
    _m("claude-mythos-5-1", 10.0, 50.0, 512, M, 128 * K, "mythos", read=0.25, new_tok=True, forced_tool_ok=False,
       source=PR + " (read $0.25, 0.025x); fable-5-1/whats-new: forced tool use returns a 400 on Mythos 5.1 too"),
    _m("claude-fable-5", 10.0, 50.0, 512, M, 128 * K, "fable", read=1.0, new_tok=True),
    _m("claude-mythos-5", 10.0, 50.0, 512, M, 128 * K, "mythos", read=1.0, new_tok=True),
]}
# the newest entry of each family: what an unknown id of that family is priced as
FAMILIES = {"sonnet": "claude-sonnet-5-5", "opus": "claude-opus-5-5", "haiku": "claude-haiku-5-5",
            "fable": "claude-fable-5-2", "mythos": "claude-mythos-5-2"}
# the cheapest current model that summarises well enough (docs/policy.md, "Summaries"): a
# 1M window takes any range, and it reads and writes at a tenth of Haiku 4.5's prices
UNKNOWN_MODEL_WINDOW = 200_000  # assumed for a model of no known family: the smallest window of current models
DEFAULT_SUMMARY_MODEL = "claude-haiku-5-5"
# On-demand compaction (the ``compaction`` parameter, beta compact-2026-09-04): the models the
# compaction-thinking-blocks and compaction-on-demand pages list. Fable 5.2 and Mythos 5.2 are on
# no list we can read (the pages may be stale; anthropic-cache-facts.md, addendum 2026-12-04) and
# are taken as supported: a refusal makes the client summarize instead, so trying costs one 400.
ONDEMAND_COMPACTION_MODELS = frozenset({
    "claude-fable-5", "claude-fable-5-1", "claude-mythos-5", "claude-mythos-5-1", "claude-mythos-preview",
    "claude-opus-5-5", "claude-opus-5", "claude-sonnet-5-5", "claude-sonnet-5", "claude-haiku-5-5",
    "claude-opus-4-8", "claude-opus-4-7", "claude-opus-4-6", "claude-sonnet-4-6", "claude-fable-5-2",
    "claude-mythos-5-2"})
# The models with preserved thinking: they think adaptively by default and bind each thinking block to
# everything before it (the prefix-checks page's supportedModels; docs/cache-model.md, *Preserved thinking*)
PRESERVED_THINKING = frozenset({"claude-fable-5-2", "claude-mythos-5-2", "claude-fable-5-1", "claude-mythos-5-1",
                                "claude-opus-5-5", "claude-sonnet-5-5", "claude-haiku-5-5"})
_ALIASES = {"claude-3-5-haiku": "claude-haiku-3-5", "claude-opus-4-0": "claude-opus-4",
            "claude-sonnet-4-0": "claude-sonnet-4"}
_LOCK = threading.Lock()
_DATE = re.compile(r"-(\d{8}|latest)$")
_WARNED: set[str] = set()
REQUIRED_FIELDS = tuple(f.name for f in fields(ModelInfo))


@functools.lru_cache(maxsize=4096)  # pure, and asked several times per request by the proxy's analysis
def _spelling(model: str) -> str:
    """The id without case, date suffix or Claude Code's ``[1m]``: pure, so it may be cached."""
    name = _DATE.sub("", model.strip().lower())
    return re.sub(r"\[1m\]$", "", name)  # Claude Code's 1M-context spelling


def _canonical(model: str) -> str:
    # the alias is looked up on every call, never cached: an alias registered after a failed
    # lookup must take effect at once
    name = _spelling(model)
    return _ALIASES.get(name, name)


def canonical_id(model: str) -> str:
    """``model`` as the table spells it (lower case, no date suffix, no ``[1m]``, aliases resolved),
    whether or not the table lists it."""
    return _canonical(model)


# A client's own entries (``wrap(pricing=...)``), keyed by canonical id, looked up before the
# table; they apply to that client alone, never to the process.
OwnPrices = Mapping[str, "ModelInfo"]


def own_prices(pricing: Mapping[str, Mapping[str, Any]] | None) -> dict[str, ModelInfo]:
    """``wrap(pricing={id: {"input": ..., "output": ...}})`` as entries keyed by canonical id."""
    if pricing is None:
        return {}
    if not isinstance(pricing, Mapping):
        raise ConfigError(f"pricing must map model ids to their prices, got {type(pricing).__name__}")
    out = {}
    for name, prices in pricing.items():
        info = custom(str(name), prices)
        out[info.name] = info
    return out


def get_model(model: str, own: OwnPrices | None = None) -> ModelInfo:
    """The entry for an exact model id, an alias or a dated id of one (``-20261001``,
    ``-latest``, Claude Code's ``[1m]``); `UnknownModelError` naming the nearest ids otherwise.
    No family guess: ``claude-sonnet-4.6`` is not ``claude-sonnet-4-6``. ``own`` entries (a
    client's ``pricing=``) come first."""
    key = _canonical(model)
    info = own.get(key) if own else None
    if info is None:
        info = _TABLE.get(key)
    if info is None:
        name = _canonical(str(model))
        near = difflib.get_close_matches(name, [*(own or {}), *_TABLE, *_ALIASES], n=3, cutoff=0.6)
        raise UnknownModelError(f"unknown model {str(model)[:80]!r}: not an id of the price table"
                                + (f"; nearest: {', '.join(near)}" if near else f"; known: {', '.join(sorted(_TABLE))}")
                                + "; to price it on purpose give its prices (wrap(pricing={id: {'input': ..., "
                                  "'output': ...}}), the command line's --model-prices FILE, or "
                                  "cachecompact.base.pricing.register_model)")
    return info


def custom(name: str, prices: Mapping[str, Any]) -> ModelInfo:
    """An entry for a model the table does not list, from the prices a user gives ($ per MTok):
    ``input`` and ``output`` are required; the writes and the read default to the documented
    multipliers (1.25x, 2x, 0.1x of input); ``context_window``, ``max_output`` and
    ``min_cacheable`` default to 200k, 64k and 1,024 tokens."""
    if not isinstance(prices, Mapping):
        raise ConfigError(f"pricing[{name!r}] must be a mapping of prices, got {type(prices).__name__}")
    known = {"input", "output", "write_5m", "write_1h", "read", "context_window", "max_output", "min_cacheable"}
    extra = sorted(set(prices) - known)
    if extra or "input" not in prices or "output" not in prices:
        raise ConfigError(f"pricing[{name!r}]: give input and output ($ per MTok), optionally "
                          f"{', '.join(sorted(known - {'input', 'output'}))}" + (f"; unknown: {', '.join(extra)}"
                                                                                if extra else ""))
    try:
        base = float(prices["input"])
        return ModelInfo(
            name=_canonical(name), input=base, write_5m=float(prices.get("write_5m", base * 1.25)),
            write_1h=float(prices.get("write_1h", base * 2)), read=float(prices.get("read", base * 0.1)),
            output=float(prices["output"]), min_cacheable=int(prices.get("min_cacheable", 1024)),
            context_window=int(prices.get("context_window", 200 * K)), max_output=int(prices.get("max_output", 64 * K)),
            family="custom", token_ratio=1.0, forced_tool_ok=True, source="given by the user")
    except (TypeError, ValueError) as err:
        raise ConfigError(f"pricing[{name!r}]: {err}") from None


def model_prices(model: str, default: str | None = None, own: OwnPrices | None = None) -> ModelInfo:
    """`get_model`, or for an id missing from the table the newest entry of its family, or else
    ``default``'s prices (a warning, once per id). Raises `UnknownModelError` only when no family
    can be recognised and no ``default`` is given."""
    try:
        return get_model(model, own)
    except UnknownModelError:
        name = _canonical(model)
        fam = next((f for f in FAMILIES if f in name), None)
        if fam is None and default is None:
            raise
        base = get_model(FAMILIES[fam] if fam is not None else str(default))
        with _LOCK:
            if name not in _WARNED:
                _WARNED.add(name)
                log.warning("cachecompact: model %r is not in the price table; using %s prices (register_model() an "
                            "entry to fix this)", model, base.name)
        return replace(base, name=name)


DEFAULT_PRICE_MODEL = "claude-sonnet-4-6"  # a request that names no model, or one of no known family


def priced(model: str, own: OwnPrices | None = None) -> ModelInfo:
    """What the runtime prices a request by: `model_prices`, and for a name of no known family
    (or none) `DEFAULT_PRICE_MODEL`'s entry, with one warning per name. Pricing never stops a
    request: every decision then uses that entry's own write and read prices."""
    return model_prices(model or DEFAULT_PRICE_MODEL, default=DEFAULT_PRICE_MODEL, own=own)


def register_model(info: ModelInfo, *aliases: str) -> None:
    """Add or replace a model entry for the whole process (the command line's ``--model-prices``);
    ``wrap(pricing=...)`` prices for one client only."""
    with _LOCK:
        _TABLE[_canonical(info.name)] = info
        for a in aliases:
            _ALIASES[_canonical(a)] = _canonical(info.name)


def override(model: str, **changes: Any) -> ModelInfo:
    """Change some fields of an existing entry, e.g. ``override("claude-sonnet-4-6", read=0.25)``."""
    info = replace(get_model(model), **changes)
    register_model(info)
    return info


def known_models() -> list[str]:
    """Every model id in the table (the CLI lists them in its errors)."""
    return sorted(_TABLE)


_UNKNOWN_WARNED: set[str] = set()  # models whose window was assumed, said once each


def model_window(model: str, own: OwnPrices | None = None) -> int:
    """The model's context window from the price table (its family's for a newer id); for a name
    of no known family, `UNKNOWN_MODEL_WINDOW`, said once per name."""
    try:
        return model_prices(model, own=own).context_window if model else UNKNOWN_MODEL_WINDOW
    except UnknownModelError:
        if model not in _UNKNOWN_WARNED:
            _UNKNOWN_WARNED.add(model)
            log.warning("cachecompact: model %r is not in the price table; assuming a %d-token context window "
                        "(pass window_tokens=... to set it)", model, UNKNOWN_MODEL_WINDOW)
        return UNKNOWN_MODEL_WINDOW
