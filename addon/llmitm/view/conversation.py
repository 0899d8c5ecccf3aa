"""The assembled conversation of one body or stream of either API, for people to look at.

Sans-IO and lenient: feed it the parsed JSON objects of an SSE stream (``StreamAssembler``), or
hand it a whole request or response body (``assemble_body``), and read a ``Conversation``:
messages made of blocks (text, reasoning, refusal, tool calls with their growing arguments,
tool results), the finish status, usage, an error, and a tally of event types. It never
raises on odd input: what it cannot place it counts and skips. The live console and the
content view in mitmproxy's UIs both read it; neither translates anything.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from llmitm.translate.think_stream import ThinkTagSplitter
from llmitm.wire.sse import DONE_DATA
from llmitm.wire.usage import usage_tokens

BlockKind = Literal["text", "reasoning", "refusal", "tool_call", "tool_result", "other"]
Api = Literal["chat", "responses"]


class Block:
    """One piece of a message; its text (or a tool call's arguments) grows by ``add``."""

    __slots__ = ("_joined", "_parts", "call_id", "kind", "name")

    def __init__(
        self, kind: BlockKind, text: str = "", name: str | None = None, call_id: str | None = None
    ) -> None:
        self.kind: BlockKind = kind
        self.name = name
        self.call_id = call_id
        # Deltas are kept as a list and joined when read: += on a long str per token is
        # quadratic, and the console reads a stream's text a few times a second at most.
        self._parts: list[str] = [text] if text else []
        self._joined: str | None = text

    def add(self, text: str) -> None:
        if text:
            self._parts.append(text)
            self._joined = None

    def replace(self, text: str) -> None:
        self._parts = [text] if text else []
        self._joined = text

    @property
    def text(self) -> str:
        if self._joined is None:
            self._joined = "".join(self._parts)
            self._parts = [self._joined] if self._joined else []
        return self._joined

    def __repr__(self) -> str:
        extra = f" {self.name!r}" if self.name else ""
        return f"Block({self.kind}{extra}: {self.text!r})"


@dataclass(slots=True)
class Message:
    role: str
    blocks: list[Block] = field(default_factory=list)

    def append(self, kind: BlockKind, text: str) -> Block:
        """Add ``text`` to the last block if it is of ``kind``, else start a new block."""
        if self.blocks and self.blocks[-1].kind == kind and kind not in ("tool_call", "other"):
            block = self.blocks[-1]
            block.add(text)
            return block
        block = Block(kind, text)
        self.blocks.append(block)
        return block


@dataclass(slots=True)
class Conversation:
    """What a body or stream says, whichever API it is in."""

    api: Api | None = None
    kind: Literal["request", "response", "stream", "error"] = "stream"
    model: str | None = None
    id: str | None = None
    messages: list[Message] = field(default_factory=list)
    tools: list[str] = field(default_factory=list)
    """Names of the tools a request declares."""
    finish: str | None = None
    """``finish_reason`` (chat) or the response's ``status`` (+ why, when incomplete)."""
    usage: tuple[int, int, int, int] | None = None
    """``(input, cached, output, reasoning)`` tokens, as the body or stream reported them."""
    error: str | None = None
    events: Counter[str] = field(default_factory=Counter)
    """Stream events by type (chat chunks count as ``chunk``)."""
    deltas: int = 0
    """Content-bearing deltas (text, reasoning, refusal, tool arguments): a token estimate."""
    first_delta_event: int | None = None
    """The number of events seen when the first content-bearing delta arrived."""

    def message(self, role: str = "assistant") -> Message:
        if not self.messages:
            self.messages.append(Message(role))
        return self.messages[-1]

    @property
    def blocks(self) -> list[Block]:
        return [block for message in self.messages for block in message.blocks]

    def text(self, kind: BlockKind = "text") -> str:
        """All blocks of ``kind`` joined (handy in tests and summaries)."""
        return "".join(block.text for block in self.blocks if block.kind == kind)


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _error_text(error: Any) -> str:
    if isinstance(error, dict):
        message = error.get("message")
        code = error.get("code") or error.get("type")
        text = message if isinstance(message, str) else str(error)
        return f"{text} ({code})" if code and str(code) not in text else text
    return str(error)


# --- streams -----------------------------------------------------------------------------------


class StreamAssembler:
    """Feed the parsed events of one stream in order; read ``conversation`` at any time."""

    def __init__(self) -> None:
        self.conversation = Conversation(kind="stream")
        self._chat_choices: dict[int, Message] = {}
        self._chat_tools: dict[tuple[int, int], Block] = {}
        self._splitters: dict[int, ThinkTagSplitter] = {}
        self._items: dict[Any, Block] = {}
        self._seen = 0
        self._last_delta: tuple[Any, Any, Any, Block] | None = None
        """The block the previous Responses delta went to, with its item id, type and part."""

    def feed(self, event: Any) -> None:
        """One event's JSON (``[DONE]`` and non-objects are counted and otherwise ignored)."""
        self._seen += 1
        conversation = self.conversation
        if not isinstance(event, dict):
            conversation.events["(not an object)"] += 1
            return
        event_type = event.get("type")
        if conversation.api is None:
            if isinstance(event_type, str) and (
                event_type.startswith("response.") or event_type == "error"
            ):
                conversation.api = "responses"
            elif "choices" in event or event.get("object") == "chat.completion.chunk":
                conversation.api = "chat"
            elif "error" in event:
                conversation.events["error"] += 1
                conversation.error = _error_text(event["error"])
                return
        if conversation.api == "responses":
            conversation.events[event_type if isinstance(event_type, str) else "(untyped)"] += 1
            last = self._last_delta
            if (
                last is not None
                and event_type == last[1]
                and event.get("item_id") == last[0]
                and event.get("content_index", event.get("summary_index")) == last[2]
            ):
                # The common case, once per token: one more delta for the same part.
                delta = event.get("delta")
                if type(delta) is str and delta:
                    self._delta()
                    last[3].add(delta)
                return
            self._responses_event(event, event_type)
        else:
            conversation.events["chunk"] += 1
            if not self._chat_fast(event):
                self._chat_chunk(event)

    def done(self) -> None:
        """``data: [DONE]``."""
        self.conversation.events["[DONE]"] += 1

    def feed_data(self, payload: bytes) -> None:
        """One SSE event's ``data``: ``[DONE]``, a JSON event, or counted as malformed."""
        if payload == DONE_DATA:
            self.done()
            return
        try:
            event = orjson.loads(payload)
        except orjson.JSONDecodeError:
            self.conversation.events["(malformed)"] += 1
            return
        self.feed(event)

    def close(self) -> Conversation:
        """End of stream: release text held back by think-tag splitting."""
        for index, splitter in self._splitters.items():
            for reasoning, text in splitter.close():
                self._chat_choices[index].append("reasoning" if reasoning else "text", text)
        self._splitters.clear()
        return self.conversation

    def _delta(self) -> None:
        conversation = self.conversation
        conversation.deltas += 1
        if conversation.first_delta_event is None:
            conversation.first_delta_event = self._seen

    # chat chunks

    def _chat_fast(self, chunk: dict[str, Any]) -> bool:
        """The common chunk, once per token: one choice whose delta is only text, past any
        think tags, nothing else to note. ``False``: take the general path."""
        choices = chunk.get("choices")
        if type(choices) is not list or len(choices) != 1 or not self._chat_choices:
            return False
        choice = choices[0]
        if type(choice) is not dict or choice.get("finish_reason") is not None:
            return False
        delta = choice.get("delta")
        if type(delta) is not dict or len(delta) != 1:
            return False
        content = delta.get("content")
        index = choice.get("index", 0)
        splitter = self._splitters.get(index)  # type: ignore[arg-type]
        if type(content) is not str or splitter is None or not splitter.settled:
            return False
        if chunk.get("usage") is not None or chunk.get("error"):
            return False
        if content:
            self._delta()
            self._chat_choices[index].append("text", content)  # type: ignore[index]
        return True

    def _chat_chunk(self, chunk: dict[str, Any]) -> None:
        conversation = self.conversation
        if not conversation.model and isinstance(chunk.get("model"), str):
            conversation.model = chunk["model"] or None
        if not conversation.id and isinstance(chunk.get("id"), str):
            conversation.id = chunk["id"] or None
        if chunk.get("error"):
            conversation.error = _error_text(chunk["error"])
        tokens = usage_tokens(chunk.get("usage"))
        if tokens is not None:
            conversation.usage = tokens
        for choice in _list(chunk.get("choices")):
            if not isinstance(choice, dict):
                continue
            index = choice.get("index")
            index = index if isinstance(index, int) else 0
            message = self._chat_choices.get(index)
            if message is None:
                message = self._chat_choices[index] = Message("assistant")
                conversation.messages.append(message)
            delta = _dict(choice.get("delta"))
            self._chat_delta(index, message, delta)
            finish = choice.get("finish_reason")
            if isinstance(finish, str) and finish:
                conversation.finish = finish

    def _chat_delta(self, index: int, message: Message, delta: dict[str, Any]) -> None:
        # One spelling of reasoning per delta: OpenRouter sends the same text as both
        # "reasoning" and "reasoning_details".
        reasoning = _str(delta.get("reasoning_content")) or _str(delta.get("reasoning"))
        if not reasoning:
            for detail in _list(delta.get("reasoning_details")):
                reasoning += _str(_dict(detail).get("text")) or _str(_dict(detail).get("summary"))
        if reasoning:
            self._delta()
            message.append("reasoning", reasoning)
        content = delta.get("content")
        if isinstance(content, str) and content:
            self._delta()
            splitter = self._splitters.get(index)
            if splitter is None:
                splitter = self._splitters[index] = ThinkTagSplitter()
            for is_reasoning, text in splitter.feed(content):
                message.append("reasoning" if is_reasoning else "text", text)
        refusal = delta.get("refusal")
        if isinstance(refusal, str) and refusal:
            self._delta()
            message.append("refusal", refusal)
        for call in _list(delta.get("tool_calls")):
            if not isinstance(call, dict):
                continue
            position = call.get("index")
            key = (index, position if isinstance(position, int) else len(self._chat_tools))
            function = _dict(call.get("function"))
            block = self._chat_tools.get(key)
            if block is None:
                block = self._chat_tools[key] = Block("tool_call")
                message.blocks.append(block)
            if isinstance(call.get("id"), str) and call["id"]:
                block.call_id = call["id"]
            if isinstance(function.get("name"), str) and function["name"]:
                block.name = function["name"]
            arguments = _str(function.get("arguments"))
            if arguments:
                self._delta()
                block.add(arguments)

    # Responses events

    def _responses_event(self, event: dict[str, Any], event_type: Any) -> None:
        conversation = self.conversation
        if event_type == "error":
            conversation.error = _error_text(event.get("error") or event)
            return
        if not isinstance(event_type, str):
            return
        response = event.get("response")
        if isinstance(response, dict):
            self._response_object(response)
            return
        kind = _DELTA_KINDS.get(event_type)
        if kind is not None:
            delta = _str(event.get("delta"))
            block = self._item_block(event, kind)
            if delta:
                self._delta()
                block.add(delta)
            item_id = event.get("item_id")
            if isinstance(item_id, str):
                part = event.get("content_index", event.get("summary_index"))
                self._last_delta = (item_id, event_type, part, block)
            return
        if event_type == "response.output_item.added":
            self._item_added(event)
        elif event_type == "response.output_item.done":
            self._item_done(event)
        elif event_type == "response.function_call_arguments.done":
            block = self._item_block(event, "tool_call")
            arguments = _str(event.get("arguments"))
            if arguments and not block.text:
                block.replace(arguments)

    def _response_object(self, response: dict[str, Any]) -> None:
        conversation = self.conversation
        if isinstance(response.get("model"), str) and response["model"]:
            conversation.model = response["model"]
        if isinstance(response.get("id"), str) and response["id"]:
            conversation.id = response["id"]
        status = response.get("status")
        if isinstance(status, str) and status not in ("in_progress", "queued"):
            reason = _dict(response.get("incomplete_details")).get("reason")
            conversation.finish = f"{status} ({reason})" if reason else status
            if not conversation.messages or not conversation.blocks:
                # A terminal Response whose items never streamed (or a plain JSON echo).
                for item in _list(response.get("output")):
                    _response_item(conversation.message(), item)
        if response.get("error"):
            conversation.error = _error_text(response["error"])
        tokens = usage_tokens(response.get("usage"))
        if tokens is not None:
            conversation.usage = tokens

    def _keys(self, event: dict[str, Any]) -> list[Any]:
        keys: list[Any] = []
        if isinstance(event.get("item_id"), str):
            keys.append(("id", event["item_id"]))
        if isinstance(event.get("output_index"), int):
            keys.append(("index", event["output_index"]))
        return keys

    def _item_block(self, event: dict[str, Any], kind: BlockKind) -> Block:
        # Items without output_index or item_id (llama.cpp) share one key per kind and part.
        keys = self._keys(event) or [("none", None)]
        part = (
            None if kind == "tool_call" else event.get("summary_index", event.get("content_index"))
        )
        for key in keys:
            block = self._items.get((key, kind, part))
            if block is not None:
                return block
        block = Block(kind)
        self.conversation.message().blocks.append(block)
        for key in keys:
            self._items[(key, kind, part)] = block
        return block

    def _item_added(self, event: dict[str, Any]) -> None:
        item = _dict(event.get("item"))
        item_type = item.get("type")
        keys = self._keys(event)
        if isinstance(item.get("id"), str):
            keys.append(("id", item["id"]))
        if item_type in ("function_call", "custom_tool_call"):
            block = Block(
                "tool_call",
                _str(item.get("arguments")) or _str(item.get("input")),
                name=_str(item.get("name")) or None,
                call_id=_str(item.get("call_id")) or None,
            )
            self.conversation.message().blocks.append(block)
            for key in keys:
                self._items[(key, "tool_call", None)] = block

    def _item_done(self, event: dict[str, Any]) -> None:
        item = _dict(event.get("item"))
        keys = self._keys(event)
        if isinstance(item.get("id"), str):
            keys.append(("id", item["id"]))
        known = any(stored[0] in keys for stored in self._items)
        if known:
            if item.get("type") in ("function_call", "custom_tool_call"):
                for key in keys:
                    block = self._items.get((key, "tool_call", None))
                    if block is not None:
                        final = _str(item.get("arguments")) or _str(item.get("input"))
                        if final and not block.text:
                            block.replace(final)
                        block.name = block.name or _str(item.get("name")) or None
                        break
            return
        # An item that streamed no deltas (a tool call sent whole, an empty reasoning item).
        _response_item(self.conversation.message(), item)


_DELTA_KINDS: dict[str, BlockKind] = {
    "response.output_text.delta": "text",
    "response.refusal.delta": "refusal",
    "response.reasoning_text.delta": "reasoning",
    "response.reasoning_summary_text.delta": "reasoning",
    "response.function_call_arguments.delta": "tool_call",
    "response.custom_tool_call_input.delta": "tool_call",
}


# --- whole bodies ------------------------------------------------------------------------------


def _content_text(content: Any) -> list[tuple[BlockKind, str]]:
    """A message's ``content`` (a string or a list of parts of either API) as blocks."""
    if isinstance(content, str):
        return [("text", content)] if content else []
    pieces: list[tuple[BlockKind, str]] = []
    for part in _list(content):
        if isinstance(part, str):
            pieces.append(("text", part))
            continue
        part = _dict(part)
        part_type = _str(part.get("type"))
        if part_type == "refusal":
            pieces.append(("refusal", _str(part.get("refusal"))))
        elif part_type in ("reasoning_text", "summary_text"):
            pieces.append(("reasoning", _str(part.get("text"))))
        elif "text" in part and isinstance(part["text"], str):
            pieces.append(("text", part["text"]))
        elif part_type:
            pieces.append(("other", f"[{part_type}]"))
    return pieces


def _response_item(message: Message, item: Any) -> None:
    """One Responses output or input item into ``message``."""
    item = _dict(item)
    item_type = item.get("type")
    if item_type in ("function_call", "custom_tool_call"):
        arguments = _str(item.get("arguments")) or _str(item.get("input"))
        message.blocks.append(
            Block(
                "tool_call",
                arguments,
                name=_str(item.get("name")) or None,
                call_id=_str(item.get("call_id")) or None,
            )
        )
    elif item_type in ("function_call_output", "custom_tool_call_output"):
        output = item.get("output")
        text = output if isinstance(output, str) else "".join(t for _k, t in _content_text(output))
        message.blocks.append(Block("tool_result", text, call_id=_str(item.get("call_id")) or None))
    elif item_type == "reasoning":
        texts = [_str(_dict(part).get("text")) for part in _list(item.get("summary"))]
        texts += [_str(_dict(part).get("text")) for part in _list(item.get("content"))]
        text = "\n".join(text for text in texts if text)
        if text:
            message.append("reasoning", text)
    elif item_type == "message" or (item_type is None and "content" in item):
        for kind, text in _content_text(item.get("content")):
            message.append(kind, text)
    elif isinstance(item_type, str):
        message.blocks.append(Block("other", f"[{item_type}]"))


def _chat_message(body: dict[str, Any]) -> Message:
    message = Message(_str(body.get("role")) or "assistant")
    reasoning = _str(body.get("reasoning_content")) or _str(body.get("reasoning"))
    if reasoning:
        message.append("reasoning", reasoning)
    content = body.get("content")
    if isinstance(content, str) and message.role == "assistant" and "<think>" in content:
        splitter = ThinkTagSplitter()
        for is_reasoning, text in splitter.feed(content) + splitter.close():
            message.append("reasoning" if is_reasoning else "text", text)
    else:
        kind: BlockKind = "tool_result" if message.role == "tool" else "text"
        for piece_kind, text in _content_text(content):
            block = message.append(kind if piece_kind == "text" else piece_kind, text)
            if kind == "tool_result":
                block.call_id = _str(body.get("tool_call_id")) or None
    if isinstance(body.get("refusal"), str) and body["refusal"]:
        message.append("refusal", body["refusal"])
    for call in _list(body.get("tool_calls")):
        call = _dict(call)
        function = _dict(call.get("function"))
        message.blocks.append(
            Block(
                "tool_call",
                _str(function.get("arguments")),
                name=_str(function.get("name")) or None,
                call_id=_str(call.get("id")) or None,
            )
        )
    return message


def _tool_names(tools: Any) -> list[str]:
    names = []
    for tool in _list(tools):
        tool = _dict(tool)
        name = _str(tool.get("name")) or _str(_dict(tool.get("function")).get("name"))
        names.append(name or _str(tool.get("type")) or "?")
    return names


def assemble_body(body: Any) -> Conversation | None:
    """A JSON body of either API (request, response or error); ``None`` if it is none."""
    if not isinstance(body, dict):
        return None
    obj = body.get("object")
    model = _str(body.get("model")) or None
    if obj == "chat.completion":
        conversation = Conversation("chat", "response", model, _str(body.get("id")) or None)
        for choice in _list(body.get("choices")):
            choice = _dict(choice)
            conversation.messages.append(_chat_message(_dict(choice.get("message"))))
            if isinstance(choice.get("finish_reason"), str):
                conversation.finish = choice["finish_reason"]
        conversation.usage = usage_tokens(body.get("usage"))
        return conversation
    if obj == "response":
        conversation = Conversation("responses", "response", model, _str(body.get("id")) or None)
        message = conversation.message()
        for item in _list(body.get("output")):
            _response_item(message, item)
        status = _str(body.get("status")) or None
        reason = _dict(body.get("incomplete_details")).get("reason")
        conversation.finish = f"{status} ({reason})" if status and reason else status
        if body.get("error"):
            conversation.error = _error_text(body["error"])
        conversation.usage = usage_tokens(body.get("usage"))
        return conversation
    if "messages" in body and isinstance(body["messages"], list):
        conversation = Conversation("chat", "request", model)
        for message in body["messages"]:
            conversation.messages.append(_chat_message(_dict(message)))
        conversation.tools = _tool_names(body.get("tools"))
        return conversation
    if "input" in body or "instructions" in body or "previous_response_id" in body:
        conversation = Conversation("responses", "request", model)
        if isinstance(body.get("instructions"), str) and body["instructions"]:
            conversation.messages.append(
                Message("instructions", [Block("text", body["instructions"])])
            )
        if isinstance(body.get("previous_response_id"), str):
            note = f"continues {body['previous_response_id']}"
            conversation.messages.append(Message("context", [Block("other", note)]))
        items = body.get("input")
        if isinstance(items, str):
            conversation.messages.append(Message("user", [Block("text", items)]))
        for item in _list(items):
            item = _dict(item)
            role = _str(item.get("role"))
            if role:
                message = Message(role)
                for kind, text in _content_text(item.get("content")):
                    message.append(kind, text)
                conversation.messages.append(message)
            else:
                previous = conversation.messages[-1] if conversation.messages else None
                if previous is None or previous.role != "items":
                    previous = Message("items")
                    conversation.messages.append(previous)
                _response_item(previous, item)
        conversation.tools = _tool_names(body.get("tools"))
        return conversation
    if "error" in body and len(body) <= 2:
        return Conversation(kind="error", error=_error_text(body["error"]))
    return None
