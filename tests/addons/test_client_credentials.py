"""A client's own credential, in any of its spellings, never reaches an endpoint whose key
llmitm injects, and never stays on the flow that mitmdump shows and ``-w`` saves."""

from __future__ import annotations

from pathlib import Path

import pytest
from mitmproxy import http
from mitmproxy.test import taddons

from tests.addons.test_addons import (
    KEY_ENV,
    RESPONSES_BODY,
    Proxy,
    config_file,
    post,
    proxy,
    sse_response,
)

__all__ = ["config_file", "proxy"]  # fixtures shared with test_addons

from llmitm.addons import make_addons
from llmitm.addons.state import METADATA_KEY
from llmitm.routing.plan import CREDENTIAL_HEADERS

SPELLINGS = {
    "authorization": "Bearer sk-client-auth",
    "api-key": "sk-client-azure",
    "x-api-key": "sk-client-x",
    "x-goog-api-key": "sk-client-goog",
}

FAILOVER = f"""
[endpoints.a]
kind = "compatible"
base_url = "http://127.0.0.1:9/v1"
apis = ["chat", "responses"]
api_key_env = "{KEY_ENV}"

[endpoints.b]
kind = "compatible"
base_url = "http://127.0.0.1:9/v1"
apis = ["chat", "responses"]
api_key_env = "{KEY_ENV}"

[[routes]]
models = ["gpt-*"]
endpoints = ["a", "b"]
"""


def with_client_keys() -> http.HTTPFlow:
    flow = post("/v1/responses", RESPONSES_BODY)
    for name, value in SPELLINGS.items():
        flow.request.headers[name] = value
    return flow


def test_every_client_spelling_is_stripped_on_the_direct_path(proxy: Proxy) -> None:
    flow = with_client_keys()
    proxy.router.request(flow)
    headers = flow.request.headers
    assert headers["authorization"] == "Bearer sk-local"
    assert not set(SPELLINGS) - {"authorization"} & set(map(str.lower, headers.keys()))
    assert "sk-client" not in repr(flow.get_state())


def test_the_plan_removes_every_spelling_it_knows() -> None:
    assert set(SPELLINGS) <= set(CREDENTIAL_HEADERS)


@pytest.fixture
def failover(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(KEY_ENV, "sk-local")
    path = tmp_path / "llmitm.toml"
    path.write_text(FAILOVER, encoding="utf-8")
    addons = make_addons()
    with taddons.context(*addons) as tctx:
        proxy = Proxy(tctx, addons)
        tctx.configure(proxy.settings, llmitm_config=str(path))
        yield proxy


async def test_a_relayed_flow_sends_no_client_spelling_and_keeps_none(failover: Proxy) -> None:
    relay = failover.router.relay
    assert relay is not None
    relay.running()
    await relay.ready()  # the relay listens, so the route is relayed
    try:
        flow = with_client_keys()
        failover.router.request(flow)
        job = flow.metadata[METADATA_KEY].routed.job
        assert job is not None
        for name in ("a", "b"):
            upstream = job.prepare(name)
            sent = {k.lower(): v for k, v in upstream.headers}
            assert sent["authorization"] == "Bearer sk-local"
            assert not (set(SPELLINGS) - {"authorization"}) & set(sent)
        flow.response = sse_response()
        failover.responses.responseheaders(flow)
        assert "sk-client" not in repr(flow.get_state())
        assert "sk-local" not in repr(flow.get_state())
    finally:
        relay.done()
