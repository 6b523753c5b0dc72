"""The embedded session store: one directory, JSON Lines, fsync on every append, a file lock.

Layout (see docs/ledger-format.md)::

    DIR/session.json      metadata: system, tools, prefix size and hash (written atomically)
    DIR/transcript.jsonl  {"h": <xxh3-128 hex of the message>, "i": <index>, "m": <message>}
    DIR/ledger.jsonl      one hash-chained LedgerEntry per line
    DIR/.lock             advisory lock held while reading-then-appending

A crash can only leave a torn *last* line (no trailing newline, or not JSON). It is reported
on load, the records before it are kept, and it is moved aside to ``<file>.torn`` before the
next append. Anything else that does not verify raises `LedgerCorruptError` naming the line.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import filelock
import msgspec

from .errors import LedgerCorruptError, SessionLockedError, StoreError
from .wire import canonical_bytes

__all__ = ["EVENTS", "FORMAT", "REQUESTS", "SessionStore", "TornTail"]

FORMAT = "cachecompact-session"
VERSION = 1
TRANSCRIPT = "transcript.jsonl"
LEDGER = "ledger.jsonl"
META = "session.json"
REQUESTS = "requests.jsonl"  # the monitor's per-request records (append-only log, not verified)
EVENTS = "events.jsonl"  # compaction and cache events (append-only log, not verified)

_DECODER = msgspec.json.Decoder()


@dataclass(frozen=True, slots=True)
class TornTail:
    """A partial last line found on load (a crash during an append)."""

    path: str
    line: int
    size: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: torn last line ({self.size} bytes) ignored; earlier records kept"


@dataclass(slots=True)
class _Tail:
    offset: int = 0  # bytes of complete lines consumed
    lines: int = 0  # complete lines consumed
    torn: TornTail | None = None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


class SessionStore:
    """Files of one session directory. All appends go through `append_lines` under `lock`."""

    def __init__(self, path: Path, lock_timeout: float = 10.0) -> None:
        self.path = Path(path)
        self.lock_timeout = lock_timeout
        self._lock = filelock.FileLock(str(self.path / ".lock"), timeout=lock_timeout, mode=0o600)
        self._tails: dict[str, _Tail] = {TRANSCRIPT: _Tail(), LEDGER: _Tail()}

    # -- creation and opening ----------------------------------------------------------------

    @classmethod
    def create(cls, path: str | os.PathLike[str], meta: dict[str, Any], lock_timeout: float = 10.0) -> SessionStore:
        p = Path(path)
        if p.exists() and (not p.is_dir() or any(p.iterdir())):
            raise StoreError(f"{p}: already exists and is not an empty directory")
        p.mkdir(mode=0o700, parents=True, exist_ok=True)
        store = cls(p, lock_timeout)
        with store.lock():
            store.write_meta(meta)
            for name in (TRANSCRIPT, LEDGER):
                os.close(os.open(p / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            _fsync_dir(p)
        return store

    @classmethod
    def open(cls, path: str | os.PathLike[str], lock_timeout: float = 10.0) -> SessionStore:
        p = Path(path)
        if not (p / META).is_file():
            raise StoreError(f"{p}: not a cachecompact session directory (no {META})")
        return cls(p, lock_timeout)

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Hold the session lock; a second process waits up to ``lock_timeout`` seconds."""
        try:
            self._lock.acquire()
        except filelock.Timeout:
            raise SessionLockedError(
                f"{self.path}: another process holds the session lock (waited {self.lock_timeout:.1f}s)"
            ) from None
        try:
            yield
        finally:
            self._lock.release()

    # -- metadata ----------------------------------------------------------------------------

    def read_meta(self) -> dict[str, Any]:
        p = self.path / META
        try:
            meta = _DECODER.decode(p.read_bytes())
        except (OSError, msgspec.DecodeError) as err:
            raise StoreError(f"{p}: unreadable session metadata: {err}") from None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise StoreError(f"{p}: not a {FORMAT} file")
        if meta.get("version") != VERSION:
            raise StoreError(f"{p}: unsupported version {meta.get('version')!r} (this build reads {VERSION})")
        return meta

    def write_meta(self, meta: dict[str, Any]) -> None:
        """Replace session.json atomically (temp file, fsync, rename, fsync dir)."""
        meta = {**meta, "format": FORMAT, "version": VERSION}
        final = self.path / META
        tmp = self.path / f".{META}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            _write_all(fd, canonical_bytes(meta) + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, final)
        _fsync_dir(self.path)

    # -- JSON Lines ----------------------------------------------------------------------------

    def read_new(self, name: str) -> tuple[list[tuple[int, Any]], TornTail | None]:
        """Records appended since the last call, as (1-based line number, decoded value)."""
        tail = self._tails[name]
        p = self.path / name
        try:
            with open(p, "rb") as f:
                f.seek(tail.offset)
                data = f.read()
        except OSError as err:
            raise StoreError(f"{p}: cannot read: {err}") from None
        out: list[tuple[int, Any]] = []
        pos = 0
        tail.torn = None
        while pos < len(data):
            nl = data.find(b"\n", pos)
            line_no = tail.lines + 1
            if nl < 0:
                tail.torn = TornTail(str(p), line_no, len(data) - pos)
                break
            chunk = data[pos:nl]
            try:
                value = _DECODER.decode(chunk)
            except msgspec.DecodeError as err:
                if nl == len(data) - 1:  # the very last line: a torn write that happened to end in \n
                    tail.torn = TornTail(str(p), line_no, len(data) - pos)
                    break
                raise LedgerCorruptError(str(p), line_no, f"not valid JSON: {err}") from None
            out.append((line_no, value))
            tail.lines += 1
            tail.offset += nl + 1 - pos
            pos = nl + 1
        return out, tail.torn

    def torn(self, name: str) -> TornTail | None:
        return self._tails[name].torn

    def append_lines(self, name: str, records: list[Any]) -> None:
        """Append records as JSON lines with one write and an fsync. Caller holds the lock."""
        if not records:
            return
        p = self.path / name
        tail = self._tails[name]
        if tail.torn is not None:
            self._set_aside_torn(p, tail)
        data = b"".join(canonical_bytes(r) + b"\n" for r in records)
        fd = os.open(p, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size != tail.offset:
                raise StoreError(f"{p}: file changed underneath this session (size {os.fstat(fd).st_size}, "
                                 f"expected {tail.offset}); reopen the session")
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        tail.offset += len(data)
        tail.lines += len(records)

    def append_log(self, name: str, records: list[Any]) -> None:
        """Append to an informational log (requests, events): one write, fsync, no offset check.

        A torn last line here is skipped by readers; these files are not part of verification.
        """
        if not records:
            return
        data = b"".join(canonical_bytes(r) + b"\n" for r in records)
        fd = os.open(self.path / name, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)

    @staticmethod
    def _set_aside_torn(p: Path, tail: _Tail) -> None:
        """Move a torn tail to ``<file>.torn`` and cut the file back to its last complete line."""
        with open(p, "rb") as f:
            f.seek(tail.offset)
            junk = f.read()
        if junk:
            aside = p.with_name(p.name + f".torn.{int(time.time() * 1000)}")
            fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                _write_all(fd, junk)
                os.fsync(fd)
            finally:
                os.close(fd)
        with open(p, "r+b") as f:
            f.truncate(tail.offset)
            f.flush()
            os.fsync(f.fileno())
        tail.torn = None


def _fsync_dir(p: Path) -> None:
    with contextlib.suppress(OSError):  # some filesystems refuse fsync on directories
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
