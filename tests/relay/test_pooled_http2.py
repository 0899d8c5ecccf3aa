"""Streams opened on a pooled HTTP/2 connection without httpcore's request path: against a
real local TLS upstream speaking HTTP/2 (h2, with a CA made for the test), the same request
on the wire as httpcore's path sends, slots shared with httpcore's own requests, streams
given up on reset, and a connection the upstream closed replaced."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable

import orjson
from hpack import NeverIndexedHeaderTuple

from llmitm.relay import pooled_http2
from llmitm.relay.client import (
    UpstreamClient,
    UpstreamRequest,
    UpstreamResponse,
    UpstreamSettings,
    UpstreamStall,
)
from llmitm.testing.tls_upstream import TlsUpstream

HEADERS = [
    ("Content-Type", "application/json"),
    ("Authorization", "Bearer sk-test-secret"),
    ("api-key", "azure-secret"),
    ("X-Trace", "a b"),
]


def _request(
    upstream: TlsUpstream, body: bytes = b'{"model":"m","stream":true}'
) -> UpstreamRequest:
    return UpstreamRequest("POST", upstream.base_url + "/v1/chat/completions", HEADERS, body)


def _client(upstream: TlsUpstream) -> UpstreamClient:
    context = ssl.create_default_context(cafile=str(upstream.ca_file))
    return UpstreamClient(UpstreamSettings(tls_context=context))


def _pooled(response: UpstreamResponse) -> bool:
    return type(response._answer) is pooled_http2.PooledStream


async def _body(client: UpstreamClient, request: UpstreamRequest) -> tuple[bool, bytes]:
    response = await client.send(request, connect_timeout=5)
    assert response.status == 200 and response.http_version == "HTTP/2"
    return _pooled(response), await response.read_body()


def _run(
    test: Callable[[TlsUpstream, UpstreamClient], Awaitable[None]], **options: object
) -> TlsUpstream:
    upstream = TlsUpstream(http2=True, **options)  # type: ignore[arg-type]

    async def main() -> None:
        await upstream.start()
        client = _client(upstream)
        try:
            await test(upstream, client)
        finally:
            await client.aclose()
            await upstream.stop()

    asyncio.run(main())
    return upstream


def test_later_requests_take_a_stream_and_send_what_httpcore_sends() -> None:
    """The first request opens the connection through httpcore; the next ones open streams
    on it here. The upstream receives the same fields in the same order, secrets never
    indexed, and answers the same body."""

    async def test(upstream: TlsUpstream, client: UpstreamClient) -> None:
        answers = [await _body(client, _request(upstream)) for _ in range(3)]
        assert [pooled for pooled, _ in answers] == [False, True, True]
        assert answers[0][1] == answers[1][1] == answers[2][1]
        assert answers[0][1].endswith(b"data: [DONE]\n\n")
        rotated = _request(upstream)
        rotated.headers = [*HEADERS[:2], ("api-key", "rotated-secret")]
        for _ in range(2):  # a value never indexed is sent literally again
            assert (await _body(client, rotated))[0]

    upstream = _run(test, events=3)
    first, *later = upstream.heads[:3]
    assert all(head == first for head in later)
    assert [name for name, _ in first] == [
        b":method", b":authority", b":scheme", b":path",
        b"content-type", b"authorization", b"api-key", b"x-trace", b"content-length",
    ]  # fmt: skip
    assert dict(first)[b":authority"] == f"127.0.0.1:{upstream.port}".encode()
    for head in upstream.heads[1:]:
        fields = {field[0]: field for field in head}
        assert type(fields[b"authorization"]) is NeverIndexedHeaderTuple
        assert type(fields[b"content-type"]) is not NeverIndexedHeaderTuple
    for head in upstream.heads[3:]:
        api_key = next(field for field in head if field[0] == b"api-key")
        assert api_key == (b"api-key", b"rotated-secret")
        assert type(api_key) is NeverIndexedHeaderTuple
    assert upstream.stats()["handshakes"] == 1


def test_streams_beyond_the_upstreams_limit_wait_for_a_slot() -> None:
    """The upstream allows two streams at once: eight requests share its one connection,
    httpcore's path and this one counting the same slots (an upstream that saw a third
    stream at once would refuse it and break the connection)."""

    async def test(upstream: TlsUpstream, client: UpstreamClient) -> None:
        await _body(client, _request(upstream))
        answers = await asyncio.gather(*(_body(client, _request(upstream)) for _ in range(8)))
        assert all(body.endswith(b"data: [DONE]\n\n") for _, body in answers)
        assert any(pooled for pooled, _ in answers)
        assert not all(pooled for pooled, _ in answers)  # the rest waited in httpcore's path

    upstream = _run(test, events=3, event_delay=0.01, max_streams=2)
    assert upstream.stats() == {
        "handshakes": 1,
        "requests": 9,
        "resets": 0,
        "protocols": {"h2": 1},
    }


def test_a_stream_given_up_on_is_reset_and_the_connection_kept() -> None:
    async def test(upstream: TlsUpstream, client: UpstreamClient) -> None:
        await _body(client, _request(upstream))
        response = await client.send(_request(upstream), connect_timeout=5)
        assert _pooled(response)
        assert await response.first_pieces()
        await response.aclose()
        pooled, body = await _body(client, _request(upstream))
        assert pooled and body.endswith(b"data: [DONE]\n\n")
        await asyncio.sleep(0.05)  # the reset reaches the upstream

    upstream = _run(test, events=5, event_delay=0.02)
    assert upstream.stats()["resets"] == 1
    assert upstream.stats()["handshakes"] == 1


def test_a_silent_stream_stalls_and_is_reset() -> None:
    async def test(upstream: TlsUpstream, client: UpstreamClient) -> None:
        await _body(client, _request(upstream))
        upstream.event_delay = 1.0
        response = await client.send(_request(upstream), connect_timeout=5)
        assert _pooled(response)
        pieces: list[bytes] = []

        async def nothing() -> None:
            return None

        try:
            await response.relay_body(pieces.extend, nothing, idle=0.1)
        except UpstreamStall as exc:
            assert "sent nothing for 0.1 s" in str(exc)
        else:
            raise AssertionError("the silent stream did not stall")
        assert b"".join(pieces).startswith(b"data: ")  # the first event came before the pause
        await asyncio.sleep(0.05)

    upstream = _run(test, events=3)
    assert upstream.stats()["resets"] == 1


def test_a_connection_the_upstream_closed_is_replaced_by_a_fresh_one() -> None:
    async def test(upstream: TlsUpstream, client: UpstreamClient) -> None:
        await _body(client, _request(upstream))
        upstream.close_connections()
        await asyncio.sleep(0.05)  # the close reaches the client's side
        for _ in range(2):
            _, body = await _body(client, _request(upstream))
            assert body.endswith(b"data: [DONE]\n\n")
        assert client.connections() == 1

    upstream = _run(test, events=2)
    assert upstream.stats()["handshakes"] == 2


def test_what_this_path_does_not_send_as_is_goes_through_httpcore() -> None:
    """A value with surrounding whitespace (h2 strips it) and a body beyond the stream's
    flow-control window (httpcore waits for the window) take httpcore's path, and arrive."""
    large = orjson.dumps({"model": "m", "stream": True, "padding": "x" * 100_000})

    async def test(upstream: TlsUpstream, client: UpstreamClient) -> None:
        await _body(client, _request(upstream))
        spaced = _request(upstream)
        spaced.headers = [*HEADERS, ("x-spaced", " value ")]
        pooled, body = await _body(client, spaced)
        assert not pooled and body.endswith(b"data: [DONE]\n\n")
        pooled, body = await _body(client, _request(upstream, large))
        assert not pooled and body.endswith(b"data: [DONE]\n\n")
        pooled, _ = await _body(client, _request(upstream))
        assert pooled

    upstream = _run(test, events=2)
    assert dict(upstream.heads[1])[b"x-spaced"] == b"value"
    assert dict(upstream.heads[2])[b"content-length"] == str(len(large)).encode()
    assert upstream.stats()["handshakes"] == 1


def test_a_connection_out_of_stream_ids_gives_way_to_a_fresh_one() -> None:
    async def test(upstream: TlsUpstream, client: UpstreamClient) -> None:
        await _body(client, _request(upstream))
        (pool,) = client._pools.values()
        (pooled,) = pool.connections
        connection = pooled._connection
        connection._h2_state.highest_outbound_stream_id = 2**31 - 1  # the last id is used
        slots = connection._max_streams_semaphore._anyio_semaphore.value
        pooled_path, body = await _body(client, _request(upstream))
        assert not pooled_path and body.endswith(b"data: [DONE]\n\n")
        assert connection._max_streams_semaphore._anyio_semaphore.value == slots
        pooled_path, _ = await _body(client, _request(upstream))
        assert pooled_path  # on the fresh connection

    upstream = _run(test, events=2)
    assert upstream.stats()["handshakes"] == 2
