"""A client's credential, in whatever header it comes, is not forwarded to an endpoint
whose key llmitm injects, and a flow file written with mitmproxy's ``-w`` keeps none."""

from __future__ import annotations

from pathlib import Path

import httpx2 as httpx
import openai
import pytest
from mitmproxy import io

from .processes import fake_upstream, llmitm_proxy

pytestmark = pytest.mark.slow

KEY_ENV = "LLMITM_E2E_ENDPOINT_KEY"
CONFIG = f"""
[endpoints.a]
kind = "compatible"
base_url = "{{a}}/v1"
apis = ["chat", "responses"]
api_key_env = "{KEY_ENV}"

[endpoints.b]
kind = "compatible"
base_url = "{{b}}/v1"
apis = ["chat", "responses"]
api_key_env = "{KEY_ENV}"

[[routes]]
models = ["relayed-*"]
endpoints = ["a", "b"]

[[routes]]
models = ["direct-*"]
endpoints = ["b"]
"""
CLIENT = {"x-api-key": "sk-client-x", "api-key": "sk-client-azure"}


def test_no_client_credential_goes_upstream_or_into_a_saved_flow(tmp_path: Path) -> None:
    saved = tmp_path / "flows.mitm"
    with (
        fake_upstream(tmp_path, name="a") as a,
        fake_upstream(tmp_path, name="b") as b,
        llmitm_proxy(
            tmp_path,
            config=CONFIG.format(a=a.url, b=b.url),
            extra=["-w", str(saved)],
            env={KEY_ENV: "sk-endpoint"},
        ) as proxy,
    ):
        client = openai.OpenAI(
            base_url=proxy.base_url(),
            api_key="sk-client-bearer",
            default_headers=CLIENT,
            max_retries=0,
            timeout=30,
        )
        for model in ("relayed-x", "direct-x"):
            answer = client.responses.create(model=model, input="Say hello")
            assert answer.output_text
            with client.responses.stream(model=model, input="Say hello") as stream:
                assert stream.get_final_response().output_text
        seen = httpx.get(f"{a.url}/_requests").json() + httpx.get(f"{b.url}/_requests").json()
    assert len(seen) == 4
    for request in seen:
        headers = {k.lower(): v for k, v in request["headers"].items()}
        assert headers["authorization"] == "Bearer sk-endpoint"
        assert "x-api-key" not in headers and "api-key" not in headers
    with saved.open("rb") as file:
        flows = list(io.FlowReader(file).stream())
    assert len(flows) == 4
    for flow in flows:
        state = repr(flow.get_state())
        assert "sk-client" not in state and "sk-endpoint" not in state, state
