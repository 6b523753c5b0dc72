"""Record formats and chain rules shared by every store (see docs/ledger-format.md).

* transcript record: ``{"c": chain, "h": xxh3-128 hex of m, "i": index, "m": message}`` with
  ``c = sha256(bytes.fromhex(previous c) + canonical_json(m))`` (64 zeros before the first);
* ledger entry: a `LedgerEntry` (sha256 over the entry without ``hash``, chained by
  ``prev_hash``), committing to the transcript chain value at its ``transcript_len``;
* request record: any JSON object sealed with ``seq``, ``prev_hash`` and ``hash`` the same way,
  committing to ``transcript_len``/``transcript_head`` and ``ledger_len``/``ledger_head``.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec

from ..base.errors import LedgerCorruptError
from ..base.wire import canonical_bytes

__all__ = ["FORMAT", "GENESIS", "VERSION", "decode_record", "record_hash", "seal", "transcript_chain"]

_DECODER = msgspec.json.Decoder()


def decode_record(raw: bytes, where: str, line: int) -> Any:
    """One stored record, which must be exactly its canonical JSON (docs/ledger-format.md): the
    hashes are over canonical bytes, so a change the hashes would not see (a space between
    tokens, a CR before the newline, keys reordered, an escape written another way) is
    corruption too, and the verdict is the same as a verifier's that reads the bytes."""
    try:
        value = _DECODER.decode(raw)
    except msgspec.DecodeError as err:
        raise LedgerCorruptError(where, line, f"not valid JSON: {err}") from None
    if canonical_bytes(value) != raw:
        raise LedgerCorruptError(where, line, "the record is not in canonical JSON (bytes were changed where its "
                                              "hashes do not reach: spacing, a CR, key order or an escape)")
    return value

FORMAT = "cachecompact-session"
VERSION = 2
GENESIS = "0" * 64


def transcript_chain(prev: str, message: Any) -> str:
    """The transcript chain value after ``message`` (sha256, hex)."""
    return hashlib.sha256(bytes.fromhex(prev) + canonical_bytes(message)).hexdigest()


def record_hash(rec: dict[str, Any]) -> str:
    """sha256 hex of the canonical JSON of ``rec`` without its ``hash`` key."""
    return hashlib.sha256(canonical_bytes({k: v for k, v in rec.items() if k != "hash"})).hexdigest()


def seal(rec: dict[str, Any], seq: int, prev_hash: str) -> dict[str, Any]:
    """``rec`` with its place in a hash chain: ``seq``, ``prev_hash`` and ``hash``."""
    out = {**rec, "seq": seq, "prev_hash": prev_hash}
    out["hash"] = record_hash(out)
    return out
