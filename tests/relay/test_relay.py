"""The relay and the stream guard: an upstream cut becomes a clean end that the guard (or the
translator) closes with a terminal error in the client's protocol."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import orjson

from llmitm.relay.client import UpstreamRequest
from llmitm.relay.jobs import RelayReply
from llmitm.relay.server import RelayServer
from llmitm.testing.fake_upstream import FakeUpstream
from llmitm.translate.guard import StreamGuard
from tests.relay.wire import RelayConnection, fetch


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
            status, headers, body = await fetch(url)
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
            status, _headers, body = await fetch(
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
        status, _headers, body = await fetch(relay.register(_request("http://127.0.0.1:9", "x")))
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
            first, _, _ = await fetch(url)
            second, _, _ = await fetch(url)
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
        status, headers, body = await fetch(relay.register(_Events()))
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
        status, headers, body = await fetch(url)
        again, _, _ = await fetch(url)
    finally:
        relay.close()
    assert status == 500
    assert headers["content-type"] == "application/json"
    assert orjson.loads(body)["error"]["type"] == "server_error"
    assert again == 404


async def test_one_connection_serves_requests_one_after_another() -> None:
    """mitmproxy reuses its connection to the relay: each answer ends framed, and the next
    request on the same connection is served, streamed, JSON or an upstream's alike."""
    async with FakeUpstream() as fake:
        relay = RelayServer()
        await relay.start()
        try:
            first = relay.register(_Events())
            connection = await RelayConnection.open(first)
            answers = [await connection.post(first)]
            for job in (_request(fake.base_url, "text"), _request("http://127.0.0.1:9", "x")):
                answers.append(await connection.post(relay.register(job)))
            assert await _until(lambda: relay.stats()["kept"] == 1)
            answers.append(await connection.post(relay.register(_Events())))
            connection.close()
            await _settled(relay)
            stats = relay.stats()
        finally:
            relay.close()
    assert [status for status, _, _ in answers] == [200, 200, 502, 200]
    assert answers[0][2] == answers[3][2] == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"
    assert b"data: [DONE]" in answers[1][2]
    assert all("connection" not in headers for _, headers, _ in answers)
    assert stats == {"registered": 0, "connections": 0, "kept": 0, "accepted": 1, "pooled": 1}


async def test_the_relay_closes_after_connection_close_an_error_or_an_unknown_token() -> None:
    relay = RelayServer()
    await relay.start()
    try:
        asked = await RelayConnection.open(url := relay.register(_Events()))
        status, headers, _ = await asked.post(url, close=True)
        assert (status, headers["connection"]) == (200, "close")
        assert await asked.closed_by_relay()

        broken = await RelayConnection.open(url := relay.register(_Broken()))
        status, headers, _ = await broken.post(url)
        assert (status, headers["connection"]) == (500, "close")
        assert await broken.closed_by_relay()

        used = await RelayConnection.open(url := relay.register(_Events()))
        assert (await used.post(url))[0] == 200
        status, headers, _ = await used.post(url)
        assert (status, headers["connection"]) == (404, "close")
        assert await used.closed_by_relay()
        await _settled(relay)
        assert relay.stats()["kept"] == relay.stats()["connections"] == 0
    finally:
        relay.close()


class _Waiting:
    """A job that waits until cancelled, and says so."""

    def __init__(self) -> None:
        self.cancelled = asyncio.Event()

    async def serve(self, reply: RelayReply) -> None:
        try:
            await asyncio.sleep(60)
        finally:
            self.cancelled.set()


async def test_a_hang_up_on_a_reused_connection_cancels_its_job() -> None:
    relay = RelayServer()
    await relay.start()
    try:
        connection = await RelayConnection.open(url := relay.register(_Events()))
        assert (await connection.post(url))[0] == 200
        waiting = _Waiting()
        await connection.send(relay.register(waiting))
        await asyncio.sleep(0.1)
        assert relay.stats()["connections"] == 1
        connection.close()
        await asyncio.wait_for(waiting.cancelled.wait(), 5)
        await _settled(relay)
        assert relay.stats() == {
            "registered": 0,
            "connections": 0,
            "kept": 0,
            "accepted": 1,
            "pooled": 0,
        }
    finally:
        relay.close()


async def _settled(relay: RelayServer) -> None:
    """Wait (bounded) until the relay has let go of every connection from its clients."""
    await _until(lambda: relay.stats()["connections"] == relay.stats()["kept"] == 0)


async def _until(condition: Callable[[], bool]) -> bool:
    """Whether ``condition`` holds within two seconds (the relay's side runs after the client
    has read its answer)."""
    for _ in range(100):
        if condition():
            return True
        await asyncio.sleep(0.02)
    return condition()
