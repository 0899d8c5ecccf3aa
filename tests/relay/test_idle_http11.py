"""A request on an idle pooled HTTP/1.1 connection skips httpcore's request path and is still
the same request on the wire, with the same answers, errors and connection reuse: against a
real local server that keeps every request's bytes and answers each as the test scripts it."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import Awaitable, Callable

import pytest

from llmitm.relay import idle_http11
from llmitm.relay.client import (
    UpstreamClient,
    UpstreamError,
    UpstreamRequest,
    UpstreamSettings,
)
from tests.relay.servers import CountingServer

OK = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
BODY = b'{"model":"m"}'


class ScriptedServer(CountingServer):
    """Answers the n-th request it reads with ``answers[n]`` (the last one repeated); a
    ``None`` answer never comes. Keeps each request's bytes and counts its connections."""

    def __init__(self, answers: list[bytes | None]) -> None:
        super().__init__()
        self.answers = answers
        self.requests: list[bytes] = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                self.requests.append(head + await reader.readexactly(length))
                answer = self.answers[min(len(self.requests), len(self.answers)) - 1]
                if answer is None:
                    await asyncio.sleep(30)
                writer.write(answer or b"")
                await writer.drain()
        writer.close()

    def request(
        self,
        method: str = "POST",
        headers: list[tuple[str, str]] | None = None,
        body: bytes = b'{"model":"m"}',
    ) -> UpstreamRequest:
        return UpstreamRequest(
            method,
            f"http://127.0.0.1:{self.port}/v1/chat/completions?x=1",
            headers or [("content-type", "application/json"), ("authorization", "Bearer k")],
            body if method == "POST" else b"",
        )


def _run(
    answers: list[bytes | None],
    test: Callable[..., Awaitable[None]],
    settings: UpstreamSettings | None = None,
) -> None:
    async def main() -> None:
        upstream = ScriptedServer(answers)
        server = await upstream.start()
        client = UpstreamClient(settings)
        try:
            await test(upstream, client)
        finally:
            await client.aclose()
            server.close()

    asyncio.run(main())


@pytest.fixture
def taken(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The connections the idle path took, in order."""
    seen: list[object] = []
    take = idle_http11._take_idle

    def counted(pool: object, origin: object) -> object:
        connection = take(pool, origin)  # type: ignore[arg-type]
        if connection is not None:
            seen.append(connection)
        return connection

    monkeypatch.setattr(idle_http11, "_take_idle", counted)
    return seen


@pytest.mark.parametrize("size", [13, idle_http11.JOIN_BELOW + 1], ids=["small", "large"])
def test_later_requests_take_the_idle_connection_and_are_the_same_bytes(
    taken: list[object], size: int
) -> None:
    body = b'{"model":"m"' + b" " * (size - 13) + b"}"

    async def test(upstream: ScriptedServer, client: UpstreamClient) -> None:
        for _ in range(3):
            response = await client.send(upstream.request(body=body), connect_timeout=5)
            assert response.status == 200
            assert await response.read_body() == b"ok"
        assert len(taken) == 2  # the first request opened the connection through httpcore
        assert upstream.connections == 1
        first, *later = upstream.requests
        assert first.startswith(b"POST /v1/chat/completions?x=1 HTTP/1.1\r\n")
        assert all(request == first for request in later)  # what httpcore's path wrote

    _run([OK], test)


def test_an_expired_idle_connection_is_left_to_httpcore_which_replaces_it(
    taken: list[object],
) -> None:
    async def test(upstream: ScriptedServer, client: UpstreamClient) -> None:
        for _ in range(2):
            response = await client.send(upstream.request(), connect_timeout=5)
            assert await response.read_body() == b"ok"
            await asyncio.sleep(0.1)
        assert taken == []
        assert upstream.connections == 2
        assert client.connections() == 1  # the expired one closed and gone

    _run([OK], test, UpstreamSettings(idle_expiry=0.05))


def test_a_head_h11_would_refuse_is_refused_as_before_and_never_written(
    taken: list[object],
) -> None:
    async def test(upstream: ScriptedServer, client: UpstreamClient) -> None:
        response = await client.send(upstream.request(), connect_timeout=5)
        await response.read_body()
        smuggled = [("x-note", "a\r\nx-injected: 1")]
        with pytest.raises(UpstreamError, match="cannot relay"):
            await client.send(upstream.request(headers=smuggled), connect_timeout=5)
        response = await client.send(upstream.request(), connect_timeout=5)
        assert await response.read_body() == b"ok"
        assert not any(b"x-injected" in request for request in upstream.requests)
        assert len(upstream.requests) == 2

    _run([OK], test)


def test_a_head_answer_has_no_body_and_the_connection_is_kept(taken: list[object]) -> None:
    head_answer = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n"

    async def test(upstream: ScriptedServer, client: UpstreamClient) -> None:
        response = await client.send(upstream.request(), connect_timeout=5)
        await response.read_body()
        response = await client.send(upstream.request("HEAD"), connect_timeout=5)
        assert response.status == 200
        assert await response.read_body() == b""
        response = await client.send(upstream.request(), connect_timeout=5)
        assert await response.read_body() == b"ok"
        assert len(taken) == 2
        assert upstream.connections == 1

    _run([OK, head_answer, OK], test)


def test_an_informational_answer_is_skipped_and_a_chunked_body_read(taken: list[object]) -> None:
    chunked = (
        b"HTTP/1.1 100 Continue\r\n\r\n"
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        b"transfer-encoding: chunked\r\n\r\n"
        b'f\r\ndata: {"a":1}\n\n\r\n0\r\n\r\n'
    )

    async def test(upstream: ScriptedServer, client: UpstreamClient) -> None:
        response = await client.send(upstream.request(), connect_timeout=5)
        await response.read_body()
        for _ in range(2):
            response = await client.send(upstream.request(), connect_timeout=5)
            assert response.status == 200
            assert ("content-type", "text/event-stream") in response.headers
            assert await response.read_body() == b'data: {"a":1}\n\n'
        assert len(taken) == 2
        assert upstream.connections == 1

    _run([OK, chunked], test)


def test_a_request_cancelled_before_its_answer_closes_the_connection(
    taken: list[object],
) -> None:
    async def test(upstream: ScriptedServer, client: UpstreamClient) -> None:
        response = await client.send(upstream.request(), connect_timeout=5)
        await response.read_body()
        waiting = asyncio.ensure_future(client.send(upstream.request(), connect_timeout=5))
        while len(upstream.requests) < 2:
            await asyncio.sleep(0.005)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        pooled = [c for pool in client._pools.values() for c in pool.connections]
        assert not any(connection.is_idle() for connection in pooled)
        response = await client.send(upstream.request(), connect_timeout=5)
        assert await response.read_body() == b"ok"
        assert upstream.connections == 2  # the half-used one was never offered again

    _run([OK, None, OK], test)


def test_an_answer_that_is_not_http_is_an_upstream_error(taken: list[object]) -> None:
    async def test(upstream: ScriptedServer, client: UpstreamClient) -> None:
        response = await client.send(upstream.request(), connect_timeout=5)
        await response.read_body()
        with pytest.raises(UpstreamError, match="not HTTP"):
            await client.send(upstream.request(), connect_timeout=5)
        assert len(taken) == 1
        response = await client.send(upstream.request(), connect_timeout=5)
        assert await response.read_body() == b"ok"
        assert upstream.connections == 2

    _run([OK, b"SSH-2.0-OpenSSH\r\n\r\n", OK], test)


def test_a_connection_reset_in_the_middle_of_the_head_is_an_upstream_error(
    taken: list[object],
) -> None:
    """Part of the head came, then the connection was reset: not a closed idle connection
    (whose request is sent again), but an answer that failed."""

    class ResettingServer(CountingServer):
        """Answers a connection's first request, resets it in the head of its second."""

        async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, asyncio.IncompleteReadError):
                await reader.readuntil(b"\r\n\r\n")
                await reader.readexactly(len(BODY))
                writer.write(OK)
                await reader.readuntil(b"\r\n\r\n")
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-")
                await writer.drain()
                await asyncio.sleep(0.05)  # the client reads the part before the reset
                sock = writer.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()

    async def main() -> None:
        upstream = ResettingServer()
        server = await upstream.start()
        client = UpstreamClient()
        request = UpstreamRequest("POST", f"http://127.0.0.1:{upstream.port}/v1/x", [], BODY)
        try:
            response = await client.send(request, connect_timeout=5)
            assert await response.read_body() == b"ok"
            with pytest.raises(UpstreamError, match="failed before answering"):
                await client.send(request, connect_timeout=5)
        finally:
            await client.aclose()
            server.close()
        assert len(taken) == 1
        assert upstream.connections == 1  # not sent again: part of an answer had come

    asyncio.run(main())


def test_without_the_idle_path_httpcore_sends_the_same_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sent: dict[bool, list[bytes]] = {}
    for enabled in (True, False):
        monkeypatch.setattr(idle_http11, "ENABLED", enabled)

        async def test(
            upstream: ScriptedServer, client: UpstreamClient, enabled: bool = enabled
        ) -> None:
            for _ in range(2):
                response = await client.send(upstream.request(), connect_timeout=5)
                await response.read_body()
            port = str(upstream.port).encode()
            sent[enabled] = [r.replace(port, b"PORT") for r in upstream.requests]

        _run([OK], test)
    assert sent[True] == sent[False]
