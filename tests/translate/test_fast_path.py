"""The one-event-per-chunk fast path writes exactly the bytes of the general path.

Streaming servers write one event per chunk, so that is what the proxy's stream callable
sees; the pipeline then lets the translator encode plain text deltas straight to bytes. Fed
event by event, every real stream and a long synthetic one must come out byte-identical to the
same stream fed in one piece (which goes through the general decoder and encoder)."""

from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from llmitm.exchange.stream import StreamRewriter
from llmitm.translate.context import TranslateOptions, TranslationContext
from llmitm.translate.pipeline import StreamPipeline
from llmitm.wire.ids import CountingIds, fixed_clock
from tests.helpers.realfixtures import REAL, real_or_skip


def _context(include_usage: bool, model: str | None) -> TranslationContext:
    options = TranslateOptions(ids=CountingIds(), clock=fixed_clock(1_700_000_000))
    return TranslationContext(options=options, include_usage=include_usage, model=model)


def _events(raw: bytes) -> list[bytes]:
    normalised = raw.replace(b"\r\n", b"\n")
    return [block + b"\n\n" for block in normalised.split(b"\n\n") if block.strip()]


def _run(direction: str, pieces: list[bytes], include_usage: bool, model: str | None) -> bytes:
    pipeline = StreamPipeline(direction, _context(include_usage, model))  # type: ignore[arg-type]
    out = pipeline.start()
    for piece in pieces:
        out += pipeline.feed(piece)
    return out + pipeline.close()


def _cases() -> list[tuple[str, str]]:
    real_or_skip()
    cases = []
    for path in sorted(REAL.glob("*.sse")):
        api = orjson.loads((REAL / (path.stem + ".meta.json")).read_bytes())["api"]
        directions = (
            ["chat-to-responses"] if api == "chat" else ["responses-to-chat", "normalise-responses"]
        )
        cases += [(path.name, direction) for direction in directions]
    return cases


@pytest.mark.parametrize(("name", "direction"), _cases())
@pytest.mark.parametrize("include_usage", [False, True])
@pytest.mark.parametrize("model", [None, "client-model"])
def test_event_by_event_equals_one_piece(
    name: str, direction: str, include_usage: bool, model: str | None
) -> None:
    raw = (REAL / name).read_bytes()
    whole = _run(direction, [raw.replace(b"\r\n", b"\n")], include_usage, model)
    by_event = _run(direction, _events(raw), include_usage, model)
    assert by_event == whole


def _chat_text_stream(words: int) -> bytes:
    base = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    chunks = [dict(base, choices=[{"index": 0, "delta": {"role": "assistant", "content": ""}}])]
    for i in range(words):
        delta = {"content": f' w"{i}\\é', "role": None, "reasoning_content": None}
        chunks.append(dict(base, choices=[{"index": 0, "delta": delta, "finish_reason": None}]))
    chunks.append(dict(base, choices=[{"index": 0, "delta": {}, "finish_reason": "stop"}]))
    body = b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks)
    return body + b"data: [DONE]\n\n"


def test_long_text_stream_with_escapes_is_identical_both_ways() -> None:
    chat = _chat_text_stream(300)
    whole = _run("chat-to-responses", [chat], False, "m")
    by_event = _run("chat-to-responses", _events(chat), False, "m")
    assert by_event == whole
    back_whole = _run("responses-to-chat", [whole], True, "m")
    back_by_event = _run("responses-to-chat", _events(whole), True, "m")
    assert back_by_event == back_whole


def test_the_fast_path_is_taken_for_plain_text_deltas() -> None:
    """Guard against the equality tests above passing because nothing took the fast path."""
    chat = _chat_text_stream(50)
    pipeline = StreamPipeline("chat-to-responses", _context(False, "m"))
    taken = 0
    fast = pipeline._fast_frame
    assert fast is not None

    def counting(obj: dict, frame: bytes, data: bytes) -> bytes | None:
        nonlocal taken
        out = fast(obj, frame, data)
        taken += out is not None
        return out

    pipeline._fast_frame = counting
    pipeline._fast_chunk = None  # this test is about the parsed-event path
    for piece in _events(chat):
        pipeline.feed(piece)
    assert taken >= 48  # all text deltas but the one that opens the message


def test_the_template_path_is_taken_for_chat_text_deltas() -> None:
    """After the first plain text chunk, the rest go through the byte template alone."""
    chat = _chat_text_stream(50)
    pipeline = StreamPipeline("chat-to-responses", _context(False, "m"))
    taken = 0
    fast_chunk = pipeline._fast_chunk
    assert fast_chunk is not None

    def counting(frame: bytes) -> bytes | None:
        nonlocal taken
        out = fast_chunk(frame)
        taken += out is not None
        return out

    pipeline._fast_chunk = counting
    for piece in _events(chat):
        pipeline.feed(piece)
    assert taken >= 47  # all but the one that opens the message and the one that teaches


def _chat_chunk(content: object, ensure_ascii: bool, spaced: bool) -> bytes:
    chunk = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [
            {"index": 0, "delta": {"content": content}, "logprobs": None, "finish_reason": None}
        ],
    }
    separators = (", ", ": ") if spaced else (",", ":")
    return json.dumps(chunk, ensure_ascii=ensure_ascii, separators=separators).encode()


# What may sit where a text chunk's string literal sits: valid literals, and what is not one
# string literal, which the general path must decide (a malformed event, a chunk without text).
# (Not other JSON types: the translator does not handle content of another type alike on every
# split, with or without the template.)
_SLOT_MUTATIONS = [
    b'"ok"',
    b'"a\\nb \\" \\\\ \\/"',  # escapes
    b'"\\u00e9\\ud83d\\ude00"',
    b'"a","role":"assistant"',
    b'"a" ',
    b' "a"',
    b"null",
    b'"a"x',
    b'""',
    b'"a\\"',  # unterminated
    b'"raw \x01"',  # a raw control character
    b'"bad utf-8 \xff"',
    b'"raw cr \r"',
    b'"raw lf \n"',
    b'"a" "b"',
]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    texts=st.lists(st.text(min_size=0, max_size=12), min_size=1, max_size=25),
    mutations=st.lists(st.tuples(st.integers(0, 30), st.sampled_from(_SLOT_MUTATIONS))),
    ensure_ascii=st.booleans(),
    spaced=st.booleans(),
)
def test_template_path_equals_general_path(
    texts: list[str],
    mutations: list[tuple[int, bytes]],
    ensure_ascii: bool,
    spaced: bool,
) -> None:
    """Any text (escaped either way, quotes, backslashes, astral characters), and frames that
    match the template around something that is not one string literal: fed one event per
    chunk (template and fast paths) the client gets exactly what the general path writes."""
    role = _chat_chunk("", ensure_ascii, spaced).replace(
        b'"content"',
        b'"role": "assistant", "content"' if spaced else b'"role":"assistant","content"',
    )
    frames = [b"data: " + role + b"\n\n"]
    frames += [b"data: " + _chat_chunk(text, ensure_ascii, spaced) + b"\n\n" for text in texts]
    template = b"data: " + _chat_chunk("\x00slot\x00", ensure_ascii, spaced) + b"\n\n"
    before, _, after = template.partition(b'"\\u0000slot\\u0000"')
    for at, slot in mutations:
        frames.insert(1 + at % len(frames), before + slot + after)
    frames.append(
        b"data: "
        + _chat_chunk(None, False, False).replace(
            b'"finish_reason":null', b'"finish_reason":"stop"'
        )
        + b"\n\n"
    )
    frames.append(b"data: [DONE]\n\n")
    body = b"".join(frames)
    assume(all(frame.find(b"\n\n") == len(frame) - 2 for frame in frames))
    # Through the proxy's stream callable, which ends the stream on a malformed event.
    whole = _rewrite([body])
    by_event = _rewrite(frames)
    assert by_event == whole


def _rewrite(pieces: list[bytes]) -> bytes:
    rewriter = StreamRewriter(StreamPipeline("chat-to-responses", _context(False, "m")))
    return b"".join(b"".join(rewriter(piece)) for piece in [*pieces, b""])
