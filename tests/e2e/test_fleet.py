"""A fleet: two real llmitm processes sharing one real PostgreSQL database as their store, in
front of fault-injecting fake upstreams (``python -m llmitm.testing.fake_upstream``, which
counts the most requests it ever had in flight at once).

- a cap of 4 holds across both proxies under 100 concurrent streams, and every slot row is
  gone afterwards;
- a 429 with Retry-After that proxy A sees cools the endpoint for proxy B;
- conversations and response ids pinned by one proxy are followed by the other;
- a proxy killed with SIGKILL mid-stream frees its slots within the lease, for the other;
- the status route shows the fleet: both proxies, their heartbeats and slots.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx2 as httpx
import openai
import pytest

from .processes import Proxy, Upstream, fake_upstream, llmitm_proxy

pytestmark = pytest.mark.slow

LEASE_S = 3.0

CONFIG = """
[routing]
cooldown = 1.5
connect_timeout = 2
first_byte_timeout = 10
timeout = 90
backoff = 0.05
queue_size = 300
queue_timeout = 90
affinity_ttl = 120
fleet_lease = {lease}
fleet_timeout = 5  # a loaded test machine; the default is half a second

[endpoints.capped]
kind = "compatible"
base_url = "{capped}/v1"
apis = ["chat"]
max_concurrency = 4

[endpoints.a]
kind = "compatible"
state = "native"
base_url = "{a}/v1"
apis = ["chat", "responses"]

[endpoints.b]
kind = "compatible"
state = "native"
base_url = "{b}/v1"
apis = ["chat", "responses"]

[endpoints.ca]
kind = "compatible"
base_url = "{a}/v1"
apis = ["chat"]
max_concurrency = 50

[endpoints.cb]
kind = "compatible"
base_url = "{b}/v1"
apis = ["chat"]
max_concurrency = 50

[[routes]]
models = ["cap-*"]
endpoints = ["capped"]

[[routes]]
models = ["fo-*"]
endpoints = ["a", "b"]

[[routes]]
models = ["w-*"]
endpoints = ["a", "b"]
strategy = "weighted"

[[routes]]
models = ["wc-*"]
endpoints = ["ca", "cb"]
strategy = "weighted"
"""

MESSAGES = [{"role": "user", "content": "Say hello."}]


class Fleet:
    def __init__(self, postgres: Any, database: str, fakes: dict[str, Upstream]) -> None:
        self.postgres = postgres
        self.database = database
        self.fakes = fakes

    @property
    def dsn(self) -> str:
        return self.postgres.dsn(self.database)

    def config(self) -> str:
        urls = {name: fake.url for name, fake in self.fakes.items()}
        return CONFIG.format(lease=LEASE_S, **urls)

    def proxy(self, tmp: Path) -> Any:
        return llmitm_proxy(
            tmp,
            config=self.config(),
            extra=["--set", f"llmitm_store={self.dsn}"],
            env=self.postgres.env(),  # the password only from the environment
        )

    def sql(self, query: str) -> str:
        return self.postgres.psql(query, self.database).strip()

    def capped_flows(self, model: str = "cap-%") -> tuple[int, int]:
        """Usage rows and recordings of the capped endpoint, whose models are ``model``."""
        usage = self.sql(
            f"SELECT count(*) FROM usage WHERE endpoint = 'capped' AND model LIKE '{model}'"
        )
        recorded = self.sql(
            "SELECT count(*) FROM rec_interactions "
            f"WHERE endpoint = 'capped' AND model LIKE '{model}'"
        )
        return int(usage), int(recorded)

    def fault(self, name: str, spec: str = "") -> None:
        httpx.post(f"{self.fakes[name].url}/_fault", content=spec).raise_for_status()

    def stats(self, name: str) -> dict:
        return httpx.get(f"{self.fakes[name].url}/_stats").json()

    def reset(self) -> None:
        for name, fake in self.fakes.items():
            self.fault(name)
            httpx.post(f"{fake.url}/_reset").raise_for_status()


def status(proxy: Proxy) -> dict:
    return httpx.get(f"http://127.0.0.1:{proxy.port()}/_llmitm/status", timeout=10).json()


def until(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what} within {timeout} s"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def fleet(postgres: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("fleet")
    dsn = postgres.create_database()
    with ExitStack() as stack:
        fakes = {
            name: stack.enter_context(fake_upstream(tmp, name=name, id_prefix=f"{name}_"))
            for name in ("capped", "a", "b")
        }
        yield Fleet(postgres, dsn.rsplit("/", 1)[1], fakes)
    postgres.drop_database(dsn)


@pytest.fixture(scope="module")
def pair(fleet: Fleet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Proxy, Proxy]]:
    tmp = tmp_path_factory.mktemp("pair")
    with fleet.proxy(tmp / "one") as one, fleet.proxy(tmp / "two") as two:
        yield one, two


@pytest.fixture
def f(fleet: Fleet, pair: tuple[Proxy, Proxy]) -> Iterator[Fleet]:
    fleet.reset()
    yield fleet
    fleet.reset()


async def _stream(client: httpx.AsyncClient, model: str) -> tuple[int, str]:
    body = {"model": model, "messages": MESSAGES, "stream": True}
    async with client.stream("POST", "/chat/completions", json=body) as response:
        text = (await response.aread()).decode()
    return response.status_code, text


@pytest.mark.timing  # a load of its own
def test_a_cap_of_4_holds_across_two_proxies_under_100_streams(f: Fleet, pair) -> None:
    f.fault("capped", "events=6;event_delay_ms=15")
    usage_before, recorded_before = f.capped_flows()

    async def run() -> list[tuple[int, str]]:
        limits = httpx.Limits(max_connections=100)
        async with (
            httpx.AsyncClient(base_url=pair[0].base_url(), timeout=120, limits=limits) as one,
            httpx.AsyncClient(base_url=pair[1].base_url(), timeout=120, limits=limits) as two,
        ):
            return await asyncio.gather(
                *(_stream(one if i % 2 else two, f"cap-{i}") for i in range(100))
            )

    results = asyncio.run(run())
    assert [code for code, _ in results] == [200] * 100, [r for r in results if r[0] != 200]
    assert all("[DONE]" in text for _, text in results)
    stats = f.stats("capped")
    assert stats["requests"] == 100
    assert stats["max_in_flight"] <= 4, stats  # each proxy alone would allow 4
    assert stats["max_in_flight"] == 4  # the cap was reached, not only respected
    # Every slot comes back: the shared rows and each proxy's own counts.
    until(lambda: f.sql("SELECT count(*) FROM llmitm_fleet_slots") == "0", 10, "rows freed")
    for proxy in pair:
        now = status(proxy)
        assert now["in_flight"] == 0 and now["waiting"] == 0, now
        assert now["fleet"]["slots_held"] == 0 and now["fleet"]["waiting"] == 0
        assert now["fleet"]["shared"] is True and now["fleet"]["fallbacks"] == 0
    # Both proxies' usage and recordings are complete in the one store.
    until(
        lambda: f.capped_flows() == (usage_before + 100, recorded_before + 100),
        15,
        f"100 usage rows and recordings more than {(usage_before, recorded_before)}",
    )


def test_a_429_seen_by_one_proxy_cools_the_endpoint_for_the_other(f: Fleet, pair) -> None:
    one, two = pair
    f.fault("a", "status=429;retry_after=30;times=1")  # only the first request is refused
    first = openai.OpenAI(base_url=one.base_url(), api_key="sk-x", max_retries=0)
    raw = first.chat.completions.with_raw_response.create(model="fo-cool", messages=MESSAGES)
    assert raw.headers["x-llmitm-endpoint"] == "b" and raw.headers["x-llmitm-attempts"] == "2"

    def cooling_on_two() -> bool:
        model = status(two)["endpoints"]["a"]["models"].get("fo-cool", {})
        return model.get("cooling_s", 0) > 20

    until(cooling_on_two, 5, "the cooldown reached the other proxy")
    second = openai.OpenAI(base_url=two.base_url(), api_key="sk-x", max_retries=0)
    for _ in range(5):
        raw = second.chat.completions.with_raw_response.create(model="fo-cool", messages=MESSAGES)
        assert raw.headers["x-llmitm-endpoint"] == "b"
        assert raw.headers["x-llmitm-attempts"] == "1"  # a was not even tried
    # ``a`` answers again (the fault was for one request), yet nobody sent it another.
    assert f.stats("a")["requests"] == 1


def test_conversations_and_response_ids_follow_their_endpoint_across_proxies(
    f: Fleet, pair
) -> None:
    one, two = (openai.OpenAI(base_url=p.base_url(), api_key="sk-x", max_retries=0) for p in pair)
    # Uncapped endpoints (a new conversation's pin written as its answer ends) and capped
    # ones (written with its slot's take).
    for model in ("w-chat", "wc-chat"):
        homes, followed = [], []
        for i in range(6):  # weighted 1:1: each follow is a coin toss without shared pins
            history = [{"role": "user", "content": f"Conversation {i} on {model}."}]
            raw = one.chat.completions.with_raw_response.create(model=model, messages=history)
            homes.append(raw.headers["x-llmitm-endpoint"])
            history += [
                {"role": "assistant", "content": raw.parse().choices[0].message.content},
                {"role": "user", "content": "And again."},
            ]
            raw = two.chat.completions.with_raw_response.create(model=model, messages=history)
            followed.append(raw.headers["x-llmitm-endpoint"])
        assert followed == homes, model
    homes, followed = [], []
    for i in range(6):
        raw = one.responses.with_raw_response.create(model="w-resp", input=f"Turn one of {i}.")
        homes.append(raw.headers["x-llmitm-endpoint"])
        raw = two.responses.with_raw_response.create(
            model="w-resp", input="Turn two.", previous_response_id=raw.parse().id
        )
        followed.append(raw.headers["x-llmitm-endpoint"])
    assert followed == homes


@pytest.mark.timing  # heartbeats keep their pace
def test_the_status_route_shows_the_fleet(f: Fleet, pair) -> None:
    seen = status(pair[0])["fleet"]
    assert seen["shared"] is True and seen["lease_s"] == LEASE_S
    proxies = {p["pid"]: p for p in seen["proxies"]}
    assert set(proxies) == {p.process.pid for p in pair}
    for member in proxies.values():
        assert member["alive"] and member["last_heartbeat_s"] < LEASE_S
    assert seen["proxy"] in {p["id"] for p in seen["proxies"]}


@pytest.mark.timing  # the slots must free within the lease
def test_a_killed_proxy_frees_its_slots_within_the_lease(f: Fleet, pair, tmp_path: Path) -> None:
    survivor = pair[1]

    async def run() -> tuple[float, float]:
        with f.proxy(tmp_path / "doomed") as doomed:
            async with httpx.AsyncClient(base_url=doomed.base_url(), timeout=60) as client:
                for i in range(3):  # finished flows: none may be lost with the proxy
                    body = {"model": f"cap-done-{i}", "messages": MESSAGES}
                    done = await client.post("/chat/completions", json=body)
                    assert done.status_code == 200
                f.fault("capped", "events=200;event_delay_ms=100")  # then 20 s streams
                streams = []
                for i in range(4):  # every slot of the cap, mid-stream
                    body = {"model": f"cap-k{i}", "messages": MESSAGES, "stream": True}
                    request = client.build_request("POST", "/chat/completions", json=body)
                    response = await client.send(request, stream=True)
                    assert response.status_code == 200
                    chunks = response.aiter_bytes()  # kept: a dropped iterator closes it
                    await anext(chunks)
                    streams.append((response, chunks))
                held = await asyncio.to_thread(f.sql, "SELECT count(*) FROM llmitm_fleet_slots")
                assert held == "4"
                async with httpx.AsyncClient(base_url=survivor.base_url(), timeout=60) as other:
                    waiting = asyncio.create_task(_first_byte(other))
                    await asyncio.sleep(0.5)
                    assert not waiting.done()  # the fleet's cap is full: it waits
                    doomed.process.send_signal(signal.SIGKILL)
                    killed = time.monotonic()
                    served = await waiting - killed
                for response, _ in streams:
                    await response.aclose()
        gone = await asyncio.to_thread(
            until,
            lambda: f.sql("SELECT count(*) FROM llmitm_fleet_proxies") == "2",
            LEASE_S * 2 + 5,
            "the dead proxy swept",
        )
        assert gone
        return served, time.monotonic() - killed

    served, _ = asyncio.run(run())
    print(f"slots freed for the other proxy {served:.2f} s after SIGKILL (lease {LEASE_S} s)")
    # Freed once the lease ran out after the last heartbeat, then a waiter's next try (at
    # most a second later, sooner on the sweep's notice).
    assert served <= LEASE_S + 2.5, served
    # The flows the killed proxy had finished before the kill were all kept.
    assert f.capped_flows("cap-done-%") == (3, 3)
    until(lambda: f.sql("SELECT count(*) FROM llmitm_fleet_slots") == "0", 30, "rows freed")


async def _first_byte(client: httpx.AsyncClient) -> float:
    body = {"model": "cap-after", "messages": MESSAGES, "stream": True}
    async with client.stream("POST", "/chat/completions", json=body) as response:
        assert response.status_code == 200
        chunks = response.aiter_bytes()
        await anext(chunks)
        return time.monotonic()


def test_an_unreachable_database_leaves_each_proxy_deciding_alone(
    fleet: Fleet, tmp_path: Path
) -> None:
    """A store whose server does not answer: the proxy starts, answers every request with its
    own caps, says so once in its log and counts each decision it took alone."""
    with socket.socket() as sock:  # a port nothing listens on: connection refused
        sock.bind(("127.0.0.1", 0))
        dead = f"postgresql://llmitm@127.0.0.1:{sock.getsockname()[1]}/llmitm"
    fleet.reset()
    proxy_cm = llmitm_proxy(
        tmp_path,
        config=fleet.config(),
        extra=["--set", f"llmitm_store={dead}"],
        env=fleet.postgres.env(),
    )
    with proxy_cm as proxy:
        client = openai.OpenAI(base_url=proxy.base_url(), api_key="sk-x", max_retries=0)
        for i in range(5):
            raw = client.chat.completions.with_raw_response.create(
                model=f"cap-alone-{i}", messages=MESSAGES
            )
            assert raw.headers["x-llmitm-endpoint"] == "capped"
        seen = status(proxy)
        assert seen["fleet"]["shared"] is False and seen["fleet"]["proxies"] is None
        assert seen["fleet"]["fallbacks"] >= 5
        assert seen["endpoints"]["capped"]["in_flight"] == 0
        log = proxy.log_text()
    assert log.count("cannot join the fleet yet") == 1
    assert "Traceback" not in log
