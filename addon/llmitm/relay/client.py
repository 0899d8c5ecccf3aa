"""A small HTTP/1.1 client on asyncio streams and h11, for the relay's upstream requests.

One connection per request (keep-alive pooling is a later optimisation). TLS uses the context
the caller builds (certifi by default, like mitmproxy). A body that ends before its framing
says it should raises :class:`UpstreamCut`, never a silent short read.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

import h11

from llmitm.errors import TransportError
from llmitm.relay.framing import BodyDecoder, CloseDecoder, FramingError, body_decoder

READ_SIZE = 65536
type Drain = Callable[[], Awaitable[None]]
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


class UpstreamError(TransportError):
    """The upstream could not be reached or answered unreadably before its headers."""


class UpstreamCut(TransportError):
    """The upstream's body ended early: connection lost or framing broken."""


class UpstreamStall(UpstreamCut):
    """The upstream kept the connection open but sent nothing for the idle limit."""


@dataclass(frozen=True, slots=True)
class Proxy:
    """A proxy to send a request through instead of connecting to its URL's host."""

    host: str
    port: int
    absolute: bool
    """A forward proxy takes the whole URL as the target; a reverse proxy only the path."""


@dataclass(slots=True)
class UpstreamRequest:
    method: str
    url: str
    headers: Sequence[tuple[str, str]]
    body: bytes


class UpstreamResponse:
    """Status and headers, then the body through :meth:`relay_body`."""

    def __init__(
        self,
        status: int,
        headers: list[tuple[str, str]],
        decoder: BodyDecoder,
        head_rest: bytes,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        self.status = status
        self.headers = headers
        self._decoder = decoder
        self._head_rest = head_rest
        self._reader = reader
        self._writer = writer

    async def first_pieces(self) -> list[bytes]:
        """Read until the body yields its first bytes (or ends); the failover job waits for
        them before it commits to this answer. :class:`UpstreamCut` when the body breaks
        first. :meth:`relay_body` then continues after them."""
        decoder = self._decoder
        data, self._head_rest = self._head_rest, b""
        while True:
            if data:
                try:
                    pieces = decoder.feed(data)
                except FramingError as exc:
                    raise UpstreamCut(f"the upstream broke the chunked framing ({exc})") from None
                if pieces or decoder.done:
                    return pieces
            if decoder.done:
                return []
            try:
                data = await self._reader.read(READ_SIZE)
            except (ConnectionError, OSError) as exc:
                raise UpstreamCut(f"the upstream connection failed ({exc})") from None
            if not data:
                if isinstance(decoder, CloseDecoder):
                    decoder.done = True
                    return []
                raise UpstreamCut("the upstream closed the connection mid-body")

    async def read_body(self, limit: int = 1 << 20) -> bytes:
        """The whole (small) body, e.g. an error's; at most ``limit`` bytes are kept."""
        pieces: list[bytes] = []
        size = 0

        def keep(chunk: list[bytes]) -> None:
            nonlocal size
            for piece in chunk:
                if size < limit:
                    pieces.append(piece[: limit - size])
                    size += len(piece)

        async def nothing() -> None:
            return None

        await self.relay_body(keep, nothing)
        return b"".join(pieces)

    async def relay_body(
        self, write: Callable[[list[bytes]], None], drain: Drain, idle: float | None = None
    ) -> None:
        """Hand each piece of the body to ``write`` as it arrives; :class:`UpstreamCut` when
        it ends early, or when ``idle`` seconds pass without a byte. One read, one decode and
        one write per network chunk: this loop runs once per event of every relayed stream."""
        decoder = self._decoder
        reader = self._reader
        try:
            if decoder.done:
                return
            data = self._head_rest
            while True:
                if data:
                    try:
                        pieces = decoder.feed(data)
                    except FramingError as exc:
                        raise UpstreamCut(
                            f"the upstream broke the chunked framing ({exc})"
                        ) from None
                    if pieces:
                        write(pieces)
                        await drain()
                    if decoder.done:
                        return
                try:
                    if idle is None:
                        data = await reader.read(READ_SIZE)
                    else:
                        data = await asyncio.wait_for(reader.read(READ_SIZE), idle)
                except TimeoutError:
                    raise UpstreamStall(f"the upstream sent nothing for {idle:g} s") from None
                except (ConnectionError, OSError) as exc:
                    raise UpstreamCut(f"the upstream connection failed ({exc})") from None
                if not data:
                    if isinstance(decoder, CloseDecoder):
                        return
                    raise UpstreamCut("the upstream closed the connection mid-body")
        finally:
            self.close()

    def close(self) -> None:
        self._writer.close()


def _parse_head(head: bytes) -> tuple[int, list[tuple[str, str]]]:
    lines = head.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    if not version.startswith("HTTP/1."):
        raise ValueError(f"bad status line {lines[0][:60]!r}")
    status = int(rest.split(" ", 1)[0])
    headers = []
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers.append((name.strip(), value.strip()))
    return status, headers


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
    request: UpstreamRequest,
    *,
    tls_context: ssl.SSLContext | None,
    connect_timeout: float,
    via: Proxy | None = None,
) -> UpstreamResponse:
    """Send ``request`` and read the response head; ``via`` sends it through an HTTP proxy
    (in plain HTTP, the target in absolute form) or to a reverse proxy (origin form)."""
    host, host_header, port, path, tls = _target(request.url)
    if via is not None:
        host, port, tls = via.host, via.port, False
        if via.absolute:
            path = request.url
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
            head = await reader.readuntil(b"\r\n\r\n")
            status, response_headers = _parse_head(head)
            if status >= 200 or status == 101:
                break  # 1xx interim answers (100 Continue) are skipped
        decoder = body_decoder(response_headers, status, request.method)
        return UpstreamResponse(status, response_headers, decoder, b"", reader, writer)
    except asyncio.IncompleteReadError:
        writer.close()
        raise UpstreamError("the upstream closed the connection before answering") from None
    except asyncio.LimitOverrunError:
        writer.close()
        raise UpstreamError("the upstream's response head is too large") from None
    except ValueError as exc:
        writer.close()
        raise UpstreamError(f"the upstream's answer is not HTTP ({exc})") from None
    except (ConnectionError, OSError) as exc:
        writer.close()
        raise UpstreamError(f"the upstream connection failed before answering ({exc})") from None
