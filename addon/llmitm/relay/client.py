"""A small HTTP/1.1 client on asyncio streams and h11, for the relay's upstream requests.

One connection per request (keep-alive pooling is a later optimisation). TLS uses the context
the caller builds (certifi by default, like mitmproxy). A body that ends before its framing
says it should raises :class:`UpstreamCut`, never a silent short read.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

import h11

READ_SIZE = 65536
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "host",
        "content-length",
    }
)


class UpstreamError(Exception):
    """The upstream could not be reached or answered unreadably before its headers."""


class UpstreamCut(Exception):
    """The upstream's body ended early: connection lost or framing broken."""


@dataclass(slots=True)
class UpstreamRequest:
    method: str
    url: str
    headers: Sequence[tuple[str, str]]
    body: bytes


class UpstreamResponse:
    """Status and headers, then the body as an async iterator of chunks."""

    def __init__(
        self,
        status: int,
        headers: list[tuple[str, str]],
        connection: h11.Connection,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        self.status = status
        self.headers = headers
        self._connection = connection
        self._reader = reader
        self._writer = writer

    async def body(self) -> AsyncIterator[bytes]:
        connection = self._connection
        try:
            while True:
                try:
                    event = connection.next_event()
                except h11.RemoteProtocolError as exc:
                    raise UpstreamCut(f"the upstream broke the HTTP framing ({exc})") from None
                if event is h11.NEED_DATA:
                    try:
                        data = await self._reader.read(READ_SIZE)
                    except (ConnectionError, OSError) as exc:
                        raise UpstreamCut(f"the upstream connection failed ({exc})") from None
                    connection.receive_data(data)
                    continue
                if isinstance(event, h11.Data):
                    yield bytes(event.data)
                elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                    return
        finally:
            self.close()

    def close(self) -> None:
        self._writer.close()


def _target(url: str) -> tuple[str, str, int, str, bool]:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UpstreamError(f"cannot relay to {url!r}")
    tls = parts.scheme == "https"
    port = parts.port or (443 if tls else 80)
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    default_port = port == (443 if tls else 80)
    host_header = parts.hostname if default_port else f"{parts.hostname}:{port}"
    if ":" in parts.hostname and not default_port:
        host_header = f"[{parts.hostname}]:{port}"
    return parts.hostname, host_header, port, path, tls


async def send(
    request: UpstreamRequest, *, tls_context: ssl.SSLContext | None, connect_timeout: float
) -> UpstreamResponse:
    """Send ``request`` and read the response head."""
    host, host_header, port, path, tls = _target(request.url)
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(
                host,
                port,
                ssl=(tls_context or ssl.create_default_context()) if tls else None,
                server_hostname=host if tls else None,
            ),
            connect_timeout,
        )
    except TimeoutError:
        raise UpstreamError(f"connecting to {host}:{port} timed out") from None
    except (OSError, ssl.SSLError) as exc:
        raise UpstreamError(f"cannot connect to {host}:{port} ({exc})") from None
    connection = h11.Connection(h11.CLIENT)
    headers = [("host", host_header)]
    headers += [(k, v) for k, v in request.headers if k.lower() not in HOP_BY_HOP]
    headers.append(("content-length", str(len(request.body))))
    try:
        writer.write(
            connection.send(h11.Request(method=request.method, target=path, headers=headers))
            + connection.send(h11.Data(data=request.body))
            + connection.send(h11.EndOfMessage())
        )
        await writer.drain()
        while True:
            event = connection.next_event()
            if event is h11.NEED_DATA:
                connection.receive_data(await reader.read(READ_SIZE))
                continue
            if isinstance(event, h11.InformationalResponse):
                continue
            if isinstance(event, h11.Response):
                response_headers = [
                    (k.decode("latin-1"), v.decode("latin-1")) for k, v in event.headers
                ]
                return UpstreamResponse(
                    event.status_code, response_headers, connection, reader, writer
                )
            raise UpstreamError("the upstream closed the connection before answering")
    except h11.RemoteProtocolError as exc:
        writer.close()
        raise UpstreamError(f"the upstream's answer is not HTTP ({exc})") from None
    except (ConnectionError, OSError) as exc:
        writer.close()
        raise UpstreamError(f"the upstream connection failed before answering ({exc})") from None
