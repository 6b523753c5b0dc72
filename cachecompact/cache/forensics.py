"""Cache forensics: for every request, what it should have read from the cache, what it read,
and, when it read less, why and what that cost.

One engine behind the middleware's monitor, `cachecompact report`, the proxy and
`cachecompact forensics` on recorded logs. Each request is a `Snapshot` (its block chain,
cumulative tokens, lookback positions, breakpoints and cache-relevant parameters); the
engine compares it with the previous request of the same session and classifies:

* ``read_as_expected`` — it read (about) everything the previous request cached;
* ``prefix_churn`` — a block before the cached end changed (actionable unless a ledger edit
  of ours explains it): the first divergent block is named (``tools[i]``, ``system[j]`` at a
  character offset, ``messages[k].content[b]``) with before/after excerpts, and tool
  reordering, a changed system prompt and an edited earlier message are told apart;
* ``invalidation`` — the model, ``tool_choice``, thinking, effort, speed or the presence of
  images changed (the documented invalidation table);
* ``below_minimum`` — the prompt is shorter than the model's minimum cacheable length;
* ``ttl_expiry`` — the idle gap exceeded the TTL in force (taken from the request's markers);
  a negative gap (a log's records out of time order) is never read as idle;
* ``lookback_miss`` — the cached end sat 20 or more positions behind every breakpoint;
* ``client_compaction`` — the client compacted its own context since the previous request
  (Claude Code's compaction or microcompact, seen in its log): priced at what it wrote again;
* ``client_rewrite`` — a request rebuilt from a client's log read its tools and system prompt
  and none of its messages, at a person's turn: the client changed the messages in a way its
  log does not record (an injected reminder or system message, a history re-serialized on
  resume, a changed thinking or effort parameter; docs/cache-model.md cites the reports);
* ``server_edit`` — the request asked the API to edit its context (``context_management``:
  Anthropic's server-side clearing), which may have changed what the server cached in ways the
  body does not show; a short read there is that edit's re-write, not the provider's doing;
* ``provider_suspected`` — nothing changed, nothing expired, the entry was reachable, and
  still nothing (or less) was read.

What a request should read is capped at the previous request's prompt as billed: no cache
entry it left can be longer, whatever the token estimate says.

The dollars of a finding are the tokens that were written (or sent uncached) although they
could have been read, priced at the difference. Where the API sent
``diagnostics.cache_miss_reason`` it is kept next to the finding and agreement is counted.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

from ..base.pricing import ModelInfo, OwnPrices, priced
from ..base.values import MISS_CLASSES, TTL, MissClass
from ..base.wire import canonical_bytes
from .cache_keys import LOOKBACK, TTL_SECONDS, chain_step, first_mismatch, next_position, thinking_key
from .simulator import SimRequest

__all__ = [
    "ACTIONABLE",
    "CLASSES",
    "BlockOrigin",
    "Finding",
    "Forensics",
    "Layout",
    "SessionSummary",
    "Snapshot",
    "is_compaction_rewrite",
    "params_key",
    "rewrite_cost",
    "snapshot_from_sim",
]

CLASSES = MISS_CLASSES  # in the order reports list them (docs/forensics.md)
ACTIONABLE: frozenset[MissClass] = frozenset({"prefix_churn", "invalidation", "lookback_miss"})
_TOLERANCE = 0.05  # a read within 5% (and 32 tokens) of the expected one is as expected
EXCERPT = 200

# which API diagnostics reason each finding corresponds to (None: the API sees no divergence)
_API_FOR = {"invalidation:model": "model_changed", "invalidation:params": "unavailable",
            "prefix_churn:tools": "tools_changed", "prefix_churn:system": "system_changed",
            "prefix_churn:messages": "messages_changed", "compaction_rewrite:messages": "messages_changed"}


def params_key(body: dict[str, Any], has_image: bool) -> dict[str, Any]:
    """The request parameters whose change invalidates the messages cache (or more)."""
    return {"tool_choice": body.get("tool_choice"),
            "thinking": thinking_key(body.get("thinking"), str(body.get("model") or "")),
            "effort": (body.get("output_config") or {}).get("effort") if isinstance(body.get("output_config"), dict)
            else None, "speed": body.get("speed"), "images": has_image}


class BlockOrigin(Protocol):
    """A rendered block as data: its JSON, its canonical bytes, the transcript message it shows
    and the ledger entry that wrote it (the renderer's blocks have these fields)."""

    @property
    def d(self) -> Mapping[str, Any]: ...

    @property
    def raw(self) -> bytes: ...

    @property
    def transcript_index(self) -> int | None: ...

    @property
    def entry_seq(self) -> int | None: ...


@dataclass(frozen=True, slots=True)
class Layout:
    """Where each block of a request sits and where it came from, as data its snapshot's maker
    fills in (no callback): a rendered request's blocks and message starts, or a plain body's
    block paths and the body itself. Sequences may be longer than the request; only its first
    blocks (and ``n_messages`` starts) are read."""

    n_tools: int = 0
    n_system: int = 0
    starts: Sequence[int] = ()  # rendered: flat index of each message's first block
    n_messages: int = 0
    blocks: Sequence[BlockOrigin] = ()  # rendered: each block's dict, bytes and origin
    edit_starts: Sequence[int] = ()  # rendered: each ledger entry's first message, by sequence number
    paths: Sequence[str] = ()  # a plain body: each block's path
    body: Mapping[str, Any] | None = None  # a plain body, for excerpts (None: its text is not kept)

    def path(self, k: int) -> str:
        """Block ``k``'s place in the body: ``tools[2]``, ``system[0]``, ``messages[5].content[1]``."""
        if self.paths or not self.blocks:
            return self.paths[k] if k < len(self.paths) else "end"
        if k < self.n_tools:
            return f"tools[{k}]"
        if k < self.n_tools + self.n_system:
            return f"system[{k - self.n_tools}]"
        mi = bisect.bisect_right(self.starts, k, 0, self.n_messages) - 1
        return f"messages[{mi}].content[{k - self.starts[mi]}]"

    def text(self, k: int) -> str | None:
        """Block ``k``'s text for excerpts (a text block's text, a string tool result, else its
        JSON); None when the snapshot keeps no text."""
        if self.blocks and not self.paths:
            b = self.blocks[k]
            if b.d.get("type") == "text":
                return str(b.d.get("text", ""))
            if b.d.get("type") == "tool_result" and isinstance(b.d.get("content"), str):
                return str(b.d["content"])
            return b.raw.decode()
        if self.body is None or k >= len(self.paths):
            return None
        return _block_text(self.body, self.paths[k])

    def explained_by(self, k: int, since: int, n_entries: int) -> int | None:
        """The earliest of our ledger entries made after the first ``since`` (of ``n_entries``)
        that starts at or before block ``k``'s source message: the edit that moved the bytes
        there (messages between its end and ``k`` may be hidden by older edits). A divergence in
        tools or system, or with no new edit before it, is unexplained."""
        if not self.blocks or k < self.n_tools + self.n_system or since >= n_entries or k >= len(self.blocks):
            return None
        b = self.blocks[k]
        if b.entry_seq is not None and since <= b.entry_seq < n_entries:
            return b.entry_seq
        ti = b.transcript_index
        if ti is None and b.entry_seq is not None and b.entry_seq < len(self.edit_starts):
            ti = self.edit_starts[b.entry_seq]
        if ti is None:
            return None
        best: int | None = None
        for seq in range(since, min(n_entries, len(self.edit_starts))):
            start = self.edit_starts[seq]
            if start <= ti and (best is None or start < self.edit_starts[best]):
                best = seq
        return best


@dataclass(slots=True)
class Snapshot:
    """One request as the cache sees it: plain data, filled in by whoever makes it."""

    time: float
    model: str
    params: dict[str, Any]
    chain: Sequence[bytes]
    cum: Sequence[int]
    pos: Sequence[int]
    breakpoints: list[tuple[int, TTL]]  # (block index, ttl)
    layout: Layout = field(default_factory=Layout)  # where each block sits and came from
    tool_keys: Sequence[bytes] = ()  # per tool definition, to tell reordering from editing
    n_entries: int = 0  # ledger entries applied in this request (ours)
    preamble_blocks: int = 0  # leading blocks that are tools and system (the rest are messages)
    from_log: bool = False  # rebuilt from a client's log: its parameters and injected content are not recorded
    human_turn: bool = False  # the last user message is a person's (not only tool results)
    prompt: str | None = None  # the start of the person's prompt this request answers, for the finding
    head_floor: int = 0  # a log's thread: the read of its tools and system alone (its smallest nonzero read)
    client_compaction: str | None = None  # the client compacted since the previous request ("compact", ...)
    server_edits: bool = False  # the request asked the API to edit its context (context_management edits)

    @property
    def total(self) -> int:
        return self.cum[-1] if len(self.cum) else 0


@dataclass(slots=True)
class Finding:
    request: int
    cls: MissClass
    time: float
    read: int  # tokens read (API's count)
    expected: int  # tokens the previous request left cached that this one should have read (API units)
    wasted_tokens: int
    wasted_usd: float
    actionable: bool = False
    location: str | None = None
    offset: int | None = None
    before: str | None = None
    after: str | None = None
    detail: str = ""
    explained_by: int | None = None
    api_reason: str | None = None
    agrees: bool | None = None
    idle_s: float | None = None
    prompt: str | None = None  # the start of the person's prompt this request answers (recorded logs)
    # a recorded log's conversation the call belongs to: None for the main chain, else the
    # sub-agent's label (each has its own cache and clock, so its times restart: issue 50)
    thread: str | None = None

    def to_dict(self) -> dict[str, Any]:
        # every field is a plain value: a flat copy, not `asdict`'s recursive deep copy (per request)
        out = {name: getattr(self, name) for name in _FINDING_FIELDS}
        if math.isnan(self.time):
            out["time"] = None  # not known (a log's copied record); JSON has no NaN
        return out


_FINDING_FIELDS = tuple(f.name for f in fields(Finding))


@dataclass(slots=True)
class SessionSummary:
    requests: int = 0
    misses: dict[str, int] = field(default_factory=dict)
    wasted_usd: dict[str, float] = field(default_factory=dict)
    api_conclusive: int = 0
    api_agree: int = 0

    def add(self, f: Finding) -> None:
        self.requests += 1
        if f.cls != "read_as_expected":
            self.misses[f.cls] = self.misses.get(f.cls, 0) + 1
            self.wasted_usd[f.cls] = self.wasted_usd.get(f.cls, 0.0) + f.wasted_usd
        if f.agrees is not None:
            self.api_conclusive += 1
            self.api_agree += int(f.agrees)


@dataclass(slots=True)
class _Entry:
    index: int
    tokens: int
    expires: float
    ttl: TTL


def _excerpt(text: str, at: int) -> str:
    start = max(0, at - EXCERPT // 4)
    return text[start: start + EXCERPT]


def _diff_offset(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class Forensics:
    """Per-session analysis: call `observe` for each request in order."""

    def __init__(self, prices: OwnPrices | None = None, as_of: float | None = None) -> None:
        """Prices come from the table (`pricing.priced`), with ``prices`` (a client's own entries)
        first, at the day ``as_of`` (a recorded log's; None: today's)."""
        self.own, self.as_of = prices, as_of
        self.prev: Snapshot | None = None
        self.prev_cached = 0  # the previous request's tokens read from or written to the cache, as billed
        self.entries: dict[bytes, _Entry] = {}  # what this session's requests wrote, by chain value
        self.n = 0
        self.summary = SessionSummary()
        # whether a finding may quote the previous request's text: not when that request belongs
        # to another session (the first request after `fork`), whose text may be what a rewrite removed
        self.quotes_prev = True

    def fork(self) -> Forensics:
        """A continuation for a new segment of the session (a rewrite, or another agent under the
        same name): it compares its first request with this one's last, then goes its own way.

        Its first finding quotes nothing of that last request: a segment that starts because an
        agent redacted an old message would otherwise copy the redacted text into the new
        segment's records and events as the "before" excerpt (issue 46). The earlier text stays
        where it was, in the session this one continues."""
        f = Forensics(self.own, self.as_of)
        f.prev, f.entries, f.n, f.prev_cached = self.prev, dict(self.entries), self.n, self.prev_cached
        f.quotes_prev = False
        return f

    def observe(self, snap: Snapshot, usage: dict[str, Any], cache_miss_reason: dict[str, Any] | None = None
                ) -> Finding:
        price = self.prices(snap.model)
        read = int(usage.get("cache_read_input_tokens") or 0)
        total_api = read + int(usage.get("cache_creation_input_tokens") or 0) + int(usage.get("input_tokens") or 0)
        ratio = total_api / snap.total if snap.total and total_api else 1.0
        prev = self.prev
        ideal = self._ideal(snap) if prev is not None else 0
        expected = round(ideal * ratio)
        if self.prev_cached:  # no entry the previous request left is longer than what it cached
            expected = min(expected, self.prev_cached)
        lost = max(0, expected - read)
        gap = (snap.time - prev.time) if prev is not None and not math.isnan(snap.time - prev.time) else None
        f = Finding(self.n, "read_as_expected", snap.time, read, expected, 0, 0.0,
                    idle_s=gap if gap is None or gap >= 0 else None, prompt=snap.prompt)
        if prev is not None and (lost > max(32, _TOLERANCE * expected) or (snap.client_compaction and lost > 0)):
            self._classify(f, snap, prev, ideal, ratio, lost, price, usage)
        if cache_miss_reason is not None:
            self._agree(f, cache_miss_reason)
        self._update(snap, read, ratio)
        self.prev = snap
        self.quotes_prev = True
        self.prev_cached = read + int(usage.get("cache_creation_input_tokens") or 0)
        self.n += 1
        self.summary.add(f)
        return f

    def prices(self, model: str) -> ModelInfo:
        return priced(model, self.own).as_of(self.as_of)

    # -- what the previous requests left cached -----------------------------------------------------

    def _ideal(self, snap: Snapshot) -> int:
        """Tokens an unchanged, prompt extension of the previous request would have read: its
        highest write (raw estimate units)."""
        prev = self.prev
        assert prev is not None
        best = 0
        for k, _ in prev.breakpoints:
            e = self.entries.get(prev.chain[k])
            if e is not None:
                best = max(best, e.tokens)
        return best

    def _update(self, snap: Snapshot, read: int, ratio: float) -> None:
        minimum = self.prices(snap.model).min_cacheable
        now = snap.time
        for k, ttl in snap.breakpoints:  # a read refreshes what it read; a write adds an entry
            tokens = snap.cum[k]
            if tokens * ratio >= minimum:
                self.entries[snap.chain[k]] = _Entry(k, tokens, now + TTL_SECONDS.get(ttl, 300.0), ttl)
        if len(self.entries) > 64:  # keep the newest entries only
            for key in sorted(self.entries, key=lambda c: self.entries[c].expires)[: len(self.entries) - 64]:
                del self.entries[key]

    # -- classification -------------------------------------------------------------------------------

    def _classify(self, f: Finding, snap: Snapshot, prev: Snapshot, ideal: int, ratio: float, lost: int,
                  price: ModelInfo, usage: dict[str, Any]) -> None:
        # a lost token is written again at the price of the TTL this request writes with
        writes_1h = bool(snap.breakpoints) and snap.breakpoints[-1][1] == "1h"
        per_token = max(0.0, (price.write_1h if writes_1h else price.write_5m) - price.read) / 1e6
        f.wasted_tokens = lost
        f.wasted_usd = lost * per_token
        top = max((k for k, _ in prev.breakpoints if prev.chain[k] in self.entries), default=None)
        # 0. the client compacted its own context: what it wrote again is the compaction's price
        if snap.client_compaction:
            written = int(usage.get("cache_creation_input_tokens") or 0)
            f.cls, f.wasted_tokens = "client_compaction", min(lost, written)  # the new context, written again
            f.wasted_usd = f.wasted_tokens * per_token
            f.detail = (f"the client's own {snap.client_compaction} since the previous request: {f.read} tokens "
                        f"read, {written} written again")
            return
        # 1. the model or a cache-relevant parameter changed
        if snap.model != prev.model or snap.params != prev.params:
            f.cls = "invalidation"
            f.actionable = True
            what = ["model"] if snap.model != prev.model else [k for k in snap.params if
                                                                snap.params[k] != prev.params.get(k)]
            f.detail = f"{', '.join(what)} changed ({_show(prev, snap, what)})"
            f.location = "model" if "model" in what else "params"
            return
        # 2. a block before the cached end changed
        n = min(len(prev.chain), len(snap.chain))
        k = first_mismatch(prev.chain, snap.chain, n)
        if k is None and top is not None and top >= len(snap.chain):
            k = len(snap.chain)  # the request is shorter than what was cached: messages removed
        if k is not None and top is not None and k <= top:
            self._churn(f, snap, prev, k, ratio, per_token, ideal, price, usage)
            return
        # 3. too short to be cached at all
        if snap.total * ratio < price.min_cacheable:
            f.cls, f.detail = "below_minimum", (f"{round(snap.total * ratio)} tokens < the model's minimum cacheable "
                                                f"{price.min_cacheable}")
            return
        # 4. the entry expired; with mixed TTLs (a 1h prefix, 5m after it) the shorter ones may
        # expire alone, and then what the longer ones still hold is all a read can find
        ttl = max((TTL_SECONDS.get(t, 300.0) for _, t in prev.breakpoints), default=300.0)
        gap = snap.time - prev.time
        if gap > ttl:
            f.cls, f.detail = "ttl_expiry", f"idle {gap:.0f} s > TTL {ttl:.0f} s"
            return
        if gap >= 0:
            self._within_ttl(f, snap, prev, ideal, ratio, gap, ttl, top)
        else:  # no time known, or records out of time order: no idle is read, so no expiry judged
            self._timeless(f, snap, top)

    def _within_ttl(self, f: Finding, snap: Snapshot, prev: Snapshot, ideal: int, ratio: float, gap: float,
                    ttl: float, top: int | None) -> None:
        """Steps 4 to 7 for a request whose idle gap is known and within the TTL in force; ``top``
        is the previous request's highest breakpoint whose entry is still held."""
        alive = [(e.tokens, e.ttl) for k, _ in prev.breakpoints
                 if (e := self.entries.get(prev.chain[k])) is not None and e.expires >= snap.time]
        kept, kept_ttl = max(alive, default=(0, ""))
        if kept < ideal and f.read + max(32, _TOLERANCE * f.expected) >= round(kept * ratio):
            short = min((TTL_SECONDS.get(t, 300.0) for _, t in prev.breakpoints), default=300.0)
            f.cls = "ttl_expiry"
            f.detail = (f"idle {gap:.0f} s > TTL {short:.0f} s of the later breakpoints; the {kept_ttl} entry "
                        f"({round(kept * ratio)} tokens) was read")
            return
        # 5. a log's request read its tools and system and none of its messages, at a person's
        # turn, within the TTL: the client changed what the log does not record (module docstring)
        floor = snap.head_floor
        if snap.from_log and snap.human_turn and floor and abs(f.read - floor) <= max(32, _TOLERANCE * floor):
            f.cls, f.location = "client_rewrite", snap.layout.path(snap.preamble_blocks)
            f.detail = (f"{f.read} tokens read: the tools and system prompt alone (this thread's floor, {floor}), "
                        f"none of the messages, at a person's turn {gap:.0f} s after the previous request; the "
                        f"client changed the messages in a way its log does not record")
            return
        if self._lookback(f, snap, top) or self._server_edit(f, snap):
            return
        f.cls = "provider_suspected"
        f.detail = (f"nothing changed, idle {gap:.0f} s within TTL {ttl:.0f} s, entry within the lookback, yet "
                    f"{f.read} of {f.expected} expected tokens were read")

    def _timeless(self, f: Finding, snap: Snapshot, top: int | None) -> None:
        """A request whose idle gap is unknown: a lookback miss can still be told, an expiry cannot."""
        if self._lookback(f, snap, top) or self._server_edit(f, snap):
            return
        f.cls = "provider_suspected"
        f.detail = (f"no idle gap is known here (the log lost this call's time, or its times run backwards), so "
                    f"no expiry can be judged; nothing else changed, yet {f.read} of {f.expected} expected tokens "
                    f"were read")

    @staticmethod
    def _server_edit(f: Finding, snap: Snapshot) -> bool:
        """7. the API edited the context it was sent (server-side clearing): what it cached is not
        the body, so a short read is that edit's cost, asked for by the request."""
        if not snap.server_edits:
            return False
        f.cls = "server_edit"
        f.detail = (f"the request asks the API to edit its context (context_management); {f.read} of {f.expected} "
                    f"expected tokens were read: what the server cleared changed what it had cached")
        return True

    @staticmethod
    def _lookback(f: Finding, snap: Snapshot, top: int | None) -> bool:
        """6. the cached end lay outside every breakpoint's lookback."""
        if top is not None and top < len(snap.pos) and not any(
                b >= top and snap.pos[b] - snap.pos[top] < LOOKBACK for b, _ in snap.breakpoints):
            f.cls, f.actionable = "lookback_miss", True
            f.location = snap.layout.path(top)
            near = min((snap.pos[b] - snap.pos[top] for b, _ in snap.breakpoints if b >= top), default=None)
            f.detail = (f"the previous cached end ({f.location}) is {near} positions behind the nearest breakpoint "
                        f"(a read looks back {LOOKBACK})" if near is not None else
                        f"no breakpoint at or after the previous cached end ({f.location})")
            return True
        return False

    def _churn(self, f: Finding, snap: Snapshot, prev: Snapshot, k: int, ratio: float, per_token: float,
               ideal: int, price: ModelInfo, usage: dict[str, Any]) -> None:
        f.cls = "prefix_churn"
        before_k = snap.cum[k - 1] if k > 0 and k - 1 < len(snap.cum) else 0
        f.wasted_tokens = min(f.wasted_tokens, max(0, round((ideal - before_k) * ratio)))
        f.wasted_usd = f.wasted_tokens * per_token
        if k >= len(snap.chain):
            f.location = prev.layout.path(k) if k < len(prev.chain) else "messages"
            f.detail = f"the request is shorter than the cached prefix: {f.location} and later were removed"
        else:
            f.location = snap.layout.path(k)
            f.detail = self._what_changed(snap, prev, k)
            a = prev.layout.text(k) if k < len(prev.chain) else None
            b = snap.layout.text(k)
            if a is not None and b is not None:
                off = _diff_offset(a, b)
                f.offset, f.after = off, _excerpt(b, off)
                if self.quotes_prev:
                    f.before = _excerpt(a, off)
                else:
                    f.detail += "; the earlier text is not copied here (it is in the session this one continues)"
        f.explained_by = (snap.layout.explained_by(k, prev.n_entries, snap.n_entries) if k < len(snap.chain)
                          else None)
        f.actionable = f.explained_by is None
        if f.explained_by is not None:  # our own compaction: its deliberate re-write, not a miss
            f.cls = "compaction_rewrite"
            f.detail += f" (explained by ledger entry #{f.explained_by})"
            f.wasted_tokens, f.wasted_usd = rewrite_cost(price, usage)

    @staticmethod
    def _what_changed(snap: Snapshot, prev: Snapshot, k: int) -> str:
        loc = snap.layout.path(k)
        if loc.startswith("tools"):
            a, b = list(prev.tool_keys), list(snap.tool_keys)
            if a and b and sorted(a) == sorted(b):
                return "tool definitions reordered (same tools, different order)"
            if len(a) != len(b):
                return f"tools added or removed ({len(a)} -> {len(b)} definitions) at {loc}"
            return f"tool definition {loc} changed (description or schema differs between requests)"
        if loc.startswith("system"):
            return f"system prompt block {loc} changed (e.g. a timestamp or per-request id in the system prompt)"
        return f"earlier message block {loc} was edited, reordered or removed instead of appended to"

    @staticmethod
    def _agree(f: Finding, reason: dict[str, Any]) -> None:
        kind = reason.get("type") if isinstance(reason, dict) else None
        f.api_reason = kind if isinstance(kind, str) else None
        if f.api_reason in (None, "previous_message_not_found"):
            return
        if f.cls == "invalidation":
            mine = _API_FOR["invalidation:model" if f.location == "model" else "invalidation:params"]
        elif f.cls in ("prefix_churn", "compaction_rewrite"):
            sect = (f.location or "messages").split("[", 1)[0]
            mine = _API_FOR.get(f"{f.cls}:{sect}", "messages_changed")
        else:
            mine = None  # the API compares structure only: no divergence to report
        if f.api_reason == "unavailable" and mine != "unavailable":
            return  # inconclusive
        f.agrees = mine == f.api_reason


def is_compaction_rewrite(finding: Mapping[str, Any]) -> bool:
    """Whether a stored finding records our own compaction's re-write: its class, or, in records
    written before that class existed, prefix churn that a ledger entry explains."""
    cls = finding.get("cls")
    return cls == "compaction_rewrite" or (cls == "prefix_churn" and finding.get("explained_by") is not None)


def rewrite_cost(price: ModelInfo, usage: dict[str, Any]) -> tuple[int, float]:
    """What a request's cache writes cost over reading them, at its own prices (the prompt's price
    tier, each TTL's write price): the written tokens and their (write - read) price. This is what a
    compaction's deliberate re-write actually paid, not what re-writing the previous, uncompacted
    prompt would have cost."""
    cc = usage.get("cache_creation") or {}
    total_w = int(usage.get("cache_creation_input_tokens") or 0)
    w1h = int(cc.get("ephemeral_1h_input_tokens") or 0) if cc else 0
    w5m = int(cc.get("ephemeral_5m_input_tokens") or 0) if cc else total_w
    p = price.at(sum(int(usage.get(k) or 0) for k in ("input_tokens", "cache_read_input_tokens",
                                                        "cache_creation_input_tokens")))
    usd = (w5m * max(0.0, p.write_5m - p.read) + w1h * max(0.0, p.write_1h - p.read)) / 1e6
    return max(total_w, w5m + w1h), usd


def _show(prev: Snapshot, snap: Snapshot, what: list[str]) -> str:
    parts = []
    for w in what[:3]:
        a = prev.model if w == "model" else prev.params.get(w)
        b = snap.model if w == "model" else snap.params.get(w)
        parts.append(f"{w}: {canonical_bytes(a).decode()[:60]} -> {canonical_bytes(b).decode()[:60]}")
    return "; ".join(parts)


# -- snapshots ------------------------------------------------------------------------------------

def _asks_server_edits(body: dict[str, Any] | None) -> bool:
    cm = body.get("context_management") if isinstance(body, dict) else None
    return isinstance(cm, dict) and bool(cm.get("edits"))


def snapshot_from_sim(req: SimRequest, body: dict[str, Any] | None, *, keep_text: bool = True) -> Snapshot:
    """A snapshot of any request body (the proxy, recorded logs), from the simulator's blocks."""
    chain: list[bytes] = []
    cum: list[int] = []
    pos: list[int] = []
    h, c, p, prev = b"", 0, -1, ""
    for b in req.blocks:
        h = chain_step(h, b.key)
        c += b.tokens
        p = next_position(p, prev, b.kind)
        prev = b.kind
        chain.append(h)
        cum.append(c)
        pos.append(p)
    blocks = req.blocks
    bps = [(k, b.ttl) for k, b in enumerate(blocks) if b.ttl is not None]
    if req.auto_ttl is not None:
        k = len(blocks) - 1
        while k >= 0 and not blocks[k].cacheable:
            k -= 1
        if k >= 0 and all(k != x for x, _ in bps):
            bps = sorted([*bps, (k, req.auto_ttl)])
    layout = Layout(req.n_tools, req.n_system, paths=[b.where for b in blocks],
                    body=body if keep_text and body is not None else None)
    return Snapshot(time=req.time, model=req.model, params=params_key(body or {}, req.has_image), chain=chain, cum=cum,
                    pos=pos, breakpoints=bps, layout=layout, tool_keys=[b.key for b in blocks[: req.n_tools]],
                    preamble_blocks=req.n_tools + req.n_system, server_edits=_asks_server_edits(body))


def _block_text(body: Mapping[str, Any], where: str) -> str:
    """The text of the block at a path like ``messages[3].content[1]`` (JSON for non-text)."""
    import re

    m = re.match(r"^(tools|system|messages)\[(\d+)\](?:\.content\[(\d+)\])?$", where)
    if not m:
        return ""
    sect, i = m.group(1), int(m.group(2))
    try:
        if sect == "tools":
            return canonical_bytes(body["tools"][i]).decode()
        if sect == "system":
            s = body["system"]
            return s if isinstance(s, str) else str(s[i].get("text", ""))
        content = body["messages"][i]["content"]
        if isinstance(content, str):
            return content
        blk = content[int(m.group(3) or 0)]
        if blk.get("type") == "text":
            return str(blk.get("text", ""))
        if blk.get("type") == "tool_result" and isinstance(blk.get("content"), str):
            return str(blk["content"])
        return canonical_bytes({k: v for k, v in blk.items() if k != "cache_control"}).decode()
    except (KeyError, IndexError, TypeError, AttributeError):
        return ""
