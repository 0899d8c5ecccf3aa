"""Responses request → Chat Completions request: a Responses client in front of a chat upstream.

Owns the request half of that direction: ``instructions`` and ``input`` items (after the
already-resolved ``history``) become chat ``messages``, Responses tools are declared as chat
functions (via :mod:`llmitm.translate.tools`), and sampling/format fields are renamed. The
returned context tells the response translators the client's model, the request fields the
synthesized Response echoes and which chat function stands for which Responses tool.

Request fields without a message or tool meaning, decided one by one (every Responses field
is also echoed in the synthesized Response, whatever happens to it here):

======================== ===============================================================
Responses field          toward the chat upstream
======================== ===============================================================
``temperature``,         same name
``top_p``, ``user``,
``service_tier``,
``prompt_cache_key``,
``prompt_cache_retention``,
``safety_identifier``,
``moderation``
``prompt_cache_options``  ``mode``, and ``ttl`` when chat has it (``30m``); ``prewarm`` and
                         ``comparison_response_id`` (a Response id) are dropped with a warning
``max_output_tokens``    ``max_completion_tokens``
``reasoning.effort``     ``reasoning_effort``
``top_logprobs`` > 0     ``logprobs: true`` and ``top_logprobs``
``include``              ``message.output_text.logprobs`` → ``logprobs: true``; the others
                         are dropped: ``reasoning.encrypted_content`` is llmitm's to honour
                         (it seals reasoning itself), the rest name hosted-tool results or
                         stored inputs a chat upstream has none of
``parallel_tool_calls``  same name when tools remain (chat rejects it without tools)
``stream_options``       replaced by ``{"include_usage": true}`` when streaming: its only
                         Responses option, ``include_obfuscation``, concerns padding llmitm
                         never adds
``metadata``, ``store``  dropped: on OpenAI chat they would store the completion
``truncation``           dropped: a chat upstream never truncates, so ``"auto"`` degrades to
                         ``"disabled"`` (an overlong input fails with the upstream's error)
``max_tool_calls``       dropped: it limits hosted tools, which never run on a chat upstream
``context_management``   dropped with a warning: llmitm compacts only when asked
                         (``responses.compact`` or a ``compaction_trigger`` item)
``background``,          handled by the proxy before translation
``background_options``,
``previous_response_id``,
``conversation``
``prompt``, and any      dropped with a warning
other field
======================== ===============================================================
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import orjson

from llmitm.translate.chat_resume import ChatResume
from llmitm.translate.content_parts import (
    BLOCK_SEPARATOR,
    STREAM_SEPARATOR,
    TEXT_PART_TYPES,
    is_text_part,
    join_text,
    part_text,
    responses_part_to_chat,
)
from llmitm.translate.context import MappedRequest, TranslateOptions, TranslationContext
from llmitm.translate.errors import TranslationError
from llmitm.translate.input_config import CONFIG_ITEM_TYPES, is_config_item, read_input_config
from llmitm.translate.tools import (
    chat_function_name,
    custom_call_arguments,
    responses_tool_choice_to_chat,
    responses_tools_to_chat,
)
from llmitm.translate.validation import require_model
from llmitm.wire.objects import ECHOED_REQUEST_FIELDS

LOGPROBS_INCLUDE = "message.output_text.logprobs"

_MESSAGE_ROLES = frozenset({"user", "assistant", "system", "developer"})
_OUTPUT_TYPES = frozenset({"function_call_output", "custom_tool_call_output"})
_SAME_NAME_FIELDS = (
    "temperature",
    "top_p",
    "user",
    "service_tier",
    "prompt_cache_key",
    "prompt_cache_retention",
    "safety_identifier",
    "moderation",
)
# Read here under another name, or handled by the proxy (store emulation, background,
# include), or meaningless to a chat upstream. Forwarding store/metadata to OpenAI chat would
# even change behaviour (stored chat completions), so they stop here silently.
_CONSUMED_FIELDS = frozenset(
    {
        "model",
        "input",
        "instructions",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "text",
        "reasoning",
        "max_output_tokens",
        "top_logprobs",
        "stream",
        "stream_options",
        "metadata",
        "store",
        "background",
        "background_options",
        "prompt_cache_options",
        "include",
        "truncation",
        "max_tool_calls",
        "client_metadata",
        "previous_response_id",
        "conversation",
        *_SAME_NAME_FIELDS,
    }
)


def responses_request_to_chat(
    body: dict[str, Any],
    options: TranslateOptions,
    *,
    history: list[dict[str, Any]] | None = None,
    resume: ChatResume | None = None,
    resumable: bool = False,
) -> MappedRequest:
    """Translate a Responses request body into a Chat Completions request body.

    ``history`` holds the items of the ancestor responses, already resolved by the store
    (Responses item shape); without it a request continuing a stored conversation is refused.

    ``resume``: where an earlier body's translation stood after its first ``resume.count``
    input items, which the caller proved the same bytes as this body's first ones; ignored
    where it does not apply. ``resumable``: the result carries where this body's stood
    (:attr:`MappedRequest.resume`) and its messages' JSON (:attr:`MappedRequest.message_texts`).
    """
    model = require_model(body, "Responses")
    _require_history(body, history)

    context = TranslationContext(options=options, model=model)
    context.echo = {key: body[key] for key in ECHOED_REQUEST_FIELDS if key in body}
    warnings: list[str] = []

    resumable = resumable and history is None and type(body.get("input")) is list
    start = resume if resumable and _goes_on_from(resume, body) else None
    located = list(_located_items(body, history, start))
    config = read_input_config(located)
    tools = responses_tools_to_chat(body.get("tools"), context, warnings, config.tools)
    builder = _messages(body, history, warnings, start, resumable)
    chat: dict[str, Any] = {"model": model, "messages": builder.messages}
    _map_tools(body, tools, chat, context, warnings)
    _map_text(body.get("text"), chat)
    _map_sampling(body, chat)
    _map_prompt_cache_options(body.get("prompt_cache_options"), chat, warnings)
    if config.reasoning_effort is not None:
        chat["reasoning_effort"] = config.reasoning_effort
    warnings += config.warnings()
    if body.get("stream"):
        # Usage arrives only in the trailing chunk, and response.completed must carry it.
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    if body.get("prompt") is not None:
        warnings.append("ignored prompt: a chat upstream cannot expand stored prompt templates")
    if body.get("context_management") is not None:
        warnings.append(
            "ignored context_management: llmitm compacts only on request (responses.compact "
            "or a compaction_trigger item), not at a token threshold"
        )
    for key in body:
        if key not in _CONSUMED_FIELDS and key not in ("prompt", "context_management"):
            warnings.append(f"ignored {key}: the Chat Completions API has no equivalent")
    mapped = MappedRequest(body=chat, context=context, warnings=warnings)
    if builder.paused is not None:
        texts = _message_texts(builder, start)
        mapped.message_texts = texts
        paused = builder.paused
        mapped.resume = replace(
            paused, texts=tuple(texts[: len(paused.messages)]), config=tuple(located)
        )
    return mapped


def _goes_on_from(resume: ChatResume | None, body: dict[str, Any]) -> bool:
    """Whether this body's translation can go on from ``resume`` (its items proven by the
    caller): the same instructions before them, and at least as many items."""
    if resume is None:
        return False
    instructions = body.get("instructions")
    return (
        type(instructions) is type(resume.instructions)
        and instructions == resume.instructions
        and len(body["input"]) >= resume.count
    )


def _message_texts(builder: _MessageBuilder, start: ChatResume | None) -> list[bytes]:
    """Each message's JSON: a resent one's as spelt before, a new one's now."""
    shared = builder.shared
    texts = list(start.texts[:shared]) if start is not None else []
    texts += [orjson.dumps(message) for message in builder.messages[shared:]]
    return texts


def _located_items(
    body: dict[str, Any], history: list[dict[str, Any]] | None, start: ChatResume | None
) -> Iterator[tuple[str, Any]]:
    """The conversation's configuring items with where each is, history first (only they
    are read for their configuration: an agent's history has thousands of items, each
    spelt out here for nothing); from ``start`` on, those it found in the resent items."""
    if start is not None:
        yield from start.config
    for name, items in (("history", history), ("input", body.get("input"))):
        if isinstance(items, list):
            first = start.count if start is not None and name == "input" else 0
            for index in range(first, len(items)):
                item = items[index]
                if is_config_item(item):
                    yield f"{name}[{index}]", item


def _require_history(body: dict[str, Any], history: list[dict[str, Any]] | None) -> None:
    if history is not None:
        return
    previous = body.get("previous_response_id")
    if previous is not None:
        # The local Responses API inlines the chains it stores: this id is unknown (OpenAI's
        # own 400, word for word).
        raise TranslationError(
            f"Previous response with id '{previous}' not found.",
            param="previous_response_id",
            code="previous_response_not_found",
        )
    if body.get("conversation") is not None:
        raise TranslationError(
            "conversation refers to server-side state that llmitm's response store must "
            "resolve first; enable the store or resend the full conversation in input.",
            param="conversation",
            code="previous_response_not_found",
        )


def _messages(
    body: dict[str, Any],
    history: list[dict[str, Any]] | None,
    warnings: list[str],
    start: ChatResume | None,
    resumable: bool,
) -> _MessageBuilder:
    """The builder, finished: its messages, and where it stood after the input items when
    ``resumable`` (going on from ``start`` when given)."""
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise TranslationError(
            "instructions must be a string; put structured context in input messages.",
            param="instructions",
            code="invalid_type",
        )
    mark = len(warnings)
    if start is not None:
        builder = _MessageBuilder.resumed(start, warnings)
    else:
        builder = _MessageBuilder(warnings)
        # Only this request's instructions count: a previous response's are never carried.
        if instructions:
            builder.messages.append({"role": "system", "content": instructions})
    for index, item in enumerate(history or []):
        builder.add(item, f"history[{index}]")
    items = body.get("input")
    if isinstance(items, str):
        builder.add({"role": "user", "content": items}, "input")
    elif isinstance(items, list):
        for index in range(start.count if start is not None else 0, len(items)):
            builder.add(items[index], f"input[{index}]")
        if resumable:
            builder.pause(len(items), instructions, warnings[mark:])
    elif items is not None:
        raise TranslationError(
            "input must be a string or an array of input items.",
            param="input",
            code="invalid_type",
        )
    builder.finish()
    if not builder.messages:
        raise TranslationError(
            "input is empty; send a string or at least one input item.",
            param="input",
            code="missing_required_parameter",
        )
    return builder


class _MessageBuilder:
    """Accumulates chat messages from Responses items, merging an assistant turn's parts."""

    def __init__(self, warnings: list[str]) -> None:
        self.messages: list[dict[str, Any]] = []
        self.warnings = warnings
        self._reasoning: list[str] = []
        self._dropped: Counter[str] = Counter()
        # Media returned by tools, held until the run of tool messages ends (see _tool_result).
        self._tool_media: list[dict[str, Any]] = []
        self.shared = 0
        """Leading messages that are the resumed state's own objects, unchanged."""
        self.paused: ChatResume | None = None
        """Where it stood after the input items (its messages' JSON not filled in)."""

    @classmethod
    def resumed(cls, start: ChatResume, warnings: list[str]) -> _MessageBuilder:
        """A builder where ``start`` left one (``start``'s warnings added to ``warnings``)."""
        builder = cls(warnings)
        messages = list(start.messages)
        builder.shared = len(messages)
        if messages and messages[-1]["role"] == "assistant":
            # Later items may join this turn (its text, calls and reasoning): on a copy, so
            # that the body that made it keeps what it spelt.
            messages[-1] = copy.deepcopy(messages[-1])
            builder.shared -= 1
        builder.messages = messages
        builder._reasoning = list(start.reasoning)
        builder._tool_media = list(start.tool_media)
        builder._dropped = Counter(dict(start.dropped))
        warnings.extend(start.warnings)
        return builder

    def pause(self, count: int, instructions: Any, warnings: list[str]) -> None:
        """Note where it stands after ``count`` input items (:attr:`paused`)."""
        self.paused = ChatResume(
            count=count,
            instructions=instructions,
            messages=tuple(self.messages),
            texts=(),
            reasoning=tuple(self._reasoning),
            tool_media=tuple(self._tool_media),
            dropped=tuple(self._dropped.items()),
            warnings=tuple(warnings),
            config=(),
        )

    def add(self, item: Any, where: str) -> None:
        if not isinstance(item, dict):
            raise TranslationError(
                f"{where} must be an object; send input items as objects.",
                param="input",
                code="invalid_type",
            )
        kind = item.get("type")
        if kind is None and "role" in item:
            kind = "message"
        if self._tool_media and kind not in _OUTPUT_TYPES:
            self._flush_tool_media()
        if kind == "message":
            self._message(item, where)
        elif kind in ("function_call", "custom_tool_call"):
            self._call(item, kind, where)
        elif kind in _OUTPUT_TYPES:
            self._tool_result(item, where)
        elif kind == "reasoning":
            text = _reasoning_text(item)
            if text:
                self._reasoning.append(text)
        elif kind in CONFIG_ITEM_TYPES:
            pass  # read by read_input_config: tools and settings, not conversation
        elif kind == "item_reference":
            raise TranslationError(
                f"{where} is an item_reference, which llmitm's response store must resolve "
                "before translation; enable the store or send the referenced item itself.",
                param="input",
            )
        elif isinstance(kind, str):
            self._dropped[kind] += 1
        else:
            raise TranslationError(
                f"{where} has neither a type nor a role; give every input item a type.",
                param="input",
                code="missing_required_parameter",
            )

    def finish(self) -> None:
        self._flush_tool_media()
        # Reasoning with no assistant turn after it has nothing to attach to.
        self._reasoning.clear()
        for kind, count in sorted(self._dropped.items()):
            self.warnings.append(
                f"dropped {count} {kind} input item(s): a chat upstream cannot replay "
                "hosted tool items"
            )

    def _tool_result(self, item: dict[str, Any], where: str) -> None:
        self._reasoning.clear()
        call_id = _call_id(item, where)
        text, media = _tool_output(item.get("output"), where, self.warnings)
        self.messages.append({"role": "tool", "tool_call_id": call_id, "content": text})
        if media:
            # Chat tool messages take only text, and nothing may come between an assistant's
            # calls and their results; images and files follow the results as a user turn.
            label = {"type": "text", "text": f"Content returned by tool call {call_id}:"}
            self._tool_media.append({"role": "user", "content": [label, *media]})
            self.warnings.append(
                f"moved non-text output of {where} to a user message: chat tool messages "
                "take only text"
            )

    def _flush_tool_media(self) -> None:
        self.messages.extend(self._tool_media)
        self._tool_media.clear()

    def _message(self, item: dict[str, Any], where: str) -> None:
        role = item.get("role")
        if role not in _MESSAGE_ROLES:
            raise TranslationError(
                f"{where}.role must be user, assistant, system or developer, not {role!r}.",
                param="input",
                code="invalid_value",
            )
        content = item.get("content")
        if role == "assistant":
            self._assistant(content, where)
            return
        self._reasoning.clear()
        if role == "user":
            self.messages.append({"role": "user", "content": self._user(content, where)})
        else:
            # Chat-only local backends' templates often reject "developer"; system is universal.
            self.messages.append({"role": "system", "content": self._system(content, where)})

    def _user(self, content: Any, where: str) -> str | list[dict[str, Any]]:
        if content is None or isinstance(content, str):
            return content or ""
        if type(content) is list and len(content) == 1:
            # The common turn: one text part, which becomes the message's text.
            (part,) = content
            if type(part) is dict and part.get("type") in TEXT_PART_TYPES:
                return part_text(part)
        parts = [
            mapped
            for index, part in enumerate(_parts(content, where))
            if (mapped := responses_part_to_chat(part, f"{where}.content[{index}]", self.warnings))
        ]
        if all(part["type"] == "text" for part in parts) and len(parts) <= 1:
            return parts[0]["text"] if parts else ""
        return parts

    def _system(self, content: Any, where: str) -> str:
        if content is None or isinstance(content, str):
            return content or ""
        parts = _parts(content, where)
        if any(not is_text_part(part) for part in parts):
            self.warnings.append(
                f"dropped non-text parts of {where}: chat system messages are text"
            )
        return join_text(parts, BLOCK_SEPARATOR)

    def _assistant(self, content: Any, where: str) -> None:
        texts: list[str] = []
        refusals: list[str] = []
        parts: list[Any] = [] if content is None else _parts(content, where)
        if isinstance(content, str):
            texts.append(content)
        for part in parts:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind in TEXT_PART_TYPES:
                texts.append(part_text(part))
            elif kind == "refusal":
                refusals.append(str(part.get("refusal") or ""))
            else:
                self.warnings.append(f"dropped a {kind!r} part of {where}: not assistant content")
        text = STREAM_SEPARATOR.join(texts)
        last = self.messages[-1] if self.messages else None
        if last is not None and last["role"] == "assistant" and last.get("tool_calls"):
            # Tool results must directly follow the calls, so text the client recorded after
            # the calls (still awaiting results) joins the calls' message.
            message = last
            if text:
                message["content"] = (message.get("content") or "") + text
        else:
            message = {"role": "assistant", "content": text}
            self.messages.append(message)
        if refusals:
            message["refusal"] = (message.get("refusal") or "") + "".join(refusals)
        self._attach_reasoning(message)

    def _call(self, item: dict[str, Any], kind: str, where: str) -> None:
        name = item.get("name")
        if not isinstance(name, str) or not name:
            raise TranslationError(
                f"{where} has no name; send the tool name of every call.",
                param="input",
                code="missing_required_parameter",
            )
        namespace = item.get("namespace")
        if kind == "custom_tool_call":
            arguments = custom_call_arguments(item.get("input"))
        else:
            arguments = _arguments(item.get("arguments"))
        call = {
            "id": _call_id(item, where),
            "type": "function",
            "function": {
                "name": chat_function_name(name, namespace if isinstance(namespace, str) else None),
                "arguments": arguments,
            },
        }
        last = self.messages[-1] if self.messages else None
        if last is not None and last["role"] == "assistant":
            # Consecutive calls, and the text the model said before them, are one chat turn.
            message = last
            if message.get("content") == "":
                message["content"] = None
        else:
            message = {"role": "assistant", "content": None}
            self.messages.append(message)
        message.setdefault("tool_calls", []).append(call)
        self._attach_reasoning(message)

    def _attach_reasoning(self, message: dict[str, Any]) -> None:
        if not self._reasoning:
            return
        texts = [message["reasoning_content"]] if message.get("reasoning_content") else []
        message["reasoning_content"] = BLOCK_SEPARATOR.join(texts + self._reasoning)
        self._reasoning.clear()


def _parts(content: Any, where: str) -> list[Any]:
    if isinstance(content, str):
        return []
    if not isinstance(content, list):
        raise TranslationError(
            f"{where}.content must be a string or an array of content parts.",
            param="input",
            code="invalid_type",
        )
    return content


def _call_id(item: dict[str, Any], where: str) -> str:
    call_id = item.get("call_id")
    if not isinstance(call_id, str) or not call_id:
        raise TranslationError(
            f"{where} has no call_id; send the call_id that pairs each tool call with its output.",
            param="input",
            code="missing_required_parameter",
        )
    return call_id


def _arguments(arguments: Any) -> str:
    # Historical arguments may be invalid JSON (a model's truncated call); forward verbatim.
    if isinstance(arguments, str):
        return arguments
    if arguments is None:
        return ""
    return orjson.dumps(arguments).decode()


def _tool_output(output: Any, where: str, warnings: list[str]) -> tuple[str, list[dict[str, Any]]]:
    """A tool output's text, and its non-text parts as chat parts."""
    if output is None:
        return "", []
    if isinstance(output, str):
        return output, []
    if not isinstance(output, list):
        return orjson.dumps(output).decode(), []
    parts = [
        mapped
        for index, part in enumerate(output)
        if (mapped := responses_part_to_chat(part, f"{where}.output[{index}]", warnings))
    ]
    text = STREAM_SEPARATOR.join(part["text"] for part in parts if part["type"] == "text")
    return text, [part for part in parts if part["type"] != "text"]


def _reasoning_text(item: dict[str, Any]) -> str:
    content = item.get("content")
    if isinstance(content, list):
        texts = [
            part_text(part)
            for part in content
            if isinstance(part, dict) and part.get("type") == "reasoning_text"
        ]
        if any(texts):
            return STREAM_SEPARATOR.join(texts)
    summary = item.get("summary")
    if isinstance(summary, list):
        return BLOCK_SEPARATOR.join(
            text for part in summary if isinstance(part, dict) and (text := part_text(part))
        )
    return ""


def _map_tools(
    body: dict[str, Any],
    tools: list[dict[str, Any]],
    chat: dict[str, Any],
    context: TranslationContext,
    warnings: list[str],
) -> None:
    choice = body.get("tool_choice")
    if not tools:
        # Chat upstreams reject tool_choice and parallel_tool_calls without tools.
        if choice not in (None, "auto", "none"):
            warnings.append("dropped tool_choice: no tool is left for a chat upstream to call")
        return
    chat["tools"] = tools
    if choice is not None:
        chat["tool_choice"] = responses_tool_choice_to_chat(choice, context, warnings)
    if body.get("parallel_tool_calls") is not None:
        chat["parallel_tool_calls"] = body["parallel_tool_calls"]


def _map_text(text: Any, chat: dict[str, Any]) -> None:
    if text is None:
        return
    if not isinstance(text, dict):
        raise TranslationError(
            "text must be an object with format and/or verbosity.",
            param="text",
            code="invalid_type",
        )
    text_format = text.get("format")
    kind = text_format.get("type") if isinstance(text_format, dict) else None
    if kind == "json_schema":
        assert isinstance(text_format, dict)
        schema = {
            key: text_format[key]
            for key in ("name", "description", "schema", "strict")
            if text_format.get(key) is not None
        }
        chat["response_format"] = {"type": "json_schema", "json_schema": schema}
    elif kind == "json_object":
        chat["response_format"] = {"type": "json_object"}
    elif text_format is not None and kind != "text":
        raise TranslationError(
            f"text.format type {kind!r} is not supported; send text, json_object or json_schema.",
            param="text.format",
            code="invalid_value",
        )
    if text.get("verbosity") is not None:
        chat["verbosity"] = text["verbosity"]


def _map_prompt_cache_options(options: Any, chat: dict[str, Any], warnings: list[str]) -> None:
    """Keep what chat's ``prompt_cache_options`` has; name what it has not."""
    if not isinstance(options, dict):
        return
    kept = {key: options[key] for key in ("mode",) if key in options}
    if options.get("ttl") in _CHAT_CACHE_TTLS:
        kept["ttl"] = options["ttl"]
    dropped = sorted(key for key in options if key not in kept)
    if dropped:
        warnings.append(
            f"dropped prompt_cache_options {', '.join(dropped)}: not available on the "
            "Chat Completions API"
        )
    if kept:
        chat["prompt_cache_options"] = kept


_CHAT_CACHE_TTLS = frozenset({"30m"})


def _map_sampling(body: dict[str, Any], chat: dict[str, Any]) -> None:
    if body.get("max_output_tokens") is not None:
        chat["max_completion_tokens"] = body["max_output_tokens"]
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and reasoning.get("effort") is not None:
        chat["reasoning_effort"] = reasoning["effort"]
    for key in _SAME_NAME_FIELDS:
        if body.get(key) is not None:
            chat[key] = body[key]
    include = body.get("include")
    top_logprobs = body.get("top_logprobs")
    wants_logprobs = isinstance(include, list) and LOGPROBS_INCLUDE in include
    if isinstance(top_logprobs, bool) or not isinstance(top_logprobs, int):
        top_logprobs = None  # not a count: nothing to forward
    if wants_logprobs or (top_logprobs is not None and top_logprobs > 0):
        chat["logprobs"] = True
        if top_logprobs is not None:
            chat["top_logprobs"] = top_logprobs
