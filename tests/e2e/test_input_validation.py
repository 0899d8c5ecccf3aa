"""Malformed create requests through a real llmitm process: every one is answered with
OpenAI's 400 naming the field (the SDK raises ``BadRequestError`` with its ``param``), never a
5xx from llmitm, on translating, passthrough and failover routes for both client APIs; the
proxy serves the next request, logs no traceback, and records the refused flows too.

The in-process suite (tests/test_input_validation.py) covers the cases one by one; this is
the smaller set that proves the same of the real process, plus a short fuzz."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import openai
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmitm.replay.model import Interaction
from llmitm.store.sqlite import SqliteStore

from .processes import Proxy, fake_upstream, llmitm_proxy

pytestmark = pytest.mark.slow

CONFIG = """
[endpoints.chat-only]
kind = "compatible"
base_url = "{url}/v1"
apis = ["chat"]

[endpoints.responses-only]
kind = "openai"
base_url = "{url}/v1"
apis = ["responses"]

[[routes]]
models = ["to-chat"]
endpoints = ["chat-only"]

[[routes]]
models = ["to-responses"]
endpoints = ["responses-only"]

[[routes]]
models = ["failover"]
endpoints = ["chat-only", "responses-only"]
"""
ROUTES = ("to-chat", "to-responses", "failover")
PATHS = {"responses": "/v1/responses", "chat": "/v1/chat/completions"}


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    tmp = tmp_path_factory.mktemp("validation")
    with (
        fake_upstream(tmp) as upstream,
        llmitm_proxy(tmp, config=CONFIG.format(url=upstream.url)) as proxy,
    ):
        yield proxy


def deep(levels: int) -> bytes:
    return b"[" * levels + b"]" * levels


def post(proxy: Proxy, api: str, content: bytes, **headers: str) -> httpx.Response:
    with httpx.Client(timeout=20) as client:
        return client.post(
            f"http://127.0.0.1:{proxy.port()}{PATHS[api]}",
            content=content,
            headers={"content-type": "application/json", "authorization": "Bearer sk-x"} | headers,
        )


def body(api: str, model: str, **fields: Any) -> dict[str, Any]:
    if api == "responses":
        return {"model": model, "input": "hi", **fields}
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], **fields}


def tool(api: str, parameters: Any) -> dict[str, Any]:
    if api == "responses":
        return {"type": "function", "name": "f", "parameters": parameters}
    return {"type": "function", "function": {"name": "f", "parameters": parameters}}


def known_cases(api: str, model: str) -> list[tuple[bytes, str]]:
    """(body, the param its 400 names) — what once answered 500 or was forwarded."""
    messages = "input" if api == "responses" else "messages"
    parameters = "tools[0].parameters" if api == "responses" else "tools[0].function.parameters"
    base = body(api, model)
    deep_tool = orjson.dumps({**base, "tools": [tool(api, {"p": 1})]}).replace(
        b'{"p":1}', b'{"p":' + deep(300) + b"}"
    )
    cases = [
        (
            orjson.dumps({**base, messages: [{"role": ["user"], "content": "x"}]}),
            f"{messages}[0].role",
        ),
        (
            orjson.dumps({**base, messages: [{"role": {"r": 1}, "content": "x"}]}),
            f"{messages}[0].role",
        ),
        (orjson.dumps({**base, "tools": [tool(api, '{"type":"object"}')]}), parameters),
        (orjson.dumps({**base, "tool_choice": 3}), "tool_choice"),
        (deep_tool, parameters),
    ]
    if api == "responses":
        deep_input = b'{"model":"%s","input":[{"role":"user","content":%s}]}' % (
            model.encode(),
            deep(600),
        )
        cases.append((deep_input, "input[0].content"))
    return cases


@pytest.mark.parametrize("api", ["responses", "chat"])
@pytest.mark.parametrize("route", ROUTES)
def test_known_bad_requests_are_400s_naming_the_field(proxy: Proxy, api: str, route: str) -> None:
    for content, param in known_cases(api, route):
        response = post(proxy, api, content)
        assert response.status_code == 400, response.text
        assert response.headers["content-type"] == "application/json"
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error"
        assert error["param"].startswith(param), error
    # ... and the proxy still serves a well-formed request on the same route.
    assert post(proxy, api, orjson.dumps(body(api, route))).status_code == 200


@pytest.mark.parametrize("route", ROUTES)
def test_the_sdk_gets_a_bad_request_error_with_the_param(proxy: Proxy, route: str) -> None:
    client = openai.OpenAI(base_url=proxy.base_url(), api_key="sk-x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(model=route, input="hi", tool_choice=7)  # type: ignore[arg-type]
    assert raised.value.param == "tool_choice"
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(
            model=route,
            messages=[{"role": ["user"], "content": "hi"}],  # type: ignore[list-item, typeddict-item]
        )
    assert raised.value.param == "messages[0].role"


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_64_kib_of_client_headers_reach_the_upstream_on_a_failover_route(
    proxy: Proxy, api: str
) -> None:
    headers = {f"x-big-{i}": "v" * 1000 for i in range(70)}
    response = post(proxy, api, orjson.dumps(body(api, "failover")), **headers)
    assert response.status_code == 200, response.text


async def refused_recordings(db_path: Path) -> list[Interaction]:
    async with SqliteStore(db_path, read_only=True) as store:
        return await store.recordings(scope="refused")


def test_refused_flows_are_recorded_and_nothing_was_a_traceback(proxy: Proxy) -> None:
    sent = 0
    for api in ("responses", "chat"):
        for route in ROUTES:
            for content, _ in known_cases(api, route):
                response = post(proxy, api, content, **{"x-llmitm-scope": "refused"})
                assert response.status_code == 400
                sent += 1
    db_path = proxy.log.parent / "llmitm.db"  # llmitm_proxy keeps its store next to its log
    deadline = time.monotonic() + 10
    rows: list[tuple[int, str]] = []
    while time.monotonic() < deadline:
        # Through the store: canonical texts may sit in its shared content chunks.
        rows = [(i.status, i.canonical) for i in asyncio.run(refused_recordings(db_path))]
        if len(rows) >= sent:
            break
        time.sleep(0.2)
    assert len(rows) == sent and {status for status, _ in rows} == {400}, rows
    # The deep bodies too (two Responses bodies and one chat body per route), keyed by bytes.
    assert sum("sha256:" in canonical for _, canonical in rows) == 3 * len(ROUTES)
    log = proxy.log_text()
    assert "Traceback" not in log and "llmitm_error" not in log, log[-3000:]


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=6),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(
            st.sampled_from(["type", "role", "content", "text", "name"]), children, max_size=3
        )
    ),
    max_leaves=10,
)


@st.composite
def bodies(draw: st.DrawFn) -> tuple[str, bytes]:
    api = draw(st.sampled_from(["responses", "chat"]))
    fields = draw(
        st.dictionaries(
            st.sampled_from(
                [
                    "input",
                    "messages",
                    "tools",
                    "tool_choice",
                    "instructions",
                    "stream",
                    "temperature",
                ]
            ),
            JSON,
            max_size=3,
        )
    )
    content = orjson.dumps({**body(api, draw(st.sampled_from(ROUTES))), **fields})
    levels = draw(st.sampled_from([0, 0, 100, 300, 1100]))
    if levels:
        content = content[:-1] + b',"extra":' + deep(levels) + b"}"
    return api, content


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(case=bodies())
def test_fuzzed_bodies_never_get_a_5xx(proxy: Proxy, case: tuple[str, bytes]) -> None:
    api, content = case
    response = post(proxy, api, content)
    assert response.status_code < 500, response.text
    assert response.headers["content-type"].startswith(("application/json", "text/event-stream"))
    if response.status_code != 200:
        assert response.json()["error"]["message"]
