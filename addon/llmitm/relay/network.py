"""httpcore's network backend on plain asyncio streams, for the relay's upstream pool.

httpcore's default backend goes through anyio: a cancel scope around every read and anyio's
own stream wrappers. The relay reads once per event of every stream it relays, and measured
on one stream read per event, anyio's backend cost about twice the CPU per read of asyncio's
streams (``scripts/bench_relay_pool.py`` compares them); this one is the same asyncio
``StreamReader``/``StreamWriter`` pair the hand-written client used, behind httpcore's
interface. Timeouts are the caller's bounds; errors become httpcore's, which the client maps.
Its reader (:class:`BlockReader`) hands a block the socket brought back as it came, instead of
copying it into a buffer and out again, when nothing else is buffered: what a large event's
bytes cost on their way through the relay.

:data:`OPENED` counts the connections opened on the caller's behalf (the backend runs in the
caller's task, so a context variable sees them): a request that failed before its answer on a
connection it did not open ran on a pooled one, and may be retried on a fresh connection.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterable
from contextvars import ContextVar
from typing import Any

import httpcore

OPENED: ContextVar[list[int] | None] = ContextVar("llmitm_relay_opened", default=None)
"""A one-item counter the caller sets before a request: connections opened for it."""


class BlockReader(asyncio.StreamReader):
    """asyncio's ``StreamReader``, except that a ``read`` finding just one received block, no
    larger than it asked for, returns that block itself.

    asyncio's reader appends every block the transport receives to one ``bytearray`` and
    copies each read out of it: two copies of every byte, which a relayed 20 MiB event paid in
    full. Here a block that arrives while nothing is buffered is kept aside as it came; the
    next block, or any read but ``read``, puts it into the buffer first, so everything else
    behaves as asyncio's reader does (the transport is paused and resumed by the same rule).
    """

    _block: bytes | None = None
    _blocks = True  # off for good once a line or exact read is asked for

    def feed_data(self, data: bytes) -> None:
        idle = not self._buffer and self._block is None and not self._eof
        if idle and self._blocks and type(data) is bytes and data:
            self._block = data
            self._wakeup_waiter()
            if len(data) > 2 * self._limit:
                self._pause()
            return
        self._merge()
        super().feed_data(data)

    async def read(self, n: int = -1) -> bytes:
        if self._exception is not None:
            raise self._exception
        if n > 0 and self._blocks:
            if not self._buffer and self._block is None and not self._eof:
                await self._wait_for_data("read")
            block = self._block
            if block is not None and len(block) <= n:
                self._block = None
                self._maybe_resume_transport()
                return block
        self._merge()
        return await super().read(n)

    def at_eof(self) -> bool:
        return self._block is None and super().at_eof()

    @property
    def buffered(self) -> bool:
        """Bytes are waiting to be read."""
        return self._block is not None or bool(self._buffer)

    async def readline(self) -> bytes:
        self._no_blocks()
        return await super().readline()

    async def readuntil(self, separator: bytes = b"\n") -> bytes:
        self._no_blocks()
        return await super().readuntil(separator)

    async def readexactly(self, n: int) -> bytes:
        self._no_blocks()
        return await super().readexactly(n)

    def _no_blocks(self) -> None:
        self._blocks = False
        self._merge()

    def _merge(self) -> None:
        block = self._block
        if block is not None:
            self._block = None
            self._buffer.extend(block)

    def _pause(self) -> None:
        transport = self._transport
        if transport is not None and not self._paused:
            try:
                transport.pause_reading()
            except NotImplementedError:
                self._transport = None
            else:
                self._paused = True


class AsyncioStream(httpcore.AsyncNetworkStream):
    __slots__ = ("_reader", "_writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    @property
    def reader(self) -> asyncio.StreamReader:
        """The stream's reader, for the client's HTTP/1.1 body fast path (``client``)."""
        return self._reader

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        try:
            if timeout is None:
                return await self._reader.read(max_bytes)
            return await asyncio.wait_for(self._reader.read(max_bytes), timeout)
        except TimeoutError:
            raise httpcore.ReadTimeout(f"nothing read for {timeout:g} s") from None
        except OSError as exc:
            raise httpcore.ReadError(str(exc) or type(exc).__name__) from None

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        try:
            writer = self._writer
            writer.write(buffer)
            if writer.transport.get_write_buffer_size() or writer.transport.is_closing():
                # Only a write the socket did not take at once waits (a request mostly
                # fits): no timer armed and cancelled around every write.
                await asyncio.wait_for(writer.drain(), timeout)
        except TimeoutError:
            raise httpcore.WriteTimeout(f"could not write for {timeout:g} s") from None
        except OSError as exc:
            raise httpcore.WriteError(str(exc) or type(exc).__name__) from None

    def write_now(self, buffer: bytes) -> None:
        """Queue ``buffer`` without waiting (an HTTP/2 stream reset, see ``client``)."""
        if not self._writer.transport.is_closing():
            self._writer.write(buffer)

    async def aclose(self) -> None:
        # No wait for the peer's close: a connection given up on must not hold its caller.
        self._writer.close()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.AsyncNetworkStream:
        # Through a proxy's CONNECT tunnel: TLS on the connection already open.
        try:
            await asyncio.wait_for(
                self._writer.start_tls(ssl_context, server_hostname=server_hostname), timeout
            )
        except TimeoutError:
            self._writer.close()
            raise httpcore.ConnectTimeout("the TLS handshake timed out") from None
        except (OSError, ssl.SSLError) as exc:
            self._writer.close()
            raise httpcore.ConnectError(str(exc) or type(exc).__name__) from None
        return self

    def get_extra_info(self, info: str) -> Any:
        transport = self._writer.transport
        if info == "is_readable":
            # Asked of an idle pooled connection: anything readable there (the peer's close
            # most often) means it cannot carry another request.
            return self._reader.at_eof() or transport.is_closing() or _buffered(self._reader)
        if info in ("ssl_object", "socket"):
            return transport.get_extra_info(info)
        if info == "server_addr":
            return transport.get_extra_info("peername")
        if info == "client_addr":
            return transport.get_extra_info("sockname")
        return None


def _buffered(reader: asyncio.StreamReader) -> bool:
    if isinstance(reader, BlockReader):
        return reader.buffered
    buffer = getattr(reader, "_buffer", None)  # no public way to peek: assume empty without it
    return bool(buffer)


async def _open_connection(
    host: str, port: int, local: tuple[str, int] | None
) -> tuple[BlockReader, asyncio.StreamWriter]:
    """``asyncio.open_connection`` with a :class:`BlockReader`."""
    loop = asyncio.get_running_loop()
    reader = BlockReader(loop=loop)
    protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
    transport, _ = await loop.create_connection(lambda: protocol, host, port, local_addr=local)
    return reader, asyncio.StreamWriter(transport, protocol, reader, loop)


class AsyncioBackend(httpcore.AsyncNetworkBackend):
    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        local = (local_address, 0) if local_address else None
        try:
            reader, writer = await asyncio.wait_for(_open_connection(host, port, local), timeout)
        except TimeoutError:
            raise httpcore.ConnectTimeout(f"connecting to {host}:{port} timed out") from None
        except OSError as exc:
            raise httpcore.ConnectError(str(exc) or type(exc).__name__) from None
        opened = OPENED.get()
        if opened is not None:
            opened[0] += 1
        return AsyncioStream(reader, writer)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("the relay does not connect to Unix sockets")

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
