"""Responses stream events → Chat Completions chunks (a chat client over a Responses upstream).

A state machine fed one parsed event at a time. It sends the role once, numbers tool calls
0..k-1 in the order they start (independent of ``output_index``) with their ``id`` and
``name`` in the first delta only — openai-python's accumulator concatenates every string it
sees twice — renders reasoning as the configured :data:`ReasoningMode`, takes the finish
reason from the terminal event, adds the usage chunk only when the client asked for it, and
ends with ``[DONE]``. A failure (``response.failed``, ``error``, or an upstream that stops
without a terminal event) becomes an error chunk, which openai-python raises as ``APIError``.

Every event type of the Responses stream is decided here, in :data:`TRANSLATED_EVENTS` or
:data:`DROPPED_EVENTS`; a type in neither (one newer than this module) is ignored too.

- Text, refusal, reasoning (summary and raw text, in the configured rendering) and
  function/custom tool call deltas become the matching chat deltas. Their ``*.done`` events
  repeat what the deltas said, so they count only for an item that streamed no delta at all
  (some servers send text only there).
- Lifecycle events (``created``, ``in_progress``, ``queued``) only start the stream; part
  boundaries (``content_part.*``, ``reasoning_summary_part.*``) need no chunk of their own: a
  new summary part is separated by a blank line in front of its first delta.
- ``output_text.annotation.added`` is dropped: a chunk has no annotations field, and citation
  offsets into one Responses text part would be wrong in the concatenated chat content.
- Hosted tool progress (web/file search, code interpreter, image generation, MCP, shell,
  compaction) and audio are dropped: a chat client can neither run nor show those items, and
  the model's answer about them arrives as ordinary text.
"""

from __future__ import annotations

from typing import Any, Final

import orjson

from llmitm.translate.context import TranslationContext
from llmitm.wire.errors import ApiError, chat_error_chunk, normalise_error
from llmitm.wire.usage import responses_usage_to_chat

DONE: Final = "[DONE]"
"""Marker in the output list for the ``data: [DONE]`` frame."""

Frame = dict[str, Any] | str

THINK_OPEN: Final = "<think>\n"
THINK_CLOSE: Final = "\n</think>\n\n"
PART_SEPARATOR: Final = "\n\n"

_INCOMPLETE_FINISH = {"max_output_tokens": "length", "content_filter": "content_filter"}


class _Call:
    """A tool call being relayed: its chat index and whether its arguments were sent."""

    __slots__ = ("closed", "custom", "index", "sent_arguments")

    def __init__(self, index: int, custom: bool) -> None:
        self.index = index
        self.custom = custom
        self.sent_arguments = False
        self.closed = False


class ResponsesToChatStream:
    """Translate one Responses event stream into chat completion chunks."""

    fast_chunk = None
    response_id = None  # a chat client's stream names no Response
    final_response = None

    def __init__(self, context: TranslationContext | None = None) -> None:
        self.context = context or TranslationContext()
        self._reasoning_mode = self.context.options.reasoning
        self._include_usage = self.context.include_usage
        self._chunk_id = ""
        self._created = 0
        self._model = self.context.model or ""
        self._started = False
        self.finished = False
        self._calls: dict[str, _Call] = {}
        self._call_count = 0
        self._think_open = False
        self._reasoning_started = False
        # Whether the current message or reasoning item sent deltas; some servers put text
        # only in the *.done events, and it must not be lost.
        self._item_streamed = False
        # Whether a *.done event supplied the current item's text (it streamed no delta).
        self._item_done_sent = False
        self._content_prefix = b""
        self._content_suffix = b""
        self._summary_key: tuple[Any, Any] | None = None
        self.error: ApiError | None = None
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None

    # -- public -------------------------------------------------------------------------

    def feed(self, event: dict[str, Any]) -> list[Frame]:
        """Translate one event; returns chunk dicts and possibly :data:`DONE`."""
        if self.finished:
            return []
        event_type = event.get("type")
        if event_type == "response.output_text.delta":
            # The hot path: one text delta, one chunk.
            out = [] if self._started else self._start(event.get("response"))
            if self._think_open:
                out.append(self._close_think())
            self._item_streamed = True
            out.append(self._chunk({"content": event.get("delta") or ""}))
            return out
        out = [] if self._started else self._start(event.get("response"))
        handler = _HANDLERS.get(event_type)  # type: ignore[arg-type]
        if handler is not None:
            handler(self, event, out)
        return out

    def close(self) -> list[Frame]:
        """The upstream ended; without a terminal event that is an error, never a clean end."""
        if self.finished:
            return []
        out = [] if self._started else self._start(None)
        error = ApiError(
            message="The upstream Responses stream ended before a terminal event "
            "(response.completed, response.incomplete or response.failed).",
            type="server_error",
            code="server_error",
            status=502,
        )
        self._fail(error, out)
        return out

    def fail(self, error: ApiError) -> list[Frame]:
        """End the stream with ``error`` (used by the proxy when the upstream breaks)."""
        if self.finished:
            return []
        out = [] if self._started else self._start(None)
        self._fail(error, out)
        return out

    # -- chunk building -----------------------------------------------------------------

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        chunk = {
            "id": self._chunk_id,
            "object": "chat.completion.chunk",
            "created": self._created,
            "model": self._model,
            "choices": [
                {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            ],
        }
        if self._include_usage:
            chunk["usage"] = None
        return chunk

    def _start(self, response: Any) -> list[Frame]:
        """First event: fix id, created and model, and send the role chunk."""
        self._started = True
        response = response if isinstance(response, dict) else {}
        response_id = response.get("id")
        options = self.context.options
        self._chunk_id = (
            f"chatcmpl-{response_id}"
            if isinstance(response_id, str)
            else "chatcmpl-" + options.ids("chatcmpl").partition("_")[2]
        )
        created = response.get("created_at")
        self._created = created if isinstance(created, int) else int(options.clock())
        if not self._model:
            model = response.get("model")
            self._model = model if isinstance(model, str) else ""
        # What _chunk({"content": …}) serialises to around the text, for fast_frame.
        self._content_prefix = (
            b'data: {"id":'
            + orjson.dumps(self._chunk_id)
            + b',"object":"chat.completion.chunk","created":'
            + str(self._created).encode()
            + b',"model":'
            + orjson.dumps(self._model)
            + b',"choices":[{"index":0,"delta":{"content":'
        )
        self._content_suffix = (
            b'},"logprobs":null,"finish_reason":null}]'
            + (b',"usage":null' if self._include_usage else b"")
            + b"}\n\n"
        )
        return [self._chunk({"role": "assistant", "content": "", "refusal": None})]

    def fast_frame(
        self, event: dict[str, Any], frame: bytes = b"", data: bytes = b""
    ) -> bytes | None:
        """The encoded chunk for a plain text delta, or ``None`` to take the general path.
        The hot path of this direction: no chunk dict, no generic serialisation."""
        if (
            event.get("type") != "response.output_text.delta"
            or not self._started
            or self._think_open
            or self.finished
        ):
            return None
        self._item_streamed = True
        return b"%b%b%b" % (
            self._content_prefix,
            orjson.dumps(event.get("delta") or ""),
            self._content_suffix,
        )

    # -- reasoning ----------------------------------------------------------------------

    def _reasoning_delta(self, event: dict[str, Any], out: list[Frame]) -> None:
        self._item_streamed = True
        self._reasoning(event, event.get("delta") or "", out)

    def _reasoning(self, event: dict[str, Any], text: str, out: list[Frame]) -> None:
        """Render one piece of reasoning; ``event`` names its item and part."""
        mode = self._reasoning_mode
        if mode == "drop":
            return
        key = (event.get("item_id"), event.get("summary_index", event.get("content_index")))
        if self._reasoning_started and key != self._summary_key:
            text = PART_SEPARATOR + text
        self._summary_key = key
        self._reasoning_started = True
        if mode == "think-tags":
            if not self._think_open:
                self._think_open = True
                text = THINK_OPEN + text.removeprefix(PART_SEPARATOR)
            out.append(self._chunk({"content": text}))
        else:
            out.append(self._chunk({mode: text}))

    def _close_think(self) -> dict[str, Any]:
        self._think_open = False
        return self._chunk({"content": THINK_CLOSE})

    def _end_reasoning(self, out: list[Frame]) -> None:
        if self._think_open:
            out.append(self._close_think())

    # -- items ----------------------------------------------------------------------------

    def _item_added(self, event: dict[str, Any], out: list[Frame]) -> None:
        item = event.get("item")
        if not isinstance(item, dict):
            return
        if item.get("type") in ("function_call", "custom_tool_call"):
            self._open_call(item, out)
        else:
            self._item_streamed = False
            self._item_done_sent = False

    def _open_call(self, item: dict[str, Any], out: list[Frame]) -> _Call:
        self._end_reasoning(out)
        call = _Call(self._call_count, item.get("type") == "custom_tool_call")
        self._call_count += 1
        self._calls[_item_key(item)] = call
        name = item.get("name") or ""
        if item.get("namespace"):
            name = f"{item['namespace']}__{name}"
        call_id = item.get("call_id") or item.get("id") or self.context.options.ids("call")
        out.append(
            self._chunk(
                {
                    "tool_calls": [
                        {
                            "index": call.index,
                            "id": call_id,
                            "type": "function",
                            "function": {"name": name, "arguments": ""},
                        }
                    ]
                }
            )
        )
        return call

    def _arguments(self, call: _Call, fragment: str) -> dict[str, Any]:
        call.sent_arguments = True
        return self._chunk(
            {"tool_calls": [{"index": call.index, "function": {"arguments": fragment}}]}
        )

    def _arguments_delta(self, event: dict[str, Any], out: list[Frame]) -> None:
        call = self._calls.get(_event_key(event))
        delta = event.get("delta")
        if call is None or not isinstance(delta, str) or not delta:
            return
        if call.custom:
            # A chat client only knows function calls: a custom tool's raw input travels as
            # the JSON arguments {"input": "..."}, streamed as escaped string fragments.
            fragment = orjson.dumps(delta).decode()[1:-1]
            delta = fragment if call.sent_arguments else '{"input":"' + fragment
        out.append(self._arguments(call, delta))

    def _arguments_done(self, event: dict[str, Any], out: list[Frame]) -> None:
        """The whole arguments (or custom input): sent only when no delta carried them."""
        call = self._calls.get(_event_key(event))
        if call is None or call.closed:
            return
        if call.custom:
            self._close_custom(call, event.get("input"), out)
        elif not call.sent_arguments:
            arguments = event.get("arguments")
            if isinstance(arguments, str) and arguments:
                out.append(self._arguments(call, arguments))

    def _close_custom(self, call: _Call, tool_input: Any, out: list[Frame]) -> None:
        """End a custom call's JSON arguments, from ``tool_input`` if nothing streamed."""
        if call.sent_arguments:
            out.append(self._arguments(call, '"}'))
        else:
            text = tool_input if isinstance(tool_input, str) else ""
            out.append(self._arguments(call, orjson.dumps({"input": text}).decode()))
        call.closed = True

    def _text_done(self, event: dict[str, Any], out: list[Frame]) -> None:
        """A text, refusal or reasoning ``*.done``: its text, when the item streamed none."""
        if self._item_streamed:
            return
        event_type = event.get("type")
        text = event.get("refusal" if event_type == "response.refusal.done" else "text")
        if not isinstance(text, str) or not text:
            return
        self._item_done_sent = True
        if event_type in ("response.output_text.done", "response.refusal.done"):
            self._end_reasoning(out)
            field = "content" if event_type == "response.output_text.done" else "refusal"
            out.append(self._chunk({field: text}))
        else:
            self._reasoning(event, text, out)

    def _item_done(self, event: dict[str, Any], out: list[Frame]) -> None:
        item = event.get("item")
        if not isinstance(item, dict):
            return
        item_type = item.get("type")
        if item_type in ("message", "reasoning"):
            if not (self._item_streamed or self._item_done_sent):
                self._unstreamed_item(item, out)
            return
        if item_type not in ("function_call", "custom_tool_call"):
            return
        call = self._calls.get(_item_key(item))
        if call is None:
            # A provider that skipped output_item.added: send the whole call now.
            call = self._open_call(item, out)
        if call.closed:
            return
        if call.custom:
            self._close_custom(call, item.get("input"), out)
        elif not call.sent_arguments:
            arguments = item.get("arguments") or ""
            if arguments:
                out.append(self._arguments(call, arguments))
        call.closed = True

    def _unstreamed_item(self, item: dict[str, Any], out: list[Frame]) -> None:
        """A message or reasoning item whose text came only in its done event."""
        item_id = item.get("id")
        if item.get("type") == "reasoning":
            texts = [p.get("text") for p in item.get("summary") or [] if isinstance(p, dict)]
            texts += [p.get("text") for p in item.get("content") or [] if isinstance(p, dict)]
            for index, text in enumerate(t for t in texts if isinstance(t, str) and t):
                self._reasoning({"item_id": item_id, "summary_index": index}, text, out)
            return
        for part in item.get("content") or []:
            if not isinstance(part, dict):
                continue
            if part.get("type") == "output_text" and part.get("text"):
                self._end_reasoning(out)
                out.append(self._chunk({"content": part["text"]}))
            elif part.get("type") == "refusal" and part.get("refusal"):
                self._end_reasoning(out)
                out.append(self._chunk({"refusal": part["refusal"]}))

    # -- terminal -----------------------------------------------------------------------

    def _terminal(self, event: dict[str, Any], out: list[Frame]) -> None:
        response = event.get("response")
        response = response if isinstance(response, dict) else {}
        self._end_reasoning(out)
        for call in self._calls.values():
            if call.custom and call.sent_arguments and not call.closed:
                # Cut before its done event: still hand the client parseable JSON.
                out.append(self._arguments(call, '"}'))
                call.closed = True
        if event.get("type") == "response.incomplete":
            details = response.get("incomplete_details")
            reason = details.get("reason") if isinstance(details, dict) else None
            finish = _INCOMPLETE_FINISH.get(reason, "length")  # type: ignore[arg-type]
        else:
            finish = "tool_calls" if self._call_count else "stop"
        self.finish_reason = finish
        out.append(self._chunk({}, finish))
        self.usage = responses_usage_to_chat(response.get("usage"))
        if self._include_usage:
            out.append(
                {
                    "id": self._chunk_id,
                    "object": "chat.completion.chunk",
                    "created": self._created,
                    "model": self._model,
                    "choices": [],
                    "usage": self.usage,
                }
            )
        out.append(DONE)
        self.finished = True

    def _failed(self, event: dict[str, Any], out: list[Frame]) -> None:
        response = event.get("response")
        error = response.get("error") if isinstance(response, dict) else None
        self._fail(normalise_error(error or "The upstream response failed.", 500), out)

    def _error_event(self, event: dict[str, Any], out: list[Frame]) -> None:
        # The live API nests the error; the spec documents it flat. Read both. In the flat
        # form "type" is the event's own type ("error"), not the error's: leave it out so
        # the client does not get an error of type "error".
        payload = event.get("error")
        if not isinstance(payload, dict):
            payload = {key: value for key, value in event.items() if key != "type"}
        self._fail(normalise_error(payload, 500), out)

    def _fail(self, error: ApiError, out: list[Frame]) -> None:
        self._end_reasoning(out)
        self.error = error
        out.append(chat_error_chunk(error))
        out.append(DONE)
        self.finished = True


def _item_key(item: dict[str, Any]) -> str:
    return str(item.get("id") or item.get("call_id"))


def _event_key(event: dict[str, Any]) -> str:
    return str(event.get("item_id"))


def _refusal_delta(self: ResponsesToChatStream, event: dict[str, Any], out: list[Frame]) -> None:
    self._end_reasoning(out)
    self._item_streamed = True
    out.append(self._chunk({"refusal": event.get("delta") or ""}))


_HANDLERS = {
    "response.reasoning_summary_text.delta": ResponsesToChatStream._reasoning_delta,
    "response.reasoning_text.delta": ResponsesToChatStream._reasoning_delta,
    "response.refusal.delta": _refusal_delta,
    "response.output_text.done": ResponsesToChatStream._text_done,
    "response.refusal.done": ResponsesToChatStream._text_done,
    "response.reasoning_summary_text.done": ResponsesToChatStream._text_done,
    "response.reasoning_text.done": ResponsesToChatStream._text_done,
    "response.output_item.added": ResponsesToChatStream._item_added,
    "response.function_call_arguments.delta": ResponsesToChatStream._arguments_delta,
    "response.custom_tool_call_input.delta": ResponsesToChatStream._arguments_delta,
    "response.function_call_arguments.done": ResponsesToChatStream._arguments_done,
    "response.custom_tool_call_input.done": ResponsesToChatStream._arguments_done,
    "response.output_item.done": ResponsesToChatStream._item_done,
    "response.completed": ResponsesToChatStream._terminal,
    "response.incomplete": ResponsesToChatStream._terminal,
    "response.failed": ResponsesToChatStream._failed,
    "error": ResponsesToChatStream._error_event,
}

TRANSLATED_EVENTS: Final = frozenset({"response.output_text.delta", *_HANDLERS})
"""Event types that produce chunks (``output_text.delta`` has its own hot path in feed)."""

DROPPED_EVENTS: Final = frozenset(
    {
        # Lifecycle: the first event of any kind starts the stream (role chunk).
        "response.created",
        "response.in_progress",
        "response.queued",
        # Part boundaries: a chat message is one text, parts are separated in _reasoning.
        "response.content_part.added",
        "response.content_part.done",
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_part.done",
        # No field in a chunk, and offsets would not survive the concatenation.
        "response.output_text.annotation.added",
        # Audio output: a translated chat request asks for text only.
        "response.audio.delta",
        "response.audio.done",
        "response.audio.transcript.delta",
        "response.audio.transcript.done",
        # Hosted tools ran (or would run) on the server: nothing for a chat client to do.
        "response.code_interpreter_call_code.delta",
        "response.code_interpreter_call_code.done",
        "response.code_interpreter_call.completed",
        "response.code_interpreter_call.in_progress",
        "response.code_interpreter_call.interpreting",
        "response.file_search_call.completed",
        "response.file_search_call.in_progress",
        "response.file_search_call.searching",
        "response.web_search_call.completed",
        "response.web_search_call.in_progress",
        "response.web_search_call.searching",
        "response.image_generation_call.completed",
        "response.image_generation_call.generating",
        "response.image_generation_call.in_progress",
        "response.image_generation_call.partial_image",
        "response.mcp_call_arguments.delta",
        "response.mcp_call_arguments.done",
        "response.mcp_call.completed",
        "response.mcp_call.failed",
        "response.mcp_call.in_progress",
        "response.mcp_list_tools.completed",
        "response.mcp_list_tools.failed",
        "response.mcp_list_tools.in_progress",
        "response.shell_call_command.added",
        "response.shell_call_command.delta",
        "response.shell_call_command.done",
        "response.shell_call_output_content.delta",
        "response.shell_call_output_content.done",
        "response.compaction.compacting",
    }
)
"""Event types ignored on purpose (see the module docstring for why)."""
