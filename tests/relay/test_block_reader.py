"""The relay connections' reader: a received block comes back as it came, and everything else
is asyncio's ``StreamReader`` (order of bytes, lines, end of stream, pausing the transport)."""

from __future__ import annotations

import asyncio

from llmitm.relay.network import BlockReader


class Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.paused = False

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False


async def test_a_block_read_alone_is_the_block_itself() -> None:
    reader = BlockReader()
    block = b"x" * 100_000
    reader.feed_data(block)
    assert await reader.read(1 << 20) is block


async def test_a_waiting_read_gets_the_block_that_arrives() -> None:
    reader = BlockReader()
    block = b"y" * 1000
    reading = asyncio.ensure_future(reader.read(4096))
    await asyncio.sleep(0)
    reader.feed_data(block)
    assert await reading is block


async def test_bytes_keep_their_order_whatever_the_reads() -> None:
    reader = BlockReader()
    reader.feed_data(b"first ")
    reader.feed_data(b"second ")
    assert await reader.read(3) == b"fir"
    reader.feed_data(b"third\nrest")
    assert await reader.readline() == b"st second third\n"
    reader.feed_data(b" more")
    reader.feed_eof()
    assert await reader.read() == b"rest more"
    assert reader.at_eof()


async def test_a_block_larger_than_the_read_is_read_in_parts() -> None:
    reader = BlockReader()
    reader.feed_data(b"0123456789")
    assert await reader.read(4) == b"0123"
    assert await reader.read(100) == b"456789"


async def test_the_end_comes_after_the_last_block() -> None:
    reader = BlockReader()
    reader.feed_data(b"last")
    reader.feed_eof()
    assert not reader.at_eof()
    assert reader.buffered
    assert await reader.read(10) == b"last"
    assert reader.at_eof()
    assert await reader.read(10) == b""


async def test_a_large_block_pauses_the_transport_until_it_is_read() -> None:
    reader = BlockReader(limit=1024)
    transport = Transport()
    reader.set_transport(transport)
    reader.feed_data(b"z" * 4096)
    assert transport.paused
    await reader.read(1 << 20)
    assert not transport.paused
