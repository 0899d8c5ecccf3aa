"""Chat Completions request → Responses request: a chat client in front of a Responses upstream.

Owns the request half of that direction: ``messages`` become ``instructions`` plus ``input``
items (without item ids), chat tools and choices become their flat Responses forms, and
sampling/format fields are renamed. Fields with no Responses equivalent are refused or dropped
according to :class:`~llmitm.translate.context.TranslateOptions`. The returned context tells
the response translators the client's model and whether it asked for a usage chunk.
"""

from __future__ import annotations

from typing import Any

from llmitm.translate.content_parts import (
    BLOCK_SEPARATOR,
    STREAM_SEPARATOR,
    chat_part_to_responses,
    chat_text_content,
)
from llmitm.translate.context import MappedRequest, TranslateOptions, TranslationContext
from llmitm.translate.errors import TranslationError
from llmitm.translate.tools import (
    chat_tool_choice_to_responses,
    chat_tools_to_responses,
    web_search_tool,
)
from llmitm.translate.validation import require_model

LOGPROBS_INCLUDE = "message.output_text.logprobs"
# OpenAI rejects max_output_tokens below 16 ("integer below minimum value").
MIN_OUTPUT_TOKENS = 16

_SAME_NAME_FIELDS = (
    "temperature",
    "top_p",
    "metadata",
    "service_tier",
    "prompt_cache_key",
    "prompt_cache_retention",
    "safety_identifier",
    "user",
)
# Chat fields the Responses API lacks, with the value that means "not used": a client sending
# the default (LangChain sends penalties of 0) loses nothing and gets no warning.
_UNSUPPORTED_DEFAULTS: dict[str, tuple[Any, ...]] = {
    "seed": (None,),
    "frequency_penalty": (None, 0, 0.0),
    "presence_penalty": (None, 0, 0.0),
    "logit_bias": (None, {}),
    "modalities": (None, ["text"]),
    "audio": (None,),
    "prediction": (None,),
}
_CONSUMED_FIELDS = frozenset(
    {
        "model",
        "messages",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "web_search_options",
        "response_format",
        "verbosity",
        "max_completion_tokens",
        "max_tokens",
        "reasoning_effort",
        "store",
        "logprobs",
        "top_logprobs",
        "n",
        "stop",
        "stream",
        "stream_options",
        *_SAME_NAME_FIELDS,
        *_UNSUPPORTED_DEFAULTS,
    }
)


def chat_request_to_responses(body: dict[str, Any], options: TranslateOptions) -> MappedRequest:
    """Translate a Chat Completions request body into a Responses request body."""
    model = require_model(body, "chat")
    for legacy in ("functions", "function_call"):
        if body.get(legacy) is not None:
            raise TranslationError(
                f"{legacy} is the deprecated function-calling API; send tools and tool_choice "
                "instead.",
                param=legacy,
            )
    context = TranslationContext(options=options, model=model)
    warnings: list[str] = []

    instructions, items = _input_items(body.get("messages"), warnings)
    result: dict[str, Any] = {"model": model}
    if instructions is not None:
        result["instructions"] = instructions
    result["input"] = items
    _map_tools(body, result)
    _map_text(body, result)
    _map_sampling(body, result, warnings)
    _map_unsupported(body, options, warnings)
    # A chat client never asked for server-side state; storing would leak its conversations
    # into the upstream's store (and Azure bills storage).
    result["store"] = body["store"] if body.get("store") is not None else False
    if body.get("stream"):
        result["stream"] = True
        stream_options = body.get("stream_options")
        if isinstance(stream_options, dict) and stream_options.get("include_usage"):
            context.include_usage = True
    for key in body:
        if key not in _CONSUMED_FIELDS:
            warnings.append(f"ignored {key}: the Responses API has no equivalent")
    return MappedRequest(body=result, context=context, warnings=warnings)


def _input_items(messages: Any, warnings: list[str]) -> tuple[str | None, list[dict[str, Any]]]:
    """``instructions`` (leading system messages) and the input items for the rest."""
    if not isinstance(messages, list) or not messages:
        raise TranslationError(
            "messages is required; send a non-empty array of chat messages.",
            param="messages",
            code="missing_required_parameter",
        )
    instructions: list[str] = []
    items: list[dict[str, Any]] = []
    custom_call_ids: set[str] = set()
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        role = message.get("role") if isinstance(message, dict) else None
        if not isinstance(message, dict) or not isinstance(role, str):
            raise TranslationError(
                f"{where} must be an object with a role; send each message as an object.",
                param="messages",
                code="invalid_value",
            )
        content = message.get("content")
        if role == "system" and not items:
            instructions.append(chat_text_content(content, f"{where}.content", BLOCK_SEPARATOR))
        elif role in ("system", "developer"):
            text = chat_text_content(content, f"{where}.content", BLOCK_SEPARATOR)
            items.append({"type": "message", "role": role, "content": text})
        elif role == "user":
            items.append({"type": "message", "role": "user", "content": _user(content, where)})
        elif role == "assistant":
            items.extend(_assistant(message, where, custom_call_ids, warnings))
        elif role == "tool":
            items.append(_tool_result(message, where, custom_call_ids))
        elif role == "function":
            raise TranslationError(
                f"{where} uses the deprecated function role; send a tool message with "
                "tool_call_id instead.",
                param="messages",
            )
        else:
            raise TranslationError(
                f"{where}.role {role!r} is not system, developer, user, assistant or tool.",
                param="messages",
                code="invalid_value",
            )
    return (BLOCK_SEPARATOR.join(instructions) if instructions else None), items


def _user(content: Any, where: str) -> str | list[dict[str, Any]]:
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise TranslationError(
            f"{where}.content must be a string or an array of content parts.",
            param="messages",
            code="invalid_type",
        )
    return [
        chat_part_to_responses(part, f"{where}.content[{index}]")
        for index, part in enumerate(content)
    ]


def _assistant(
    message: dict[str, Any], where: str, custom_call_ids: set[str], warnings: list[str]
) -> list[dict[str, Any]]:
    # reasoning_content / reasoning are dropped on purpose: OpenAI rejects reasoning input
    # items it did not issue itself (they need its id and encrypted_content).
    if message.get("function_call") is not None:
        raise TranslationError(
            f"{where}.function_call is the deprecated function-calling API; send tool_calls "
            "instead.",
            param="messages",
        )
    if message.get("audio") is not None:
        warnings.append(f"dropped {where}.audio: Responses input has no audio reference")
    parts = _assistant_parts(message.get("content"), where)
    if isinstance(message.get("refusal"), str) and message["refusal"]:
        parts.append({"type": "refusal", "refusal": message["refusal"]})
    tool_calls = message.get("tool_calls") or []
    if not isinstance(tool_calls, list):
        raise TranslationError(
            f"{where}.tool_calls must be an array.", param="messages", code="invalid_type"
        )
    items: list[dict[str, Any]] = []
    # content:"" is the usual chat spelling of "no text" (next to tool calls, or a turn some
    # clients record before them); an empty output_text item would only invite a 400.
    if any(part.get("text") or part.get("refusal") for part in parts):
        items.append({"type": "message", "role": "assistant", "content": parts})
    for call_index, call in enumerate(tool_calls):
        items.append(_tool_call(call, f"{where}.tool_calls[{call_index}]", custom_call_ids))
    return items


def _assistant_parts(content: Any, where: str) -> list[dict[str, Any]]:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "output_text", "text": content}]
    if not isinstance(content, list):
        raise TranslationError(
            f"{where}.content must be a string or an array of text parts.",
            param="messages",
            code="invalid_type",
        )
    parts: list[dict[str, Any]] = []
    for index, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            parts.append({"type": "output_text", "text": part.get("text") or ""})
        elif kind == "refusal":
            parts.append({"type": "refusal", "refusal": part.get("refusal") or ""})
        else:
            raise TranslationError(
                f"{where}.content[{index}] has type {kind!r}; assistant content takes only text "
                "and refusal parts.",
                param="messages",
                code="invalid_value",
            )
    return parts


def _tool_call(call: Any, where: str, custom_call_ids: set[str]) -> dict[str, Any]:
    call_id = call.get("id") if isinstance(call, dict) else None
    if not isinstance(call, dict) or not isinstance(call_id, str) or not call_id:
        raise TranslationError(
            f"{where} has no id; send the id that pairs each tool call with its tool message.",
            param="messages",
            code="missing_required_parameter",
        )
    kind = call.get("type", "function")
    detail = call.get(kind) if isinstance(kind, str) else None
    name = detail.get("name") if isinstance(detail, dict) else None
    if kind not in ("function", "custom") or not isinstance(name, str) or not name:
        raise TranslationError(
            f"{where} must be a function or custom tool call with a name.",
            param="messages",
            code="invalid_value",
        )
    assert isinstance(detail, dict)
    if kind == "custom":
        custom_call_ids.add(call_id)
        tool_input = detail.get("input")
        return {
            "type": "custom_tool_call",
            "call_id": call_id,
            "name": name,
            "input": tool_input if isinstance(tool_input, str) else "",
        }
    arguments = detail.get("arguments")
    return {
        "type": "function_call",
        "call_id": call_id,
        "name": name,
        "arguments": arguments if isinstance(arguments, str) else "",
    }


def _tool_result(message: dict[str, Any], where: str, custom_call_ids: set[str]) -> dict[str, Any]:
    call_id = message.get("tool_call_id")
    if not isinstance(call_id, str) or not call_id:
        raise TranslationError(
            f"{where} has no tool_call_id; send the id of the tool call it answers.",
            param="messages",
            code="missing_required_parameter",
        )
    output = chat_text_content(message.get("content"), f"{where}.content", STREAM_SEPARATOR)
    # A custom tool call must be answered by a custom output item, or OpenAI rejects the pair.
    kind = "custom_tool_call_output" if call_id in custom_call_ids else "function_call_output"
    return {"type": kind, "call_id": call_id, "output": output}


def _map_tools(body: dict[str, Any], result: dict[str, Any]) -> None:
    tools = chat_tools_to_responses(body.get("tools"))
    if body.get("web_search_options") is not None:
        tools.append(web_search_tool(body["web_search_options"]))
    if tools:
        result["tools"] = tools
        if body.get("parallel_tool_calls") is not None:
            result["parallel_tool_calls"] = body["parallel_tool_calls"]
    if body.get("tool_choice") is not None:
        result["tool_choice"] = chat_tool_choice_to_responses(body["tool_choice"])


def _map_text(body: dict[str, Any], result: dict[str, Any]) -> None:
    text: dict[str, Any] = {}
    response_format = body.get("response_format")
    if response_format is not None:
        kind = response_format.get("type") if isinstance(response_format, dict) else None
        if kind == "json_schema":
            schema = response_format.get("json_schema")
            if not isinstance(schema, dict):
                raise TranslationError(
                    "response_format.json_schema must be an object with name and schema.",
                    param="response_format",
                    code="invalid_value",
                )
            text["format"] = {"type": "json_schema"} | {
                key: schema[key]
                for key in ("name", "description", "schema", "strict")
                if schema.get(key) is not None
            }
        elif kind in ("json_object", "text"):
            text["format"] = {"type": kind}
        else:
            raise TranslationError(
                f"response_format type {kind!r} is not supported; send text, json_object or "
                "json_schema.",
                param="response_format",
                code="invalid_value",
            )
    if body.get("verbosity") is not None:
        text["verbosity"] = body["verbosity"]
    if text:
        result["text"] = text


def _map_sampling(body: dict[str, Any], result: dict[str, Any], warnings: list[str]) -> None:
    limit = body.get("max_completion_tokens")
    if limit is None:
        limit = body.get("max_tokens")
    if isinstance(limit, int) and limit < MIN_OUTPUT_TOKENS:
        warnings.append(
            f"raised the output token limit from {limit} to {MIN_OUTPUT_TOKENS}, the Responses "
            "API's minimum"
        )
        limit = MIN_OUTPUT_TOKENS
    if limit is not None:
        result["max_output_tokens"] = limit
    if body.get("reasoning_effort") is not None:
        # Without a summary request a Responses upstream streams no reasoning text at all.
        result["reasoning"] = {"effort": body["reasoning_effort"], "summary": "auto"}
    for key in _SAME_NAME_FIELDS:
        if body.get(key) is not None:
            result[key] = body[key]
    if body.get("logprobs"):
        result["include"] = [LOGPROBS_INCLUDE]
        if body.get("top_logprobs") is not None:
            result["top_logprobs"] = body["top_logprobs"]


def _map_unsupported(body: dict[str, Any], options: TranslateOptions, warnings: list[str]) -> None:
    n = body.get("n")
    if n is not None and n != 1:
        _refuse_or_drop(
            "n",
            f"n={n} asks for several choices, which the Responses API cannot produce; "
            "send n=1 or enable drop_unsupported.",
            options.drop_unsupported,
            warnings,
        )
    stop = body.get("stop")
    if stop:
        _refuse_or_drop(
            "stop",
            "stop sequences are not supported by the Responses API; remove stop or enable "
            "drop_unsupported.",
            options.drop_unsupported,
            warnings,
        )
    for key, defaults in _UNSUPPORTED_DEFAULTS.items():
        if key in body and body[key] not in defaults:
            _refuse_or_drop(
                key,
                f"{key} is not supported by the Responses API; remove it or turn off strict "
                "mode to have it dropped.",
                not options.strict,
                warnings,
            )


def _refuse_or_drop(param: str, message: str, drop: bool, warnings: list[str]) -> None:
    if not drop:
        raise TranslationError(message, param=param)
    warnings.append(f"dropped {param}: the Responses API has no equivalent")
