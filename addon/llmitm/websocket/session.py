"""One Responses WebSocket connection as a state machine, in the style of h11 and wsproto.

The client sends JSON text messages:

- ``response.create``: the body of a ``POST /v1/responses`` plus the socket's envelope
  (``type``, ``stream_id``, ``generate``). It becomes one :class:`Call` — an ordinary
  streamed Responses request the caller runs through the proxy — and every SSE event of its
  answer goes back as one text message, as OpenAI sends them.
- ``response.processed``: the client has handled a response; nothing to answer.
- ``response.steer``: refused with ``response.steer.failed`` (llmitm cannot steer a running
  response).

Requests with the same ``stream_id`` (a *lane*; none is a lane too) run one after another,
lanes side by side. ``generate: false`` prepares state without a model call (Codex's
warm-up): it is answered here. The connection remembers its last responses, so a
``previous_response_id`` naming one created with ``store: false`` or as a warm-up — which no
store holds — is expanded here into the whole input (that response's input and output, then
the new items), as OpenAI's socket does for ``store: false`` turns; other ids go on to the
store or the upstream like any HTTP request.

A client that resends its whole history on every message (no ``previous_response_id``) has
each message parsed where it differs from its last one (:mod:`llmitm.wire.growing`), so the
turns a connection remembers share the items they resend.

Bad input gets an ``error`` message with an HTTP ``status`` (the shape Codex maps to an HTTP
error) and the connection stays open.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from llmitm.errors import InputError
from llmitm.wire.errors import ApiError, normalise_error
from llmitm.wire.growing import GrowingBodies
from llmitm.wire.ids import random_id
from llmitm.wire.objects import response_object
from llmitm.wire.usage import chat_usage_to_responses

HISTORY = 16
"""Responses a connection remembers for ``previous_response_id`` (Codex uses the last)."""
MESSAGES_BUDGET = 16 * 2**20
"""Bytes of a connection's last messages kept with their parse (one a conversation)."""

TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed", "error"})
# Events whose Response object echoes ``previous_response_id``: patched when this connection
# expanded that id itself, so the client sees the lineage it asked for.
_ECHOING = frozenset({"response.created", "response.in_progress"}) | TERMINAL - {"error"}
_ENVELOPE = ("type", "stream_id", "generate")
_HEADERS_ON_ERRORS = ("retry-after", "retry-after-ms", "x-request-id", "x-llmitm-attempts")


@dataclass(slots=True)
class Send:
    """Send one text message to the client."""

    data: bytes


@dataclass(slots=True)
class Start:
    """Run this call: ``POST`` :attr:`Call.body` as a streamed Responses request, then feed
    its answer back with :meth:`ResponsesSocket.call_event` and friends."""

    call: Call


@dataclass(slots=True, eq=False)
class Call:
    """One ``response.create`` on its way through the proxy."""

    number: int
    lane: str | None
    request: dict[str, Any]
    """The client's ``response.create`` without its envelope."""
    body: bytes = b""
    """What goes to the proxy, built when the call starts (it may name a response the same
    lane finishes first)."""
    input: list[Any] = field(default_factory=list)
    """The whole input the model sees, ``previous_response_id`` expanded when it was ours."""
    echo_previous: str | None = None
    """The ``previous_response_id`` this connection expanded, echoed in the answer."""
    warmup: bool = False
    """``generate: false``: answered here, no model call."""
    ended: bool = False
    failed_next: bool = False
    """The call ended with a stream ``error`` event: the ``response.failed`` that follows
    it (llmitm's terminal pair for a cut or stalled stream) still goes to the client, which
    waits for a ``response.*`` terminal event (Codex does)."""


@dataclass(slots=True)
class _Remembered:
    input: list[Any]
    output: list[Any]
    local: bool
    """Only this connection knows it (``store: false``, or a warm-up)."""


type Action = Send | Start


class ResponsesSocket:
    """The protocol of one connection. Feed it what the client sends and what each call
    answers; do what the returned actions say."""

    def __init__(
        self,
        *,
        mint_id: Callable[[str], str] = random_id,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._mint_id = mint_id
        self._clock = clock
        self._calls = 0
        self._lanes: dict[str | None, deque[Call]] = {}
        """Per lane, its running call first, then the queued ones."""
        self._history: OrderedDict[str, _Remembered] = OrderedDict()
        self._messages = GrowingBodies(MESSAGES_BUDGET)
        """The last message of each conversation, parsed: a client that resends its history
        (no ``previous_response_id``) has only its new items parsed, and the turns this
        socket remembers share the items they resend."""

    # -- from the client ------------------------------------------------------------------

    def receive_text(self, data: bytes | str) -> list[Action]:
        """One whole text message from the client."""
        try:
            message = self._messages.parse(data.encode() if isinstance(data, str) else data).body
        except (orjson.JSONDecodeError, UnicodeEncodeError):
            return [self._error(400, "The message is not valid JSON.", "invalid_json")]
        if not isinstance(message, dict):
            return [self._error(400, "A message must be a JSON object.", "invalid_json")]
        kind = message.get("type")
        if kind == "response.create":
            return self._create(message)
        if kind == "response.processed":
            return []
        if kind == "response.steer":
            return [self._steer_failed(message)]
        return [
            self._error(
                400,
                f"Unknown message type {kind!r}: send response.create or response.processed.",
                "unknown_message_type",
                param="type",
            )
        ]

    def receive_binary(self) -> list[Action]:
        return [self._error(400, "Send JSON text messages, not binary ones.", "invalid_json")]

    # -- from the calls -------------------------------------------------------------------

    def call_event(self, call: Call, name: str | None, data: bytes) -> list[Action]:
        """One SSE event of the call's answer (``name`` is its ``event:`` line, if any)."""
        if call.failed_next:
            return self._failed_after_error(call, data)
        if call.ended or data == b"[DONE]":
            return []
        if name is None or name in TERMINAL:
            return self._parsed_event(call, data)
        if call.echo_previous is not None and name in _ECHOING:
            # Only a Response object is patched: a text delta goes as it came, unparsed.
            return self._parsed_event(call, data)
        if call.lane is not None:
            data = _with_stream_id(data, call.lane)
        return [Send(data)]

    def call_failed(
        self, call: Call, status: int, body: bytes, headers: list[tuple[str, str]]
    ) -> list[Action]:
        """The call was answered with an HTTP error instead of a stream."""
        if call.ended:
            return []
        try:
            payload: Any = orjson.loads(body) if body else None
        except orjson.JSONDecodeError:
            payload = body.decode("utf-8", "replace")[:500] or None
        error = normalise_error(payload, status)
        wanted = {name.lower(): value for name, value in headers}
        kept = {name: wanted[name] for name in _HEADERS_ON_ERRORS if name in wanted}
        call.ended = True
        return [
            self._error(
                status, error.message, error.code, error.type, error.param, kept, lane=call.lane
            )
        ]

    def call_ended(self, call: Call, why: str | None = None) -> list[Action]:
        """The call's answer ended (``why`` says how, when it broke). A stream that ended
        without a terminal event gets one, then the lane's next call starts."""
        actions: list[Action] = []
        if not call.ended:
            message = why or "The stream ended before the response completed."
            actions.append(self._error(502, message, "stream_cut", "server_error", lane=call.lane))
        return actions + self._finish(call)

    @property
    def running(self) -> list[Call]:
        """The calls started and not yet ended (the caller cancels them when the client
        leaves)."""
        return [lane[0] for lane in self._lanes.values() if lane]

    # -- inside ---------------------------------------------------------------------------

    def _create(self, message: dict[str, Any]) -> list[Action]:
        lane = message.get("stream_id")
        if lane is not None and not isinstance(lane, str):
            return [self._error(400, "stream_id must be a string.", "invalid_type", "stream_id")]
        if message.get("background"):
            return [
                self._error(
                    400,
                    "background is not supported over a WebSocket; use HTTPS for it.",
                    "unsupported_parameter",
                    param="background",
                    lane=lane,
                )
            ]
        request = {key: value for key, value in message.items() if key not in _ENVELOPE}
        self._calls += 1
        call = Call(self._calls, lane, request, warmup=message.get("generate") is False)
        queue = self._lanes.setdefault(lane, deque())
        queue.append(call)
        if len(queue) > 1:
            return []  # runs when the calls before it on this lane have ended
        return self._begin(call)

    def _begin(self, call: Call) -> list[Action]:
        try:
            call.input = self._whole_input(call)
        except _Refused as refused:
            return [refused.action, *self._finish(call)]
        if call.warmup:
            return self._warm_up(call)
        body = dict(call.request)
        if call.echo_previous is not None:
            body.pop("previous_response_id", None)
            body["input"] = call.input
        body["stream"] = True
        call.body = orjson.dumps(body)
        return [Start(call)]

    def _whole_input(self, call: Call) -> list[Any]:
        request = call.request
        items = request.get("input")
        if isinstance(items, str):
            items = [{"type": "message", "role": "user", "content": items}]
        elif items is None:
            items = []
        elif not isinstance(items, list):
            raise _Refused(
                self._error(
                    400,
                    "input must be a string or an array.",
                    "invalid_type",
                    param="input",
                    lane=call.lane,
                )
            )
        previous = request.get("previous_response_id")
        remembered = self._history.get(previous) if isinstance(previous, str) else None
        if remembered is None or not remembered.local:
            return items
        call.echo_previous = previous
        return [*remembered.input, *remembered.output, *items]

    def _warm_up(self, call: Call) -> list[Action]:
        """Answer ``generate: false`` here: a completed Response with no output whose id the
        next request may continue from."""
        response_id = self._mint_id("resp")
        echo = {key: call.request.get(key) for key in ("model", "instructions", "store")}
        echo["previous_response_id"] = call.request.get("previous_response_id")
        created = response_object(
            response_id=response_id,
            created_at=int(self._clock()),
            model=str(call.request.get("model") or ""),
            echo={k: v for k, v in echo.items() if v is not None},
        )
        done = dict(created, status="completed", completed_at=int(self._clock()))
        done["usage"] = chat_usage_to_responses({"prompt_tokens": 0, "completion_tokens": 0})
        events = [
            {"type": "response.created", "sequence_number": 0, "response": created},
            {"type": "response.in_progress", "sequence_number": 1, "response": created},
            {"type": "response.completed", "sequence_number": 2, "response": done},
        ]
        self._remember(response_id, call.input, [], local=True)
        call.ended = True
        actions: list[Action] = [Send(self._encode(event, call.lane)) for event in events]
        return actions + self._finish(call)

    def _parsed_event(self, call: Call, data: bytes) -> list[Action]:
        try:
            event = orjson.loads(data)
        except orjson.JSONDecodeError:
            return []  # not an event: nothing a client could use
        if not isinstance(event, dict):
            return []
        kind = event.get("type")
        response = event.get("response")
        if isinstance(response, dict):
            if call.echo_previous is not None and kind in _ECHOING:
                response["previous_response_id"] = call.echo_previous
            if kind in TERMINAL:
                self._completed(call, response)
        if kind in TERMINAL:
            call.ended = True
            call.failed_next = kind == "error"
        return [Send(self._encode(event, call.lane))]

    def _failed_after_error(self, call: Call, data: bytes) -> list[Action]:
        """After a stream's ``error``: its ``response.failed``, and nothing else."""
        if b"response.failed" not in data:
            return []
        call.failed_next = False
        return self._parsed_event(call, data)

    def _completed(self, call: Call, response: dict[str, Any]) -> None:
        response_id = response.get("id")
        output = response.get("output")
        if isinstance(response_id, str) and isinstance(output, list):
            local = call.request.get("store") is False
            self._remember(response_id, call.input, output, local=local)

    def _remember(
        self, response_id: str, items: list[Any], output: list[Any], *, local: bool
    ) -> None:
        self._history[response_id] = _Remembered(items, output, local)
        self._history.move_to_end(response_id)
        while len(self._history) > HISTORY:
            self._history.popitem(last=False)

    def _finish(self, call: Call) -> list[Action]:
        """Take the call off its lane and start the lane's next one."""
        call.ended = True
        lane = self._lanes.get(call.lane)
        if not lane or lane[0] is not call:
            return []
        lane.popleft()
        if not lane:
            del self._lanes[call.lane]
            return []
        return self._begin(lane[0])

    def _steer_failed(self, message: dict[str, Any]) -> Send:
        event = {
            "type": "response.steer.failed",
            "sequence_number": 0,
            "error": {
                "type": "invalid_request_error",
                "code": "steering_not_supported",
                "message": "llmitm cannot steer a running response; send response.create.",
            },
            "steer": {
                "input": message.get("input"),
                "previous_response_id": message.get("previous_response_id"),
            },
        }
        return Send(orjson.dumps(event))

    def _error(
        self,
        status: int,
        message: str,
        code: str | None,
        type_: str = "invalid_request_error",
        param: str | None = None,
        headers: dict[str, str] | None = None,
        *,
        lane: str | None = None,
    ) -> Send:
        error = ApiError(message=message, type=type_, code=code, param=param, status=status)
        event: dict[str, Any] = {
            "type": "error",
            "status": error.status,
            "error": {
                "type": error.type,
                "code": error.code,
                "message": error.message,
                "param": error.param,
            },
        }
        if headers:
            event["headers"] = headers
        return Send(self._encode(event, lane))

    @staticmethod
    def _encode(event: dict[str, Any], lane: str | None) -> bytes:
        if lane is not None:
            event["stream_id"] = lane
        return orjson.dumps(event)


class _Refused(InputError):
    def __init__(self, action: Send) -> None:
        self.action = action


def _with_stream_id(data: bytes, lane: str) -> bytes:
    """The event with ``stream_id`` added, without parsing it: an event is one JSON object."""
    end = data.rstrip()
    if not end.endswith(b"}") or end.endswith(b"{}"):
        return data
    return end[:-1] + b',"stream_id":' + orjson.dumps(lane) + b"}"
