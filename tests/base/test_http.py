"""`SSEUsage`, the stream usage parser of the middleware and the proxy: the same result however
a stream is split, with LF or CRLF frames."""

from __future__ import annotations

import json
import re
from typing import Any

from hypothesis import given, settings, strategies as st

from cachecompact.base.http import SSEUsage
from cachecompact.base.values import Answer

EVENTS = [
    {"type": "message_start", "message": {"id": "msg_1", "usage": {"input_tokens": 10, "cache_read_input_tokens": 3},
                                          "diagnostics": {"cache_miss_reason": {"type": "ttl"}}}},
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "a \"message_\" in text"}},
    {"type": "ping"},
    {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 7}},
    {"type": "message_stop"},
]


def _stream(events: list[dict[str, Any]], seps: list[str]) -> bytes:
    out = []
    for k, e in enumerate(events):
        sep = seps[k % len(seps)]
        out.append(f"event: {e['type']}{sep[:len(sep) // 2]}data: {json.dumps(e)}{sep}")
    return "".join(out).encode()


def _reference(raw: bytes) -> tuple[dict[str, Any], str | None, Any]:
    """Frame by frame, the slow obvious way."""
    usage: dict[str, Any] = {}
    mid = diag = None
    for frame in re.split(rb"\r\n\r\n|\n\n", raw):
        for line in frame.splitlines():
            if not line.startswith(b"data:") or b"message_" not in line:
                continue
            d = json.loads(line[5:])
            if d["type"] == "message_start":
                mid = d["message"]["id"]
                usage.update(d["message"]["usage"])
                diag = d["message"].get("diagnostics", {}).get("cache_miss_reason")
            elif d["type"] == "message_delta":
                usage.update(d["usage"])
    return usage, mid, diag


def _triple(a: Answer | None) -> tuple[dict[str, Any], str | None, Any] | None:
    return None if a is None else (a.usage, a.message_id, a.cache_miss_reason)


def _parse(parts: list[bytes]) -> tuple[dict[str, Any], str | None, Any] | None:
    p = SSEUsage()
    got = [a for a in [*(p.feed(part) for part in parts), p.finish()] if a is not None]
    assert len(got) <= 1  # the answer is returned once
    return _triple(got[0]) if got else None


@settings(max_examples=300, deadline=None)
@given(seps=st.lists(st.sampled_from(["\n\n", "\r\n\r\n"]), min_size=1, max_size=4),
       cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=30),
       drop_stop=st.booleans())
def test_any_split_gives_the_reference_result(seps: list[str], cuts: list[int], drop_stop: bool) -> None:
    events = EVENTS[:-1] if drop_stop else EVENTS
    raw = _stream(events, seps)
    if drop_stop:
        raw = raw.rstrip(b"\r\n")  # the last frame without its blank line: finish() reads it
    points = sorted({min(c, len(raw)) for c in cuts})
    parts = [raw[a:b] for a, b in zip([0, *points], [*points, len(raw)], strict=True)]
    assert _parse(parts) == _reference(raw) == _parse([raw])


def test_a_huge_frame_split_into_many_chunks() -> None:
    """One 8 MB frame in 16 KB chunks (its speed is not timed here: the chunks are only collected
    until the frame ends, see `SSEUsage.feed`)."""
    big = b"data: " + b"x" * (8 << 20) + b"\n\n"
    raw = _stream(EVENTS[:1], ["\n\n"]) + big + _stream(EVENTS[4:], ["\n\n"])
    chunks = [raw[i:i + 16384] for i in range(0, len(raw), 16384)]
    assert _parse(chunks) == _parse([raw]) == _reference(raw)


def test_a_separator_split_over_tiny_pieces_ends_the_frame_at_once() -> None:
    """The usage is reported when the stop frame ends, not only at ``finish``, even if its blank
    line arrives one byte at a time (compact mode records a stream before its last bytes)."""
    raw = _stream(EVENTS, ["\r\n\r\n"])
    p = SSEUsage()
    assert p.feed(raw[:-4]) is None
    got = [p.feed(raw[-k:len(raw) - k + 1]) for k in range(4, 0, -1)]
    assert [_triple(a) for a in got if a is not None] == [_reference(raw)] and got[-1] is not None
    assert p.finish() is None  # returned once


def test_the_proxy_tap_parses_a_long_compressed_stream_and_keeps_little_of_it() -> None:
    """Observe mode keeps a response's bytes for the analysis thread, up to `_Tap.SSE_DEFER` for a
    stream; past that it parses as the stream passes, so memory stays small either way."""
    import gzip
    import random

    from cachecompact.adapters.proxy._tap import ResponseTap as _Tap

    rng = random.Random(1)
    filler = [{"type": "content_block_delta", "index": 0,
               "delta": {"type": "text_delta", "text": "".join(rng.choice("abcdef ") for _ in range(2000))}}
              for _ in range(1500)]
    raw = _stream([EVENTS[0], *filler, *EVENTS[4:]], ["\n\n"])
    wire = gzip.compress(raw)
    assert len(wire) > _Tap.SSE_DEFER
    tap = _Tap("text/event-stream", "gzip")
    for i in range(0, len(wire), 16384):
        tap.feed(wire[i:i + 16384])
        assert tap.size <= _Tap.SSE_DEFER + 16384
    assert _triple(tap.finish()) == _reference(raw)
    small = _Tap("text/event-stream", "gzip")
    small.feed(gzip.compress(_stream(EVENTS, ["\n\n"])))
    # parsed only at the end
    assert small.parser is None and _triple(small.finish()) == _reference(_stream(EVENTS, ["\n\n"]))


def test_the_reader_that_saw_the_stream_says_so() -> None:
    """Whether an answer was streamed is set by the reader of the transport (issue 39: as the
    third of a positional tuple it was once recorded as ``false`` for a streamed request)."""
    from cachecompact.adapters.proxy._tap import ResponseTap as _Tap

    p = SSEUsage()
    got = [a for a in (p.feed(_stream(EVENTS, ["\n\n"])), p.finish()) if a is not None]
    body = json.dumps({"id": "msg_1", "usage": {"input_tokens": 3, "output_tokens": 1}}).encode()
    tap = _Tap("application/json", "")
    tap.feed(body)
    assert [a.stream for a in got] == [True]
    assert tap.finish() == Answer({"input_tokens": 3, "output_tokens": 1}, "msg_1", None, stream=False)
