"""One huge event, split anywhere: the stream callable's parts (``StreamPipeline.feed_parts``)
join to exactly the bytes of a one-shot reading, in every direction a chat upstream takes;
a held event that goes out as it came is the very pieces it came in (no copy of its size),
and a huge text in Responses events is encoded once and shared by the events repeating it.

The events are a few hundred KB (above ``BIG_EVENT``) so hypothesis stays quick; the
Responses sharing threshold is lowered to match."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmitm.translate import pipeline as pipeline_module
from llmitm.translate.context import TranslateOptions, TranslationContext
from llmitm.translate.pipeline import StreamPipeline
from llmitm.wire.ids import CountingIds, fixed_clock
from llmitm.wire.modes import Direction
from llmitm.wire.sse import BIG_EVENT

FAST = settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
DIRECTIONS: list[Direction] = ["normalise-chat", "chat-to-responses"]
KINDS = [
    "text",
    "text+finish",
    "text+usage",
    "first",
    "tool",
    "tool-sparse",
    "reasoning",
    "spaced",
    "malformed",
]


@pytest.fixture(autouse=True)
def small_big_text(monkeypatch: pytest.MonkeyPatch) -> None:
    """Strings of 10 KB and more count as big here (1 MiB in the proxy)."""
    monkeypatch.setattr(pipeline_module, "BIG_TEXT", 10_000)


def context() -> TranslationContext:
    options = TranslateOptions(ids=CountingIds(), clock=fixed_clock(1_700_000_000))
    return TranslationContext(options, model="client-model", include_usage=True)


def frame(delta: dict[str, Any], finish: str | None = None, *, spaced: bool = False) -> bytes:
    payload: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    if spaced:  # a writer that puts a space after its colons
        return b"data: " + json.dumps(payload, ensure_ascii=False).encode() + b"\n\n"
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def big_stream(kind: str, size: int, text_seed: str, done: bool, more: bool = True) -> bytes:
    # Escaped quotes and the markers' spelling inside the text must not count as markers.
    text = (text_seed + ' "usage":{ é "tool_calls":[ ') * (size // (len(text_seed) + 26) + 1)
    role = frame({"role": "assistant", "content": ""})
    if kind == "text":
        big = frame({"content": text})
    elif kind == "text+finish":
        big = frame({"content": text}, "stop")
    elif kind == "text+usage":
        payload = orjson.loads(frame({"content": text})[6:])
        payload["usage"] = {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
        big = b"data: " + orjson.dumps(payload) + b"\n\n"
    elif kind == "first":  # no role chunk before it: the stream's first chunk is parsed
        role, big = b"", frame({"role": "assistant", "content": text})
    elif kind == "tool":
        call = {"index": 0, "id": "call_1", "type": "function"}
        big = frame({"tool_calls": [{**call, "function": {"name": "f", "arguments": text}}]})
    elif kind == "tool-sparse":  # repaired: index 3 becomes 0, an id and type are added
        big = frame({"tool_calls": [{"index": 3, "function": {"name": "f", "arguments": text}}]})
    elif kind == "reasoning":
        big = frame({"reasoning_content": text})
    elif kind == "spaced":
        big = frame({"content": text}, spaced=True)
    else:  # malformed: the event's JSON is cut short
        big = frame({"content": text})[:-40] + b"\n\n"
    finish = frame({}, "tool_calls" if kind.startswith("tool") else "stop")
    body = role + big + (frame({"content": " and more"}) if more else b"") + finish
    return body + b"data: [DONE]\n\n" if done else body


def one_shot(direction: Direction, body: bytes) -> bytes:
    pipeline = StreamPipeline(direction, context())
    return pipeline.start() + pipeline.feed(body) + pipeline.close()


def in_parts(direction: Direction, chunks: list[bytes]) -> tuple[bytes, list[list[bytes]]]:
    pipeline = StreamPipeline(direction, context())
    outputs = [pipeline.feed_parts(chunk) for chunk in chunks]
    for parts in outputs:
        assert all(parts), "an empty part would end a chunked body"
    out = pipeline.start() + b"".join(itertools.chain.from_iterable(outputs)) + pipeline.close()
    return out, outputs


def pieces(body: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({cut % (len(body) + 1) for cut in cuts})
    return [body[a:b] for a, b in itertools.pairwise([0, *points, len(body)]) if b > a]


@FAST
@given(
    kind=st.sampled_from(KINDS),
    size=st.integers(BIG_EVENT, 3 * BIG_EVENT),
    seed=st.sampled_from(["word ", "x", 'say \\"hi\\"', "日本語"]),
    done=st.booleans(),
    more=st.booleans(),
    eol=st.sampled_from([b"\n", b"\r\n"]),
    cuts=st.lists(st.integers(0), max_size=12),
    read=st.sampled_from([0, 1500, 16 << 10, 64 << 10]),
)
def test_any_split_of_a_huge_event_gives_identical_bytes(
    kind: str,
    size: int,
    seed: str,
    done: bool,
    more: bool,
    eol: bytes,
    cuts: list[int],
    read: int,
) -> None:
    body = big_stream(kind, size, seed, done, more).replace(b"\n", eol)
    chunks = pieces(body, cuts)
    if read:  # and reads of one size, as a socket gives them
        chunks = [body[at : at + read] for at in range(0, len(body), read)]
    for direction in DIRECTIONS:
        expected = one_shot(direction, body)
        got, _outputs = in_parts(direction, chunks)
        assert got == expected, direction


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("read", [4096, 65536])
def test_each_kind_of_huge_event_read_as_a_socket_gives_it(kind: str, read: int) -> None:
    body = big_stream(kind, 3 * BIG_EVENT, 'say \\"hi\\"', True)
    chunks = [body[at : at + read] for at in range(0, len(body), read)]
    for direction in DIRECTIONS:
        assert in_parts(direction, chunks)[0] == one_shot(direction, body), direction


def test_a_held_event_that_goes_out_as_it_came_is_its_own_pieces() -> None:
    """No copy of a huge chat event: the reads in its middle are sent as the very objects
    that came (only the join for the one check that it needs no repair is made)."""
    body = big_stream("text", 4 * BIG_EVENT, "word ", True)
    reads = [body[at : at + 4096] for at in range(0, len(body), 4096)]
    _out, outputs = in_parts("normalise-chat", reads)
    sent = [part for parts in outputs for part in parts]
    middle = reads[2:-2]
    assert all(any(part is read for part in sent) for read in middle)


def test_a_huge_text_is_encoded_once_for_all_the_events_repeating_it() -> None:
    body = big_stream("text", 4 * BIG_EVENT, "word ", True, more=False)
    reads = [body[at : at + 65536] for at in range(0, len(body), 65536)]
    got, outputs = in_parts("chat-to-responses", reads)
    assert got == one_shot("chat-to-responses", body)
    slices = [part for parts in outputs for part in parts if len(part) == 10_000]
    # The delta and the four closing events each send the text; its pieces are shared.
    assert len(slices) >= 5 * 20
    assert set(Counter(id(part) for part in slices).values()) == {5}
    events = [line for line in got.split(b"\n") if line.startswith(b"event: ")]
    assert events.count(b"event: response.completed") == 1
