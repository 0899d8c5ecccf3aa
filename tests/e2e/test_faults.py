"""Upstream faults answered in the client's protocol, through a real llmitm process and a
fault-injecting fake upstream (the fault rides on each request's ``x-fake-scenario``).

For a stall (connection open, no bytes) after the stream began, and for every failure
before the answer's head (refused, reset, bytes that are not HTTP, a plain body cut short),
on single-endpoint (direct) and failover (relayed) routes, for both client APIs, passthrough
and translated, with a raw HTTP client and the openai SDK: the answer comes in bounded
time, is an error in the client's protocol (an OpenAI error object, or a terminal stream
event), the next request on the route is served, the counters are back at 0, and the flow
is recorded.
"""

from __future__ import annotations

import itertools
import socket
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx2 as httpx
import openai
import orjson
import pytest

from .processes import Proxy, fake_upstream, llmitm_proxy
from .test_record_replay import llmitm

pytestmark = pytest.mark.slow

IDLE_S = 1.0

CONFIG = """
[routing]
stream_idle_timeout = {idle}
connect_timeout = 1
first_byte_timeout = 5
timeout = 10
cooldown = 0.1
backoff = 0.01
backoff_max = 0.02

[endpoints.both]
kind = "compatible"
base_url = "{url}/v1"
apis = ["chat", "responses"]

[endpoints.both2]
kind = "compatible"
base_url = "{url}/v1"
apis = ["chat", "responses"]

[endpoints.chat]
kind = "compatible"
base_url = "{url}/v1"
apis = ["chat"]

[endpoints.chat2]
kind = "compatible"
base_url = "{url}/v1"
apis = ["chat"]

[endpoints.resp]
kind = "compatible"
base_url = "{url}/v1"
apis = ["responses"]

[endpoints.resp2]
kind = "compatible"
base_url = "{url}/v1"
apis = ["responses"]

[endpoints.dead]
kind = "compatible"
base_url = "http://127.0.0.1:{dead}/v1"
apis = ["chat", "responses"]

[endpoints.dead2]
kind = "compatible"
base_url = "http://127.0.0.1:{dead}/v1"
apis = ["chat", "responses"]

[[routes]]
models = ["direct-pass-*"]
endpoints = ["both"]

[[routes]]
models = ["direct-tr-chat-*"]
endpoints = ["resp"]

[[routes]]
models = ["direct-tr-responses-*"]
endpoints = ["chat"]

[[routes]]
models = ["failover-pass-*"]
endpoints = ["both", "both2"]

[[routes]]
models = ["failover-tr-chat-*"]
endpoints = ["resp", "resp2"]

[[routes]]
models = ["failover-tr-responses-*"]
endpoints = ["chat", "chat2"]

[[routes]]
models = ["direct-dead-*"]
endpoints = ["dead"]

[[routes]]
models = ["failover-dead-*"]
endpoints = ["dead", "dead2"]
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Stack:
    proxy: Proxy
    db: Path

    def status(self) -> dict:
        return httpx.get(f"http://127.0.0.1:{self.proxy.port()}/_llmitm/status").json()

    def recorded(self, model: str) -> list[int]:
        """The statuses recorded for ``model`` (the store writes in the background)."""
        deadline = time.monotonic() + 5
        while True:
            with sqlite3.connect(self.db) as db:
                rows = db.execute(
                    "SELECT status FROM rec_interactions WHERE model = ?", (model,)
                ).fetchall()
            if rows or time.monotonic() > deadline:
                return [row[0] for row in rows]
            time.sleep(0.05)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("faults")
    with fake_upstream(tmp) as fake:
        config = CONFIG.format(idle=IDLE_S, url=fake.url, dead=free_port())
        with llmitm_proxy(tmp, config=config) as proxy:
            yield Stack(proxy, tmp / "llmitm.db")


_names = itertools.count()


def model_for(path: str, api: str, plan: str) -> str:
    """A fresh model name on the route for ``path`` × ``api`` × ``plan`` (health is kept
    per endpoint and model, so no test's failure decides another's route)."""
    kind = "pass" if plan == "pass" else f"tr-{api}"
    return f"{path}-{kind}-{next(_names)}"


def request_for(api: str, model: str, stream: bool) -> tuple[str, dict]:
    if api == "chat":
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
        return "/chat/completions", {**body, "stream": stream}
    return "/responses", {"model": model, "input": "hi", "stream": stream}


def assert_settled(s: Stack, model: str) -> None:
    """Counters back at 0, and the flow in the store."""
    deadline = time.monotonic() + 5
    while (status := s.status())["in_flight"] or status["waiting"]:
        assert time.monotonic() < deadline, status
        time.sleep(0.05)
    assert all(e["in_flight"] == 0 for e in status["endpoints"].values()), status
    assert s.recorded(model), f"{model} was not recorded"


def assert_next_request_served(client: httpx.Client, api: str, model: str) -> None:
    path, body = request_for(api, model, stream=False)
    answer = client.post(path, json=body, headers={"x-fake-scenario": "text"})
    assert answer.status_code == 200, answer.text


ROUTE_ENDPOINTS = {
    "direct-pass": ["both"],
    "direct-tr-chat": ["resp"],
    "direct-tr-responses": ["chat"],
    "failover-pass": ["both", "both2"],
    "failover-tr-chat": ["resp", "resp2"],
    "failover-tr-responses": ["chat", "chat2"],
    "direct-dead": ["dead"],
    "failover-dead": ["dead", "dead2"],
}


def outcomes(s: Stack, model: str) -> list[str | None]:
    """The last outcome on each endpoint of ``model``'s route that was tried: per model, or
    per endpoint for a connection error (which keeps the whole endpoint away)."""
    route = next(prefix for prefix in ROUTE_ENDPOINTS if model.startswith(prefix + "-"))
    found = []
    for name in ROUTE_ENDPOINTS[route]:
        endpoint = s.status()["endpoints"][name]
        if model in endpoint["models"]:
            found.append(endpoint["models"][model]["last_outcome"])
        elif endpoint["last_outcome"] == "connect_error":
            found.append("connect_error")
    return found


# --- a stall after the stream began ---------------------------------------------------------

MATRIX = [
    (path, api, plan)
    for path in ("direct", "failover")
    for api in ("chat", "responses")
    for plan in ("pass", "translated")
]


def sse_events(text: str) -> list[tuple[str | None, str]]:
    events = []
    for block in text.split("\n\n"):
        name, data = None, []
        for line in block.splitlines():
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].strip())
        if data:
            events.append((name, "\n".join(data)))
    return events


@pytest.mark.parametrize(("path", "api", "plan"), MATRIX)
def test_a_stalled_stream_ends_in_the_clients_protocol_raw(
    stack: Stack, path: str, api: str, plan: str
) -> None:
    model = model_for(path, api, plan)
    url, body = request_for(api, model, stream=True)
    with httpx.Client(base_url=stack.proxy.base_url(), timeout=30) as client:
        started = time.monotonic()
        answer = client.post(url, json=body, headers={"x-fake-scenario": "text;stall_after=2"})
        took = time.monotonic() - started
        assert answer.status_code == 200
        assert IDLE_S <= took < IDLE_S + 3, took
        events = sse_events(answer.text)
        if api == "chat":
            assert events[-1] == (None, "[DONE]")
            error = orjson.loads(events[-2][1])["error"]
            assert error["type"] == "server_error" and error["message"]
        else:
            assert [name for name, _ in events[-2:]] == ["error", "response.failed"]
            assert orjson.loads(events[-1][1])["response"]["status"] == "failed"
        # Counted against the endpoint (until the next request's success).
        assert {"cut", "timeout"} & set(outcomes(stack, model))
        assert_next_request_served(client, api, model)
    assert_settled(stack, model)


@pytest.mark.parametrize(("path", "api", "plan"), MATRIX)
def test_a_stalled_stream_ends_in_the_clients_protocol_sdk(
    stack: Stack, path: str, api: str, plan: str
) -> None:
    model = model_for(path, api, plan)
    client = openai.OpenAI(
        base_url=stack.proxy.base_url(), api_key="sk-client", max_retries=0, timeout=30
    )
    stall = {"x-fake-scenario": "text;stall_after=2"}
    started = time.monotonic()
    with pytest.raises(openai.APIError) as info:
        if api == "chat":
            messages = [{"role": "user", "content": "hi"}]
            for _ in client.chat.completions.create(
                model=model, messages=messages, stream=True, extra_headers=stall
            ):
                pass
        else:
            for _ in client.responses.create(
                model=model, input="hi", stream=True, extra_headers=stall
            ):
                pass
    # The error event of the API, not a transport error (APIConnectionError, APITimeoutError).
    assert type(info.value) is openai.APIError
    assert "ended" in str(info.value)
    assert time.monotonic() - started < IDLE_S + 3
    assert_settled(stack, model)


# --- failures before the answer's head ------------------------------------------------------

HEAD_FAULTS = [
    ("reset_before_headers", True),
    ("reset_before_headers", False),
    ("not_http", True),
    ("not_http", False),
    ("short_body", False),
    ("refused", True),
    ("refused", False),
]


HEAD_CASES = [
    (*case, *fault)
    for case in MATRIX
    for fault in HEAD_FAULTS
    # Nothing is translated from an endpoint that is not there: refused is one plan.
    if fault[0] != "refused" or case[2] == "pass"
]


@pytest.mark.parametrize(("path", "api", "plan", "fault", "stream"), HEAD_CASES)
def test_a_failure_before_the_head_is_an_openai_error(
    stack: Stack, path: str, api: str, plan: str, fault: str, stream: bool
) -> None:
    if fault == "refused":
        model = f"{path}-dead-{api}-{next(_names)}"
    else:
        model = model_for(path, api, plan)
    url, body = request_for(api, model, stream)
    with httpx.Client(base_url=stack.proxy.base_url(), timeout=30) as client:
        started = time.monotonic()
        answer = client.post(url, json=body, headers={"x-fake-scenario": f"text;{fault}"})
        assert time.monotonic() - started < 3
        assert answer.status_code == 502, answer.text
        assert answer.headers["content-type"] == "application/json"
        error = answer.json()["error"]
        assert set(error) >= {"message", "type", "code"} and error["type"] == "server_error"
        expected = {"direct": {"upstream_unreachable", "upstream_error"}}
        assert error["code"] in expected.get(path, {"upstream_failed"})
        # Counted against the endpoint(s) (until the next request's success).
        found = outcomes(stack, model)
        assert found and set(found) <= {"connect_error", "server_error"}, found
        if fault != "refused":
            assert_next_request_served(client, api, model)
    assert_settled(stack, model)
    assert_recorded_answer(stack, model, 502, error["code"])


def assert_recorded_answer(s: Stack, model: str, status: int, code: str) -> None:
    """The model's first flow is recorded with the answer its client got (the direct path
    records at the error hook, before that answer is sent): the store's row and ``llmitm rec
    show`` hold its status and its OpenAI error."""
    with sqlite3.connect(s.db) as db:
        rows = db.execute(
            "SELECT id, status FROM rec_interactions WHERE model = ? ORDER BY started_us",
            (model,),
        ).fetchall()
    ident, recorded = rows[0]
    assert recorded == status
    shown = llmitm("rec", "show", ident, "--db", str(s.db), "--json")
    assert shown.returncode == 0, shown.stderr
    answer = orjson.loads(shown.stdout)["client_resp"]
    assert answer["status"] == status
    assert answer["body"]["json"]["error"]["code"] == code


@pytest.mark.parametrize("path", ["direct", "failover"])
@pytest.mark.parametrize("api", ["chat", "responses"])
def test_the_sdk_reads_a_failure_before_the_head_as_an_api_error(
    stack: Stack, path: str, api: str
) -> None:
    model = model_for(path, api, "pass")
    client = openai.OpenAI(
        base_url=stack.proxy.base_url(), api_key="sk-client", max_retries=0, timeout=30
    )
    short = {"x-fake-scenario": "text;short_body"}
    with pytest.raises(openai.APIStatusError) as info:
        if api == "chat":
            client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "hi"}], extra_headers=short
            )
        else:
            client.responses.create(model=model, input="hi", extra_headers=short)
    assert info.value.status_code == 502
    assert info.value.code in {"upstream_error", "upstream_failed"}
    assert_settled(stack, model)
