"""The embedded store: one directory per session, JSON Lines, fsync on every append (a
deferred append, `FileSessionStore.append_deferred`, is fsynced by `FileSessionStore.flush` or
before the next plain append or metadata write, whichever comes first).

Layout of a session directory (see docs/ledger-format.md)::

    DIR/session.json       metadata (replaced atomically)
    DIR/transcript.jsonl   hash-chained messages
    DIR/ledger.jsonl       hash-chained edits
    DIR/requests.jsonl     hash-chained request records
    DIR/events.jsonl       compaction and cache events (informational, not chained)
    DIR/scratchpad/        externalized tool output, ``<ref>.txt``
    DIR/.lock              flock target while reading-then-appending

A session directory is built in a hidden temporary sibling and renamed into place, so it
appears complete or not at all. A crash can only leave a torn *last* line (no trailing
newline); it is reported, the records before it are kept, and it is moved to
``<file>.torn.<ms>`` before the next append. A line that ends in a newline but does not
parse is corruption, never a torn tail.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import stat
import threading
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from ..base.errors import (
    InvalidSessionIdError,
    SessionExistsError,
    SessionNotFoundError,
    StoreConflictError,
    StoreError,
)
from ..base.safefs import (
    FileLock,
    append_bytes,
    atomic_replace,
    ensure_dir,
    fsync_dir,
    fsync_file,
    open_nofollow,
    write_new,
)
from ..base.wire import canonical_bytes
from .contract import LOGS, LogName, TornTail, blob_matches, check_blob_ref, check_ref, check_session_id
from .records import FORMAT, VERSION, decode_record

__all__ = ["EVENTS", "FILES", "META", "FileSessionStore", "FileStore", "half_made"]

log = logging.getLogger("cachecompact")

META = "session.json"
EVENTS = "events.jsonl"
FILES: dict[LogName, str] = {"transcript": "transcript.jsonl", "ledger": "ledger.jsonl", "requests": "requests.jsonl"}
SCRATCH = "scratchpad"
_DECODER = msgspec.json.Decoder()


@dataclass(slots=True)
class _Tail:
    offset: int = 0  # bytes of complete lines consumed
    lines: int = 0  # complete lines consumed
    torn: TornTail | None = None


_OURS = {META, EVENTS, ".lock", SCRATCH, *FILES.values()}


def half_made(p: Path) -> bool:
    """A directory a crash left during creation (or an older version's partial create): only
    session files, no metadata or metadata without its logs, and no data in any log. A
    directory holding anything else is never taken for one."""
    if not p.is_dir() or p.is_symlink():
        return False
    names = {x.name for x in p.iterdir()}
    if any(n not in _OURS and not (n.startswith(f".{META}.") and n.endswith(".tmp")) for n in names):
        return False
    if META in names and all(f in names for f in FILES.values()):
        return False
    for f in FILES.values():
        q = p / f
        if q.is_file() and q.stat().st_size > 0:
            return False
    return True


def _read_file(p: Path) -> bytes:
    fd = open_nofollow(p, os.O_RDONLY)
    try:
        chunks = []
        while True:
            b = os.read(fd, 1 << 20)
            if not b:
                break
            chunks.append(b)
        return b"".join(chunks)
    finally:
        os.close(fd)


class FileSessionStore:
    """One session directory. Appends go through `append` under `lock`."""

    def __init__(self, path: Path, lock_timeout: float = 10.0) -> None:
        self.path = Path(path)
        self.lock_timeout = lock_timeout
        self._lock = FileLock(self.path / ".lock", lock_timeout)
        self._tails: dict[LogName, _Tail] = {k: _Tail() for k in FILES}
        # logs with deferred appends not yet fsynced (`append_deferred`); the lock is held while they are
        # synced, so an append that needs them durable waits for a flush under way instead of passing it
        self._unsynced: set[LogName] = set()
        self._sync_lock = threading.Lock()
        self._events_unsynced = False  # `append_event_deferred`

    # -- creation and opening ----------------------------------------------------------------

    @classmethod
    def create(cls, path: str | os.PathLike[str], meta: dict[str, Any], lock_timeout: float = 10.0
               ) -> FileSessionStore:
        """Build the directory in a hidden sibling, then rename it into place."""
        final = Path(path)
        ensure_dir(final.parent)
        if os.path.lexists(final):
            if final.is_symlink() or not final.is_dir():
                raise SessionExistsError(f"{final}: already exists and is not a session directory")
            if half_made(final):
                aside = final.with_name(f".{final.name}.broken-{int(time.time() * 1000)}")
                log.warning("cachecompact: %s is a half-made session directory (a crash during creation); "
                            "moved aside to %s and rebuilt", final, aside.name)
                os.rename(final, aside)
            elif any(final.iterdir()):
                raise SessionExistsError(f"{final}: already exists")
        tmp = final.with_name(f".{final.name}.creating-{os.getpid()}-{secrets.token_hex(4)}")
        os.mkdir(tmp, 0o700)
        try:
            os.chmod(tmp, 0o700)
            write_new(tmp / META, canonical_bytes({**meta, "format": FORMAT, "version": VERSION}) + b"\n")
            for name in FILES.values():
                write_new(tmp / name, b"")
            fsync_dir(tmp)
            try:
                os.rename(tmp, final)  # replaces only an empty directory; a taken name fails
            except OSError as err:
                raise SessionExistsError(f"{final}: already exists ({err.strerror})") from None
            fsync_dir(final.parent)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return cls(final, lock_timeout)

    @classmethod
    def open(cls, path: str | os.PathLike[str], lock_timeout: float = 10.0) -> FileSessionStore:
        p = Path(path)
        if p.is_symlink():
            raise StoreError(f"{p}: is a symbolic link; refusing to open it as a session")
        if not p.is_dir():
            raise SessionNotFoundError(f"{p}: no such session directory")
        if not (p / META).exists():
            inside = sorted(c.name for c in p.iterdir() if c.is_dir() and (c / META).is_file())[:3]
            if inside:
                raise SessionNotFoundError(f"{p}: a store holding sessions ({', '.join(inside)}, ...), not a session; "
                                           f"name one, e.g. {p / inside[0]}")
            if not any(p.iterdir()):
                raise SessionNotFoundError(f"{p}: an empty folder, not a cachecompact session directory")
        if half_made(p):
            raise SessionNotFoundError(f"{p}: a half-made session directory (a crash during creation, no data); "
                                       "create the session again")
        if not (p / META).is_file():
            raise StoreError(f"{p}: not a cachecompact session directory (no {META})")
        missing = [f for f in FILES.values() if not (p / f).is_file()]
        if missing:
            raise StoreError(f"{p}: session directory is missing {', '.join(missing)}")
        return cls(p, lock_timeout)

    # -- identity ----------------------------------------------------------------------------

    @property
    def session_id(self) -> str:
        return self.path.name

    @property
    def location(self) -> str:
        return str(self.path)

    def where(self, log: LogName) -> str:
        return str(self.path / FILES[log])

    def lock(self) -> AbstractContextManager[None]:
        return self._lock.hold()

    def read_lock(self) -> AbstractContextManager[None]:
        """Shared, and never creates the lock file (see `Session.open` with ``readonly``)."""
        return self._lock.hold_shared()

    # -- metadata ----------------------------------------------------------------------------

    def read_meta(self) -> dict[str, Any]:
        p = self.path / META
        try:
            raw = _read_file(p)
            meta = _DECODER.decode(raw)
        except (OSError, msgspec.DecodeError) as err:
            raise StoreError(f"{p}: unreadable session metadata: {err}") from None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise StoreError(f"{p}: not a {FORMAT} file")
        if raw.removesuffix(b"\n") != canonical_bytes(meta):  # docs/ledger-format.md, *session.json*
            raise StoreError(f"{p}: not in canonical JSON (bytes were changed: spacing, indentation, key order or an "
                             "escape); the store writes it as exactly its canonical JSON and one newline")
        if meta.get("version") != VERSION:
            raise StoreError(f"{p}: format version {meta.get('version')!r} is not supported by this build (it reads "
                             f"version {VERSION}; version 1 sessions cannot be upgraded in place, see CHANGELOG.md)")
        return meta

    def write_meta(self, meta: dict[str, Any]) -> None:
        self.flush()  # the prefix fields name transcript messages: those are durable first
        atomic_replace(self.path / META, canonical_bytes({**meta, "format": FORMAT, "version": VERSION}) + b"\n")

    # -- logs ---------------------------------------------------------------------------------

    def read_new(self, log: LogName) -> tuple[list[tuple[int, Any]], TornTail | None]:
        tail = self._tails[log]
        p = self.path / FILES[log]
        with contextlib.suppress(OSError):  # the read below says what is wrong
            st = os.lstat(p)
            if stat.S_ISREG(st.st_mode) and st.st_size == tail.offset:
                # nothing after what was read (each turn asks, twice, of three logs): no open and read
                tail.torn = None
                return [], None
        try:
            fd = open_nofollow(p, os.O_RDONLY)
            try:
                os.lseek(fd, tail.offset, os.SEEK_SET)
                parts = []
                while True:
                    b = os.read(fd, 1 << 20)
                    if not b:
                        break
                    parts.append(b)
                data = b"".join(parts)
            finally:
                os.close(fd)
        except FileNotFoundError:
            raise StoreError(f"{p}: missing") from None
        except OSError as err:
            raise StoreError(f"{p}: cannot read: {err}") from None
        out: list[tuple[int, Any]] = []
        pos = 0
        tail.torn = None
        while pos < len(data):
            nl = data.find(b"\n", pos)
            line_no = tail.lines + 1
            if nl < 0:  # no newline: a write that did not finish
                tail.torn = TornTail(str(p), line_no, len(data) - pos, log)
                break
            out.append((line_no, decode_record(data[pos:nl], str(p), line_no)))
            tail.lines += 1
            tail.offset += nl + 1 - pos
            pos = nl + 1
        if out:  # another writer's records, maybe deferred and not yet durable: ours that name them wait for them
            with self._sync_lock:
                self._unsynced.add(log)
        return out, tail.torn

    def read_all(self, log: LogName) -> list[tuple[int, Any]]:
        reader = FileSessionStore(self.path, self.lock_timeout)
        records, _ = reader.read_new(log)
        return records

    def append(self, log: LogName, records: list[dict[str, Any]], at: int) -> None:
        self._append(log, records, at, durable=True)

    def append_deferred(self, log: LogName, records: list[dict[str, Any]], at: int) -> None:
        """`append`, written but not yet fsynced: durable at the next `flush`, or before the next
        write of another log or of the metadata, whichever comes first. Readers see it at once; a
        crash of the process keeps it (the kernel has it), one of the machine before the flush
        may lose it (a torn last line is set aside as always). Nothing is written that names it
        before it is durable, and it is written only once what it names is (the other logs'
        deferred appends are synced first), so the kernel writing pages back in any order
        never leaves a durable record naming a lost one. Records read from another writer
        (`read_new`), which may have deferred them, count as deferred here too: this store
        object syncs their file before it writes anything that names them."""
        self._append(log, records, at, durable=False)

    def flush(self, but: LogName | None = None) -> None:
        """Make every deferred append durable (`append_deferred`, `append_event_deferred`); with
        ``but``, those of the other logs only (events wait for a flush without it)."""
        with self._sync_lock:
            for log in LOGS:  # in the order records name each other: transcript, ledger, requests
                if log in self._unsynced and log != but:
                    fsync_file(self.path / FILES[log])
                    self._unsynced.discard(log)
            if self._events_unsynced and but is None:
                fsync_file(self.path / EVENTS)
                self._events_unsynced = False

    def _append(self, log: LogName, records: list[dict[str, Any]], at: int, *, durable: bool) -> None:
        if not records:
            return
        tail = self._tails[log]
        if at != tail.lines:
            raise StoreConflictError(self.where(log), at, tail.lines)
        p = self.path / FILES[log]
        if tail.torn is not None:
            self.repair(log)
        data = b"".join(canonical_bytes(r) + b"\n" for r in records)
        self.flush(None if durable else log)  # what these records name is durable before they are written
        tail.offset = append_bytes(p, data, expected_size=tail.offset, fsync=durable)
        tail.lines += len(records)
        if not durable:
            with self._sync_lock:
                self._unsynced.add(log)

    def repair(self, log: LogName) -> TornTail | None:
        """Move a torn tail to ``<file>.torn.<ms>`` and cut the file back to its last complete line."""
        tail = self._tails[log]
        torn = tail.torn
        if torn is None:
            return None
        p = self.path / FILES[log]
        fd = open_nofollow(p, os.O_RDWR)
        try:
            os.lseek(fd, tail.offset, os.SEEK_SET)
            junk = os.read(fd, 1 << 24)
            if junk:
                write_new(p.with_name(p.name + f".torn.{int(time.time() * 1000)}"), junk)
            os.ftruncate(fd, tail.offset)
            os.fsync(fd)
        finally:
            os.close(fd)
        tail.torn = None
        return torn

    def append_event(self, event: dict[str, Any]) -> None:
        append_bytes(self.path / EVENTS, canonical_bytes(event) + b"\n")

    def append_event_deferred(self, event: dict[str, Any]) -> None:
        """`append_event`, synced at the next `flush` (nothing names an event: an informational log)."""
        append_bytes(self.path / EVENTS, canonical_bytes(event) + b"\n", fsync=False)
        with self._sync_lock:
            self._events_unsynced = True

    def read_events(self) -> list[dict[str, Any]]:
        p = self.path / EVENTS
        if not p.is_file():
            return []
        out = []
        for line in _read_file(p).split(b"\n"):
            if line.strip():
                try:
                    v = _DECODER.decode(line)
                except msgspec.DecodeError:  # a torn last line of an informational log
                    continue
                if isinstance(v, dict):
                    out.append(v)
        return out

    # -- scratchpad blobs -----------------------------------------------------------------------

    def _blob_path(self, ref: str) -> Path:
        check_blob_ref(ref, f"{self.path / SCRATCH}")  # a name is never a path (../x, /abs)
        d = self.path / SCRATCH
        ensure_dir(d)
        return d / f"{ref}.txt"

    def put_blob(self, ref: str, data: bytes) -> None:
        p = self._blob_path(ref)
        if p.is_file() and not p.is_symlink():
            if not blob_matches(ref, data):  # never trade stored bytes for others that are no better
                return
            with contextlib.suppress(OSError, StoreError):  # unreadable: written again below
                if p.stat().st_size == len(data) and _read_file(p) == data:
                    return
        # absent, or damaged since it was stored: the same name with the right bytes mends it, so
        # the read error's advice ("run the tool again") repairs what it reports
        atomic_replace(p, data)

    def blob_refs(self) -> list[str]:
        d = self.path / SCRATCH
        if not d.is_dir() or d.is_symlink():
            return []
        return sorted(p.name[:-4] for p in d.iterdir() if p.name.endswith(".txt") and p.is_file()
                      and not p.is_symlink())

    def get_blob(self, ref: str) -> bytes | None:
        check_blob_ref(ref, f"{self.path / SCRATCH}")
        d = self.path / SCRATCH
        if d.is_symlink():  # a planted link never leads out of the session
            return None
        p = d / f"{ref}.txt"
        try:
            return _read_file(p)
        except FileNotFoundError:
            return None


class FileStore:
    """A directory of session directories, named by session id."""

    def __init__(self, root: str | os.PathLike[str], lock_timeout: float = 10.0) -> None:
        self.root = Path(root)
        self.lock_timeout = lock_timeout

    @property
    def url(self) -> str:
        return str(self.root)

    def _path(self, session_id: str) -> Path:
        return self.root / check_session_id(session_id)

    def create(self, session_id: str, meta: dict[str, Any]) -> FileSessionStore:
        return FileSessionStore.create(self._path(session_id), meta, self.lock_timeout)

    def open(self, session_id: str) -> FileSessionStore:
        return FileSessionStore.open(self._path(session_id), self.lock_timeout)

    def exists(self, session_id: str) -> bool:
        p = self._path(session_id)
        return p.is_dir() and not p.is_symlink() and (p / META).is_file() and not half_made(p)

    def delete(self, session_id: str) -> None:
        p = self._path(session_id)
        if not p.is_dir() or p.is_symlink():
            raise SessionNotFoundError(f"{p}: no such session")
        gone = self.root / f".deleting-{session_id}-{secrets.token_hex(4)}"
        os.rename(p, gone)  # out of sight at once (hidden names are never listed or opened) ...
        shutil.rmtree(gone, ignore_errors=True)  # ... then removed

    def blob_owners(self, ref: str) -> list[str]:
        """Sessions holding scratchpad content ``ref``, by a few stats each (none opened)."""
        check_ref(ref)
        if not self.root.is_dir():
            return []
        out = []
        for x in sorted(self.root.iterdir()):
            with contextlib.suppress(OSError, InvalidSessionIdError):  # gone meanwhile, or not a session id (hidden)
                check_session_id(x.name)
                if stat.S_ISDIR(os.lstat(x).st_mode) and (x / META).is_file() \
                        and stat.S_ISDIR(os.lstat(x / SCRATCH).st_mode) \
                        and stat.S_ISREG(os.lstat(x / SCRATCH / f"{ref}.txt").st_mode) and not half_made(x):
                    out.append(x.name)
        return out

    def list(self, prefix: str = "") -> list[str]:
        if not self.root.is_dir():
            return []
        out = []
        for x in self.root.iterdir():
            if not x.name.startswith(prefix) or x.name.startswith("."):
                continue
            with contextlib.suppress(FileNotFoundError):  # deleted by another process since iterdir
                if stat.S_ISDIR(os.lstat(x).st_mode) and (x / META).is_file():
                    out.append(x.name)
        return sorted(out)

    def close(self) -> None:
        return None
