"""The relay's failover job in-process, against the fake upstream: slots taken and given
back on every path (success, over the cap, queue timeout, the client hanging up), client
errors answered and not retried, and what the job tells the flow."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import orjson

from llmitm.relay.client import UpstreamRequest
from llmitm.relay.failover import FailoverJob
from llmitm.relay.server import RelayServer
from llmitm.routing.config import parse_config
from llmitm.routing.engine import Routing

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from fake_upstream import FakeUpstream


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


def job(routing: Routing, urls: dict[str, str], scenario: str = "text") -> FailoverJob:
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})

    def prepare(endpoint: str) -> UpstreamRequest:
        headers = [("content-type", "application/json"), ("x-fake-scenario", scenario)]
        return UpstreamRequest("POST", f"{urls[endpoint]}/v1/chat/completions", headers, body)

    return FailoverJob(routing, routing.config.routes[0], "m", prepare, connect_timeout=1)


async def fetch(url: str, hang_up_after: float | None = None) -> tuple[int, dict, bytes]:
    """POST to a relay URL (with a body, like mitmproxy) and read the answer."""
    host_port, path = url.split("/", 3)[2], "/" + url.split("/", 3)[3]
    host, port = host_port.split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        f"POST {path} HTTP/1.1\r\nhost: {host_port}\r\ncontent-length: 2\r\n\r\n{{}}".encode()
    )
    await writer.drain()
    if hang_up_after is not None:
        await asyncio.sleep(hang_up_after)
        writer.close()
        return 0, {}, b""
    raw = await reader.read()
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, body


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
