"""The compaction addon's own decisions on flows as mitmproxy hands them over: which endpoints
compact natively, and where a native route's compact call goes (OpenAI and both Azure forms),
with the endpoint's credentials and deployment."""

from __future__ import annotations

import orjson
import pytest
from mitmproxy.test import tflow

from llmitm.addons.compaction import _to_native, is_native
from llmitm.routing.config import Endpoint


def endpoint(kind: str, apis: tuple[str, ...] = ("responses",), **more: object) -> Endpoint:
    return Endpoint(
        name="e",
        kind=kind,  # type: ignore[arg-type]
        base_url="https://upstream.example" + ("/v1" if kind != "azure" else ""),
        apis=frozenset(apis),  # type: ignore[arg-type]
        **more,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("kind", "apis", "native"),
    [
        ("openai", ("responses",), True),
        ("azure", ("chat", "responses"), True),
        ("openai", ("chat",), False),
        ("compatible", ("responses",), False),  # llama.cpp's Responses API has no compact
        ("compatible", ("chat",), False),
    ],
)
def test_only_openai_and_azure_responses_endpoints_compact_natively(
    kind: str, apis: tuple[str, ...], native: bool
) -> None:
    assert is_native(endpoint(kind, apis)) is native


@pytest.mark.parametrize(
    ("target", "url", "model"),
    [
        (endpoint("openai"), "https://upstream.example/v1/responses/compact", "gpt-5"),
        (
            endpoint("azure", deployments={"gpt-5": "prod-gpt5"}),
            "https://upstream.example/openai/v1/responses/compact",
            "prod-gpt5",
        ),
        (
            endpoint("azure", api_version="2025-04-01-preview"),
            "https://upstream.example/openai/responses/compact?api-version=2025-04-01-preview",
            "gpt-5",
        ),
    ],
)
def test_a_native_routes_compact_call_goes_to_its_endpoints_compact_path(
    target: Endpoint, url: str, model: str
) -> None:
    keyed = Endpoint(**{**_fields(target), "api_key": "sk-endpoint", "api_key_env": "K"})
    flow = tflow.tflow()
    flow.request.method = "POST"
    flow.request.url = "https://api.openai.com/v1/responses/compact"
    flow.request.headers["authorization"] = "Bearer sk-client"
    body = {"model": "gpt-5", "input": [{"role": "user", "content": "hi"}]}
    flow.request.content = orjson.dumps(body)

    _to_native(flow, body, keyed, None)

    assert flow.request.url == url
    assert flow.request.headers["authorization"] == "Bearer sk-endpoint"
    sent = orjson.loads(flow.request.content or b"")
    assert sent == {**body, "model": model}


def _fields(value: Endpoint) -> dict[str, object]:
    return {name: getattr(value, name) for name in Endpoint.__dataclass_fields__}
