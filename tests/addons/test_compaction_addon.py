"""The compaction addons' own decisions on flows as mitmproxy hands them over: where they sit
in the chain, which endpoints compact natively, where a native route's compact call goes
(OpenAI and both Azure forms, with the endpoint's credentials and deployment), and that a call
no route takes is left alone."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from mitmproxy import http
from mitmproxy.test import taddons, tflow

from llmitm.addons import make_addons
from llmitm.addons.compaction import LlmCompaction, _to_native, is_native
from llmitm.addons.settings import LlmitmSettings
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


def test_the_addons_sit_where_the_flow_needs_them() -> None:
    """After the local Responses API (chains inlined, sealed items opened) and before the
    router plans; the answer after the translator made the Response and before the Responses
    recorder stores it and the record tap records what the client got."""
    names = [addon.name for addon in make_addons()]  # type: ignore[attr-defined]
    assert (
        names.index("llmitm_responses_api")
        < names.index("llmitm_compaction")
        < names.index("llmitm_router")
    )
    assert (
        names.index("llmitm_stream_translator")
        < names.index("llmitm_compaction_answer")
        < names.index("llmitm_responses_state")
        < names.index("llmitm_record_tap")
    )


COMPACT = {"model": "gpt-5", "input": [{"role": "user", "content": "hi"}]}


def compact_flow(host: str = "api.openai.com") -> http.HTTPFlow:
    flow = tflow.tflow()
    flow.request.method = "POST"
    flow.request.url = f"https://{host}/v1/responses/compact"
    flow.request.content = orjson.dumps(COMPACT)
    return flow


@pytest.mark.parametrize(
    ("config", "host"),
    [
        (None, "api.openai.com"),  # the embedded default: nothing is routed
        ('[[routes]]\nmodels = ["gpt-*"]\nhosts = ["example.org"]\nendpoints = ["local"]\n', ""),
    ],
)
async def test_a_compact_call_no_route_takes_passes_untouched(
    tmp_path: Path, config: str | None, host: str
) -> None:
    addons = make_addons()
    compaction = next(a for a in addons if isinstance(a, LlmCompaction))
    settings = next(a for a in addons if isinstance(a, LlmitmSettings))
    with taddons.context(*addons) as tctx:
        if config is not None:
            path = tmp_path / "llmitm.toml"
            endpoint = (
                '[endpoints.local]\nkind = "compatible"\nbase_url = "http://127.0.0.1:1/v1"\n'
            )
            path.write_text(endpoint + config)
            tctx.configure(settings, llmitm_config=str(path))
        flow = compact_flow(host or "api.openai.com")
        pending = compaction.request(flow)
        if config is None:
            assert pending is None  # decided without a coroutine
        elif pending is not None:
            await pending
    assert flow.response is None
    assert flow.request.url == "https://api.openai.com/v1/responses/compact"
    assert orjson.loads(flow.request.content or b"") == COMPACT
    assert "llmitm_compaction" not in flow.metadata
