"""The chat stream normaliser (``normalise-chat``): chat backend quirks repaired for chat
clients, conformant streams relayed as their own bytes.

The openai SDK judges the output (its chat stream helper accumulates tool calls the way the
issue describes: ``id`` and ``name`` fragments are concatenated), and every case also runs
without the normaliser to show the SDK really gets the quirk wrong on the raw bytes.
"""

from __future__ import annotations

import functools
import itertools
import json
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmitm.translate.chat_normalise import ChatNormaliser
from llmitm.translate.context import TranslateOptions, TranslationContext
from llmitm.translate.pipeline import StreamPipeline
from llmitm.wire.ids import CountingIds, fixed_clock
from tests.helpers.oracle import sdk_chat_raw_chunks, sdk_chat_stream

REAL = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "real"
HEAD = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
DONE = b"data: [DONE]\n\n"


def context() -> TranslationContext:
    options = TranslateOptions(ids=CountingIds(), clock=fixed_clock(1_700_000_000))
    return TranslationContext(options, model="m")


def frame(payload: dict[str, Any], *, spaced: bool = False) -> bytes:
    data = json.dumps(payload).encode() if spaced else orjson.dumps(payload)
    return b"data: " + data + b"\n\n"


def chunk(delta: dict[str, Any], finish: str | None = None, index: int = 0) -> bytes:
    return frame({**HEAD, "choices": [{"index": index, "delta": delta, "finish_reason": finish}]})


def call(index: int, call_id: str | None, name: str | None, args: str) -> dict[str, Any]:
    delta: dict[str, Any] = {"index": index, "function": {"arguments": args}}
    if call_id is not None:
        delta["id"] = call_id
        delta["type"] = "function"
    if name is not None:
        delta["function"]["name"] = name
    return delta


def normalise(chunks: list[bytes], **kwargs: Any) -> bytes:
    pipeline = StreamPipeline("normalise-chat", context(), **kwargs)
    out = [pipeline.feed(piece) for piece in chunks]
    out.append(pipeline.close())
    assert pipeline.finished
    return b"".join(out)


def pieces(body: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({cut % (len(body) + 1) for cut in cuts})
    return [body[a:b] for a, b in itertools.pairwise([0, *points, len(body)])]


def tool_calls(sse: bytes) -> list[tuple[int, str, str, str]]:
    final, _chunks = sdk_chat_stream(sse)
    calls = final.choices[0].message.tool_calls or []
    return [(c.index, c.id, c.function.name, c.function.arguments) for c in calls]  # type: ignore[attr-defined]


# --- tool calls ----------------------------------------------------------------------------


def test_an_id_and_name_repeated_in_every_chunk_are_sent_once() -> None:
    body = [
        chunk({"role": "assistant", "content": None}),
        chunk({"tool_calls": [call(0, "call_a", "get_weather", '{"city"')]}),
        chunk({"tool_calls": [call(0, "call_a", "get_weather", ':"Paris"')]}),
        chunk({"tool_calls": [call(0, "call_a", "get_weather", "}")]}),
        chunk({}, "tool_calls"),
        DONE,
    ]
    # The quirk as the SDK's helper takes it: fragments concatenated.
    assert tool_calls(b"".join(body))[0][1:3] == (
        "call_acall_acall_a",
        "get_weatherget_weatherget_weather",
    )
    out = normalise(body)
    assert tool_calls(out) == [(0, "call_a", "get_weather", '{"city":"Paris"}')]
    assert out.count(b'"id":"call_a"') == 1 and out.count(b'"name":"get_weather"') == 1


def test_sparse_indexes_become_0_to_k_minus_1() -> None:
    body = [
        chunk({"tool_calls": [call(1, "call_a", "f", "{}")]}),
        chunk({"tool_calls": [call(3, "call_b", "g", '{"x"')]}),
        chunk({"tool_calls": [call(3, None, None, ":1}")]}),
        chunk({}, "tool_calls"),
        DONE,
    ]
    assert tool_calls(normalise(body)) == [(0, "call_a", "f", "{}"), (1, "call_b", "g", '{"x":1}')]


def test_calls_that_share_an_index_are_told_apart_by_their_ids() -> None:
    """Some backends stream every call at index 0, each with its own id."""
    body = [
        chunk({"tool_calls": [call(0, "call_a", "f", '{"a":')]}),
        chunk({"tool_calls": [call(0, None, None, "1}")]}),
        chunk({"tool_calls": [call(0, "call_b", "g", '{"b":2}')]}),
        chunk({}, "tool_calls"),
        DONE,
    ]
    assert [c[0] for c in tool_calls(b"".join(body))] == [0]  # the SDK merges them raw
    assert tool_calls(normalise(body)) == [
        (0, "call_a", "f", '{"a":1}'),
        (1, "call_b", "g", '{"b":2}'),
    ]


def test_a_call_without_an_id_or_type_gets_them() -> None:
    first = {"index": 0, "function": {"name": "f", "arguments": "{}"}}
    out = normalise([chunk({"tool_calls": [first]}), chunk({}, "tool_calls"), DONE])
    [(index, call_id, name, args)] = tool_calls(out)
    assert (index, name, args) == (0, "f", "{}")
    assert call_id.startswith("call_")
    assert b'"type":"function"' in out


def test_a_name_streamed_in_pieces_is_kept_whole() -> None:
    body = [
        chunk({"tool_calls": [call(0, "call_a", "get_", "")]}),
        chunk({"tool_calls": [{"index": 0, "function": {"name": "weather", "arguments": "{}"}}]}),
        chunk({}, "tool_calls"),
        DONE,
    ]
    assert tool_calls(normalise(body)) == [(0, "call_a", "get_weather", "{}")]


# --- finish reason, errors, the end ------------------------------------------------------


def test_a_stream_without_a_finish_reason_gets_stop_before_done() -> None:
    body = [chunk({"role": "assistant", "content": "Hi"}), chunk({"content": " there"}), DONE]
    assert sdk_chat_stream(b"".join(body))[0].choices[0].finish_reason is None
    out = normalise(body)
    final, _ = sdk_chat_stream(out)
    assert final.choices[0].finish_reason == "stop"
    assert final.choices[0].message.content == "Hi there"
    assert out.endswith(b'"finish_reason":"stop"}]}\n\n' + DONE)


def test_a_stream_with_calls_and_no_finish_reason_gets_tool_calls() -> None:
    out = normalise([chunk({"tool_calls": [call(0, "call_a", "f", "{}")]}), DONE])
    assert sdk_chat_stream(out)[0].choices[0].finish_reason == "tool_calls"


def test_an_error_inside_a_200_stream_is_an_error_the_sdk_raises() -> None:
    error = frame({**HEAD, "error": {"code": 502, "message": "Provider returned error"}})
    body = [chunk({"content": "partial"}), error, chunk({"content": "after"}), DONE]
    out = normalise(body)
    with pytest.raises(openai.APIError, match="Provider returned error"):
        sdk_chat_raw_chunks(out)
    assert b"after" not in out and out.endswith(DONE)
    assert json.loads(out.split(b"\n\n")[1].removeprefix(b"data: "))["error"]["message"] == (
        "Provider returned error"
    )


def test_a_stream_cut_before_its_finish_ends_with_an_error() -> None:
    out = normalise([chunk({"content": "par"})])
    with pytest.raises(openai.APIError, match="ended before"):
        sdk_chat_raw_chunks(out)


def test_a_stream_cut_after_its_finish_ends_cleanly() -> None:
    out = normalise([chunk({"content": "done"}, "stop")])
    assert out.endswith(DONE)
    assert sdk_chat_stream(out)[0].choices[0].message.content == "done"


def test_the_usage_chunk_asked_for_on_the_clients_behalf_is_read_then_dropped() -> None:
    usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    body = [chunk({"content": "x"}, "stop"), frame({**HEAD, "choices": [], "usage": usage}), DONE]
    pipeline = StreamPipeline("normalise-chat", context(), strip_usage=True)
    out = b"".join(pipeline.feed(piece) for piece in body) + pipeline.close()
    assert b'"usage"' not in out and pipeline.usage == usage
    assert normalise(body) == b"".join(body)  # kept when the client asked for it


def test_reasoning_fields_are_kept_as_sent() -> None:
    body = [
        chunk({"role": "assistant", "reasoning_content": "Let me think"}),
        chunk({"reasoning": " more"}),
        chunk({"content": "42"}, "stop"),
        DONE,
    ]
    assert normalise(body) == b"".join(body)


# --- the fast path: conformant bytes out as they came ---------------------------------------


def _real_chat_streams() -> list[Any]:
    if not REAL.is_dir():
        return [pytest.param(None, marks=pytest.mark.skip(reason="real fixtures not present"))]
    names = []
    for path in sorted(REAL.glob("*.sse")):
        meta = json.loads(path.with_name(path.stem + ".meta.json").read_text())
        if meta["api"] == "chat":
            names.append(pytest.param(path.name, id=path.stem))
    return names


@functools.cache
def _real(name: str) -> bytes:
    return (REAL / name).read_bytes()


@pytest.mark.parametrize("name", _real_chat_streams())
def test_real_chat_streams_without_quirks_come_out_byte_identical(name: str) -> None:
    """Every real capture (OpenAI's own, llama.cpp's, DeepSeek's, Azure's, …) is relayed as
    its own bytes, one event per chunk as servers write them and as one whole body; only one
    with an in-stream error is rewritten, into the SDK's error shape."""
    body = _real(name)
    events = [block + b"\n\n" for block in body.split(b"\n\n") if block]
    has_error = any(b'"error":{' in block for block in events)
    data_only = b"".join(block for block in events if block.startswith(b"data:"))
    for chunks in (events, [body]):
        out = normalise(chunks)
        if has_error:
            assert out.endswith(DONE) and b'{"error":{"message":' in out
        else:
            assert out == data_only


def test_a_conformant_chunk_is_not_parsed_on_the_fast_path() -> None:
    normaliser = ChatNormaliser(context())
    text = chunk({"content": "hello"})
    assert normaliser.fast_chunk(text) is None  # the first chunk is parsed: it names the stream
    assert normaliser.feed(orjson.loads(text.removeprefix(b"data: "))) == [text]
    assert normaliser.fast_chunk(text) is text  # the very object: no copy, no parse
    for marked in (
        chunk({}, "stop"),
        chunk({"tool_calls": [call(0, "c", "f", "")]}),
        frame({**HEAD, "choices": [], "usage": {"total_tokens": 1}}),
        frame({**HEAD, "error": {"message": "x"}}),
        frame({**HEAD, "choices": [{"index": 0, "delta": {"content": "a"}}]}, spaced=True),
    ):
        assert normaliser.fast_chunk(marked) is None


def test_a_text_delta_shaped_like_the_first_plain_one_is_relayed_by_its_ends() -> None:
    """The relay takes a chunk with a plain one's bytes around another valid string; a chunk
    whose string is no valid JSON (a raw quote or line break) or of another shape is not its,
    and goes the way it always went."""
    normaliser = ChatNormaliser(context())
    first = chunk({"content": "hello"})
    normaliser.feed(orjson.loads(first.removeprefix(b"data: ")))
    assert normaliser.fast_relay() is None  # only a plain chunk teaches it
    assert normaliser.fast_chunk(first) is first
    relay = normaliser.fast_relay()
    assert relay is not None
    assert relay(chunk({"content": 'wörld "quoted"\n'}))
    head, _, tail = first.partition(b"hello")
    others = [
        head + b'a"b' + tail,
        head + b"a\nb" + tail,
        chunk({"content": "x"}, "stop"),
        chunk({"reasoning_content": "x"}),
        frame({**HEAD, "choices": [], "usage": {"total_tokens": 1}}),
    ]
    assert not any(relay(other) for other in others)
    assert normaliser.relayed == 1
    stream = [first, first, head + b'a"b' + tail, first, chunk({}, "stop"), b"data: [DONE]\n\n"]
    # Relayed or not, the same bytes: the refused chunk takes the marker searches as before
    # (which find none in it, so it goes out as it came).
    assert normalise(stream) == normalise([b"".join(stream)]) == b"".join(stream)


# --- properties -------------------------------------------------------------------------

WORDS = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=8
)


@st.composite
def conformant_streams(draw: st.DrawFn) -> list[bytes]:
    """What OpenAI itself sends: text or reasoning deltas, calls with their id and name in
    the first chunk only, a finish reason, maybe a usage chunk, [DONE]."""
    chunks = [chunk({"role": "assistant", "content": ""})]
    for word in draw(st.lists(WORDS, max_size=6)):
        chunks.append(chunk({"reasoning_content": word}))
    for word in draw(st.lists(WORDS, max_size=6)):
        chunks.append(chunk({"content": word}))
    calls = draw(st.integers(0, 3))
    for index in range(calls):
        chunks.append(chunk({"tool_calls": [call(index, f"call_{index}", f"tool_{index}", "")]}))
        for piece in draw(st.lists(WORDS, max_size=3)):
            chunks.append(
                chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
            )
    chunks.append(chunk({}, "tool_calls" if calls else draw(st.sampled_from(["stop", "length"]))))
    if draw(st.booleans()):
        usage = {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
        chunks.append(frame({**HEAD, "choices": [], "usage": usage}))
    return [*chunks, DONE]


@st.composite
def quirky_streams(draw: st.DrawFn) -> tuple[list[bytes], list[tuple[str, str, str]]]:
    """Calls with repeated ids and names, odd indexes, no finish reason: and the calls the
    client must end up with."""
    chunks = [chunk({"role": "assistant", "content": draw(WORDS)})]
    expected = []
    base = draw(st.sampled_from([0, 1, 5]))
    repeat = draw(st.booleans())
    for number in range(draw(st.integers(1, 3))):
        index, call_id, name = base + 2 * number, f"call_{number}", f"tool_{number}"
        args = draw(st.lists(WORDS, min_size=1, max_size=3))
        for position, piece in enumerate(args):
            head = position == 0 or repeat
            delta = call(index, call_id if head else None, name if head else None, piece)
            chunks.append(chunk({"tool_calls": [delta]}))
        expected.append((call_id, name, "".join(args)))
    if draw(st.booleans()):
        chunks.append(chunk({}, "tool_calls"))
    return [*chunks, DONE], expected


QUICK = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@QUICK
@given(stream=conformant_streams(), cuts=st.lists(st.integers(0), max_size=8))
def test_conformant_streams_come_out_byte_identical_however_split(
    stream: list[bytes], cuts: list[int]
) -> None:
    body = b"".join(stream)
    assert normalise(stream) == body
    assert normalise(pieces(body, cuts)) == body


@QUICK
@given(stream=quirky_streams(), cuts=st.lists(st.integers(0), max_size=8))
def test_any_split_gives_the_same_repaired_stream(
    stream: tuple[list[bytes], list[tuple[str, str, str]]], cuts: list[int]
) -> None:
    chunks, expected = stream
    reference = normalise(chunks)
    assert normalise(pieces(b"".join(chunks), cuts)) == reference
    assert normalise([b"".join(chunks)]) == reference
    final, _ = sdk_chat_stream(reference)
    calls = final.choices[0].message.tool_calls or []
    assert [c.index for c in calls] == list(range(len(expected)))  # type: ignore[attr-defined]
    assert [(c.id, c.function.name, c.function.arguments) for c in calls] == expected  # type: ignore[attr-defined]
    assert final.choices[0].finish_reason == "tool_calls"
