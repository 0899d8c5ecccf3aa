"""The checks every request starts with, and their 400 messages.

:func:`validate_request` runs on every create call llmitm routes — both APIs, translated,
passed through or failed over — before anything reads the body for translation, affinity or
state: a body of the wrong shape gets OpenAI's 400 naming the field (``param``) instead of
reaching code that assumes the documented types. It checks the types of the fields llmitm
reads (and OpenAI documents), the shape of messages, items and tools, and the nesting depth
(:mod:`llmitm.wire.depth`); fields it does not know are left to the endpoint, which may
have extensions. ``null`` is taken for any optional field, as OpenAI takes it.

One pass over the body's containers, no copies: it runs once per turn of a conversation that
grows with every turn. Given the request's :class:`~llmitm.translate.seen_items.SeenItems`,
a Responses input item that passed before is not walked again (its checks do not depend on
its index, and it is at the same depth in every body): the result is the same, refusal for
refusal.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from llmitm.translate.errors import TranslationError
from llmitm.translate.seen_items import SeenItems
from llmitm.wire.depth import MAX_DEPTH, deep_path, exceeds


def require_model(body: Any, api: str) -> str:
    """The request's model; a 400 when the body is not an object or names no model."""
    if not isinstance(body, dict):
        raise TranslationError(
            f"The request body must be a JSON object; send the {api} request as an object.",
            code=None,
        )
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise TranslationError(
            "model is required; send the model name as a string.",
            param="model",
            code="missing_required_parameter",
        )
    return model


# --- JSON types ---------------------------------------------------------------------------

Check = Callable[[Any], bool]


def _string(value: Any) -> bool:
    return isinstance(value, str)


def _boolean(value: Any) -> bool:
    return isinstance(value, bool)


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _object(value: Any) -> bool:
    return isinstance(value, dict)


def _array(value: Any) -> bool:
    return isinstance(value, list)


def _string_or_array(value: Any) -> bool:
    return isinstance(value, str | list)


def _string_or_object(value: Any) -> bool:
    return isinstance(value, str | dict)


_KIND: Final[dict[Check, str]] = {
    _string: "a string",
    _boolean: "a boolean",
    _integer: "an integer",
    _number: "a number",
    _object: "an object",
    _array: "an array",
    _string_or_array: "a string or an array",
    _string_or_object: "a string or an object",
}


_ACCEPTS: Final[dict[Check, frozenset[type]]] = {
    _string: frozenset({str}),
    _boolean: frozenset({bool}),
    _integer: frozenset({int}),
    _number: frozenset({int, float}),
    _object: frozenset({dict}),
    _array: frozenset({list}),
    _string_or_array: frozenset({str, list}),
    _string_or_object: frozenset({str, dict}),
}
"""The exact types each check takes at a glance (``bool`` is not ``int`` here)."""


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


def _refuse(param: str, check: Check, value: Any) -> TranslationError:
    return TranslationError(
        f"{param} must be {_KIND[check]}, not {_json_type(value)}.",
        param=param,
        code="invalid_type",
    )


def _fields(item: dict[str, Any], checks: dict[str, Check], where: str) -> None:
    """Each field of ``item`` named in ``checks`` is null or of its type."""
    for name, check in checks.items():
        value = item.get(name)
        if value is not None and not check(value):
            raise _refuse(f"{where}{name}", check, value)


def _fields_at(item: dict[str, Any], checks: dict[str, Check], param: str, index: int) -> None:
    """:func:`_fields` of ``param[index]``, whose name is only spelt out for a refusal (an
    agent's input has tens of thousands of items and parts, resent every turn).

    Walks the item's own fields (a few) rather than every check (ten or so), and takes a
    value whose exact type the check accepts without calling it: what ``orjson`` parses
    has exactly these types, so the check runs only on what it will likely refuse."""
    for name, value in item.items():
        check = checks.get(name)
        if check is None or value is None or type(value) in _ACCEPTS[check]:
            continue
        if not check(value):
            raise _refuse(f"{param}[{index}].{name}", check, value)


def _objects(value: Any, param: str) -> list[dict[str, Any]]:
    """An array of objects (the caller checked it is an array)."""
    for index, element in enumerate(value):
        if not isinstance(element, dict):
            raise _refuse(f"{param}[{index}]", _object, element)
    return value  # type: ignore[no-any-return]


# --- the two APIs' bodies -----------------------------------------------------------------

_SAMPLING: Final[dict[str, Check]] = {
    "stream": _boolean,
    "store": _boolean,
    "parallel_tool_calls": _boolean,
    "temperature": _number,
    "top_p": _number,
    "top_logprobs": _integer,
    "tool_choice": _string_or_object,
    "metadata": _object,
    "stream_options": _object,
    "user": _string,
    "service_tier": _string,
    "prompt_cache_key": _string,
    "safety_identifier": _string,
}
_RESPONSES_FIELDS: Final[dict[str, Check]] = {
    **_SAMPLING,
    "input": _string_or_array,
    "instructions": _string,
    "tools": _array,
    "background": _boolean,
    "max_output_tokens": _integer,
    "max_tool_calls": _integer,
    "previous_response_id": _string,
    "conversation": _string_or_object,
    "include": _array,
    "reasoning": _object,
    "text": _object,
    "prompt": _object,
    "truncation": _string,
}
_CHAT_FIELDS: Final[dict[str, Check]] = {
    **_SAMPLING,
    "messages": _array,
    "tools": _array,
    "functions": _array,
    "function_call": _string_or_object,
    "n": _integer,
    "max_tokens": _integer,
    "max_completion_tokens": _integer,
    "seed": _integer,
    "presence_penalty": _number,
    "frequency_penalty": _number,
    "logprobs": _boolean,
    "stop": _string_or_array,
    "response_format": _object,
    "logit_bias": _object,
    "modalities": _array,
    "reasoning_effort": _string,
}
_ITEM_FIELDS: Final[dict[str, Check]] = {
    "type": _string,
    "role": _string,
    "content": _string_or_array,
    "name": _string,
    "call_id": _string,
    "arguments": _string,
    "output": _string_or_array,
    "summary": _array,
    "encrypted_content": _string,
    "tools": _array,
}
_MESSAGE_FIELDS: Final[dict[str, Check]] = {
    "role": _string,
    "content": _string_or_array,
    "name": _string,
    "tool_calls": _array,
    "tool_call_id": _string,
}
_PART_FIELDS: Final[dict[str, Check]] = {"type": _string, "text": _string}
_FUNCTION_FIELDS: Final[dict[str, Check]] = {
    "name": _string,
    "description": _string,
    "parameters": _object,
    "strict": _boolean,
}
_TOOL_FIELDS: Final[dict[str, Check]] = {"type": _string, **_FUNCTION_FIELDS, "tools": _array}
_CHAT_TOOL_FIELDS: Final[dict[str, Check]] = {"type": _string, "function": _object}
_TOOL_CALL_FIELDS: Final[dict[str, Check]] = {"id": _string, "type": _string, "function": _object}
_CALLED_FUNCTION_FIELDS: Final[dict[str, Check]] = {"name": _string, "arguments": _string}


def validate_request(body: dict[str, Any], api: str, seen: SeenItems | None = None) -> None:
    """A 400 naming the field when ``body`` (a parsed JSON object) is not a well-formed
    ``api`` (``"chat"`` or ``"responses"``) create request; nothing when it is. ``seen``: a
    Responses body's input items as the memo knows them (those that pass are marked)."""
    if _too_deep(body, seen if api == "responses" else None):
        param = deep_path(body, MAX_DEPTH)
        raise TranslationError(
            f"{param} nests objects and arrays more than {MAX_DEPTH} levels deep; llmitm "
            f"takes at most {MAX_DEPTH}.",
            param=param,
            code="invalid_value",
        )
    if api == "chat":
        _chat(body)
    else:
        _responses(body, seen)


def _too_deep(body: dict[str, Any], seen: SeenItems | None) -> bool:
    """:func:`~llmitm.wire.depth.exceeds` of ``body``, leaving out the input items that
    passed before: the body is level 1, its fields' values level 2, an input item level 3."""
    items = body.get("input")
    if seen is None or type(items) is not list:
        return exceeds(body, MAX_DEPTH)
    return any(
        exceeds(value, MAX_DEPTH - 1) for name, value in body.items() if name != "input"
    ) or any(not seen.valid(item) and exceeds(item, MAX_DEPTH - 2) for item in items)


def _responses(body: dict[str, Any], seen: SeenItems | None = None) -> None:
    _fields(body, _RESPONSES_FIELDS, "")
    items = body.get("input")
    if isinstance(items, list):
        for index, item in enumerate(_objects(items, "input")):
            if seen is not None and seen.valid(item):
                continue
            _fields_at(item, _ITEM_FIELDS, "input", index)
            # Parameter names are spelt out only for a refusal: this runs per item per turn.
            content, output = item.get("content"), item.get("output")
            if type(content) is list:
                _parts_at(content, "input", index, "content")
            if type(output) is list:
                _parts_at(output, "input", index, "output")
            tools = item.get("tools")  # Codex declares its tools in an additional_tools item
            if tools is not None:
                _responses_tools(tools, f"input[{index}].tools")
    tools = body.get("tools")
    if tools is not None:
        _responses_tools(tools, "tools")
    _fields(body.get("text") or {}, {"format": _object, "verbosity": _string}, "text.")
    _fields(body.get("reasoning") or {}, {"effort": _string, "summary": _string}, "reasoning.")
    if seen is not None and isinstance(items, list):
        seen.mark_valid(items)  # only now: the whole body passed, depth included


def _parts_at(content: list[Any], param: str, index: int, field: str) -> None:
    """:func:`_parts` of ``param[index].field``, named only when a part is refused."""
    for part_index, part in enumerate(content):
        if type(part) is not dict:
            _parts(content, f"{param}[{index}].{field}")  # names the part it refuses
        for name, value in part.items():
            check = _PART_FIELDS.get(name)
            if check is None or value is None or type(value) in _ACCEPTS[check]:
                continue
            if not check(value):
                raise _refuse(f"{param}[{index}].{field}[{part_index}].{name}", check, value)


def _responses_tools(tools: list[Any], param: str) -> None:
    for index, tool in enumerate(_objects(tools, param)):
        where = f"{param}[{index}]"
        _fields(tool, _TOOL_FIELDS, f"{where}.")
        nested = tool.get("tools")  # a namespace's own tools
        if nested is not None:
            _responses_tools(nested, f"{where}.tools")


def _chat(body: dict[str, Any]) -> None:
    if "messages" not in body:
        raise TranslationError(
            "messages is required; send the conversation as an array of messages.",
            param="messages",
            code="missing_required_parameter",
        )
    _fields(body, _CHAT_FIELDS, "")
    for index, message in enumerate(_objects(body.get("messages") or [], "messages")):
        _fields_at(message, _MESSAGE_FIELDS, "messages", index)
        content = message.get("content")
        if isinstance(content, list):
            _parts(content, f"messages[{index}].content")
        calls = message.get("tool_calls")
        if not calls:
            continue
        where = f"messages[{index}]"
        for call_index, call in enumerate(_objects(calls, f"{where}.tool_calls")):
            call_where = f"{where}.tool_calls[{call_index}]"
            _fields(call, _TOOL_CALL_FIELDS, f"{call_where}.")
            _fields(call.get("function") or {}, _CALLED_FUNCTION_FIELDS, f"{call_where}.function.")
    for index, tool in enumerate(_objects(body.get("tools") or [], "tools")):
        where = f"tools[{index}]"
        _fields(tool, _CHAT_TOOL_FIELDS, f"{where}.")
        _fields(tool.get("function") or {}, _FUNCTION_FIELDS, f"{where}.function.")
    for index, function in enumerate(_objects(body.get("functions") or [], "functions")):
        _fields(function, _FUNCTION_FIELDS, f"functions[{index}].")


def _parts(content: Any, param: str) -> None:
    """A content array's parts are objects whose type and text are strings."""
    if isinstance(content, list):
        for index, part in enumerate(_objects(content, param)):
            _fields_at(part, _PART_FIELDS, param, index)
