"""Chat Completions stream → spec-conformant Chat Completions stream (same API in and out).

The chat twin of :mod:`~llmitm.translate.normalise`. Backends that speak chat get a few things
wrong that strict clients trip on, and a relay byte for byte hands those mistakes on:

- a tool call's ``id`` and ``function.name`` repeated in every chunk of the call (openai-python's
  stream helper and LangChain concatenate them into ``call_1call_1…``): sent once, in the call's
  first chunk;
- tool-call ``index`` values that are sparse, 1-based, missing, or the same for several calls
  told apart only by their ids: renumbered 0..k-1 in the order the calls start;
- a first chunk of a call without ``id`` or ``type``: filled (an id is minted);
- a stream that ends without a ``finish_reason``: a last chunk with ``stop`` (``tool_calls``
  when the choice made calls) before ``[DONE]``;
- an error object inside an HTTP 200 stream (OpenRouter): turned into the ``{"error": …}``
  chunk openai-python raises ``APIError`` on, and the stream ends there.

Reasoning fields (``reasoning_content``, ``reasoning``) and anything else are kept as sent,
unless the endpoint asks for a rendering (``reasoning_passthrough``): then
:mod:`~llmitm.translate.think_render` rewrites them, and chunks that mention reasoning (and,
for ``think-tags``, every chunk while a think block is open) take the parsed path.

Cost: a conformant chunk goes out as the very bytes that came in, never re-serialised. The hot
path (:meth:`ChatNormaliser.fast_chunk`) does not even parse it: a chunk that is one plain
``data:`` line and holds none of the few markers of something to repair (tool calls, an
error, usage, a finish reason) is relayed at once. The hottest (:meth:`ChatNormaliser.
fast_relay`) learns the shape of the first such chunk that holds one ``content`` string: a
later chunk with the same bytes around another valid string is plain as well, which two
comparisons and one string read tell. Everything else is parsed and looked at; what needs no
repair still goes out as its own bytes.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import orjson

from llmitm.translate.context import TranslationContext
from llmitm.translate.normalise_fast import string_end
from llmitm.translate.think_render import DeltaReasoning, render_message_reasoning
from llmitm.wire.errors import ApiError, chat_error_chunk, normalise_error
from llmitm.wire.sse import DONE_FRAME

Frame = bytes
"""One encoded SSE frame for the client (``data: …\\n\\n``)."""

_dumps = orjson.dumps
_loads = orjson.loads
_JSONDecodeError = orjson.JSONDecodeError
_CONTENT = b'"content":"'
_RELAY_MISSES = 16
"""Plain chunks that did not fit the relay (another kind of delta, a value that changes from
chunk to chunk) or could not teach one (no ``content`` string): after this many, a stream
stops asking and learning it, and its chunks take the marker searches as before."""


def _plain(data: bytes, start: int) -> bool:
    """Whether the chunk JSON in ``data`` (from ``start``) holds none of the few markers of
    something to look at: tool calls, an error, usage, a finish reason. JSON strings escape
    their quotes, so no text can forge one. The markers are spelled compactly; a writer that
    puts a space after its colons (checked at the first key) takes the parsed path.

    Runs once per chunk: a chain of ``find`` calls, each one C scan."""
    colon = data.find(b'":', start)
    return (
        0 <= colon < len(data) - 2
        and data[colon + 2] != 0x20
        and data.find(b'"finish_reason":"') < 0
        and data.find(b'"tool_calls":[') < 0
        and data.find(b'"usage":{') < 0
        and data.find(b'"error":') < 0
    )


_MARKER = re.compile(rb'"(?:finish_reason":"|tool_calls":\[|usage":\{|error":)')
"""The markers of :func:`_plain` in one pattern: one pass over a piece of a huge event
(its first byte is a literal, which the regex engine skips to), not four."""
MARKER_SPAN = len(b'"finish_reason":"')
"""The longest marker: a piece is searched together with this many bytes before it."""


def has_marker(window: bytes) -> bool:
    """Whether ``window`` holds one of :func:`_plain`'s markers."""
    return _MARKER.search(window) is not None


CUT = ApiError(
    message="The upstream chat stream ended before its finish reason and [DONE].",
    type="server_error",
    code="server_error",
    status=502,
)


class _Call:
    """One tool call of a choice, as the client sees it."""

    __slots__ = ("call_id", "index", "name")

    def __init__(self, index: int, call_id: str, name: str) -> None:
        self.index = index
        self.call_id = call_id
        self.name = name


class _Choice:
    """What one choice has streamed: its calls, its reasoning rendering, whether it
    finished."""

    __slots__ = ("by_id", "by_index", "calls", "finished", "last", "reasoning")

    def __init__(self, reasoning: DeltaReasoning | None = None) -> None:
        self.calls: list[_Call] = []
        self.by_index: dict[int, _Call] = {}
        self.by_id: dict[str, _Call] = {}
        self.last: _Call | None = None
        self.finished = False
        self.reasoning = reasoning


class ChatNormaliser:
    """Make one upstream chat chunk stream conformant; conformant chunks keep their bytes.

    With ``strip_usage``, a usage-only chunk (empty ``choices``) that llmitm asked for on the
    client's behalf is read for accounting and not relayed."""

    final_response = None  # a chat client's stream: llmitm stores no Response
    response_id = None

    def __init__(
        self, context: TranslationContext | None = None, *, strip_usage: bool = False
    ) -> None:
        self.context = context or TranslationContext()
        self.strip_usage = strip_usage
        self._choices: dict[int, _Choice] = {}
        self._head: dict[str, Any] | None = None
        """The stream's ``id``, ``created`` and ``model``, for a chunk llmitm adds."""
        self.finished = False
        self.error: ApiError | None = None
        self.usage: dict[str, Any] | None = None
        """The upstream's usage (chat shape), for accounting."""
        self.repaired = 0
        """How many upstream chunks were changed or dropped (for tests and logs)."""
        self._render = self.context.options.reasoning_passthrough
        """The reasoning rendering asked for (``None``: the fields as sent)."""
        self._relay: Callable[[bytes], bool] | None = None
        self._relay_misses = _RELAY_MISSES
        self.relayed = 0
        """Chunks the relay took (the driver counts events with it)."""

    def _new_choice(self) -> _Choice:
        return _Choice(DeltaReasoning(self._render) if self._render is not None else None)

    def fast_relay(self) -> Callable[[bytes], bool] | None:
        """What tells, for the next chunk, whether it is a text delta that goes out as it came
        (see :func:`_relay`; one Python call per chunk), once a plain one taught it. It holds
        until a chunk takes another path: only that can end the stream."""
        if self._relay_misses <= 0 or self._render is not None or self.finished:
            return None
        return self._relay

    def _skips_fast_path(self, data: bytes) -> bool:
        """With a rendering asked for: whether this chunk must be parsed anyway (it mentions
        reasoning, or a think block is open that its answer must close)."""
        if data.find(b'"reasoning') >= 0:
            return True
        return any(
            state.reasoning is not None and state.reasoning.think_open
            for state in self._choices.values()
        )

    # -- the driver's entry points ------------------------------------------------------------

    def fast_chunk(self, chunk: bytes) -> bytes | None:
        """``chunk`` itself when it is one plain ``data:`` event with nothing to look at (the
        hot path: a text or reasoning delta), else ``None`` to have it parsed."""
        if (
            self.finished
            or self._head is None  # the first chunk is parsed: it names the stream
            or not chunk.startswith(b"data: {")
            or chunk.find(b"\n") != len(chunk) - 2
            or chunk[-1] != 0x0A
            or chunk.find(b"\r") >= 0
            or (self._render is not None and self._skips_fast_path(chunk))
        ):
            return None
        if not _plain(chunk, 7):
            return None
        if self._relay is None and self._relay_misses > 0 and self._render is None:
            self._relay = _relay(self, chunk)
            if self._relay is None:
                self._relay_misses -= 1  # a reasoning delta, say: a few tries per stream
        return chunk

    def plain(self, data: bytes) -> bool:
        """Whether one event's ``data`` is a chunk with nothing to look at (the same test as
        :meth:`fast_chunk`'s, for events that arrived several to a read)."""
        return (
            not self.finished
            and self._head is not None
            and data.startswith(b"{")
            and _plain(data, 1)
            and (self._render is None or not self._skips_fast_path(data))
        )

    def plain_held(self, head: bytes, marked: bool) -> bool:
        """:meth:`plain` for an event held across reads, told by the first bytes of its data
        (``head``) and whether a search of its pieces as they came found one of the markers
        (``marked``). Anything unusual is parsed."""
        if (
            marked
            or self.finished
            or self._head is None
            or self._render is not None
            or not head.startswith(b"{")
        ):
            return False
        colon = head.find(b'":', 1)  # the first key's (a writer's spacing)
        return 0 < colon < len(head) - 2 and head[colon + 2] != 0x20

    def fast_frame(self, event: dict[str, Any], chunk: bytes, data: bytes) -> bytes:
        """A parsed chunk that arrived as one whole event: its own bytes when it needs no
        repair, else its repaired frames."""
        repaired = self._repair(event)
        if repaired is None:
            return chunk if chunk.startswith(b"data: ") else b"data: " + data + b"\n\n"
        return b"".join(repaired)

    def feed_data(self, event: dict[str, Any], data: bytes) -> list[Frame]:
        """A parsed chunk and its raw ``data`` (the general path: chunks split anywhere)."""
        repaired = self._repair(event)
        return [b"data: " + data + b"\n\n"] if repaired is None else repaired

    def repair(self, event: dict[str, Any]) -> list[Frame] | None:
        """A parsed chunk: ``None`` when it goes out as it came, else the frames that replace
        it (the driver then sends a chunk held across reads as the pieces it came in)."""
        return self._repair(event)

    def feed(self, event: dict[str, Any]) -> list[Frame]:
        repaired = self._repair(event)
        return [b"data: " + _dumps(event) + b"\n\n"] if repaired is None else repaired

    def done(self) -> list[Frame]:
        """The upstream's ``[DONE]``: the finish reasons it left out, then ``[DONE]``."""
        if self.finished:
            return []
        self.finished = True
        return [*self._missing_finishes(), DONE_FRAME]

    def close(self) -> list[Frame]:
        """The upstream ended. After a finish reason only ``[DONE]`` (or the usage chunk) can
        be missing: the answer is whole, so it ends cleanly. Before one, the stream was cut:
        the client gets an error."""
        if self.finished:
            return []
        first = self._choices.get(0)
        if first is not None and first.finished:
            return self.done()
        return self.fail(CUT)

    def fail(self, error: ApiError) -> list[Frame]:
        if self.finished:
            return []
        self.finished = True
        self.error = error
        return [b"data: " + _dumps(chat_error_chunk(error)) + b"\n\n", DONE_FRAME]

    # -- repairs ------------------------------------------------------------------------------

    def _repair(self, event: dict[str, Any]) -> list[Frame] | None:
        """``None`` when ``event`` goes out as it came; else the frames that replace it
        (none: dropped)."""
        if self.finished:
            return []
        if self._head is None:
            self._head = self._new_head(event)
        usage = event.get("usage")
        if isinstance(usage, dict):
            # Before the error check: OpenRouter's error chunk carries the failed call's usage.
            self.usage = usage
        error = event.get("error")
        if error:
            self.repaired += 1
            return self.fail(normalise_error(error, 500))
        choices = event.get("choices")
        if type(choices) is not list:
            return None
        if not choices:
            if self.strip_usage and isinstance(usage, dict):
                self.repaired += 1
                return []
            return None
        changed = False
        for choice in choices:
            if type(choice) is not dict:
                continue
            index = choice.get("index", 0)
            state = self._choices.get(index) if type(index) is int else None
            if state is None:
                state = self._choices[index if type(index) is int else 0] = self._new_choice()
            delta = choice.get("delta")
            finishing = bool(choice.get("finish_reason"))
            if type(delta) is dict:
                calls = delta.get("tool_calls")
                if type(calls) is list and calls and self._calls(state, calls):
                    changed = True
                if state.reasoning is not None and state.reasoning.render(delta, finishing):
                    changed = True
            if finishing:
                state.finished = True
        if not changed:
            return None
        self.repaired += 1
        if self._render == "drop" and _only_empty_deltas(choices):
            return []  # a reasoning-only chunk with its reasoning dropped says nothing
        return [b"data: " + _dumps(event) + b"\n\n"]

    def _calls(self, state: _Choice, calls: list[Any]) -> bool:
        """Renumber and trim one chunk's tool-call deltas in place; whether any changed."""
        changed = False
        for position, delta in enumerate(calls):
            if type(delta) is not dict:
                continue
            new = self._call_delta(state, delta)
            if new is not None:
                calls[position] = new
                changed = True
        return changed

    def _call_delta(self, state: _Choice, delta: dict[str, Any]) -> dict[str, Any] | None:
        """The delta as the client should get it, or ``None`` when it is right as it is."""
        upstream_index = delta.get("index")
        if type(upstream_index) is not int:
            upstream_index = None
        call_id = delta.get("id")
        if type(call_id) is not str or not call_id:
            call_id = None
        function = delta.get("function")
        function = function if type(function) is dict else {}
        name = function.get("name")
        if type(name) is not str:
            name = None

        call = self._known_call(state, upstream_index, call_id)
        if call is None:
            call = _Call(len(state.calls), call_id or self.context.options.ids("call"), name or "")
            state.calls.append(call)
            state.by_id[call.call_id] = call
            if upstream_index is not None:
                state.by_index[upstream_index] = call
            state.last = call
            if (
                upstream_index == call.index
                and call_id is not None
                and delta.get("type") == "function"
                and "arguments" in function
            ):
                return None  # a conformant first chunk
            first = {"index": call.index, "id": call.call_id, "type": "function"}
            first["function"] = {**function, "arguments": function.get("arguments") or ""}
            return {**_extras(delta), **first}
        state.last = call
        repeated_name = name is not None and call.name != "" and name == call.name
        if name is not None and not repeated_name:
            call.name += name  # a name streamed in pieces, or sent after the id
        if upstream_index == call.index and call_id is None and not repeated_name:
            return None
        fixed = {**_extras(delta), "index": call.index}
        if repeated_name or "name" in function:
            kept = {key: value for key, value in function.items() if key != "name"}
            if name is not None and not repeated_name:
                kept["name"] = name
            fixed["function"] = kept
        elif "function" in delta:
            fixed["function"] = delta["function"]
        return fixed

    def _known_call(
        self, state: _Choice, upstream_index: int | None, call_id: str | None
    ) -> _Call | None:
        """The call a delta continues, or ``None`` when it starts one."""
        if upstream_index is not None:
            call = state.by_index.get(upstream_index)
            if call is not None and (call_id is None or call_id == call.call_id):
                return call
            # The same index with another id is another call (some backends send every call
            # at index 0); an id seen before under another index is that call.
            return state.by_id.get(call_id) if call_id is not None else None
        if call_id is not None:
            return state.by_id.get(call_id)
        return state.last

    def _new_head(self, event: dict[str, Any]) -> dict[str, Any]:
        options = self.context.options
        return {
            "id": event.get("id") or options.ids("chatcmpl"),
            "created": event.get("created") or int(options.clock()),
            "model": event.get("model") or self.context.model or "",
        }

    def _missing_finishes(self) -> list[Frame]:
        """A closing chunk for each choice that never said why it stopped."""
        if not self._choices:
            self._choices[0] = self._new_choice()
        frames = []
        for index, state in sorted(self._choices.items()):
            if state.finished:
                continue
            state.finished = True
            self.repaired += 1
            reason = "tool_calls" if state.calls else "stop"
            head = self._head or self._new_head({})
            closing = state.reasoning.closing() if state.reasoning is not None else None
            chunk = {
                "id": head["id"],
                "object": "chat.completion.chunk",
                "created": head["created"],
                "model": head["model"],
                "choices": [
                    {
                        "index": index,
                        "delta": {"content": closing} if closing else {},
                        "finish_reason": reason,
                    }
                ],
            }
            frames.append(b"data: " + _dumps(chunk) + b"\n\n")
        return frames


def _relay(normaliser: ChatNormaliser, plain: bytes) -> Callable[[bytes], bool] | None:
    """The relay of the text deltas shaped like ``plain``, a chunk :meth:`ChatNormaliser.
    fast_chunk` found plain that holds one ``content`` string: a later chunk that is its
    bytes with another string there is plain too. (The string's JSON must be valid: a raw
    line break or quote in it would be another chunk. Within a valid string no marker can be
    spelled, its quotes being escaped.) Comparing both ends and reading the one string costs
    a few C calls; the markers' searches cost a dozen. ``None`` when ``plain`` has no single
    ``content`` string."""
    start = plain.find(_CONTENT)
    if start < 0 or plain.find(_CONTENT, start + 1) >= 0:
        return None
    begin = start + len(_CONTENT)
    end = string_end(plain, begin - 1)
    if end < 0:
        return None
    head, tail = plain[:begin], plain[end - 1 :]  # each with its quote
    size = len(tail)
    loads, decode_error = _loads, _JSONDecodeError

    def relay(chunk: bytes) -> bool:
        end = len(chunk) - size
        if chunk[:begin] != head or chunk[end:] != tail:
            normaliser._relay_misses -= 1
            return False
        try:
            loads(chunk[begin - 1 : end + 1])
        except decode_error:
            return False
        normaliser.relayed += 1
        return True

    return relay


def _extras(delta: dict[str, Any]) -> dict[str, Any]:
    """A tool-call delta's fields other than the ones the normaliser rewrites."""
    return {
        key: value for key, value in delta.items() if key not in ("index", "id", "type", "function")
    }


def _only_empty_deltas(choices: list[Any]) -> bool:
    """Whether every choice of a chunk has a delta of nothing but nulls and no finish
    reason."""
    return all(
        type(choice) is dict
        and not choice.get("finish_reason")
        and not choice.get("logprobs")
        and all(value is None for value in (choice.get("delta") or {}).values())
        for choice in choices
    )


def repair_chat_completion(completion: dict[str, Any], context: TranslationContext) -> bool:
    """The same repairs for a whole ``chat.completion`` body, in place; whether any was made.

    A body cannot repeat a call's id or name (each call is one object), and its calls carry no
    stream ``index``; what can be missing is a call's ``id`` or ``type`` and a choice's
    ``finish_reason``. The reasoning rendering asked for applies to each message."""
    choices = completion.get("choices")
    if type(choices) is not list:
        return False
    render = context.options.reasoning_passthrough
    changed = False
    for choice in choices:
        if type(choice) is not dict:
            continue
        message = choice.get("message")
        if render is not None and type(message) is dict:
            changed = render_message_reasoning(message, render) or changed
        calls = message.get("tool_calls") if type(message) is dict else None
        calls = calls if type(calls) is list else []
        for tool_call in calls:
            if type(tool_call) is not dict:
                continue
            if type(tool_call.get("id")) is not str or not tool_call["id"]:
                tool_call["id"] = context.options.ids("call")
                changed = True
            if "type" not in tool_call:
                tool_call["type"] = "function"
                changed = True
        if not choice.get("finish_reason"):
            choice["finish_reason"] = "tool_calls" if calls else "stop"
            changed = True
    return changed
