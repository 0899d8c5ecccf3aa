"""Raw ``reasoning_text`` of a Responses backend shown to Responses clients as reasoning
summary events (an endpoint's ``reasoning_summary``).

The openai SDK's ``responses.stream()`` helper judges the output (it checks every event
against the snapshot it accumulates); the real LM Studio stream and a synthetic
llama.cpp-style one (no sequence numbers, no content parts) both come out with their
reasoning as the item's summary, and any split of the bytes gives the same output.
"""

from __future__ import annotations

import itertools
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmitm.translate.context import TranslateOptions, TranslationContext
from llmitm.translate.pipeline import StreamPipeline
from llmitm.translate.think_summary import response_reasoning_as_summary
from llmitm.wire.ids import CountingIds, fixed_clock
from tests.helpers.oracle import sdk_responses_stream
from tests.helpers.realfixtures import load_json, real_or_skip

THOUGHT = ["Think", "ing ", "hard."]
ANSWER = ["Hi", "!"]


def context(summary: bool) -> TranslationContext:
    options = TranslateOptions(
        ids=CountingIds(), clock=fixed_clock(1_700_000_000), reasoning_summary=summary
    )
    return TranslationContext(options, model="m")


def sse(events: list[dict[str, Any]]) -> bytes:
    return b"".join(
        b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n" for e in events
    )


def bare_stream() -> bytes:
    """llama.cpp's spelling: no sequence numbers, no content parts around the raw text."""
    response = {"id": "resp_1", "object": "response", "status": "in_progress", "output": []}
    reasoning = {"id": "rs_1", "type": "reasoning", "summary": [], "content": []}
    message = {"id": "msg_1", "type": "message", "role": "assistant", "content": []}
    text = "".join(THOUGHT)
    done_reasoning = {**reasoning, "content": [{"type": "reasoning_text", "text": text}]}
    part = {"type": "output_text", "text": "".join(ANSWER), "annotations": []}
    done_message = {**message, "status": "completed", "content": [part]}
    return sse(
        [
            {"type": "response.created", "response": response},
            {"type": "response.output_item.added", "item": reasoning},
            *[
                {"type": "response.reasoning_text.delta", "item_id": "rs_1", "delta": piece}
                for piece in THOUGHT
            ],
            {"type": "response.reasoning_text.done", "item_id": "rs_1", "text": text},
            {"type": "response.output_item.done", "item": done_reasoning},
            {"type": "response.output_item.added", "item": message},
            {
                "type": "response.content_part.added",
                "item_id": "msg_1",
                "part": {**part, "text": ""},
            },
            *[
                {"type": "response.output_text.delta", "item_id": "msg_1", "delta": piece}
                for piece in ANSWER
            ],
            {"type": "response.output_text.done", "item_id": "msg_1", "text": "".join(ANSWER)},
            {"type": "response.content_part.done", "item_id": "msg_1", "part": part},
            {"type": "response.output_item.done", "item": done_message},
            {
                "type": "response.completed",
                "response": {
                    **response,
                    "status": "completed",
                    "output": [done_reasoning, done_message],
                },
            },
        ]
    )


def normalise(pieces: list[bytes], summary: bool = True) -> bytes:
    pipeline = StreamPipeline("normalise-responses", context(summary))
    out = [pipeline.feed(piece) for piece in pieces]
    out.append(pipeline.close())
    assert pipeline.finished
    return b"".join(out)


def reasoning_of(response: Any) -> list[Any]:
    return [item for item in response.output if item.type == "reasoning"]


def test_raw_reasoning_becomes_the_summary_the_sdk_accumulates() -> None:
    events, final = sdk_responses_stream(normalise([bare_stream()]))
    types = [event.type for event in events]
    assert not any(t.startswith("response.reasoning_text.") for t in types)
    assert types.count("response.reasoning_summary_text.delta") == len(THOUGHT)
    assert types.index("response.reasoning_summary_part.added") < types.index(
        "response.reasoning_summary_text.delta"
    )
    assert types.index("response.reasoning_summary_part.done") < types.index(
        "response.output_item.done"
    )
    [item] = reasoning_of(final)
    assert [part.text for part in item.summary] == ["".join(THOUGHT)]
    assert not item.content
    assert final.output_text == "".join(ANSWER)
    assert [event.sequence_number for event in events] == list(range(len(events)))


def test_without_the_option_the_raw_text_stays() -> None:
    events, final = sdk_responses_stream(normalise([bare_stream()], summary=False))
    assert "response.reasoning_text.delta" in [event.type for event in events]
    [item] = reasoning_of(final)
    assert item.summary == []
    assert [part.text for part in item.content or []] == ["".join(THOUGHT)]


def test_the_real_lm_studio_stream_shows_its_reasoning_as_summary() -> None:
    raw = (real_or_skip() / "vercel-ai-lmstudio-responses-reasoning-tool-stream.sse").read_bytes()
    _events, before = sdk_responses_stream(normalise([raw], summary=False))
    [raw_item] = reasoning_of(before)
    thought = "".join(part.text for part in raw_item.content or [])
    assert len(thought) > 50
    events, final = sdk_responses_stream(normalise([raw]))
    [item] = reasoning_of(final)
    assert [part.text for part in item.summary] == [thought]
    deltas = [e.delta for e in events if e.type == "response.reasoning_summary_text.delta"]
    assert "".join(deltas) == thought
    calls = [(i.name, i.arguments) for i in final.output if i.type == "function_call"]
    assert calls == [(i.name, i.arguments) for i in before.output if i.type == "function_call"]
    assert calls


def test_an_upstream_summary_and_raw_text_get_separate_indexes() -> None:
    """A server sending both (raw text first) keeps them apart: raw part 0, summary part 1."""
    reasoning_done = b'event: response.output_item.done\ndata: {"type":"response.output_item.done"'
    reasoning_done += b',"item":{"id":"rs_1"'
    body = bare_stream().replace(
        reasoning_done,
        sse(
            [
                {
                    "type": "response.reasoning_summary_part.added",
                    "item_id": "rs_1",
                    "summary_index": 0,
                    "part": {"type": "summary_text", "text": ""},
                },
                {
                    "type": "response.reasoning_summary_text.delta",
                    "item_id": "rs_1",
                    "summary_index": 0,
                    "delta": "In short.",
                },
                {
                    "type": "response.reasoning_summary_text.done",
                    "item_id": "rs_1",
                    "summary_index": 0,
                    "text": "In short.",
                },
                {
                    "type": "response.reasoning_summary_part.done",
                    "item_id": "rs_1",
                    "summary_index": 0,
                    "part": {"type": "summary_text", "text": "In short."},
                },
            ]
        )
        + reasoning_done,
        1,
    )
    _events, final = sdk_responses_stream(normalise([body]))
    [item] = reasoning_of(final)
    assert [part.text for part in item.summary] == ["".join(THOUGHT), "In short."]


@settings(max_examples=40)
@given(cuts=st.lists(st.integers(min_value=0, max_value=20_000), max_size=12))
def test_any_split_gives_the_same_output(cuts: list[int]) -> None:
    body = bare_stream()
    points = sorted({cut % (len(body) + 1) for cut in cuts})
    split = [body[a:b] for a, b in itertools.pairwise([0, *points, len(body)])]
    assert normalise(split) == normalise([body])


def test_a_whole_body_moves_raw_text_into_summary() -> None:
    body = {
        "output": [
            {
                "id": "rs_1",
                "type": "reasoning",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": "why"}],
            },
            {"id": "msg_1", "type": "message", "content": [{"type": "output_text", "text": "A"}]},
        ]
    }
    assert response_reasoning_as_summary(body)
    assert body["output"][0] == {
        "id": "rs_1",
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": "why"}],
    }
    assert body["output"][1]["content"] == [{"type": "output_text", "text": "A"}]
    assert not response_reasoning_as_summary(body)


@pytest.mark.parametrize(
    "name",
    [
        "pydantic-ai-azure-responses-reasoning.json",
        "simonw-llm-responses-interleaved-reasoning-tools.json",
    ],
)
def test_real_bodies_with_summaries_only_are_left_alone(name: str) -> None:
    body = load_json(name)
    before = orjson.dumps(body)
    changed = response_reasoning_as_summary(body)
    assert changed is any(
        item.get("type") == "reasoning" and item.get("content")
        for item in load_json(name)["output"]
    )
    if not changed:
        assert orjson.dumps(body) == before
