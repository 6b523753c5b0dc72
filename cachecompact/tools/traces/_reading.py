"""Reading a log a user points us at, whatever it turns out to be: the bytes, checked.

Every loader reads files through `read_text` and parses JSON through `json_value`, so a FIFO,
a device, a directory named ``.jsonl``, a binary file, a line nested ten thousand deep, an
integer of five thousand digits, ``NaN`` or a lone surrogate is a `TraceFormatError` naming
the file and the line, never a hang, a ``RecursionError`` or a crash several steps later
(issue 46: forensics and whatif failed 9 and 8 of 129 malformed logs, and hung on a FIFO).
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from pathlib import Path
from typing import Any

from .trace_model import TraceFormatError

__all__ = ["MAX_LOG_BYTES", "check_usage", "json_value", "read_text"]

MAX_LOG_BYTES = 1 << 30  # the largest log read (the longest recorded sessions are a few MB)

_KIND = {stat.S_IFIFO: "a named pipe (FIFO)", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
         stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a folder"}
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abAB]", re.ASCII)


def _not_regular(mode: int) -> str | None:
    if stat.S_ISREG(mode):
        return None
    return _KIND.get(stat.S_IFMT(mode), "not a regular file")


def read_text(path: str | Path) -> str:
    """The file's text: a regular file (checked before it is opened, and again on the open file,
    so a pipe never blocks the reader), at most `MAX_LOG_BYTES`, valid UTF-8 (a BOM is dropped)."""
    p = str(path)
    try:
        st = os.stat(p)
    except OSError as err:
        raise TraceFormatError(p, f"cannot read: {err.strerror or err}") from None
    kind = _not_regular(st.st_mode)
    if kind is not None:
        raise TraceFormatError(p, f"{kind}, not a log file")
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError as err:
        raise TraceFormatError(p, f"cannot read: {err.strerror or err}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        kind = _not_regular(st.st_mode)  # replaced between the two looks
        if kind is not None:
            raise TraceFormatError(p, f"{kind}, not a log file")
        if st.st_size > MAX_LOG_BYTES:
            raise TraceFormatError(p, f"{st.st_size:,} bytes, more than the {MAX_LOG_BYTES:,} a log is read up to")
        data = f.read(MAX_LOG_BYTES + 1)
    if len(data) > MAX_LOG_BYTES:
        raise TraceFormatError(p, f"more than the {MAX_LOG_BYTES:,} bytes a log is read up to")
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as err:
        head = "gzip data" if data[:2] == b"\x1f\x8b" else "binary data" if b"\0" in data[:4096] else "not UTF-8"
        raise TraceFormatError(p, f"not a text log ({head}: byte {err.start} is not UTF-8)") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def json_value(text: str, where: str, line: int | None = None) -> Any:
    """``text`` as JSON, or `TraceFormatError` naming the place: invalid JSON, nesting deeper than
    the parser goes, an integer too long to convert, ``NaN``/``Infinity``, a lone surrogate."""
    at = f"line {line}: " if line is not None else ""
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError:
        raise
    except RecursionError:
        raise TraceFormatError(where, f"{at}nested too deeply to read") from None
    except ValueError as err:  # NaN/Infinity, or an integer of more digits than Python converts
        raise TraceFormatError(where, f"{at}{str(err)[:120]}") from None
    if _SURROGATE_ESCAPE.search(text):  # only an escape can make one: UTF-8 text holds none
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise TraceFormatError(where, f"{at}a lone UTF-16 surrogate (\\ud800-\\udfff) in a string") from None
        except RecursionError:
            raise TraceFormatError(where, f"{at}nested too deeply to read") from None
    return value


_TOKEN_FIELDS = ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")


def _count(v: Any) -> bool:
    return v is None or (isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 53)


def check_usage(usage: Any, where: str, at: str) -> None:
    """A recorded ``usage`` as the API writes it: its token fields non-negative integers (or
    null), ``cache_creation`` and each ``iterations`` entry the same; else `TraceFormatError`."""
    if usage is None:
        return
    if not isinstance(usage, dict):
        raise TraceFormatError(where, f"{at}: message.usage is not an object")
    for k in _TOKEN_FIELDS:
        if not _count(usage.get(k)):
            raise TraceFormatError(where, f"{at}: message.usage.{k} is {str(usage.get(k))[:40]}, not a token count")
    cc = usage.get("cache_creation")
    if cc is not None and (not isinstance(cc, dict) or not all(_count(v) for v in cc.values())):
        raise TraceFormatError(where, f"{at}: message.usage.cache_creation is not an object of token counts")
    its = usage.get("iterations")
    if its is not None:
        if not isinstance(its, list) or not all(isinstance(x, dict) for x in its):
            raise TraceFormatError(where, f"{at}: message.usage.iterations is not a list of objects")
        for x in its:
            check_usage({k: x.get(k) for k in (*_TOKEN_FIELDS, "cache_creation")}, where, at)


def finite(v: Any) -> float | None:
    """A number a log field may hold, as a float, or None when it is not one (bool, NaN, inf)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        f = float(v)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None
