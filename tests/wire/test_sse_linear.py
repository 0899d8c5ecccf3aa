"""SSE framing of events of any size under any chunking: the incremental decoder and the
passthrough guard agree with a one-shot reading of the whole body, and one huge event costs
time linear in its size (re-joining the pending event per chunk was quadratic)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from llmitm.translate.guard import StreamGuard
from llmitm.wire.sse import SSEDecoder

_LINE_END = re.compile(rb"\r\n|\r|\n")


def reference_parse(body: bytes) -> list[tuple[str | None, bytes]]:
    """The event-stream algorithm on the whole body at once (an unterminated last event is
    dispatched too, as the decoder's close() does)."""
    body = body.removeprefix(b"\xef\xbb\xbf")
    events: list[tuple[str | None, bytes]] = []
    name: str | None = None
    data: list[bytes] | None = None
    for line in [*_LINE_END.split(body), b""]:
        if not line:
            if data is not None:
                events.append((name, b"\n".join(data)))
            name, data = None, None
            continue
        if line.startswith(b":"):
            continue
        field, colon, value = line.partition(b":")
        if colon and value.startswith(b" "):
            value = value[1:]
        if field == b"data":
            data = [*(data or []), value]
        elif field == b"event":
            name = value.decode("utf-8", "replace") or None
    return events


def decode(chunks: list[bytes]) -> list[tuple[str | None, bytes]]:
    decoder = SSEDecoder()
    events = []
    for chunk in chunks:
        events += decoder.feed(chunk)
    return events + decoder.close()


def split(body: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({cut % (len(body) + 1) for cut in cuts})
    return [body[a:b] for a, b in zip([0, *points], [*points, len(body)], strict=True)]


_ends = st.sampled_from([b"\n", b"\r\n", b"\r"])
# A value is a run of one filler byte: sizes up to ~200 KB without making hypothesis build
# (and shrink) that many bytes one by one.
_value = st.builds(
    lambda head, filler, size: head + filler * size,
    st.binary(max_size=8).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b"")),
    st.sampled_from([b"x", b"\xc3\xa9", b":", b" ", b"{"]),
    st.one_of(st.integers(0, 40), st.integers(0, 200_000)),
)
_line = st.tuples(st.sampled_from([b"data: ", b"data:", b"event: ", b": ", b"id: "]), _value)
_event = st.tuples(st.lists(st.tuples(_line, _ends), min_size=1, max_size=4), _ends)


@st.composite
def streams(draw: st.DrawFn) -> bytes:
    events = draw(st.lists(_event, max_size=5))
    body = b"".join(
        b"".join(prefix + value + end for (prefix, value), end in lines) + blank
        for lines, blank in events
    )
    if draw(st.booleans()):
        body = b"\xef\xbb\xbf" + body
    return body


@settings(max_examples=300, deadline=None)
@given(body=streams(), cuts=st.lists(st.integers(min_value=0), max_size=12))
def test_decoder_matches_the_one_shot_parse_for_any_sizes_and_chunking(
    body: bytes, cuts: list[int]
) -> None:
    assert decode(split(body, cuts)) == reference_parse(body)


@settings(max_examples=100, deadline=None)
@given(body=streams(), size=st.integers(1, 70_000))
def test_decoder_matches_the_one_shot_parse_in_fixed_size_reads(body: bytes, size: int) -> None:
    chunks = [body[i : i + size] for i in range(0, len(body), size)]
    assert decode(chunks) == reference_parse(body)


@settings(max_examples=200, deadline=None)
@given(body=streams(), cuts=st.lists(st.integers(min_value=0), max_size=12))
def test_guard_relays_whole_events_unchanged_under_any_chunking(
    body: bytes, cuts: list[int]
) -> None:
    """Every piece the guard lets out ends at a blank line, and what it lets out before its
    closing error is the body itself up to the last blank line."""
    guard = StreamGuard("chat")
    body = body.removeprefix(b"\xef\xbb\xbf")
    out = b""
    for chunk in split(body, cuts):
        piece = guard.feed(chunk)
        if piece:
            assert piece.endswith((b"\n\n", b"\r\r", b"\r\n\r\n")), piece[-8:]
        out += piece
    assert body.startswith(out)
    held = body[len(out) :]
    assert not any(blank in held for blank in (b"\n\n", b"\r\r", b"\r\n\r\n"))
    closing = guard.close()
    assert closing.endswith(b"data: [DONE]\n\n")  # the body has no [DONE]: a cut


def _huge_event(size: int) -> bytes:
    return b'data: {"choices":[{"delta":{"content":"' + b"x" * size + b'"}}]}\n\n'


def _chunks(size: int) -> tuple[bytes, list[bytes]]:
    event = _huge_event(size)
    return event, [event[i : i + 4096] for i in range(0, len(event), 4096)]


def _growth(work: Callable[[list[bytes]], None]) -> float:
    """How much longer ``work`` takes on an event 8x larger (best of 5 each, in this thread's
    CPU time, which other processes on a busy machine do not add to): ~8 for a linear pass,
    ~64 for one that rescans what it holds on every read. A ratio, not a time bound, so a slow
    or busy machine does not change the verdict."""

    def best(size: int) -> float:
        _event, chunks = _chunks(size)
        times = []
        for _ in range(5):
            started = time.thread_time()
            work(chunks)
            times.append(time.thread_time() - started)
        return min(times)

    return best(16 << 20) / best(2 << 20)


def test_one_huge_event_is_decoded_in_linear_time() -> None:
    event, chunks = _chunks(4 << 20)
    decoder = SSEDecoder()
    events = [e for chunk in chunks for e in decoder.feed(chunk)]
    assert [data for _name, data in events] == [event[6:-2]]
    assert decoder.idle and decoder.close() == []

    def decode(chunks: list[bytes]) -> None:
        decoder = SSEDecoder()
        for chunk in chunks:
            decoder.feed(chunk)

    assert _growth(decode) < 24


def test_one_huge_event_passes_the_guard_in_linear_time() -> None:
    event, chunks = _chunks(4 << 20)
    guard = StreamGuard("chat")
    out = [guard.feed(chunk) for chunk in chunks]
    assert b"".join(out) == event and out[-1] == event

    def relay(chunks: list[bytes]) -> None:
        guard = StreamGuard("chat")
        for chunk in chunks:
            guard.feed(chunk)

    assert _growth(relay) < 24
