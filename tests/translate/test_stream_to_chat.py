"""Direction 1 streaming: Responses SSE from the upstream → chat completion chunks for the client.

The openai SDK is the judge of form (``client.chat.completions.stream`` must accept the bytes
and every chunk must parse as ``ChatCompletionChunk``); the meaning is checked against the
source events, read here with a deliberately independent SSE split and stdlib ``json``.
Real captured streams come from ``shared/fixtures/real``; what they lack (length and
content-filter cuts, refusals, parallel and custom calls, odd provider orderings) is built
with :class:`Responses`, a small builder of conformant Responses event sequences.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionChunk

from llmitm.translate.context import TranslateOptions, TranslationContext
from llmitm.translate.pipeline import StreamPipeline
from llmitm.translate.stream_to_chat import DONE, ResponsesToChatStream
from llmitm.wire.errors import ApiError
from llmitm.wire.ids import CountingIds, fixed_clock
from llmitm.wire.modes import REASONING_MODES
from tests.helpers.oracle import sdk_chat_raw_chunks, sdk_chat_stream

REAL = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "real"
NOW = 1_700_000_000
THINK_OPEN, THINK_CLOSE = "<think>\n", "\n</think>\n\n"
REASONING_FIELDS = ("reasoning_content", "reasoning")

# -- independent readers ---------------------------------------------------------------------


def parse_sse(raw: bytes) -> list[Any]:
    """Every ``data:`` payload in ``raw``: dicts, and the string ``"[DONE]"`` where it occurs.

    Independent of ``llmitm.wire.sse`` on purpose: blank-line blocks, ``data:`` lines only.
    """
    payloads: list[Any] = []
    for block in raw.replace(b"\r\n", b"\n").split(b"\n\n"):
        data = [line[5:].strip() for line in block.split(b"\n") if line.startswith(b"data:")]
        if not data:
            continue
        payload = b"\n".join(data)
        payloads.append(DONE if payload == b"[DONE]" else json.loads(payload))
    return payloads


def source_events(raw: bytes) -> list[dict[str, Any]]:
    return [p for p in parse_sse(raw) if isinstance(p, dict)]


@dataclass
class Meaning:
    """What a Responses stream says, independent of how it is encoded."""

    response_id: str | None = None
    created_at: int | None = None
    model: str | None = None
    text: str = ""
    refusal: str = ""
    reasoning_parts: list[str] = field(default_factory=list)
    calls: list[tuple[str, str, str]] = field(default_factory=list)
    terminal: str | None = None
    incomplete_reason: str | None = None
    usage: dict[str, Any] | None = None
    error_message: str | None = None

    @property
    def reasoning(self) -> str:
        return "\n\n".join(self.reasoning_parts)

    @property
    def finish_reason(self) -> str | None:
        if self.terminal == "response.completed":
            return "tool_calls" if self.calls else "stop"
        if self.terminal == "response.incomplete":
            return {"content_filter": "content_filter"}.get(self.incomplete_reason, "length")
        return None


def meaning_of(events: list[dict[str, Any]]) -> Meaning:
    """Read the text, reasoning parts, calls and terminal state of a Responses event list."""
    meaning = Meaning()
    parts: dict[tuple[Any, Any], list[str]] = {}
    calls: dict[str, dict[str, Any]] = {}
    for event in events:
        kind = event.get("type")
        response = event.get("response") if isinstance(event.get("response"), dict) else {}
        if kind == "response.created":
            meaning.response_id = response.get("id")
            meaning.created_at = response.get("created_at")
            meaning.model = response.get("model")
        elif kind == "response.output_text.delta":
            meaning.text += event["delta"]
        elif kind == "response.refusal.delta":
            meaning.refusal += event["delta"]
        elif kind in ("response.reasoning_summary_text.delta", "response.reasoning_text.delta"):
            key = (event.get("item_id"), event.get("summary_index", event.get("content_index")))
            parts.setdefault(key, []).append(event["delta"])
        elif kind in ("response.output_item.added", "response.output_item.done"):
            item = event["item"]
            if item.get("type") == "function_call":
                call = calls.setdefault(item["id"], {"deltas": ""})
                call.update(call_id=item["call_id"], name=item["name"])
                if kind.endswith("done"):
                    call["arguments"] = item["arguments"]
        elif kind == "response.function_call_arguments.delta":
            calls.setdefault(event["item_id"], {"deltas": ""})["deltas"] += event["delta"]
        elif kind in ("response.completed", "response.incomplete", "response.failed"):
            meaning.terminal = meaning.terminal or kind
            meaning.usage = response.get("usage")
            details = response.get("incomplete_details") or {}
            meaning.incomplete_reason = details.get("reason")
        elif kind == "error" and meaning.error_message is None:
            error = event.get("error") if isinstance(event.get("error"), dict) else event
            meaning.error_message = error["message"]
    meaning.reasoning_parts = ["".join(deltas) for deltas in parts.values()]
    meaning.calls = [
        (c["call_id"], c["name"], c.get("arguments", c["deltas"])) for c in calls.values()
    ]
    return meaning


# -- running the translator ----------------------------------------------------------------


def context(
    mode: str = "think-tags", *, include_usage: bool = False, model: str | None = None
) -> TranslationContext:
    options = TranslateOptions(reasoning=mode, ids=CountingIds(), clock=fixed_clock(NOW))  # type: ignore[arg-type]
    return TranslationContext(options=options, model=model, include_usage=include_usage)


def through_pipeline(raw: bytes, ctx: TranslationContext) -> bytes:
    pipeline = StreamPipeline("responses-to-chat", ctx)
    return pipeline.start() + pipeline.feed(raw) + pipeline.close()


def translate(events: list[dict[str, Any]], ctx: TranslationContext | None = None) -> list[Any]:
    """Feed events one by one, then close; the frames the client would get."""
    stream = ResponsesToChatStream(ctx or context())
    frames: list[Any] = []
    for event in events:
        frames += stream.feed(event)
    frames += stream.close()
    return frames


def encode(frames: list[Any]) -> bytes:
    return b"".join(
        b"data: [DONE]\n\n" if f == DONE else b"data: " + json.dumps(f).encode() + b"\n\n"
        for f in frames
    )


def chunks_of(frames: list[Any]) -> list[dict[str, Any]]:
    return [f for f in frames if isinstance(f, dict) and "error" not in f]


def deltas_of(frames: list[Any]) -> list[dict[str, Any]]:
    return [c["choices"][0]["delta"] for c in chunks_of(frames) if c["choices"]]


def content_of(frames: list[Any]) -> str:
    return "".join(d.get("content") or "" for d in deltas_of(frames))


def field_of(frames: list[Any], name: str) -> str:
    return "".join(d.get(name) or "" for d in deltas_of(frames))


def sdk_final(frames: list[Any], **request: Any):
    """The SDK's accumulated completion for ``frames`` (also asserts every chunk validates)."""
    for chunk in chunks_of(frames):
        ChatCompletionChunk.model_validate(chunk)
    final, _chunks = sdk_chat_stream(encode(frames), **request)
    return final


# -- a builder of conformant Responses streams ---------------------------------------------


USAGE = {
    "input_tokens": 120,
    "input_tokens_details": {"cached_tokens": 64},
    "output_tokens": 80,
    "output_tokens_details": {"reasoning_tokens": 50},
    "total_tokens": 200,
}


class Responses:
    """Builds the events OpenAI sends, item by item, with sequence numbers and output indexes."""

    def __init__(self, response_id: str = "resp_test", model: str = "gpt-test") -> None:
        self.response_id = response_id
        self.model = model
        self.events: list[dict[str, Any]] = []
        self.output: list[dict[str, Any]] = []
        self.emit("response.created", response=self.response("in_progress"))
        self.emit("response.in_progress", response=self.response("in_progress"))

    def response(self, status: str, **fields: Any) -> dict[str, Any]:
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": 1_750_000_000,
            "status": status,
            "model": self.model,
            "output": list(self.output) if status != "in_progress" else [],
            "usage": None,
            **fields,
        }

    def emit(self, kind: str, **fields: Any) -> Responses:
        self.events.append({"type": kind, "sequence_number": len(self.events), **fields})
        return self

    def _add(self, item: dict[str, Any], *, announce: bool = True) -> int:
        index = len(self.output)
        self.output.append(item)
        if announce:
            self.emit("response.output_item.added", output_index=index, item=item)
        return index

    def _done(self, index: int, item: dict[str, Any]) -> None:
        self.output[index] = item
        self.emit("response.output_item.done", output_index=index, item=item)

    def reasoning(self, *parts: str, item_id: str = "rs_1", raw: bool = False) -> Responses:
        """A reasoning item: summary parts, or raw chain of thought (``reasoning_text``)."""
        index = self._add({"id": item_id, "type": "reasoning", "summary": []})
        ids = {"item_id": item_id, "output_index": index}
        if raw:  # one reasoning_text part, the arguments are its deltas
            for delta in parts:
                self.emit("response.reasoning_text.delta", **ids, content_index=0, delta=delta)
            content = [{"type": "reasoning_text", "text": "".join(parts)}]
            self._done(
                index, {"id": item_id, "type": "reasoning", "summary": [], "content": content}
            )
            return self
        for k, text in enumerate(parts):
            ids_k = {**ids, "summary_index": k}
            self.emit("response.reasoning_summary_part.added", **ids_k, part=_summary(""))
            for piece in _halves(text):
                self.emit("response.reasoning_summary_text.delta", **ids_k, delta=piece)
            self.emit("response.reasoning_summary_text.done", **ids_k, text=text)
            self.emit("response.reasoning_summary_part.done", **ids_k, part=_summary(text))
        summary = [_summary(text) for text in parts]
        self._done(index, {"id": item_id, "type": "reasoning", "summary": summary})
        return self

    def message(self, *deltas: str, item_id: str = "msg_1", refusal: bool = False) -> Responses:
        part_type, kind = ("refusal", "refusal") if refusal else ("output_text", "output_text")
        item = {"id": item_id, "type": "message", "role": "assistant", "status": "in_progress"}
        index = self._add({**item, "content": []})
        ids = {"item_id": item_id, "output_index": index, "content_index": 0}
        empty = {"type": part_type, part_type if refusal else "text": ""}
        self.emit("response.content_part.added", **ids, part=empty)
        for delta in deltas:
            extra = {} if refusal else {"logprobs": []}
            self.emit(f"response.{kind}.delta", **ids, delta=delta, **extra)
        text = "".join(deltas)
        part = {"type": "refusal", "refusal": text} if refusal else {
            "type": "output_text", "text": text, "annotations": [], "logprobs": []
        }  # fmt: skip
        self.emit("response.content_part.done", **ids, part=part)
        self._done(index, {**item, "status": "completed", "content": [part]})
        return self

    def function_call(
        self,
        call_id: str,
        name: str,
        *deltas: str,
        item_id: str | None = None,
        arguments: str | None = None,
        announce: bool = True,
    ) -> Responses:
        """A function call; ``deltas`` stream the arguments, ``arguments`` (default: their
        concatenation) is what the done events carry; ``announce=False`` skips output_item.added."""
        item_id = item_id or f"fc_{call_id}"
        arguments = "".join(deltas) if arguments is None else arguments
        base = {"id": item_id, "type": "function_call", "call_id": call_id, "name": name}
        index = self._add({**base, "arguments": "", "status": "in_progress"}, announce=announce)
        for delta in deltas:
            self.emit(
                "response.function_call_arguments.delta",
                item_id=item_id,
                output_index=index,
                delta=delta,
            )
        self.emit(
            "response.function_call_arguments.done",
            item_id=item_id,
            output_index=index,
            name=name,
            arguments=arguments,
        )
        self._done(index, {**base, "arguments": arguments, "status": "completed"})
        return self

    def custom_call(self, call_id: str, name: str, *deltas: str) -> Responses:
        item_id = f"ctc_{call_id}"
        base = {"id": item_id, "type": "custom_tool_call", "call_id": call_id, "name": name}
        index = self._add({**base, "input": "", "status": "in_progress"})
        for delta in deltas:
            self.emit(
                "response.custom_tool_call_input.delta",
                item_id=item_id,
                output_index=index,
                delta=delta,
            )
        tool_input = "".join(deltas)
        self.emit(
            "response.custom_tool_call_input.done",
            item_id=item_id,
            output_index=index,
            input=tool_input,
        )
        self._done(index, {**base, "input": tool_input, "status": "completed"})
        return self

    def completed(self, usage: dict[str, Any] | None = USAGE) -> list[dict[str, Any]]:
        self.emit("response.completed", response=self.response("completed", usage=usage))
        return self.events

    def incomplete(self, reason: str) -> list[dict[str, Any]]:
        details = {"reason": reason}
        response = self.response("incomplete", usage=USAGE, incomplete_details=details)
        self.emit("response.incomplete", response=response)
        return self.events

    def failed(self, code: str, message: str) -> list[dict[str, Any]]:
        error = {"code": code, "message": message}
        self.emit("response.failed", response=self.response("failed", error=error))
        return self.events


def _summary(text: str) -> dict[str, str]:
    return {"type": "summary_text", "text": text}


def _halves(text: str) -> list[str]:
    middle = len(text) // 2
    return [piece for piece in (text[:middle], text[middle:]) if piece]


# -- the real fixtures -----------------------------------------------------------------------


def _responses_fixtures(*, failing: bool) -> list[Any]:
    """pytest params: the real Responses ``.sse`` fixtures that complete (or that fail)."""
    if not REAL.is_dir():
        return [pytest.param(None, marks=pytest.mark.skip(reason=f"{REAL} not present"))]
    params = []
    for path in sorted(REAL.glob("*.sse")):
        meta_path = path.with_name(path.stem + ".meta.json")
        meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
        if meta.get("api") != "responses":
            continue
        fails = any(
            e.get("type") in ("error", "response.failed") for e in source_events(path.read_bytes())
        )
        if fails == failing:
            params.append(pytest.param(path.name, id=path.stem))
    return params


COMPLETING = _responses_fixtures(failing=False)
FAILING = _responses_fixtures(failing=True)


def read_fixture(name: str) -> bytes:
    path = REAL / name
    if not path.exists():
        pytest.skip(f"{path} not present")
    return path.read_bytes()


def test_fixture_lists_are_not_empty() -> None:
    """Guards the parametrisation: a renamed fixture folder must not silently test nothing."""
    if not REAL.is_dir():
        pytest.skip(f"{REAL} not present")
    assert len(COMPLETING) >= 7
    assert len(FAILING) >= 1


@pytest.mark.parametrize("mode", REASONING_MODES)
@pytest.mark.parametrize("name", COMPLETING)
def test_fixture_is_accepted_by_the_sdk_and_keeps_its_meaning(name: str, mode: str) -> None:
    """Every real Responses stream, in every reasoning mode: the SDK's accumulator accepts the
    bytes, every chunk validates, and text, reasoning, tool calls and finish reason are the
    source's."""
    raw = read_fixture(name)
    source = meaning_of(source_events(raw))
    out = through_pipeline(raw, context(mode))

    frames = parse_sse(out)
    assert frames[-1] == DONE and frames.count(DONE) == 1
    json_chunks = [f for f in frames if f != DONE]
    for chunk in json_chunks:
        assert "error" not in chunk
        ChatCompletionChunk.model_validate(chunk)
    assert len(sdk_chat_raw_chunks(out)) == len(json_chunks)

    final, _ = sdk_chat_stream(out)
    (choice,) = final.choices
    message = choice.message
    extras = message.model_extra or {}
    if mode == "think-tags" and source.reasoning:
        assert message.content == THINK_OPEN + source.reasoning + THINK_CLOSE + source.text
    else:
        assert message.content == source.text
    if mode in REASONING_FIELDS and source.reasoning:
        assert extras == {mode: source.reasoning}
    else:
        assert not any(name in extras for name in REASONING_FIELDS)
    got_calls = [(c.id, c.function.name, c.function.arguments) for c in message.tool_calls or []]
    assert got_calls == source.calls
    assert choice.finish_reason == source.finish_reason


@pytest.mark.parametrize("name", COMPLETING)
def test_fixture_chunks_carry_the_response_identity(name: str) -> None:
    """Chunk ids are ``chatcmpl-<response id>``; ``created`` is the response's ``created_at``
    (the injected clock when the upstream sent none); ``model`` the upstream's model."""
    raw = read_fixture(name)
    source = meaning_of(source_events(raw))
    chunks = [f for f in parse_sse(through_pipeline(raw, context())) if f != DONE]
    assert {c["id"] for c in chunks} == {f"chatcmpl-{source.response_id}"}
    assert {c["created"] for c in chunks} == {source.created_at or NOW}
    assert {c["model"] for c in chunks} == {source.model or ""}


@pytest.mark.parametrize("name", COMPLETING)
def test_fixture_usage_when_requested(name: str) -> None:
    """include_usage: the final usage equals the terminal Responses usage, cached and reasoning
    tokens included, and arrives in a ``choices: []`` chunk right before ``[DONE]``."""
    raw = read_fixture(name)
    source = meaning_of(source_events(raw))
    out = through_pipeline(raw, context(include_usage=True))
    frames = parse_sse(out)
    assert frames[-2]["choices"] == []
    assert all("usage" in f and f["usage"] is None for f in frames[:-2])

    final, _ = sdk_chat_stream(out, stream_options={"include_usage": True})
    usage = final.usage
    assert usage is not None and source.usage is not None
    assert usage.prompt_tokens == source.usage["input_tokens"]
    assert usage.completion_tokens == source.usage["output_tokens"]
    assert usage.total_tokens == source.usage["total_tokens"]
    details_in = source.usage.get("input_tokens_details") or {}
    details_out = source.usage.get("output_tokens_details") or {}
    assert usage.prompt_tokens_details.cached_tokens == details_in.get("cached_tokens", 0)
    assert usage.completion_tokens_details.reasoning_tokens == details_out.get(
        "reasoning_tokens", 0
    )


@pytest.mark.parametrize("name", COMPLETING)
def test_fixture_no_usage_chunk_unless_requested(name: str) -> None:
    """Without include_usage no chunk mentions usage and every chunk has one choice."""
    raw = read_fixture(name)
    out = through_pipeline(raw, context(include_usage=False))
    chunks = [f for f in parse_sse(out) if f != DONE]
    assert all("usage" not in c and len(c["choices"]) == 1 for c in chunks)
    final, _ = sdk_chat_stream(out)
    assert final.usage is None


@pytest.mark.parametrize("mode", REASONING_MODES)
@pytest.mark.parametrize("name", FAILING)
def test_error_fixture_raises_the_upstream_message(name: str, mode: str) -> None:
    """A Responses stream that fails mid-way (error event + response.failed): the SDK raises
    ``APIError`` with the upstream's message and code, and the body still ends with ``[DONE]``."""
    raw = read_fixture(name)
    source = meaning_of(source_events(raw))
    assert source.error_message
    out = through_pipeline(raw, context(mode))
    assert out.endswith(b"data: [DONE]\n\n")
    frames = parse_sse(out)
    errors = [f for f in frames if f != DONE and "error" in f]
    assert len(errors) == 1 and frames[-2] is errors[0]
    assert errors[0]["error"]["message"] == source.error_message
    assert errors[0]["error"]["code"] == "insufficient_quota"
    with pytest.raises(openai.APIError, match=re.escape(source.error_message)):
        sdk_chat_stream(out)


# -- the conformance checklist, direction 1 -------------------------------------------------


def _text_and_two_calls() -> list[dict[str, Any]]:
    return (
        Responses()
        .reasoning("Plan the calls.")
        .message("Checking ", "both.")
        .function_call("call_a", "get_weather", '{"city":', '"Paris"}')
        .function_call("call_b", "get_time", '{"tz":"CET"}')
        .completed()
    )


def test_checklist_35_chunk_object_role_once_and_tool_identity_once() -> None:
    """Every chunk is ``chat.completion.chunk``; ``role`` only in the first chunk; a
    tool call's ``id``, ``type`` and ``name`` only in its first delta (the SDK concatenates
    repeats)."""
    frames = translate(_text_and_two_calls(), context(include_usage=True))
    chunks = chunks_of(frames)
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    deltas = deltas_of(frames)
    assert deltas[0]["role"] == "assistant"
    assert all("role" not in d for d in deltas[1:])
    seen: dict[int, int] = {}
    for delta in deltas:
        for call in delta.get("tool_calls") or []:
            first = call["index"] not in seen
            seen[call["index"]] = seen.get(call["index"], 0) + 1
            assert ("id" in call) is first
            assert ("type" in call) is first
            assert ("name" in call["function"]) is first
    assert set(seen) == {0, 1}
    final = sdk_final(frames)
    calls = final.choices[0].message.tool_calls
    assert [(c.id, c.function.name) for c in calls] == [
        ("call_a", "get_weather"),
        ("call_b", "get_time"),
    ]


def test_checklist_36_tool_indices_independent_of_output_index() -> None:
    """Calls at output_index 2 and 3 (after a reasoning item and a message) become
    tool call indices 0 and 1."""
    events = _text_and_two_calls()
    added = [e for e in events if e["type"] == "response.output_item.added"]
    assert [(e["item"]["type"], e["output_index"]) for e in added] == [
        ("reasoning", 0),
        ("message", 1),
        ("function_call", 2),
        ("function_call", 3),
    ]
    frames = translate(events)
    indices = [c["index"] for d in deltas_of(frames) for c in d.get("tool_calls") or []]
    assert sorted(set(indices)) == [0, 1]
    assert indices == sorted(indices)  # sequential: call 1 starts after call 0 is finished
    final = sdk_final(frames)
    calls = final.choices[0].message.tool_calls
    assert [(c.index, c.function.arguments) for c in calls] == [
        (0, '{"city":"Paris"}'),
        (1, '{"tz":"CET"}'),
    ]
    assert final.choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize("include_usage", [True, False])
def test_checklist_37_usage_chunk_only_when_requested_and_last(include_usage: bool) -> None:
    """The ``choices: []`` usage chunk exists iff the client asked, and is the last
    JSON chunk before ``[DONE]``; the finish chunk precedes it."""
    frames = translate(Responses().message("Hi").completed(), context(include_usage=include_usage))
    assert frames[-1] == DONE
    usage_chunks = [f for f in chunks_of(frames) if f["choices"] == []]
    if include_usage:
        assert usage_chunks == [frames[-2]]
        assert frames[-2]["usage"] == {
            "prompt_tokens": 120,
            "completion_tokens": 80,
            "total_tokens": 200,
            "prompt_tokens_details": {"cached_tokens": 64},
            "completion_tokens_details": {"reasoning_tokens": 50},
        }
        assert frames[-3]["choices"][0]["finish_reason"] == "stop"
    else:
        assert usage_chunks == []
        assert frames[-2]["choices"][0]["finish_reason"] == "stop"
        assert all("usage" not in f for f in chunks_of(frames))


@pytest.mark.parametrize("mode", REASONING_MODES)
def test_checklist_38_reasoning_goes_where_configured(mode: str) -> None:
    """Reasoning reaches the configured field, or the ``<think>`` wrapper; it is never
    mixed into ``content`` otherwise, and ``drop`` sends it nowhere."""
    events = Responses().reasoning("Think hard.").message("Answer.").completed()
    frames = translate(events, context(mode))
    message = sdk_final(frames).choices[0].message
    extras = message.model_extra or {}
    if mode == "think-tags":
        assert message.content == "<think>\nThink hard.\n</think>\n\nAnswer."
        assert not any(field_of(frames, name) for name in REASONING_FIELDS)
    elif mode == "drop":
        assert message.content == "Answer."
        assert extras == {}
        assert "Think" not in json.dumps(frames)
    else:
        assert message.content == "Answer."
        assert extras == {mode: "Think hard."}
        other = next(name for name in REASONING_FIELDS if name != mode)
        assert field_of(frames, other) == ""


def test_checklist_38_think_tags_close_before_a_tool_call() -> None:
    """The ``</think>`` close comes before the first tool call delta, so a chat UI
    never shows an open think block above the call."""
    events = Responses().reasoning("Need a tool.").function_call("call_1", "f", "{}").completed()
    frames = translate(events, context("think-tags"))
    deltas = deltas_of(frames)
    close = next(i for i, d in enumerate(deltas) if d.get("content") == THINK_CLOSE)
    first_call = next(i for i, d in enumerate(deltas) if d.get("tool_calls"))
    assert close < first_call
    assert content_of(frames) == "<think>\nNeed a tool.\n</think>\n\n"


def test_checklist_38_think_block_closed_even_without_text() -> None:
    """A reasoning-only response still closes its ``<think>`` before the finish chunk."""
    frames = translate(Responses().reasoning("Only thoughts.").completed(), context("think-tags"))
    assert content_of(frames) == "<think>\nOnly thoughts.\n</think>\n\n"
    assert chunks_of(frames)[-1]["choices"][0]["finish_reason"] == "stop"


def test_checklist_41_azure_quirks_do_not_crash() -> None:
    """Azure's extra fields (``content_filters``), unknown and hosted-tool event types,
    events without ``type``, ``item: null`` and a terminal with ``response: null`` neither crash
    the translator nor reach the client."""
    r = Responses(model="gpt-5-azure")
    r.events[0]["response"]["content_filters"] = None
    r.message("Hello")
    r.emit("response.content_filter.results", content_filter_results={"hate": {"filtered": False}})
    r.emit("response.web_search_call.in_progress", item_id="ws_1", output_index=1)
    r.events.append({"no_type": True})
    r.events.append({"type": None})
    r.emit("response.output_item.added", output_index=2, item=None)
    r.emit("response.output_item.done", output_index=2, item="not an item")
    r.emit("response.output_item.added", output_index=2, item={"id": "x"})
    r.emit("response.function_call_arguments.delta", item_id="unknown", delta="{}")
    r.emit("response.completed", response=None)
    frames = translate(r.events, context(include_usage=True))
    final = sdk_final(frames, stream_options={"include_usage": True})
    assert final.choices[0].message.content == "Hello"
    assert final.choices[0].finish_reason == "stop"
    assert final.usage is None  # unknown usage stays null, never a partial object
    assert frames[-1] == DONE


def test_checklist_20_stream_without_terminal_ends_in_error_never_clean() -> None:
    """The upstream stops after some text without a terminal event:
    the client gets an error chunk and ``[DONE]``; the SDK raises instead of returning a
    truncated answer as if it were complete."""
    events = Responses().message("Partial ans").events[:-2]  # cut before the item is done
    frames = translate(events)
    assert frames[-1] == DONE
    assert frames[-2]["error"]["code"] == "server_error"
    assert "terminal" in frames[-2]["error"]["message"]
    assert all(f["choices"][0]["finish_reason"] is None for f in chunks_of(frames))
    with pytest.raises(openai.APIError, match="terminal event"):
        sdk_chat_stream(encode(frames))


def test_checklist_20_empty_upstream_still_gets_a_well_formed_error() -> None:
    """An upstream that sends nothing at all: role chunk, error chunk, ``[DONE]``."""
    frames = translate([])
    assert [type(f) for f in frames] == [dict, dict, str]
    assert frames[0]["choices"][0]["delta"]["role"] == "assistant"
    assert frames[1]["error"]["code"] == "server_error"


def test_checklist_20_stream_closed_inside_a_think_block_closes_the_tag_first() -> None:
    """Cut while reasoning: the ``</think>`` is sent before the error, so the partial content a
    UI already rendered stays well-formed."""
    events = Responses().reasoning("Half a thou").events[:-1]
    frames = translate(events, context("think-tags"))
    assert content_of(frames) == "<think>\nHalf a thou\n</think>\n\n"
    assert "error" in frames[-2] and frames[-1] == DONE


@pytest.mark.parametrize(
    "error_event",
    [
        pytest.param(
            {
                "type": "error",
                "sequence_number": 4,
                "error": {
                    "type": "rate_limit_error",
                    "code": "rate_limit_exceeded",
                    "message": "Slow down.",
                    "param": None,
                },
            },
            id="nested",
        ),
        pytest.param(
            {
                "type": "error",
                "sequence_number": 4,
                "code": "rate_limit_exceeded",
                "message": "Slow down.",
                "param": None,
            },
            id="flat",
        ),
    ],
)
def test_checklist_22_nested_and_flat_error_events_are_both_read(
    error_event: dict[str, Any],
) -> None:
    """The live API nests the error object, the API reference documents it flat; both become
    the same chat error chunk (the event's own ``type: "error"`` is not taken for the error's
    type), followed by ``[DONE]``."""
    events = [*Responses().message("so far").events, error_event]
    frames = translate(events)
    assert frames[-1] == DONE
    error = frames[-2]["error"]
    assert error["message"] == "Slow down."
    assert error["code"] == "rate_limit_exceeded"
    assert error["type"] != "error"
    with pytest.raises(openai.APIError, match="Slow down"):
        sdk_chat_stream(encode(frames))


def test_checklist_22_error_then_failed_yields_one_error() -> None:
    """OpenAI sends ``error`` and then ``response.failed``: the client sees one error chunk and
    one ``[DONE]``, nothing after."""
    r = Responses().message("x")
    r.emit("error", error={"type": "server_error", "code": "server_error", "message": "boom"})
    events = r.failed("server_error", "boom again")
    frames = translate(events)
    assert [f for f in frames if f == DONE or "error" in f] == [frames[-2], DONE]
    assert frames[-2]["error"]["message"] == "boom"


def test_checklist_23_context_length_error_event() -> None:
    """llama.cpp's real context-size error (its own ``type``, an integer ``code``) in a
    mid-stream error event becomes ``code: context_length_exceeded``."""
    body = json.loads(read_fixture("llamacpp-gemma270m-responses-ctx-error.json"))
    events = [*Responses().events, {"type": "error", **body}]
    frames = translate(events)
    error = frames[-2]["error"]
    assert error["code"] == "context_length_exceeded"
    assert error["type"] == "invalid_request_error"
    assert "exceeds the available context size" in error["message"]


def test_checklist_23_context_length_response_failed() -> None:
    """A ``response.failed`` whose error says the context window was exceeded."""
    events = Responses().failed(
        "context_length_exceeded", "Your input exceeds the context window of this model."
    )
    frames = translate(events)
    assert frames[-2]["error"]["code"] == "context_length_exceeded"
    assert frames[-1] == DONE
    with pytest.raises(openai.APIError, match="context window"):
        sdk_chat_stream(encode(frames))


# -- synthetic cases the fixtures lack -------------------------------------------------------


def test_incomplete_max_output_tokens_finishes_with_length() -> None:
    """``response.incomplete`` (max_output_tokens) → ``finish_reason: "length"``; the SDK's
    stream helper raises ``LengthFinishReasonError`` exactly as it does against OpenAI's own
    chat API, carrying the truncated text."""
    frames = translate(Responses().message('{"answer": "tru').incomplete("max_output_tokens"))
    assert chunks_of(frames)[-1]["choices"][0]["finish_reason"] == "length"
    with pytest.raises(openai.LengthFinishReasonError) as raised:
        sdk_final(frames)
    (choice,) = raised.value.completion.choices
    assert choice.finish_reason == "length"
    assert choice.message.content == '{"answer": "tru'


def test_incomplete_content_filter_finishes_with_content_filter() -> None:
    """``response.incomplete`` (content_filter) → ``finish_reason: "content_filter"``, which
    the SDK reports as ``ContentFilterFinishReasonError``."""
    frames = translate(Responses().message("Here is how").incomplete("content_filter"))
    with pytest.raises(openai.ContentFilterFinishReasonError) as raised:
        sdk_final(frames)
    assert raised.value.completion is not None
    assert raised.value.completion.choices[0].finish_reason == "content_filter"


def test_incomplete_with_unknown_reason_is_still_a_length_cut() -> None:
    """An unknown incomplete reason is still an incomplete answer: ``length``, not ``stop``."""
    r = Responses().message("abc")
    r.emit("response.incomplete", response=r.response("incomplete", incomplete_details=None))
    frames = translate(r.events)
    assert chunks_of(frames)[-1]["choices"][0]["finish_reason"] == "length"
    with pytest.raises(openai.LengthFinishReasonError):
        sdk_final(frames)


def test_refusal_becomes_delta_refusal() -> None:
    """``response.refusal.delta`` → ``delta.refusal``; the SDK's final message carries the
    refusal and no content."""
    events = Responses().message("I can't ", "help with that.", refusal=True).completed()
    frames = translate(events)
    assert field_of(frames, "refusal") == "I can't help with that."
    message = sdk_final(frames).choices[0].message
    assert message.refusal == "I can't help with that."
    assert message.content == ""


def test_refusal_after_reasoning_closes_the_think_block() -> None:
    events = Responses().reasoning("Hmm.").message("No.", refusal=True).completed()
    frames = translate(events, context("think-tags"))
    message = sdk_final(frames).choices[0].message
    assert message.content == "<think>\nHmm.\n</think>\n\n"
    assert message.refusal == "No."


def test_parallel_function_calls() -> None:
    """Two calls in one response (OpenAI's parallel tool calls): two tool calls with distinct
    ids, their own arguments and ``finish_reason: "tool_calls"``."""
    events = (
        Responses()
        .function_call("call_1", "get_weather", '{"city":', '"Oslo"}')
        .function_call("call_2", "get_weather", '{"city":', '"Rome"}')
        .completed()
    )
    final = sdk_final(translate(events))
    calls = final.choices[0].message.tool_calls
    assert [(c.id, c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("call_1", "get_weather", {"city": "Oslo"}),
        ("call_2", "get_weather", {"city": "Rome"}),
    ]
    assert final.choices[0].finish_reason == "tool_calls"


def test_interleaved_argument_deltas_are_attributed_by_item_id() -> None:
    """A provider that streams two calls' arguments interleaved: each fragment lands on the
    call whose ``item_id`` it names."""
    r = Responses()
    for n in (1, 2):
        item = {"id": f"fc_{n}", "type": "function_call", "call_id": f"call_{n}", "name": "f"}
        r.emit("response.output_item.added", output_index=n - 1, item={**item, "arguments": ""})
    for n, delta in [(1, '{"n":'), (2, '{"n":'), (2, "2}"), (1, "1}")]:
        r.emit(
            "response.function_call_arguments.delta", item_id=f"fc_{n}", output_index=n - 1,
            delta=delta,
        )  # fmt: skip
    frames = translate(r.completed())
    calls = sdk_final(frames).choices[0].message.tool_calls
    assert [(c.id, c.function.arguments) for c in calls] == [
        ("call_1", '{"n":1}'),
        ("call_2", '{"n":2}'),
    ]


def test_function_call_without_argument_deltas_sends_arguments_from_done() -> None:
    """A call whose arguments arrive only in ``output_item.done`` (LM Studio does this)
    still reaches the client with its full arguments, once."""
    events = Responses().function_call("call_1", "lookup", arguments='{"q":"llmitm"}').completed()
    frames = translate(events)
    calls = sdk_final(frames).choices[0].message.tool_calls
    assert [(c.id, c.function.name, c.function.arguments) for c in calls] == [
        ("call_1", "lookup", '{"q":"llmitm"}')
    ]


def test_function_call_with_deltas_is_not_repeated_by_done() -> None:
    """When arguments were streamed, ``output_item.done`` does not send them again (the SDK
    would concatenate them twice)."""
    frames = translate(Responses().function_call("call_1", "f", '{"a"', ":1}").completed())
    fragments = [
        c["function"]["arguments"] for d in deltas_of(frames) for c in d.get("tool_calls") or []
    ]
    assert "".join(fragments) == '{"a":1}'


def test_function_call_without_output_item_added() -> None:
    """A provider that never announced the call (no ``output_item.added``): the call is sent
    whole from ``output_item.done`` — id, name and arguments once each."""
    events = (
        Responses()
        .message("Let me look.")
        .function_call("call_9", "search", '{"q":', '"x"}', announce=False)
        .completed()
    )
    frames = translate(events)
    message = sdk_final(frames).choices[0].message
    assert message.content == "Let me look."
    calls = message.tool_calls
    assert [(c.index, c.id, c.function.name, c.function.arguments) for c in calls] == [
        (0, "call_9", "search", '{"q":"x"}')
    ]


@pytest.mark.parametrize(
    "deltas",
    [
        pytest.param(("*** Begin Patch\n", 'say "hi"\\n', "*** End Patch"), id="streamed"),
        pytest.param((), id="input-only-in-done"),
    ],
)
def test_custom_tool_call_becomes_function_call_with_input_json(deltas: tuple[str, ...]) -> None:
    """A ``custom_tool_call`` (Codex's apply_patch) reaches a chat client as a function call
    whose arguments are the JSON ``{"input": …}``, and they parse back to the exact input."""
    r = Responses()
    if deltas:
        events = r.custom_call("call_p", "apply_patch", *deltas).completed()
        expected = "".join(deltas)
    else:
        expected = 'raw "input"\nwith lines'
        item = {"id": "ctc_p", "type": "custom_tool_call", "call_id": "call_p",
                "name": "apply_patch", "status": "completed"}  # fmt: skip
        r.emit("response.output_item.added", output_index=0, item={**item, "input": ""})
        r.emit("response.output_item.done", output_index=0, item={**item, "input": expected})
        events = r.completed()
    final = sdk_final(translate(events))
    (call,) = final.choices[0].message.tool_calls
    assert (call.id, call.function.name) == ("call_p", "apply_patch")
    assert json.loads(call.function.arguments) == {"input": expected}
    assert final.choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize("mode", REASONING_MODES)
def test_reasoning_with_two_summary_parts_is_separated(mode: str) -> None:
    """Two summary parts are separated by a blank line in every mode that shows them."""
    events = Responses().reasoning("First part.", "Second part.").message("Done.").completed()
    frames = translate(events, context(mode))
    message = sdk_final(frames).choices[0].message
    both = "First part.\n\nSecond part."
    if mode == "think-tags":
        assert message.content == f"<think>\n{both}\n</think>\n\nDone."
    elif mode == "drop":
        assert message.content == "Done." and not message.model_extra
    else:
        assert message.model_extra == {mode: both}


def test_raw_chain_of_thought_reasoning_text() -> None:
    """``reasoning_text.delta`` (gpt-oss, LM Studio) is reasoning too."""
    events = Responses().reasoning("raw ", "thoughts", raw=True).message("ok").completed()
    frames = translate(events, context("reasoning_content"))
    message = sdk_final(frames).choices[0].message
    assert message.model_extra == {"reasoning_content": "raw thoughts"}
    assert message.content == "ok"


@pytest.mark.parametrize(
    ("mode", "content", "reasoning"),
    [
        (
            "think-tags",
            "<think>\nFirst idea.\n</think>\n\nHello.<think>\nSecond idea.\n</think>\n\n",
            None,
        ),
        ("reasoning_content", "Hello.", "First idea.\n\nSecond idea."),
        ("reasoning", "Hello.", "First idea.\n\nSecond idea."),
        ("drop", "Hello.", None),
    ],
)
def test_interleaved_reasoning_text_reasoning(
    mode: str, content: str, reasoning: str | None
) -> None:
    """Reasoning → text → reasoning (interleaved thinking): think-tags opens a second block
    after the text and closes it at the end; the field modes join both with a blank line."""
    events = (
        Responses()
        .reasoning("First idea.", item_id="rs_1")
        .message("Hello.")
        .reasoning("Second idea.", item_id="rs_2")
        .completed()
    )
    frames = translate(events, context(mode))
    message = sdk_final(frames).choices[0].message
    assert message.content == content
    assert (message.model_extra or {}).get(mode) == reasoning


def test_namespaced_call_name_and_missing_call_id() -> None:
    """A namespaced (MCP) call is named ``namespace__name``; a call without ``call_id`` falls
    back to its item id, so the client can still answer it."""
    r = Responses()
    item = {"id": "fc_ns", "type": "function_call", "name": "read", "namespace": "fs",
            "arguments": '{"p":"/"}', "status": "completed"}  # fmt: skip
    r.emit("response.output_item.added", output_index=0, item={**item, "arguments": ""})
    r.emit("response.output_item.done", output_index=0, item=item)
    calls = sdk_final(translate(r.completed())).choices[0].message.tool_calls
    assert [(c.id, c.function.name, c.function.arguments) for c in calls] == [
        ("fc_ns", "fs__read", '{"p":"/"}')
    ]


def test_client_model_overrides_upstream_model() -> None:
    """The chunks echo the model the client asked for (an Azure deployment name, say)."""
    frames = translate(Responses(model="gpt-5-2025").message("x").completed(), context(model="my"))
    assert {c["model"] for c in chunks_of(frames)} == {"my"}


def test_first_event_not_created_still_starts_with_the_role() -> None:
    """An upstream whose first event is a text delta: role chunk first, with a minted id and the
    injected clock."""
    events = [
        {"type": "response.output_text.delta", "item_id": "m", "delta": "hi"},
        {"type": "response.completed", "response": {"usage": None}},
    ]
    frames = translate(events)
    assert deltas_of(frames)[0] == {"role": "assistant", "content": "", "refusal": None}
    assert content_of(frames) == "hi"
    assert {c["created"] for c in chunks_of(frames)} == {NOW}
    assert sdk_final(frames).choices[0].finish_reason == "stop"


def test_nothing_after_the_terminal_event() -> None:
    """After the terminal event feed, close and fail all return nothing: one ``[DONE]``."""
    stream = ResponsesToChatStream(context())
    frames: list[Any] = []
    for event in Responses().message("x").completed():
        frames += stream.feed(event)
    assert stream.finished and stream.finish_reason == "stop" and stream.error is None
    assert stream.feed({"type": "response.output_text.delta", "delta": "late"}) == []
    assert stream.close() == []
    assert stream.fail(ApiError(message="late")) == []
    assert frames.count(DONE) == 1 and frames[-1] == DONE


def test_fail_after_some_output() -> None:
    """``fail(ApiError)`` mid-answer: the client gets that error (message, type, code) and
    ``[DONE]``; the translator records it."""
    stream = ResponsesToChatStream(context())
    frames: list[Any] = []
    for event in Responses().message("Half").events[:-2]:
        frames += stream.feed(event)
    error = ApiError(message="Upstream reset", type="server_error", code="upstream_reset")
    frames += stream.fail(error)
    assert frames[-2] == {
        "error": {
            "message": "Upstream reset",
            "type": "server_error",
            "param": None,
            "code": "upstream_reset",
        }
    }
    assert frames[-1] == DONE
    assert stream.error == error and stream.finished
    with pytest.raises(openai.APIError, match="Upstream reset"):
        sdk_chat_stream(encode(frames))


def test_translator_records_finish_and_usage() -> None:
    """``finish_reason`` and the chat-shaped ``usage`` are kept on the translator for the
    proxy's accounting, whether or not the client asked for the usage chunk."""
    stream = ResponsesToChatStream(context(include_usage=False))
    for event in Responses().function_call("c", "f", "{}").completed():
        stream.feed(event)
    assert stream.finish_reason == "tool_calls"
    assert stream.usage is not None and stream.usage["total_tokens"] == 200


# -- servers that skip deltas or stop early ------------------------------------------------


def _created() -> dict[str, Any]:
    return {
        "type": "response.created",
        "response": {"id": "resp_x", "created_at": 1, "model": "m", "status": "in_progress"},
    }


def _completed() -> dict[str, Any]:
    return {"type": "response.completed", "response": {"id": "resp_x", "status": "completed"}}


def test_text_and_reasoning_only_in_done_events_are_not_lost() -> None:
    """A server that sends no deltas, only finished items, still reaches the client."""
    reasoning = {
        "id": "rs_1",
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": "Think first."}],
    }
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "Answer.", "annotations": []}],
    }
    events = [
        _created(),
        {"type": "response.output_item.added", "item": dict(reasoning, summary=[])},
        {"type": "response.output_item.done", "item": reasoning},
        {"type": "response.output_item.added", "item": dict(message, content=[])},
        {"type": "response.output_item.done", "item": message},
        _completed(),
    ]
    frames = translate(events, context("reasoning_content"))
    final = sdk_final(frames)
    assert final.choices[0].message.content == "Answer."
    assert field_of(frames, "reasoning_content") == "Think first."


def test_streamed_text_is_not_repeated_from_the_done_event() -> None:
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "Hi", "annotations": []}],
    }
    events = [
        _created(),
        {"type": "response.output_item.added", "item": dict(message, content=[])},
        {"type": "response.output_text.delta", "item_id": "msg_1", "delta": "Hi"},
        {"type": "response.output_item.done", "item": message},
        _completed(),
    ]
    assert content_of(translate(events)) == "Hi"


def test_custom_tool_call_cut_by_incomplete_still_has_parseable_arguments() -> None:
    call = {"id": "ctc_1", "type": "custom_tool_call", "call_id": "call_1", "name": "apply_patch"}
    events = [
        _created(),
        {"type": "response.output_item.added", "item": dict(call, input="")},
        {"type": "response.custom_tool_call_input.delta", "item_id": "ctc_1", "delta": "*** Begin"},
        {
            "type": "response.incomplete",
            "response": {"id": "resp_x", "incomplete_details": {"reason": "max_output_tokens"}},
        },
    ]
    frames = translate(events)
    arguments = "".join(
        tc["function"].get("arguments") or ""
        for d in deltas_of(frames)
        for tc in d.get("tool_calls") or []
    )
    assert json.loads(arguments) == {"input": "*** Begin"}
    assert chunks_of(frames)[-1]["choices"][0]["finish_reason"] == "length"


def test_minted_chunk_id_has_openais_dash() -> None:
    frames = translate([{"type": "response.output_text.delta", "item_id": "m", "delta": "x"}])
    assert chunks_of(frames)[0]["id"].startswith("chatcmpl-")
