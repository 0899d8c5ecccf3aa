"""Routing that survives, through a real llmitm process and several fault-injecting fake
upstreams (``python -m llmitm.testing.fake_upstream --fault``, changed per test with
``POST /_fault``).

Each test uses its own model name: 429/5xx cooldowns are kept per endpoint *and model*, so
one test's cooldown never decides another's route. The clients are the openai SDK (with its
own retries off, so every retry seen is llmitm's) and, for load, raw httpx streams.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
import time
from collections import Counter
from collections.abc import Iterator

import httpx2 as httpx
import openai
import pytest

from .processes import Proxy, Upstream, fake_upstream, llmitm_proxy

pytestmark = pytest.mark.slow

CONFIG = """
[routing]
cooldown = 1.5
connect_timeout = 1
first_byte_timeout = 2
timeout = 10
backoff = 0.05
backoff_max = 0.2
queue_size = 300
queue_timeout = 20
affinity_ttl = 60

[endpoints.a]
kind = "compatible"
state = "native"  # the fake keeps Responses state: ids have an owner
base_url = "{a}/v1"
apis = ["chat", "responses"]

[endpoints.b]
kind = "compatible"
state = "native"  # the fake keeps Responses state: ids have an owner
base_url = "{b}/v1"
apis = ["chat", "responses"]

[endpoints.b-chat]
kind = "compatible"
base_url = "{b}/v1"
apis = ["chat"]

[endpoints.dead]
kind = "compatible"
state = "native"  # the fake keeps Responses state: ids have an owner
base_url = "http://127.0.0.1:{dead}/v1"
apis = ["chat", "responses"]

[endpoints.c]
kind = "compatible"
state = "native"  # the fake keeps Responses state: ids have an owner
base_url = "{c}/v1"
apis = ["chat", "responses"]
max_concurrency = 4

[endpoints.d]
kind = "compatible"
state = "native"  # the fake keeps Responses state: ids have an owner
base_url = "{d}/v1"
apis = ["chat", "responses"]
max_concurrency = 3

[[routes]]
name = "failover"
models = ["fo-*"]
endpoints = ["a", "b"]

[[routes]]
name = "translated-fallback"
models = ["tf-*"]
endpoints = ["a", "b-chat"]

[[routes]]
models = ["dead-*"]
endpoints = ["dead", "b"]

[[routes]]
models = ["alldown-*"]
endpoints = ["dead", "a"]

[[routes]]
models = ["retry-*"]
endpoints = ["a"]
attempts = 3

[[routes]]
models = ["slow-*"]
endpoints = ["a", "b"]
first_byte_timeout = 0.5

[[routes]]
models = ["lb-*"]
endpoints = ["a", "b"]
strategy = "least-busy"
affinity = false

[[routes]]
models = ["w-*"]
endpoints = ["a", "b"]
strategy = "weighted"

[[routes]]
models = ["cap-direct-*"]
endpoints = ["c"]

[[routes]]
models = ["cap-relay-*"]
endpoints = ["c", "d"]
strategy = "least-busy"
"""


def free_port() -> int:
    """A loopback port nobody listens on (connection refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Stack:
    def __init__(self, proxy: Proxy, fakes: dict[str, Upstream]) -> None:
        self.proxy = proxy
        self.fakes = fakes
        self.client = openai.OpenAI(
            base_url=proxy.base_url(), api_key="sk-client", max_retries=0, timeout=30
        )

    def fault(self, name: str, spec: str = "") -> None:
        httpx.post(f"{self.fakes[name].url}/_fault", content=spec).raise_for_status()

    def reset(self) -> None:
        """Clear faults, and requests once the previous test's (timed-out, aborted) requests
        have left the fakes, so each test reads its own concurrency."""
        deadline = time.monotonic() + 10
        for name, fake in self.fakes.items():
            self.fault(name)
            while self.stats(name)["in_flight"] and time.monotonic() < deadline:
                time.sleep(0.05)
            httpx.post(f"{fake.url}/_reset").raise_for_status()

    def requests(self, name: str) -> list[dict]:
        return httpx.get(f"{self.fakes[name].url}/_requests").json()

    def models(self, name: str) -> list[str]:
        return [r["body"]["model"] for r in self.requests(name)]

    def stats(self, name: str) -> dict:
        return httpx.get(f"{self.fakes[name].url}/_stats").json()

    def status(self) -> dict:
        url = f"http://127.0.0.1:{self.proxy.port()}/_llmitm/status"
        return httpx.get(url).json()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("routing")
    with (
        fake_upstream(tmp, name="a") as a,
        fake_upstream(tmp, name="b") as b,
        fake_upstream(tmp, name="c") as c,
        fake_upstream(tmp, name="d") as d,
    ):
        config = CONFIG.format(a=a.url, b=b.url, c=c.url, d=d.url, dead=free_port())
        with llmitm_proxy(tmp, config=config) as proxy:
            yield Stack(proxy, {"a": a, "b": b, "c": c, "d": d})


@pytest.fixture
def s(stack: Stack) -> Iterator[Stack]:
    stack.reset()
    yield stack
    stack.reset()


MESSAGES = [{"role": "user", "content": "Say hello."}]


_conversations = itertools.count()


def chat(s: Stack, model: str, **kwargs):
    """One chat request, each a new conversation (so affinity pins nothing across calls)."""
    messages = [{"role": "user", "content": f"Say hello ({next(_conversations)})."}]
    return s.client.chat.completions.with_raw_response.create(
        model=model, messages=messages, **kwargs
    )


def facts(raw) -> tuple[str, int]:
    return raw.headers["x-llmitm-endpoint"], int(raw.headers["x-llmitm-attempts"])


# --- failover -------------------------------------------------------------------------------


def test_429_with_retry_after_fails_over_and_the_endpoint_cools_for_what_it_asked(s) -> None:
    s.fault("a", "status=429;retry_after=2")
    raw = chat(s, "fo-429")
    assert raw.http_response.status_code == 200
    assert facts(raw) == ("b", 2)
    assert float(raw.headers["x-llmitm-overhead-ms"]) < 200
    assert raw.headers.get("connection") != "close"  # the relay's hop-by-hop, not the client's
    assert raw.parse().choices[0].message.content == "Hello from the fake upstream."
    # a is cooling: the next request goes straight to b, a sees nothing.
    s.fault("a")
    assert facts(chat(s, "fo-429")) == ("b", 1)
    assert s.models("a") == ["fo-429"]
    time.sleep(2.1)  # the Retry-After has passed: a is first again
    assert facts(chat(s, "fo-429")) == ("a", 1)


def test_a_500_is_retried_on_the_only_endpoint(s) -> None:
    s.fault("a", "status=500;times=2")
    raw = chat(s, "retry-500")
    assert raw.http_response.status_code == 200
    assert facts(raw) == ("a", 3)
    assert s.models("a") == ["retry-500"] * 3


def test_connection_refused_goes_to_the_next_endpoint(s) -> None:
    raw = chat(s, "dead-x")
    assert facts(raw) == ("b", 2)
    # The dead endpoint is cooling as a whole: no second connect attempt meanwhile.
    assert facts(chat(s, "dead-y")) == ("b", 1)


@pytest.mark.timing
def test_a_slow_first_byte_past_the_timeout_goes_to_the_next_endpoint(s) -> None:
    s.fault("a", "first_byte_delay_ms=3000")
    started = time.monotonic()
    with s.client.chat.completions.with_streaming_response.create(
        model="slow-x", messages=MESSAGES, stream=True
    ) as raw:
        assert facts(raw) == ("b", 2)
        assert time.monotonic() - started < 2.5  # 0.5 s timeout, not a's 3 s
        assert [c for c in raw.parse() if c.choices][-1].choices[0].finish_reason == "stop"


def test_a_plain_request_may_take_longer_than_the_first_byte_timeout(s) -> None:
    # Its first byte is its whole answer: only the route's budget bounds it.
    s.fault("a", "first_byte_delay_ms=1000")
    assert facts(chat(s, "slow-plain")) == ("a", 1)


def test_all_down_gives_one_error_listing_the_attempts(s) -> None:
    s.fault("a", "status=503")
    with pytest.raises(openai.APIStatusError) as info:
        chat(s, "alldown-x")
    error = info.value
    assert error.status_code == 502
    assert error.response.headers["x-llmitm-attempts"] == "2"
    assert error.response.headers["x-should-retry"] == "false"
    body = error.response.json()["error"]
    assert body["code"] == "upstream_failed"
    # (in either order: dead may still be cooling from another test's connect error)
    assert sorted((t["endpoint"], t["outcome"], t["status"]) for t in body["attempts"]) == [
        ("a", "server_error", 503),
        ("dead", "connect_error", None),
    ]
    assert "dead" in body["message"] and "503" in body["message"]


def test_streamed_failover_before_the_first_byte_is_invisible(s) -> None:
    s.fault("a", "status=500")
    with s.client.chat.completions.with_streaming_response.create(
        model="fo-stream", messages=MESSAGES, stream=True
    ) as raw:
        assert facts(raw) == ("b", 2)
        text = "".join(
            chunk.choices[0].delta.content or "" for chunk in raw.parse() if chunk.choices
        )
    assert text == "Hello from the fake upstream."


def test_failover_to_an_endpoint_of_the_other_api_translates_its_stream(s) -> None:
    # a fails; b-chat speaks only chat, so the Responses client's stream is translated.
    s.fault("a", "status=429;retry_after=1")
    with s.client.responses.with_streaming_response.create(
        model="tf-x", input="Say hello.", stream=True
    ) as raw:
        assert facts(raw) == ("b-chat", 2)
        events = list(raw.parse())
    assert events[-1].type == "response.completed"
    assert events[-1].response.output_text == "Hello from the fake upstream."
    assert s.requests("b")[0]["api"] == "chat"


def test_a_cut_after_the_first_byte_is_a_terminal_error_and_not_retried(s) -> None:
    s.fault("a", "disconnect_after=3")
    stream = s.client.chat.completions.create(
        model="fo-cut", messages=MESSAGES, stream=True, extra_headers={"x-fake-scenario": "text"}
    )
    with pytest.raises(openai.APIError) as info:
        for _ in stream:
            pass
    # The cut is the client's terminal error: the guard's words, or the chat normaliser's
    # (a compatible endpoint's chat streams are normalised by default).
    assert "stream ended before its" in str(info.value)
    assert s.models("a") == ["fo-cut"]
    assert s.models("b") == []  # nothing retried after the first byte


# --- strategies and caps under load ---------------------------------------------------------


async def _stream(client: httpx.AsyncClient, model: str, spec: str, abort: bool) -> str | None:
    body = {"model": model, "messages": MESSAGES, "stream": True}
    headers = {"x-fake-scenario": spec}
    async with client.stream("POST", "/chat/completions", json=body, headers=headers) as r:
        endpoint = r.headers.get("x-llmitm-endpoint")
        if r.status_code != 200:
            await r.aread()
            return f"status {r.status_code}"
        async for _ in r.aiter_bytes():
            if abort:
                return None  # leaving the block closes the connection mid-stream
    return endpoint


def test_least_busy_spreads_concurrent_streams(s) -> None:
    async def run() -> list[str | None]:
        async with httpx.AsyncClient(base_url=s.proxy.base_url(), timeout=30) as client:
            return await asyncio.gather(
                *(_stream(client, "lb-x", "text;events=10;event_delay_ms=100", False)
                  for _ in range(12))
            )  # fmt: skip

    served = Counter(asyncio.run(run()))
    assert served == {"a": 6, "b": 6}
    assert s.stats("a")["max_in_flight"] == 6 and s.stats("b")["max_in_flight"] == 6


def test_counters_return_to_zero_after_200_mixed_requests_with_aborts(s) -> None:
    """Direct and relayed flows on capped endpoints, streamed and not, a quarter aborted by
    the client mid-stream, a few cut by the upstream: the caps hold and every slot comes
    back."""

    async def one(client: httpx.AsyncClient, i: int) -> str | None:
        model = "cap-direct-x" if i % 2 else "cap-relay-x"
        spec = "text;events=8;event_delay_ms=20"
        if i % 13 == 0:
            spec += ";disconnect_after=3"
        if i % 5 == 0:
            body = {"model": model, "messages": MESSAGES}
            r = await client.post("/chat/completions", json=body, headers={"x-fake-scenario": spec})
            return r.headers.get("x-llmitm-endpoint") if r.status_code == 200 else None
        return await _stream(client, model, spec, abort=i % 4 == 0)

    async def run() -> list[str | None]:
        limits = httpx.Limits(max_connections=200)
        async with httpx.AsyncClient(
            base_url=s.proxy.base_url(), timeout=60, limits=limits
        ) as client:
            return await asyncio.gather(*(one(client, i) for i in range(200)))

    results = asyncio.run(run())
    assert not [r for r in results if r is not None and r.startswith("status")], results
    assert s.stats("c")["max_in_flight"] <= 4
    assert s.stats("d")["max_in_flight"] <= 3
    assert s.stats("c")["max_in_flight"] == 4  # the cap was reached, not just respected
    deadline = time.monotonic() + 10
    while True:
        status = s.status()
        if status["in_flight"] == 0 and status["waiting"] == 0:
            break
        assert time.monotonic() < deadline, status
        time.sleep(0.1)
    assert all(e["in_flight"] == 0 for e in status["endpoints"].values()), status


# --- affinity --------------------------------------------------------------------------------


def test_a_conversation_stays_on_its_endpoint_and_moves_when_it_dies(s) -> None:
    history = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    served = []
    for turn in range(6):
        raw = s.client.chat.completions.with_raw_response.create(model="w-conv", messages=history)
        served.append(raw.headers["x-llmitm-endpoint"])
        answer = raw.parse().choices[0].message.content
        history += [
            {"role": "assistant", "content": answer},
            {"role": "user", "content": f"Turn {turn}"},
        ]
    assert len(set(served)) == 1, served
    home = served[0]
    other = "b" if home == "a" else "a"
    s.fault(home, "status=500")
    moved = [
        s.client.chat.completions.with_raw_response.create(
            model="w-conv", messages=history
        ).headers["x-llmitm-endpoint"]
        for _ in range(4)
    ]
    assert moved == [other] * 4  # and it stays there
    # Other conversations still spread over both (weighted 1:1).
    s.fault(home)
    time.sleep(1.6)
    spread = Counter(
        s.client.chat.completions.with_raw_response.create(
            model="w-other", messages=[{"role": "user", "content": f"conversation {i}"}]
        ).headers["x-llmitm-endpoint"]
        for i in range(24)
    )
    assert set(spread) == {"a", "b"}, spread


def test_a_previous_response_id_chain_always_reaches_its_owner(s) -> None:
    owners = []
    previous = None
    for turn in range(8):
        raw = s.client.responses.with_raw_response.create(
            model="w-chain", input=f"turn {turn}", previous_response_id=previous
        )
        owners.append(raw.headers["x-llmitm-endpoint"])
        previous = raw.parse().id
    assert len(set(owners)) == 1, owners
    owner = owners[0]
    fake_ids = {r["body"].get("previous_response_id") for r in s.requests(owner)} - {None}
    assert len(fake_ids) == 7
    # Mandatory on a native Responses endpoint: even a throttled owner is not replaced.
    s.fault(owner, "status=429;retry_after=1;times=1")
    raw = s.client.responses.with_raw_response.create(
        model="w-chain", input="again", previous_response_id=previous
    )
    assert facts(raw) == (owner, 2)


def test_status_route_reports_counters_and_cooldowns(s) -> None:
    s.fault("a", "status=503")
    assert facts(chat(s, "fo-status")) == ("b", 2)
    status = s.status()
    assert set(status["endpoints"]) == {"a", "b", "b-chat", "dead", "c", "d"}
    assert status["in_flight"] == 0 and status["waiting"] == 0
    a = status["endpoints"]["a"]["models"]["fo-status"]
    assert a["last_outcome"] == "server_error" and 0 < a["cooling_s"] <= 1.5


def test_route_facts_are_in_the_flow_headers_for_the_direct_path(s) -> None:
    raw = chat(s, "cap-direct-facts")
    assert facts(raw) == ("c", 1)
    assert float(raw.headers["x-llmitm-overhead-ms"]) >= 0
