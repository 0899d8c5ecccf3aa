"""A single-endpoint (direct) route bounds the wait for the upstream's answer head by
``first_byte_timeout``, as a failover route does: through a real llmitm process and a fake
upstream that delays its head (``first_byte_delay_ms``) far beyond the bound, the client gets
the failover job's 504 ``upstream_timeout`` error in bounded time (raw client and the openai
SDK in its default configuration), the endpoint's health learns a timeout, the next request
is served, the counters are back at 0 and the flow is recorded.
"""

from __future__ import annotations

import itertools
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx2 as httpx
import openai
import pytest

from .processes import Proxy, fake_upstream, llmitm_proxy

pytestmark = [pytest.mark.slow, pytest.mark.timing]

FIRST_BYTE_S = 1.0
STALL = {"x-fake-scenario": "text;first_byte_delay_ms=30000"}

CONFIG = """
[routing]
first_byte_timeout = {limit}
cooldown = 0.1

[endpoints.both]
kind = "compatible"
base_url = "{url}/v1"
apis = ["chat", "responses"]

[endpoints.chat]
kind = "compatible"
base_url = "{url}/v1"
apis = ["chat"]

[endpoints.resp]
kind = "compatible"
base_url = "{url}/v1"
apis = ["responses"]

[[routes]]
models = ["pass-*"]
endpoints = ["both"]

[[routes]]
models = ["tr-chat-*"]
endpoints = ["resp"]

[[routes]]
models = ["tr-responses-*"]
endpoints = ["chat"]

[[routes]]
models = ["slow-*"]
endpoints = ["both"]
first_byte_timeout = 30
"""

ENDPOINT = {"pass": "both", "tr-chat": "resp", "tr-responses": "chat"}


@dataclass
class Stack:
    proxy: Proxy
    db: Path

    def status(self) -> dict:
        return httpx.get(f"http://127.0.0.1:{self.proxy.port()}/_llmitm/status").json()

    def recorded(self, model: str, flows: int) -> list[int]:
        """The statuses recorded for ``model``, once ``flows`` are (the store writes in the
        background)."""
        deadline = time.monotonic() + 5
        while True:
            with sqlite3.connect(self.db) as db:
                rows = db.execute(
                    "SELECT status FROM rec_interactions WHERE model = ?", (model,)
                ).fetchall()
            if len(rows) >= flows or time.monotonic() > deadline:
                return [row[0] for row in rows]
            time.sleep(0.05)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("first-byte")
    with fake_upstream(tmp) as fake:
        config = CONFIG.format(limit=FIRST_BYTE_S, url=fake.url)
        with llmitm_proxy(tmp, config=config) as proxy:
            yield Stack(proxy, tmp / "llmitm.db")


_names = itertools.count()


def request_for(api: str, model: str, stream: bool) -> tuple[str, dict]:
    if api == "chat":
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
        return "/chat/completions", {**body, "stream": stream}
    return "/responses", {"model": model, "input": "hi", "stream": stream}


def last_outcome(s: Stack, endpoint: str, model: str) -> str | None:
    return s.status()["endpoints"][endpoint]["models"][model]["last_outcome"]


def assert_settled(s: Stack, model: str, statuses: list[int]) -> None:
    deadline = time.monotonic() + 5
    while (status := s.status())["in_flight"] or status["waiting"]:
        assert time.monotonic() < deadline, status
        time.sleep(0.05)
    assert all(e["in_flight"] == 0 for e in status["endpoints"].values()), status
    # Each flow is recorded with the status its client got: the timed-out one's 504 too,
    # although the direct path records at the error hook, before that answer is sent.
    assert sorted(s.recorded(model, len(statuses))) == sorted(statuses)


CASES = [
    (api, plan, stream)
    for api in ("chat", "responses")
    for plan in ("pass", "translated")
    for stream in (True, False)
]


@pytest.mark.parametrize(("api", "plan", "stream"), CASES)
def test_no_head_within_first_byte_timeout_is_a_504_upstream_timeout(
    stack: Stack, api: str, plan: str, stream: bool
) -> None:
    kind = "pass" if plan == "pass" else f"tr-{api}"
    model = f"{kind}-{next(_names)}"
    path, body = request_for(api, model, stream)
    with httpx.Client(base_url=stack.proxy.base_url(), timeout=30) as client:
        started = time.monotonic()
        answer = client.post(path, json=body, headers=STALL)
        took = time.monotonic() - started
        assert FIRST_BYTE_S <= took < FIRST_BYTE_S + 3, took
        assert answer.status_code == 504, answer.text
        assert answer.headers["content-type"] == "application/json"
        assert answer.headers["x-should-retry"] == "false"
        error = answer.json()["error"]
        assert (error["type"], error["code"]) == ("timeout_error", "upstream_timeout")
        head = f"The upstream attempt failed: {ENDPOINT[kind]}: timeout"
        assert error["message"].startswith(head)
        [attempt] = error["attempts"]
        assert (attempt["endpoint"], attempt["outcome"]) == (ENDPOINT[kind], "timeout")
        assert attempt["message"] == f"no first byte within {FIRST_BYTE_S:g} s"
        assert last_outcome(stack, ENDPOINT[kind], model) == "timeout"
        # The same connection serves the next request, and health hears of its success.
        path, body = request_for(api, model, stream=False)
        assert client.post(path, json=body, headers={"x-fake-scenario": "text"}).status_code == 200
        assert last_outcome(stack, ENDPOINT[kind], model) == "success"
    assert_settled(stack, model, [504, 200])


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_the_sdk_reads_the_timeout_as_a_504_without_retrying(stack: Stack, api: str) -> None:
    model = f"pass-{next(_names)}"
    client = openai.OpenAI(base_url=stack.proxy.base_url(), api_key="sk-client")
    started = time.monotonic()
    with pytest.raises(openai.APIStatusError) as info:
        if api == "chat":
            client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "hi"}], extra_headers=STALL
            )
        else:
            client.responses.create(model=model, input="hi", stream=True, extra_headers=STALL)
    # x-should-retry: false — the SDK's two default retries would triple the wait.
    assert time.monotonic() - started < FIRST_BYTE_S + 3
    assert info.value.status_code == 504
    assert info.value.code == "upstream_timeout"
    assert_settled(stack, model, [504])


def test_a_head_within_the_routes_own_limit_is_served(stack: Stack) -> None:
    """The route's ``first_byte_timeout`` overrides the default: a head 2 s late is in time."""
    model = f"slow-{next(_names)}"
    with httpx.Client(base_url=stack.proxy.base_url(), timeout=30) as client:
        answer = client.post(
            "/chat/completions",
            json={"model": model, "messages": [{"role": "user", "content": "hi"}]},
            headers={"x-fake-scenario": "text;first_byte_delay_ms=2000"},
        )
    assert answer.status_code == 200, answer.text
    assert last_outcome(stack, "both", model) == "success"
