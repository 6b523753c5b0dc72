"""The terminal's width, and the one way every command folds a line to it."""

from __future__ import annotations

import textwrap

__all__ = ["WIDTH", "fold", "shorten"]

WIDTH = 120  # the columns every command's terminal output fits (the rest goes to files)


def fold(text: str, indent: str = "  ") -> str:
    """``text`` with each line over `WIDTH` columns folded, its continuation indented (a path or
    a name is never broken at a hyphen)."""
    return "\n".join(textwrap.fill(ln, WIDTH, subsequent_indent=indent, break_on_hyphens=False)
                     if len(ln) > WIDTH else ln for ln in text.split("\n"))


def shorten(text: str, width: int) -> str:
    """``text`` on one line of at most ``width`` characters, cut at a word boundary with `` ...``
    (never mid-word, the way a report line must read)."""
    return textwrap.shorten(" ".join(text.split()), width, placeholder=" ...")
