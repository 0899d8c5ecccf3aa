"""Responses request → what a third-party Responses server takes, and its calls back.

OpenAI's Responses API takes Codex's shapes natively; an OpenAI-compatible server's own
``/v1/responses`` (llama.cpp's, for one) converts the request to a chat call: it knows only
``function`` tools at the top level and ``message``, ``function_call``,
``function_call_output`` and text-bearing ``reasoning`` items — anything else is a 400
(``Cannot determine type of 'item'``) — and hands message roles to the model's chat template.
:func:`responses_request_for_compatible` rewrites a request the way the chat translation would
declare it: ``additional_tools`` items hoisted into ``tools``, ``namespace`` tools flattened to
``namespace__name`` functions, ``custom`` tools as a function with one ``input`` string (the
same names as :mod:`llmitm.translate.tools`), their calls and outputs in history as function
items, ``developer`` messages as ``system``, ``configuration_update`` applied to
``reasoning``. :class:`CallRestorer` and :func:`restore_response_calls` turn the server's
function calls back into the items the client declared.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import orjson

from llmitm.translate.content_parts import BLOCK_SEPARATOR
from llmitm.translate.context import MappedRequest, TranslateOptions, TranslationContext
from llmitm.translate.input_config import is_config_item, read_input_config
from llmitm.translate.tools import (
    chat_function_name,
    custom_call_arguments,
    custom_input_from_arguments,
    responses_tool_choice_to_chat,
    responses_tools_to_chat,
    restore_call,
)
from llmitm.translate.validation import require_model

Event = dict[str, Any]


def needs_rewrite(body: dict[str, Any]) -> bool:
    """Whether ``body`` holds a shape a third-party server refuses or misreads (a plain
    request is forwarded byte for byte)."""
    tools = body.get("tools")
    if isinstance(tools, list) and any(
        not isinstance(tool, dict) or tool.get("type") != "function" for tool in tools
    ):
        return True
    if isinstance(body.get("tool_choice"), dict):
        return True
    items = body.get("input")
    return isinstance(items, list) and any(_item_needs_rewrite(item) for item in items)


def _item_needs_rewrite(item: Any) -> bool:
    if not isinstance(item, dict):
        return False
    kind = item.get("type")
    if kind is None or kind == "message":
        # llama.cpp tells an assistant turn from the rest by its explicit type only.
        return item.get("role") == "developer" or (kind is None and item.get("role") == "assistant")
    if kind == "function_call_output":
        return False
    if kind == "function_call":
        return "namespace" in item
    if kind == "reasoning":
        return _reasoning_text(item.get("content")) is None
    return True


def responses_request_for_compatible(
    body: dict[str, Any], options: TranslateOptions
) -> MappedRequest:
    """``body`` rewritten for a compatible server's Responses API (a new dict)."""
    model = require_model(body, "Responses")
    context = TranslationContext(options=options, model=model)
    warnings: list[str] = []
    items = body.get("input")
    located = list(enumerate(items)) if isinstance(items, list) else []
    config = read_input_config((f"input[{index}]", item) for index, item in located)
    chat_tools = responses_tools_to_chat(body.get("tools"), context, warnings, config.tools)

    rewritten = dict(body)
    rewritten.pop("tools", None)
    if chat_tools:
        rewritten["tools"] = [_flat_function(tool["function"]) for tool in chat_tools]
    _rewrite_tool_choice(body, rewritten, bool(chat_tools), context, warnings)
    if isinstance(items, list):
        rewritten["input"] = _items(items, warnings)
    if config.reasoning_effort is not None:
        reasoning = body.get("reasoning")
        reasoning = dict(reasoning) if isinstance(reasoning, dict) else {}
        reasoning["effort"] = config.reasoning_effort
        rewritten["reasoning"] = reasoning
    warnings += config.warnings()
    return MappedRequest(body=rewritten, context=context, warnings=warnings)


def _flat_function(function: dict[str, Any]) -> dict[str, Any]:
    """A chat function declaration in the Responses tool shape."""
    return {"type": "function", **function}


def _rewrite_tool_choice(
    body: dict[str, Any],
    rewritten: dict[str, Any],
    has_tools: bool,
    context: TranslationContext,
    warnings: list[str],
) -> None:
    choice = body.get("tool_choice")
    if choice is None or isinstance(choice, str):
        return
    if not has_tools:
        rewritten.pop("tool_choice", None)
        warnings.append("dropped tool_choice: no tool is left for the endpoint to call")
        return
    chat_choice = responses_tool_choice_to_chat(choice, context, warnings)
    if isinstance(chat_choice, dict) and chat_choice.get("type") == "function":
        rewritten["tool_choice"] = {"type": "function", "name": chat_choice["function"]["name"]}
    elif isinstance(chat_choice, dict) and chat_choice.get("type") == "allowed_tools":
        allowed = chat_choice["allowed_tools"]
        rewritten["tool_choice"] = {
            "type": "allowed_tools",
            "mode": allowed["mode"],
            "tools": [
                {"type": "function", "name": t["function"]["name"]} for t in allowed["tools"]
            ],
        }
    else:
        rewritten["tool_choice"] = chat_choice


def _items(items: list[Any], warnings: list[str]) -> list[Any]:
    out: list[Any] = []
    dropped: Counter[str] = Counter()
    for index, item in enumerate(items):
        if is_config_item(item):
            continue  # read by read_input_config
        mapped = _item(item) if isinstance(item, dict) else item
        if isinstance(mapped, dict) and mapped.get("type") == "function_call_output":
            mapped = _text_output(mapped, f"input[{index}]", warnings)
        if mapped is None:
            dropped[str(item.get("type"))] += 1
        else:
            out.append(mapped)
    for kind, count in sorted(dropped.items()):
        warnings.append(
            f"dropped {count} {kind} input item(s): the endpoint's Responses API cannot replay them"
        )
    return out


def _item(item: dict[str, Any]) -> dict[str, Any] | None:
    """One input item as the server takes it, or ``None`` when it has nothing it can carry
    (items it would refuse: hosted tool calls, opaque reasoning, and the like)."""
    kind = item.get("type")
    if kind is None and "role" in item:
        kind = "message"
    if kind == "message":
        # llama.cpp tells an assistant message from a call by its explicit type, and hands
        # the role to the model's chat template, which often knows no "developer" (OpenAI's
        # new name for system; the chat translation renames it the same way).
        role = "system" if item.get("role") == "developer" else item.get("role")
        return {**item, "type": "message", "role": role}
    if kind in ("function_call", "custom_tool_call"):
        return _call(item, kind)
    if kind in ("function_call_output", "custom_tool_call_output"):
        return {**item, "type": "function_call_output"}
    if kind == "reasoning":
        return _reasoning(item)
    return None


def _call(item: dict[str, Any], kind: str) -> dict[str, Any]:
    """A historical call under the function name its tool was declared with."""
    name = item.get("name")
    namespace = item.get("namespace")
    call = {key: value for key, value in item.items() if key not in ("namespace", "input")}
    call["type"] = "function_call"
    if isinstance(name, str):
        call["name"] = chat_function_name(name, namespace if isinstance(namespace, str) else None)
    if kind == "custom_tool_call":
        call["arguments"] = custom_call_arguments(item.get("input"))
    elif not isinstance(call.get("arguments"), str):
        call["arguments"] = (
            "" if call.get("arguments") is None else orjson.dumps(call["arguments"]).decode()
        )
    return call


def _text_output(item: dict[str, Any], where: str, warnings: list[str]) -> dict[str, Any]:
    """A tool output the server takes: a string, or ``input_text`` parts only (llama.cpp
    refuses the whole request over one image a tool returned)."""
    output = item.get("output")
    if not isinstance(output, list):
        return item
    parts = [part for part in output if isinstance(part, dict)]
    if all(part.get("type") == "input_text" for part in parts) and len(parts) == len(output):
        return item
    warnings.append(
        f"dropped non-text output of {where}: the endpoint's Responses API takes only text "
        "tool outputs"
    )
    texts = [part for part in parts if part.get("type") == "input_text"]
    return {**item, "output": texts or ""}


def _reasoning(item: dict[str, Any]) -> dict[str, Any] | None:
    """Reasoning with text to replay (its own, else its summary's); opaque reasoning (only
    ``encrypted_content``) means nothing to another server and is left out."""
    if _reasoning_text(item.get("content")) is not None:
        return item
    summary = _reasoning_text(item.get("summary"))
    if not summary:
        return None
    replay = {key: value for key, value in item.items() if key != "encrypted_content"}
    replay["content"] = [{"type": "reasoning_text", "text": summary}]
    return replay


def _reasoning_text(parts: Any) -> str | None:
    """The text of reasoning parts, ``None`` when there is none (llama.cpp reads only the
    first part's ``text``)."""
    if not isinstance(parts, list):
        return None
    texts = [
        part["text"]
        for part in parts
        if isinstance(part, dict) and isinstance(part.get("text"), str)
    ]
    return BLOCK_SEPARATOR.join(texts) if texts and texts[0] else None


# --- Answers: the server's function calls as the client's tools -----------------------


def restore_item(item: Any, context: TranslationContext) -> Any:
    """An output item with a renamed function call turned back into the client's tool."""
    if not isinstance(item, dict) or item.get("type") != "function_call":
        return item
    name = item.get("name")
    if not isinstance(name, str) or name not in context.tools:
        return item
    return restore_call(
        str(item.get("id") or ""),
        str(item.get("call_id") or ""),
        name,
        str(item.get("arguments") or ""),
        str(item.get("status") or "completed"),
        context,
    )


def restore_response_calls(response: dict[str, Any], context: TranslationContext) -> None:
    """A Response object's output calls restored in place."""
    output = response.get("output")
    if isinstance(output, list):
        response["output"] = [restore_item(item, context) for item in output]


class CallRestorer:
    """A conformant Responses event stream with the server's calls of renamed tools turned
    back into the client's: namespaced functions get their name and ``namespace``, custom
    tools become ``custom_tool_call`` items whose input streams as one delta once the JSON
    arguments are whole (the same events the chat translation makes)."""

    def __init__(self, context: TranslationContext) -> None:
        self.context = context
        self._custom: set[str] = set()
        self._seq = 0

    @property
    def next_sequence(self) -> int:
        """The ``sequence_number`` the next event gets."""
        return self._seq

    def relayed_around(self, count: int = 1) -> None:
        """Events went out without passing here (nothing in them to restore): they took the
        next sequence numbers."""
        self._seq += count

    def events(self, events: list[Event]) -> list[Event]:
        out: list[Event] = []
        for event in events:
            out += self._event(event)
        for event in out:
            if "sequence_number" in event:
                event["sequence_number"] = self._seq
                self._seq += 1
        return out

    def _event(self, event: Event) -> list[Event]:
        kind = event.get("type")
        if kind in ("response.output_item.added", "response.output_item.done"):
            item = event.get("item")
            restored = restore_item(item, self.context)
            if restored is not item:
                event["item"] = restored
                if restored.get("type") == "custom_tool_call":
                    self._custom.add(str(restored.get("id")))
            return [event]
        if kind == "response.function_call_arguments.delta":
            return [] if event.get("item_id") in self._custom else [event]
        if kind == "response.function_call_arguments.done":
            return self._arguments_done(event)
        response = event.get("response")
        if isinstance(response, dict) and kind is not None and kind.startswith("response."):
            restore_response_calls(response, self.context)
        return [event]

    def _arguments_done(self, event: Event) -> list[Event]:
        item_id = event.get("item_id")
        if item_id not in self._custom:
            name = event.get("name")
            if isinstance(name, str) and name in self.context.tools:
                event["name"] = self.context.tools[name].name  # as the item names it
            return [event]
        ids = {"item_id": item_id, "output_index": event.get("output_index", 0)}
        tool_input = custom_input_from_arguments(str(event.get("arguments") or ""))
        return [
            {"type": "response.custom_tool_call_input.delta", **ids, "delta": tool_input,
             "sequence_number": 0},
            {"type": "response.custom_tool_call_input.done", **ids, "input": tool_input,
             "sequence_number": 0},
        ]  # fmt: skip
