"""The relay's upstream client: httpcore's connection pool (the transport under httpx) on an
asyncio network backend (:mod:`llmitm.relay.network`).

Keep-alive connections are pooled per origin — at most :data:`KEEPALIVE` idle ones kept, each
for at most :data:`IDLE_EXPIRY` seconds — so a failover route's second request skips the TCP
and TLS handshakes; HTTP/2 is spoken where a TLS upstream offers it (ALPN); requests go
through mitmproxy's upstream proxy when it runs in ``upstream:`` mode, and TLS follows its
options (CA bundle, ``ssl_insecure``, client certificates), all given as plain
:class:`UpstreamSettings` by the addons.

What it guarantees, as the hand-written HTTP/1.1 client before it did: :class:`UpstreamError`
before the answer's head; a body that ends before its framing says raises
:class:`UpstreamCut`, never a silent short read; :class:`UpstreamStall` when a stream sends
nothing for its idle limit; hop-by-hop headers never cross. A response given up on before its
end (cut, stall, the client leaving) never goes back to the pool: its HTTP/1.1 connection is
closed, its HTTP/2 stream reset. A request that fails before any answer on a pooled
connection (the upstream closed it while idle) is sent again once, on a fresh connection.

A request that finds an idle HTTP/1.1 connection to its origin in the pool skips httpcore's
request path (:mod:`llmitm.relay.idle_http11`): the same bytes written, the answer's head read
by the connection's own h11 state, the connection handed back by httpcore's own rules. One
that finds an HTTP/2 connection to its origin with a stream slot free opens its stream there
the same way (:mod:`llmitm.relay.pooled_http2`), and reads its body's data frames a read at
a time instead of through httpcore's iterator.

The body is the per-event hot path (one read per event of every relayed stream). An HTTP/1.1
body is read straight from the pooled connection's reader, not through httpcore's three nested
async generators: a chunked one's framing is decoded from each read as it came
(:mod:`llmitm.relay.chunked`, which spares a large event h11's copies) from its first byte,
what h11 read with the head included, any other by the connection's own h11 state; every
chunk one read brings is relayed in one write; the idle limit is one timer per body, re-armed
only when it fires early, instead of a timeout armed and cancelled around every read.
httpcore still owns the connection: the body's end (or its abandonment) is handed back to it,
so it returns the connection to the pool only when h11 saw the whole body.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import SplitResult, urlsplit

import h11
import httpcore
from h11._readers import ChunkedReader
from h11._receivebuffer import ReceiveBuffer

from llmitm.errors import TransportError
from llmitm.relay import fast_locks, idle_http11, pooled_http2
from llmitm.relay.chunked import ChunkedBody, ChunkError
from llmitm.relay.network import OPENED, AsyncioBackend, AsyncioStream

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
KEEPALIVE = 32
"""Idle connections kept for reuse, over all origins (more are closed when released)."""
IDLE_EXPIRY = 60.0
"""Seconds an idle connection is kept: below the idle limits of the usual load balancers."""
WRITE_TIMEOUT = 120.0
"""The longest wait for the upstream to take a piece of the request body."""

READ_SIZE = 64 * 1024
"""The most one read of an HTTP/1.1 body takes (httpcore's own read size)."""
BLOCK_READ = 1 << 20
"""The most one read of a chunked body read without h11 takes: more than a socket read brings
(asyncio's 256 KiB), so each block the connection's reader received comes back whole."""

_CUT = (
    httpcore.RemoteProtocolError,
    httpcore.ReadError,
    httpcore.NetworkError,
    h11.RemoteProtocolError,
    OSError,
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


@dataclass(frozen=True, slots=True)
class UpstreamProxy:
    """The HTTP(S) proxy every upstream request goes through (mitmproxy's ``upstream:`` mode):
    CONNECT for an HTTPS upstream, the absolute URL for a plain one."""

    url: str
    auth: tuple[str, str] | None = None


@dataclass(frozen=True, slots=True)
class UpstreamSettings:
    """How the relay reaches upstreams, from mitmproxy's options (``addons.relay``)."""

    tls_context: ssl.SSLContext | None = None
    """Verification and client certificate; ``None``: the system's defaults."""
    host_tls: Mapping[str, ssl.SSLContext] = field(default_factory=dict)
    """Contexts for hosts with a client certificate of their own (``<host>.pem`` in a
    ``client_certs`` folder)."""
    proxy: UpstreamProxy | None = None
    http2: bool = True
    keepalive: int = KEEPALIVE
    idle_expiry: float = IDLE_EXPIRY


@dataclass(slots=True)
class UpstreamRequest:
    method: str
    url: str
    headers: Sequence[tuple[str, str]]
    body: bytes


class UpstreamClient:
    """Pools of connections to the upstreams, opened lazily on the running loop."""

    def __init__(self, settings: UpstreamSettings | None = None) -> None:
        self.settings = settings or UpstreamSettings()
        self._pools: dict[str, httpcore.AsyncConnectionPool] = {}
        self._origins: dict[tuple[str, str, int], httpcore.Origin] = {}
        fast_locks.install()  # once per process: no forced loop turns per request

    def _pool(self, key: str) -> httpcore.AsyncConnectionPool:
        """The pool for ``key``: ``"via"`` (straight to a local proxy listener), a host with a
        client certificate of its own, or ``""`` (every other upstream)."""
        pool = self._pools.get(key)
        if pool is not None:
            return pool
        settings = self.settings
        tls = settings.host_tls.get(key, settings.tls_context)
        common: dict[str, Any] = {
            "ssl_context": tls,
            "max_connections": None,
            "max_keepalive_connections": settings.keepalive,
            "keepalive_expiry": settings.idle_expiry,
            "http2": settings.http2,
            "network_backend": AsyncioBackend(),
        }
        if settings.proxy is not None and key != "via":
            proxy = settings.proxy
            pool = httpcore.AsyncHTTPProxy(
                proxy_url=proxy.url,
                proxy_auth=proxy.auth,
                # An HTTPS proxy is verified as upstreams are (httpcore refuses one for HTTP).
                proxy_ssl_context=settings.tls_context if proxy.url.startswith("https:") else None,
                **common,
            )
        else:
            pool = httpcore.AsyncConnectionPool(**common)
        self._pools[key] = pool
        return pool

    def _origin(self, url: str, where: Proxy | SplitResult) -> httpcore.Origin:
        """The origin httpcore's pool files ``url``'s connections under (``where``: the
        proxy listener or the URL's parts, the key it is kept by)."""
        if isinstance(where, Proxy):
            key = ("http", where.host, where.port)
        else:
            key = (where.scheme, where.hostname or "", where.port or 0)
        origin = self._origins.get(key)
        if origin is None:
            origin = self._origins[key] = httpcore.URL(url).origin
        return origin

    def connections(self) -> int:
        """Connections the pools hold now (idle or busy)."""
        return sum(len(pool.connections) for pool in self._pools.values())

    async def aclose(self, *, busy: bool = True) -> None:
        """Close the pools' connections; with ``busy=False`` only the idle ones (the client is
        being replaced and requests under way finish on theirs)."""
        pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            with contextlib.suppress(Exception):
                if busy:
                    await pool.aclose()
                else:
                    for connection in pool.connections:
                        if connection.is_idle():
                            await connection.aclose()

    async def send(
        self, request: UpstreamRequest, *, connect_timeout: float, via: Proxy | None = None
    ) -> UpstreamResponse:
        """Send ``request`` and read the answer's head; ``via`` sends it to a local proxy
        listener instead (the target in absolute form for a forward proxy, origin form for
        a reverse one), never through the upstream proxy."""
        parts = urlsplit(request.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UpstreamError(f"cannot relay to {request.url!r}")
        host = parts.hostname
        tls = parts.scheme == "https"
        port = parts.port or (443 if tls else 80)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        default_port = port == (443 if tls else 80)
        authority = f"[{host}]" if ":" in host else host
        host_header = authority if default_port else f"{authority}:{port}"
        timeouts = {
            "connect": connect_timeout,
            "read": None,  # the first-byte and idle limits are the callers'
            "write": WRITE_TIMEOUT,
            "pool": connect_timeout,
        }
        extensions: dict[str, Any] = {"timeout": timeouts}
        url = request.url
        key = host if host in self.settings.host_tls else ""
        if via is not None:
            url = f"http://{via.host}:{via.port}{path}"
            extensions["target"] = (request.url if via.absolute else path).encode()
            key = "via"
        headers = [(b"host", host_header.encode("latin-1"))]
        headers += [
            (name.encode("latin-1"), value.encode("latin-1"))
            for name, value in request.headers
            if name.lower() not in HOP_BY_HOP
        ]
        headers.append((b"content-length", str(len(request.body)).encode()))
        pool = self._pool(key)
        where = f"{host}:{port}"
        if tls and via is None and self.settings.http2:
            pooled = await _send_pooled_http2(
                pool, self._origin(url, parts), request, path, headers, where
            )
            if pooled is not None:
                return UpstreamResponse(pooled)
        try:
            idle = await idle_http11.send(
                pool,
                self._origin(url, via or parts),
                request.method,
                extensions.get("target") or path,
                headers,
                request.body,
                WRITE_TIMEOUT,
            )
        except idle_http11.IdleConnectionClosed:
            idle = None  # sent again below, on another connection
        except httpcore.WriteTimeout:
            raise UpstreamError(f"{where} did not take the request in time") from None
        except httpcore.RemoteProtocolError as exc:
            raise UpstreamError(f"the upstream's answer is not HTTP ({exc})") from None
        except httpcore.ReadError as exc:
            raise UpstreamError(
                f"the upstream connection failed before answering ({_reason(exc)})"
            ) from None
        if idle is not None:
            return UpstreamResponse(idle)
        for attempt in (1, 2):
            opened = [0]
            token = OPENED.set(opened)
            try:
                answer = await pool.handle_async_request(
                    httpcore.Request(
                        request.method, url, headers=headers, content=request.body,
                        extensions=extensions,
                    )
                )  # fmt: skip
                return UpstreamResponse(answer)
            except (httpcore.ConnectTimeout, httpcore.PoolTimeout):
                raise UpstreamError(f"connecting to {where} timed out") from None
            except httpcore.WriteTimeout:
                raise UpstreamError(f"{where} did not take the request in time") from None
            except httpcore.ProxyError as exc:
                raise UpstreamError(f"the upstream proxy refused {where} ({exc})") from None
            except httpcore.ConnectError as exc:
                raise UpstreamError(f"cannot connect to {where} ({_reason(exc)})") from None
            except httpcore.RemoteProtocolError as exc:
                if attempt == 1 and not opened[0] and _disconnected(exc):
                    continue  # a pooled connection the upstream had closed while idle
                if _disconnected(exc):
                    message = "the upstream closed the connection before answering"
                else:
                    message = f"the upstream's answer is not HTTP ({exc})"
                raise UpstreamError(message) from None
            except (httpcore.ReadError, httpcore.WriteError, httpcore.NetworkError) as exc:
                if attempt == 1 and not opened[0]:
                    continue
                raise UpstreamError(
                    f"the upstream connection failed before answering ({_reason(exc)})"
                ) from None
            except (httpcore.UnsupportedProtocol, httpcore.LocalProtocolError) as exc:
                raise UpstreamError(f"cannot relay to {request.url!r} ({exc})") from None
            finally:
                OPENED.reset(token)
        raise AssertionError("unreachable")  # pragma: no cover


async def _send_pooled_http2(
    pool: httpcore.AsyncConnectionPool,
    origin: httpcore.Origin,
    request: UpstreamRequest,
    path: str,
    headers: list[tuple[bytes, bytes]],
    where: str,
) -> pooled_http2.PooledStream | None:
    """:func:`pooled_http2.send` with its errors as the client's; ``None`` when it took no
    connection, or the one it took went away before the upstream took the stream."""
    try:
        method, target = request.method.encode("ascii"), path.encode("ascii")
    except UnicodeEncodeError:
        return None
    try:
        return await pooled_http2.send(
            pool, origin, method, headers[0][1], target, headers[1:], request.body, WRITE_TIMEOUT
        )
    except pooled_http2.StreamNotSent:
        return None  # sent again by httpcore's path, on a connection that takes it
    except httpcore.WriteTimeout:
        raise UpstreamError(f"{where} did not take the request in time") from None
    except httpcore.LocalProtocolError as exc:
        raise UpstreamError(f"cannot relay to {request.url!r} ({exc})") from None
    except httpcore.RemoteProtocolError as exc:
        raise UpstreamError(f"the upstream's answer is not HTTP/2 ({exc})") from None
    except (httpcore.ReadError, httpcore.WriteError, httpcore.NetworkError) as exc:
        raise UpstreamError(
            f"the upstream connection failed before answering ({_reason(exc)})"
        ) from None


def _disconnected(exc: Exception) -> bool:
    return "disconnected" in str(exc).lower() or "without sending" in str(exc).lower()


def _reason(exc: Exception) -> str:
    return str(exc) or type(exc).__name__


class UpstreamResponse:
    """Status and headers, then the body through :meth:`relay_body`."""

    __slots__ = (
        "_answer",
        "_chunked",
        "_chunks",
        "_closed",
        "_done",
        "_h11",
        "_reader",
        "headers",
        "http_version",
        "status",
    )

    def __init__(
        self, answer: httpcore.Response | idle_http11.IdleAnswer | pooled_http2.PooledStream
    ) -> None:
        self._answer = answer
        self.status = answer.status
        self.headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in answer.headers]
        version = answer.extensions.get("http_version", b"HTTP/1.1")
        self.http_version = version.decode("ascii", "replace")
        if type(answer) is idle_http11.IdleAnswer:
            self._h11, self._reader = answer.state, answer.reader
        elif type(answer) is pooled_http2.PooledStream:
            self._h11, self._reader = None, None
        else:
            self._h11, self._reader = _http11_parts(answer.stream)
        self._chunks: Any = None  # httpcore's body iterator, started only without h11's
        self._chunked: ChunkedBody | bool = self._h11 is not None
        """The chunked framing once read without h11 (from its first byte, h11's buffer
        included); ``True``: not taken over yet; ``False``: h11 reads the whole body."""
        self._done = False
        self._closed = False

    async def _pieces(self) -> list[bytes]:
        """The body bytes of the next read (empty at the end, then ``_done`` is set), in one
        piece when h11 has them; raises what :data:`_CUT` names when the body breaks."""
        state = self._h11
        if state is None:
            answer = self._answer
            if type(answer) is pooled_http2.PooledStream:
                pieces = await answer.pieces()
                self._done = answer.ended
                return pieces
            if self._chunks is None:
                stream = self._answer.stream
                assert hasattr(stream, "__aiter__")
                self._chunks = stream.__aiter__()
            try:
                return [await anext(self._chunks)]
            except StopAsyncIteration:
                self._done = True
                return []
        reader = self._reader
        assert reader is not None
        chunked = self._chunked
        if chunked is True:
            chunked = self._chunked = _take_over(state)
        if chunked is not True and chunked is not False:
            return await _chunk_pieces(self, chunked, state, reader)
        pieces: list[bytes] = []
        while True:
            event = state.next_event()
            if type(event) is h11.Data:
                pieces.append(event.data)  # type: ignore[arg-type]  # a bytearray, joined below
            elif event is h11.NEED_DATA:
                if pieces:
                    break
                # At the end of the stream h11 gets b"": a body short of its framing then
                # raises h11.RemoteProtocolError, a close-delimited one ends.
                state.receive_data(await reader.read(READ_SIZE))
            else:  # EndOfMessage (h11 reads no further: never a next response's bytes)
                self._done = True
                break
        if not pieces:
            return []
        return [b"".join(pieces)]

    async def first_pieces(self) -> list[bytes]:
        """Read until the body yields its first bytes (or ends); the failover job waits for
        them before it commits to this answer. :class:`UpstreamCut` when the body breaks
        first. :meth:`relay_body` then continues after them."""
        try:
            while not self._done:
                pieces = await self._pieces()
                if pieces and pieces[0]:
                    return pieces
        except _CUT as exc:
            await self.aclose()
            raise UpstreamCut(_cut_message(exc)) from None
        return []

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

        await self.relay_body(keep, _nothing)
        return b"".join(pieces)

    async def relay_body(
        self, write: Callable[[list[bytes]], None], drain: Drain, idle: float | None = None
    ) -> None:
        """Hand the body to ``write`` as it arrives, all a read brought in one call;
        :class:`UpstreamCut` when it ends early, :class:`UpstreamStall` when ``idle`` seconds
        pass in a read without a byte (time spent in ``drain`` does not count). This loop
        runs once per event of every relayed stream."""
        limit = _IdleLimit(idle) if idle is not None and not self._done else None
        try:
            while not self._done:
                if limit is not None:
                    limit.reading_since = limit.loop.time()
                try:
                    pieces = await self._pieces()
                except _CUT as exc:
                    raise UpstreamCut(_cut_message(exc)) from None
                except asyncio.CancelledError:
                    if limit is not None and limit.expired and limit.task.uncancel() == 0:
                        raise UpstreamStall(f"the upstream sent nothing for {idle:g} s") from None
                    raise
                if limit is not None:
                    limit.reading_since = None
                if pieces and pieces[0]:
                    write(pieces)
                    await drain()
        finally:
            if limit is not None:
                limit.stop()
            await self.aclose()

    async def aclose(self) -> None:
        """Give the connection back to the pool when the body was read to its end, else
        close it (HTTP/1.1) or reset the stream (HTTP/2): a connection in an unknown state
        never carries another request."""
        if self._closed:
            return
        self._closed = True
        if not self._done and self.http_version == "HTTP/2":
            _reset_stream(self._answer.stream)
        with contextlib.suppress(Exception):
            # httpcore's HTTP/1.1 connection goes back to the pool only when h11 says both
            # sides are done, whoever read the body; otherwise it is closed.
            await self._answer.aclose()


class _IdleLimit:
    """The idle limit of one body: cancels the reading task once a read has waited ``idle``
    seconds. One timer for the whole body: a read only notes when it started, and the timer,
    when it fires, re-arms itself at that read's deadline if it is still ahead (or when no
    read is waiting) — no timer armed and cancelled per read, as ``asyncio.wait_for`` does."""

    __slots__ = ("_handle", "expired", "idle", "loop", "reading_since", "task")

    def __init__(self, idle: float) -> None:
        self.loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        self.task = task
        self.idle = idle
        self.reading_since: float | None = None
        self.expired = False
        self._handle: asyncio.TimerHandle | None = self.loop.call_at(
            self.loop.time() + idle, self._check
        )

    def _check(self) -> None:
        since = self.reading_since
        now = self.loop.time()
        if since is None or now < since + self.idle:
            start = now if since is None else since
            self._handle = self.loop.call_at(start + self.idle, self._check)
            return
        self._handle = None
        self.expired = True
        self.task.cancel()

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


def _http11_parts(stream: object) -> tuple[h11.Connection | None, asyncio.StreamReader | None]:
    """The h11 state and the reader of the pooled HTTP/1.1 connection carrying ``stream`` (a
    response's stream from httpcore's pool: ``PoolByteStream._stream`` is the connection's
    ``HTTP11ConnectionByteStream``), for reading its body without httpcore's iterators; two
    ``None`` for HTTP/2 or a shape this code does not know, which then reads through httpcore."""
    inner = getattr(stream, "_stream", None)
    connection = getattr(inner, "_connection", None)
    state = getattr(connection, "_h11_state", None)
    network = getattr(connection, "_network_stream", None)
    if (
        isinstance(state, h11.Connection)
        and isinstance(network, AsyncioStream)
        and state.their_state is h11.SEND_BODY
    ):
        return state, network.reader
    return None, None


def _take_over(state: h11.Connection) -> ChunkedBody | bool:
    """The chunked framing where h11 stands, taken from it with whatever of the body h11 holds
    (handed to the new framing as its first read: the first events, which came in the read
    that brought the head, are not decoded through h11's events); ``True`` while h11 reads a
    trailer (a later read may take over), ``False`` when the body is not chunked, h11 has
    seen the connection's end, or its reader is not the one this code knows."""
    body = getattr(state, "_reader", None)
    if type(body) is not ChunkedReader or getattr(state, "_receive_buffer_closed", True):
        return False
    if body._reading_trailer:
        return True
    buffer = getattr(state, "_receive_buffer", None)
    if type(buffer) is not ReceiveBuffer:
        return False
    chunked = ChunkedBody(body._bytes_in_chunk, body._bytes_to_discard)
    body._bytes_in_chunk, body._bytes_to_discard = 0, b""
    if len(buffer):
        # ``_extract`` empties h11's buffer as its own reads do (its line searches reset).
        chunked.pending = bytes(buffer._extract(len(buffer)))
    return chunked


async def _chunk_pieces(
    response: UpstreamResponse,
    chunked: ChunkedBody,
    state: h11.Connection,
    reader: asyncio.StreamReader,
) -> list[bytes]:
    """:meth:`UpstreamResponse._pieces` for a chunked body read without h11."""
    while True:
        data = chunked.pending
        if data:
            chunked.pending = b""
        else:
            data = await reader.read(BLOCK_READ)
        if not data:
            raise h11.RemoteProtocolError(
                "peer closed connection without sending complete message body "
                "(incomplete chunked read)"
            )
        try:
            pieces = chunked.feed(data)
        except ChunkError as exc:
            raise h11.RemoteProtocolError(str(exc)) from None
        if chunked.ended:
            # h11 ends the message its way (and httpcore pools the connection by it).
            state.receive_data(b"0\r\n\r\n" + chunked.rest)
            if type(state.next_event()) is not h11.EndOfMessage:
                raise h11.RemoteProtocolError("the chunked body did not end cleanly")
            response._done = True
            break
        if pieces:
            break
    if len(pieces) > 1:
        return [b"".join(pieces)]
    return pieces


async def _nothing() -> None:
    return None


def _cut_message(exc: Exception) -> str:
    text = str(exc)
    if "incomplete" in text or "without sending complete" in text or not text:
        return "the upstream closed the connection mid-body"
    return f"the upstream connection failed ({text})"


def _reset_stream(stream: object) -> None:
    """Reset an HTTP/2 stream given up on before its end. httpcore 1.0 only forgets it
    (encode/httpcore#943): the upstream would go on generating an answer nobody reads, into
    a window nobody opens, and h2's count of open streams would drift from httpcore's. So
    this reaches into httpcore's pool stream (``_stream``) for its HTTP/2 connection and
    stream id, and sends the RST_STREAM itself; without those it does nothing."""
    inner = getattr(stream, "_stream", None)
    connection = getattr(inner, "_connection", None)
    stream_id = getattr(inner, "_stream_id", None)
    if (
        getattr(connection, "_h2_state", None) is None
        or stream_id is None
        or type(getattr(connection, "_network_stream", None)) is not AsyncioStream
    ):
        return
    pooled_http2.reset(connection, stream_id)


async def send(
    request: UpstreamRequest,
    *,
    client: UpstreamClient,
    connect_timeout: float,
    via: Proxy | None = None,
) -> UpstreamResponse:
    """:meth:`UpstreamClient.send`."""
    return await client.send(request, connect_timeout=connect_timeout, via=via)
