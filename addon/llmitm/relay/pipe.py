"""An in-memory connection: two asyncio transports joined back to back, for the relay and
mitmproxy, which run on one event loop in one process.

Over loopback TCP every relayed request paid a ``send`` and a ``recv`` each way (mitmproxy's
request to the relay, the relay's answer back) and waited for the next poll of the loop to see
them, and every relayed read of a stream paid one more of each. On a busy machine a loopback
``send`` alone measured about a third of a millisecond. Here a write hands its bytes straight
to the other side's protocol (``data_received``), which wakes its reader in the same loop turn.

What a socket pair guarantees, these transports keep: bytes arrive in order and whole; a side
that stops reading (its reader's buffer full: ``pause_reading``) pauses the other side's
writes (``pause_writing``, so its ``drain`` waits) until it reads again; ``close`` is seen by
the other side as the end of its input (``eof_received``), then each side's protocol hears
``connection_lost`` once it has closed. Bytes written to a side that has closed are dropped,
as a socket's peer would reset them.
"""

from __future__ import annotations

import asyncio
from typing import Any


class PipeTransport(asyncio.Transport):
    """One end of an in-memory connection (see :func:`pipe`)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        protocol: asyncio.Protocol,
        extra: dict[str, Any],
    ) -> None:
        super().__init__(extra)
        self._loop = loop
        self._protocol = protocol
        self._peer: PipeTransport | None = None
        self._closing = False
        self._eof_sent = False
        self._eof_received = False
        self._reading = True
        self._writing_paused = False
        self._lost = False

    # --- what asyncio's streams call ---------------------------------------------------------

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._protocol

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        assert isinstance(protocol, asyncio.Protocol)
        self._protocol = protocol

    def is_closing(self) -> bool:
        return self._closing

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._eof_sent:
            raise RuntimeError("Cannot call write() after write_eof()")
        if not data or self._closing:
            return
        peer = self._peer
        if peer is None or peer._closing or peer._eof_received:
            return  # the other side has gone: a socket's peer would reset these bytes
        peer._protocol.data_received(bytes(data))

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))

    def write_eof(self) -> None:
        if self._eof_sent or self._closing:
            return
        self._eof_sent = True
        peer = self._peer
        if peer is not None:
            peer._receive_eof()

    def can_write_eof(self) -> bool:
        return True

    def get_write_buffer_size(self) -> int:
        """What the other side has received but not read yet (a socket's send buffer and its
        peer's receive buffer, together)."""
        peer = self._peer
        if peer is None or peer._closing:
            return 0
        reader = getattr(peer._protocol, "_stream_reader", None)
        buffer = getattr(reader, "_buffer", None)
        return len(buffer) if buffer is not None else 0

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return (0, 0)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass  # the other side's reader decides when writes pause

    def is_reading(self) -> bool:
        return self._reading and not self._closing

    def pause_reading(self) -> None:
        if not self._reading:
            return
        self._reading = False
        peer = self._peer
        if peer is not None and not peer._closing and not peer._writing_paused:
            peer._writing_paused = True
            peer._protocol.pause_writing()

    def resume_reading(self) -> None:
        if self._reading:
            return
        self._reading = True
        peer = self._peer
        if peer is not None and not peer._closing and peer._writing_paused:
            peer._writing_paused = False
            peer._protocol.resume_writing()

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        peer = self._peer
        if peer is not None:
            if not self._eof_sent:
                peer._receive_eof()
            if peer._writing_paused and not peer._closing:
                # Nothing will be read any more: the other side's drain must not wait forever.
                peer._writing_paused = False
                peer._protocol.resume_writing()
        self._loop.call_soon(self._connection_lost, None)

    def abort(self) -> None:
        self.close()

    # --- inside ----------------------------------------------------------------------------

    def _receive_eof(self) -> None:
        if self._eof_received or self._closing:
            return
        self._eof_received = True
        self._loop.call_soon(self._eof)

    def _eof(self) -> None:
        if self._closing:
            return
        keep_open = self._protocol.eof_received()
        if not keep_open:
            self.close()

    def _connection_lost(self, exc: BaseException | None) -> None:
        if self._lost:
            return
        self._lost = True
        self._protocol.connection_lost(exc)


def pipe(
    loop: asyncio.AbstractEventLoop,
    near: asyncio.Protocol,
    far: asyncio.Protocol,
    near_address: tuple[str, int],
    far_address: tuple[str, int],
) -> tuple[PipeTransport, PipeTransport]:
    """Join ``near`` and ``far`` by an in-memory connection; both protocols have been told
    ``connection_made``. The addresses are what each side reports as its own
    (``sockname``) and the other side's (``peername``)."""
    near_transport = PipeTransport(loop, near, {"peername": far_address, "sockname": near_address})
    far_transport = PipeTransport(loop, far, {"peername": near_address, "sockname": far_address})
    near_transport._peer = far_transport
    far_transport._peer = near_transport
    near.connection_made(near_transport)
    far.connection_made(far_transport)
    return near_transport, far_transport


def stream_pipe(
    loop: asyncio.AbstractEventLoop,
    near_address: tuple[str, int],
    far_address: tuple[str, int],
    *,
    limit: int = 2**16,
) -> tuple[
    tuple[asyncio.StreamReader, asyncio.StreamWriter],
    tuple[asyncio.StreamReader, asyncio.StreamWriter],
]:
    """Two ends of an in-memory connection as asyncio stream pairs: what
    ``asyncio.open_connection`` returns on one side, what ``asyncio.start_server`` hands its
    callback on the other."""
    near_reader = asyncio.StreamReader(limit=limit, loop=loop)
    far_reader = asyncio.StreamReader(limit=limit, loop=loop)
    near_protocol = asyncio.StreamReaderProtocol(near_reader, loop=loop)
    far_protocol = asyncio.StreamReaderProtocol(far_reader, loop=loop)
    near_transport, far_transport = pipe(
        loop, near_protocol, far_protocol, near_address, far_address
    )
    near_writer = asyncio.StreamWriter(near_transport, near_protocol, near_reader, loop)
    far_writer = asyncio.StreamWriter(far_transport, far_protocol, far_reader, loop)
    return (near_reader, near_writer), (far_reader, far_writer)
