"""A chat backend answering several choices (``n > 1``) to a Responses client: choice 0 is
the answer, the others are dropped with one warning, in streams and in JSON bodies.

Choices are told apart by their ``index``: interleaved in separate chunks, or side by side in
one chunk. The openai SDK's ``responses.stream()`` helper judges the translated stream.
"""

from __future__ import annotations

import itertools
import logging
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmitm.translate.body_to_responses import chat_completion_to_response
from llmitm.translate.context import TranslateOptions, TranslationContext
from llmitm.translate.pipeline import StreamPipeline
from llmitm.wire.ids import CountingIds, fixed_clock
from tests.helpers.oracle import sdk_responses_stream
from tests.translate.test_stream_to_responses import assert_conformant

HEAD = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
DONE = b"data: [DONE]\n\n"
ANSWERS = {0: ["The", " first", " answer", " is", " this", "."], 1: ["Another", " one", "!"]}


def context() -> TranslationContext:
    options = TranslateOptions(ids=CountingIds(), clock=fixed_clock(1_700_000_000))
    return TranslationContext(options, model="m")


def frame(choices: list[dict[str, Any]]) -> bytes:
    return b"data: " + orjson.dumps({**HEAD, "choices": choices}) + b"\n\n"


def choice(index: int, content: str | None = None, finish: str | None = None) -> dict[str, Any]:
    delta = {} if content is None else {"content": content}
    return {"index": index, "delta": delta, "finish_reason": finish}


def interleaved() -> list[bytes]:
    """One choice per chunk, taking turns (how OpenAI streams n > 1)."""
    chunks = [frame([{"index": i, "delta": {"role": "assistant", "content": ""}}]) for i in (0, 1)]
    for word0, word1 in itertools.zip_longest(ANSWERS[0], ANSWERS[1]):
        chunks += [frame([choice(0, word0)])] if word0 else []
        chunks += [frame([choice(1, word1)])] if word1 else []
    return [*chunks, frame([choice(1, None, "length")]), frame([choice(0, None, "stop")]), DONE]


def side_by_side() -> list[bytes]:
    """Both choices' deltas in every chunk, choice 1 first."""
    chunks = []
    for word0, word1 in itertools.zip_longest(ANSWERS[0], ANSWERS[1]):
        chunks.append(frame([choice(1, word1 or ""), choice(0, word0 or "")]))
    return [*chunks, frame([choice(1, None, "length"), choice(0, None, "stop")]), DONE]


def translate(chunks: list[bytes]) -> bytes:
    pipeline = StreamPipeline("chat-to-responses", context())
    out = [pipeline.start(), *(pipeline.feed(piece) for piece in chunks), pipeline.close()]
    return b"".join(out)


def events(sse: bytes) -> list[dict[str, Any]]:
    return [
        orjson.loads(block.split(b"data: ", 1)[1])
        for block in sse.split(b"\n\n")
        if b"data: " in block
    ]


@pytest.mark.parametrize("make", [interleaved, side_by_side])
def test_a_responses_client_gets_choice_0_only(make: Any, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="llmitm.translate.stream_to_responses"):
        out = translate(make())
    _events, response = sdk_responses_stream(out)
    assert response is not None
    assert response.output_text == "".join(ANSWERS[0])
    assert response.status == "completed"  # choice 0's stop, not choice 1's length
    assert_conformant(events(out))
    warnings = [r for r in caplog.records if "n > 1" in r.getMessage()]
    assert len(warnings) == 1  # one per stream, however many chunks carried other choices


def test_choice_1_text_matching_the_fast_path_template_is_still_dropped() -> None:
    """The hot path learns the bytes around a text delta from choice 0's chunks: a chunk of
    choice 1 must not pass for one (its index differs inside those bytes)."""
    chunks = [frame([{"index": 0, "delta": {"role": "assistant", "content": ""}}])]
    for _ in range(5):
        chunks += [frame([choice(0, "a")]), frame([choice(1, "B")])]
    out = translate([*chunks, frame([choice(0, None, "stop")]), DONE])
    assert sdk_responses_stream(out)[1].output_text == "aaaaa"  # type: ignore[union-attr]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cuts=st.lists(st.integers(0), max_size=8), make=st.sampled_from([interleaved, side_by_side]))
def test_any_split_gives_the_same_stream(cuts: list[int], make: Any) -> None:
    body = b"".join(make())
    points = sorted({cut % (len(body) + 1) for cut in cuts})
    split = [body[a:b] for a, b in itertools.pairwise([0, *points, len(body)])]
    assert translate(split) == translate(make())


def test_a_json_body_with_several_choices_answers_with_choice_0(
    caplog: pytest.LogCaptureFixture,
) -> None:
    completion = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {
                "index": 1,
                "message": {"role": "assistant", "content": "other"},
                "finish_reason": "length",
            },
            {
                "index": 0,
                "message": {"role": "assistant", "content": "first"},
                "finish_reason": "stop",
            },
        ],
    }
    with caplog.at_level(logging.WARNING, logger="llmitm.translate.body_to_responses"):
        response = chat_completion_to_response(completion, context())
    texts = [part["text"] for item in response["output"] for part in item.get("content", [])]
    assert texts == ["first"] and response["status"] == "completed"
    assert len([r for r in caplog.records if "n > 1" in r.getMessage()]) == 1
