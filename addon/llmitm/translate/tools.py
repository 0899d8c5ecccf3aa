"""Tools across the two APIs: which chat function stands for which Responses tool.

Chat upstreams only know ``function`` tools. A Responses request's ``custom`` tools (Codex's
``apply_patch`` and code-mode ``exec``) become a function with one string parameter ``input``,
and ``namespace`` tools are flattened to ``namespace__name`` — whether declared in ``tools`` or
in ``additional_tools`` input items. :func:`restore_call` turns the upstream's function call
back into the item the Responses client declared.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from typing import Any

import orjson

from llmitm.translate.context import ToolOrigin, TranslationContext
from llmitm.translate.errors import TranslationError

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
        custom: dict[str, Any] = {
            "id": item_id,
            "type": "custom_tool_call",
            "status": status,
            "call_id": call_id,
            "name": origin.name,
            "input": custom_input_from_arguments(arguments),
        }
        if origin.namespace is not None:
            custom["namespace"] = origin.namespace
        return custom
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


# --- Request side: declaring Responses tools to a chat upstream, and back. ---------------

CHAT_NAME_PATTERN = re.compile(r"[a-zA-Z0-9_-]{1,64}")
NAMESPACE_SEPARATOR = "__"
_DIGEST_LENGTH = 8
_TOOL_CHOICE_MODES = frozenset({"none", "auto", "required"})


def chat_function_name(name: str, namespace: str | None = None) -> str:
    """The chat function name for a Responses tool, stable across requests.

    Chat names must match ``^[a-zA-Z0-9_-]{1,64}$``. Names that do not are sanitised and
    shortened, with a hash of the original appended so that two long or exotic names never
    collapse into one and the same tool gets the same name on every turn.
    """
    flat = f"{namespace}{NAMESPACE_SEPARATOR}{name}" if namespace else name
    if CHAT_NAME_PATTERN.fullmatch(flat):
        return flat
    digest = hashlib.sha256(flat.encode()).hexdigest()[:_DIGEST_LENGTH]
    safe = re.sub(r"[^a-zA-Z0-9_-]", "_", flat)[: 64 - _DIGEST_LENGTH - 1]
    return f"{safe}_{digest}"


def custom_tool_parameters(tool_format: Any) -> dict[str, Any]:
    """The JSON schema of the chat function standing in for a Responses ``custom`` tool."""
    description = "The raw input for this tool, as free text (not JSON)."
    if isinstance(tool_format, dict) and tool_format.get("type") == "grammar":
        grammar = tool_format.get("grammar")
        # Older clients put syntax/definition next to type rather than under "grammar".
        spec = grammar if isinstance(grammar, dict) else tool_format
        syntax = spec.get("syntax", "lark")
        definition = spec.get("definition", "")
        description += f" It must match this {syntax} grammar:\n{definition}"
    return {
        "type": "object",
        "properties": {CUSTOM_INPUT_PARAMETER: {"type": "string", "description": description}},
        "required": [CUSTOM_INPUT_PARAMETER],
        "additionalProperties": False,
    }


def custom_call_arguments(tool_input: Any) -> str:
    """Chat ``arguments`` for a historical ``custom_tool_call``'s ``input``."""
    text = tool_input if isinstance(tool_input, str) else ""
    return orjson.dumps({CUSTOM_INPUT_PARAMETER: text}).decode()


def _tool_name(tool: dict[str, Any], where: str) -> str:
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise TranslationError(
            f"{where} has no name; give every function and custom tool a non-empty name.",
            param=where,
            code="missing_required_parameter",
        )
    return name


class _ToolDeclarer:
    """Builds the chat ``tools`` list and records which Responses tool each name stands for."""

    def __init__(self, context: TranslationContext) -> None:
        self.context = context
        self.tools: list[dict[str, Any]] = []
        self._seen: dict[str, tuple[str, ToolOrigin, int]] = {}
        self.redeclare = False
        """Tools of ``additional_tools`` items: a later item may declare the same tool
        again (a conversation resent whole carries every turn's item); its newer
        definition replaces the earlier one instead of being a name clash."""

    def _declare(
        self, chat_name: str, origin: ToolOrigin, where: str, tool: dict[str, Any]
    ) -> None:
        seen = self._seen.get(chat_name)
        if seen is not None:
            earlier, earlier_origin, position = seen
            if self.redeclare and earlier_origin == origin:
                self.tools[position] = tool
                return
            raise TranslationError(
                f"{where} and {earlier} both become the chat function "
                f"{chat_name!r}; rename one of them.",
                param="tools",
                code="invalid_value",
            )
        self._seen[chat_name] = (where, origin, len(self.tools))
        self.tools.append(tool)
        # Plain functions whose name survives unchanged need no entry: origin_of defaults.
        if origin != ToolOrigin("function", chat_name):
            self.context.tools[chat_name] = origin

    def function(self, tool: dict[str, Any], where: str, namespace: str | None) -> None:
        name = _tool_name(tool, where)
        chat_name = chat_function_name(name, namespace)
        function: dict[str, Any] = {"name": chat_name}
        if tool.get("description") is not None:
            function["description"] = tool["description"]
        parameters = tool.get("parameters")
        function["parameters"] = (
            parameters if parameters is not None else {"type": "object", "properties": {}}
        )
        if tool.get("strict") is not None:
            function["strict"] = tool["strict"]
        origin = ToolOrigin("function", name, namespace=namespace)
        self._declare(chat_name, origin, where, {"type": "function", "function": function})

    def custom(self, tool: dict[str, Any], where: str, namespace: str | None) -> None:
        name = _tool_name(tool, where)
        chat_name = chat_function_name(name, namespace)
        function: dict[str, Any] = {"name": chat_name}
        if tool.get("description") is not None:
            function["description"] = tool["description"]
        function["parameters"] = custom_tool_parameters(tool.get("format"))
        origin = ToolOrigin("custom", name, namespace=namespace)
        self._declare(chat_name, origin, where, {"type": "function", "function": function})


def _hosted(kind: str, where: str, strict: bool, warnings: list[str]) -> None:
    if strict:
        raise TranslationError(
            f"{where} is a hosted {kind!r} tool that a chat upstream cannot run; "
            "remove it or turn off strict mode to have it dropped.",
            param="tools",
        )
    warnings.append(f"dropped hosted tool {kind!r} ({where}): a chat upstream cannot run it")


def responses_tools_to_chat(
    tools: Any,
    context: TranslationContext,
    warnings: list[str],
    additional: Sequence[tuple[str, Any]] = (),
) -> list[dict[str, Any]]:
    """Chat ``tools`` for a Responses request's ``tools``; hosted tools are dropped or refused.

    ``additional`` holds the tools declared by ``additional_tools`` input items, as
    ``(where, tool)`` pairs; they follow the top-level ones. Fills ``context.tools`` with the
    origin of every renamed, custom or namespaced function.
    """
    if tools is not None and not isinstance(tools, list):
        raise TranslationError("tools must be an array of tool objects.", param="tools")
    declarer = _ToolDeclarer(context)
    for index, tool in enumerate(tools or []):
        _declare_tool(declarer, tool, f"tools[{index}]", warnings)
    declarer.redeclare = True
    for where, tool in additional:
        _declare_tool(declarer, tool, where, warnings)
    return declarer.tools


def _declare_tool(declarer: _ToolDeclarer, tool: Any, where: str, warnings: list[str]) -> None:
    strict = declarer.context.options.strict
    kind = tool.get("type") if isinstance(tool, dict) else None
    if not isinstance(tool, dict) or not isinstance(kind, str):
        raise TranslationError(
            f"{where} must be an object with a type; send each tool as an object.",
            param="tools",
        )
    if kind == "function":
        declarer.function(tool, where, None)
    elif kind == "custom":
        declarer.custom(tool, where, None)
    elif kind == "namespace":
        namespace = _tool_name(tool, where)
        inner_tools = tool.get("tools")
        if not isinstance(inner_tools, list):
            raise TranslationError(
                f"{where}.tools must be an array; list the namespace's tools in it.",
                param="tools",
            )
        for inner_index, inner in enumerate(inner_tools):
            inner_where = f"{where}.tools[{inner_index}]"
            inner_kind = inner.get("type") if isinstance(inner, dict) else None
            if inner_kind == "function":
                declarer.function(inner, inner_where, namespace)
            elif inner_kind == "custom":
                declarer.custom(inner, inner_where, namespace)
            else:
                _hosted(str(inner_kind), inner_where, strict, warnings)
    else:
        _hosted(kind, where, strict, warnings)


def _chat_name_for(name: str, namespace: str | None, kind: str, context: TranslationContext) -> str:
    """The chat name already declared for a Responses tool, or the one it would get."""
    for chat_name, origin in context.tools.items():
        if origin.kind == kind and origin.name == name and origin.namespace == namespace:
            return chat_name
    return chat_function_name(name, namespace)


def _dropped_choice(kind: str, context: TranslationContext, warnings: list[str], why: str) -> str:
    if context.options.strict:
        raise TranslationError(
            f"tool_choice {kind!r} cannot be carried to a chat upstream ({why}); "
            "choose a function tool or turn off strict mode.",
            param="tool_choice",
        )
    warnings.append(f"replaced tool_choice {kind!r} with 'auto': {why}")
    return "auto"


def _tool_choice_mode(choice: str) -> str:
    """The string tool choices, the same in both APIs."""
    if choice in _TOOL_CHOICE_MODES:
        return choice
    raise TranslationError(
        f"tool_choice {choice!r} is not one of none, auto or required; send one of those "
        "or a tool choice object.",
        param="tool_choice",
        code="invalid_value",
    )


def responses_tool_choice_to_chat(
    choice: Any, context: TranslationContext, warnings: list[str]
) -> Any:
    """Chat ``tool_choice`` for a Responses one (call after :func:`responses_tools_to_chat`)."""
    if isinstance(choice, str):
        return _tool_choice_mode(choice)
    kind = choice.get("type") if isinstance(choice, dict) else None
    if not isinstance(choice, dict) or not isinstance(kind, str):
        raise TranslationError(
            "tool_choice must be a string or an object with a type; send 'auto' or a "
            "tool choice object.",
            param="tool_choice",
            code="invalid_value",
        )
    if kind in ("function", "custom"):
        name = _tool_name(choice, "tool_choice")
        chat_name = _chat_name_for(name, choice.get("namespace"), kind, context)
        return {"type": "function", "function": {"name": chat_name}}
    if kind == "allowed_tools":
        allowed: list[dict[str, Any]] = []
        for index, tool in enumerate(choice.get("tools") or []):
            tool_kind = tool.get("type") if isinstance(tool, dict) else None
            if tool_kind in ("function", "custom"):
                name = _tool_name(tool, f"tool_choice.tools[{index}]")
                chat_name = _chat_name_for(name, tool.get("namespace"), tool_kind, context)
                allowed.append({"type": "function", "function": {"name": chat_name}})
            else:
                warnings.append(
                    f"dropped hosted tool {tool_kind!r} from tool_choice.allowed_tools: "
                    "a chat upstream cannot run it"
                )
        if not allowed:
            return _dropped_choice(kind, context, warnings, "no function tools are allowed")
        return {
            "type": "allowed_tools",
            "allowed_tools": {"mode": choice.get("mode", "auto"), "tools": allowed},
        }
    return _dropped_choice(kind, context, warnings, "it names a hosted tool")


def chat_tools_to_responses(tools: Any) -> list[dict[str, Any]]:
    """Responses ``tools`` (flat) for chat ``tools`` (nested ``function``/``custom``)."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise TranslationError("tools must be an array of tool objects.", param="tools")
    result: list[dict[str, Any]] = []
    for index, tool in enumerate(tools):
        where = f"tools[{index}]"
        kind = tool.get("type") if isinstance(tool, dict) else None
        body = tool.get(kind) if isinstance(tool, dict) and isinstance(kind, str) else None
        if kind not in ("function", "custom") or not isinstance(body, dict):
            raise TranslationError(
                f"{where} must be a function or custom tool with its definition under "
                f"'function' or 'custom'; got type {kind!r}.",
                param="tools",
                code="invalid_value",
            )
        flat: dict[str, Any] = {"type": kind, "name": _tool_name(body, where)}
        if body.get("description") is not None:
            flat["description"] = body["description"]
        if kind == "custom":
            if body.get("format") is not None:
                flat["format"] = body["format"]
        else:
            parameters = body.get("parameters")
            flat["parameters"] = (
                parameters if parameters is not None else {"type": "object", "properties": {}}
            )
            # Chat functions are non-strict unless asked; Responses would try strict mode
            # when strict is omitted, constraining the model differently.
            strict = body.get("strict")
            flat["strict"] = strict if strict is not None else False
        result.append(flat)
    return result


def web_search_tool(options: Any) -> dict[str, Any]:
    """The Responses ``web_search`` tool for chat ``web_search_options``."""
    tool: dict[str, Any] = {"type": "web_search"}
    if not isinstance(options, dict):
        return tool
    if options.get("search_context_size") is not None:
        tool["search_context_size"] = options["search_context_size"]
    location = options.get("user_location")
    if isinstance(location, dict):
        # Chat nests the fields under "approximate"; Responses has them flat.
        approximate = location.get("approximate")
        fields = approximate if isinstance(approximate, dict) else {}
        flat = {"type": location.get("type", "approximate")}
        flat.update({key: value for key, value in fields.items() if value is not None})
        tool["user_location"] = flat
    return tool


def chat_tool_choice_to_responses(choice: Any) -> Any:
    """Responses ``tool_choice`` for a chat one."""
    if isinstance(choice, str):
        return _tool_choice_mode(choice)
    kind = choice.get("type") if isinstance(choice, dict) else None
    if isinstance(choice, dict) and kind in ("function", "custom"):
        named = choice.get(kind)
        if isinstance(named, dict):
            return {"type": kind, "name": _tool_name(named, "tool_choice")}
    if isinstance(choice, dict) and kind == "allowed_tools":
        allowed = choice.get("allowed_tools")
        if isinstance(allowed, dict):
            tools = []
            for index, tool in enumerate(allowed.get("tools") or []):
                tool_kind = tool.get("type") if isinstance(tool, dict) else None
                named = tool.get(tool_kind) if isinstance(tool_kind, str) else None
                if tool_kind not in ("function", "custom") or not isinstance(named, dict):
                    raise TranslationError(
                        f"tool_choice.allowed_tools.tools[{index}] must name a function or "
                        "custom tool.",
                        param="tool_choice",
                        code="invalid_value",
                    )
                where = f"tool_choice.allowed_tools.tools[{index}]"
                tools.append({"type": tool_kind, "name": _tool_name(named, where)})
            return {"type": "allowed_tools", "mode": allowed.get("mode", "auto"), "tools": tools}
    raise TranslationError(
        "tool_choice must be none, auto, required, or a function, custom or allowed_tools choice.",
        param="tool_choice",
        code="invalid_value",
    )
