"""The relay and the stream guard: an upstream cut becomes a clean end that the guard (or the
translator) closes with a terminal error in the client's protocol."""

from __future__ import annotations

import asyncio

import orjson

from llmitm.relay.client import UpstreamRequest
from llmitm.relay.jobs import RelayReply
from llmitm.relay.server import RelayServer
from llmitm.testing.fake_upstream import FakeUpstream
from llmitm.translate.guard import StreamGuard


async def _fetch(url: str) -> tuple[int, dict[str, str], bytes]:
    """A raw HTTP/1.1 GET-like POST through the relay, reading to the end."""
    host_port = url.split("/")[2]
    path = "/" + url.split("/", 3)[3]
    host, port = host_port.split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(f"POST {path} HTTP/1.1\r\nhost: {host_port}\r\ncontent-length: 0\r\n\r\n".encode())
    await writer.drain()
    raw = await reader.read()
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    if headers.get("transfer-encoding") == "chunked":
        body = _dechunk(body)
    return status, headers, body


def _dechunk(body: bytes) -> bytes:
    out = b""
    while body:
        size_line, _, rest = body.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            return out
        out, body = out + rest[:size], rest[size + 2 :]
    raise AssertionError("the relay's body did not end with a last chunk")


def _request(base_url: str, scenario: str, api: str = "chat") -> UpstreamRequest:
    body = (
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        if api == "chat"
        else {"model": "m", "input": "hi", "stream": True}
    )
    path = "/v1/chat/completions" if api == "chat" else "/v1/responses"
    return UpstreamRequest(
        method="POST",
        url=base_url + path,
        headers=[("content-type", "application/json"), ("x-fake-scenario", scenario)],
        body=orjson.dumps(body),
    )


async def test_a_cut_upstream_becomes_a_clean_end_of_the_relay_body() -> None:
    async with FakeUpstream() as fake:
        relay = RelayServer()
        await relay.start()
        try:
            url = relay.register(_request(fake.base_url, "text;events=20;disconnect_after=3"))
            status, headers, body = await _fetch(url)
        finally:
            relay.close()
    assert status == 200
    assert headers["content-type"].startswith("text/event-stream")
    assert body.count(b"data: ") == 3  # what arrived before the cut, and a proper end
    guard = StreamGuard("chat")
    assert guard.feed(body) == body
    ending = guard.close()
    assert b'"error"' in ending and ending.endswith(b"data: [DONE]\n\n")


async def test_a_complete_stream_passes_through_unchanged() -> None:
    async with FakeUpstream() as fake:
        relay = RelayServer()
        await relay.start()
        try:
            status, _headers, body = await _fetch(
                relay.register(_request(fake.base_url, "text", api="responses"))
            )
        finally:
            relay.close()
    assert status == 200
    guard = StreamGuard("responses")
    guard.feed(body)
    assert guard.close() == b""
    assert b"response.completed" in body


async def test_unreachable_upstream_is_an_openai_shaped_502() -> None:
    relay = RelayServer(connect_timeout=2)
    await relay.start()
    try:
        status, _headers, body = await _fetch(relay.register(_request("http://127.0.0.1:9", "x")))
    finally:
        relay.close()
    assert status == 502
    assert orjson.loads(body)["error"]["code"] == "upstream_unreachable"


async def test_tokens_are_single_use() -> None:
    async with FakeUpstream() as fake:
        relay = RelayServer()
        await relay.start()
        try:
            url = relay.register(_request(fake.base_url, "text"))
            first, _, _ = await _fetch(url)
            second, _, _ = await _fetch(url)
        finally:
            relay.close()
    assert (first, second) == (200, 404)


def test_guard_closes_a_cut_responses_stream_with_error_and_failed() -> None:
    created = {
        "type": "response.created",
        "sequence_number": 0,
        "response": {"id": "resp_1", "object": "response", "status": "in_progress"},
    }
    delta = {"type": "response.output_text.delta", "sequence_number": 1, "delta": "x"}
    body = b"".join(
        b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n"
        for e in (created, delta)
    )
    guard = StreamGuard("responses")
    guard.feed(body[:50])
    guard.feed(body[50:])
    ending = guard.close()
    events = [orjson.loads(line[6:]) for line in ending.split(b"\n") if line.startswith(b"data: ")]
    assert [e["type"] for e in events] == ["error", "response.failed"]
    assert [e["sequence_number"] for e in events] == [2, 3]
    assert events[1]["response"]["id"] == "resp_1"


class _Events:
    """A local job: streams events it makes itself, as stored-response streaming will."""

    async def serve(self, reply: RelayReply) -> None:
        await reply.start(200, [("content-type", "text/event-stream")])
        for n in range(3):
            reply.write([b"data: %d\n\n" % n, b""])  # an empty piece must not end the body
            await reply.drain()


class _Broken:
    async def serve(self, reply: RelayReply) -> None:
        raise RuntimeError("a bug in a job")


async def test_a_local_job_streams_through_the_relay_and_ends_cleanly() -> None:
    relay = RelayServer()
    await relay.start()
    try:
        status, headers, body = await _fetch(relay.register(_Events()))
    finally:
        relay.close()
    assert status == 200
    assert headers["content-type"] == "text/event-stream"
    assert body == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"


async def test_a_failing_job_answers_an_openai_shaped_500_and_the_token_is_single_use() -> None:
    relay = RelayServer()
    await relay.start()
    try:
        url = relay.register(_Broken())
        status, headers, body = await _fetch(url)
        again, _, _ = await _fetch(url)
    finally:
        relay.close()
    assert status == 500
    assert headers["content-type"] == "application/json"
    assert orjson.loads(body)["error"]["type"] == "server_error"
    assert again == 404
