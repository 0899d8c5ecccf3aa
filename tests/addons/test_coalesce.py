"""Batched client writes: same bytes in the same order, fewer writes, nothing held past the
loop turn, flushed before a (half-)close."""

from __future__ import annotations

import asyncio
from typing import Any

from mitmproxy.test import taddons, tflow

from llmitm.addons.patches import coalesce
from llmitm.addons.patches.coalesce import MAX_PENDING, UNBATCHED_WRITES, coalesce_client_writes


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.eof = False
        self.closing = False

    def write(self, data: bytes) -> None:  # type: ignore[override]
        assert not self.eof and not self.closing
        self.writes.append(bytes(data))

    def write_eof(self) -> None:
        self.eof = True

    def can_write_eof(self) -> bool:
        return True

    def close(self) -> None:
        self.closing = True

    def is_closing(self) -> bool:
        return self.closing


def _writer(loop: asyncio.AbstractEventLoop) -> tuple[asyncio.StreamWriter, _Transport]:
    transport = _Transport()
    protocol = asyncio.StreamReaderProtocol(asyncio.StreamReader(loop=loop), loop=loop)
    return asyncio.StreamWriter(transport, protocol, None, loop), transport


class _Handler:
    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.client = object()
        self.transports = {self.client: type("IO", (), {"writer": writer})()}


class _Proxyserver:
    def __init__(self) -> None:
        self.connections: dict[object, _Handler] = {}


def _batched(flow: Any, writer: asyncio.StreamWriter, tctx: Any) -> bool:
    proxyserver = _Proxyserver()
    proxyserver.connections[flow.client_conn.id] = _Handler(writer)
    tctx.master.addons.get = lambda name: proxyserver if name == "proxyserver" else None
    return coalesce_client_writes(flow)


async def test_one_turns_writes_go_out_as_one_in_order() -> None:
    loop = asyncio.get_running_loop()
    writer, transport = _writer(loop)
    with taddons.context() as tctx:
        flow = tflow.tflow()
        assert _batched(flow, writer, tctx)
        for _ in range(UNBATCHED_WRITES):
            writer.write(b"-")  # a stream's start: at once
        assert transport.writes == [b"-"] * UNBATCHED_WRITES
        transport.writes.clear()
        for piece in (b"a", b"bc", b"d"):
            writer.write(piece)
        assert transport.writes == []
        await asyncio.sleep(0)
        assert transport.writes == [b"abcd"]
        writer.write(b"e")  # a later turn: its own write, not held back
        await asyncio.sleep(0)
        assert transport.writes == [b"abcd", b"e"]
        assert _batched(flow, writer, tctx)  # the next stream on the connection starts unbatched
        writer.write(b"f")
        assert transport.writes == [b"abcd", b"e", b"f"]


def _unbatched_done(writer: asyncio.StreamWriter) -> None:
    writer.write.__self__.unbatched = 0  # type: ignore[attr-defined]


async def test_a_long_burst_is_sent_in_pieces_as_it_comes() -> None:
    writer, transport = _writer(asyncio.get_running_loop())
    with taddons.context() as tctx:
        assert _batched(tflow.tflow(), writer, tctx)
        _unbatched_done(writer)
        piece = b"x" * 1000
        for _ in range(MAX_PENDING // 1000 + 1):
            writer.write(piece)
        assert len(transport.writes) == 1 and len(transport.writes[0]) >= MAX_PENDING
        writer.write(b"tail")
        await asyncio.sleep(0)
        assert b"".join(transport.writes) == piece * (MAX_PENDING // 1000 + 1) + b"tail"


async def test_half_close_and_close_send_what_is_pending_first() -> None:
    loop = asyncio.get_running_loop()
    writer, transport = _writer(loop)
    with taddons.context() as tctx:
        assert _batched(tflow.tflow(), writer, tctx)
        _unbatched_done(writer)
        writer.write(b"last")
        writer.write_eof()
        assert transport.writes == [b"last"] and transport.eof
    writer, transport = _writer(loop)
    with taddons.context() as tctx:
        assert _batched(tflow.tflow(), writer, tctx)
        _unbatched_done(writer)
        writer.write(b"bye")
        writer.close()
        assert transport.writes == [b"bye"] and transport.closing
        writer.write(b"late")  # as mitmproxy: nothing reaches a closing connection
        await asyncio.sleep(0)
        assert transport.writes == [b"bye"]


def test_without_a_registry_nothing_changes() -> None:
    with taddons.context():
        assert not coalesce_client_writes(tflow.tflow())
    assert coalesce.MAX_PENDING > 0
