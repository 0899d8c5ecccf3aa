"""Builders for the OpenAI objects llmitm synthesizes: the Response object and its items.

Every field of the Response object is present (the SDK's types and Codex expect them), with
OpenAI's defaults, overridden by the request values the exchange echoes.
"""

from __future__ import annotations

from typing import Any

# Request fields that a Response object repeats back.
ECHOED_REQUEST_FIELDS: tuple[str, ...] = (
    "background",
    "instructions",
    "max_output_tokens",
    "max_tool_calls",
    "metadata",
    "parallel_tool_calls",
    "previous_response_id",
    "prompt_cache_key",
    "reasoning",
    "safety_identifier",
    "service_tier",
    "store",
    "temperature",
    "text",
    "tool_choice",
    "tools",
    "top_logprobs",
    "top_p",
    "truncation",
    "user",
)


def response_object(
    *,
    response_id: str,
    created_at: int,
    model: str,
    echo: dict[str, Any] | None = None,
    status: str = "in_progress",
) -> dict[str, Any]:
    """A complete Response object with empty ``output`` and ``usage: null``."""
    response: dict[str, Any] = {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "background": False,
        "completed_at": None,
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "max_output_tokens": None,
        "max_tool_calls": None,
        "model": model,
        "output": [],
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "prompt_cache_key": None,
        "reasoning": {"effort": None, "summary": None},
        "safety_identifier": None,
        "service_tier": "default",
        "store": True,
        "temperature": 1.0,
        "text": {"format": {"type": "text"}, "verbosity": "medium"},
        "tool_choice": "auto",
        "tools": [],
        "top_logprobs": 0,
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": None,
        "user": None,
        "metadata": {},
    }
    if echo:
        for key, value in echo.items():
            if value is not None or key in response:
                response[key] = value
    # Fields the SDK types require non-null even when a request sent null.
    for key, default in (("metadata", {}), ("tools", []), ("parallel_tool_calls", True)):
        if response.get(key) is None:
            response[key] = default
    return response


def output_text_part(text: str = "") -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def refusal_part(refusal: str = "") -> dict[str, Any]:
    return {"type": "refusal", "refusal": refusal}


def message_item(item_id: str, content: list[dict[str, Any]], status: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": content,
    }


def reasoning_item(
    item_id: str, summary_texts: list[str], status: str | None = None
) -> dict[str, Any]:
    item: dict[str, Any] = {
        "id": item_id,
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": text} for text in summary_texts],
    }
    if status is not None:
        item["status"] = status
    return item


def function_call_item(
    item_id: str,
    call_id: str,
    name: str,
    arguments: str,
    status: str,
    namespace: str | None = None,
) -> dict[str, Any]:
    item: dict[str, Any] = {
        "id": item_id,
        "type": "function_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }
    if namespace is not None:
        item["namespace"] = namespace
    return item


def custom_tool_call_item(
    item_id: str, call_id: str, name: str, tool_input: str, status: str
) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "custom_tool_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "input": tool_input,
    }
