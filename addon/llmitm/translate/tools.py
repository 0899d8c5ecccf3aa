"""Tools across the two APIs: which chat function stands for which Responses tool.

Chat upstreams only know ``function`` tools. A Responses request's ``custom`` tools (Codex's
``apply_patch``) become a function with one string parameter ``input``, and ``namespace`` tools
are flattened to ``namespace__name``. :func:`restore_call` turns the upstream's function call
back into the item the Responses client declared.
"""

from __future__ import annotations

from typing import Any

import orjson

from llmitm.translate.context import ToolOrigin, TranslationContext

CUSTOM_INPUT_PARAMETER = "input"


def custom_input_from_arguments(arguments: str) -> str:
    """The ``input`` string of a custom tool call from the chat function's arguments.

    A model that ignores the schema and sends a bare string (or invalid JSON) still gets its
    text through rather than an empty input.
    """
    try:
        parsed = orjson.loads(arguments) if arguments else {}
    except orjson.JSONDecodeError:
        return arguments
    if isinstance(parsed, dict):
        value = parsed.get(CUSTOM_INPUT_PARAMETER)
        if isinstance(value, str):
            return value
        if value is not None:
            return orjson.dumps(value).decode()
        return ""
    if isinstance(parsed, str):
        return parsed
    return arguments


def origin_of(name: str, context: TranslationContext) -> ToolOrigin:
    """The Responses tool a chat function name stands for (a plain function by default)."""
    origin = context.tools.get(name)
    return origin if origin is not None else ToolOrigin("function", name)


def restore_call(
    item_id: str,
    call_id: str,
    chat_name: str,
    arguments: str,
    status: str,
    context: TranslationContext,
) -> dict[str, Any]:
    """The Responses output item for a chat tool call."""
    origin = origin_of(chat_name, context)
    if origin.kind == "custom":
        return {
            "id": item_id,
            "type": "custom_tool_call",
            "status": status,
            "call_id": call_id,
            "name": origin.name,
            "input": custom_input_from_arguments(arguments),
        }
    item: dict[str, Any] = {
        "id": item_id,
        "type": "function_call",
        "status": status,
        "call_id": call_id,
        "name": origin.name,
        "arguments": arguments,
    }
    if origin.namespace is not None:
        item["namespace"] = origin.namespace
    return item
