"""Responses stream → spec-conformant Responses stream (same API in and out).

Third-party Responses servers stream something close to OpenAI's events but not close
enough for strict consumers: llama.cpp sends no ``sequence_number`` or ``output_index``, a
minimal Response object in ``response.created``, text deltas without ``logprobs`` and usage
without ``output_tokens_details``. The normaliser fills what is missing from what it has seen
(item ids → positions, open content parts), renumbers events from 0, completes the Response
object, guarantees exactly one terminal event, and turns an early end into ``response.failed``
— so openai-python's ``responses.stream()`` and Codex accept the result. Upstream ids are kept:
with a native Responses endpoint its ids are the truth.

Every event type passes through (renumbered); the item-scoped ones get their ``item_id`` and
``output_index`` filled and are dropped once their item is closed. What streams of an item is
remembered so an item the upstream leaves open can be closed with its full ``*.done`` events:
text, refusal and reasoning parts with their annotations, and the arguments of function, custom
tool and MCP calls (whose ``*.done`` also gains a delta when it was the only one to carry them).
Events the spec scopes by no item id (``audio.*``, ``shell_call_command.*``) are left as sent.

Cost: on a conformant stream the deltas — nearly every event — go out as the very bytes that
came in, unparsed. The first delta of an item takes the general path; when what that path writes
is its input byte for byte, its bytes become a :class:`~llmitm.translate.normalise_fast.
DeltaTemplate`, and the item's next deltas that fit it are relayed as they are, their text kept
for the item's ``*.done`` events: a chunk that is one delta goes through the template's relay
(:meth:`ResponsesNormaliser.fast_relay`), which the proxy's stream callable asks first, one
Python call per event; :meth:`ResponsesNormaliser.relay_events` and
:meth:`ResponsesNormaliser.fast_event` take events that arrived several to a read. What does
not fit — another item, a number out of step, an escape orjson would spell otherwise — takes
the general path, which writes the same bytes the fast path would have.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from llmitm.translate.context import TranslationContext
from llmitm.translate.normalise_fast import DeltaTemplate, Parts, fold, text_of
from llmitm.wire.errors import (
    ApiError,
    normalise_error,
    response_object_error,
    responses_error_event,
)
from llmitm.wire.objects import response_object
from llmitm.wire.usage import chat_usage_to_responses, responses_usage_to_chat

Event = dict[str, Any]

_TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})
_LIFECYCLE = frozenset({"response.created", "response.in_progress", "response.queued"})
_ITEM_DEFAULTS: dict[str, dict[str, Any]] = {
    "message": {"role": "assistant", "content": []},
    "function_call": {"arguments": ""},
    "reasoning": {"summary": []},
    "custom_tool_call": {"input": ""},
    "mcp_call": {"arguments": ""},
}
# The call items whose arguments stream: the event name stem, and the field that holds them
# in the done event and in the item.
_ARGUMENT_STREAMS = {
    "function_call": ("response.function_call_arguments", "arguments"),
    "custom_tool_call": ("response.custom_tool_call_input", "input"),
    "mcp_call": ("response.mcp_call_arguments", "arguments"),
}
_ARGUMENT_STEMS = {stem: field for stem, field in _ARGUMENT_STREAMS.values()}
# The delta events of the fast path, and where each keeps its text in the item's record.
_TEXT, _SUMMARY, _ARGS = 0, 1, 2
_DELTAS = {
    "response.output_text.delta": _TEXT,
    "response.reasoning_text.delta": _TEXT,
    "response.refusal.delta": _TEXT,
    "response.reasoning_summary_text.delta": _SUMMARY,
    "response.function_call_arguments.delta": _ARGS,
    "response.custom_tool_call_input.delta": _ARGS,
    "response.mcp_call_arguments.delta": _ARGS,
}
# Deltas the general path wrote otherwise than they came (a server that leaves fields out):
# after this many, a stream stops looking for a template.
_LEARN_MISSES = 16
_dumps = orjson.dumps
_loads = orjson.loads
_SORTED = orjson.OPT_SORT_KEYS
# The spec gives these no item_id: filling one would invent a field (see the module docstring).
_UNSCOPED = frozenset(
    {
        "response.audio.delta",
        "response.audio.done",
        "response.audio.transcript.delta",
        "response.audio.transcript.done",
        "response.shell_call_command.added",
        "response.shell_call_command.delta",
        "response.shell_call_command.done",
    }
)


class _Item:
    """What has streamed of one output item: enough to close it if the upstream does not."""

    __slots__ = (
        "added",
        "annotations",
        "args",
        "args_streamed",
        "closed",
        "content_index",
        "name",
        "open_parts",
        "open_summaries",
        "output_index",
        "part_types",
        "summaries",
        "texts",
    )

    def __init__(self, output_index: int, added: dict[str, Any]) -> None:
        self.output_index = output_index
        self.added = dict(added)
        self.name: str | None = added.get("name")
        self.content_index = -1
        self.closed = False
        self.texts: dict[int, Parts] = {}
        self.annotations: dict[int, list[Any]] = {}
        self.part_types: dict[int, str] = {}
        self.open_parts: list[int] = []
        self.summaries: dict[int, Parts] = {}
        self.open_summaries: list[int] = []
        self.args: Parts = []
        self.args_streamed = False

    def text(self, content_index: int) -> Parts:
        texts = self.texts.get(content_index)
        if texts is None:
            texts = self.texts[content_index] = []
        return texts

    def summary(self, summary_index: int) -> Parts:
        texts = self.summaries.get(summary_index)
        if texts is None:
            texts = self.summaries[summary_index] = []
        return texts

    def fold(self) -> None:
        """Join what has streamed of the item into few objects (:func:`fold`)."""
        for parts in self.texts.values():
            fold(parts)
        for parts in self.summaries.values():
            fold(parts)
        fold(self.args)

    def done_item(self) -> dict[str, Any]:
        """The item as its ``output_item.done`` would carry it, from what streamed."""
        item = dict(self.added)
        item_type = item.get("type")
        if item_type != "reasoning":
            item["status"] = "completed"
        if item_type == "message":
            item["content"] = [
                _part(
                    self.part_types.get(index, "output_text"),
                    text_of(self.texts[index]),
                    self.annotations.get(index),
                )
                for index in sorted(self.texts)
            ]
        elif item_type == "reasoning":
            item["summary"] = [
                {"type": "summary_text", "text": text_of(self.summaries[index])}
                for index in sorted(self.summaries)
            ]
            if self.texts:
                item["content"] = [
                    {"type": "reasoning_text", "text": text_of(self.texts[index])}
                    for index in sorted(self.texts)
                ]
        elif item_type in _ARGUMENT_STREAMS and (self.args or item_type == "function_call"):
            item[_ARGUMENT_STREAMS[item_type][1]] = text_of(self.args)
        return item


class ResponsesNormaliser:
    """Make one upstream Responses event stream conformant."""

    fast_frame = None  # the pipeline calls feed_event(), which also sees the raw data

    def __init__(self, context: TranslationContext | None = None) -> None:
        self.context = context or TranslationContext()
        self.next_sequence = 0
        """The ``sequence_number`` the next event gets (the template's relay counts it too)."""
        self._response: dict[str, Any] | None = None
        self._items: dict[str, _Item] = {}
        self._last_item_id: str | None = None
        # output_item.done items by id, in the order they finished.
        self._done_items: dict[str, dict[str, Any]] = {}
        self._pending_error: ApiError | None = None
        self.finished = False
        self.error: ApiError | None = None
        self.usage: dict[str, Any] | None = None
        """The upstream terminal event's usage (Responses shape), for accounting."""
        self.template: DeltaTemplate | None = None
        """The open item's delta bytes, once one of its deltas came out as it came in."""
        self._learn_misses = _LEARN_MISSES
        self.final_response: dict[str, Any] | None = None
        """The Response of the upstream's terminal event as the client got it, normalised
        (what an emulated state stores: no second parse of the stream's bytes)."""

    @property
    def sequence(self) -> int:
        """The ``sequence_number`` the next event gets."""
        return self.next_sequence

    @property
    def response_id(self) -> str | None:
        """The upstream's response id (the endpoint that minted it owns its state)."""
        return self._response["id"] if self._response is not None else None

    def fold(self) -> None:
        """Join the deltas its items hold for their closing events into few objects; for the
        shell to call now and then on a live stream, never from a hot path."""
        for item in self._items.values():
            item.fold()

    # -- the fast path -------------------------------------------------------------------

    def fast_relay(self) -> Callable[[bytes], bool] | None:
        """What tells, for the next chunk, whether it is one delta event that goes out as it
        came (its text recorded, its number counted): the open item's
        :attr:`~llmitm.translate.normalise_fast.DeltaTemplate.relay`, one Python call per
        event. ``None`` when no template holds. It holds until an event takes another path:
        only that can close the item or end the stream, so the driver asks again after
        each such event."""
        template = self.template
        if template is None or template.item.closed or self.finished:
            return None
        return template.relay

    def fast_chunk(self, chunk: bytes) -> bytes | None:
        """``chunk`` itself when it is one delta event that fits the template (its text is
        recorded), else ``None`` to take the general path. No parse, no copy."""
        template = self.template
        if template is None or template.item.closed or self.finished:
            return None
        seq = self.next_sequence
        scan = template.scan
        if scan is not None:
            end = scan(chunk, 0, seq)
            if end == len(chunk):
                self.next_sequence = seq + 1
                return chunk
            if end >= 0:
                # One fitting event and more after it: relay_events takes the read.
                template.sink.pop()
                return None
        if not chunk.startswith(template.line) or not chunk.endswith(b"\n\n"):
            return None
        delta = template.match(chunk, len(template.line), len(chunk) - 2, seq)
        if delta is None:
            return None
        self.next_sequence = seq + 1
        template.sink.append(delta)
        return chunk

    def relay_events(self, chunk: bytes) -> int:
        """How many leading bytes of ``chunk`` (read with nothing buffered before it) are
        whole delta events that fit the template: relayed as they are, their text recorded.
        A read of several events then costs no frame building, and the same decisions as
        :meth:`fast_event` for each."""
        template = self.template
        if template is None or template.item.closed or self.finished:
            return 0
        line, match, sink, scan = template.line, template.match, template.sink, template.scan
        start = len(line)
        seq = self.next_sequence
        position = 0
        size = len(chunk)
        while position < size:
            if scan is not None:
                end = scan(chunk, position, seq)
                if end >= 0:
                    seq += 1
                    position = end
                    continue
            if not chunk.startswith(line, position):
                break
            end = chunk.find(b"\n\n", position + start)
            if end < 0:
                break
            delta = match(chunk, position + start, end, seq)
            if delta is None:
                break
            seq += 1
            sink.append(delta)
            position = end + 2
        self.next_sequence = seq
        return position

    def fast_event(self, name: str | None, data: bytes) -> bytes | None:
        """The frame for one decoded event (its ``event:`` name and data) that fits the
        template: the bytes :meth:`fast_chunk` would relay for it. Else ``None``."""
        template = self.template
        if template is None or name != template.event_type or template.item.closed or self.finished:
            return None
        delta = template.match(data, 0, len(data), self.next_sequence)
        if delta is None:
            return None
        self.next_sequence += 1
        template.sink.append(delta)
        return template.line + data + b"\n\n"

    def feed_event(
        self, event: dict[str, Any], name: str | None, data: bytes, *, keep_bytes: bool = True
    ) -> list[Event | bytes]:
        """:meth:`feed` for a parsed event given with its ``event:`` name and raw data.

        A delta that comes out as it came in teaches the template. With ``keep_bytes``, any
        other event the general path writes as it came, but for the order of its keys, goes
        out as its own bytes (a frame in the list): the upstream's spelling is the truth."""
        kind = _DELTAS.get(name)  # type: ignore[arg-type]
        if kind is not None or not keep_bytes or name != event.get("type"):
            out: list[Event | bytes] = self.feed(event)  # type: ignore[assignment]
            if kind is not None and self._learn_misses and len(out) == 1 and out[0] is event:
                self._learn(event, data, kind)
            return out
        out = self.feed(event)  # type: ignore[assignment]
        if len(out) != 1:
            return out
        # Written as it came (a conformant stream's events): one encoding says so. Else the
        # upstream's event is read again (feed() changed it in place) to compare but for key
        # order. (The terminal event holds the whole answer: this is most of what a long
        # conformant stream costs beyond its deltas.)
        if type(out[0]) is not dict or _dumps(out[0]) != data:
            upstream = _loads(data)
            if _dumps(upstream) != data or not _same(out[0], upstream):
                return out
        return [b"event: " + name.encode() + b"\ndata: " + data + b"\n\n"]  # type: ignore[union-attr]

    def _learn(self, event: Event, data: bytes, kind: int) -> None:
        item = self._items.get(event.get("item_id"))  # type: ignore[arg-type]
        if item is None or item.closed:
            return
        if _dumps(event) != data:
            self._learn_misses -= 1
            return
        if kind == _TEXT:
            sink = item.text(event["content_index"])
        elif kind == _SUMMARY:
            sink = item.summary(event["summary_index"])
        else:
            sink = item.args
        self.template = DeltaTemplate.learn(event, data, item, sink, self)

    # -- the general path -----------------------------------------------------------------

    def feed(self, event: dict[str, Any]) -> list[Event]:
        if self.finished:
            return []
        event_type = event.get("type")
        if not isinstance(event_type, str):
            return []
        out: list[Event] = []
        if self._response is None:
            self._start(event.get("response") if event_type in _LIFECYCLE else None, out)
            if event_type == "response.created":
                return out
        if event_type == "response.output_text.delta":
            # The hot path: fill only what the event lacks.
            item = self._item_for(event)
            if item is not None:
                if item.closed:
                    return out  # closed when a later item started (see _close_open_items)
                # Always the item's position: output_item.added is renumbered, so an upstream
                # index that disagrees (1-based, gaps) would point the SDK at the wrong item.
                event["output_index"] = item.output_index
            if "content_index" not in event:
                event["content_index"] = max(item.content_index, 0) if item else 0
            if item is not None:
                item.text(event["content_index"]).append(event.get("delta") or "")
            if not isinstance(event.get("logprobs"), list):
                event["logprobs"] = []
        elif event_type in _LIFECYCLE:
            self._merge_response(event.get("response"))
            event["response"] = dict(self._response)  # type: ignore[arg-type]
        elif event_type == "response.output_item.added":
            self._close_open_items(out)
            self._item_added(event)
        elif event_type in _TERMINAL:
            self._terminal(event, out)
            return out
        elif event_type == "error":
            payload = event.get("error")
            if not isinstance(payload, dict):
                # The flat spelling: its "type" is the event's ("error"), not the error's.
                payload = {key: value for key, value in event.items() if key != "type"}
            error = normalise_error(payload, 500)
            self._pending_error = error
            out.append(responses_error_event(error, self._next_seq()))
            return out
        else:
            if "\n" in event_type or "\r" in event_type:
                # Unknown types pass through, but this one would break the event: line.
                return out
            if event_type not in _UNSCOPED and not self._fill_indexes(event_type, event, out):
                return out
        event["sequence_number"] = self._next_seq()
        out.append(event)
        return out

    def close(self) -> list[Event]:
        """The upstream ended; without a terminal event the client gets ``response.failed``."""
        if self.finished:
            return []
        out: list[Event] = []
        if self._response is None:
            self._start(None, out)
        error = self._pending_error
        if error is None:
            # Announce the cut with an error event too: SDK users then get its message as an
            # APIError rather than a bare "no response.completed".
            error = ApiError(
                message="The upstream Responses stream ended before a terminal event.",
                type="server_error",
                code="server_error",
                status=502,
            )
            out.append(responses_error_event(error, self._next_seq()))
        self._failed(error, out)
        return out

    def fail(self, error: ApiError) -> list[Event]:
        if self.finished:
            return []
        out: list[Event] = []
        if self._response is None:
            self._start(None, out)
        out.append(responses_error_event(error, self._next_seq()))
        self._failed(error, out)
        return out

    # -- lifecycle ------------------------------------------------------------------------

    def _next_seq(self) -> int:
        seq = self.next_sequence
        self.next_sequence = seq + 1
        return seq

    def _start(self, upstream: Any, out: list[Event]) -> None:
        options = self.context.options
        upstream = upstream if isinstance(upstream, dict) else {}
        response_id = upstream.get("id")
        created_at = upstream.get("created_at")
        model = upstream.get("model") or self.context.model or ""
        self._response = response_object(
            response_id=response_id if isinstance(response_id, str) else options.ids("resp"),
            created_at=created_at if isinstance(created_at, int) else int(options.clock()),
            model=model,
            echo=self.context.echo,
        )
        self._merge_response(upstream)
        out.append(
            {
                "type": "response.created",
                "sequence_number": self._next_seq(),
                "response": dict(self._response),
            }
        )

    def _merge_response(self, upstream: Any) -> None:
        """Keep what the upstream said; fill the rest from the skeleton."""
        if not isinstance(upstream, dict) or self._response is None:
            return
        for key, value in upstream.items():
            # The identity the client saw first stays: a server that omits created_at in
            # response.created (llama.cpp) must not change it in the terminal event.
            if key in _IDENTITY and self.next_sequence > 0:
                continue
            if key in _SDK_ONLY:
                continue
            if value is not None or key not in self._response:
                self._response[key] = value
        self._response["output"] = []
        self._response["usage"] = None

    # -- items ------------------------------------------------------------------------------

    def _item_added(self, event: Event) -> None:
        item = event.get("item")
        if not isinstance(item, dict):
            item = event["item"] = {}
        item_type = item.get("type") or "message"
        item["type"] = item_type
        if not item.get("id"):
            item["id"] = self.context.options.ids(_ID_PREFIX.get(item_type, "item"))
        for key, value in _ITEM_DEFAULTS.get(item_type, {}).items():
            item.setdefault(key, value)
        if item_type != "reasoning":
            item.setdefault("status", "in_progress")
        output_index = len(self._items)
        event["output_index"] = output_index
        self._items[item["id"]] = _Item(output_index, item)
        self._last_item_id = item["id"]

    def _close_open_items(self, out: list[Event]) -> None:
        """Items never interleave (OpenAI finishes one before the next starts): an item still
        open when the next one starts is closed
        here from what it streamed. OpenRouter, for one, sends a reasoning item's done events
        only after the message that follows it; those late events are then dropped."""
        for item_id, item in self._items.items():
            if item.closed or item_id in self._done_items:
                continue
            ids = {"item_id": item_id, "output_index": item.output_index}
            for index in item.open_summaries:
                text = text_of(item.summary(index))
                out.append(
                    self._synthetic(
                        "response.reasoning_summary_text.done", ids, summary_index=index, text=text
                    )
                )
                out.append(
                    self._synthetic(
                        "response.reasoning_summary_part.done",
                        ids,
                        summary_index=index,
                        part={"type": "summary_text", "text": text},
                    )
                )
            for index in item.open_parts:
                kind = item.part_types.get(index, "output_text")
                text = text_of(item.text(index))
                if kind == "output_text":
                    out.append(
                        self._synthetic(
                            "response.output_text.done",
                            ids,
                            content_index=index,
                            text=text,
                            logprobs=[],
                        )
                    )
                elif kind == "refusal":
                    out.append(
                        self._synthetic(
                            "response.refusal.done", ids, content_index=index, refusal=text
                        )
                    )
                elif kind == "reasoning_text":
                    out.append(
                        self._synthetic(
                            "response.reasoning_text.done", ids, content_index=index, text=text
                        )
                    )
                out.append(
                    self._synthetic(
                        "response.content_part.done",
                        ids,
                        content_index=index,
                        part=_part(kind, text, item.annotations.get(index)),
                    )
                )
            done = item.done_item()
            arguments = _ARGUMENT_STREAMS.get(done.get("type"))  # type: ignore[arg-type]
            if arguments is not None:
                stem, field = arguments
                extra = {"name": done.get("name")} if field == "arguments" else {}
                out.append(
                    self._synthetic(f"{stem}.done", ids, **{field: done.get(field, "")}, **extra)
                )
            out.append(
                self._synthetic(
                    "response.output_item.done", {"output_index": item.output_index}, item=done
                )
            )
            item.closed = True
            self._done_items[item_id] = done

    def _synthetic(self, event_type: str, ids: dict[str, Any], **fields: Any) -> Event:
        return {"type": event_type, "sequence_number": self._next_seq(), **ids, **fields}

    def _item_for(self, event: Event) -> _Item | None:
        item_id = event.get("item_id")
        if not isinstance(item_id, str):
            item_id = self._last_item_id
            if item_id is None:
                return None
            event["item_id"] = item_id
        return self._items.get(item_id)

    def _fill_indexes(self, event_type: str, event: Event, out: list[Event]) -> bool:
        """Complete an item event and track what streamed; ``False`` drops the event."""
        if event_type == "response.output_item.done":
            return self._item_done(event)
        item = self._item_for(event)
        if item is None:
            return True
        if item.closed:
            return False  # a late event for an item closed when a later one started
        event["output_index"] = item.output_index  # see the text-delta path in feed()
        if event_type == "response.content_part.added":
            if "content_index" not in event:
                event["content_index"] = item.content_index + 1
            index = item.content_index = event["content_index"]
            part = event.get("part")
            _fill_part(part)
            item.part_types[index] = (
                part.get("type", "output_text") if isinstance(part, dict) else "output_text"
            )
            item.open_parts.append(index)
        elif event_type.startswith(("response.output_text.", "response.refusal.")) or (
            event_type in ("response.content_part.done", "response.reasoning_text.delta")
            or event_type == "response.reasoning_text.done"
        ):
            index = event.setdefault("content_index", max(item.content_index, 0))
            if event_type.endswith(".delta"):
                item.text(index).append(event.get("delta") or "")
            elif event_type == "response.output_text.done":
                event.setdefault("logprobs", [])
            elif event_type == "response.output_text.annotation.added":
                annotations = item.annotations.setdefault(index, [])
                event.setdefault("annotation_index", len(annotations))
                annotations.append(event.get("annotation"))
            elif event_type == "response.content_part.done":
                _fill_part(event.get("part"))
                if index in item.open_parts:
                    item.open_parts.remove(index)
        elif event_type.startswith("response.reasoning_summary_"):
            index = event.setdefault("summary_index", 0)
            if event_type == "response.reasoning_summary_text.delta":
                item.summary(index).append(event.get("delta") or "")
            elif event_type == "response.reasoning_summary_part.added":
                item.summary(index)
                item.open_summaries.append(index)
            elif (
                event_type == "response.reasoning_summary_part.done"
                and index in item.open_summaries
            ):
                item.open_summaries.remove(index)
        else:
            stem, _, kind = event_type.rpartition(".")
            field = _ARGUMENT_STEMS.get(stem)
            if field is not None:
                self._arguments(item, stem, field, kind, event, out)
        return True

    def _arguments(
        self, item: _Item, stem: str, field: str, kind: str, event: Event, out: list[Event]
    ) -> None:
        """Track a call's streamed arguments (or custom input) and complete its done event."""
        if kind == "delta":
            item.args.append(event.get("delta") or "")
            item.args_streamed = True
            return
        if kind != "done":
            return
        if stem == "response.function_call_arguments" and not event.get("name") and item.name:
            event["name"] = item.name
        arguments = event.get(field)
        if not isinstance(arguments, str):
            event[field] = text_of(item.args)
        elif not item.args_streamed and arguments:
            # Arguments only in the done event (LM Studio): send them as one delta first,
            # so done == concat(deltas) for clients that stream them.
            item.args.append(arguments)
            item.args_streamed = True
            out.append(
                self._synthetic(
                    f"{stem}.delta",
                    {"item_id": event["item_id"], "output_index": item.output_index},
                    delta=arguments,
                )
            )

    def _item_done(self, event: Event) -> bool:
        item = event.get("item")
        if not isinstance(item, dict):
            return True
        last = self._last_item_id
        if not item.get("id") and last is not None and last not in self._done_items:
            # A server that sends no item ids: this done closes the open item, whose id was
            # minted in _item_added (else it would become a second, never-added item).
            item["id"] = last
        known = self._items.get(item.get("id"))  # type: ignore[arg-type]
        if known is not None and known.closed:
            # Closed early (see _close_open_items): keep what only the upstream knows, such
            # as reasoning's encrypted_content, for the terminal output.
            stored = self._done_items[item["id"]]
            for key, value in item.items():
                stored.setdefault(key, value)
            return False
        if known is None:
            # Done without added: register it so positions stay right.
            self._item_added({"item": item})
            known = self._items[item["id"]]
        event["output_index"] = known.output_index
        if item.get("type") == "message":
            for part in item.get("content") or []:
                _fill_part(part)
        known.closed = True
        self._done_items[item["id"]] = item
        return True

    # -- terminal ---------------------------------------------------------------------------

    def _terminal(self, event: Event, out: list[Event]) -> None:
        upstream = event.get("response")
        self._merge_response(upstream)
        response = dict(self._response)  # type: ignore[arg-type]
        upstream = upstream if isinstance(upstream, dict) else {}
        response["output"] = self._final_output(upstream.get("output"))
        response["usage"] = _full_usage(upstream.get("usage"))
        self.usage = response["usage"]
        status = event["type"].removeprefix("response.")
        response["status"] = status
        if status == "completed" and not response.get("completed_at"):
            response["completed_at"] = int(self.context.options.clock())
        if status == "failed":
            # A failed response without its own error keeps the preceding error event's
            # (its code decides whether Codex retries), not a generic server_error.
            self.error = (
                normalise_error(response["error"], 500)
                if response.get("error")
                else self._pending_error or normalise_error("The response failed.", 500)
            )
            if not isinstance(response.get("error"), dict):
                response["error"] = response_object_error(self.error)
        out.append(
            {"type": event["type"], "sequence_number": self._next_seq(), "response": response}
        )
        self.final_response = response
        self.finished = True

    def _final_output(self, upstream_output: Any) -> list[Any]:
        """The terminal ``output``: the streamed items, in ``output_index`` order.

        Clients build history from ``output_item.done`` (Codex pairs by id), so the terminal
        must name the same items with the same ids. The upstream's own terminal item is kept
        when its id matches (OpenAI re-encrypts reasoning there); a streamed done item replaces
        one the upstream re-minted (OpenRouter's ``rs_tmp_…``) or sent without an id, and the
        order is by position even when items finished out of order. Only a stream that
        announced no items at all falls back to the upstream's list.
        """
        upstream_items = upstream_output if isinstance(upstream_output, list) else []
        if not self._items:
            return upstream_items
        by_id = {
            item["id"]: item
            for item in upstream_items
            if isinstance(item, dict) and isinstance(item.get("id"), str)
        }
        output = []
        for item_id in self._items:  # insertion order is output_index order
            item = by_id.get(item_id) or self._done_items.get(item_id)
            if item is not None:
                if item.get("type") == "message":
                    for part in item.get("content") or []:
                        _fill_part(part)
                output.append(item)
        return output

    def _failed(self, error: ApiError, out: list[Event]) -> None:
        self.error = error
        response = dict(self._response)  # type: ignore[arg-type]
        response["status"] = "failed"
        response["error"] = response_object_error(error)
        response["output"] = self._final_output(None)
        out.append(
            {"type": "response.failed", "sequence_number": self._next_seq(), "response": response}
        )
        self.finished = True


_IDENTITY = frozenset({"id", "created_at"})
# Fields the SDKs compute on their side, which no wire Response carries. OpenRouter sends
# ``output_text: ""``; openai-node keeps a present one, so its final response lost the text.
_SDK_ONLY = frozenset({"output_text"})
_ID_PREFIX = {"message": "msg", "function_call": "fc", "reasoning": "rs", "custom_tool_call": "ctc"}


def _part(kind: str, text: str, annotations: list[Any] | None = None) -> dict[str, Any]:
    if kind == "refusal":
        return {"type": "refusal", "refusal": text}
    if kind == "output_text":
        return {
            "type": "output_text",
            "text": text,
            "annotations": list(annotations or []),
            "logprobs": [],
        }
    return {"type": kind, "text": text}


def _same(written: Any, upstream: Any) -> bool:
    """Whether the normalised event is the upstream's but for key order (``1``, ``1.0`` and
    ``true`` told apart, unlike ``==``)."""
    return type(written) is dict and _dumps(written, option=_SORTED) == _dumps(
        upstream, option=_SORTED
    )


def _fill_part(part: Any) -> None:
    if isinstance(part, dict) and part.get("type") == "output_text":
        part.setdefault("annotations", [])
        part.setdefault("logprobs", [])
        part.setdefault("text", "")


def _full_usage(usage: Any) -> dict[str, Any] | None:
    """Usage with both details objects (the SDK and Codex expect them when usage is present)."""
    if not isinstance(usage, dict):
        return None
    full = chat_usage_to_responses(responses_usage_to_chat(usage))
    if full is None:
        return None
    # Keep provider extras (cache_write_tokens, …) the round trip does not know.
    for key in ("input_tokens_details", "output_tokens_details"):
        extra = usage.get(key)
        if isinstance(extra, dict):
            full[key] = {**extra, **full[key]}
    return full
