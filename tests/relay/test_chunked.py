"""The relay's own chunked decoding: the data of each read, split anywhere, and a body that ends
or breaks as h11 says — also through the relay client against a raw server, whose keep-alive
connection must go back to the pool after a body read this way."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmitm.relay.chunked import ChunkedBody, ChunkError
from llmitm.relay.client import UpstreamClient, UpstreamCut, UpstreamRequest


def chunked(pieces: list[bytes], trailer: bytes = b"") -> bytes:
    framed = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(piece), piece) for piece in pieces if piece)
    return framed + b"0\r\n" + trailer + b"\r\n"


def decode(wire: bytes, cuts: list[int], body: ChunkedBody | None = None) -> tuple[bytes, bytes]:
    """The data of ``wire`` read in pieces split at ``cuts``, and what followed the body (the
    rest of the read that ended it, and whatever was not read)."""
    body = body or ChunkedBody()
    data = b""
    bounds = [0, *sorted(set(cuts)), len(wire)]
    for start, end in itertools.pairwise(bounds):
        if start < end:
            data += b"".join(body.feed(wire[start:end]))
            if body.ended:
                return data, body.rest + wire[end:]
    raise AssertionError("the body did not end")


@given(
    st.lists(st.binary(max_size=40), max_size=6),
    st.lists(st.integers(0, 400), max_size=8),
    st.sampled_from([b"", b"x-trailer: 1\r\n"]),
)
def test_the_data_comes_out_whole_wherever_the_reads_split_it(
    pieces: list[bytes], cuts: list[int], trailer: bytes
) -> None:
    wire = chunked(pieces, trailer)
    assert decode(wire + b"NEXT", cuts) == (b"".join(pieces), b"NEXT")


def test_a_read_inside_one_chunk_is_handed_on_as_it_is() -> None:
    body = ChunkedBody()
    assert body.feed(b"100000\r\n") == []
    piece = b"x" * 65536
    (out,) = body.feed(piece)
    assert out is piece


def test_it_takes_over_where_h11_stood() -> None:
    # 3 data bytes of the current chunk left, then its CRLF (of which "\r" came already).
    assert decode(b"abc\r\n0\r\n\r\n", [], ChunkedBody(left=3, crlf=b"\r\n")) == (b"abc", b"")
    assert decode(b"\n0\r\n\r\n", [], ChunkedBody(crlf=b"\n")) == (b"", b"")


@pytest.mark.parametrize(
    "wire", [b"zz\r\n", b"5\r\nhelloXX", b"-1\r\n", b"5 junk\r\nhello\r\n"], ids=repr
)
def test_broken_framing_is_an_error(wire: bytes) -> None:
    with pytest.raises(ChunkError):
        ChunkedBody().feed(wire)


def test_an_endless_size_line_is_an_error() -> None:
    body = ChunkedBody()
    with pytest.raises(ChunkError):
        for _ in range(20):
            body.feed(b"0" * 8192)


# --- through the relay client, against a raw HTTP/1.1 server ---------------------------------

EVENT = b"data: " + b"word " * (600 * 1024) + b"\n\n"  # one 3 MiB event


async def serve_raw(writes: list[bytes], *, cut: bool = False) -> tuple[asyncio.Server, list[int]]:
    """A server answering every request on a connection with ``writes`` (a chunked body, in
    the pieces it is written in); ``cut``: it closes the connection after them instead."""
    connections = [0]

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections[0] += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                await reader.readexactly(length)
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                    b"transfer-encoding: chunked\r\n\r\n"
                )
                for data in writes:
                    writer.write(data)
                    await writer.drain()
                if cut:
                    writer.transport.abort()
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, connections


def split(wire: bytes, size: int) -> list[bytes]:
    """Writes that split the framing anywhere (an odd size against 64 KiB chunks)."""
    return [wire[start : start + size] for start in range(0, len(wire), size)]


def request(server: asyncio.Server) -> UpstreamRequest:
    port = server.sockets[0].getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    return UpstreamRequest("POST", url, [("content-type", "application/json")], b"{}")


async def relayed(client: UpstreamClient, server: asyncio.Server) -> tuple[bytes, object]:
    response = await client.send(request(server), connect_timeout=5)
    pieces = await response.first_pieces()

    async def nothing() -> None:
        return None

    await response.relay_body(pieces.extend, nothing)
    return b"".join(pieces), response._chunked


async def test_a_large_event_relayed_without_h11_keeps_the_connection_pooled() -> None:
    pieces = [EVENT[start : start + 65536] for start in range(0, len(EVENT), 65536)]
    server, connections = await serve_raw(split(chunked(pieces, b"x-t: 1\r\n"), 50_001))
    client = UpstreamClient()
    try:
        for _ in range(3):
            body, decoder = await relayed(client, server)
            assert body == EVENT
            # The fast path was taken (h11's internals are as this code expects them).
            assert isinstance(decoder, ChunkedBody)
        assert connections == [1]  # h11 saw each body end: the connection went back
    finally:
        await client.aclose()
        server.close()


async def test_a_body_cut_mid_chunk_is_a_cut() -> None:
    wire = chunked([EVENT])
    server, _ = await serve_raw(split(wire[: len(wire) // 2], 65536), cut=True)
    client = UpstreamClient()
    try:
        with pytest.raises(UpstreamCut, match="mid-body"):
            await relayed(client, server)
    finally:
        await client.aclose()
        server.close()
