"""A non-streamed ``chat.completion`` body → a Responses ``response`` body (direction 2).

This module owns the mapping of whole bodies: the first choice becomes ordered
output items — one ``reasoning`` item (from whichever of the four reasoning spellings the
backend used), one assistant ``message`` item, then one item per tool call, restored to the
``custom``/namespaced tool the Responses client declared — and ``finish_reason`` becomes the
Response status.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson

from llmitm.translate.context import TranslationContext
from llmitm.translate.think_tags import split_think_tags
from llmitm.translate.tools import restore_call
from llmitm.wire.objects import (
    custom_tool_call_item,
    message_item,
    output_text_part,
    reasoning_item,
    refusal_part,
    response_object,
)
from llmitm.wire.usage import chat_usage_to_responses

logger = logging.getLogger(__name__)

CONTENT_FILTERED_REFUSAL = "The response was blocked by the upstream content filter."
"""Refusal text for a filtered turn with no output, so clients show something (agents SDK)."""

_INCOMPLETE_REASON = {"length": "max_output_tokens", "content_filter": "content_filter"}


def _first_choice(completion: dict[str, Any]) -> dict[str, Any]:
    """Choice 0: one Response has one answer. A backend that answers several (``n > 1``,
    which the mapped request does not ask for) has the others dropped, with a warning."""
    choices = completion.get("choices")
    if not isinstance(choices, list):
        return {}
    candidates = [choice for choice in choices if isinstance(choice, dict)]
    if len(candidates) > 1:
        logger.warning(
            "the upstream answered %d choices (n > 1); a Responses client gets choice 0 only",
            len(candidates),
        )
    for choice in candidates:
        if choice.get("index", 0) == 0:
            return choice
    return candidates[0] if candidates else {}


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _text_of(value: Any) -> str:
    """Text of a content value: a string, or a list of text parts (some servers send parts)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(
            part["text"]
            for part in value
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""


def _reasoning_field(message: dict[str, Any]) -> str:
    """Reasoning carried beside the content, in the first spelling the backend used.

    OpenRouter sends the same text as both ``reasoning`` and ``reasoning_details``; taking
    only the first spelling present avoids doubling it.
    """
    value = message.get("reasoning_content")
    if isinstance(value, str) and value:
        return value
    value = message.get("reasoning")
    if isinstance(value, dict):  # {text} or {content} (what Codex's chat mode read)
        value = value.get("text") or value.get("content")
    if isinstance(value, str) and value:
        return value
    details = message.get("reasoning_details")
    if isinstance(details, list):
        texts: list[str] = []
        for detail in details:
            if not isinstance(detail, dict):
                continue
            # reasoning.text carries `text`, reasoning.summary carries `summary`;
            # reasoning.encrypted is opaque and skipped.
            text = detail.get("text") if detail.get("type") != "reasoning.summary" else None
            text = text or detail.get("summary")
            if isinstance(text, str) and text:
                texts.append(text)
        return "\n\n".join(texts)
    return ""


def _annotation(annotation: Any, shift: int) -> dict[str, Any] | None:
    """A chat ``url_citation`` annotation in Responses' flat shape."""
    if not isinstance(annotation, dict) or annotation.get("type") != "url_citation":
        return None
    citation = annotation.get("url_citation")
    if not isinstance(citation, dict):
        return None
    start = citation.get("start_index")
    end = citation.get("end_index")
    return {
        "type": "url_citation",
        "start_index": max((start if isinstance(start, int) else 0) - shift, 0),
        "end_index": max((end if isinstance(end, int) else 0) - shift, 0),
        "title": _str(citation.get("title")),
        "url": _str(citation.get("url")),
    }


def _token_bytes(entry: dict[str, Any]) -> list[int]:
    # Chat allows bytes: null; Responses requires the list.
    value = entry.get("bytes")
    if isinstance(value, list):
        return value
    token = entry.get("token")
    return list(token.encode()) if isinstance(token, str) else []


def _logprobs(choice: dict[str, Any]) -> list[dict[str, Any]]:
    logprobs = choice.get("logprobs")
    entries = logprobs.get("content") if isinstance(logprobs, dict) else None
    result: list[dict[str, Any]] = []
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, dict) or not isinstance(entry.get("token"), str):
            continue
        result.append(
            {
                "token": entry["token"],
                "bytes": _token_bytes(entry),
                "logprob": entry.get("logprob", 0.0),
                "top_logprobs": [
                    {"token": top["token"], "bytes": _token_bytes(top), "logprob": top["logprob"]}
                    for top in entry.get("top_logprobs") or []
                    if isinstance(top, dict) and isinstance(top.get("token"), str)
                ],
            }
        )
    return result


def _usage(chat_usage: Any) -> dict[str, Any] | None:
    usage = chat_usage_to_responses(chat_usage)
    if usage is not None:
        details = chat_usage.get("prompt_tokens_details")
        written = details.get("cache_write_tokens") if isinstance(details, dict) else None
        # The openai SDK's ResponseUsage now requires cache_write_tokens, which
        # wire.usage does not write yet; setdefault keeps whatever it writes later.
        usage["input_tokens_details"].setdefault(
            "cache_write_tokens", written if isinstance(written, int) else 0
        )
    return usage


def _arguments(value: Any) -> str:
    if isinstance(value, str):
        return value
    # Some servers (Ollama's native shape) hand back parsed arguments.
    return orjson.dumps(value).decode() if value is not None else ""


def _tool_call_items(
    message: dict[str, Any], status: str, context: TranslationContext
) -> list[dict[str, Any]]:
    ids = context.options.ids
    items: list[dict[str, Any]] = []
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else []:
        if not isinstance(call, dict):
            continue
        call_id = call.get("id") if isinstance(call.get("id"), str) and call.get("id") else None
        custom = call.get("custom")
        if call.get("type") == "custom" or (call.get("type") is None and isinstance(custom, dict)):
            custom = custom if isinstance(custom, dict) else {}
            items.append(
                custom_tool_call_item(
                    ids("ctc"),
                    call_id or ids("call"),
                    _str(custom.get("name")),
                    _str(custom.get("input")),
                    status,
                )
            )
            continue
        function = call.get("function") if isinstance(call.get("function"), dict) else {}
        name = _str(function.get("name"))
        arguments = _arguments(function.get("arguments"))
        items.append(
            restore_call(ids("fc"), call_id or ids("call"), name, arguments, status, context)
        )
    legacy = message.get("function_call")
    if not items and isinstance(legacy, dict):  # the deprecated `functions` API
        name = _str(legacy.get("name"))
        arguments = _arguments(legacy.get("arguments"))
        items.append(restore_call(ids("fc"), ids("call"), name, arguments, status, context))
    return items


def chat_completion_to_response(
    completion: dict[str, Any], context: TranslationContext
) -> dict[str, Any]:
    """The Response object a Responses client gets for a ``chat.completion`` body."""
    options = context.options
    ids = options.ids
    response_id = context.response_id or ids("resp")
    created = completion.get("created")
    created_at = (
        created
        if isinstance(created, int) and not isinstance(created, bool)
        else int(options.clock())
    )
    model = context.model or _str(completion.get("model"))

    choice = _first_choice(completion)
    message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
    finish_reason = choice.get("finish_reason")
    incomplete_reason = _INCOMPLETE_REASON.get(_str(finish_reason))
    item_status = "incomplete" if incomplete_reason else "completed"

    raw_content = _text_of(message.get("content"))
    think_reasoning, content = split_think_tags(raw_content, options.think_open_missing)
    reasoning = "\n\n".join(text for text in (_reasoning_field(message), think_reasoning) if text)
    refusal = _str(message.get("refusal"))

    output: list[dict[str, Any]] = []
    if reasoning:
        output.append(reasoning_item(ids("rs"), [reasoning]))
        if context.seal_reasoning is not None:
            output[-1]["encrypted_content"] = context.seal_reasoning(output[-1])

    has_calls = bool(message.get("tool_calls")) or isinstance(message.get("function_call"), dict)
    parts: list[dict[str, Any]] = []
    # Whitespace some backends put beside tool calls is not an answer worth an item.
    if content.strip() or (content and not has_calls):
        part = output_text_part(content)
        # Removing a leading <think> block moved the text; citations move with it.
        shift = len(raw_content) - len(content) if raw_content.endswith(content) else 0
        annotations = message.get("annotations")
        if not isinstance(annotations, list):
            annotations = []
        mapped = (_annotation(a, shift) for a in annotations)
        part["annotations"] = [a for a in mapped if a is not None]
        part["logprobs"] = _logprobs(choice)
        parts.append(part)
    if refusal:
        parts.append(refusal_part(refusal))
    if not parts and not has_calls and incomplete_reason == "content_filter":
        parts.append(refusal_part(CONTENT_FILTERED_REFUSAL))
    if parts:
        output.append(message_item(ids("msg"), parts, item_status))
    # Minted after the message so ids count up in output order.
    output.extend(_tool_call_items(message, item_status, context))

    response = response_object(
        response_id=response_id,
        created_at=created_at,
        model=model,
        echo=context.echo,
        status="incomplete" if incomplete_reason else "completed",
    )
    response["output"] = output
    response["usage"] = _usage(completion.get("usage"))
    if incomplete_reason:
        response["incomplete_details"] = {"reason": incomplete_reason}
    else:
        response["completed_at"] = int(options.clock())
    service_tier = completion.get("service_tier")
    if isinstance(service_tier, str) and service_tier:
        response["service_tier"] = service_tier  # the tier that actually served the request
    return response
