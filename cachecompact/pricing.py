"""Per-model prices, cache minimums, windows and tokenizer families (Anthropic's model pages).

Prices are dollars per million tokens. Every entry names its source. Model ids with a date
suffix (``claude-sonnet-4-20250514``) resolve to the same entry. `model_prices` is what the
runtime uses: a model missing from the table gets its family's newest entry (one warning per
id), so a new model id never disables compaction. Every value can be overridden with
`register` or `override`.

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
from typing import Any

from .errors import ConfigError, UnknownModelError

__all__ = ["DEFAULT_PRICE_MODEL", "FAMILIES", "ModelInfo", "get_model", "known_models", "model_prices", "override",
           "priced", "register"]

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

    def __post_init__(self) -> None:
        for f in ("input", "write_5m", "write_1h", "read", "output"):
            if getattr(self, f) < 0:
                raise ValueError(f"{self.name}: {f} price must be >= 0")
        if self.min_cacheable < 0 or self.context_window <= 0 or self.max_output <= 0 or self.token_ratio <= 0:
            raise ValueError(f"{self.name}: token limits and the token ratio must be positive")
        if not self.source:
            raise ValueError(f"{self.name}: every price entry names its source")

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
        return (int(usage.get("input_tokens") or 0) * self.input
                + w5m * self.write_5m + w1h * self.write_1h
                + int(usage.get("cache_read_input_tokens") or 0) * self.read
                + int(usage.get("output_tokens") or 0) * self.output) / 1e6


M, K = 1_000_000, 1000
PC = "platform.claude.com/docs/en/about-claude/pricing and build-with-claude/prompt-caching (late 2026)"
MP = "platform.claude.com/docs/en/about-claude/models (model pages, November 2026)"


def _m(name: str, base_in: float, out: float, minimum: int, window: int, max_out: int, family: str, *,
       read: float | None = None, new_tok: bool = False, forced_tool_ok: bool = True, source: str = PC) -> ModelInfo:
    """An entry priced by the documented multipliers: 5m write 1.25x, 1h write 2x, read 0.1x input."""
    return ModelInfo(name, base_in, base_in * 1.25, base_in * 2, base_in * 0.1 if read is None else read, out,
                     min_cacheable=minimum, context_window=window, max_output=max_out, family=family,
                     token_ratio=NEW_TOKENIZER_RATIO if new_tok else 1.0, forced_tool_ok=forced_tool_ok, source=source)


# Minimum cacheable lengths marked (u) are not on any page yet (UNCONFIRMED): the family's
# nearest documented value is used; docs/cache-model.md lists them.
_TABLE: dict[str, ModelInfo] = {m.name: m for m in [
    # current lineup (model pages, November 2026)
    _m("claude-sonnet-5-5", 2.0, 10.0, 1024, M, 128 * K, "sonnet", new_tok=True, forced_tool_ok=False,
       source=MP + ": Sonnet 5.5 $2/$10, 5m write $2.50, 1h $4, read $0.20, 1M/128K; forced tool use refused; "
                   "minimum cacheable (u) = Sonnet 5's 1024"),
    _m("claude-opus-5-5", 4.0, 20.0, 512, M, 128 * K, "opus", new_tok=True,
       source=MP + ": Opus 5.5 $4/$20 (writes and reads by the multipliers), 1M/128K; minimum cacheable (u) = "
                   "Opus 5's 512"),
    _m("claude-fable-5-2", 8.0, 40.0, 512, M, 128 * K, "fable", new_tok=True,
       source=MP + ": Fable 5.2 $8/$40, 1M/128K; read (u) by the 0.1x multiplier (the 0.025x exception is "
                   "documented for 5.1 only); minimum cacheable (u) = Fable 5.1's 512"),
    _m("claude-haiku-4-5", 1.0, 5.0, 4096, 200 * K, 64 * K, "haiku", source=PC + "; " + MP),
    # earlier models still served
    _m("claude-opus-5", 5.0, 25.0, 512, M, 128 * K, "opus", new_tok=True),
    _m("claude-opus-4-8", 5.0, 25.0, 1024, M, 128 * K, "opus", new_tok=True),
    _m("claude-opus-4-7", 5.0, 25.0, 2048, M, 128 * K, "opus", new_tok=True),
    _m("claude-opus-4-6", 5.0, 25.0, 4096, M, 128 * K, "opus"),
    _m("claude-opus-4-5", 5.0, 25.0, 4096, 200 * K, 64 * K, "opus"),
    _m("claude-opus-4-1", 15.0, 75.0, 1024, 200 * K, 32 * K, "opus"),
    _m("claude-opus-4", 15.0, 75.0, 1024, 200 * K, 32 * K, "opus"),
    _m("claude-sonnet-5", 2.0, 10.0, 1024, M, 128 * K, "sonnet", new_tok=True),
    _m("claude-sonnet-4-6", 3.0, 15.0, 1024, M, 128 * K, "sonnet", source=PC + "; " + MP + " (128K output)"),
    _m("claude-sonnet-4-5", 3.0, 15.0, 1024, 200 * K, 64 * K, "sonnet"),
    _m("claude-sonnet-4", 3.0, 15.0, 1024, 200 * K, 64 * K, "sonnet"),
    _m("claude-haiku-3-5", 0.80, 4.0, 2048, 200 * K, 8192, "haiku"),
    _m("claude-fable-5-1", 10.0, 50.0, 512, M, 128 * K, "fable", read=0.25, new_tok=True),
    _m("claude-mythos-5-1", 10.0, 50.0, 512, M, 128 * K, "mythos", read=0.25, new_tok=True),
    _m("claude-fable-5", 10.0, 50.0, 512, M, 128 * K, "fable", read=1.0, new_tok=True),
    _m("claude-mythos-5", 10.0, 50.0, 512, M, 128 * K, "mythos", read=1.0, new_tok=True),
]}
# the newest entry of each family: what an unknown id of that family is priced as
FAMILIES = {"sonnet": "claude-sonnet-5-5", "opus": "claude-opus-5-5", "haiku": "claude-haiku-4-5",
            "fable": "claude-fable-5-2", "mythos": "claude-mythos-5-1"}
_ALIASES = {"claude-3-5-haiku": "claude-haiku-3-5", "claude-opus-4-0": "claude-opus-4",
            "claude-sonnet-4-0": "claude-sonnet-4"}
_LOCK = threading.Lock()
_DATE = re.compile(r"-(\d{8}|latest)$")
_WARNED: set[str] = set()
REQUIRED_FIELDS = tuple(f.name for f in fields(ModelInfo))


@functools.lru_cache(maxsize=4096)  # pure, and asked several times per request by the proxy's analysis
def _canonical(model: str) -> str:
    name = _DATE.sub("", model.strip().lower())
    name = re.sub(r"\[1m\]$", "", name)  # Claude Code's 1M-context spelling
    return _ALIASES.get(name, name)


def get_model(model: str) -> ModelInfo:
    """The entry for an exact model id, an alias or a dated id of one (``-20261001``,
    ``-latest``, Claude Code's ``[1m]``); `UnknownModelError` naming the nearest ids otherwise.
    No family guess: ``claude-sonnet-4.6`` is not ``claude-sonnet-4-6``."""
    info = _TABLE.get(_canonical(model))
    if info is None:
        name = _canonical(str(model))
        near = difflib.get_close_matches(name, [*_TABLE, *_ALIASES], n=3, cutoff=0.6)
        raise UnknownModelError(f"unknown model {str(model)[:80]!r}: not an id of the price table"
                                + (f"; nearest: {', '.join(near)}" if near else f"; known: {', '.join(sorted(_TABLE))}")
                                + "; to price it on purpose give its prices (wrap(pricing={id: {'input': ..., "
                                  "'output': ...}}), --model-prices FILE, or cachecompact.pricing.register)")
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


def model_prices(model: str, default: str | None = None) -> ModelInfo:
    """`get_model`, or for an id missing from the table the newest entry of its family, or else
    ``default``'s prices (a warning, once per id). Raises `UnknownModelError` only when no family
    can be recognised and no ``default`` is given."""
    try:
        return get_model(model)
    except UnknownModelError:
        name = _canonical(model)
        fam = next((f for f in FAMILIES if f in name), None)
        if fam is None and default is None:
            raise
        base = get_model(FAMILIES[fam] if fam is not None else str(default))
        with _LOCK:
            if name not in _WARNED:
                _WARNED.add(name)
                log.warning("cachecompact: model %r is not in the price table; using %s prices (register() an "
                            "entry to fix this)", model, base.name)
        return replace(base, name=name)


DEFAULT_PRICE_MODEL = "claude-sonnet-4-6"  # a request that names no model, or one of no known family


def priced(model: str) -> ModelInfo:
    """What the runtime prices a request by: `model_prices`, and for a name of no known family
    (or none) `DEFAULT_PRICE_MODEL`'s entry, with one warning per name. Pricing never stops a
    request: the cache multipliers are the same for every model, so the trade-offs hold."""
    return model_prices(model or DEFAULT_PRICE_MODEL, default=DEFAULT_PRICE_MODEL)


def register(info: ModelInfo, *aliases: str) -> None:
    """Add or replace a model entry (user overrides take effect everywhere)."""
    with _LOCK:
        _TABLE[_canonical(info.name)] = info
        for a in aliases:
            _ALIASES[_canonical(a)] = _canonical(info.name)


def override(model: str, **changes: Any) -> ModelInfo:
    """Change some fields of an existing entry, e.g. ``override("claude-sonnet-4-6", read=0.25)``."""
    info = replace(get_model(model), **changes)
    register(info)
    return info


def known_models() -> list[str]:
    """Every model id in the table (the CLI lists them in its errors)."""
    return sorted(_TABLE)
