"""The relay's WebSocket job: one Responses WebSocket, served on the connection mitmproxy
opens to the relay when a client asks to upgrade.

:class:`~llmitm.websocket.session.ResponsesSocket` speaks the protocol; this shell frames
messages with wsproto and runs each call as an ordinary streamed ``POST`` back through the
proxy's own listener, so routing, failover, translation, Responses state, usage, recording,
replay and the console treat it like any HTTPS request — they never learn which door it came
through. The calls carry a per-socket token that the proxy's socket addon checks and strips.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

import orjson
from wsproto.connection import Connection, ConnectionType
from wsproto.events import BytesMessage, CloseConnection, Ping, TextMessage
from wsproto.utilities import LocalProtocolError, RemoteProtocolError

from llmitm.relay.client import (
    Proxy,
    UpstreamClient,
    UpstreamCut,
    UpstreamError,
    UpstreamRequest,
)
from llmitm.websocket.frames import text_frame
from llmitm.websocket.handshake import switching_protocols
from llmitm.websocket.session import Action, Call, ResponsesSocket, Send, Start
from llmitm.wire.errors import ApiError, openai_error_body
from llmitm.wire.sse import SSEDecoder

logger = logging.getLogger(__name__)

READ_SIZE = 65536
DRAIN_ABOVE = 256 * 1024
MAX_MESSAGE = 64 * 1024 * 1024
"""A client message larger than this closes the socket (1009): a whole conversation fits."""
SOCKET_IDLE_S = 3600.0
"""A socket with no call running and nothing from the client for this long is closed
(OpenAI closes its sockets after 60 minutes)."""
CALL_IDLE_S = 600.0
"""A call whose answer sends nothing for this long ends with an error event."""
CALL_CONNECT_S = 10.0


@dataclass(frozen=True, slots=True)
class SocketOrigin:
    """Where the socket's calls go: the HTTPS URL the client opened the socket to, sent
    through the proxy's own listener with the handshake's headers."""

    url: str
    headers: list[tuple[str, str]]
    proxy: Proxy


class ResponsesSocketJob:
    """Serve one WebSocket; ``closed`` is called when it ends (the addon forgets its token)."""

    def __init__(
        self,
        origin: SocketOrigin,
        closed: Callable[[], None] = lambda: None,
        client: UpstreamClient | None = None,
    ) -> None:
        self.origin = origin
        self.closed = closed
        self.client = client or UpstreamClient()
        """The relay's client: calls to the proxy's listener share its keep-alive pool."""
        self.call_idle = CALL_IDLE_S
        self.socket_idle = SOCKET_IDLE_S
        self._socket = ResponsesSocket()
        self._ws = Connection(ConnectionType.SERVER)
        self._writer: asyncio.StreamWriter | None = None
        self._tasks: dict[Call, asyncio.Task[None]] = {}

    async def serve_socket(
        self,
        headers: list[tuple[bytes, bytes]],
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        """Answer the upgrade, then serve messages until either side closes."""
        key = next((v for n, v in headers if n.lower() == b"sec-websocket-key"), None)
        if key is None:
            writer.write(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
            return
        self._writer = writer
        writer.write(switching_protocols(key.decode("latin-1")))
        try:
            await self._read_messages(reader)
        finally:
            for task in list(self._tasks.values()):
                task.cancel()
            if self._tasks:
                await asyncio.gather(*self._tasks.values(), return_exceptions=True)
            self.closed()

    async def _read_messages(self, reader: asyncio.StreamReader) -> None:
        # A message's pieces as UTF-8 (wsproto hands them over decoded, never splitting a
        # character): joined as bytes, a whole history is not copied once more as a string
        # of up to four bytes a character before the protocol encodes it back for its parse.
        text: list[bytes] = []
        size = 0
        while True:
            try:
                data = await asyncio.wait_for(reader.read(READ_SIZE), self.socket_idle)
            except TimeoutError:
                if self._tasks:
                    continue  # a call is running: the client is waiting, not idle
                self._close(1001, "idle for too long")
                return
            if not data:
                return  # mitmproxy closed the connection: the client went away
            try:
                self._ws.receive_data(data)
                for event in self._ws.events():
                    if isinstance(event, TextMessage):
                        piece = event.data.encode()
                        text.append(piece)
                        size += len(piece)
                        if size > MAX_MESSAGE:
                            self._close(1009, "message too large")
                            return
                        if event.message_finished:
                            message, text, size = b"".join(text), [], 0
                            self._act(self._socket.receive_text(message))
                    elif isinstance(event, BytesMessage):
                        if event.message_finished:
                            self._act(self._socket.receive_binary())
                    elif isinstance(event, Ping):
                        self._write(self._ws.send(event.response()))
                    elif isinstance(event, CloseConnection):
                        self._write(self._ws.send(event.response()))
                        return
            except (LocalProtocolError, RemoteProtocolError) as exc:
                logger.info("llmitm: WebSocket client broke the protocol: %s", exc)
                return

    def _act(self, actions: list[Action]) -> None:
        # One write for all the frames of a batch: mitmproxy's tunnel runs a hook per chunk.
        frames = []
        for action in actions:
            if isinstance(action, Send):
                frames.append(text_frame(action.data))
            elif isinstance(action, Start):
                call = action.call
                self._tasks[call] = asyncio.ensure_future(self._run(call))
        if frames:
            self._write(b"".join(frames))

    def _write(self, data: bytes) -> None:
        writer = self._writer
        if writer is not None and not writer.transport.is_closing():
            writer.write(data)

    def _close(self, code: int, reason: str) -> None:
        with contextlib.suppress(LocalProtocolError):
            self._write(self._ws.send(CloseConnection(code=code, reason=reason)))

    async def _drain(self) -> None:
        writer = self._writer
        if writer is not None and writer.transport.get_write_buffer_size() > DRAIN_ABOVE:
            await writer.drain()

    async def _run(self, call: Call) -> None:
        """One call through the proxy, its answer fed back to the protocol."""
        why: str | None = None
        try:
            why = await self._stream(call)
        finally:
            self._tasks.pop(call, None)
            task = asyncio.current_task()
            if task is None or not task.cancelling():
                self._act(self._socket.call_ended(call, why))

    async def _stream(self, call: Call) -> str | None:
        """Send the call and feed its events; what broke the answer, if anything did."""
        origin = self.origin
        socket = self._socket
        try:
            response = await self.client.send(
                UpstreamRequest("POST", origin.url, origin.headers, call.body),
                connect_timeout=CALL_CONNECT_S,
                via=origin.proxy,
            )
        except UpstreamError as exc:
            self._act(socket.call_failed(call, 502, _error_body(str(exc)), []))
            return None
        content_type = next((v for n, v in response.headers if n.lower() == "content-type"), "")
        if response.status >= 300 or "text/event-stream" not in content_type:
            body = await response.read_body()
            status = response.status
            if status < 300:
                status, body = 502, _error_body("The call was answered without a stream.")
            self._act(socket.call_failed(call, status, body, response.headers))
            return None
        decoder = SSEDecoder()

        def feed(pieces: list[bytes]) -> None:
            actions: list[Action] = []
            for piece in pieces:
                for name, data in decoder.feed(piece):
                    actions += socket.call_event(call, name, data)
            self._act(actions)

        try:
            await response.relay_body(feed, self._drain, idle=self.call_idle)
        except UpstreamCut as exc:
            return f"The answer broke off: {exc}."
        for name, data in decoder.close():
            self._act(socket.call_event(call, name, data))
        return None


def _error_body(message: str) -> bytes:
    error = ApiError(message=message, type="server_error", code="upstream_unreachable")
    return orjson.dumps(openai_error_body(error))
