"""The one-event-per-chunk fast path writes exactly the bytes of the general path.

Streaming servers write one event per chunk, so that is what the proxy's stream callable
sees; the pipeline then lets the translator encode plain text deltas straight to bytes. Fed
event by event, every real stream and a long synthetic one must come out byte-identical to the
same stream fed in one piece (which goes through the general decoder and encoder)."""

from __future__ import annotations

import orjson
import pytest
from realfixtures import REAL, real_or_skip

from llmitm.translate.context import TranslateOptions, TranslationContext
from llmitm.translate.pipeline import StreamPipeline
from llmitm.wire.ids import CountingIds, fixed_clock


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

    def counting(obj: dict) -> bytes | None:
        nonlocal taken
        out = fast(obj)
        taken += out is not None
        return out

    pipeline._fast_frame = counting
    for piece in _events(chat):
        pipeline.feed(piece)
    assert taken >= 48  # all text deltas but the one that opens the message
