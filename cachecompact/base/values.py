"""Typed records that cross the layers: what one layer hands another as a value, never a bag of
keys or an exception.

* `ContextFull`: the decision that a request cannot fit even after every compaction level. The
  compactor returns it (`Plan.context_full`), the engine passes it on, and each adapter
  gives it as its transport's error (`wrap()`: `ContextFullError`, the proxy: a 400).
* `Answer`: what one response told us that the engine records. The SDK middleware and the
  proxy's tap each read it from their transport (a parsed message, an SSE stream, a JSON body)
  and hand the engine this one value; whether it was a stream is set by the reader that saw the
  stream, so it cannot be mislabelled on the way (it once was, as the third of a positional
  tuple).
* `RequestRecord`: what the engine records of one answered request, handed to the session that
  seals it into its chain of request records (docs/ledger-format.md has the stored form, which
  this type writes key for key).
* `StoredRequest` and `Usage`: a sealed request record as read back from a store (issue 49: it
  was typed when written and read back as a plain dict), with the API's usage typed where
  cachecompact reads it and every other field kept as sent, as the SDK's usage model keeps them.
* `IdleDecision`: whether a quiet session was compacted before its cache expired, and the prices
  that decided it (`compaction.idle`), for the caller of `compact_idle`, the scheduler and the log.
* The closed vocabularies as `Literal` types, so a misspelt value is a type error where it is
  written, not a silent miss where it is compared: `TTL`, `Level` (the compactor's five and `restore`),
  `SummaryMode`, `ProxyMode` and `MissClass` (forensics' classes of a request's cache read).
  Values read back from storage or another program stay ``str``: a ledger written by a peer may
  name its own level.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, get_args

import msgspec

__all__ = ["MISS_CLASSES", "PREFIX_SETTING", "TTL", "Answer", "ContextFull", "IdleDecision", "Level", "MissClass",
           "ProxyMode", "Refuse", "RequestRecord", "Send", "StoredRequest", "SummaryMode", "Usage"]

# how a refusal names the setting that shrinks the immutable prefix; an adapter whose settings have
# other names (the proxy's flags) puts its own in place of this text (`adapters.proxy`)
PREFIX_SETTING = "wrap(..., prefix_messages=1)"

TTL = Literal["5m", "1h"]  # a cache entry's lifetime, as `cache_control.ttl` spells it
Level = Literal["L1", "L2", "L3", "L4", "L5", "restore"]  # micro .. truncate; restore: hidden lines given back
SummaryMode = Literal["auto", "forced-tool", "prefix-reuse", "in-text", "extractive"]  # how a summary is asked for
ProxyMode = Literal["observe", "compact"]
MissClass = Literal["read_as_expected", "prefix_churn", "compaction_rewrite", "invalidation", "below_minimum",
                    "ttl_expiry", "lookback_miss", "client_compaction", "client_rewrite", "server_edit",
                    "provider_suspected"]
MISS_CLASSES: tuple[MissClass, ...] = get_args(MissClass)


class ContextFull(msgspec.Struct, frozen=True):
    """The request cannot fit; ``message`` says what fills it and what to do; ``session_id`` is
    the session the request was resolved to (its refusal is counted there)."""

    message: str
    session_id: str | None = None


class Send(msgspec.Struct, frozen=True):
    """A step of the engine's request exchange (`engine.request_cycle.RequestExchange`): send
    ``body`` upstream, with ``betas`` added to the request's ``anthropic-beta`` header (what the
    strategy's body needs). Plain data here, so an adapter tells the steps apart without loading
    the compaction runtime (the proxy's observe mode never does)."""

    body: dict[str, Any]
    betas: tuple[str, ...] = ()


class Refuse(msgspec.Struct, frozen=True):
    """A step of the request exchange: send nothing (more); answer the caller with ``message``,
    the context is full (`ContextFullError` from the SDK middleware, a 400 from the proxy).
    ``session_id``: the session the engine resolved the request to, where the proxy counts the
    refusal (None when there is none)."""

    message: str
    session_id: str | None = None


class Answer(msgspec.Struct, frozen=True):
    """One response as the engine records it.

    ``usage`` is the response's usage object exactly as the API sent it: it is billed, stored in
    the session's request record and compared by forensics, and a field the API adds tomorrow
    must survive the trip, so it stays the API's own mapping rather than a Struct of today's
    fields. ``cache_miss_reason`` is the API's ``diagnostics.cache_miss_reason``, if any."""

    usage: dict[str, Any]
    message_id: str | None = None
    cache_miss_reason: dict[str, Any] | None = None
    stream: bool = False
    # why the model stopped (``end_turn``, ``tool_use``, ...): after ``tool_use`` the agent answers
    # the calls; after anything else the turn is over and the next request waits for a person
    stop_reason: str | None = None


class RequestRecord(msgspec.Struct, kw_only=True):
    """One answered request as the engine records it: when, which model, the usage as the API
    sent it and its price, the render's estimate and what was sent, the response's id, whether
    it streamed, and forensics' finding. ``strategy_state`` (a stateful strategy's, for a replica
    that picks the session up) and ``thinking`` (the preserved thinking its edits left out) are
    written only when there is something to say."""

    time: float
    model: str
    usage: dict[str, Any]
    cost_usd: float
    est_tokens: int
    message_id: str | None
    stream: bool
    sent_tokens: int
    finding: dict[str, Any]
    strategy_state: dict[str, Any] | msgspec.UnsetType = msgspec.UNSET
    thinking: dict[str, Any] | msgspec.UnsetType = msgspec.UNSET

    def fields(self) -> dict[str, Any]:
        """The stored form: plain JSON values, the unset ones left out."""
        out: dict[str, Any] = msgspec.to_builtins(self)
        return out


class Usage(msgspec.Struct, frozen=True, kw_only=True):
    """The API's ``usage`` object, typed where cachecompact reads it. A field this version does
    not know (or a known one the API sent as null) stays in ``extra`` as sent, and `to_dict`
    gives the mapping back key for key, so a usage the API extends tomorrow survives the trip."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation: dict[str, Any] | None = None  # the split by TTL (ephemeral_5m / ephemeral_1h), as sent
    iterations: list[dict[str, Any]] | None = None  # server compaction's steps
    extra: dict[str, Any] = {}
    present: frozenset[str] = frozenset()  # the known fields the API sent (to give back only those)

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> Usage:
        """The typed usage of ``raw``; `msgspec.ValidationError` naming the field when a known one
        has the wrong type."""
        known = {k: v for k, v in raw.items() if k in _USAGE_FIELDS and v is not None}
        typed = msgspec.convert(known, _UsageFields, strict=False)  # 5.0 is 5, as JSON readers differ
        return cls(**{k: getattr(typed, k) for k in known}, extra={k: v for k, v in raw.items() if k not in known},
                   present=frozenset(known))

    def to_dict(self) -> dict[str, Any]:
        """The usage as the API sent it."""
        return {**{k: getattr(self, k) for k in self.present}, **self.extra}

    @property
    def prompt_tokens(self) -> int:
        """Every input token of the request: read, written and uncached."""
        return self.input_tokens + self.cache_creation_input_tokens + self.cache_read_input_tokens


class _UsageFields(msgspec.Struct, kw_only=True):
    input_tokens: int = 0
    output_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation: dict[str, Any] | None = None
    iterations: list[dict[str, Any]] | None = None


_USAGE_FIELDS = frozenset(f for f in _UsageFields.__struct_fields__)


class StoredRequest(msgspec.Struct, frozen=True, kw_only=True):
    """A sealed request record read back from a store (docs/ledger-format.md, *Request records*):
    its place in the chain and what it commits to, then what the engine recorded (`RequestRecord`;
    a tool that keeps its own records in a session may leave those out, and its other fields
    stay in the store)."""

    seq: int
    prev_hash: str
    hash: str
    meta: str
    transcript_len: int
    transcript_head: str
    ledger_len: int
    ledger_head: str
    breakpoints: list[tuple[int, str]]
    stable_before: int | None = None
    time: float = 0.0
    model: str = ""
    usage: Usage = Usage()
    cost_usd: float = 0.0
    est_tokens: int = 0
    message_id: str | None = None
    stream: bool = False
    sent_tokens: int = 0
    finding: dict[str, Any] = {}
    strategy_state: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> StoredRequest:
        """Decode one stored record; `ValueError` naming the record and the field when it does not fit."""
        try:
            u = raw.get("usage") or {}
            if not isinstance(u, Mapping):
                raise TypeError(f"usage is {type(u).__name__}, not an object")
            # a field written as null reads as absent (a tool's own record may leave any of them so)
            known = {k: v for k, v in raw.items() if k in _STORED_FIELDS and k != "usage" and v is not None}
            return msgspec.structs.replace(msgspec.convert(known, cls, strict=False), usage=Usage.of(u))
        except (msgspec.ValidationError, TypeError) as err:
            raise ValueError(f"request record #{raw.get('seq')!r}: {err}") from None

    def fields(self) -> dict[str, Any]:
        """The record as plain JSON values, as stored (its usage as the API sent it; the optional
        parts it did not have left out)."""
        out: dict[str, Any] = msgspec.to_builtins(self)
        out["usage"] = self.usage.to_dict()
        out["breakpoints"] = [[k, h] for k, h in self.breakpoints]
        for k in ("stable_before", "strategy_state", "thinking"):
            if out[k] is None:
                del out[k]
        return out


_STORED_FIELDS = frozenset(StoredRequest.__struct_fields__)


class IdleDecision(msgspec.Struct, frozen=True, kw_only=True):
    """Whether a quiet session was summarized before its cache expired (`compaction.idle`).

    ``fired``: the summary was made (on the warm cache) and waits, as ledger edits, for the next
    request, which appends and renders them. ``p_late`` is the chance that the agent returns only
    after the cache expired, from the session's own gaps; ``value_usd`` the expected saving that
    decided it (positive: it pays); ``summary_warm_usd`` and ``summary_cold_usd`` the summary's
    estimated price now and on a cold return; ``early_cost_usd`` what the edit costs at once when
    the agent returns before expiry (the term that decides), and ``early_net_usd`` what the cache
    model says it is worth with its later savings (`policy.economics`; shown, not counted).
    ``cost_usd`` is what the summary did cost."""

    session_id: str
    at: float
    fired: bool
    reason: str
    level: str | None = None
    p_late: float = 0.0
    value_usd: float = 0.0
    summary_warm_usd: float = 0.0
    summary_cold_usd: float = 0.0
    early_net_usd: float = 0.0
    early_cost_usd: float = 0.0
    cost_usd: float = 0.0
    tokens_before: int = 0
    tokens_after: int = 0
