"""The direct path's concurrency slot, in-process (taddons): taken in ``request``, handed to
a waiting flow when freed, a 429 with ``Retry-After`` when the queue is full or the wait
times out, and given back by ``response`` and by ``error`` (client abort)."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import orjson
import pytest
from mitmproxy import http
from mitmproxy.connection import ConnectionState
from mitmproxy.proxy.server_hooks import ServerConnectionHookData
from mitmproxy.test import taddons, tflow

from llmitm.addons import make_addons
from llmitm.addons.router import LlmRouter
from llmitm.addons.settings import LlmitmSettings

CONFIG = """
[routing]
queue_size = {queue}
queue_timeout = 0.2
queue_retry_after = 2

[endpoints.small]
kind = "compatible"
base_url = "http://127.0.0.1:9/v1"
max_concurrency = 1

[[routes]]
models = ["*"]
endpoints = ["small"]
"""


def flow() -> http.HTTPFlow:
    f = tflow.tflow()
    f.request.method = "POST"
    f.request.url = "https://api.openai.com/v1/chat/completions"
    f.request.headers["content-type"] = "application/json"
    f.request.content = orjson.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    )
    return f


async def request(router: LlmRouter, f: http.HTTPFlow) -> None:
    result: Any = router.request(f)
    if inspect.isawaitable(result):
        await result


def in_flight(router: LlmRouter) -> int:
    return router.routing.limiter.total_in_flight()


@pytest.fixture
def router(tmp_path: Path, request: pytest.FixtureRequest):
    path = tmp_path / "llmitm.toml"
    path.write_text(CONFIG.format(queue=getattr(request, "param", 0)))
    addons = make_addons()
    with taddons.context(*addons) as tctx:
        settings = next(a for a in addons if isinstance(a, LlmitmSettings))
        tctx.configure(settings, llmitm_config=str(path))
        yield next(a for a in addons if isinstance(a, LlmRouter))


async def test_over_the_cap_with_no_queue_is_a_local_429(router: LlmRouter) -> None:
    first, second = flow(), flow()
    await request(router, first)
    assert first.response is None and in_flight(router) == 1
    await request(router, second)
    assert second.response is not None and second.response.status_code == 429
    assert second.response.headers["retry-after"] == "2"
    assert second.response.headers["x-llmitm-endpoint"] == "llmitm"
    assert orjson.loads(second.response.content)["error"]["code"] == "concurrency_limit"
    first.response = http.Response.make(200, b"{}", {"content-type": "application/json"})
    router.response(first)
    router.response(second)
    assert in_flight(router) == 0


@pytest.mark.parametrize("router", [1], indirect=True)
async def test_a_waiting_flow_gets_the_slot_a_client_abort_frees(router: LlmRouter) -> None:
    first, second = flow(), flow()
    await request(router, first)
    waiting = router.request(second)
    assert inspect.isawaitable(waiting)
    first.error = tflow.terr("Client disconnected.")
    first.server_conn.state = ConnectionState.CLOSED  # never connected upstream: freed at once
    router.error(first)
    await waiting
    assert second.response is None and in_flight(router) == 1
    second.response = http.Response.make(200, b"{}", {"content-type": "application/json"})
    router.response(second)
    router.response(second)  # twice: a slot is freed once
    assert in_flight(router) == 0


@pytest.mark.parametrize("router", [1], indirect=True)
async def test_the_wait_times_out_into_a_429(router: LlmRouter) -> None:
    first, second = flow(), flow()
    await request(router, first)
    await request(router, second)  # waits 0.2 s
    assert second.response is not None and second.response.status_code == 429
    assert router.routing.limiter.waiting == 0


async def test_an_aborted_flow_frees_its_slot_once_the_upstream_connection_closes(
    router: LlmRouter,
) -> None:
    first = flow()
    await request(router, first)
    first.server_conn.state = ConnectionState.OPEN
    first.error = tflow.terr("Client disconnected.")
    router.error(first)
    assert in_flight(router) == 1  # the upstream may still be answering it
    router.server_disconnected(ServerConnectionHookData(first.server_conn, first.client_conn))
    assert in_flight(router) == 0


async def test_the_facts_are_in_the_headers_and_the_metadata(router: LlmRouter) -> None:
    from llmitm.addons.patches.headers import IndexedHeaders
    from llmitm.addons.stream_translator import FACTS_KEY, LlmStreamTranslator

    f = flow()
    body = orjson.loads(f.request.content or b"")
    f.request.content = orjson.dumps({**body, "stream": True})
    await request(router, f)
    f.response = http.Response.make(200, b"", {"content-type": "text/event-stream"})
    LlmStreamTranslator().responseheaders(f)
    headers = f.response.headers
    assert isinstance(headers, IndexedHeaders)  # streamed: looked up per chunk
    assert (headers["x-llmitm-endpoint"], headers["x-llmitm-attempts"]) == ("small", "1")
    overhead = float(headers["x-llmitm-overhead-ms"])
    assert 0 < overhead < 1000
    assert f.metadata[FACTS_KEY] == {
        "endpoint": "small",
        "attempts": 1,
        "overhead_ms": overhead,
        "route": "routes[0]",
    }
    # The router asked the chat upstream for usage the client did not ask for.
    assert orjson.loads(f.request.content or b"")["stream_options"] == {"include_usage": True}
    router.response(f)
    assert in_flight(router) == 0
