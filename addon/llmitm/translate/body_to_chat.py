"""A non-streamed Responses ``response`` body → a ``chat.completion`` body (direction 1).

This module owns the mapping of whole bodies: all output items fold into one
choice (text concatenated, every call in ``tool_calls`` in output order, reasoning rendered
the way the chat client was configured for) and the terminal status becomes
``finish_reason``.

A ``failed`` or ``cancelled`` response is not a completion at all: callers check
:func:`response_failure` first and answer with an HTTP error.
:func:`response_to_chat_completion` still returns a well-formed body if called anyway.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from llmitm.translate.context import TranslationContext
from llmitm.wire.errors import ApiError, normalise_error
from llmitm.wire.usage import responses_usage_to_chat

THINK_OPEN = "<think>\n"
THINK_CLOSE = "\n</think>\n\n"
NAMESPACE_SEPARATOR = "__"
"""Namespaced Responses tools reach chat upstreams as ``namespace__name`` (request mapping)."""

# HTTP status for the ``error.code`` values a failed Response can carry (response_error.py);
# anything else is the server's fault.
_STATUS_BY_FAILURE_CODE: dict[str, int] = {
    "rate_limit_exceeded": 429,
    "insufficient_quota": 429,
    "invalid_prompt": 400,
    "content_filter": 400,
    "context_length_exceeded": 400,
    "invalid_image": 400,
    "invalid_image_format": 400,
    "invalid_base64_image": 400,
    "invalid_image_url": 400,
    "image_too_large": 400,
    "image_too_small": 400,
    "image_parse_error": 400,
    "image_content_policy_violation": 400,
    "invalid_image_mode": 400,
    "image_file_too_large": 400,
    "unsupported_image_media_type": 400,
    "empty_image_file": 400,
    "failed_to_download_image": 400,
    "image_file_not_found": 400,
}


def response_failure(response: dict[str, Any]) -> ApiError | None:
    """The error a chat client should get for a ``failed`` or ``cancelled`` response.

    ``None`` for every other status (``incomplete`` is a completion with
    ``finish_reason: length``/``content_filter``).
    """
    status = response.get("status")
    if status == "failed":
        error = response.get("error")
        if not isinstance(error, dict):
            error = {"code": "server_error", "message": "The upstream response failed."}
        code = error.get("code")
        http_status = _STATUS_BY_FAILURE_CODE.get(code, 500) if isinstance(code, str) else 500
        return normalise_error(error, http_status)
    if status == "cancelled":
        response_id = response.get("id")
        named = f" {response_id}" if isinstance(response_id, str) and response_id else ""
        return ApiError(
            message=f"The upstream response{named} was cancelled before it completed.",
            type="server_error",
            code="response_cancelled",
            status=500,
        )
    return None


@dataclass(slots=True)
class _Folded:
    """What the output items of one response add up to."""

    texts: list[str] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)
    annotations: list[dict[str, Any]] = field(default_factory=list)
    logprobs: list[Any] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    tool_calls: list[dict[str, Any]] = field(default_factory=list)

    @property
    def text_length(self) -> int:
        return sum(len(text) for text in self.texts)


def _string(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _url_citation(annotation: Any, offset: int) -> dict[str, Any] | None:
    """A Responses ``url_citation`` annotation in chat's nested shape, indices shifted to the
    position of its part inside the concatenated ``content``."""
    if not isinstance(annotation, dict) or annotation.get("type") != "url_citation":
        return None
    start = annotation.get("start_index")
    end = annotation.get("end_index")
    return {
        "type": "url_citation",
        "url_citation": {
            "start_index": (start if isinstance(start, int) else 0) + offset,
            "end_index": (end if isinstance(end, int) else 0) + offset,
            "title": _string(annotation.get("title")),
            "url": _string(annotation.get("url")),
        },
    }


def _fold_message(item: dict[str, Any], folded: _Folded) -> None:
    content = item.get("content")
    if isinstance(content, str):  # tolerated shorthand some servers use
        folded.texts.append(content)
        return
    for part in content if isinstance(content, list) else []:
        if not isinstance(part, dict):
            continue
        kind = part.get("type")
        if kind == "output_text":
            offset = folded.text_length
            for annotation in part.get("annotations") or []:
                mapped = _url_citation(annotation, offset)
                if mapped is not None:
                    folded.annotations.append(mapped)
            logprobs = part.get("logprobs")
            if isinstance(logprobs, list):
                folded.logprobs.extend(logprobs)
            folded.texts.append(_string(part.get("text")))
        elif kind == "refusal":
            folded.refusals.append(_string(part.get("refusal")))


def _reasoning_text(item: dict[str, Any]) -> str:
    """Summary texts, or the raw ``reasoning_text`` content when there is no summary
    (LM Studio, vLLM); encrypted-only items give ``""``."""
    for key, part_type in (("summary", "summary_text"), ("content", "reasoning_text")):
        parts = item.get(key)
        texts = [
            part["text"]
            for part in (parts if isinstance(parts, list) else [])
            if isinstance(part, dict)
            and part.get("type", part_type) == part_type
            and isinstance(part.get("text"), str)
            and part["text"]
        ]
        if texts:
            return "\n\n".join(texts)
    return ""


def _function_call(item: dict[str, Any]) -> dict[str, Any]:
    name = _string(item.get("name"))
    namespace = item.get("namespace")
    if isinstance(namespace, str) and namespace:
        name = f"{namespace}{NAMESPACE_SEPARATOR}{name}"
    arguments = item.get("arguments")
    if not isinstance(arguments, str):
        # Some servers hand back parsed arguments; chat clients expect the JSON text.
        arguments = orjson.dumps(arguments).decode() if arguments is not None else ""
    return {
        "id": _string(item.get("call_id")) or _string(item.get("id")),
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def _custom_call(item: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": _string(item.get("call_id")) or _string(item.get("id")),
        "type": "custom",
        "custom": {"name": _string(item.get("name")), "input": _string(item.get("input"))},
    }


def _fold(output: Any) -> _Folded:
    folded = _Folded()
    for item in output if isinstance(output, list) else []:
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        if kind == "message" or (kind is None and item.get("role") == "assistant"):
            _fold_message(item, folded)
        elif kind == "reasoning":
            text = _reasoning_text(item)
            if text:
                folded.reasoning.append(text)
        elif kind == "function_call":
            folded.tool_calls.append(_function_call(item))
        elif kind == "custom_tool_call":
            folded.tool_calls.append(_custom_call(item))
        # Hosted tool items (web_search_call, …) ran upstream; a chat client has no place
        # for them, and their results already shaped the text.
    return folded


def _usage(responses_usage: Any) -> dict[str, Any] | None:
    usage = responses_usage_to_chat(responses_usage)
    if usage is not None:
        details = responses_usage.get("input_tokens_details")
        written = details.get("cache_write_tokens") if isinstance(details, dict) else None
        # Cache writes are billed differently; keep them when the upstream reported any
        # (wire.usage predates the field; zero means the same as absent).
        if isinstance(written, int) and written:
            usage["prompt_tokens_details"].setdefault("cache_write_tokens", written)
    return usage


def _finish_reason(response: dict[str, Any], has_calls: bool) -> str:
    status = response.get("status")
    if status in ("failed", "cancelled"):
        # Not a completion (see response_failure); never invite running half-made calls.
        return "stop"
    if status == "incomplete":
        details = response.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, dict) else None
        return "content_filter" if reason == "content_filter" else "length"
    return "tool_calls" if has_calls else "stop"


def response_to_chat_completion(
    response: dict[str, Any], context: TranslationContext
) -> dict[str, Any]:
    """The ``chat.completion`` body a chat client gets for a Responses ``response`` body.

    Check :func:`response_failure` first: a failed response is an HTTP error, not a body.
    """
    folded = _fold(response.get("output"))
    text = "".join(folded.texts)
    has_text = bool(folded.texts)
    reasoning = "\n\n".join(folded.reasoning)
    mode = context.options.reasoning

    content: str | None
    if has_text:
        content = text
    elif folded.tool_calls or folded.refusals:
        content = None  # what OpenAI sends for a pure tool-call or refusal turn
    else:
        content = ""

    annotations = folded.annotations
    if reasoning and mode == "think-tags":
        prefix = f"{THINK_OPEN}{reasoning}{THINK_CLOSE}"
        content = prefix + (content or "")
        for annotation in annotations:  # citations point into the text after the prefix
            annotation["url_citation"]["start_index"] += len(prefix)
            annotation["url_citation"]["end_index"] += len(prefix)

    message: dict[str, Any] = {
        "role": "assistant",
        "content": content,
        "refusal": "".join(folded.refusals) if folded.refusals else None,
        "annotations": annotations,
    }
    if reasoning and mode in ("reasoning_content", "reasoning"):
        message[mode] = reasoning
    if folded.tool_calls:
        message["tool_calls"] = folded.tool_calls

    created = response.get("created_at")
    model = context.model or _string(response.get("model"))
    response_id = _string(response.get("id"))
    completion: dict[str, Any] = {
        "id": f"chatcmpl-{response_id}",
        "object": "chat.completion",
        "created": int(created) if isinstance(created, int | float) else 0,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                # Responses carries logprobs per output_text part, in chat's token shape.
                "logprobs": {"content": folded.logprobs, "refusal": None}
                if folded.logprobs
                else None,
                "finish_reason": _finish_reason(response, bool(folded.tool_calls)),
            }
        ],
        "usage": _usage(response.get("usage")),
        "system_fingerprint": None,
    }
    service_tier = response.get("service_tier")
    if isinstance(service_tier, str):
        completion["service_tier"] = service_tier
    return completion
