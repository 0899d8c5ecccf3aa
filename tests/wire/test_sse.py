"""SSEDecoder and the SSE encoders: framing that survives any chunking (mitmproxy hands a stream
callable pieces cut anywhere, even inside a UTF-8 character or a blank line)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmitm.wire.sse import (
    DONE_DATA,
    DONE_FRAME,
    SSEDecoder,
    encode_data,
    encode_event,
    encode_typed,
)

REAL = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "real"


def decode_all(*chunks: bytes) -> list[tuple[str | None, bytes]]:
    """Feed ``chunks`` in order, then close."""
    decoder = SSEDecoder()
    events = []
    for chunk in chunks:
        events += decoder.feed(chunk)
    return events + decoder.close()


# A representative stream: data-only and named frames, a comment keep-alive, multi-line data,
# id/retry fields, non-ASCII text (2-, 3- and 4-byte UTF-8), an event with no data, [DONE].
REPRESENTATIVE = (
    ": OPENROUTER PROCESSING\n\n"
    'data: {"a":1}\n\n'
    "event: response.created\n"
    'data: {"type":"response.created"}\n\n'
    "id: 7\n"
    "retry: 1500\n"
    'data: {"t":"caf\u00e9 \u2603 \U0001f600"}\n\n'
    ": keep-alive\n"
    "event: multi\n"
    "data: line one\n"
    "data: line two\n\n"
    "event: nodata\n\n"
    "data: [DONE]\n\n"
).encode()

REPRESENTATIVE_EVENTS = [
    (None, b'{"a":1}'),
    ("response.created", b'{"type":"response.created"}'),
    (None, '{"t":"caf\u00e9 \u2603 \U0001f600"}'.encode()),
    ("multi", b"line one\nline two"),
    (None, b"[DONE]"),
]


def _with_line_ends(body: bytes, ending: bytes) -> bytes:
    return body.replace(b"\n", ending)


# -- whole streams -------------------------------------------------------------------------


@pytest.mark.parametrize("ending", [b"\n", b"\r\n", b"\r"], ids=["LF", "CRLF", "CR"])
def test_representative_stream_decodes_with_each_line_ending(ending: bytes) -> None:
    """LF, CRLF and CR line ends give the same events; comments, id/retry and data-less events
    dispatch nothing of their own."""
    assert decode_all(_with_line_ends(REPRESENTATIVE, ending)) == REPRESENTATIVE_EVENTS


@pytest.mark.parametrize("ending", [b"\n", b"\r\n", b"\r"], ids=["LF", "CRLF", "CR"])
def test_every_split_point_of_the_representative_stream(ending: bytes) -> None:
    """Chunks split anywhere — inside a UTF-8 character, between CR and LF, inside
    ``data:`` — decode to the same events."""
    body = _with_line_ends(REPRESENTATIVE, ending)
    for cut in range(len(body) + 1):
        assert decode_all(body[:cut], body[cut:]) == REPRESENTATIVE_EVENTS, cut


def test_every_pair_of_split_points_of_a_crlf_stream() -> None:
    """Three chunks, both cuts anywhere (also an empty middle chunk), of a CRLF stream."""
    body = _with_line_ends(
        'event: e\ndata: {"x":"\u00e9\u2603"}\n\ndata: [DONE]\n\n'.encode(), b"\r\n"
    )
    expected = [("e", '{"x":"\u00e9\u2603"}'.encode()), (None, b"[DONE]")]
    for first in range(len(body) + 1):
        for second in range(first, len(body) + 1):
            got = decode_all(body[:first], body[first:second], body[second:])
            assert got == expected, (first, second)


def test_byte_at_a_time() -> None:
    """One byte per chunk is the worst case of splitting."""
    body = _with_line_ends(REPRESENTATIVE, b"\r\n")
    assert decode_all(*(body[i : i + 1] for i in range(len(body)))) == REPRESENTATIVE_EVENTS


def test_split_inside_a_multibyte_character_keeps_the_bytes() -> None:
    """The decoder works on bytes: half a character waits for its other half."""
    body = 'data: {"t":"\U0001f600"}\n\n'.encode()
    start = body.index(b"\xf0")
    for cut in range(start + 1, start + 4):  # inside the 4-byte sequence
        decoder = SSEDecoder()
        assert decoder.feed(body[:cut]) == []
        events = decoder.feed(body[cut:])
        assert events == [(None, '{"t":"\U0001f600"}'.encode())]
        assert events[0][1].decode() == '{"t":"\U0001f600"}'


def test_cr_at_chunk_end_and_lf_in_the_next_chunk_is_one_line_end() -> None:
    """``\\r`` ending one chunk and ``\\n`` starting the next must not count as two line ends
    (two would dispatch a half-read event early)."""
    decoder = SSEDecoder()
    assert decoder.feed(b"event: e\r") == []
    assert decoder.feed(b"\ndata: x\r") == []
    assert decoder.feed(b"\n\r") == [("e", b"x")]
    assert decoder.feed(b"\n") == []  # the LF of that last CRLF, nothing more
    assert decoder.feed(b"data: y\r\n\r\n") == [(None, b"y")]


def test_empty_chunk_between_cr_and_lf_keeps_the_pending_cr() -> None:
    """Regression: an empty chunk after a trailing ``\\r`` made the decoder forget it, so the
    ``\\n`` that followed became a blank line and ended the event early (here the name ``e``
    was lost and the data went out unnamed)."""
    decoder = SSEDecoder()
    assert decoder.feed(b"event: e\r") == []
    assert decoder.feed(b"") == []
    assert decoder.feed(b"\ndata: 1\r\n\r\n") == [("e", b"1")]


def test_lone_cr_line_ends_across_chunks() -> None:
    """Old-Mac CR-only streams split between the two CRs of a blank line."""
    assert decode_all(b"data: a\r", b"\rdata: b\r\r") == [(None, b"a"), (None, b"b")]


# -- fields and framing details ----------------------------------------------------------


def test_comment_keepalives_dispatch_nothing() -> None:
    """OpenRouter sends ``: OPENROUTER PROCESSING`` frames while the model thinks."""
    assert decode_all(b": OPENROUTER PROCESSING\n\n" * 17) == []
    decoder = SSEDecoder()
    assert decoder.feed(b": OPENROUTER PROCESSING\n\n: OPENROUTER") == []
    assert decoder.feed(b" PROCESSING\n\ndata: 1\n\n") == [(None, b"1")]


def test_comment_inside_an_event() -> None:
    assert decode_all(b"event: e\n: note\ndata: 1\n\n") == [("e", b"1")]


def test_multi_line_data_is_joined_with_newlines() -> None:
    assert decode_all(b"data: a\ndata:b\ndata:  c\n\n") == [(None, b"a\nb\n c")]


def test_only_one_space_after_the_colon_is_stripped() -> None:
    assert decode_all(b"data:x\n\ndata:  x\n\n") == [(None, b"x"), (None, b" x")]


def test_event_without_event_line_has_no_name() -> None:
    """Data-only Responses SSE (OpenRouter) has no ``event:`` lines: consumers use the JSON."""
    assert decode_all(b'data: {"type":"response.created"}\n\n') == [
        (None, b'{"type":"response.created"}')
    ]


def test_non_utf8_event_name_does_not_raise() -> None:
    """Regression: the ``event:`` fast path decoded the name strictly, so a non-UTF-8 name
    raised UnicodeDecodeError out of feed() (the proxy would lose the chunk). Both paths now
    decode it leniently; the data is untouched."""
    expected = [("\ufffd\ufffd", b"{}")]
    assert decode_all(b"event: \xff\xfe\ndata: {}\n\n") == expected  # fast path
    assert decode_all(b"event:\xff\xfe\ndata: {}\n\n") == expected  # general path


def test_event_line_after_data_and_without_space() -> None:
    """The general path (not the fast one) reads fields in any order."""
    assert decode_all(b"data: 1\nevent:late\n\n") == [("late", b"1")]


def test_empty_event_name_is_no_name() -> None:
    assert decode_all(b"event:\ndata: 1\n\n") == [(None, b"1")]


def test_event_without_data_is_not_dispatched() -> None:
    """WHATWG: an empty data buffer dispatches nothing (the name is dropped too)."""
    assert decode_all(b"event: ping\n\ndata: 1\n\n") == [(None, b"1")]


def test_empty_data_line_dispatches_empty_data() -> None:
    assert decode_all(b"data:\n\n") == [(None, b"")]


def test_id_and_retry_fields_are_ignored() -> None:
    body = b"id: 41\nretry: 3000\nevent: e\ndata: 1\nid: 42\n\nretry: 5\n\nid: 43\n\n"
    assert decode_all(body) == [("e", b"1")]


def test_unknown_fields_and_colonless_lines_are_ignored() -> None:
    assert decode_all(b"foo: bar\nbaz\ndata: 1\n\n") == [(None, b"1")]


def test_blank_lines_before_and_between_events() -> None:
    assert decode_all(b"\n\n\ndata: 1\n\n\n\n\ndata: 2\n\n\n") == [(None, b"1"), (None, b"2")]


def test_done_is_passed_through_as_data() -> None:
    """``[DONE]`` is ordinary data to the decoder; the pipeline interprets it."""
    assert decode_all(DONE_FRAME) == [(None, DONE_DATA)]


def test_missing_final_blank_line_is_flushed_by_close() -> None:
    """A body that ends right after its last data line still delivers that event."""
    for tail in (b"data: last", b"data: last\n", b"data: last\r\n", b"data: last\r"):
        decoder = SSEDecoder()
        assert decoder.feed(b"data: first\n\n" + tail) == [(None, b"first")]
        assert decoder.close() == [(None, b"last")], tail


def test_close_without_a_pending_event_returns_nothing() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: 1\n\n") == [(None, b"1")]
    assert decoder.close() == []
    assert SSEDecoder().close() == []
    decoder = SSEDecoder()
    decoder.feed(b": comment only")
    assert decoder.close() == []


def test_close_resets_the_decoder() -> None:
    decoder = SSEDecoder()
    decoder.feed(b"data: a\r")
    assert decoder.close() == [(None, b"a")]
    assert decoder.feed(b"\ndata: b\n\n") == [(None, b"b")]


def test_empty_chunks_are_harmless() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"") == []
    assert decoder.feed(b"data: 1\n") == []
    assert decoder.feed(b"") == []
    assert decoder.feed(b"\n") == [(None, b"1")]


# -- real fixtures -------------------------------------------------------------------------


def _small_real_streams() -> list[Path]:
    if not REAL.is_dir():
        return []
    return [path for path in sorted(REAL.glob("*.sse")) if path.stat().st_size <= 8000]


@pytest.mark.parametrize("path", _small_real_streams() or [None], ids=lambda p: p and p.stem)
def test_every_split_point_of_small_real_streams(path: Path | None) -> None:
    """Each real capture under 8 kB, cut at every byte, decodes like the whole body."""
    if path is None:
        pytest.skip(f"{REAL} not present")
    body = path.read_bytes()
    whole = decode_all(body)
    assert whole, "a fixture stream with no events"
    assert all(data for _, data in whole)
    for cut in range(len(body) + 1):
        assert decode_all(body[:cut], body[cut:]) == whole, cut


def test_openrouter_fixture_comments_and_done() -> None:
    """The OpenRouter capture: 17 keep-alive comments, four chunks, ``[DONE]``."""
    path = REAL / "pydantic-ai-openrouter-stream-error.sse"
    if not path.exists():
        pytest.skip(f"{path} not present")
    events = decode_all(path.read_bytes())
    assert [name for name, _ in events] == [None] * 5
    assert events[-1] == (None, DONE_DATA)
    assert all(data.startswith(b"{") for _, data in events[:-1])


# -- encoders --------------------------------------------------------------------------------


def test_encode_event_named_and_unnamed() -> None:
    assert encode_event("e", b"1") == b"event: e\ndata: 1\n\n"
    assert encode_event(None, b"1") == b"data: 1\n\n"


def test_encode_event_multi_line_data_round_trips() -> None:
    frame = encode_event("e", b"a\nb\r\nc\rd")
    assert frame == b"event: e\ndata: a\ndata: b\ndata: c\ndata: d\n\n"
    # Line breaks inside data come back as LF: SSE cannot carry CR in data.
    assert decode_all(frame) == [("e", b"a\nb\nc\nd")]


def test_encode_data_and_typed_round_trip() -> None:
    assert decode_all(encode_data(b'{"a":1}')) == [(None, b'{"a":1}')]
    assert encode_typed("response.created", b"{}") == b"event: response.created\ndata: {}\n\n"
    assert decode_all(encode_typed("response.created", b"{}")) == [("response.created", b"{}")]


_names = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n"), min_size=1
).filter(lambda name: name.strip() == name)
_data = st.binary(max_size=60).filter(lambda data: b"\r" not in data)


@settings(max_examples=200, deadline=None)
@given(
    events=st.lists(st.tuples(st.none() | _names, _data), max_size=8),
    cuts=st.lists(st.integers(min_value=0), max_size=6),
)
def test_encode_event_round_trips_under_any_split(
    events: list[tuple[str | None, bytes]], cuts: list[int]
) -> None:
    """Whatever was encoded decodes back to the same (name, data), however it is chunked."""
    body = b"".join(encode_event(name, data) for name, data in events)
    points = sorted({cut % (len(body) + 1) for cut in cuts})
    chunks = [body[a:b] for a, b in zip([0, *points], [*points, len(body)], strict=True)]
    assert decode_all(*chunks) == events


@pytest.mark.parametrize("cut", [0, 1, 2, 3, 4])
def test_a_leading_byte_order_mark_is_not_data(cut: int) -> None:
    """Some servers start the body with a UTF-8 BOM; the first event must survive it."""
    raw = b'\xef\xbb\xbfdata: {"a":1}\n\ndata: [DONE]\n\n'
    decoder = SSEDecoder()
    events = decoder.feed(raw[:cut]) + decoder.feed(raw[cut:]) + decoder.close()
    assert events == [(None, b'{"a":1}'), (None, b"[DONE]")]
