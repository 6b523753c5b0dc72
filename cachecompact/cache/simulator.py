"""Prompt-cache billing simulator: pure, no HTTP. Follows the documented rules.

Rules (see docs/cache-model.md for each choice where the docs are silent):

* keys are cumulative prefix hashes over tools, then system, then messages; the model (and
  ``speed``) seed the chain, so each model has its own cache; ``speed`` is also mixed in at
  the system boundary and tool_choice / thinking / effort / image presence at the messages
  boundary, so changing them invalidates exactly the levels the docs list;
* an entry is written only at a ``cache_control`` breakpoint, at most 4 per request
  (a top-level ``cache_control`` adds one on the last cacheable block);
* a read walks back at most 20 positions per breakpoint, the breakpoint included; a run of
  consecutive tool_use blocks, or of tool_result blocks, is one position;
* nothing is cached below the model's minimum cacheable length; a breakpoint whose prefix
  is shorter writes nothing and its tokens are billed as input;
* TTL is 5 minutes or 1 hour from the *start* of the request, refreshed when read;
* billing is the A/B/C rule: read = A (highest hit), 1h write = B - A, 5m write = C - B,
  input = total - C.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import msgspec
import xxhash

from ..base.errors import MalformedMessageError
from ..base.tokens import BLOCK_OVERHEAD, TokenCounter, block_tokens
from ..base.values import TTL
from ..base.wire import (
    Block,
    ImageBlock,
    ToolResultBlock,
    block_to_dict,
    canonical_bytes,
    content_blocks,
    message_from_dict,
    system_from_param,
    tool_from_dict,
)
from .cache_keys import (
    LOOKBACK,
    MAX_BREAKPOINTS,
    TTL_SECONDS,
    block_key,
    check_marker,
    is_cacheable,
    positions,
    strip_for_key,
    thinking_key,
    tool_key,
)

__all__ = [
    "LOOKBACK",
    "TTL_SECONDS",
    "CacheSimulator",
    "SimBlock",
    "SimRequest",
    "SimResult",
    "message_blocks",
    "positions",
    "request_from_body",
]



@dataclass(frozen=True, slots=True)
class SimBlock:
    """One cacheable position candidate: content hash, token count, kind and marker."""

    key: bytes
    tokens: int
    kind: str
    ttl: TTL | None = None  # explicit cache_control on this block
    cacheable: bool = True
    where: str = ""


@dataclass(slots=True)
class SimRequest:
    model: str
    time: float
    blocks: list[SimBlock]
    n_tools: int = 0
    n_system: int = 0
    system_salt: bytes = b""
    messages_salt: bytes = b""
    auto_ttl: TTL | None = None  # top-level cache_control
    has_image: bool = False  # an image anywhere in the messages (its presence is part of the messages' cache key)
    # when the response ended, if later than ``time``: what the request read or wrote lives for its TTL from
    # then (a recorded log's long response; tools/bench/_call_facts.py measures it). None: from ``time``
    done: float | None = None


@dataclass(slots=True)
class SimResult:
    input_tokens: int
    cache_creation_input_tokens: int
    cache_read_input_tokens: int
    ephemeral_5m_input_tokens: int
    ephemeral_1h_input_tokens: int
    total_tokens: int
    hit_block: int | None
    breakpoints: list[tuple[int, TTL]]
    chain: list[bytes] = field(repr=False)
    cumulative: list[int] = field(repr=False)

    def usage(self) -> dict[str, Any]:
        """The ``usage`` object the API returns (without output tokens)."""
        return {
            "input_tokens": self.input_tokens,
            "cache_creation_input_tokens": self.cache_creation_input_tokens,
            "cache_read_input_tokens": self.cache_read_input_tokens,
            "cache_creation": {"ephemeral_5m_input_tokens": self.ephemeral_5m_input_tokens,
                               "ephemeral_1h_input_tokens": self.ephemeral_1h_input_tokens},
        }

    @property
    def prefix_hashes(self) -> list[str]:
        """Chained hash at each breakpoint, hex: what this request wrote or read."""
        return [self.chain[k].hex() for k, _ in self.breakpoints]


class CacheSimulator:
    """Holds cache entries across requests; `process` bills one request and updates them."""

    def __init__(self, min_cacheable: Callable[[str], int]) -> None:
        self._min = min_cacheable
        self.entries: dict[bytes, tuple[float, TTL]] = {}  # chain key -> (expires_at, ttl)

    def _live(self, key: bytes, now: float) -> bool:
        e = self.entries.get(key)
        return e is not None and e[0] > now

    def process(self, req: SimRequest) -> SimResult:
        """Bill ``req``. Raises `MalformedMessageError` for the API's 400s (too many breakpoints...)."""
        blocks, now = req.blocks, req.time
        chain: list[bytes] = []
        cum: list[int] = []
        h = xxhash.xxh3_128_digest(b"model:" + req.model.encode())
        c = 0
        for k, b in enumerate(blocks):
            if k == req.n_tools:
                h = xxhash.xxh3_128_digest(h + b"|system|" + req.system_salt)
            if k == req.n_tools + req.n_system:
                h = xxhash.xxh3_128_digest(h + b"|messages|" + req.messages_salt)
            h = xxhash.xxh3_128_digest(h + b.key)
            c += b.tokens
            chain.append(h)
            cum.append(c)
        total = cum[-1] if cum else 0
        bps = [(k, b.ttl) for k, b in enumerate(blocks) if b.ttl is not None]
        if req.auto_ttl is not None:
            bps = self._auto(blocks, bps, req.auto_ttl)
        if len(bps) > MAX_BREAKPOINTS:
            raise MalformedMessageError("cache_control", f"A maximum of {MAX_BREAKPOINTS} blocks with "
                                                         f"cache_control may be provided. Found {len(bps)}.")
        seen_5m = False
        for k, ttl in bps:
            if ttl == "1h" and seen_5m:
                raise MalformedMessageError(blocks[k].where or "cache_control", "a ttl='1h' cache_control block "
                                            "must not come after a ttl='5m' cache_control block")
            seen_5m = seen_5m or ttl == "5m"
        pos = positions([b.kind for b in blocks])

        # reads: each breakpoint looks back up to LOOKBACK positions for an earlier write
        hits: list[int] = []
        for k, _ in reversed(bps):
            j = k
            while j >= 0 and pos[k] - pos[j] < LOOKBACK:
                if self._live(chain[j], now):
                    hits.append(j)
                    break
                j -= 1
        hit = max(hits) if hits else None
        a = cum[hit] if hit is not None else 0
        minimum = self._min(req.model)
        writable = [(k, ttl) for k, ttl in bps if cum[k] >= minimum]
        after = [(k, ttl) for k, ttl in writable if cum[k] > a]
        b_tok = max((cum[k] for k, ttl in after if ttl == "1h"), default=a)
        c_tok = max((cum[k] for k, _ in after), default=a)

        since = max(now, req.done) if req.done is not None else now
        for j in hits:  # reading refreshes the entry for its own TTL
            _, ttl = self.entries[chain[j]]
            self.entries[chain[j]] = (since + TTL_SECONDS[ttl], ttl)
        for k, ttl in writable:
            old = self.entries.get(chain[k])
            if old is None or old[0] <= now or TTL_SECONDS[ttl] >= TTL_SECONDS[old[1]]:
                self.entries[chain[k]] = (since + TTL_SECONDS[ttl], ttl)
        return SimResult(
            input_tokens=total - c_tok,
            cache_creation_input_tokens=c_tok - a,
            cache_read_input_tokens=a,
            ephemeral_5m_input_tokens=c_tok - b_tok,
            ephemeral_1h_input_tokens=b_tok - a,
            total_tokens=total,
            hit_block=hit,
            breakpoints=bps,
            chain=chain,
            cumulative=cum,
        )

    @staticmethod
    def _auto(blocks: list[SimBlock], bps: list[tuple[int, TTL]], ttl: TTL) -> list[tuple[int, TTL]]:
        """Automatic caching: a breakpoint on the last cacheable block (walking back silently)."""
        k = len(blocks) - 1
        while k >= 0 and not blocks[k].cacheable:
            k -= 1
        if k < 0:
            return bps
        explicit = dict(bps)
        if k in explicit:
            if explicit[k] != ttl:
                raise MalformedMessageError("cache_control", "the top-level cache_control ttl differs from the "
                                                             "explicit cache_control on the last cacheable block")
            return bps
        if len(bps) >= MAX_BREAKPOINTS:
            raise MalformedMessageError("cache_control", "automatic caching needs a free breakpoint slot; "
                                                         f"{len(bps)} explicit cache_control blocks were given")
        return sorted([*bps, (k, ttl)])


def _ttl_of(cc: Any, where: str) -> TTL | None:
    """A marker's TTL by the one rule (`cache_keys.check_marker`; null is no marker)."""
    ttl = check_marker(None if cc is msgspec.UNSET else cc, where)
    return None if ttl is None else "1h" if ttl == "1h" else "5m"


def request_from_body(body: dict[str, Any], time: float, counter: TokenCounter,
                      memo: dict[tuple[bytes, int], tuple[list[SimBlock], bool]] | None = None,
                      ratio: float = 1.0, keys: Sequence[bytes] | None = None) -> SimRequest:
    """Tokenize and hash a Messages API body into a `SimRequest` (same counts as the renderer).

    ``memo`` caches each message's blocks by (hash of its JSON, index), so replaying a long
    conversation parses every message once instead of once per request; ``keys`` may give each
    message's memo key (e.g. a hash of its raw bytes) to save hashing it again. ``ratio``
    scales the token counts (a model family's tokenizer against tiktoken's, see `pricing`).
    """
    blocks: list[SimBlock] = []
    has_image = False
    for i, t in enumerate(body.get("tools") or []):
        tool = tool_from_dict(t, i)
        _, raw, key = tool_key(tool.raw)
        blocks.append(SimBlock(key, counter.count_cached(key, raw.decode(), BLOCK_OVERHEAD), "tool",
                               _ttl_of(tool.raw.get("cache_control"), f"tools[{i}]"), True, f"tools[{i}]"))
    n_tools = len(blocks)
    system = body.get("system")
    sys_blocks = system_from_param(system)
    for j, sb in enumerate(sys_blocks):
        blocks.append(_sim_block(sb, counter, False, f"system[{j}]"))
    n_system = len(sys_blocks)
    for i, m in enumerate(body.get("messages") or []):
        if memo is None:
            mblocks, img = message_blocks(m, i, counter)
        else:
            mkey = (keys[i] if keys is not None else xxhash.xxh3_128_digest(canonical_bytes(m)), i)
            hit = memo.get(mkey)
            if hit is None:
                if len(memo) > 200_000:
                    memo.clear()
                hit = memo[mkey] = message_blocks(m, i, counter)
            mblocks, img = hit
        blocks += mblocks
        has_image = has_image or img
    if ratio != 1.0:
        blocks = [replace(b, tokens=round(b.tokens * ratio)) for b in blocks]
    thinking = thinking_key(body.get("thinking"), str(body.get("model") or ""))
    salt_msgs = canonical_bytes([body.get("tool_choice"), thinking,
                                 (body.get("output_config") or {}).get("effort"), has_image])
    top = body.get("cache_control")
    return SimRequest(
        model=str(body.get("model")), time=time, blocks=blocks, n_tools=n_tools, n_system=n_system,
        system_salt=canonical_bytes(body.get("speed")), messages_salt=salt_msgs,
        auto_ttl=_ttl_of(top, "") if top is not None else None, has_image=has_image,
    )


def message_blocks(m: Any, i: int, counter: TokenCounter) -> tuple[list[SimBlock], bool]:
    """The blocks of message ``i`` (a dict) and whether it holds an image."""
    msg = message_from_dict(m, i)
    out, has_image = [], False
    for j, b in enumerate(content_blocks(msg)):
        if isinstance(b, ImageBlock) or (isinstance(b, ToolResultBlock) and isinstance(b.content, list)
                                         and any(isinstance(x, ImageBlock) for x in b.content)):
            has_image = True
        out.append(_sim_block(b, counter, j == 0, f"messages[{i}].content[{j}]"))
    return out, has_image


def _sim_block(b: Block, counter: TokenCounter, first: bool, where: str) -> SimBlock:
    # null fields (e.g. ``citations: null`` from an SDK model dump) render no tokens, so they
    # do not change the cache key
    d = strip_for_key(block_to_dict(b, strip_cache_control=True))
    key = block_key(d)
    tokens = block_tokens(counter, key, b, first)
    kind = d["type"]
    cc = getattr(b, "cache_control", None) if not hasattr(b, "raw") else b.raw.get("cache_control")
    ttl = _ttl_of(cc, where)
    return SimBlock(key, tokens, kind, ttl, is_cacheable(kind, d), where)
