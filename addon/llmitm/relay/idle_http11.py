"""A request on an idle HTTP/1.1 connection of httpcore's pool, without httpcore's request path.

On a failover route the relay's upstream request is on the way to the client's first byte,
and httpcore's path for it — its request and response models, the pool's assignment, h11's
validation and writing of every header, three layers of calls with their traces — costs
about twice the CPU of writing the same bytes and reading the answer's head
(``scripts/bench_relay_client.py``). When httpcore's pool holds an idle, unexpired HTTP/1.1
connection to the request's origin, :func:`send` takes it as httpcore itself would (marked
active and counted under the same rules, so the pool hands it to nobody else), writes the
request as one prepared piece, and reads the answer's head through the connection's own h11
state. Everything after that is httpcore's again: the body is read as any other, and
:meth:`IdleAnswer.aclose` hands the connection back with httpcore's own ending (pooled
again only when h11 saw both messages whole, otherwise closed).

h11 is told of the request by a stand-in of the same method and no body: what h11 keeps of
a request is its method (a ``HEAD``'s answer has no body) and its framing, and the headers
that would change more (``connection``, ``upgrade``, ``transfer-encoding``) never cross the
relay. A head h11 would refuse (a header name that is not a token, a control byte in a
value) is not sent here: :func:`send` returns ``None`` and httpcore's path refuses it with
its own error. So does everything this module does not know: no idle connection, an upstream
proxy, HTTP/2, or a httpcore whose internals are not the ones read here (then
:data:`ENABLED` is false from the start).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import h11
import httpcore

from llmitm.errors import TransportError
from llmitm.relay.network import AsyncioStream

try:
    from httpcore._async.connection import AsyncHTTPConnection
    from httpcore._async.http11 import AsyncHTTP11Connection, HTTPConnectionState
except ImportError:  # pragma: no cover - a httpcore laid out differently
    ENABLED = False
else:
    ENABLED = all(
        hasattr(AsyncHTTP11Connection, name)
        for name in ("_response_closed", "has_expired", "handle_async_request")
    ) and all(
        hasattr(httpcore.AsyncConnectionPool, name)
        for name in ("_assign_requests_to_connections", "_close_connections")
    )
"""Whether idle connections are taken here; false when httpcore is not the code read here."""

READ_SIZE = 64 * 1024
"""The most one read of the answer's head takes (httpcore's own read size)."""
JOIN_BELOW = 256 * 1024
"""A body below this size goes out in one write with the head; a larger one is not copied."""
_HEAD = re.compile(
    rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+ [\x21-\x7e\x80-\xff]+ HTTP/1\.1\r\n"
    rb"(?:[!#$%&'*+\-.^_`|~0-9A-Za-z]+:[ \t]*[^\x00-\x08\x0a-\x1f\x7f]*\r\n)*\r\n"
)
"""A request head h11 would write as it is: a token method, a target without spaces or
control bytes, token header names and values without line breaks or control bytes."""
_END = h11.EndOfMessage()
STAND_INS_KEPT = 16
"""Methods whose stand-in is kept (a method is whatever token a client sent)."""
_STAND_INS: dict[bytes, h11.Request] = {}


class IdleConnectionClosed(TransportError):
    """The idle connection was closed before any of the answer came (an upstream closes idle
    connections when it likes): the request may be sent again on a fresh one."""


@dataclass(slots=True)
class IdleAnswer:
    """An answer's head read on an idle connection taken from the pool, in the shape the
    client's response reads (httpcore's ``Response``: status, headers, ``aclose``)."""

    status: int
    headers: list[tuple[bytes, bytes]]
    extensions: dict[str, Any]
    state: h11.Connection
    reader: asyncio.StreamReader
    connection: Any  # httpcore's AsyncHTTP11Connection
    pool: httpcore.AsyncConnectionPool
    stream: None = None

    async def aclose(self) -> None:
        """httpcore's own ending: the connection pooled again if both messages are whole,
        else closed; then the pool's housekeeping, as after any of its own requests (idle
        connections beyond what it keeps, and expired ones, closed)."""
        await self.connection._response_closed()
        await tidy(self.pool)


async def tidy(pool: httpcore.AsyncConnectionPool) -> None:
    """The pool's housekeeping after a request it did not send itself ended, as it does after
    its own: idle connections beyond what it keeps, and expired ones, closed."""
    with pool._optional_thread_lock:
        closing = pool._assign_requests_to_connections()
    await pool._close_connections(closing)


async def send(
    pool: httpcore.AsyncConnectionPool,
    origin: httpcore.Origin,
    method: str,
    target: str | bytes,
    headers: Sequence[tuple[bytes, bytes]],
    body: bytes,
    write_timeout: float,
) -> IdleAnswer | None:
    """Send the request on an idle connection of ``pool`` to ``origin`` and read the answer's
    head; ``None`` (at once) when there is none, or the head is one for httpcore's path.
    Raises httpcore's errors, and :class:`IdleConnectionClosed` when the connection turned
    out closed before any of the answer came."""
    if not ENABLED or type(pool) is not httpcore.AsyncConnectionPool or not pool._connections:
        return None
    try:
        verb = method.encode("ascii")
        path = target if type(target) is bytes else target.encode("ascii")
    except UnicodeEncodeError:
        return None
    head = b"%s %s HTTP/1.1\r\n%s\r\n" % (
        verb,
        path,
        b"".join([b"%s: %s\r\n" % pair for pair in headers]),
    )
    if head.count(b"\n") != len(headers) + 2 or _HEAD.fullmatch(head) is None:
        return None  # a line break in a value would pass as a header line of its own
    connection = _take_idle(pool, origin)
    if connection is None:
        return None
    return await _exchange(pool, connection, verb, head, body, write_timeout)


def _take_idle(pool: httpcore.AsyncConnectionPool, origin: httpcore.Origin) -> Any:
    """An idle HTTP/1.1 connection to ``origin``, marked active as httpcore's own request
    marks it (no wait between looking and marking: nothing else can take it meanwhile).
    ``None`` also when the pool has housekeeping to do — an idle connection expired or
    closed by its upstream, more idle ones than it keeps — which its own path then does."""
    chosen = None
    idle = 0
    for pooled in pool._connections:
        if not pooled.is_idle():
            continue
        if pooled.has_expired():
            return None
        idle += 1
        if chosen is not None or type(pooled) is not AsyncHTTPConnection:
            continue
        connection = pooled._connection
        if type(connection) is not AsyncHTTP11Connection or pooled._origin != origin:
            continue
        state = connection._h11_state
        if (
            state.our_state is h11.IDLE
            and state.their_state is h11.IDLE
            and type(connection._network_stream) is AsyncioStream
        ):
            chosen = connection
    if chosen is None or idle > pool._max_keepalive_connections:
        return None
    chosen._request_count += 1
    chosen._state = HTTPConnectionState.ACTIVE
    chosen._expire_at = None
    return chosen


async def _exchange(
    pool: httpcore.AsyncConnectionPool,
    connection: Any,
    method: bytes,
    head: bytes,
    body: bytes,
    timeout: float,
) -> IdleAnswer:
    state: h11.Connection = connection._h11_state
    network: AsyncioStream = connection._network_stream
    try:
        stand_in = _STAND_INS.get(method)
        if stand_in is None:
            headers = [(b"host", b"-"), (b"content-length", b"0")]
            stand_in = h11.Request(method=method, target=b"/", headers=headers)
            if len(_STAND_INS) < STAND_INS_KEPT:
                _STAND_INS[method] = stand_in
        state.send(stand_in)
        state.send(_END)
        with contextlib.suppress(httpcore.WriteError):
            # As httpcore does: an upstream may close its side early and still answer.
            if len(body) < JOIN_BELOW:
                await network.write(head + body, timeout)  # one send, one TLS record
            else:
                await network.write(head, timeout)
                await network.write(body, timeout)
        event = await _answer_head(state, network.reader)
    except BaseException:
        # Cancelled, timed out or broken: a connection in an unknown state is never reused.
        with contextlib.suppress(Exception):
            await connection.aclose()
        raise
    return IdleAnswer(
        status=event.status_code,
        headers=event.headers.raw_items(),
        extensions={"http_version": b"HTTP/" + event.http_version, "reason_phrase": event.reason},
        state=state,
        reader=network.reader,
        connection=connection,
        pool=pool,
    )


async def _answer_head(state: h11.Connection, reader: asyncio.StreamReader) -> h11.Response:
    """The answer's head (1xx answers skipped, as httpcore skips them)."""
    received = False
    while True:
        try:
            event = state.next_event()
        except h11.RemoteProtocolError as exc:
            raise httpcore.RemoteProtocolError(str(exc)) from None
        if event is h11.NEED_DATA:
            try:
                data = await reader.read(READ_SIZE)
            except OSError as exc:
                if not received:
                    raise IdleConnectionClosed(str(exc)) from None
                raise httpcore.ReadError(str(exc) or type(exc).__name__) from None
            if not data and not received:
                raise IdleConnectionClosed("the upstream closed the idle connection")
            received = True
            state.receive_data(data)
        elif type(event) is h11.Response:
            return event
        elif type(event) is not h11.InformationalResponse:
            raise httpcore.RemoteProtocolError(f"unexpected {type(event).__name__}")
