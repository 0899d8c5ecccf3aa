"""The relay's failover job in-process, against the fake upstream: slots taken and given
back on every path (success, over the cap, queue timeout, the client hanging up), client
errors answered and not retried, and what the job tells the flow."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from llmitm.relay.client import UpstreamRequest
from llmitm.relay.failover import FailoverJob
from llmitm.relay.server import RelayServer
from llmitm.routing.config import parse_config
from llmitm.routing.engine import Routing
from llmitm.testing.fake_upstream import FakeUpstream
from tests.relay.wire import RelayConnection


def make_routing(urls: dict[str, str], **routing: Any) -> Routing:
    raw = {
        "routing": {"backoff": 0.01, "backoff_max": 0.02, "cooldown": 1, **routing},
        "endpoints": {
            name: {"kind": "compatible", "base_url": f"{url}/v1", "max_concurrency": 1}
            for name, url in urls.items()
        },
        "routes": [{"endpoints": list(urls)}],
    }
    return Routing(parse_config(raw, "test.toml", {}))


def job(
    routing: Routing, urls: dict[str, str], scenario: str = "text", *, stream: bool = False
) -> FailoverJob:
    message = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    body = orjson.dumps(message)

    def prepare(endpoint: str) -> UpstreamRequest:
        headers = [("content-type", "application/json"), ("x-fake-scenario", scenario)]
        return UpstreamRequest("POST", f"{urls[endpoint]}/v1/chat/completions", headers, body)

    route = routing.config.routes[0]
    return FailoverJob(routing, route, "m", prepare, connect_timeout=1, stream=stream)


async def fetch(url: str, hang_up_after: float | None = None) -> tuple[int, dict, bytes]:
    """POST to a relay URL (with a body, like mitmproxy) and read the answer by its framing."""
    connection = await RelayConnection.open(url)
    try:
        if hang_up_after is None:
            return await connection.post(url, b"{}")
        await connection.send(url, b"{}")
        await asyncio.sleep(hang_up_after)
        return 0, {}, b""
    finally:
        connection.close()


async def test_over_the_cap_with_no_queue_is_a_429_with_retry_after() -> None:
    async with FakeUpstream() as fake:
        urls = {"only": fake.base_url}
        routing = make_routing(urls, queue_size=0, queue_retry_after=3)
        relay = RelayServer()
        await relay.start()
        try:
            slow = job(routing, urls, "text;first_byte_delay_ms=300")
            first = asyncio.ensure_future(fetch(relay.register(slow)))
            await asyncio.sleep(0.1)
            second = job(routing, urls)
            status, headers, body = await fetch(relay.register(second))
            assert status == 429 and headers["retry-after"] == "3"
            assert orjson.loads(body)["error"]["code"] == "concurrency_limit"
            assert second.result.error and second.result.endpoint is None
            assert (await first)[0] == 200
            assert slow.result.endpoint == "only" and slow.result.attempts == 1
        finally:
            relay.close()
        assert routing.limiter.total_in_flight() == 0
        assert fake.max_in_flight == 1


async def test_a_full_endpoint_makes_requests_wait_their_turn() -> None:
    async with FakeUpstream() as fake:
        urls = {"only": fake.base_url}
        routing = make_routing(urls, queue_size=10, queue_timeout=5)
        relay = RelayServer()
        await relay.start()
        try:
            jobs = [job(routing, urls, "text;first_byte_delay_ms=50") for _ in range(4)]
            answers = await asyncio.gather(*(fetch(relay.register(j)) for j in jobs))
        finally:
            relay.close()
        assert [status for status, _, _ in answers] == [200] * 4
        assert fake.max_in_flight == 1  # the cap held
        assert routing.limiter.total_in_flight() == 0 and routing.limiter.waiting == 0


async def test_the_queue_times_out_into_a_429() -> None:
    async with FakeUpstream() as fake:
        urls = {"only": fake.base_url}
        routing = make_routing(urls, queue_size=10, queue_timeout=0.1)
        relay = RelayServer()
        await relay.start()
        try:
            slow = fetch(relay.register(job(routing, urls, "text;first_byte_delay_ms=400")))
            late = job(routing, urls)

            async def after_a_moment() -> tuple[int, dict, bytes]:
                await asyncio.sleep(0.05)
                return await fetch(relay.register(late))

            (first, _, _), (second, _, _) = await asyncio.gather(slow, after_a_moment())
        finally:
            relay.close()
        assert (first, second) == (200, 429)
        assert routing.limiter.total_in_flight() == 0 and routing.limiter.waiting == 0


async def test_a_client_hanging_up_frees_the_slot_at_once() -> None:
    async with FakeUpstream() as fake:
        urls = {"only": fake.base_url}
        routing = make_routing(urls)
        relay = RelayServer()
        await relay.start()
        try:
            await fetch(relay.register(job(routing, urls, "text;first_byte_delay_ms=2000")), 0.2)
            for _ in range(50):
                if routing.limiter.total_in_flight() == 0:
                    break
                await asyncio.sleep(0.02)
            assert routing.limiter.total_in_flight() == 0  # not after the 2 s upstream wait
        finally:
            relay.close()


async def test_a_client_error_is_answered_and_not_retried() -> None:
    async with FakeUpstream() as a, FakeUpstream() as b:
        urls = {"a": a.base_url, "b": b.base_url}
        routing = make_routing(urls)
        relay = RelayServer()
        await relay.start()
        try:
            bad = job(routing, urls, "text;status=400")
            status, _, body = await fetch(relay.register(bad))
        finally:
            relay.close()
        assert status == 400 and b"HTTP 400" in body
        assert bad.result.endpoint == "a" and bad.result.attempts == 1
        assert len(b.requests) == 0
        assert routing.health.is_available("a", 1e9, "m")  # not the endpoint's fault


async def test_failover_tells_who_answered_and_how_much_was_llmitm() -> None:
    async with FakeUpstream() as a, FakeUpstream() as b:
        urls = {"a": a.base_url, "b": b.base_url}
        a.fault = "status=503;retry_after=0"
        routing = make_routing(urls)
        relay = RelayServer()
        await relay.start()
        try:
            moved = job(routing, urls)
            status, _, _ = await fetch(relay.register(moved))
        finally:
            relay.close()
        assert status == 200
        assert (moved.result.endpoint, moved.result.attempts) == ("b", 2)
        assert 0 <= moved.result.overhead < 0.05


async def test_a_plain_body_cut_short_is_retried_and_never_a_truncated_200() -> None:
    async with FakeUpstream() as a, FakeUpstream() as b:
        urls = {"a": a.base_url, "b": b.base_url}
        a.fault = "short_body"
        routing = make_routing(urls)
        relay = RelayServer()
        await relay.start()
        try:
            moved = job(routing, urls)
            status, _, body = await fetch(relay.register(moved))
            b.fault = "short_body"
            failed = job(routing, urls)
            failed_status, _, failed_body = await fetch(relay.register(failed))
        finally:
            relay.close()
        assert status == 200 and (moved.result.endpoint, moved.result.attempts) == ("b", 2)
        assert orjson.loads(body)["choices"][0]["message"]["content"]
        assert not routing.health.is_available("a", 0.5, "m")  # the cut counts against a
        assert failed_status == 502 and failed.result.error
        error = orjson.loads(failed_body)["error"]
        assert [t["outcome"] for t in error["attempts"]] == ["server_error", "server_error"]


async def test_a_stream_silent_past_the_idle_timeout_ends_and_counts_as_a_timeout() -> None:
    async with FakeUpstream() as a:
        urls = {"a": a.base_url}
        routing = make_routing(urls, stream_idle_timeout=0.3)
        relay = RelayServer()
        await relay.start()
        try:
            stalled = job(routing, urls, "text;stall_after=2", stream=True)
            started = asyncio.get_running_loop().time()
            status, _, body = await asyncio.wait_for(fetch(relay.register(stalled)), 5)
            took = asyncio.get_running_loop().time() - started
        finally:
            relay.close()
        assert status == 200 and 0.3 <= took < 2
        data = body
        assert data.count(b"data: ") == 2 and not data.rstrip().endswith(b"[DONE]")
        assert routing.health.state("a", "m").last == "timeout"
        assert routing.limiter.in_flight("a") == 0
