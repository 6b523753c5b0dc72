"""File operations that cannot be redirected: no symlink is followed, nothing is overwritten by
accident, and modes are exact (0700 directories, 0600 files) whatever the umask.

* new files are opened with ``O_CREAT | O_EXCL | O_NOFOLLOW``;
* replacements are written to a fresh temporary file (``mkstemp``: ``O_EXCL``) in the same
  directory and renamed over the target (a rename replaces a symlink, never its target);
* appends open with ``O_APPEND | O_NOFOLLOW`` and check the size first;
* the lock is ``flock`` on a file opened with ``O_NOFOLLOW`` and without ``O_TRUNC``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from .errors import SessionLockedError, StoreConflictError, StoreError

__all__ = ["FileLock", "append_bytes", "atomic_replace", "ensure_dir", "fsync_dir", "open_nofollow", "write_new"]

DIR_MODE = 0o700
FILE_MODE = 0o600
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def fsync_dir(p: Path) -> None:
    with contextlib.suppress(OSError):  # some filesystems refuse fsync on directories
        fd = os.open(p, os.O_RDONLY | _CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def ensure_dir(p: Path) -> None:
    """Create ``p`` and missing parents as 0700 directories; refuse a symlink or a non-directory."""
    missing: list[Path] = []
    q = p
    while not os.path.lexists(q):
        missing.append(q)
        if q.parent == q:
            break
        q = q.parent
    for d in reversed(missing):
        try:
            os.mkdir(d, DIR_MODE)
        except FileExistsError:
            continue  # made concurrently: its maker sets the mode
        os.chmod(d, DIR_MODE, follow_symlinks=False)
    st = os.lstat(p)
    if stat.S_ISLNK(st.st_mode):
        raise StoreError(f"{p}: is a symbolic link; refusing to use it as a store directory")
    if not stat.S_ISDIR(st.st_mode):
        raise StoreError(f"{p}: exists and is not a directory")


def open_nofollow(p: Path, flags: int) -> int:
    """``os.open`` that refuses symlinks with a clear error."""
    try:
        return os.open(p, flags | _NOFOLLOW | _CLOEXEC, FILE_MODE)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise StoreError(f"{p}: is a symbolic link; refusing to follow it") from None
        raise


def write_new(p: Path, data: bytes) -> None:
    """Create ``p`` (it must not exist), write, fsync; mode 0600."""
    fd = open_nofollow(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        os.fchmod(fd, FILE_MODE)
        _write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_replace(p: Path, data: bytes) -> None:
    """Replace ``p`` with ``data``: temporary file in the same folder, fsync, rename, fsync folder."""
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        os.fchmod(fd, FILE_MODE)
        _write_all(fd, data)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.close(fd)
    os.replace(tmp, p)
    fsync_dir(p.parent)


def append_bytes(p: Path, data: bytes, expected_size: int | None = None, *, fsync: bool = True) -> int:
    """Append with one write and an fsync (without it with ``fsync=False``: the caller syncs the
    file later, `fsync_file`); returns the new size. With ``expected_size`` the file must have
    exactly that size first (another writer or a tamper changed it otherwise)."""
    fd = open_nofollow(p, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        size = os.fstat(fd).st_size
        if expected_size is not None and size != expected_size:
            raise StoreConflictError(f"{p} (bytes)", expected_size, size)
        if size == 0:
            os.fchmod(fd, FILE_MODE)
        _write_all(fd, data)
        if fsync:
            os.fsync(fd)
        return size + len(data)
    finally:
        os.close(fd)


def fsync_file(p: Path) -> None:
    """Make what was written to ``p`` durable (every write to the file before this call)."""
    fd = open_nofollow(p, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class FileLock:
    """An exclusive ``flock`` on ``path``, reentrant within a thread, exclusive across threads and
    processes (each acquisition opens its own descriptor)."""

    def __init__(self, path: Path, timeout: float = 10.0) -> None:
        self.path = path
        self.timeout = timeout
        self._local = threading.local()

    def _wait(self, fd: int, mode: int) -> None:
        """``flock(fd, mode)``, polling with backoff until ``timeout``, then `SessionLockedError`."""
        deadline = time.monotonic() + self.timeout
        delay = 0.001
        while True:
            try:
                fcntl.flock(fd, mode | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise SessionLockedError(f"{self.path.parent}: another writer holds the session lock "
                                             f"(waited {self.timeout:.1f}s)") from None
                time.sleep(delay)
                delay = min(delay * 2, 0.05)

    @contextlib.contextmanager
    def hold_shared(self) -> Iterator[None]:
        """For readers that must not write (``ledger verify``): a shared lock on the lock file if
        it exists, never creating it (a read-only mount, an archived session). Without the file
        no writer has ever held the lock, so there is nothing to wait for."""
        if getattr(self._local, "depth", 0):
            yield
            return
        try:
            fd = open_nofollow(self.path, os.O_RDONLY)
        except FileNotFoundError:
            yield
            return
        try:
            self._wait(fd, fcntl.LOCK_SH)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        depth = getattr(self._local, "depth", 0)
        if depth:
            self._local.depth = depth + 1
            try:
                yield
            finally:
                self._local.depth -= 1
            return
        fd = open_nofollow(self.path, os.O_RDWR | os.O_CREAT)
        try:
            self._wait(fd, fcntl.LOCK_EX)
            self._local.depth = 1
            try:
                yield
            finally:
                self._local.depth = 0
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
