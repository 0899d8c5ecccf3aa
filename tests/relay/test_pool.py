"""The relay's upstream client keeps connections alive and never reuses one in an unknown
state: against real local servers (TLS with a CA made for the test, HTTP/1.1 and HTTP/2, and
plain servers that close idle connections), counting the connections they saw."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Awaitable, Callable

import pytest

from llmitm.relay.client import (
    UpstreamClient,
    UpstreamCut,
    UpstreamError,
    UpstreamRequest,
    UpstreamSettings,
    UpstreamStall,
)
from llmitm.testing.tls_upstream import TlsUpstream
from tests.relay.servers import CountingServer

STREAM = UpstreamRequest(
    "POST", "", [("content-type", "application/json")], b'{"model":"m","stream":true}'
)


def _client(upstream: TlsUpstream) -> UpstreamClient:
    context = ssl.create_default_context(cafile=str(upstream.ca_file))
    return UpstreamClient(UpstreamSettings(tls_context=context))


def _at(base_url: str) -> UpstreamRequest:
    return UpstreamRequest(
        STREAM.method, base_url + "/v1/chat/completions", STREAM.headers, STREAM.body
    )


async def _with_tls(http2: bool, test: Callable[[TlsUpstream], Awaitable[None]]) -> None:
    upstream = TlsUpstream(http2=http2, events=5, event_delay=0.01)
    await upstream.start()
    try:
        await test(upstream)
    finally:
        await upstream.stop()


@pytest.mark.parametrize("http2", [False, True], ids=["http1", "h2"])
def test_sequential_requests_share_one_tls_connection(http2: bool) -> None:
    async def test(upstream: TlsUpstream) -> None:
        client = _client(upstream)
        try:
            for _ in range(6):
                response = await client.send(_at(upstream.base_url), connect_timeout=5)
                body = await response.read_body()
                assert response.status == 200
                assert response.http_version == ("HTTP/2" if http2 else "HTTP/1.1")
                assert body.endswith(b"data: [DONE]\n\n")
        finally:
            await client.aclose()
        protocol = "h2" if http2 else "http/1.1"
        assert upstream.stats() == {
            "handshakes": 1,
            "requests": 6,
            "resets": 0,
            "protocols": {protocol: 1},
        }

    asyncio.run(_with_tls(http2, test))


def test_concurrent_http2_streams_share_one_connection() -> None:
    async def one(client: UpstreamClient, url: str) -> bytes:
        response = await client.send(_at(url), connect_timeout=5)
        return await response.read_body()

    async def test(upstream: TlsUpstream) -> None:
        client = _client(upstream)
        try:
            bodies = await asyncio.gather(*(one(client, upstream.base_url) for _ in range(8)))
        finally:
            await client.aclose()
        assert all(body.endswith(b"data: [DONE]\n\n") for body in bodies)
        assert upstream.stats()["handshakes"] == 1

    asyncio.run(_with_tls(True, test))


@pytest.mark.parametrize("http2", [False, True], ids=["http1", "h2"])
def test_a_stream_given_up_on_is_never_reused_half_read(http2: bool) -> None:
    """The client leaves after the first event: HTTP/1.1 closes that connection (the next
    request opens a fresh one), HTTP/2 resets the stream and keeps the connection."""

    async def test(upstream: TlsUpstream) -> None:
        client = _client(upstream)
        try:
            response = await client.send(_at(upstream.base_url), connect_timeout=5)
            assert await response.first_pieces()
            await response.aclose()
            response = await client.send(_at(upstream.base_url), connect_timeout=5)
            assert (await response.read_body()).endswith(b"data: [DONE]\n\n")
            await asyncio.sleep(0.05)  # the reset reaches the server
        finally:
            await client.aclose()
        stats = upstream.stats()
        assert stats["handshakes"] == (1 if http2 else 2)
        assert stats["resets"] == (1 if http2 else 0)

    asyncio.run(_with_tls(http2, test))


def test_a_cancelled_stream_is_not_returned_to_the_pool() -> None:
    """The relay cancels a job when its client leaves: the connection it was reading closes."""

    async def test(upstream: TlsUpstream) -> None:
        client = _client(upstream)
        try:
            response = await client.send(_at(upstream.base_url), connect_timeout=5)
            pieces: list[bytes] = []

            async def nothing() -> None:
                return None

            relay = asyncio.ensure_future(response.relay_body(pieces.extend, nothing))
            while not pieces:
                await asyncio.sleep(0.005)
            relay.cancel()
            with pytest.raises(asyncio.CancelledError):
                await relay
            assert client.connections() == 0
        finally:
            await client.aclose()

    asyncio.run(_with_tls(False, test))


def test_a_wrong_ca_fails_before_the_head_naming_the_tls_failure() -> None:
    async def test(upstream: TlsUpstream) -> None:
        client = UpstreamClient(UpstreamSettings(tls_context=ssl.create_default_context()))
        try:
            with pytest.raises(UpstreamError, match="CERTIFICATE_VERIFY_FAILED"):
                await client.send(_at(upstream.base_url), connect_timeout=5)
        finally:
            await client.aclose()

    asyncio.run(_with_tls(False, test))


class ClosingServer(CountingServer):
    """A plain HTTP/1.1 server answering ``200 ok`` with keep-alive, which then either closes
    the connection once idle (``close_idle``) or takes the next request on it and closes
    without answering (the race a pool loses when the server's idle timer fires just as the
    request goes out)."""

    def __init__(self, *, close_idle: bool) -> None:
        super().__init__()
        self.close_idle = close_idle
        self.requests = 0
        self.answered = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            self.requests += 1
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            await writer.drain()
            self.answered += 1
            if not self.close_idle:
                await reader.readuntil(b"\r\n\r\n")  # the next request: dropped unanswered
                self.requests += 1
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


@pytest.mark.parametrize("close_idle", [True, False], ids=["closed-while-idle", "closed-on-send"])
def test_a_connection_the_upstream_closed_is_replaced_by_a_fresh_one(close_idle: bool) -> None:
    async def test() -> None:
        upstream = ClosingServer(close_idle=close_idle)
        server = await upstream.start()
        client = UpstreamClient()
        request = UpstreamRequest("POST", f"http://127.0.0.1:{upstream.port}/v1/x", [], b"{}")
        try:
            for _ in range(3):
                response = await client.send(request, connect_timeout=5)
                assert await response.read_body() == b"ok"
                await asyncio.sleep(0.05)  # the server's close arrives while the pool idles
        finally:
            await client.aclose()
            server.close()
        assert upstream.answered == 3
        assert upstream.connections == 3
        # Closed while idle, the pool saw it and opened a fresh one; closed on a request, the
        # request was sent again on a fresh one.
        assert upstream.requests == (3 if close_idle else 5)

    asyncio.run(test())


def test_a_fresh_connection_that_fails_before_the_head_is_not_retried() -> None:
    """Only a pooled connection's failure is retried: a fresh one's is the upstream's answer."""

    async def test() -> None:
        seen = 0

        async def drop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal seen
            seen += 1
            await reader.readuntil(b"\r\n\r\n")
            writer.close()

        server = await asyncio.start_server(drop, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = UpstreamClient()
        try:
            with pytest.raises(UpstreamError, match="closed the connection before answering"):
                await client.send(
                    UpstreamRequest("POST", f"http://127.0.0.1:{port}/", [], b""),
                    connect_timeout=5,
                )
        finally:
            await client.aclose()
            server.close()
        assert seen == 1

    asyncio.run(test())


def test_a_body_cut_short_of_its_length_raises_upstream_cut() -> None:
    async def test() -> None:
        async def short(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nhalf")
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(short, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = UpstreamClient()
        try:
            response = await client.send(
                UpstreamRequest("GET", f"http://127.0.0.1:{port}/", [], b""), connect_timeout=5
            )
            with pytest.raises(UpstreamCut):
                await response.read_body()
            assert client.connections() == 0
        finally:
            await client.aclose()
            server.close()

    asyncio.run(test())


async def _chunked_server(
    chunks: list[list[bytes]], *, gap: float, then_hang: bool
) -> tuple[asyncio.Server, int, list[int]]:
    """A plain HTTP/1.1 server answering each request with a chunked body: each inner list of
    ``chunks`` goes out in one write, ``gap`` seconds apart; with ``then_hang`` the body never
    ends. The list counts the connections it accepted."""
    accepted = [0]

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted[0] += 1
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
                for group in chunks:
                    writer.write(b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in group))
                    await writer.drain()
                    await asyncio.sleep(gap)
                if then_hang:
                    await asyncio.sleep(30)
                writer.write(b"0\r\n\r\n")
                await writer.drain()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], accepted


def _plain(port: int) -> UpstreamRequest:
    return UpstreamRequest("POST", f"http://127.0.0.1:{port}/", [], b"{}")


def test_a_stream_silent_for_its_idle_limit_stalls_and_its_connection_closes() -> None:
    """Everything sent before the silence is relayed (the chunks of one read in one write),
    then :class:`UpstreamStall`; the half-read connection leaves the pool."""

    async def test() -> None:
        server, port, _ = await _chunked_server([[b"a", b"b", b"c"]], gap=0, then_hang=True)
        client = UpstreamClient()
        try:
            response = await client.send(_plain(port), connect_timeout=5)
            writes: list[list[bytes]] = []
            with pytest.raises(UpstreamStall):
                await response.relay_body(writes.append, _drained, idle=0.3)
            assert b"".join(b"".join(w) for w in writes) == b"abc"
            assert len(writes) <= 2  # one read took the three chunks (two if split in flight)
            assert client.connections() == 0
        finally:
            await client.aclose()
            server.close()

    asyncio.run(test())


def test_time_spent_draining_does_not_count_as_upstream_silence() -> None:
    """The client reads slower than the idle limit while the upstream keeps sending: no stall,
    the whole body, and the connection goes back to the pool for the next request."""

    async def test() -> None:
        groups = [[b"x%d" % i] for i in range(4)]
        server, port, accepted = await _chunked_server(groups, gap=0.02, then_hang=False)
        client = UpstreamClient()

        async def slow_drain() -> None:
            await asyncio.sleep(0.25)

        try:
            for _ in range(2):
                response = await client.send(_plain(port), connect_timeout=5)
                writes: list[list[bytes]] = []
                await response.relay_body(writes.append, slow_drain, idle=0.2)
                assert b"".join(b"".join(w) for w in writes) == b"x0x1x2x3"
            assert accepted[0] == 1
        finally:
            await client.aclose()
            server.close()

    asyncio.run(test())


async def _drained() -> None:
    return None
