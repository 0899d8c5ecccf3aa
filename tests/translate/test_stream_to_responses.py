"""Chat chunks → Responses events (direction 2: a Responses client over a chat upstream).

Every translated stream is checked by :func:`assert_conformant` (the invariants of OpenAI's own
streams), judged by the openai SDK's ``responses.stream()`` and, where it matters, by a
Codex-style consumer (``codex_parser``). Real captures are compared for meaning against their
source chunks, which are parsed here independently of the translator.
"""

from __future__ import annotations

import gc
import json
import re
from pathlib import Path
from typing import Any

import openai
import pytest

from llmitm.translate.context import ToolOrigin, TranslateOptions, TranslationContext
from llmitm.translate.pipeline import StreamPipeline
from llmitm.translate.stream_to_chat import ResponsesToChatStream
from llmitm.translate.stream_to_responses import ChatToResponsesStream
from llmitm.wire.errors import ApiError
from llmitm.wire.ids import CountingIds, fixed_clock
from tests.helpers.codex_parser import (
    CodexStreamError,
    Completed,
    Created,
    OutputItemDone,
    OutputTextDelta,
    ReasoningSummaryDelta,
    ReasoningSummaryPartAdded,
    SkippedItem,
    TokenUsage,
    history,
    iter_sse,
    parse_codex_stream,
    sse_json_events,
)
from tests.helpers.oracle import accumulate_responses, sdk_responses_stream

REAL = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "real"
NOW = 1_700_000_000
TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})

Event = dict[str, Any]


# =============================================================================================
# The conformance checker: what every Responses event stream OpenAI sends keeps
# =============================================================================================


class _ItemState:
    def __init__(self, item: dict[str, Any]) -> None:
        self.item = item
        self.done = False
        self.parts: list[dict[str, Any]] = []  # closed content parts
        self.open_part: tuple[int, str, list[str]] | None = None  # index, type, deltas
        self.part_text_done: str | None = None
        self.summaries: list[str] = []  # closed summary parts
        self.open_summary: tuple[int, list[str]] | None = None
        self.summary_text_done: str | None = None
        self.arguments: list[str] = []
        self.arguments_done: str | None = None
        self.custom_input: list[str] = []
        self.custom_done: str | None = None


def assert_conformant(events: list[Event]) -> None:
    """Assert the invariants a Responses event stream must keep.

    1 created first (in_progress, empty output), sequence numbers 0,1,2… without gaps;
    2 exactly one terminal event, last (an ``error`` event may only sit right before a
      ``response.failed``); 4 ``output_index`` = number of items added before; 5 every
    delta/done ``item_id`` is its item's id; 6 ``content_part.added`` before a part's deltas;
    7 text done == deltas == part done == item text; 8 arguments done == deltas == item
    arguments, done carries ``name``; 9 no event for an item after its ``output_item.done``;
    10 terminal ``output`` == the done items in order (identical ids and call ids); 11 text
    deltas carry a ``logprobs`` list; 12 summary deltas sit inside
    ``reasoning_summary_part.added/done`` of the same ``summary_index``. Also: usage only on
    the terminal, ``completed_at`` only when completed, the status fields agree.
    """
    assert events, "no events at all"
    # -- 1
    first = events[0]
    assert first["type"] == "response.created", first["type"]
    created = first["response"]
    assert created["status"] == "in_progress"
    assert created["output"] == []
    assert created["usage"] is None
    assert created["completed_at"] is None
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    if len(events) > 2 and events[1]["type"] != "error" and events[1]["type"] not in TERMINAL:
        # OpenAI sends in_progress second; a stream that fails at once may skip it.
        assert events[1]["type"] == "response.in_progress"
    # -- 2
    terminal = events[-1]
    assert [e["type"] for e in events if e["type"] in TERMINAL] == [terminal["type"]]
    assert terminal["type"] in TERMINAL
    error_positions = [i for i, e in enumerate(events) if e["type"] == "error"]
    assert error_positions in ([], [len(events) - 2]), error_positions
    if error_positions:
        assert terminal["type"] == "response.failed"
    final = terminal["response"]
    assert final["id"] == created["id"]
    assert final["created_at"] == created["created_at"]
    status = final["status"]
    assert status == terminal["type"].removeprefix("response."), status
    if status == "completed":
        assert isinstance(final["completed_at"], int)
        assert final["error"] is None
        assert final["incomplete_details"] is None
    else:
        assert final["completed_at"] is None
    if status == "incomplete":
        assert final["incomplete_details"]["reason"] in ("max_output_tokens", "content_filter")
        assert final["error"] is None
    if status == "failed":
        assert isinstance(final["error"]["code"], str)
        assert isinstance(final["error"]["message"], str)
    for event in events[:-1]:
        if "response" in event:
            assert event["response"]["usage"] is None, "usage only on the terminal event"
            assert event["response"]["status"] == "in_progress"
    # -- items
    states: list[_ItemState] = []
    done_items: list[dict[str, Any]] = []
    for event in events[2:-1]:
        kind = event["type"]
        if kind == "error":
            continue
        assert kind not in ("response.created", "response.in_progress"), "lifecycle repeated"
        index = event["output_index"]
        if kind == "response.output_item.added":
            assert index == len(states), "4: output_index must count the items added before"
            assert all(state.done for state in states), "9: items must not interleave"
            item = event["item"]
            assert isinstance(item.get("id"), str) and item["id"]
            if item["type"] in ("message", "function_call", "custom_tool_call"):
                assert item["status"] == "in_progress"
            if item["type"] == "message":
                assert item["content"] == []
            if item["type"] == "function_call":
                assert item["arguments"] == ""
                assert item["call_id"] and item["name"]
            if item["type"] == "reasoning":
                assert item["summary"] == []
            states.append(_ItemState(item))
            continue
        assert 0 <= index < len(states), f"{kind} for an item never added"
        state = states[index]
        assert not state.done, f"9: {kind} after output_item.done of item {index}"
        if kind == "response.output_item.done":
            _check_item_done(state, event["item"])
            state.done = True
            done_items.append(event["item"])
            continue
        assert event["item_id"] == state.item["id"], f"5: {kind} item_id"
        _check_item_event(state, event)
    # -- 10
    assert all(state.done for state in states), "every added item must be done"
    # OpenAI re-encrypts encrypted_content for the terminal snapshot (a real capture shows
    # it); everything else, ids and call ids above all, must be identical.
    assert _without_encrypted(final["output"]) == _without_encrypted(done_items), (
        "10: terminal output == output_item.done items"
    )
    if status == "completed":
        assert all(item.get("status", "completed") == "completed" for item in done_items)


_PART_TYPES = {"message": ("output_text", "refusal"), "reasoning": ("reasoning_text",)}
_DELTA_PART = {
    "response.output_text.delta": "output_text",
    "response.refusal.delta": "refusal",
    "response.reasoning_text.delta": "reasoning_text",
}
_DONE_PART = {
    "response.output_text.done": "output_text",
    "response.refusal.done": "refusal",
    "response.reasoning_text.done": "reasoning_text",
}


def _without_encrypted(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in item.items() if k != "encrypted_content"} for item in items]


def _check_item_event(state: _ItemState, event: Event) -> None:
    kind = event["type"]
    item_type = state.item["type"]
    if kind == "response.content_part.added":
        assert state.open_part is None, "a content part is already open"
        assert event["content_index"] == len(state.parts)
        part = event["part"]
        assert part["type"] in _PART_TYPES[item_type], (item_type, part["type"])
        assert part.get("text", part.get("refusal")) == ""
        state.open_part = (event["content_index"], part["type"], [])
        state.part_text_done = None
    elif kind in _DELTA_PART:
        expected = _DELTA_PART[kind]
        assert state.open_part is not None, "6: content_part.added must precede deltas"
        assert state.open_part[:2] == (event["content_index"], expected), "6"
        assert state.part_text_done is None, "delta after the part's text was done"
        assert isinstance(event["delta"], str)
        if kind == "response.output_text.delta":
            assert isinstance(event["logprobs"], list), "11: logprobs must be a list"
        state.open_part[2].append(event["delta"])
    elif kind in _DONE_PART:
        assert state.open_part is not None
        assert state.open_part[:2] == (event["content_index"], _DONE_PART[kind])
        text = event["refusal"] if kind == "response.refusal.done" else event["text"]
        assert text == "".join(state.open_part[2]), "7: done text == concat(deltas)"
        if kind == "response.output_text.done":
            assert isinstance(event["logprobs"], list)
        state.part_text_done = text
    elif kind == "response.content_part.done":
        assert state.open_part is not None and state.open_part[0] == event["content_index"]
        part = event["part"]
        assert part["type"] == state.open_part[1]
        text = part.get("text", part.get("refusal"))
        assert text == state.part_text_done == "".join(state.open_part[2]), "7: part text"
        state.parts.append(part)
        state.open_part = None
    elif kind == "response.function_call_arguments.delta":
        assert item_type == "function_call"
        assert "content_index" not in event
        assert state.arguments_done is None
        state.arguments.append(event["delta"])
    elif kind == "response.function_call_arguments.done":
        assert item_type == "function_call"
        assert event["arguments"] == "".join(state.arguments), "8: done == concat(deltas)"
        assert event["name"] == state.item["name"], "8: arguments.done carries the name"
        state.arguments_done = event["arguments"]
    elif kind == "response.custom_tool_call_input.delta":
        assert item_type == "custom_tool_call"
        state.custom_input.append(event["delta"])
    elif kind == "response.custom_tool_call_input.done":
        assert item_type == "custom_tool_call"
        assert event["input"] == "".join(state.custom_input)
        state.custom_done = event["input"]
    elif kind == "response.reasoning_summary_part.added":
        assert item_type == "reasoning"
        assert state.open_summary is None
        assert event["summary_index"] == len(state.summaries)
        assert event["part"] == {"type": "summary_text", "text": ""}
        state.open_summary = (event["summary_index"], [])
        state.summary_text_done = None
    elif kind == "response.reasoning_summary_text.delta":
        assert state.open_summary is not None, "12: summary delta outside its part"
        assert state.open_summary[0] == event["summary_index"], "12: summary_index"
        assert state.summary_text_done is None
        state.open_summary[1].append(event["delta"])
    elif kind == "response.reasoning_summary_text.done":
        assert state.open_summary is not None
        assert state.open_summary[0] == event["summary_index"]
        assert event["text"] == "".join(state.open_summary[1])
        state.summary_text_done = event["text"]
    elif kind == "response.reasoning_summary_part.done":
        assert state.open_summary is not None, "12: part.done without part.added"
        assert state.open_summary[0] == event["summary_index"], "12: summary_index"
        text = "".join(state.open_summary[1])
        assert state.summary_text_done == text
        assert event["part"] == {"type": "summary_text", "text": text}
        state.summaries.append(text)
        state.open_summary = None
    else:
        raise AssertionError(f"unexpected event type {kind!r}")


def _check_item_done(state: _ItemState, item: dict[str, Any]) -> None:
    added = state.item
    assert item["id"] == added["id"] and item["type"] == added["type"]
    assert item.get("status", "completed") in ("completed", "incomplete")
    if item["type"] == "message":
        assert state.open_part is None, "a content part left open"
        assert item["role"] == "assistant"
        assert item["content"] == state.parts, "7: item content == closed parts"
        assert item["content"], "a message item with no content"
    elif item["type"] == "function_call":
        assert state.arguments_done is not None, "function_call_arguments.done missing"
        assert item["arguments"] == state.arguments_done, "8: item arguments"
        assert (item["call_id"], item["name"]) == (added["call_id"], added["name"])
        assert item.get("namespace") == added.get("namespace")
    elif item["type"] == "custom_tool_call":
        assert state.custom_done is not None, "custom_tool_call_input.done missing"
        assert item["input"] == state.custom_done
        assert (item["call_id"], item["name"]) == (added["call_id"], added["name"])
    elif item["type"] == "reasoning":
        assert state.open_summary is None, "a summary part left open"
        assert state.open_part is None, "a reasoning_text part left open"
        assert [part["text"] for part in item["summary"]] == state.summaries
        assert (item.get("content") or []) == state.parts, "reasoning_text parts"
    else:
        raise AssertionError(f"unexpected item type {item['type']!r}")


# =============================================================================================
# Helpers
# =============================================================================================


def make_context(
    *,
    model: str | None = "gpt-test",
    open_missing: bool = False,
    tools: dict[str, ToolOrigin] | None = None,
) -> TranslationContext:
    return TranslationContext(
        TranslateOptions(
            think_open_missing=open_missing, ids=CountingIds(), clock=fixed_clock(NOW)
        ),
        model=model,
        tools=tools or {},
    )


def chunk(
    delta: dict[str, Any] | None = None,
    finish: str | None = None,
    *,
    usage: dict[str, Any] | None = None,
    logprobs: Any = None,
) -> dict[str, Any]:
    return {
        "id": "chatcmpl-up",
        "object": "chat.completion.chunk",
        "created": NOW,
        "model": "upstream-model",
        "choices": [
            {"index": 0, "delta": delta or {}, "logprobs": logprobs, "finish_reason": finish}
        ],
    } | ({"usage": usage} if usage is not None else {})


def text(content: str) -> dict[str, Any]:
    return chunk({"content": content})


def reasoning(content: str, key: str = "reasoning_content") -> dict[str, Any]:
    return chunk({key: content})


def call_start(index: int, call_id: str | None, name: str, arguments: str = "") -> dict[str, Any]:
    tool_call: dict[str, Any] = {
        "index": index,
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }
    if call_id is not None:
        tool_call["id"] = call_id
    return chunk({"tool_calls": [tool_call]})


def call_args(index: int, fragment: str) -> dict[str, Any]:
    return chunk({"tool_calls": [{"index": index, "function": {"arguments": fragment}}]})


def usage_chunk(
    prompt: int, completion: int, total: int | None = None, cached: int = 0, reasoning: int = 0
) -> dict[str, Any]:
    return {
        "id": "chatcmpl-up",
        "object": "chat.completion.chunk",
        "created": NOW,
        "model": "upstream-model",
        "choices": [],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion if total is None else total,
            "prompt_tokens_details": {"cached_tokens": cached},
            "completion_tokens_details": {"reasoning_tokens": reasoning},
        },
    }


def translate(
    chunks: list[dict[str, Any]],
    context: TranslationContext | None = None,
    end: str = "done",
) -> list[Event]:
    """Run ``chunks`` through a fresh translator; ``end`` is ``"done"`` ([DONE] then the body
    ends), ``"close"`` (the body ends with no [DONE]). The output is checked for conformance."""
    stream = ChatToResponsesStream(context or make_context())
    events = stream.start()
    for item in chunks:
        events += stream.feed(item)
    if end == "done":
        events += stream.done()
    events += stream.close()
    assert stream.finished
    assert_conformant(events)
    return events


def sse_body(chunks: list[dict[str, Any]], done: bool = True) -> bytes:
    body = b"".join(b"data: " + json.dumps(item).encode() + b"\n\n" for item in chunks)
    return body + (b"data: [DONE]\n\n" if done else b"")


def run_pipeline(body: bytes, context: TranslationContext | None = None) -> bytes:
    pipeline = StreamPipeline("chat-to-responses", context or make_context())
    out = pipeline.start() + pipeline.feed(body) + pipeline.close()
    assert pipeline.finished
    return out


def responses_sse(events: list[Event]) -> bytes:
    return b"".join(
        f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode() for event in events
    )


def of_type(events: list[Event], kind: str) -> list[Event]:
    return [event for event in events if event["type"] == kind]


def output_of(events: list[Event]) -> list[dict[str, Any]]:
    return events[-1]["response"]["output"]


def output_text(output: list[dict[str, Any]]) -> str:
    return "".join(
        part["text"]
        for item in output
        if item["type"] == "message"
        for part in item["content"]
        if part["type"] == "output_text"
    )


def output_refusal(output: list[dict[str, Any]]) -> str:
    return "".join(
        part["refusal"]
        for item in output
        if item["type"] == "message"
        for part in item["content"]
        if part["type"] == "refusal"
    )


def output_reasoning(output: list[dict[str, Any]]) -> str:
    return "".join(
        part["text"] for item in output if item["type"] == "reasoning" for part in item["summary"]
    )


def output_calls(output: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    return [
        (item["call_id"], item["name"], item["arguments"])
        for item in output
        if item["type"] == "function_call"
    ]


def usage_fields(usage: dict[str, Any] | None) -> tuple[int, ...] | None:
    """(input, output, total, cached, reasoning) of a Responses usage object."""
    if usage is None:
        return None
    return (
        usage["input_tokens"],
        usage["output_tokens"],
        usage["total_tokens"],
        usage["input_tokens_details"]["cached_tokens"],
        usage["output_tokens_details"]["reasoning_tokens"],
    )


# =============================================================================================
# Real captures
# =============================================================================================


def _chat_fixtures() -> list[Any]:
    if not REAL.is_dir():
        return [pytest.param(None, marks=pytest.mark.skip(reason=f"{REAL} not present"))]
    params = []
    for path in sorted(REAL.glob("*.sse")):
        meta = json.loads(path.with_name(path.stem + ".meta.json").read_text())
        if meta.get("api") == "chat":
            params.append(pytest.param(path, id=path.stem))
    return params


class SourceMeaning:
    """What a chat stream says, read from its chunks directly (not by the translator)."""

    def __init__(self, body: bytes) -> None:
        content, self.reasoning, self.refusal = [], [], []
        self.calls: dict[int, dict[str, Any]] = {}
        self.finish: str | None = None
        self.usage: dict[str, Any] | None = None
        self.error: dict[str, Any] | None = None
        for _, data in iter_sse(body):
            if data == "[DONE]":
                continue
            obj = json.loads(data)
            if obj.get("error"):
                self.error = self.error or obj["error"]
            if obj.get("usage"):
                self.usage = obj["usage"]
            for choice in obj.get("choices") or []:
                delta = choice.get("delta") or {}
                if isinstance(delta.get("content"), str):
                    content.append(delta["content"])
                details = delta.get("reasoning_details") or []
                self.reasoning.append(
                    delta.get("reasoning_content")
                    or delta.get("reasoning")
                    or "".join(d.get("text") or "" for d in details)
                )
                if isinstance(delta.get("refusal"), str):
                    self.refusal.append(delta["refusal"])
                for tool_call in delta.get("tool_calls") or []:
                    call = self.calls.setdefault(
                        tool_call["index"], {"id": None, "name": None, "arguments": ""}
                    )
                    call["id"] = call["id"] or tool_call.get("id")
                    function = tool_call.get("function") or {}
                    call["name"] = call["name"] or function.get("name")
                    call["arguments"] += function.get("arguments") or ""
                if choice.get("finish_reason"):
                    self.finish = choice["finish_reason"]
        joined = "".join(content)
        think = re.match(r"\s*<think>(.*?)</think>\s*", joined, re.DOTALL)
        if think:
            self.reasoning.append(think.group(1).strip())
            joined = joined[think.end() :]
        self.text = joined
        self.reasoning_text = "".join(self.reasoning)
        self.refusal_text = "".join(self.refusal)

    @property
    def expected_status(self) -> str:
        if self.error:
            return "failed"
        if self.finish in ("length", "content_filter"):
            return "incomplete"
        return "completed"

    @property
    def expected_usage(self) -> tuple[int, ...] | None:
        usage = self.usage
        if usage is None:
            return None
        return (
            usage["prompt_tokens"],
            usage["completion_tokens"],
            usage["total_tokens"],
            (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0),
            (usage.get("completion_tokens_details") or {}).get("reasoning_tokens", 0),
        )


@pytest.mark.parametrize("path", _chat_fixtures())
def test_real_chat_stream_translates_with_its_meaning(path: Path) -> None:
    """Every captured chat stream: conformant output the SDK accepts, with the same text,
    reasoning, refusal, tool calls (ids, names, arguments), usage and finish status."""
    body = path.read_bytes()
    source = SourceMeaning(body)
    out = run_pipeline(body)
    events = sse_json_events(out)  # also checks each event: line repeats the JSON type
    assert_conformant(events)
    final = events[-1]["response"]
    output = final["output"]

    assert final["status"] == source.expected_status
    assert output_text(output) == source.text
    assert output_reasoning(output) == source.reasoning_text
    if source.expected_status != "incomplete" or source.refusal_text:
        assert output_refusal(output) == source.refusal_text
    expected_calls = [
        (call["id"], call["name"], call["arguments"]) for _, call in sorted(source.calls.items())
    ]
    assert output_calls(output) == expected_calls
    assert usage_fields(final["usage"]) == source.expected_usage

    if source.expected_status == "completed":
        sdk_events, response = sdk_responses_stream(out)
        assert response is not None
        assert [item.id for item in response.output] == [item["id"] for item in output]
        assert response.output_text == source.text
        assert response.status == "completed"
        codex = parse_codex_stream(out, require_usage=source.usage is not None)
        seen = [e.item for e in codex if isinstance(e, OutputItemDone | SkippedItem)]
        assert seen == output
        # Codex's ContentItem has no refusal variant: only a refusal message is skipped.
        skipped = [e for e in codex if isinstance(e, SkippedItem)]
        assert all("refusal" in e.problem for e in skipped) and bool(skipped) == bool(
            source.refusal_text
        )
    elif source.expected_status == "incomplete":
        sdk_events, _ = sdk_responses_stream(out, final=False)
        assert sdk_events[-1].type == "response.incomplete"
        reason = "max_output_tokens" if source.finish == "length" else "content_filter"
        assert sdk_events[-1].response.incomplete_details.reason == reason
        with pytest.raises(RuntimeError, match=r"response\.completed"):
            sdk_responses_stream(out)
    else:
        with pytest.raises(openai.APIError, match=source.error["message"]):
            sdk_responses_stream(out, final=False)


def _load(name: str) -> bytes:
    path = REAL / name
    if not path.exists():
        pytest.skip(f"{path} not present")
    return path.read_bytes()


def test_real_openrouter_error_chunk_becomes_error_event_and_failed() -> None:
    """OpenRouter's HTTP-200 stream with ``{"error": {"code": 400, ...}}`` in its last chunk:
    an ``error`` event (nested and flat fields), then ``response.failed``; the SDK raises
    APIError; the reasoning seen so far is kept as an incomplete item; the usage that rode in
    the error chunk is kept."""
    out = run_pipeline(_load("pydantic-ai-openrouter-stream-error.sse"))
    events = sse_json_events(out)
    assert_conformant(events)
    error, failed = events[-2], events[-1]
    assert error["type"] == "error"
    assert error["error"]["message"] == error["message"] == "Token limit reached"
    assert error["error"]["code"] == error["code"]
    assert "param" in error and "param" in error["error"] and "type" in error["error"]
    assert failed["type"] == "response.failed"
    assert failed["response"]["error"] == {"code": error["code"], "message": "Token limit reached"}
    [item] = failed["response"]["output"]
    assert item["type"] == "reasoning" and item["status"] == "incomplete"
    assert item["summary"][0]["text"] == "We need to respond to a greeting. The user"
    assert usage_fields(failed["response"]["usage"]) == (43, 10, 53, 0, 11)
    with pytest.raises(openai.APIError, match="Token limit reached"):
        sdk_responses_stream(out, final=False)
    with pytest.raises(CodexStreamError) as raised:
        parse_codex_stream(out)
    assert raised.value.kind == "retryable"


def test_real_azure_content_filter_stream() -> None:
    """Azure's first chunk has empty choices, id and model plus prompt_filter_results; every
    chunk carries content_filter_results. The text comes through untouched."""
    body = _load("vercel-ai-azure-chat-content-filter-stream.sse")
    events = sse_json_events(run_pipeline(body))
    assert_conformant(events)
    final = events[-1]["response"]
    assert final["status"] == "completed"
    assert output_text(final["output"]) == SourceMeaning(body).text
    assert [item["type"] for item in final["output"]] == ["message"]


def test_real_deepseek_reasoning_then_tool_call() -> None:
    """DeepSeek: reasoning_content deltas, then one tool call; cached and reasoning tokens."""
    body = _load("vercel-ai-deepseek-reasoning-tool-call-stream.sse")
    events = sse_json_events(run_pipeline(body))
    output = output_of(events)
    assert [item["type"] for item in output] == ["reasoning", "function_call"]
    assert output_reasoning(output).startswith("The user")
    [(call_id, name, arguments)] = output_calls(output)
    assert json.loads(arguments) and name and call_id
    assert usage_fields(events[-1]["response"]["usage"]) == (339, 83, 422, 320, 39)


def test_real_logprobs_reach_text_deltas() -> None:
    """Chat token logprobs ride on the Responses text deltas (same fields)."""
    body = _load("openai-python-chat-logprobs-stream.sse")
    events = sse_json_events(run_pipeline(body))
    deltas = of_type(events, "response.output_text.delta")
    source_logprobs = [
        entry
        for _, data in iter_sse(body)
        if data != "[DONE]"
        for choice in json.loads(data)["choices"]
        if choice.get("logprobs")
        for entry in choice["logprobs"]["content"]
    ]
    assert source_logprobs
    assert [entry for delta in deltas for entry in delta["logprobs"]] == source_logprobs


def test_real_refusal_stream() -> None:
    """OpenAI's structured-output refusal: a message with one refusal part."""
    body = _load("openai-python-chat-refusal-stream.sse")
    out = run_pipeline(body)
    events = sse_json_events(out)
    [message] = output_of(events)
    assert [part["type"] for part in message["content"]] == ["refusal"]
    assert message["content"][0]["refusal"] == SourceMeaning(body).refusal_text
    assert of_type(events, "response.refusal.done")
    _, response = sdk_responses_stream(out)
    assert response.output[0].content[0].type == "refusal"


# =============================================================================================
# The conformance checklist, direction 2
# =============================================================================================

RICH = [
    chunk({"role": "assistant", "content": ""}),
    reasoning("Think"),
    reasoning("ing."),
    text("Calling"),
    text(" tools."),
    call_start(0, "call_a", "get_weather"),
    call_args(0, '{"city":'),
    call_args(0, ' "Paris"}'),
    call_start(1, "call_b", "get_time"),
    call_args(1, '{"tz": "CET"}'),
    chunk(finish="tool_calls"),
    usage_chunk(20, 30, cached=4, reasoning=7),
]


def test_checklist_01_created_first_and_sequence_numbers() -> None:
    """1. First event is response.created (in_progress, output []); seq 0, +1 per event.
    It is available from start(), before the upstream sends anything."""
    stream = ChatToResponsesStream(make_context())
    opening = stream.start()
    assert [e["type"] for e in opening] == ["response.created", "response.in_progress"]
    assert opening[0]["response"]["output"] == [] and opening[0]["sequence_number"] == 0
    assert stream.start() == []  # only once
    events = translate(RICH)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    # Also when the first thing the translator sees is a chunk (no start() call).
    stream = ChatToResponsesStream(make_context())
    events = stream.feed(text("hi")) + stream.done()
    assert events[0]["type"] == "response.created"
    assert_conformant(events)


def test_checklist_02_exactly_one_terminal_and_nothing_after() -> None:
    """2. Exactly one terminal event, last; the body ends right after it: later chunks,
    [DONE], close() and fail() add nothing, and the pipeline reports it is finished."""
    stream = ChatToResponsesStream(make_context())
    events = stream.start() + stream.feed(text("a")) + stream.feed(chunk(finish="stop"))
    events += stream.done()
    assert events[-1]["type"] == "response.completed"
    assert stream.feed(text("late")) == []
    assert stream.done() == [] and stream.close() == []
    assert stream.fail(ApiError("boom")) == []
    assert_conformant(events)

    pipeline = StreamPipeline("chat-to-responses", make_context())
    body = sse_body([text("a"), chunk(finish="stop")])
    out = pipeline.start() + pipeline.feed(body)
    assert pipeline.finished
    assert pipeline.feed(sse_body([text("more")])) == b""
    assert pipeline.close() == b""
    assert [e["type"] for e in sse_json_events(out) if e["type"] in TERMINAL] == [
        "response.completed"
    ]


def test_checklist_03_sdk_replays_without_error_and_final_response_works() -> None:
    """3. openai-python's ResponseStreamState accepts the stream; get_final_response() returns
    the same output as the terminal event."""
    events = translate(RICH)
    _, final = accumulate_responses(events)
    assert final is not None
    out = responses_sse(events)
    _, response = sdk_responses_stream(out)
    assert response.status == "completed"
    assert response.output_text == "Calling tools."
    assert [item.id for item in response.output] == [item["id"] for item in output_of(events)]
    calls = [item for item in response.output if item.type == "function_call"]
    assert [(c.call_id, c.name, c.arguments) for c in calls] == output_calls(output_of(events))


def test_checklist_04_output_index_counts_added_items() -> None:
    """4. output_item.added.output_index == number of items added before it."""
    events = translate(RICH)
    added = of_type(events, "response.output_item.added")
    assert [e["output_index"] for e in added] == list(range(4))
    assert [e["item"]["type"] for e in added] == [
        "reasoning",
        "message",
        "function_call",
        "function_call",
    ]


def test_checklist_05_item_ids_match_their_added_item() -> None:
    """5. Every delta/done item_id equals the id from its output_item.added."""
    events = translate(RICH)
    ids = {
        e["output_index"]: e["item"]["id"] for e in of_type(events, "response.output_item.added")
    }
    assert len(set(ids.values())) == 4
    with_item_id = [e for e in events if "item_id" in e]
    assert len(with_item_id) > 10
    for event in with_item_id:
        assert event["item_id"] == ids[event["output_index"]], event


def test_checklist_06_content_part_added_precedes_text_deltas() -> None:
    """6. content_part.added precedes the first text/refusal delta of its content_index."""
    events = translate([text("a"), chunk({"refusal": "no"}), text("b"), chunk(finish="stop")])
    kinds = [(e["type"], e.get("content_index")) for e in events if "content_index" in e]
    assert kinds == [
        ("response.content_part.added", 0),
        ("response.output_text.delta", 0),
        ("response.output_text.done", 0),
        ("response.content_part.done", 0),
        ("response.content_part.added", 1),
        ("response.refusal.delta", 1),
        ("response.refusal.done", 1),
        ("response.content_part.done", 1),
        ("response.content_part.added", 2),
        ("response.output_text.delta", 2),
        ("response.output_text.done", 2),
        ("response.content_part.done", 2),
    ]


def test_checklist_07_text_agrees_everywhere() -> None:
    """7. output_text.done.text == concat(deltas) == content_part.done text == item text."""
    pieces = ["Hel", "lo, ", "wörld ", "😀", "!"]
    events = translate([text(p) for p in pieces] + [chunk(finish="stop")])
    whole = "".join(pieces)
    assert "".join(e["delta"] for e in of_type(events, "response.output_text.delta")) == whole
    assert of_type(events, "response.output_text.done")[0]["text"] == whole
    assert of_type(events, "response.content_part.done")[0]["part"]["text"] == whole
    [item] = [e["item"] for e in of_type(events, "response.output_item.done")]
    assert item["content"][0]["text"] == whole == output_text(output_of(events))


def test_checklist_08_arguments_agree_and_done_has_name() -> None:
    """8. function_call_arguments.done.arguments == concat(deltas) == item arguments, and the
    done event carries the name."""
    fragments = ['{"q"', ': "a', " b", '"}']
    events = translate(
        [call_start(0, "call_1", "search")]
        + [call_args(0, f) for f in fragments]
        + [chunk(finish="tool_calls")]
    )
    deltas = of_type(events, "response.function_call_arguments.delta")
    assert [e["delta"] for e in deltas] == fragments  # fragments as received
    [done] = of_type(events, "response.function_call_arguments.done")
    assert done["arguments"] == '{"q": "a b"}' and done["name"] == "search"
    assert output_calls(output_of(events)) == [("call_1", "search", '{"q": "a b"}')]


def test_checklist_09_items_never_interleave() -> None:
    """9. No event for item k after its output_item.done, even when the upstream flips between
    reasoning, text and tool calls."""
    events = translate(
        [
            text("a"),
            reasoning("r1"),
            text("b"),
            call_start(0, "c0", "f"),
            call_args(0, "{}"),
            text("c"),
            reasoning("r2"),
            chunk(finish="stop"),
        ]
    )
    done_at: dict[int, int] = {}
    for position, event in enumerate(events):
        if event["type"] == "response.output_item.done":
            done_at[event["output_index"]] = position
    for position, event in enumerate(events):
        index = event.get("output_index")
        if index is not None and event["type"] != "response.output_item.done":
            assert position < done_at[index]
    assert [i["type"] for i in output_of(events)] == [
        "message",
        "reasoning",
        "message",
        "function_call",
        "message",
        "reasoning",
    ]


def test_checklist_10_terminal_output_repeats_done_items() -> None:
    """10. Terminal response.output == output_item.done items in order, identical ids and
    call_ids."""
    events = translate(RICH)
    done_items = [e["item"] for e in of_type(events, "response.output_item.done")]
    assert output_of(events) == done_items
    assert [i.get("call_id") for i in output_of(events)] == [None, None, "call_a", "call_b"]


def test_checklist_11_text_deltas_have_logprobs_lists() -> None:
    """11. output_text.delta always has logprobs (a list), with or without chat logprobs."""
    logprobs = {"content": [{"token": "a", "logprob": -0.5, "bytes": [97], "top_logprobs": []}]}
    events = translate(
        [text("x"), chunk({"content": "a"}, logprobs=logprobs), text("y"), chunk(finish="stop")]
    )
    deltas = of_type(events, "response.output_text.delta")
    assert [d["logprobs"] for d in deltas] == [[], logprobs["content"], []]


def test_checklist_12_summary_deltas_are_bracketed() -> None:
    """12. Summary deltas sit between reasoning_summary_part.added and .done with the same
    summary_index."""
    events = translate([reasoning("a"), reasoning("b"), text("t"), chunk(finish="stop")])
    kinds = [
        (e["type"].removeprefix("response.reasoning_summary_"), e["summary_index"])
        for e in events
        if "summary_index" in e
    ]
    assert kinds == [
        ("part.added", 0),
        ("text.delta", 0),
        ("text.delta", 0),
        ("text.done", 0),
        ("part.done", 0),
    ]


@pytest.mark.parametrize(
    "delta",
    [
        {"reasoning_content": "Hmm."},
        {"reasoning": "Hmm."},
        {"reasoning": {"text": "Hmm."}},
        {"reasoning": "Hmm.", "reasoning_details": [{"type": "reasoning.text", "text": "Hmm."}]},
        {"reasoning_details": [{"type": "reasoning.text", "text": "Hmm."}]},
        {"reasoning_details": [{"type": "reasoning.summary", "summary": "Hmm."}]},
    ],
    ids=["reasoning_content", "reasoning", "reasoning-dict", "openrouter-both", "details", "sum"],
)
def test_checklist_13_reasoning_fields_make_a_reasoning_item_closed_before_the_message(
    delta: dict[str, Any],
) -> None:
    """13. reasoning_content / reasoning (/ reasoning_details) produce a reasoning item whose
    output_item.done comes before the message's output_item.added; OpenRouter's duplicate
    spelling is not doubled."""
    events = translate([chunk(delta), text("Answer"), chunk(finish="stop")])
    items = [(e["type"], e["item"]["type"]) for e in events if "item" in e]
    assert items == [
        ("response.output_item.added", "reasoning"),
        ("response.output_item.done", "reasoning"),
        ("response.output_item.added", "message"),
        ("response.output_item.done", "message"),
    ]
    assert output_reasoning(output_of(events)) == "Hmm."
    assert output_text(output_of(events)) == "Answer"


THINK_CONTENT = "<think>Let me see.</think>\n\nIt is 4."


def test_checklist_14_think_tags_split_anywhere_never_leak() -> None:
    """14. <think> tags split across chunks at every position never leak into output_text;
    the reasoning becomes a reasoning item before the message."""
    for first in range(1, len(THINK_CONTENT)):
        for second in range(first, len(THINK_CONTENT)):
            pieces = [THINK_CONTENT[:first], THINK_CONTENT[first:second], THINK_CONTENT[second:]]
            events = translate([text(p) for p in pieces if p] + [chunk(finish="stop")])
            output = output_of(events)
            assert output_text(output) == "It is 4.", (first, second)
            assert output_reasoning(output) == "Let me see.", (first, second)
            assert [item["type"] for item in output] == ["reasoning", "message"]
            for delta in of_type(events, "response.output_text.delta"):
                assert "<" not in delta["delta"] and "think" not in delta["delta"]


def test_checklist_14_missing_open_tag_with_think_open_missing() -> None:
    """14. With think_open_missing, content that starts inside the reasoning (R1 distills)
    splits at </think>, wherever the chunks break."""
    body = "Let me see.</think>\n\nIt is 4."
    for cut in range(1, len(body)):
        events = translate(
            [text(body[:cut]), text(body[cut:]), chunk(finish="stop")],
            make_context(open_missing=True),
        )
        assert output_text(output_of(events)) == "It is 4.", cut
        assert output_reasoning(output_of(events)) == "Let me see.", cut
    # Without the option the same content is plain text.
    events = translate([text(body), chunk(finish="stop")])
    assert output_text(output_of(events)) == body


def test_checklist_14_unterminated_think_block_is_reasoning() -> None:
    """A think block cut by max tokens stays reasoning (incomplete), never text."""
    events = translate([text("<think>Still think"), text("ing </th"), chunk(finish="length")])
    output = output_of(events)
    assert output_reasoning(output) == "Still thinking </th"
    assert output_text(output) == ""
    assert output[0]["status"] == "incomplete"


def test_checklist_15_text_reasoning_tool_gives_three_items_in_order() -> None:
    """15. Upstream order text → reasoning → tool gives three items with increasing
    output_index."""
    events = translate(
        [
            text("Let me check."),
            reasoning("Need the weather."),
            call_start(0, "call_w", "weather", '{"city": "Oslo"}'),
            chunk(finish="tool_calls"),
        ]
    )
    added = of_type(events, "response.output_item.added")
    assert [(e["output_index"], e["item"]["type"]) for e in added] == [
        (0, "message"),
        (1, "reasoning"),
        (2, "function_call"),
    ]
    assert output_calls(output_of(events)) == [("call_w", "weather", '{"city": "Oslo"}')]


def test_checklist_16_parallel_tool_calls() -> None:
    """16. Parallel chat tool calls (index 0, 1) → two function_call items with distinct
    call_ids and their own arguments; also when both start in one chunk."""
    events = translate(
        [
            call_start(0, "call_x", "f"),
            call_args(0, '{"n": 1}'),
            call_start(1, "call_y", "g"),
            call_args(1, '{"n": 2}'),
            chunk(finish="tool_calls"),
        ]
    )
    assert output_calls(output_of(events)) == [
        ("call_x", "f", '{"n": 1}'),
        ("call_y", "g", '{"n": 2}'),
    ]

    both = chunk(
        {
            "tool_calls": [
                {
                    "index": 0,
                    "id": "c0",
                    "type": "function",
                    "function": {"name": "f", "arguments": "{}"},
                },
                {
                    "index": 1,
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "g", "arguments": "[]"},
                },
            ]
        }
    )
    events = translate([both, chunk(finish="tool_calls")])
    assert output_calls(output_of(events)) == [("c0", "f", "{}"), ("c1", "g", "[]")]


def test_checklist_17_tool_deltas_by_index_and_synthesized_id_is_stable() -> None:
    """17. Deltas without id are attributed by index; a call whose id never comes gets one
    synthesized id, the same in added, done and terminal output."""
    events = translate(
        [
            call_start(0, None, "f"),
            call_args(0, '{"a"'),
            call_args(0, ": 1}"),
            call_start(1, None, "g", "{}"),
            chunk(finish="tool_calls"),
        ]
    )
    calls = output_calls(output_of(events))
    assert [(name, args) for _, name, args in calls] == [("f", '{"a": 1}'), ("g", "{}")]
    first_id, second_id = calls[0][0], calls[1][0]
    assert first_id.startswith("call_") and second_id.startswith("call_")
    assert first_id != second_id
    added = [e["item"]["call_id"] for e in of_type(events, "response.output_item.added")]
    done = [e["item"]["call_id"] for e in of_type(events, "response.output_item.done")]
    assert added == done == [first_id, second_id]


def test_checklist_17_repeated_id_in_every_delta_is_one_call() -> None:
    """17. Keyed by index, never by id: a backend repeating the id (and name) in every delta
    still yields one call with the arguments concatenated once (openai/codex#7517)."""
    repeated = [
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_r",
                        "type": "function",
                        "function": {"name": "f", "arguments": fragment},
                    }
                ]
            }
        )
        for fragment in ["", '{"x"', ": 2", "}"]
    ]
    events = translate([*repeated, chunk(finish="tool_calls")])
    assert output_calls(output_of(events)) == [("call_r", "f", '{"x": 2}')]


def test_checklist_18_text_before_tool_calls_survives() -> None:
    """18. Text preceding tool calls survives as a message item in the final output."""
    events = translate(
        [text("I'll look it up."), call_start(0, "c", "lookup", "{}"), chunk(finish="tool_calls")]
    )
    output = output_of(events)
    assert [item["type"] for item in output] == ["message", "function_call"]
    assert output_text(output) == "I'll look it up."
    assert output[0]["status"] == "completed"


def test_checklist_19_length_is_incomplete_max_output_tokens() -> None:
    """19. finish_reason length → response.incomplete, reason max_output_tokens; the open
    item is marked incomplete."""
    events = translate([text("Once upon a"), chunk(finish="length"), usage_chunk(5, 3)])
    final = events[-1]["response"]
    assert events[-1]["type"] == "response.incomplete"
    assert final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert final["output"][0]["status"] == "incomplete"
    assert output_text(final["output"]) == "Once upon a"
    assert usage_fields(final["usage"]) == (5, 3, 8, 0, 0)


def test_checklist_19_length_inside_tool_arguments() -> None:
    """19. A call cut by length stays an (incomplete) function_call with the partial args."""
    events = translate([call_start(0, "c", "f", '{"a": "tru'), chunk(finish="length")])
    [item] = output_of(events)
    assert item["status"] == "incomplete" and item["arguments"] == '{"a": "tru'


def test_checklist_19_content_filter_is_incomplete_content_filter() -> None:
    """19. content_filter → response.incomplete, reason content_filter; the text before the
    filter stays; with no output at all a refusal explains the empty answer."""
    events = translate([text("Partial"), chunk(finish="content_filter")])
    final = events[-1]["response"]
    assert final["incomplete_details"] == {"reason": "content_filter"}
    assert output_text(final["output"]) == "Partial" and output_refusal(final["output"]) == ""

    events = translate([chunk({"role": "assistant", "content": ""}, "content_filter")])
    final = events[-1]["response"]
    assert final["status"] == "incomplete"
    assert final["incomplete_details"] == {"reason": "content_filter"}
    [message] = final["output"]
    assert message["content"][0]["type"] == "refusal" and message["content"][0]["refusal"]


def test_checklist_20_cut_without_finish_or_done_fails_with_server_error() -> None:
    """20. Upstream cut without finish_reason or [DONE] → response.failed, error.code
    server_error; what streamed so far is closed as incomplete items."""
    events = translate([text("Half an ans")], end="close")
    failed = events[-1]
    assert failed["type"] == "response.failed"
    assert failed["response"]["error"]["code"] == "server_error"
    assert output_of(events)[0]["status"] == "incomplete"
    assert output_text(output_of(events)) == "Half an ans"
    with pytest.raises(CodexStreamError):
        parse_codex_stream(responses_sse(events))
    # Either signal alone is an orderly end.
    assert translate([text("a"), chunk(finish="stop")], end="close")[-1]["type"] == (
        "response.completed"
    )
    assert translate([text("a")], end="done")[-1]["type"] == "response.completed"


def test_checklist_20_every_cut_of_a_real_stream_ends_well_formed() -> None:
    """20. A real stream cut at any byte still ends with exactly one terminal event; cuts
    before the finish_reason chunk end in response.failed / server_error."""
    body = _load("simonw-llm-chat-tool-call-stream.sse")
    finish_at = body.index(b'"finish_reason":"tool_calls"')
    finish_frame = body.rindex(b"data: ", 0, finish_at)
    for cut in range(0, len(body) + 1, 7):
        events = sse_json_events(run_pipeline(body[:cut]))
        assert_conformant(events)
        if cut <= finish_frame:
            assert events[-1]["response"]["error"]["code"] == "server_error", cut
    assert sse_json_events(run_pipeline(body))[-1]["type"] == "response.completed"


def test_checklist_22_mid_stream_error_is_nested_and_flat() -> None:
    """22. A mid-stream error (an error chunk, or the proxy's fail()) becomes an ``error``
    event carrying nested error{type,code,message,param} and flat code/message/param, then
    response.failed with the same code."""
    error_chunk = {"error": {"message": "Rate limit", "type": "rate_limit_error", "code": 429}}
    events = translate([text("a"), error_chunk])
    error = events[-2]
    assert error["type"] == "error"
    assert set(error["error"]) == {"type", "code", "message", "param"}
    assert error["error"]["message"] == error["message"] == "Rate limit"
    assert error["error"]["code"] == error["code"] == "rate_limit_exceeded"
    assert error["error"]["param"] is error["param"] is None
    assert events[-1]["response"]["error"]["code"] == "rate_limit_exceeded"

    stream = ChatToResponsesStream(make_context())
    events = stream.start() + stream.feed(text("a"))
    events += stream.fail(ApiError("Upstream went away", code="server_error", status=502))
    assert_conformant(events)
    assert events[-2]["code"] == events[-2]["error"]["code"] == "server_error"
    assert stream.error is not None and stream.error.message == "Upstream went away"
    with pytest.raises(openai.APIError, match="Upstream went away"):
        sdk_responses_stream(responses_sse(events), final=False)


def test_checklist_24_usage_maps_exactly_chat_to_responses() -> None:
    """24. prompt/completion/total, cached_tokens and reasoning_tokens map exactly."""
    events = translate([text("a"), chunk(finish="stop"), usage_chunk(1000, 250, 1300, 600, 200)])
    usage = events[-1]["response"]["usage"]
    assert usage_fields(usage) == (1000, 250, 1300, 600, 200)
    codex = parse_codex_stream(responses_sse(events))
    assert codex[-1] == Completed(
        events[-1]["response"]["id"],
        TokenUsage(
            input_tokens=1000,
            cached_input_tokens=600,
            output_tokens=250,
            reasoning_output_tokens=200,
            total_tokens=1300,
        ),
    )


def test_checklist_24_usage_maps_exactly_responses_to_chat() -> None:
    """24. The other way: a Responses terminal usage becomes the chat usage chunk, exactly."""
    stream = ResponsesToChatStream(
        TranslationContext(
            TranslateOptions(ids=CountingIds(), clock=fixed_clock(NOW)), include_usage=True
        )
    )
    completed = {
        "type": "response.completed",
        "sequence_number": 2,
        "response": {
            "id": "resp_1",
            "created_at": NOW,
            "model": "m",
            "status": "completed",
            "output": [],
            "usage": {
                "input_tokens": 1000,
                "input_tokens_details": {"cached_tokens": 600},
                "output_tokens": 250,
                "output_tokens_details": {"reasoning_tokens": 200},
                "total_tokens": 1300,
            },
        },
    }
    frames = stream.feed(completed)
    [usage_frame] = [f for f in frames if isinstance(f, dict) and f.get("choices") == []]
    usage = usage_frame["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]) == (
        1000,
        250,
        1300,
    )
    assert usage["prompt_tokens_details"]["cached_tokens"] == 600
    assert usage["completion_tokens_details"]["reasoning_tokens"] == 200


@pytest.mark.parametrize(
    "usage",
    [None, {"prompt_tokens": 5}, {"prompt_tokens": 5, "completion_tokens": None}],
    ids=["absent", "no-completion", "null-completion"],
)
def test_checklist_24_unknown_usage_is_null(usage: dict[str, Any] | None) -> None:
    """24. No usage, or usage without all totals, → usage null (never a partial object) —
    which Codex accepts."""
    chunks = [text("a"), chunk(finish="stop")]
    if usage is not None:
        chunks.append(chunk(usage=usage) | {"choices": []})
    events = translate(chunks)
    assert events[-1]["response"]["usage"] is None
    codex = parse_codex_stream(responses_sse(events), require_usage=False)
    assert codex[-1] == Completed(events[-1]["response"]["id"], None)


def test_checklist_24_unknown_usage_is_null_responses_to_chat() -> None:
    """24. The other way: a Responses terminal without usage gives a usage chunk with null."""
    stream = ResponsesToChatStream(
        TranslationContext(
            TranslateOptions(ids=CountingIds(), clock=fixed_clock(NOW)), include_usage=True
        )
    )
    frames = stream.feed(
        {"type": "response.completed", "response": {"id": "r", "status": "completed"}}
    )
    [usage_frame] = [f for f in frames if isinstance(f, dict) and f.get("choices") == []]
    assert usage_frame["usage"] is None


def test_checklist_25_waits_for_the_trailing_usage_chunk() -> None:
    """25. After finish_reason nothing terminal is sent until [DONE] or the end of the body:
    the usage chunk that follows (with choices []) still makes it into the terminal."""
    stream = ChatToResponsesStream(make_context())
    events = stream.start() + stream.feed(text("Hi"))
    after_finish = stream.feed(chunk(finish="stop"))
    assert not [e for e in after_finish if e["type"] in TERMINAL]
    after_usage = stream.feed(usage_chunk(9, 2, cached=1, reasoning=0))
    assert after_usage == []
    assert not stream.finished
    events += after_finish + after_usage + stream.done()
    assert_conformant(events)
    assert usage_fields(events[-1]["response"]["usage"]) == (9, 2, 11, 1, 0)
    # Without [DONE], the body's end finishes it the same way.
    events = translate([text("Hi"), chunk(finish="stop"), usage_chunk(9, 2)], end="close")
    assert events[-1]["type"] == "response.completed"
    assert usage_fields(events[-1]["response"]["usage"]) == (9, 2, 11, 0, 0)


def test_checklist_42_codex_parser_sees_every_item_and_completed() -> None:
    """42. A Codex-style parser fed the proxy output yields OutputItemDone per item plus
    Completed with the response id and usage; its UI deltas are there too."""
    out = run_pipeline(sse_body(RICH))
    events = sse_json_events(out)
    codex = parse_codex_stream(out)
    assert isinstance(codex[0], Created)
    assert [e for e in codex if isinstance(e, SkippedItem)] == []
    done = [e for e in codex if isinstance(e, OutputItemDone)]
    assert [e.item for e in done] == output_of(events) == history(codex)
    types = ["reasoning", "message", "function_call", "function_call"]
    assert [e.item["type"] for e in done] == types
    assert codex[-1] == Completed(
        events[-1]["response"]["id"],
        TokenUsage(
            input_tokens=20,
            cached_input_tokens=4,
            output_tokens=30,
            reasoning_output_tokens=7,
            total_tokens=50,
        ),
    )
    assert ReasoningSummaryPartAdded(0) in codex
    assert [e.delta for e in codex if isinstance(e, ReasoningSummaryDelta)] == ["Think", "ing."]
    assert "".join(e.delta for e in codex if isinstance(e, OutputTextDelta)) == "Calling tools."
    # Codex runs tools from the done items: call ids pair with what the client sends back.
    calls = [e.item for e in done if e.item["type"] == "function_call"]
    assert [(c["call_id"], c["name"]) for c in calls] == [
        ("call_a", "get_weather"),
        ("call_b", "get_time"),
    ]


def test_checklist_42_codex_errors_on_incomplete_and_maps_failed_codes() -> None:
    """42. Codex errors when the stream ends without response.completed (incomplete) and
    maps response.failed codes (context length is fatal, not retried)."""
    events = translate([text("a"), chunk(finish="length")])
    with pytest.raises(CodexStreamError, match=r"stream closed before response\.completed") as e:
        parse_codex_stream(responses_sse(events))
    assert len([x for x in e.value.events if isinstance(x, OutputItemDone)]) == 1

    stream = ChatToResponsesStream(make_context())
    events = stream.start() + stream.fail(
        ApiError("too long", type="invalid_request_error", code="context_length_exceeded")
    )
    assert_conformant(events)
    with pytest.raises(CodexStreamError) as raised:
        parse_codex_stream(responses_sse(events))
    assert raised.value.kind == "context_window_exceeded"


# =============================================================================================
# Synthetic cases the captures lack
# =============================================================================================


def test_custom_tool_becomes_custom_tool_call_with_input() -> None:
    """A chat function standing for a Responses ``custom`` tool (Codex apply_patch): its
    ``{"input": ...}`` arguments become a custom_tool_call item with that raw input, streamed
    as custom_tool_call_input events, never as function-call arguments."""
    patch = '*** Begin Patch\n*** Add File: a.txt\n+hi "there"\n*** End Patch\n'
    arguments = json.dumps({"input": patch})
    context = make_context(tools={"apply_patch": ToolOrigin("custom", "apply_patch")})
    events = translate(
        [call_start(0, "call_p", "apply_patch")]
        + [call_args(0, arguments[i : i + 9]) for i in range(0, len(arguments), 9)]
        + [chunk(finish="tool_calls")],
        context,
    )
    [item] = output_of(events)
    assert item["type"] == "custom_tool_call"
    assert (item["call_id"], item["name"], item["input"]) == ("call_p", "apply_patch", patch)
    assert not of_type(events, "response.function_call_arguments.delta")
    assert of_type(events, "response.custom_tool_call_input.done")[0]["input"] == patch
    _, response = sdk_responses_stream(responses_sse(events))
    assert response.output[0].type == "custom_tool_call" and response.output[0].input == patch
    assert history(parse_codex_stream(responses_sse(events), require_usage=False)) == [item]


def test_custom_tool_with_a_bare_string_argument_keeps_the_text() -> None:
    """A model that ignores the one-parameter schema and sends raw text still gets it through."""
    context = make_context(tools={"apply_patch": ToolOrigin("custom", "apply_patch")})
    events = translate(
        [call_start(0, "c", "apply_patch", "*** Begin Patch"), chunk(finish="tool_calls")], context
    )
    assert output_of(events)[0]["input"] == "*** Begin Patch"


def test_namespace_tool_restores_name_and_namespace() -> None:
    """A flattened ``namespace__tool`` chat function comes back as a function_call with the
    tool's own name and its ``namespace``."""
    context = make_context(
        tools={"mcp_fs__read_file": ToolOrigin("function", "read_file", namespace="mcp_fs")}
    )
    events = translate(
        [call_start(0, "c", "mcp_fs__read_file", '{"path": "a"}'), chunk(finish="tool_calls")],
        context,
    )
    [item] = output_of(events)
    assert (item["type"], item["name"], item["namespace"]) == (
        "function_call",
        "read_file",
        "mcp_fs",
    )
    assert of_type(events, "response.function_call_arguments.done")[0]["name"] == "read_file"
    _, response = sdk_responses_stream(responses_sse(events))
    assert response.output[0].name == "read_file"
    assert history(parse_codex_stream(responses_sse(events), require_usage=False)) == [item]


def test_azure_async_filter_frames_are_ignored() -> None:
    """Azure's prompt-filter first chunk (empty choices, id, model) and async-filter frames
    (``object: ""``, no delta, content_filter_offsets) change nothing."""
    prompt_filter = {
        "choices": [],
        "created": 0,
        "id": "",
        "model": "",
        "object": "",
        "prompt_filter_results": [{"prompt_index": 0, "content_filter_results": {}}],
    }
    async_filter = {
        "choices": [
            {
                "index": 0,
                "finish_reason": None,
                "content_filter_results": {"hate": {"filtered": False, "severity": "safe"}},
                "content_filter_offsets": {"check_offset": 0, "start_offset": 0, "end_offset": 5},
            }
        ],
        "created": 0,
        "id": "",
        "model": "",
        "object": "",
    }
    with_filters = translate(
        [
            prompt_filter,
            text("Hello"),
            async_filter,
            text(" there"),
            async_filter,
            chunk(finish="stop"),
            async_filter,
        ]
    )
    without = translate([text("Hello"), text(" there"), chunk(finish="stop")])
    assert with_filters == without


def test_tool_call_name_before_id() -> None:
    """A call whose name arrives in one delta and its id in the next keeps the upstream id
    (the item waits for it instead of minting one)."""
    events = translate(
        [
            chunk({"tool_calls": [{"index": 0, "function": {"name": "f"}}]}),
            chunk({"tool_calls": [{"index": 0, "id": "call_late", "function": {"arguments": ""}}]}),
            call_args(0, '{"k": "v"}'),
            chunk(finish="tool_calls"),
        ]
    )
    assert output_calls(output_of(events)) == [("call_late", "f", '{"k": "v"}')]


def test_text_held_by_the_think_splitter_stays_before_the_next_item() -> None:
    """Regression: ``<`` (a possible ``<think>`` start) held back when a tool call or a
    reasoning field arrived came out at the end, in a message after that item; upstream order
    is text first."""
    events = translate([text("<"), call_start(0, "c", "f", "{}"), chunk(finish="tool_calls")])
    assert [(i["type"], output_text([i])) for i in output_of(events)] == [
        ("message", "<"),
        ("function_call", ""),
    ]
    events = translate([text("<th"), reasoning("r"), text("x"), chunk(finish="stop")])
    assert [(i["type"], output_text([i])) for i in output_of(events)] == [
        ("message", "<th"),
        ("reasoning", ""),
        ("message", "x"),
    ]


def test_tool_call_without_index_uses_ids_to_tell_calls_apart() -> None:
    """Backends that omit the tool index: a new id starts a new call; deltas without one
    continue the latest."""

    def delta(**tool_call: Any) -> dict[str, Any]:
        return chunk({"tool_calls": [tool_call]})

    events = translate(
        [
            delta(id="c1", function={"name": "f", "arguments": "{"}),
            delta(function={"arguments": "}"}),
            delta(id="c2", function={"name": "g", "arguments": "[]"}),
            chunk(finish="tool_calls"),
        ]
    )
    assert output_calls(output_of(events)) == [("c1", "f", "{}"), ("c2", "g", "[]")]


def test_fragment_for_a_call_already_closed_is_reported() -> None:
    """Items never interleave, so once call 1 has started, call 0 is done: a late fragment for
    call 0 (interleaved parallel calls) cannot be streamed any more. It is recorded as an
    anomaly for the log, and the stream stays well-formed."""
    stream = ChatToResponsesStream(make_context())
    events = stream.start()
    for item in [
        call_start(0, "c0", "f", '{"a":'),
        call_start(1, "c1", "g", "{}"),
        call_args(0, " 1}"),
        chunk(finish="tool_calls"),
    ]:
        events += stream.feed(item)
    events += stream.done()
    assert_conformant(events)
    assert stream.anomalies == ["tool call index 0 continued after it was closed"]
    assert output_calls(output_of(events)) == [("c0", "f", '{"a":'), ("c1", "g", "{}")]


def test_tool_call_that_never_gets_a_name_is_dropped_and_reported() -> None:
    stream = ChatToResponsesStream(make_context())
    events = stream.start() + stream.feed(text("a"))
    events += stream.feed(chunk({"tool_calls": [{"index": 0, "id": "c0"}]}))
    events += stream.feed(chunk(finish="tool_calls")) + stream.done()
    assert_conformant(events)
    assert [item["type"] for item in output_of(events)] == ["message"]
    assert stream.anomalies == ["dropped a tool call that never got a name"]


def test_response_id_from_the_context_is_used_everywhere() -> None:
    """Store emulation assigns the id: created, terminal and ``response_id`` agree."""
    context = make_context()
    context.response_id = "resp_stored"
    stream = ChatToResponsesStream(context)
    assert stream.response_id is None
    events = stream.start() + stream.feed(text("a")) + stream.done()
    assert stream.response_id == "resp_stored"
    assert events[0]["response"]["id"] == events[-1]["response"]["id"] == "resp_stored"


def test_legacy_function_call_finish_is_completed() -> None:
    events = translate([call_start(0, "c", "f", "{}"), chunk(finish="function_call")])
    assert events[-1]["type"] == "response.completed"


def test_refusal_deltas_make_a_refusal_part() -> None:
    """Chat ``delta.refusal`` → a message with a refusal part, refusal.delta/.done events;
    the SDK accepts it."""
    events = translate(
        [
            chunk({"role": "assistant", "refusal": ""}),
            chunk({"refusal": "I can't"}),
            chunk({"refusal": " help."}),
            chunk(finish="stop"),
        ]
    )
    [message] = output_of(events)
    assert message["content"] == [{"type": "refusal", "refusal": "I can't help."}]
    assert [e["delta"] for e in of_type(events, "response.refusal.delta")] == ["I can't", " help."]
    _, response = sdk_responses_stream(responses_sse(events))
    assert response.output[0].content[0].refusal == "I can't help."


def test_empty_leading_content_is_skipped() -> None:
    """The role chunk's ``content: ""`` opens no message: a pure tool-call answer has only the
    function_call item, and reasoning after it is item 0."""
    events = translate(
        [
            chunk({"role": "assistant", "content": "", "refusal": None}),
            call_start(0, "c", "f", "{}"),
            chunk({"content": ""}, "tool_calls"),
        ]
    )
    assert [item["type"] for item in output_of(events)] == ["function_call"]
    events = translate(
        [
            chunk({"role": "assistant", "content": ""}),
            reasoning("r"),
            text("t"),
            chunk(finish="stop"),
        ]
    )
    assert [item["type"] for item in output_of(events)] == ["reasoning", "message"]


def test_whitespace_only_content_before_a_tool_call_opens_no_message() -> None:
    """Whitespace held back (a ``<think>`` might follow) and never followed by text does not
    become an empty-looking message item."""
    events = translate([text("\n\n"), call_start(0, "c", "f", "{}"), chunk(finish="tool_calls")])
    types = [item["type"] for item in output_of(events)]
    assert types in (["function_call"], ["message", "function_call"])
    assert output_text(output_of(events)).strip() == ""


def test_model_comes_from_the_context_or_the_first_chunk() -> None:
    """The client's model name is echoed; without one, the upstream's."""
    events = translate([text("a"), chunk(finish="stop")], make_context(model="client-model"))
    assert events[0]["response"]["model"] == events[-1]["response"]["model"] == "client-model"
    stream = ChatToResponsesStream(make_context(model=None))
    events = stream.feed(text("a")) + stream.done()
    assert events[0]["response"]["model"] == "upstream-model"


def test_malformed_upstream_event_fails_the_stream() -> None:
    """Unparseable upstream data ends the client's stream with response.failed (server_error),
    never silently."""
    body = sse_body([text("ok")], done=False) + b"data: {not json\n\n"
    events = sse_json_events(run_pipeline(body))
    assert_conformant(events)
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["error"]["code"] == "server_error"


def test_done_without_a_final_blank_line_completes() -> None:
    """``data: [DONE]`` as the very last bytes (no blank line after it) is still [DONE]."""
    body = sse_body([text("ok")], done=False) + b"data: [DONE]"
    events = sse_json_events(run_pipeline(body))
    assert events[-1]["type"] == "response.completed"
    body = sse_body([text("ok"), chunk(finish="stop")], done=False) + b"data: [DONE]"
    assert sse_json_events(run_pipeline(body))[-1]["type"] == "response.completed"


def test_usage_in_the_error_chunk_is_kept() -> None:
    """A failing chunk that also reports usage (OpenRouter) keeps it on response.failed."""
    error_chunk = {"error": {"message": "boom", "code": 502}} | usage_chunk(7, 3)
    events = translate([text("a"), error_chunk])
    assert events[-1]["type"] == "response.failed"
    assert usage_fields(events[-1]["response"]["usage"]) == (7, 3, 10, 0, 0)


# =============================================================================================
# The checker itself must be able to fail
# =============================================================================================


def _index(events: list[Event], kind: str, nth: int = 0) -> int:
    return [i for i, e in enumerate(events) if e["type"] == kind][nth]


def _renumber(events: list[Event]) -> list[Event]:
    for number, event in enumerate(events):
        event["sequence_number"] = number
    return events


def _drop(kind: str, nth: int = 0):
    def mutate(events: list[Event]) -> list[Event]:
        del events[_index(events, kind, nth)]
        return _renumber(events)

    return mutate


def _set(kind: str, key: str, value: Any, nth: int = 0):
    def mutate(events: list[Event]) -> list[Event]:
        events[_index(events, kind, nth)][key] = value
        return events

    return mutate


def _swap_first(kind_a: str, kind_b: str):
    def mutate(events: list[Event]) -> list[Event]:
        a, b = _index(events, kind_a), _index(events, kind_b)
        events[a], events[b] = events[b], events[a]
        return _renumber(events)

    return mutate


def _duplicate_terminal(events: list[Event]) -> list[Event]:
    return _renumber([*events, json.loads(json.dumps(events[-1]))])


def _event_after_done(events: list[Event]) -> list[Event]:
    late = json.loads(json.dumps(events[_index(events, "response.output_text.delta")]))
    events.insert(_index(events, "response.output_item.done", 1) + 1, late)
    return _renumber(events)


def _terminal_output_changed(events: list[Event]) -> list[Event]:
    events[-1]["response"]["output"][2]["call_id"] = "call_other"
    return events


def _usage_early(events: list[Event]) -> list[Event]:
    events[1]["response"] = dict(events[1]["response"], usage=events[-1]["response"]["usage"])
    return events


MUTATIONS = {
    "1-created-missing": _drop("response.created"),
    "1-sequence-gap": _set("response.output_text.delta", "sequence_number", 99),
    "2-two-terminals": _duplicate_terminal,
    "2-terminal-missing": _drop("response.completed"),
    "4-output-index": _set("response.output_item.added", "output_index", 5, nth=1),
    "5-item-id": _set("response.output_text.delta", "item_id", "msg_other"),
    "6-part-added-missing": _drop("response.content_part.added"),
    "7-text-done-differs": _set("response.output_text.done", "text", "Calling tools!"),
    "8-arguments-done-differs": _set("response.function_call_arguments.done", "arguments", "{}"),
    "8-arguments-done-no-name": _set("response.function_call_arguments.done", "name", None),
    "9-event-after-done": _event_after_done,
    "10-terminal-output": _terminal_output_changed,
    "11-logprobs-missing": _set("response.output_text.delta", "logprobs", None),
    "12-summary-part-missing": _drop("response.reasoning_summary_part.added"),
    "12-summary-order": _swap_first(
        "response.reasoning_summary_part.added", "response.reasoning_summary_text.delta"
    ),
    "usage-before-terminal": _usage_early,
}


@pytest.mark.parametrize("mutation", list(MUTATIONS), ids=list(MUTATIONS))
def test_assert_conformant_rejects_broken_streams(mutation: str) -> None:
    """Each checklist invariant the checker claims is really checked: breaking a good stream
    in that one way makes it fail."""
    events = json.loads(json.dumps(translate(RICH)))
    with pytest.raises(AssertionError):
        assert_conformant(MUTATIONS[mutation](events))


def test_content_given_as_text_parts_is_text() -> None:
    parts = chunk({"content": [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}]})
    events = translate([text("Say: "), parts, chunk(finish="stop")])
    assert output_text(output_of(events)) == "Say: Hello"


@pytest.mark.parametrize("content", [12, {"text": "x"}, [1, 2]])
def test_content_that_is_not_text_fails_the_stream_the_same_way_however_it_is_chunked(
    content: Any,
) -> None:
    body = sse_body([text("Hi"), chunk({"content": content}), text("never"), chunk(finish="stop")])
    whole = run_pipeline(body)
    pipeline = StreamPipeline("chat-to-responses", make_context())
    split = pipeline.start() + b"".join(
        pipeline.feed(body[i : i + 7]) for i in range(0, len(body), 7)
    )
    split += pipeline.close()
    assert whole == split
    assert b"response.failed" in whole and b"not text" in whole and b"never" not in whole


# =============================================================================================
# A long answer: its text is held in few objects until its part closes
# =============================================================================================


def test_a_long_answer_is_whole_at_its_end_and_held_in_few_objects() -> None:
    words = [f"w{i}— " if i % 7 else f"“{i}” " for i in range(1000)]
    arguments = ['{"q": "', *(f"x{i}" for i in range(300)), '"}']
    stream = ChatToResponsesStream(make_context())
    events = stream.start()
    for word in words:
        events += stream.feed(reasoning(word))
    for word in words:
        events += stream.feed(text(word))
    message = stream._message
    assert message is not None
    # A str per delta was ~50 bytes of header for a few characters: now one per 16 deltas.
    held = gc.get_referents(message.parts._joined) + gc.get_referents(message.parts._run)
    assert len(held) <= len(words) // 16 + 16
    events += stream.feed(call_start(0, "call_q", "search"))
    for fragment in arguments:
        events += stream.feed(call_args(0, fragment))
    events += stream.feed(chunk(finish="tool_calls")) + stream.done() + stream.close()
    assert_conformant(events)

    output = output_of(events)
    assert output_reasoning(output) == "".join(words)
    assert output_text(output) == "".join(words)
    assert output_calls(output) == [("call_q", "search", "".join(arguments))]
    _, response = sdk_responses_stream(responses_sse(events))
    assert response is not None and response.output_text == "".join(words)
