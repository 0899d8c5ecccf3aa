"""Reasoning of a chat stream relayed to a chat client, rendered as the endpoint asks
(``reasoning_passthrough``): ``think-tags``, ``reasoning_content``, ``reasoning`` or ``drop``.

The openai SDK's chat stream helper judges the output; the real DeepSeek stream shows the
whole reasoning reaching ``content`` with the tool call intact, and a property checks that
any split of the upstream bytes gives the same client bytes.
"""

from __future__ import annotations

import itertools
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmitm.translate.chat_normalise import repair_chat_completion
from llmitm.translate.context import ReasoningMode, TranslateOptions, TranslationContext
from llmitm.translate.pipeline import StreamPipeline
from llmitm.wire.ids import CountingIds, fixed_clock
from tests.helpers.oracle import sdk_chat_stream
from tests.helpers.realfixtures import real_or_skip

HEAD = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
DONE = b"data: [DONE]\n\n"
REASONING = ["Let ", "me ", "think ", "about ", "this."]
ANSWER = ["Hello", " there."]
MODES: tuple[ReasoningMode, ...] = ("think-tags", "reasoning_content", "reasoning", "drop")


def context(mode: ReasoningMode | None) -> TranslationContext:
    options = TranslateOptions(
        ids=CountingIds(), clock=fixed_clock(1_700_000_000), reasoning_passthrough=mode
    )
    return TranslationContext(options, model="m")


def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return b"data: " + orjson.dumps({**HEAD, "choices": [choice]}) + b"\n\n"


def reasoning_stream(field: str = "reasoning_content", *, finish: bool = True) -> list[bytes]:
    chunks = [chunk({"role": "assistant", "content": None})]
    chunks += [chunk({"content": None, field: piece}) for piece in REASONING]
    chunks += [chunk({"content": piece}) for piece in ANSWER]
    if finish:
        chunks += [chunk({}, "stop"), DONE]
    return chunks


def normalise(chunks: list[bytes], mode: ReasoningMode | None) -> bytes:
    pipeline = StreamPipeline("normalise-chat", context(mode))
    out = [pipeline.feed(piece) for piece in chunks]
    out.append(pipeline.close())
    assert pipeline.finished
    return b"".join(out)


def deltas(sse: bytes) -> list[dict[str, Any]]:
    """Every choice delta the client gets, parsed."""
    out = []
    for line in sse.split(b"\n"):
        if line.startswith(b"data: {"):
            for choice in orjson.loads(line[6:]).get("choices", []):
                out.append(choice["delta"])
    return out


THOUGHT = "".join(REASONING)
TAGGED = f"<think>\n{THOUGHT}\n</think>\n\n{''.join(ANSWER)}"


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_think_tags_put_the_whole_reasoning_in_content(field: str) -> None:
    """A client keeps ``content`` whole, whatever it does with fields it does not know."""
    out = normalise(reasoning_stream(field), "think-tags")
    final, _chunks = sdk_chat_stream(out)
    assert final.choices[0].message.content == TAGGED
    assert not any(field in delta for delta in deltas(out))
    assert final.choices[0].finish_reason == "stop"


def test_without_a_rendering_the_reasoning_field_is_relayed_as_it_came() -> None:
    """The default: fields as the backend sent them, byte for byte."""
    chunks = reasoning_stream()
    assert normalise(chunks, None) == b"".join(chunks)


@pytest.mark.parametrize(
    ("mode", "sent"),
    [("reasoning_content", "reasoning"), ("reasoning", "reasoning_content")],
)
def test_the_other_spelling_is_renamed(mode: ReasoningMode, sent: str) -> None:
    out = deltas(normalise(reasoning_stream(sent), mode))
    assert "".join(delta.get(mode) or "" for delta in out) == THOUGHT
    assert not any(sent in delta for delta in out)
    assert "".join(delta.get("content") or "" for delta in out) == "".join(ANSWER)


def test_the_asked_for_spelling_keeps_its_bytes() -> None:
    chunks = reasoning_stream("reasoning_content")
    assert normalise(chunks, "reasoning_content") == b"".join(chunks)


def test_drop_removes_the_reasoning_and_its_empty_chunks() -> None:
    chunks = reasoning_stream("reasoning")
    out = normalise(chunks, "drop")
    assert b"reasoning" not in out
    final, parsed = sdk_chat_stream(out)
    assert final.choices[0].message.content == "".join(ANSWER)
    # The reasoning-only chunks said nothing once their reasoning was gone.
    assert len(parsed) == len(chunks) - 1 - len(REASONING)


def test_a_tool_call_after_reasoning_closes_the_think_block_first() -> None:
    call = {"index": 0, "id": "call_1", "type": "function"}
    call["function"] = {"name": "lookup", "arguments": '{"q": 1}'}
    chunks = [
        chunk({"role": "assistant", "content": None}),
        *[chunk({"reasoning_content": piece}) for piece in REASONING],
        chunk({"tool_calls": [call]}),
        chunk({}, "tool_calls"),
        DONE,
    ]
    final, _chunks = sdk_chat_stream(normalise(chunks, "think-tags"))
    message = final.choices[0].message
    assert message.content == f"<think>\n{THOUGHT}\n</think>\n\n"
    assert [(c.id, c.function.name, c.function.arguments) for c in message.tool_calls or []] == [
        ("call_1", "lookup", '{"q": 1}')
    ]


def test_a_stream_cut_inside_reasoning_still_closes_the_think_block() -> None:
    """The finish the normaliser adds carries the ``</think>`` owed."""
    chunks = [*reasoning_stream(finish=False)[: 1 + len(REASONING)], DONE]
    final, _chunks = sdk_chat_stream(normalise(chunks, "think-tags"))
    assert final.choices[0].message.content == f"<think>\n{THOUGHT}\n</think>\n\n"
    assert final.choices[0].finish_reason == "stop"


def test_openrouter_details_go_with_the_field_they_copy() -> None:
    details = [{"type": "reasoning.text", "text": "x"}]
    chunks = [
        chunk({"role": "assistant", "content": ""}),
        chunk({"reasoning": "x", "reasoning_details": details}),
        chunk({"content": "A"}, "stop"),
        DONE,
    ]
    tagged = deltas(normalise(chunks, "think-tags"))
    assert not any("reasoning_details" in delta for delta in tagged)
    kept = deltas(normalise(chunks, "reasoning_content"))
    assert kept[1] == {"reasoning_details": details, "reasoning_content": "x"}


def test_the_real_deepseek_stream_shows_all_its_reasoning_and_its_call() -> None:
    """2 000-odd characters of ``reasoning_content`` in one-token deltas, then a tool call:
    all of it reaches ``content`` (openai-node would keep only the last delta)."""
    raw = (real_or_skip() / "vercel-ai-deepseek-reasoning-tool-call-stream.sse").read_bytes()
    thought = "".join(delta.get("reasoning_content") or "" for delta in deltas(raw))
    assert len(thought) > 100
    before, _chunks = sdk_chat_stream(raw)
    final, _chunks = sdk_chat_stream(normalise([raw], "think-tags"))
    message = final.choices[0].message
    assert message.content == f"<think>\n{thought}\n</think>\n\n" + (
        before.choices[0].message.content or ""
    )
    calls = [(c.id, c.function.name, c.function.arguments) for c in message.tool_calls or []]
    assert calls == [
        (c.id, c.function.name, c.function.arguments)
        for c in before.choices[0].message.tool_calls or []
    ]
    assert calls


@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=12))
def test_any_split_gives_the_same_output(mode: ReasoningMode, cuts: list[int]) -> None:
    body = b"".join(reasoning_stream("reasoning_content"))
    points = sorted({cut % (len(body) + 1) for cut in cuts})
    split = [body[a:b] for a, b in itertools.pairwise([0, *points, len(body)])]
    assert (
        normalise(split, mode)
        == normalise([body], mode)
        == normalise(reasoning_stream("reasoning_content"), mode)
    )


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("think-tags", {"content": "<think>\nwhy\n</think>\n\nA"}),
        ("reasoning_content", {"content": "A", "reasoning_content": "why"}),
        ("reasoning", {"content": "A", "reasoning": "why"}),
        ("drop", {"content": "A"}),
    ],
)
def test_a_whole_body_gets_the_same_rendering(mode: ReasoningMode, expected: dict) -> None:
    message = {"role": "assistant", "content": "A", "reasoning_content": "why"}
    body = {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}
    changed = repair_chat_completion(body, context(mode))
    assert {k: v for k, v in message.items() if k != "role"} == expected
    assert changed is (mode != "reasoning_content")


def test_no_rendering_leaves_a_body_alone() -> None:
    message = {"role": "assistant", "content": "A", "reasoning_content": "why"}
    body = {"choices": [{"index": 0, "message": dict(message), "finish_reason": "stop"}]}
    assert not repair_chat_completion(body, context(None))
    assert body["choices"][0]["message"] == message


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="reasoning_passthrough must be one of"):
        TranslateOptions(reasoning_passthrough="tags")  # type: ignore[arg-type]
