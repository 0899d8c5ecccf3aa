"""What the relay serves: a job writes one HTTP response through a :class:`RelayReply`.

A job is anything with ``async serve(reply)``. :class:`UpstreamJob` forwards one request
upstream (llmitm's own client, so a cut ends cleanly); failover, stored-response streaming and
paced replay are other jobs behind the same server and token scheme.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Protocol, runtime_checkable

import orjson

from llmitm.relay.client import (
    HOP_BY_HOP,
    UpstreamClient,
    UpstreamCut,
    UpstreamError,
    UpstreamRequest,
)
from llmitm.wire.errors import ApiError, openai_error_body

logger = logging.getLogger(__name__)

DRAIN_ABOVE = 256 * 1024
WRITE_APART = 16 * 1024
"""From this size on a piece is not copied into its chunk's framing: the transport sends the
framing and the piece together (``sendmsg``), and keeps the piece itself if it must wait."""

_BODILESS = frozenset({204, 304, *range(100, 200)})
_CHUNKED = b"transfer-encoding: chunked\r\n\r\n"
_CHUNKED_CLOSE = b"transfer-encoding: chunked\r\nconnection: close\r\n\r\n"


class RelayReply:
    """One HTTP/1.1 response toward mitmproxy: a head, then chunked pieces, then the end.

    Or, before the head, :meth:`error` with an OpenAI-shaped JSON body. Either way the body is
    framed (chunked or ``content-length``), so once :attr:`finished` the connection can serve
    the next request; with ``close`` the head says ``connection: close`` and it will not."""

    def __init__(self, writer: asyncio.StreamWriter, *, close: bool = True) -> None:
        self._writer = writer
        self.close = close
        self.started = False
        self.finished = False

    async def start(
        self, status: int, headers: Sequence[tuple[str, str]], first: Sequence[bytes] = ()
    ) -> None:
        """Send the head; hop-by-hop headers are replaced by chunked framing. ``first`` body
        pieces already at hand go out with it, in one write (one send, one read for
        mitmproxy) instead of two."""
        if status in _BODILESS:
            # mitmproxy reads no body after these: the chunked end would be left unread.
            self.close = True
        head = [f"HTTP/1.1 {status} {reason(status)}\r\n".encode()]
        for name, value in headers:
            if name.lower() not in HOP_BY_HOP:
                head.append(f"{name}: {value}\r\n".encode("latin-1"))
        head.append(_CHUNKED_CLOSE if self.close else _CHUNKED)
        head += [b"%x\r\n%s\r\n" % (len(piece), piece) for piece in first if piece]
        self._writer.write(b"".join(head))
        self.started = True

    def write(self, pieces: list[bytes]) -> None:
        """Queue body pieces (empty pieces are skipped: a zero chunk would end the body)."""
        if len(pieces) == 1 and len(pieces[0]) >= WRITE_APART:
            # A large piece goes out as it is, its framing beside it (one sendmsg).
            piece = pieces[0]
            self._writer.writelines([b"%x\r\n" % len(piece), piece, b"\r\n"])
            return
        self._writer.write(
            b"".join([b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces if piece])
        )

    @property
    def gone(self) -> bool:
        """mitmproxy closed this connection (its client went away): stop writing."""
        return self._writer.transport.is_closing()

    async def drain(self) -> None:
        # Await only when mitmproxy reads slower than the job writes.
        if self._writer.transport.get_write_buffer_size() > DRAIN_ABOVE:
            await self._writer.drain()

    def end(self) -> None:
        """Queue the body's clean end (idempotent; nothing before :meth:`start`)."""
        if self.started and not self.finished:
            self.finished = True
            self._writer.write(b"0\r\n\r\n")

    async def finish(self) -> None:
        """End the body cleanly (idempotent)."""
        if not self.finished:
            self.finished = True
            self._writer.write(b"0\r\n\r\n")
            await self._writer.drain()

    async def json(
        self, status: int, body: dict[str, Any], headers: Sequence[tuple[str, str]] = ()
    ) -> None:
        """Answer with a whole JSON body (only before :meth:`start`)."""
        data = orjson.dumps(body)
        extra = "".join(f"{name}: {value}\r\n" for name, value in headers)
        if self.close:
            extra += "connection: close\r\n"
        self._writer.write(
            f"HTTP/1.1 {status} {reason(status)}\r\ncontent-type: application/json\r\n"
            f"{extra}content-length: {len(data)}\r\n\r\n".encode("latin-1")
            + data
        )
        self.started = self.finished = True
        await self._writer.drain()

    async def error(
        self,
        status: int,
        message: str,
        *,
        code: str = "upstream_unreachable",
        type: str = "server_error",
        headers: Sequence[tuple[str, str]] = (),
    ) -> None:
        """Answer with an OpenAI-shaped error instead of a body (only before :meth:`start`)."""
        body = openai_error_body(ApiError(message=message, type=type, code=code, status=status))
        await self.json(status, body, headers)


class RelayJob(Protocol):
    async def serve(self, reply: RelayReply) -> None: ...


@runtime_checkable
class SocketJob(Protocol):
    """A job that takes the connection over after the request head (a WebSocket)."""

    async def serve_socket(
        self,
        headers: list[tuple[bytes, bytes]],
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None: ...


@dataclass(slots=True)
class UpstreamJob:
    """Forward one request upstream and stream its answer; a cut ends the body cleanly so the
    flow's stream callable, seeing no terminal event, closes the client's stream with an
    error in the client's protocol."""

    request: UpstreamRequest
    client: UpstreamClient = field(default_factory=UpstreamClient)
    connect_timeout: float = 30.0

    async def serve(self, reply: RelayReply) -> None:
        job = self.request
        try:
            response = await self.client.send(job, connect_timeout=self.connect_timeout)
        except UpstreamError as exc:
            logger.warning("llmitm relay: %s: %s", job.url, exc)
            await reply.error(502, f"llmitm could not reach the upstream: {exc}")
            return
        await reply.start(response.status, response.headers)
        try:
            await response.relay_body(reply.write, reply.drain)
        except UpstreamCut as exc:
            logger.warning("llmitm relay: %s: the upstream stream was cut: %s", job.url, exc)
        await reply.finish()


def reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""
