"""Oracles for translated request bodies: the openai SDK's request param types.

The SDK's TypedDicts are validated with pydantic (lazy ``Iterable`` fields drained so their
elements are checked too), and top-level keys are checked separately because a TypedDict
silently ignores keys it does not know — which would hide a misspelt field.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pydantic
from openai.types.chat import completion_create_params
from openai.types.responses import ResponseInputItemParam, ToolParam, response_create_params

CHAT_PARAMS = frozenset(completion_create_params.CompletionCreateParamsBase.__annotations__) | {
    "stream"
}
RESPONSES_PARAMS = frozenset(response_create_params.ResponseCreateParamsBase.__annotations__) | {
    "stream"
}
CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
CHAT_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")

_CHAT_STREAMING = pydantic.TypeAdapter(completion_create_params.CompletionCreateParamsStreaming)
_CHAT_PLAIN = pydantic.TypeAdapter(completion_create_params.CompletionCreateParamsNonStreaming)
_RESPONSES_STREAMING = pydantic.TypeAdapter(response_create_params.ResponseCreateParamsStreaming)
_RESPONSES_PLAIN = pydantic.TypeAdapter(response_create_params.ResponseCreateParamsNonStreaming)
_INPUT_ITEM = pydantic.TypeAdapter(ResponseInputItemParam)
_TOOL = pydantic.TypeAdapter(ToolParam)


def _drain(value: Any) -> Any:
    """Consume pydantic's lazy iterators so every nested element is validated."""
    if isinstance(value, Iterator):
        return [_drain(element) for element in value]
    if isinstance(value, dict):
        return {key: _drain(element) for key, element in value.items()}
    if isinstance(value, list):
        return [_drain(element) for element in value]
    return value


def assert_valid_chat_request(body: dict[str, Any]) -> None:
    """A Chat Completions request body the SDK's types accept, in a valid message order."""
    assert set(body) <= CHAT_PARAMS, f"unknown chat params: {set(body) - CHAT_PARAMS}"
    adapter = _CHAT_STREAMING if body.get("stream") else _CHAT_PLAIN
    _drain(adapter.validate_python(body))
    for tool in body.get("tools", []):
        assert tool["type"] == "function"
        assert CHAT_NAME.fullmatch(tool["function"]["name"])
    pending: set[str] = set()
    for message in body["messages"]:
        assert message["role"] in CHAT_ROLES
        if message["role"] == "tool":
            # Chat demands tool results right after the assistant message with their calls.
            assert message["tool_call_id"] in pending, message
            pending.discard(message["tool_call_id"])
            continue
        assert not pending, f"tool calls {pending} not answered before {message}"
        if message["role"] == "assistant":
            for call in message.get("tool_calls", []):
                assert call["type"] == "function"
                assert CHAT_NAME.fullmatch(call["function"]["name"])
                assert isinstance(call["function"]["arguments"], str)
                pending.add(call["id"])


def assert_valid_responses_request(body: dict[str, Any]) -> None:
    """A Responses request body the SDK's types accept, with no item ids (checklist 40)."""
    assert set(body) <= RESPONSES_PARAMS, f"unknown params: {set(body) - RESPONSES_PARAMS}"
    adapter = _RESPONSES_STREAMING if body.get("stream") else _RESPONSES_PLAIN
    # Assistant history is sent as {role: assistant, content: [output_text…]} without ids,
    # which the API accepts but the SDK types only describe with ids; checked by hand below.
    _drain(adapter.validate_python({**body, "input": []}))
    for tool in body.get("tools", []):
        _drain(_TOOL.validate_python(tool))
    items = body["input"]
    if isinstance(items, str):
        return
    for item in items:
        assert "id" not in item, item
        if item.get("role") == "assistant":
            assert item["type"] == "message"
            for part in item["content"]:
                assert part["type"] in ("output_text", "refusal")
                assert isinstance(part.get("text", part.get("refusal")), str)
        else:
            _drain(_INPUT_ITEM.validate_python(_without_audio(item)))


def _without_audio(item: dict[str, Any]) -> dict[str, Any]:
    """The item with input_audio parts checked and set aside.

    The spec keeps chat audio parts as Responses ``input_audio`` (limited upstream support);
    the SDK's message content union does not list them.
    """
    content = item.get("content")
    if not isinstance(content, list):
        return item
    for part in content:
        if part.get("type") == "input_audio":
            assert set(part["input_audio"]) <= {"data", "format"}
    kept = [part for part in content if part.get("type") != "input_audio"]
    return {**item, "content": kept}
