"""The in-memory connection between mitmproxy and the relay behaves as a socket pair does for
asyncio's streams: bytes in order both ways, a reader that stops reading pauses the writer
(its ``drain`` waits) until it reads again, a close is the other side's end of input, and
bytes written to a closed side are dropped. Then the relay itself served over it: two
requests kept alive on one in-memory connection, and a client that hangs up cancels its job."""

from __future__ import annotations

import asyncio

from llmitm.relay.jobs import RelayReply
from llmitm.relay.pipe import stream_pipe
from llmitm.relay.server import RelayServer

NEAR = ("127.0.0.1", 0)
FAR = ("127.0.0.1", 9)


def _pair() -> tuple[
    tuple[asyncio.StreamReader, asyncio.StreamWriter],
    tuple[asyncio.StreamReader, asyncio.StreamWriter],
]:
    return stream_pipe(asyncio.get_running_loop(), NEAR, FAR)


async def test_bytes_cross_in_order_both_ways() -> None:
    (near_reader, near_writer), (far_reader, far_writer) = _pair()
    near_writer.write(b"one ")
    near_writer.writelines([b"two ", b"three"])
    far_writer.write(b"back")
    assert await far_reader.readexactly(13) == b"one two three"
    assert await near_reader.readexactly(4) == b"back"
    assert near_writer.get_extra_info("peername") == FAR
    assert far_writer.get_extra_info("peername") == NEAR


async def test_a_reader_that_stops_reading_pauses_the_writer() -> None:
    (_, near_writer), (far_reader, _) = _pair()
    near_writer.write(b"x" * (1 << 20))  # far beyond the reader's limit: it pauses
    assert near_writer.transport.get_write_buffer_size() == 1 << 20
    draining = asyncio.ensure_future(near_writer.drain())
    await asyncio.sleep(0.01)
    assert not draining.done()
    received = 0
    while received < 1 << 20:
        received += len(await far_reader.read(1 << 16))
    await asyncio.wait_for(draining, 1)
    assert near_writer.transport.get_write_buffer_size() == 0


async def test_a_close_ends_the_other_sides_input() -> None:
    (near_reader, near_writer), (far_reader, far_writer) = _pair()
    near_writer.write(b"last words")
    near_writer.close()
    assert await far_reader.read() == b"last words"  # then the end, as after a FIN
    far_writer.write(b"nobody reads this")  # dropped, as a reset socket would
    far_writer.close()
    await asyncio.wait_for(near_writer.wait_closed(), 1)
    await asyncio.wait_for(far_writer.wait_closed(), 1)
    assert near_reader.at_eof() or await near_reader.read() == b""


async def test_a_drain_waiting_on_a_side_that_closes_returns() -> None:
    (_, near_writer), (_, far_writer) = _pair()
    near_writer.write(b"x" * (1 << 20))
    draining = asyncio.ensure_future(near_writer.drain())
    await asyncio.sleep(0)
    far_writer.close()
    await asyncio.wait_for(draining, 1)


class Answer:
    def __init__(self, text: bytes) -> None:
        self.text = text

    async def serve(self, reply: RelayReply) -> None:
        await reply.start(200, [("content-type", "text/plain")], [self.text])


class Waits:
    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.cancelled = asyncio.Event()

    async def serve(self, reply: RelayReply) -> None:
        self.started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise


def _post(url: str, body: bytes = b"{}") -> bytes:
    path = "/" + url.split("/", 3)[3]
    return (
        f"POST {path} HTTP/1.1\r\nhost: relay\r\ncontent-length: {len(body)}\r\n\r\n".encode()
        + body
    )


async def test_the_relay_serves_requests_kept_alive_on_one_connection() -> None:
    server = RelayServer()
    await server.start()
    try:
        reader, writer = server.connect()
        for text in (b"first", b"second"):
            writer.write(_post(server.register(Answer(text)), b'{"big": "' + b"y" * 70000 + b'"}'))
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert head.startswith(b"HTTP/1.1 200 OK\r\n")
            assert b"transfer-encoding: chunked" in head
            body = await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 5)
            assert body == b"%x\r\n%s\r\n0\r\n\r\n" % (len(text), text)
        assert server.stats()["accepted"] == 1
        writer.close()
    finally:
        server.close()


async def test_a_client_hanging_up_cancels_its_job() -> None:
    server = RelayServer()
    await server.start()
    try:
        _, writer = server.connect()
        job = Waits()
        writer.write(_post(server.register(job)))
        await asyncio.wait_for(job.started.wait(), 5)
        writer.close()
        await asyncio.wait_for(job.cancelled.wait(), 5)
        for _ in range(50):
            if server.stats()["connections"] == 0 and server.stats()["kept"] == 0:
                break
            await asyncio.sleep(0.01)
        assert server.stats()["connections"] == 0 and server.stats()["kept"] == 0
    finally:
        server.close()
