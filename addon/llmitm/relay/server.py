"""The relay server: mitmproxy sends a registered flow's request here and the registered job
answers it — forwarding upstream (:class:`~llmitm.relay.jobs.UpstreamJob`) or any other job
that writes a response — always ending its own body cleanly.

Bound to 127.0.0.1 on a random port; each request carries a one-use token in its path, so
nothing but the flows llmitm registered can use it. A registration lives until its request
arrives or its flow ends without sending it (``forget``, from the relay addon's flow-end
hooks): :meth:`RelayServer.stats` counts both, for ``GET /_llmitm/status``.

Connections from mitmproxy are kept alive (HTTP/1.1): every reply is framed (chunked or
``content-length``), so once one has ended the connection reads the next request, and
mitmproxy reuses it for its client's next relayed flow instead of opening (and running its
connection hooks for) a new one per flow. A connection closes on an error, on a reply that
cannot be framed, on ``connection: close``, after a WebSocket, and when idle too long.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

import h11

from llmitm.relay.client import UpstreamClient, UpstreamRequest, UpstreamSettings
from llmitm.relay.jobs import RelayJob, RelayReply, SocketJob, UpstreamJob
from llmitm.relay.pipe import stream_pipe
from llmitm.relay.request_head import plain_head

type Header = tuple[bytes, bytes]

logger = logging.getLogger(__name__)

PATH_PREFIX = "/llmitm-relay/"
IDLE_TIMEOUT = 300.0
"""A connection from mitmproxy waiting this long for its next request is closed (mitmproxy
closes its own when the client's connection ends; this bounds the rest). Longer than the
clients' own keep-alive, so mitmproxy rarely sends a request into one closing under it."""
MAX_HEAD_BYTES = 1 << 20
"""The largest request head the relay reads (h11's default, 16 KiB, is less than the client
headers mitmproxy takes and hands on); the router refuses larger ones before relaying."""


class RelayServer:
    """Register jobs, then serve each once to mitmproxy by token."""

    def __init__(
        self, *, connect_timeout: float = 30.0, upstream: UpstreamSettings | None = None
    ) -> None:
        self.connect_timeout = connect_timeout
        self.client = UpstreamClient(upstream)
        """Every job's upstream requests share its keep-alive pools."""
        self._jobs: dict[str, RelayJob | SocketJob] = {}
        self._connections = 0  # relay connections serving a request now
        self._kept = 0  # relay connections kept open for mitmproxy's next request
        self._accepted = 0
        self._piped: set[asyncio.Task[None]] = set()
        """The tasks serving in-memory connections (kept referenced while they run)."""
        self._server: asyncio.Server | None = None
        self._ready = asyncio.Event()
        self._closing: set[asyncio.Task[None]] = set()
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A new in-memory connection to this server (:mod:`llmitm.relay.pipe`): the caller's
        end, as ``asyncio.open_connection`` returns it; the server serves the other end as
        it serves a connection accepted over TCP."""
        loop = asyncio.get_running_loop()
        # No port on the caller's side: it has no socket (mitmproxy only shows its address).
        near, far = stream_pipe(loop, ("127.0.0.1", 0), self.address)
        task = loop.create_task(self._handle(*far), name="llmitm relay connection")
        self._piped.add(task)
        task.add_done_callback(self._piped.discard)
        return near

    async def ready(self) -> None:
        await self._ready.wait()

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self._close_client(self.client)

    def reconfigure(self, upstream: UpstreamSettings) -> None:
        """Use ``upstream`` from now on; requests under way finish on the old pools."""
        old, self.client = self.client, UpstreamClient(upstream)
        self._close_client(old, busy=False)

    def _close_client(self, client: UpstreamClient, *, busy: bool = True) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop: nothing was ever opened on one
        task = loop.create_task(client.aclose(busy=busy), name="llmitm relay pools close")
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def register(self, job: RelayJob | SocketJob | UpstreamRequest) -> str:
        """The relay URL that serves ``job`` once (a bare request is forwarded upstream)."""
        if isinstance(job, UpstreamRequest):
            job = UpstreamJob(job, self.client, self.connect_timeout)
        token = secrets.token_urlsafe(18)
        self._jobs[token] = job
        return f"http://127.0.0.1:{self.port}{PATH_PREFIX}{token}"

    def forget(self, url: str) -> None:
        """Drop a registration that will not be used (the flow was answered otherwise)."""
        self._jobs.pop(url.rpartition("/")[2], None)

    def stats(self) -> dict[str, int]:
        """Registrations not yet used, and relay connections serving a request now: both
        return to 0 once every flow has ended; relay connections kept open between requests
        (0 once mitmproxy's clients have closed theirs) and accepted since start; and
        upstream connections kept in the pools (at most the pool's keep-alive bound once
        every flow has ended)."""
        return {
            "registered": len(self._jobs),
            "connections": self._connections,
            "kept": self._kept,
            "accepted": self._accepted,
            "pooled": self.client.connections(),
        }

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serve requests on one connection from mitmproxy: one after another while each reply
        ends framed, so mitmproxy reuses the connection for its client's next relayed flow."""
        self._accepted += 1
        self._kept += 1
        received = b""
        try:
            while True:
                request = await self._read_request(reader, received)
                if request is None:
                    return  # mitmproxy closed the connection, or left it idle too long
                self._kept -= 1
                self._connections += 1
                try:
                    kept = await self._serve(request, reader, writer)
                finally:
                    self._connections -= 1
                    self._kept += 1
                if kept is None:
                    return
                received = request.received + kept
        except (ConnectionError, OSError):
            pass  # mitmproxy went away (the client aborted): nothing to answer
        finally:
            self._kept -= 1
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _serve(
        self, request: _Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bytes | None:
        """Answer one request; ``None`` when the connection cannot serve the next one, else
        what was read of the next request meanwhile (mostly nothing)."""
        reply = RelayReply(writer, close=request.close)
        job = self._jobs.pop(request.token, None) if request.token is not None else None
        try:
            if job is None:
                reply.close = True
                await reply.error(404, "Unknown or used llmitm relay token.", code="not_found")
                return None
            if isinstance(job, SocketJob):
                await job.serve_socket(request.headers, reader, writer)
                return None
            early = await _serve_until_abort(job, reply, reader)
            if early is None:
                return None  # mitmproxy sent something mid-reply: nothing is left to trust
            if not reply.started:
                reply.close = True
                await reply.error(500, "llmitm's relay job gave no answer.")
                return None
            await reply.finish()
        except (ConnectionError, OSError):
            raise
        except Exception:
            logger.exception("llmitm relay: unexpected failure")
            with contextlib.suppress(Exception):
                if not reply.started:
                    reply.close = True
                    await reply.error(500, "llmitm's relay failed; see the proxy's log.")
            return None
        return None if reply.close or reply.gone else early

    async def _read_request(self, reader: asyncio.StreamReader, received: bytes) -> _Request | None:
        """The next request on the connection, its body read and dropped (the job has its
        own); ``None`` once mitmproxy closes the connection or leaves it idle for
        :data:`IDLE_TIMEOUT`. ``received`` is what the previous request's read took beyond it.
        A plain head (:mod:`llmitm.relay.request_head`) is read here; any other by h11."""
        data = received
        while True:
            end = data.find(b"\r\n\r\n")
            if end >= 0 or len(data) > MAX_HEAD_BYTES:
                break
            try:
                if not data:
                    async with asyncio.timeout(IDLE_TIMEOUT):
                        more = await reader.read(65536)
                else:
                    more = await reader.read(65536)
            except TimeoutError:
                return None
            if not more:
                return None
            data += more
        head = plain_head(data, end + 4) if end >= 0 else None
        if head is None:
            return await self._read_request_h11(reader, data)
        request = _Request.of(head.method, head.target, head.http_version, head.headers)
        if request.token is None:
            return request  # answered 404 and closed: its body does not matter
        # Read the body mitmproxy sends along: closing a socket with unread data resets it,
        # and mitmproxy would lose the answer.
        rest = data[head.head_length :]
        left = head.body_length - len(rest)
        while left > 0:
            rest = await reader.read(65536)
            if not rest:
                return None
            left -= len(rest)
        request.received = rest[len(rest) + left :] if left < 0 else b""
        return request

    async def _read_request_h11(
        self, reader: asyncio.StreamReader, received: bytes
    ) -> _Request | None:
        """:meth:`_read_request` by h11, for a head that is not plain."""
        connection = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        if received:
            connection.receive_data(received)
        request: _Request | None = None
        while True:
            event = connection.next_event()
            if event is h11.NEED_DATA:
                data = await reader.read(65536)
                if not data:
                    return None
                connection.receive_data(data)
            elif isinstance(event, h11.Request):
                request = _Request.of(event.method, event.target, event.http_version, event.headers)
                if request.token is None:
                    return request  # answered 404 and closed: its body does not matter
            elif isinstance(event, h11.EndOfMessage) and request is not None:
                request.received = connection.trailing_data[0]
                return request
            elif not isinstance(event, h11.Data):
                return None  # h11's ConnectionClosed or a malformed request


@dataclass(slots=True)
class _Request:
    """What the relay takes from one request of mitmproxy's."""

    token: str | None
    """The registration the path names; ``None`` for a path outside the relay's."""
    headers: list[tuple[bytes, bytes]]
    close: bool
    """mitmproxy will not send another request on this connection (``connection: close``,
    HTTP/1.0, or a ``HEAD``, whose answer the relay's chunked framing does not fit)."""
    received: bytes = b""

    @classmethod
    def of(
        cls, method: bytes, raw_target: bytes, http_version: bytes, headers: Sequence[Header]
    ) -> _Request:
        target = raw_target.decode("latin-1")
        if target.startswith("http://"):
            # Absolute form: mitmproxy in upstream mode writes its requests for a proxy,
            # also the ones it sends straight here.
            target = "/" + target.removeprefix("http://").partition("/")[2]
        token = target[len(PATH_PREFIX) :] if target.startswith(PATH_PREFIX) else None
        close = http_version != b"1.1" or method == b"HEAD"
        for name, value in headers:
            if name == b"connection" and b"close" in value.lower():
                close = True
        return cls(token, list(headers), close)


async def _serve_until_abort(
    job: RelayJob, reply: RelayReply, reader: asyncio.StreamReader
) -> bytes | None:
    """Serve ``job``; cancel it when mitmproxy closes the connection (the client went away),
    so a job waiting for an upstream, a backoff or a free slot lets go at once and its
    ``finally`` releases what it holds. ``None`` when mitmproxy sent something while the job
    ran (it never does between a request and its answer): the connection is not reused.
    Otherwise what was read of mitmproxy's next request once the answer had ended (the
    in-memory connection delivers it within the same loop turn that ended the answer)."""
    loop = asyncio.get_running_loop()
    # Started eagerly: the job runs up to its first wait (the upstream request written) now,
    # not one turn of the event loop later, on the time to first byte of every relayed flow.
    serving = asyncio.Task(_serve_and_end(job, reply), loop=loop, eager_start=True)
    watching = asyncio.Task(reader.read(1), loop=loop, eager_start=True)
    early: bytes | None = b""
    try:
        await asyncio.wait({serving, watching}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watching.cancel()
        # Let the cancel land before anyone reads the connection again (one reader at a
        # time: the next request's read would fail while this one still waits).
        await asyncio.wait({watching})
        if not watching.cancelled():
            # A reset reads as an error here: retrieved, or asyncio logs it as an unhandled
            # task error (one traceback per client that aborted).
            failed = watching.exception() is not None
            early = None if failed else watching.result()
        if not serving.done():
            serving.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await serving
            raise ConnectionResetError("mitmproxy closed the relay connection")
    serving.result()  # re-raise what the job raised
    if early and not reply.finished:
        return None  # bytes while the answer was still under way
    return early


async def _serve_and_end(job: RelayJob, reply: RelayReply) -> None:
    """Serve ``job`` and end its body in the same step as its last write: a client that
    hangs up as soon as it has read its stream's last event (the OpenAI SDK does, at
    ``[DONE]``) must not find mitmproxy still waiting for the body's end, or its flow ends
    as an error instead of an answer (not cached, not recorded as complete)."""
    await job.serve(reply)
    reply.end()
