"""A request on an HTTP/2 connection of httpcore's pool, without httpcore's request path.

An upstream that offers HTTP/2 gets one connection from httpcore's pool, shared by every
request to it. httpcore's HTTP/2 request path costs about two and a half times the CPU of
the relay's HTTP/1.1 path for a streamed answer (``scripts/bench_relay_client.py --http2``):
its request and response models, a trace around every step, three writes per request
(headers, body, end of stream), a lock taken around every write and read, and an async
generator around every event of the body.
When the pool holds an open HTTP/2 connection to the request's origin with a stream slot
free, :func:`send` opens the stream on it directly: headers and body handed to the
connection's own h2 state and written in one piece, the answer read through httpcore's own
event reader (``_receive_events``), which shares the connection's reads with httpcore's
requests on it, and every data frame a read brought handed on in one piece.

Everything about the connection stays httpcore's: it opened it (TLS, ALPN, the upstream's
settings), counts its requests and stream slots under the same rules (a slot taken here is
one its own requests wait for), and :meth:`PooledStream.aclose` ends the stream through
httpcore's own ending (the connection idle again, expired or closed by its rules). A stream
given up on before its end is reset (``CANCEL``), so the upstream stops generating it.

What this module does not take goes through httpcore's path, which handles it: no HTTP/2
connection yet (the first request opens it), no free slot, a body larger than the flow
control windows allow at once, a connection out of stream ids, an upstream proxy, or a
httpcore whose internals are not the ones read here (then :data:`ENABLED` is false from the
start).
"""

from __future__ import annotations

import contextlib
import copy
import re
from collections.abc import Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import h2.config
import h2.errors
import h2.events
import h2.exceptions
import httpcore
from hpack import NeverIndexedHeaderTuple

from llmitm.errors import TransportError
from llmitm.relay import idle_http11
from llmitm.relay.network import AsyncioStream

try:
    from httpcore._async.connection import AsyncHTTPConnection
    from httpcore._async.http2 import AsyncHTTP2Connection, HTTPConnectionState
except ImportError:  # pragma: no cover - a httpcore laid out differently
    ENABLED = False
else:
    ENABLED = all(
        hasattr(AsyncHTTP2Connection, name)
        for name in ("_receive_events", "_response_closed", "is_available", "has_expired")
    ) and all(
        hasattr(httpcore.AsyncConnectionPool, name)
        for name in ("_assign_requests_to_connections", "_close_connections")
    )
"""Whether HTTP/2 streams are opened here; false when httpcore is not the code read here."""

_DATA = h2.events.DataReceived
_ENDED = h2.events.StreamEnded
_RESPONSE = h2.events.ResponseReceived
_RESET = h2.events.StreamReset
_WINDOW = 2**24
"""The receive window opened on every stream, as httpcore opens it."""
_FIELDS = re.compile(
    rb"(?:[!#$%&'*+\-.^_`|~0-9a-z]+\x00"
    rb"(?:[\x21-\x7e\x80-\xff](?:[\t\x20-\x7e\x80-\xff]*[\x21-\x7e\x80-\xff])?)?\n)*"
)
"""Header fields h2 would send as they are: lower-case token names (no pseudo-header) and
values without control bytes or surrounding whitespace, each written ``name NUL value LF``."""
_REQUEST_LINE = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+ /[\x21-\x7e\x80-\xff]*")
"""A token method and an origin-form target without spaces or control bytes."""
SECRET = frozenset({b"authorization", b"proxy-authorization", b"cookie", b"api-key", b"x-api-key"})
"""Fields never added to HPACK's table (RFC 7541, 7.1.3: a table shared by a connection's
streams must not let one guess another's secrets by their compressed size)."""
_CHECKED: dict[h2.config.H2Configuration, h2.config.H2Configuration] = {}
"""Each connection configuration's twin without h2's outbound header checks."""


class StreamNotSent(TransportError):
    """The connection went away before the upstream took the stream (closed while idle, or a
    GOAWAY below the stream's id): the request may be sent again on a fresh connection."""


@dataclass(slots=True)
class PooledStream:
    """An answer's head read on a stream of a pooled HTTP/2 connection, and its body; in the
    shape the client's response reads (httpcore's ``Response``: status, headers, ``aclose``)."""

    status: int
    headers: list[tuple[bytes, bytes]]
    extensions: dict[str, Any]
    connection: Any  # httpcore's AsyncHTTP2Connection
    stream_id: int
    pool: httpcore.AsyncConnectionPool
    reading: Any  # the stand-in request httpcore's reader takes (its timeouts)
    ended: bool = False
    stream: None = None

    async def pieces(self) -> list[bytes]:
        """The body bytes the next read brought, in one piece; empty at the end (then
        :attr:`ended`). Raises httpcore's errors when the stream or the connection breaks."""
        connection = self.connection
        stream_id = self.stream_id
        events = connection._events[stream_id]
        pieces: list[bytes] = []
        state = connection._h2_state
        while not pieces:
            while not events:
                await connection._receive_events(self.reading, stream_id)
            while events:
                event = events.pop(0)
                kind = type(event)
                if kind is _DATA:
                    state.acknowledge_received_data(event.flow_controlled_length, stream_id)
                    if event.data:
                        pieces.append(event.data)
                elif kind is _ENDED:
                    self.ended = True
                    break
                elif kind is _RESET:
                    raise httpcore.RemoteProtocolError(str(event))
            if self.ended:
                break
        _flush(connection)  # window updates, when the acknowledgements earned one
        if len(pieces) > 1:
            return [b"".join(pieces)]
        return pieces

    async def aclose(self) -> None:
        """Reset the stream when it was given up on before its end, then httpcore's own ending
        (the slot freed, the connection idle or closed by its rules) and the pool's
        housekeeping, as after any of its own requests."""
        connection = self.connection
        if not self.ended:
            reset(connection, self.stream_id)
        await connection._response_closed(stream_id=self.stream_id)
        await idle_http11.tidy(self.pool)


async def send(
    pool: httpcore.AsyncConnectionPool,
    origin: httpcore.Origin,
    method: bytes,
    authority: bytes,
    target: bytes,
    headers: Sequence[tuple[bytes, bytes]],
    body: bytes,
    write_timeout: float,
) -> PooledStream | None:
    """Open a stream for the request on a pooled HTTP/2 connection to ``origin`` and read the
    answer's head; ``None`` (at once) when there is none to take. ``headers`` are the
    request's without ``host`` (``authority`` stands for it). Raises httpcore's errors, and
    :class:`StreamNotSent` when the connection went away before the upstream took the
    stream."""
    if not ENABLED or type(pool) is not httpcore.AsyncConnectionPool or not pool._connections:
        return None
    connection = _find(pool, origin, len(body))
    if connection is None:
        return None  # an HTTP/1.1 upstream's requests pay this look and nothing more
    fields = [(name.lower(), value) for name, value in headers]
    if (
        _REQUEST_LINE.fullmatch(b"%s %s" % (method, target)) is None
        or _FIELDS.fullmatch(b"".join([b"%s\x00%s\n" % pair for pair in fields])) is None
    ):
        return None  # httpcore's path normalises or refuses it, with its own error
    _take(connection)
    state = connection._h2_state
    try:
        stream_id = state.get_next_available_stream_id()
    except h2.exceptions.NoAvailableStreamIDError:
        # As httpcore does: the connection is used up, a fresh one follows on its path.
        connection._used_all_stream_ids = True
        connection._request_count -= 1
        connection._max_streams_semaphore._anyio_semaphore.release()
        return None
    connection._events[stream_id] = []
    reading = SimpleNamespace(extensions={"timeout": {"read": None, "write": write_timeout}})
    try:
        head = [
            (b":method", method),
            (b":authority", authority),
            (b":scheme", origin.scheme),
            (b":path", target),
        ]
        head += [
            NeverIndexedHeaderTuple(name, value) if name in SECRET else (name, value)
            for name, value in fields
        ]
        _send_headers(state, stream_id, head, end_stream=not body)
        state.increment_flow_control_window(_WINDOW, stream_id=stream_id)
        frame = state.max_outbound_frame_size
        for start in range(0, len(body), frame):
            piece = body[start : start + frame]
            state.send_data(stream_id, piece, end_stream=start + frame >= len(body))
        await _write(connection, state.data_to_send(), write_timeout)
        status, answer_fields = await _head(connection, stream_id, reading)
    except BaseException as exc:
        with contextlib.suppress(Exception):
            reset(connection, stream_id)
            await connection._response_closed(stream_id=stream_id)
            if connection._connection_error and not connection._events:
                await connection.aclose()  # broken: the pool drops it, a fresh one follows
        if isinstance(exc, h2.exceptions.ProtocolError):
            raise httpcore.LocalProtocolError(str(exc)) from None
        raise
    return PooledStream(
        status=status,
        headers=answer_fields,
        extensions={"http_version": b"HTTP/2"},
        connection=connection,
        stream_id=stream_id,
        pool=pool,
        reading=reading,
    )


def _find(pool: httpcore.AsyncConnectionPool, origin: httpcore.Origin, size: int) -> Any:
    """An open HTTP/2 connection to ``origin`` with a stream slot free and room in its flow
    control windows for a body of ``size`` bytes; ``None`` also when the pool has
    housekeeping to do (an expired idle connection), which its own path then does."""
    for pooled in pool._connections:
        if type(pooled) is not AsyncHTTPConnection or pooled._origin != origin:
            continue
        connection = pooled._connection
        if type(connection) is not AsyncHTTP2Connection:
            continue
        if connection.has_expired():
            return None
        if _usable(connection, size):
            return connection
    return None


def _take(connection: Any) -> None:
    """Count the request and take its slot as httpcore's own request does; called in the same
    step as :func:`_find` found the connection, so nothing else took the slot meanwhile."""
    connection._max_streams_semaphore._anyio_semaphore.acquire_nowait()
    connection._request_count += 1
    connection._expire_at = None
    connection._state = HTTPConnectionState.ACTIVE


def _usable(connection: Any, size: int) -> bool:
    if (
        not connection._sent_connection_init
        or connection._state is HTTPConnectionState.CLOSED
        or connection._connection_terminated is not None
        or connection._read_exception is not None
        or connection._write_exception is not None
        or not connection.is_available()
        or type(connection._network_stream) is not AsyncioStream
    ):
        return False
    slots = getattr(connection._max_streams_semaphore, "_anyio_semaphore", None)
    if slots is None or slots.value < 1:
        return False
    state = connection._h2_state
    window = min(state.outbound_flow_control_window, state.remote_settings.initial_window_size)
    return size <= window


async def _write(connection: Any, data: bytes, timeout: float) -> None:
    """Write the stream's opening; a connection that cannot take it is marked broken, as
    httpcore marks it, and the stream was never sent."""
    if connection._write_exception is not None:
        raise StreamNotSent(str(connection._write_exception))
    try:
        await connection._network_stream.write(data, timeout)
    except httpcore.WriteError as exc:
        connection._write_exception = exc
        connection._connection_error = True
        raise StreamNotSent(str(exc)) from None


async def _head(
    connection: Any, stream_id: int, reading: Any
) -> tuple[int, list[tuple[bytes, bytes]]]:
    """The stream's answer status and header fields (informational answers are not kept by
    httpcore's reader); :class:`StreamNotSent` when the connection ends before the upstream
    took the stream."""
    events = connection._events[stream_id]
    while True:
        while not events:
            try:
                await connection._receive_events(reading, stream_id)
            except httpcore.ConnectionNotAvailable:
                raise StreamNotSent("the upstream refused the stream (GOAWAY)") from None
            except (httpcore.RemoteProtocolError, httpcore.ReadError) as exc:
                if "disconnected" in str(exc).lower() or type(exc) is httpcore.ReadError:
                    raise StreamNotSent(str(exc) or type(exc).__name__) from None
                raise
        event = events.pop(0)
        if type(event) is _RESPONSE:
            _flush(connection)
            return _status_and_fields(event.headers or [])
        if type(event) is _RESET:
            if event.error_code == h2.errors.ErrorCodes.REFUSED_STREAM:
                raise StreamNotSent("the upstream refused the stream")
            raise httpcore.RemoteProtocolError(str(event))


def _status_and_fields(
    headers: Sequence[tuple[bytes, bytes]],
) -> tuple[int, list[tuple[bytes, bytes]]]:
    status = 0
    fields: list[tuple[bytes, bytes]] = []
    for name, value in headers:
        if name == b":status":
            status = int(value) if value.isdigit() and len(value) == 3 else 0
        elif not name.startswith(b":"):
            fields.append((name, value))
    if not status:
        raise httpcore.RemoteProtocolError("the answer has no valid :status")
    return status, fields


def _send_headers(
    state: Any, stream_id: int, fields: list[tuple[bytes, bytes]], *, end_stream: bool
) -> None:
    """h2's ``send_headers`` without its outbound checks and normalisation (a third of its
    cost), which :data:`_REQUEST_LINE`, :data:`_FIELDS` and :data:`SECRET` stand for here:
    the stream is opened under a twin of the connection's configuration that skips them."""
    config = state.config
    checked = _CHECKED.get(config)
    if checked is None:
        checked = _CHECKED[config] = copy.copy(config)
        checked.validate_outbound_headers = False
        checked.normalize_outbound_headers = False
    state.config = checked
    try:
        state.send_headers(stream_id, fields, end_stream=end_stream)
    finally:
        state.config = config


def _flush(connection: Any) -> None:
    data = connection._h2_state.data_to_send()
    if data:
        connection._network_stream.write_now(data)


def reset(connection: Any, stream_id: int) -> None:
    """Reset a stream given up on before its end (``CANCEL``), so the upstream stops
    generating an answer nobody reads; nothing when it is already closed or reset.
    ``connection``: httpcore's HTTP/2 connection, on :class:`AsyncioStream`."""
    with contextlib.suppress(h2.exceptions.ProtocolError, KeyError):
        connection._h2_state.reset_stream(stream_id, error_code=h2.errors.ErrorCodes.CANCEL)
    _flush(connection)
