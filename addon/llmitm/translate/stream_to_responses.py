"""Chat Completions chunks → Responses stream events (a Responses client over a chat upstream).

A state machine fed one parsed chunk at a time that emits the full lifecycle OpenAI's streams have:
``response.created`` and ``response.in_progress`` at once, then one output item at a time —
reasoning (from ``reasoning_content``, ``reasoning``, ``reasoning_details`` or ``<think>``
tags), message (text and refusal parts), function calls (keyed by the chunk's tool ``index``,
held until their id and name are known) — each opened with ``output_item.added`` and closed
with its ``*.done`` events, and exactly one terminal event whose ``response.output`` repeats the
done items with identical ids. ``sequence_number`` counts from 0 without gaps.

The terminal event waits for the trailing usage chunk, which chat upstreams send after the
finish reason; it is emitted at ``[DONE]`` or when the upstream closes.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson

from llmitm.translate.context import TranslationContext
from llmitm.translate.held_text import HeldText
from llmitm.translate.think_stream import ThinkTagSplitter
from llmitm.translate.tools import origin_of, restore_call
from llmitm.wire.errors import (
    ApiError,
    normalise_error,
    response_object_error,
    responses_error_event,
)
from llmitm.wire.frame_template import StringSlotTemplate
from llmitm.wire.objects import output_text_part, response_object
from llmitm.wire.usage import chat_usage_to_responses

Event = dict[str, Any]

logger = logging.getLogger(__name__)

_TEXT_DELTA_PREFIX = (
    b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta",'
    b'"sequence_number":'
)
_FILTERED_REFUSAL = "The response was blocked by the provider's content filter."
_CONTENT_PATH = ("choices", 0, "delta", "content")
_TEMPLATE_TRIES = 4


class _Reasoning:
    __slots__ = ("item_id", "output_index", "parts")

    def __init__(self, item_id: str, output_index: int) -> None:
        self.item_id = item_id
        self.output_index = output_index
        self.parts = HeldText()


class _Message:
    __slots__ = ("content", "fast_key", "fast_mid", "item_id", "output_index", "part_kind", "parts")

    def __init__(self, item_id: str, output_index: int) -> None:
        self.item_id = item_id
        self.output_index = output_index
        self.content: list[dict[str, Any]] = []  # closed parts
        self.part_kind: str | None = None  # "output_text" | "refusal" while a part is open
        self.parts = HeldText()  # fragments of the open part
        self.fast_key = -1  # the content index fast_mid was built for
        self.fast_mid = b""


class _Call:
    __slots__ = ("arguments", "call_id", "item_id", "name", "output_index", "pending")

    def __init__(self) -> None:
        self.call_id: str | None = None
        self.name = ""
        self.item_id = ""
        self.output_index = -1  # -1 until output_item.added was sent
        self.arguments = HeldText()
        self.pending: list[str] = []  # argument fragments received before it was added


class ChatToResponsesStream:
    """Translate one chat completion chunk stream into Responses events."""

    def __init__(self, context: TranslationContext | None = None) -> None:
        self.context = context or TranslationContext()
        options = self.context.options
        self._ids = options.ids
        self._clock = options.clock
        self._seq = 0
        self._response: dict[str, Any] | None = None
        self._output: list[dict[str, Any]] = []
        self._reasoning: _Reasoning | None = None
        self._message: _Message | None = None
        self._calls: dict[int, _Call] = {}
        self._open_calls: list[_Call] = []
        self._think = ThinkTagSplitter(options.think_open_missing)
        self._template: StringSlotTemplate | None = None
        self._template_tries = _TEMPLATE_TRIES
        self._upstream_model: str | None = None
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.finished = False
        self._saw_done = False
        self.error: ApiError | None = None
        self.final_response: dict[str, Any] | None = None
        """The terminal event's Response object (what the store keeps), once finished."""
        self.anomalies: list[str] = []
        """Upstream oddities worth a log line (deltas for a call already closed, …)."""
        self._other_choices = False
        """Whether a choice other than 0 (``n > 1``) was seen and dropped (warned once)."""

    # -- public -------------------------------------------------------------------------

    @property
    def response_id(self) -> str | None:
        return self._response["id"] if self._response is not None else None

    def start(self) -> list[Event]:
        """``response.created`` and ``response.in_progress``; send them before the upstream
        answers so clients with an idle timer (Codex) see the stream alive."""
        if self._response is not None:
            return []
        self._response = response_object(
            response_id=self.context.response_id or self._ids("resp"),
            created_at=int(self._clock()),
            model=self.context.model or self._upstream_model or "",
            echo=self.context.echo,
        )
        return [
            self._event("response.created", response=dict(self._response)),
            self._event("response.in_progress", response=dict(self._response)),
        ]

    def feed(self, chunk: dict[str, Any]) -> list[Event]:
        """Translate one chunk (a parsed ``data:`` object)."""
        if self.finished:
            return []
        out: list[Event] = []
        if self._response is None:
            model = chunk.get("model")
            self._upstream_model = model if isinstance(model, str) and model else None
            out = self.start()
        elif not self._response["model"]:
            # Azure's first chunk names no model; the terminal takes the first real one.
            model = chunk.get("model")
            if isinstance(model, str) and model:
                self._response["model"] = model
        usage = chunk.get("usage")
        if usage:
            # Read before the error check: OpenRouter's error chunk also carries the usage
            # of the failed generation, which response.failed should report.
            self.usage = usage
        error = chunk.get("error")
        if error:
            # OpenRouter and others report a failure inside an HTTP 200 stream.
            self._fail(normalise_error(error, 500), out, with_error_event=True)
            return out
        choices = chunk.get("choices")
        if not choices:
            return out  # usage chunk, Azure prompt-filter and async-filter frames
        choice = self._first_choice(choices)
        if choice is None:
            return out
        delta = choice.get("delta")
        if delta:
            self._delta(delta, choice, out)
        finish_reason = choice.get("finish_reason")
        if finish_reason:
            self.finish_reason = finish_reason
        return out

    def fast_chunk(self, frame: bytes) -> bytes | None:
        """The encoded ``output_text.delta`` for a raw upstream frame that is the learned text
        chunk template with other text (see :meth:`fast_frame`), or ``None``. The hottest path
        of this direction: only the text's string literal is parsed, not the whole chunk."""
        template = self._template
        if template is None:
            return None
        content = template.value(frame)
        message = self._message
        if (
            not content
            or message is None
            or message.part_kind != "output_text"
            or self.finished
            or not self._think.settled
        ):
            # (The response's model needs no check: a template is only learned once it is set.)
            return None
        return self._text_delta_frame(message, content)

    def fast_frame(
        self, chunk: dict[str, Any], frame: bytes = b"", data: bytes = b""
    ) -> bytes | None:
        """The encoded ``output_text.delta`` for a chunk that only adds text to the open text
        part, or ``None`` to take the general path. The hot path of this direction: no event
        dict, no generic serialisation — the same bytes the general path writes.

        Given the chunk's raw ``frame`` and its ``data``, the first such chunks also teach
        :meth:`fast_chunk` the bytes around their text (a few tries per stream, in case the
        upstream's first text chunks differ from the rest)."""
        message = self._message
        if (
            message is None
            or message.part_kind != "output_text"
            or self.finished
            or not self._think.settled
            or chunk.get("error")
            or chunk.get("usage")
            or not self._response["model"]  # type: ignore[index]  # the general path names it
        ):
            return None
        choices = chunk.get("choices")
        if type(choices) is not list or len(choices) != 1:
            return None
        choice = choices[0]
        if (
            type(choice) is not dict
            or choice.get("index", 0) != 0  # another choice's (n > 1): the general path drops it
            or choice.get("finish_reason")
            or choice.get("logprobs")
        ):
            return None
        delta = choice.get("delta")
        if type(delta) is not dict:
            return None
        content = delta.get("content")
        if type(content) is not str or not content:
            return None
        if len(delta) != 1:  # usually {"content": …} alone; else only role/nulls may ride along
            for key, value in delta.items():
                if value is not None and key != "content" and key != "role":
                    return None
        if frame and self._template_tries:
            # Whatever else this chunk holds passed the checks above, so another chunk with
            # the same bytes around a different text qualifies too.
            self._template_tries -= 1
            self._template = StringSlotTemplate.learn(frame, data, _CONTENT_PATH)
        return self._text_delta_frame(message, content)

    def _first_choice(self, choices: Any) -> dict[str, Any] | None:
        """Choice 0 of a chunk; the others (``n > 1``) have no place in one Response.

        Choices are told apart by their ``index``, not their position: a backend may send
        choice 1's delta alone in a chunk, or after choice 0's in the same one. Merging them
        would interleave several answers into one text."""
        if type(choices) is not list:
            return None
        first = None
        for choice in choices:
            if type(choice) is not dict:
                continue
            if choice.get("index", 0) == 0:
                if first is None:
                    first = choice
            elif not self._other_choices:
                self._other_choices = True
                self.anomalies.append("dropped the choices other than 0 (n > 1)")
                logger.warning(
                    "the upstream streamed several choices (n > 1); a Responses client gets "
                    "choice 0 only"
                )
        return first

    def _text_delta_frame(self, message: _Message, content: str) -> bytes:
        content_index = len(message.content)
        if message.fast_key != content_index:
            message.fast_key = content_index
            message.fast_mid = (
                b',"item_id":'
                + orjson.dumps(message.item_id)
                + b',"output_index":'
                + str(message.output_index).encode()
                + b',"content_index":'
                + str(content_index).encode()
                + b',"delta":'
            )
        message.parts.add(content)
        sequence = self._seq
        self._seq = sequence + 1
        # One formatting step, one allocation (a chain of + would copy the frame four times).
        return b'%b%d%b%b,"logprobs":[]}\n\n' % (
            _TEXT_DELTA_PREFIX,
            sequence,
            message.fast_mid,
            orjson.dumps(content),
        )

    def done(self) -> list[Event]:
        """The upstream sent ``data: [DONE]``: finish the response."""
        self._saw_done = True
        return self.close()

    def close(self) -> list[Event]:
        """The upstream ended. Without a finish reason or ``[DONE]`` that is a failure."""
        if self.finished:
            return []
        out = self.start() if self._response is None else []
        for is_reasoning, text in self._think.close():
            if is_reasoning or self._message is not None or text.strip():
                self._content(is_reasoning, text, None, out)
        if self.finish_reason is None and not self._saw_done:
            self._fail(
                ApiError(
                    message="The upstream chat stream ended without a finish_reason.",
                    type="server_error",
                    code="server_error",
                    status=502,
                ),
                out,
                with_error_event=True,
            )
            return out
        self._complete(out)
        return out

    def fail(self, error: ApiError) -> list[Event]:
        """End the stream with ``error`` (the proxy's view of a broken upstream)."""
        if self.finished:
            return []
        out = self.start() if self._response is None else []
        self._fail(error, out, with_error_event=True)
        return out

    # -- deltas ---------------------------------------------------------------------------

    def _event(self, event_type: str, **fields: Any) -> Event:
        event = {"type": event_type, "sequence_number": self._seq, **fields}
        self._seq += 1
        return event

    def _delta(self, delta: dict[str, Any], choice: dict[str, Any], out: list[Event]) -> None:
        if not _REASONING_KEYS.isdisjoint(delta):
            reasoning = _reasoning_text(delta)
            if reasoning:
                self._flush_held_text(out)
                self._add_reasoning(reasoning, out)
        content = delta.get("content")
        if content and type(content) is not str:
            content = _content_text(content)
            if content is None:
                self._fail(_malformed_content(delta), out, with_error_event=True)
                return
        if content:
            message = self._message
            if message is not None and message.part_kind == "output_text" and self._think.settled:
                # The hot path: more text for the open text part.
                message.parts.add(content)
                out.append(
                    {
                        "type": "response.output_text.delta",
                        "sequence_number": self._seq,
                        "item_id": message.item_id,
                        "output_index": message.output_index,
                        "content_index": len(message.content),
                        "delta": content,
                        "logprobs": _logprobs(choice.get("logprobs")),
                    }
                )
                self._seq += 1
            else:
                for is_reasoning, text in self._think.feed(content):
                    self._content(is_reasoning, text, choice.get("logprobs"), out)
        refusal = delta.get("refusal")
        if refusal:
            self._add_message_part("refusal", refusal, None, out)
        tool_calls = delta.get("tool_calls")
        if tool_calls:
            for tool_call in tool_calls:
                if isinstance(tool_call, dict):
                    self._tool_call(tool_call, out)

    def _flush_held_text(self, out: list[Event]) -> None:
        """Before a reasoning field or tool call opens an item, release what the think splitter
        holds back (``<``, ``<thi``, leading whitespace): it came first, so it belongs in the
        message before that item, not in a message opened after it at the end."""
        for is_reasoning, text in self._think.close():
            if is_reasoning or self._message is not None or text.strip():
                self._content(is_reasoning, text, None, out)

    def _content(self, is_reasoning: bool, text: str, logprobs: Any, out: list[Event]) -> None:
        if is_reasoning:
            self._add_reasoning(text, out)
        else:
            self._add_message_part("output_text", text, logprobs, out)

    def _add_reasoning(self, text: str, out: list[Event]) -> None:
        reasoning = self._reasoning
        if reasoning is None:
            self._close_items(out)
            reasoning = self._reasoning = _Reasoning(self._ids("rs"), len(self._output))
            item = {"id": reasoning.item_id, "type": "reasoning", "summary": []}
            out.append(
                self._event(
                    "response.output_item.added", output_index=reasoning.output_index, item=item
                )
            )
            out.append(
                self._event(
                    "response.reasoning_summary_part.added",
                    item_id=reasoning.item_id,
                    output_index=reasoning.output_index,
                    summary_index=0,
                    part={"type": "summary_text", "text": ""},
                )
            )
        reasoning.parts.add(text)
        out.append(
            {
                "type": "response.reasoning_summary_text.delta",
                "sequence_number": self._seq,
                "item_id": reasoning.item_id,
                "output_index": reasoning.output_index,
                "summary_index": 0,
                "delta": text,
            }
        )
        self._seq += 1

    def _add_message_part(self, kind: str, text: str, logprobs: Any, out: list[Event]) -> None:
        message = self._message
        if message is None:
            self._close_items(out)
            message = self._message = _Message(self._ids("msg"), len(self._output))
            item = {
                "id": message.item_id,
                "type": "message",
                "role": "assistant",
                "status": "in_progress",
                "content": [],
            }
            out.append(
                self._event(
                    "response.output_item.added", output_index=message.output_index, item=item
                )
            )
        if message.part_kind != kind:
            if message.part_kind is not None:
                self._close_part(message, out)
            message.part_kind = kind
            part = (
                output_text_part() if kind == "output_text" else {"type": "refusal", "refusal": ""}
            )
            out.append(
                self._event(
                    "response.content_part.added",
                    item_id=message.item_id,
                    output_index=message.output_index,
                    content_index=len(message.content),
                    part=part,
                )
            )
        message.parts.add(text)
        if kind == "output_text":
            out.append(
                self._event(
                    "response.output_text.delta",
                    item_id=message.item_id,
                    output_index=message.output_index,
                    content_index=len(message.content),
                    delta=text,
                    logprobs=_logprobs(logprobs),
                )
            )
        else:
            out.append(
                self._event(
                    "response.refusal.delta",
                    item_id=message.item_id,
                    output_index=message.output_index,
                    content_index=len(message.content),
                    delta=text,
                )
            )

    def _tool_call(self, tool_call: dict[str, Any], out: list[Event]) -> None:
        index = tool_call.get("index")
        if not isinstance(index, int):
            # Some backends omit the index: a new id starts a new call, otherwise it continues
            # the latest one.
            new_call = bool(tool_call.get("id")) or not self._calls
            index = len(self._calls) if new_call else max(self._calls)
        call = self._calls.get(index)
        if call is None:
            # A new call ends the text or reasoning before it, and the calls before it.
            self._flush_held_text(out)
            self._close_items(out)
            call = self._calls[index] = _Call()
            self._open_calls.append(call)
        elif call.output_index >= 0 and call not in self._open_calls:
            self.anomalies.append(f"tool call index {index} continued after it was closed")
            return
        call_id = tool_call.get("id")
        if call_id and call.call_id is None:
            call.call_id = call_id
        function = tool_call.get("function")
        fragment = ""
        if isinstance(function, dict):
            name = function.get("name")
            if name and not call.name:
                call.name = name
            fragment = function.get("arguments") or ""
        if call.output_index < 0:
            if fragment:
                call.pending.append(fragment)
            if call.name and (call.call_id is not None or fragment):
                self._add_call(call, out)
            return
        if fragment:
            self._arguments_delta(call, fragment, out)

    def _add_call(self, call: _Call, out: list[Event]) -> None:
        """Send ``output_item.added`` once id and name are known (an id is minted if the
        upstream never sends one), then the arguments held back so far."""
        if call.call_id is None:
            call.call_id = self._ids("call")
        # A call added while an earlier one is still open closes the earlier one: items
        # never interleave.
        for earlier in [c for c in self._open_calls if c is not call and c.output_index >= 0]:
            self._close_call(earlier, "completed", out)
        call.item_id = self._ids("fc")
        call.output_index = len(self._output)
        item = restore_call(call.item_id, call.call_id, call.name, "", "in_progress", self.context)
        out.append(
            self._event("response.output_item.added", output_index=call.output_index, item=item)
        )
        pending, call.pending = call.pending, []
        for fragment in pending:
            self._arguments_delta(call, fragment, out)

    def _arguments_delta(self, call: _Call, fragment: str, out: list[Event]) -> None:
        call.arguments.add(fragment)
        if origin_of(call.name, self.context).kind == "custom":
            return  # a custom tool's input is only known once its JSON arguments are whole
        out.append(
            self._event(
                "response.function_call_arguments.delta",
                item_id=call.item_id,
                output_index=call.output_index,
                delta=fragment,
            )
        )

    # -- closing items ------------------------------------------------------------------

    def _close_items(self, out: list[Event], status: str = "completed") -> None:
        if self._reasoning is not None:
            self._close_reasoning(out, status)
        if self._message is not None:
            self._close_message(out, status)
        if self._open_calls:
            for call in list(self._open_calls):
                if call.output_index < 0:
                    if not call.name:
                        self.anomalies.append("dropped a tool call that never got a name")
                        self._open_calls.remove(call)
                        continue
                    self._add_call(call, out)
                self._close_call(call, status, out)
            self._open_calls.clear()

    def _close_reasoning(self, out: list[Event], status: str) -> None:
        reasoning = self._reasoning
        assert reasoning is not None
        self._reasoning = None
        text = reasoning.parts.text()
        ids = {"item_id": reasoning.item_id, "output_index": reasoning.output_index}
        out.append(
            self._event("response.reasoning_summary_text.done", **ids, summary_index=0, text=text)
        )
        out.append(
            self._event(
                "response.reasoning_summary_part.done",
                **ids,
                summary_index=0,
                part={"type": "summary_text", "text": text},
            )
        )
        item = {
            "id": reasoning.item_id,
            "type": "reasoning",
            "summary": [{"type": "summary_text", "text": text}],
        }
        if status != "completed":
            item["status"] = status
        if self.context.seal_reasoning is not None:
            item["encrypted_content"] = self.context.seal_reasoning(item)
        self._done_item(item, reasoning.output_index, out)

    def _close_part(self, message: _Message, out: list[Event]) -> None:
        text = message.parts.text()
        message.parts = HeldText()
        ids = {
            "item_id": message.item_id,
            "output_index": message.output_index,
            "content_index": len(message.content),
        }
        if message.part_kind == "output_text":
            part = output_text_part(text)
            out.append(self._event("response.output_text.done", **ids, text=text, logprobs=[]))
        else:
            part = {"type": "refusal", "refusal": text}
            out.append(self._event("response.refusal.done", **ids, refusal=text))
        out.append(self._event("response.content_part.done", **ids, part=part))
        message.content.append(part)
        message.part_kind = None

    def _close_message(self, out: list[Event], status: str) -> None:
        message = self._message
        assert message is not None
        self._message = None
        if message.part_kind is not None:
            self._close_part(message, out)
        item = {
            "id": message.item_id,
            "type": "message",
            "role": "assistant",
            "status": status,
            "content": message.content,
        }
        self._done_item(item, message.output_index, out)

    def _close_call(self, call: _Call, status: str, out: list[Event]) -> None:
        if call in self._open_calls:
            self._open_calls.remove(call)
        arguments = call.arguments.text()
        assert call.call_id is not None
        item = restore_call(call.item_id, call.call_id, call.name, arguments, status, self.context)
        ids = {"item_id": call.item_id, "output_index": call.output_index}
        if item["type"] == "custom_tool_call":
            tool_input = item["input"]
            if tool_input:
                out.append(
                    self._event("response.custom_tool_call_input.delta", **ids, delta=tool_input)
                )
            out.append(self._event("response.custom_tool_call_input.done", **ids, input=tool_input))
        else:
            out.append(
                self._event(
                    "response.function_call_arguments.done",
                    **ids,
                    name=item["name"],
                    arguments=arguments,
                )
            )
        self._done_item(item, call.output_index, out)

    def _done_item(self, item: dict[str, Any], output_index: int, out: list[Event]) -> None:
        self._output.append(item)
        out.append(self._event("response.output_item.done", output_index=output_index, item=item))

    # -- terminal -----------------------------------------------------------------------

    def _complete(self, out: list[Event]) -> None:
        finish = self.finish_reason
        response = self._terminal_response()
        if finish == "length" or finish == "content_filter":
            self._close_items(out, "incomplete")
            if finish == "content_filter" and not self._output:
                self._add_message_part("refusal", _FILTERED_REFUSAL, None, out)
                self._close_items(out, "incomplete")
            reason = "max_output_tokens" if finish == "length" else "content_filter"
            response["status"] = "incomplete"
            response["incomplete_details"] = {"reason": reason}
            event_type = "response.incomplete"
        else:
            self._close_items(out)
            response["status"] = "completed"
            response["completed_at"] = int(self._clock())
            event_type = "response.completed"
        response["output"] = list(self._output)
        response["usage"] = chat_usage_to_responses(self.usage)
        out.append(self._event(event_type, response=response))
        self.final_response = response
        self.finished = True

    def _fail(self, error: ApiError, out: list[Event], *, with_error_event: bool) -> None:
        self._close_items(out, "incomplete")
        self.error = error
        if with_error_event:
            out.append(responses_error_event(error, self._seq))
            self._seq += 1
        response = self._terminal_response()
        response["status"] = "failed"
        response["error"] = response_object_error(error)
        response["output"] = list(self._output)
        response["usage"] = chat_usage_to_responses(self.usage)
        out.append(self._event("response.failed", response=response))
        self.final_response = response
        self.finished = True

    def _terminal_response(self) -> dict[str, Any]:
        assert self._response is not None
        return dict(self._response)


_REASONING_KEYS = frozenset({"reasoning_content", "reasoning", "reasoning_details"})


def _content_text(content: Any) -> str | None:
    """A delta's content that is not a string: a list of text parts (as some OpenAI-compatible
    servers send) gives their text; anything else is ``None`` (the upstream is broken)."""
    if isinstance(content, list) and all(
        isinstance(part, dict) and isinstance(part.get("text"), str) for part in content
    ):
        return "".join(part["text"] for part in content)
    return None


def _malformed_content(delta: dict[str, Any]) -> ApiError:
    preview = repr(delta.get("content"))[:80]
    return ApiError(
        message=f"The upstream sent a chat delta whose content is not text: {preview}",
        type="server_error",
        code="server_error",
        status=502,
    )


def _reasoning_text(delta: dict[str, Any]) -> str:
    """Reasoning in any of its chat spellings (OpenRouter sends the same text twice, as
    ``reasoning`` and ``reasoning_details``: take the first spelling present)."""
    text = delta.get("reasoning_content")
    if isinstance(text, str) and text:
        return text
    text = delta.get("reasoning")
    if isinstance(text, str):
        if text:
            return text
    elif isinstance(text, dict):
        value = text.get("text") or text.get("content")
        if isinstance(value, str) and value:
            return value
    details = delta.get("reasoning_details")
    if isinstance(details, list) and details:
        pieces = [
            d.get("text") or d.get("summary") or ""
            for d in details
            if isinstance(d, dict) and d.get("type") in ("reasoning.text", "reasoning.summary")
        ]
        return "".join(p for p in pieces if isinstance(p, str))
    return ""


def _logprobs(logprobs: Any) -> list[Any]:
    """Chat token logprobs as Responses delta logprobs (the same fields)."""
    if logprobs and isinstance(logprobs, dict):
        content = logprobs.get("content")
        if isinstance(content, list):
            return content
    return []
