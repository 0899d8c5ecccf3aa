"""The relay server: mitmproxy sends a registered flow's request here, the relay forwards it
upstream and streams the answer back — and always ends its own body cleanly, even when the
upstream's is cut, so the flow's stream callable can end the client's stream properly.

Bound to 127.0.0.1 on a random port; each request carries a one-use token in its path, so
nothing but the flows llmitm registered can use it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import ssl

import h11
import orjson

from llmitm.relay.client import HOP_BY_HOP, UpstreamCut, UpstreamError, UpstreamRequest, send
from llmitm.wire.errors import ApiError, openai_error_body

logger = logging.getLogger(__name__)

PATH_PREFIX = "/llmitm-relay/"
DRAIN_ABOVE = 256 * 1024


class RelayServer:
    """Register upstream requests, then serve them to mitmproxy by token."""

    def __init__(self, *, connect_timeout: float = 30.0) -> None:
        self.connect_timeout = connect_timeout
        self.tls_context: ssl.SSLContext | None = None
        self._jobs: dict[str, UpstreamRequest] = {}
        self._server: asyncio.Server | None = None
        self._ready = asyncio.Event()
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()

    async def ready(self) -> None:
        await self._ready.wait()

    def close(self) -> None:
        if self._server is not None:
            self._server.close()

    def register(self, request: UpstreamRequest) -> str:
        """The relay URL that fetches ``request`` once."""
        token = secrets.token_urlsafe(18)
        self._jobs[token] = request
        return f"http://127.0.0.1:{self.port}{PATH_PREFIX}{token}"

    def forget(self, url: str) -> None:
        """Drop a registration that will not be used (the flow was answered otherwise)."""
        self._jobs.pop(url.rpartition("/")[2], None)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            job = await self._read_job(reader)
            if job is None:
                await _write_error(writer, 404, "Unknown or used llmitm relay token.")
            else:
                await self._relay(job, writer)
        except (ConnectionError, OSError):
            pass  # mitmproxy went away (the client aborted): nothing to answer
        except Exception:
            logger.exception("llmitm relay: unexpected failure")
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _read_job(self, reader: asyncio.StreamReader) -> UpstreamRequest | None:
        connection = h11.Connection(h11.SERVER)
        while True:
            event = connection.next_event()
            if event is h11.NEED_DATA:
                data = await reader.read(65536)
                if not data:
                    return None
                connection.receive_data(data)
                continue
            if isinstance(event, h11.Request):
                target = event.target.decode("latin-1")
                if not target.startswith(PATH_PREFIX):
                    return None
                return self._jobs.pop(target[len(PATH_PREFIX) :], None)
            return None

    async def _relay(self, job: UpstreamRequest, writer: asyncio.StreamWriter) -> None:
        try:
            response = await send(
                job, tls_context=self.tls_context, connect_timeout=self.connect_timeout
            )
        except UpstreamError as exc:
            logger.warning("llmitm relay: %s: %s", job.url, exc)
            await _write_error(writer, 502, f"llmitm could not reach the upstream: {exc}")
            return
        head = [f"HTTP/1.1 {response.status} {_reason(response.status)}\r\n".encode()]
        for name, value in response.headers:
            if name.lower() not in HOP_BY_HOP:
                head.append(f"{name}: {value}\r\n".encode("latin-1"))
        head.append(b"transfer-encoding: chunked\r\nconnection: close\r\n\r\n")
        writer.write(b"".join(head))
        transport = writer.transport

        def write(pieces: list[bytes]) -> None:
            writer.write(b"".join([b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces]))

        async def drain() -> None:
            # Await only when mitmproxy reads slower than the upstream writes.
            if transport.get_write_buffer_size() > DRAIN_ABOVE:
                await writer.drain()

        try:
            await response.relay_body(write, drain)
        except UpstreamCut as exc:
            # The point of the relay: end cleanly, and let the stream callable, which sees no
            # terminal event, close the client's stream with an error in its protocol.
            logger.warning("llmitm relay: %s: the upstream stream was cut: %s", job.url, exc)
        writer.write(b"0\r\n\r\n")
        await writer.drain()


async def _write_error(writer: asyncio.StreamWriter, status: int, message: str) -> None:
    error = ApiError(
        message=message, type="server_error", code="upstream_unreachable", status=status
    )
    body = orjson.dumps(openai_error_body(error))
    writer.write(
        f"HTTP/1.1 {status} {_reason(status)}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode()
        + body
    )
    await writer.drain()


def _reason(status: int) -> str:
    from http import HTTPStatus

    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""
