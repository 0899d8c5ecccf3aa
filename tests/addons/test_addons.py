"""The mitmproxy shell: settings, router and response addons driven with mitmproxy's own test
helpers (taddons, tflow), on flows as mitmproxy would hand them over."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import orjson
import pytest
from mitmproxy import exceptions, http
from mitmproxy.addons.proxyserver import Proxyserver
from mitmproxy.test import taddons, tflow
from openai.types.responses import Response

from llmitm.addons import make_addons
from llmitm.addons.router import LlmRouter
from llmitm.addons.settings import LlmitmSettings
from llmitm.addons.state import METADATA_KEY, FlowState
from llmitm.addons.stream_translator import LlmStreamTranslator
from llmitm.exchange.stream import StreamRewriter
from tests.helpers.oracle import sdk_responses_stream

KEY_ENV = "LLMITM_TEST_LOCAL_KEY"
NOW = 1_750_000_000

CONFIG = f"""
[llmitm]
reasoning = "drop"

[endpoints.local]
kind = "compatible"
base_url = "http://127.0.0.1:11434/v1"
api_key_env = "{KEY_ENV}"

[[routes]]
models = ["gpt-*"]
endpoints = ["local"]
model = "qwen3:8b"
"""


@pytest.fixture
def config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(KEY_ENV, "sk-local")
    path = tmp_path / "llmitm.toml"
    path.write_text(CONFIG, encoding="utf-8")
    return path


class Proxy:
    """make_addons() inside a taddons context, with handles on the addons under test."""

    def __init__(self, tctx: taddons.context, addons: list[Any]) -> None:
        self.tctx = tctx
        self.settings = next(a for a in addons if isinstance(a, LlmitmSettings))
        self.router = next(a for a in addons if isinstance(a, LlmRouter))
        self.responses = next(a for a in addons if isinstance(a, LlmStreamTranslator))


@pytest.fixture
def proxy(config_file: Path):
    addons = make_addons()
    with taddons.context(*addons) as tctx:
        proxy = Proxy(tctx, addons)
        tctx.configure(proxy.settings, llmitm_config=str(config_file))
        yield proxy


def post(path: str, body: Any, *, host: str = "api.openai.com", **headers: str) -> http.HTTPFlow:
    flow = tflow.tflow()
    request = flow.request
    request.method = "POST"
    request.url = f"https://{host}{path}"
    request.headers.clear()
    request.headers["host"] = host
    request.headers["content-type"] = "application/json"
    request.headers["authorization"] = "Bearer sk-client"
    request.headers["accept-encoding"] = "gzip, deflate, br"
    for name, value in headers.items():
        request.headers[name.replace("_", "-")] = value
    request.content = body if isinstance(body, bytes) else orjson.dumps(body)
    return flow


RESPONSES_BODY = {
    "model": "gpt-5",
    "instructions": "be brief",
    "input": "Name three colours.",
    "stream": True,
}
CHAT_BODY = {
    "model": "gpt-4o",
    "messages": [{"role": "user", "content": "hi"}],
    "temperature": 0.5,
}


def state_of(flow: http.HTTPFlow) -> FlowState:
    state = flow.metadata[METADATA_KEY]
    assert isinstance(state, FlowState)
    return state


# --- request --------------------------------------------------------------------------------


def test_make_addons_composes_distinct_addons_in_dataflow_order() -> None:
    addons = make_addons()
    names = [addon.name for addon in addons]  # type: ignore[attr-defined]
    assert len(set(names)) == len(names)
    assert names.index("llmitm_settings") < names.index("llmitm_router")
    assert names.index("llmitm_router") < names.index("llmitm_stream_translator")


def test_responses_request_is_routed_and_translated_to_chat(proxy: Proxy) -> None:
    flow = post("/v1/responses", RESPONSES_BODY)
    proxy.router.request(flow)
    assert flow.response is None
    request = flow.request
    assert request.url == "http://127.0.0.1:11434/v1/chat/completions"
    assert request.host == "127.0.0.1" and request.port == 11434
    assert request.headers["host"] == "127.0.0.1:11434"
    assert request.headers["authorization"] == "Bearer sk-local"
    assert request.headers["accept-encoding"] == "identity"
    sent = orjson.loads(request.content or b"")
    assert sent["model"] == "qwen3:8b"
    assert sent["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "Name three colours."},
    ]
    assert sent["stream"] is True
    assert int(request.headers["content-length"]) == len(request.content or b"")
    state = state_of(flow)
    assert state.plan.label == "responses→chat"
    assert state.plan.endpoint.name == "local"
    assert state.client_stream is True
    assert state.streamed is False
    assert state.context.model == "gpt-5"
    assert state.context.options.reasoning == "drop"  # from the file


def test_chat_request_to_a_chat_endpoint_only_gets_the_alias(proxy: Proxy) -> None:
    flow = post("/v1/chat/completions", CHAT_BODY, api_key="azure-style-key")
    proxy.router.request(flow)
    assert flow.response is None
    assert flow.request.url == "http://127.0.0.1:11434/v1/chat/completions"
    assert flow.request.headers["authorization"] == "Bearer sk-local"
    assert "api-key" not in flow.request.headers  # every client credential is replaced
    assert flow.request.headers["accept-encoding"] == "identity"
    assert orjson.loads(flow.request.content or b"") == {**CHAT_BODY, "model": "qwen3:8b"}
    state = state_of(flow)
    assert state.plan.label == "chat→chat"
    assert state.client_stream is False


def test_gzip_request_body_is_read_and_sent_plain(proxy: Proxy) -> None:
    flow = post("/v1/chat/completions", b"")
    flow.request.headers["content-encoding"] = "gzip"
    flow.request.raw_content = gzip.compress(orjson.dumps(CHAT_BODY))
    proxy.router.request(flow)
    assert "content-encoding" not in flow.request.headers
    assert orjson.loads(flow.request.raw_content or b"")["model"] == "qwen3:8b"


def test_reasoning_option_overrides_the_file(proxy: Proxy) -> None:
    proxy.tctx.configure(proxy.settings, llmitm_reasoning="reasoning_content")
    flow = post("/v1/responses", RESPONSES_BODY)
    proxy.router.request(flow)
    assert state_of(flow).context.options.reasoning == "reasoning_content"


def test_without_routes_the_flow_is_untouched() -> None:
    addons = make_addons()
    with taddons.context(*addons) as tctx:
        settings = next(a for a in addons if isinstance(a, LlmitmSettings))
        router = next(a for a in addons if isinstance(a, LlmRouter))
        tctx.configure(settings, llmitm_config="")
        for path, body in (("/v1/responses", RESPONSES_BODY), ("/v1/chat/completions", b"{bad")):
            flow = post(path, body)
            before = flow.request.copy()
            router.request(flow)
            assert flow.response is None
            assert flow.request.url == before.url
            assert flow.request.headers == before.headers
            assert flow.request.raw_content == before.raw_content
            assert METADATA_KEY not in flow.metadata


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/v1/models", b""),
        ("POST", "/v1/models", b"{}"),
        ("POST", "/v1/embeddings", orjson.dumps({"model": "gpt-4o", "input": "x"})),
        ("GET", "/v1/responses/resp_1", b""),
        ("GET", "/v1/chat/completions", b""),
    ],
)
def test_other_calls_are_untouched(proxy: Proxy, method: str, path: str, body: bytes) -> None:
    flow = post(path, body)
    flow.request.method = method
    before = flow.request.copy()
    proxy.router.request(flow)
    assert flow.response is None
    assert flow.request.url == before.url
    assert flow.request.headers == before.headers
    assert METADATA_KEY not in flow.metadata


def test_a_model_no_route_matches_passes_untouched(proxy: Proxy) -> None:
    flow = post("/v1/chat/completions", {**CHAT_BODY, "model": "claude-3"})
    proxy.router.request(flow)
    assert flow.response is None
    assert flow.request.url == "https://api.openai.com/v1/chat/completions"
    assert flow.request.headers["authorization"] == "Bearer sk-client"
    assert METADATA_KEY not in flow.metadata


def test_a_flow_already_answered_or_not_live_is_left_alone(proxy: Proxy) -> None:
    answered = post("/v1/responses", RESPONSES_BODY)
    answered.response = http.Response.make(200, b"{}")
    proxy.router.request(answered)
    assert answered.request.host == "api.openai.com"
    dead = post("/v1/responses", RESPONSES_BODY)
    dead.live = False
    proxy.router.request(dead)
    assert dead.request.host == "api.openai.com"
    assert METADATA_KEY not in dead.metadata


@pytest.mark.parametrize(
    ("path", "body", "code"),
    [
        ("/v1/responses", b"{not json", "invalid_json"),
        ("/v1/chat/completions", b"", "invalid_json"),
        ("/v1/chat/completions", b"[1]", "invalid_json"),
        ("/v1/responses", orjson.dumps({"input": "hi"}), "missing_required_parameter"),
        (
            "/v1/chat/completions",
            orjson.dumps({"model": 3, "messages": []}),
            "missing_required_parameter",
        ),
    ],
)
def test_unreadable_requests_get_a_local_400(
    proxy: Proxy, path: str, body: bytes, code: str
) -> None:
    flow = post(path, body)
    proxy.router.request(flow)
    response = flow.response
    assert response is not None
    assert response.status_code == 400
    assert response.headers["content-type"] == "application/json"
    assert response.headers["x-should-retry"] == "false"
    error = orjson.loads(response.content or b"")["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert error["code"] == code
    # Not forwarded, not rewritten.
    assert flow.request.url == f"https://api.openai.com{path}"
    assert flow.request.headers["authorization"] == "Bearer sk-client"
    assert METADATA_KEY not in flow.metadata


def test_a_strict_refusal_is_a_local_400(proxy: Proxy) -> None:
    proxy.tctx.configure(proxy.settings, llmitm_strict=True)
    flow = post("/v1/responses", {**RESPONSES_BODY, "tools": [{"type": "web_search"}]})
    proxy.router.request(flow)
    assert flow.response is not None
    assert flow.response.status_code == 400
    assert orjson.loads(flow.response.content or b"")["error"]["param"] == "tools"


# --- configure ------------------------------------------------------------------------------


def test_a_bad_config_file_is_an_options_error_naming_file_and_key(
    proxy: Proxy, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[endpoints.az]\nkind = "azure"\nbase_url = "https://r"\napi_version = 1\n')
    with pytest.raises(exceptions.OptionsError) as info:
        proxy.tctx.configure(proxy.settings, llmitm_config=str(bad))
    message = str(info.value)
    assert str(bad) in message
    assert "endpoints.az.api_version" in message
    assert "expected a non-empty string" in message
    # The working configuration stays in force.
    assert proxy.settings.config.endpoints.keys() == {"local"}


def test_a_missing_config_file_is_an_options_error(proxy: Proxy, tmp_path: Path) -> None:
    missing = tmp_path / "missing.toml"
    with pytest.raises(exceptions.OptionsError, match="does not exist") as info:
        proxy.tctx.configure(proxy.settings, llmitm_config=str(missing))
    assert str(missing) in str(info.value)


def test_a_missing_key_variable_is_an_options_error(
    proxy: Proxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(KEY_ENV)
    with pytest.raises(exceptions.OptionsError) as info:
        # Any llmitm option change re-reads the file, and the key with it.
        proxy.tctx.configure(proxy.settings, llmitm_strict=True)
    assert "endpoints.local.api_key_env" in str(info.value)
    assert KEY_ENV in str(info.value)


# --- responseheaders ------------------------------------------------------------------------


def chat_chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    chunk = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": NOW,
        "model": "qwen3:8b",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
    }
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


CHAT_SSE = b"".join(
    [
        chat_chunk({"role": "assistant", "content": ""}),
        chat_chunk({"content": "Red, gre"}),
        chat_chunk({"content": "en and blue €"}),
        chat_chunk({}, "stop"),
        b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1750000000,'
        b'"model":"qwen3:8b","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":6,'
        b'"total_tokens":15}}\n\n',
        b"data: [DONE]\n\n",
    ]
)


def sse_response(**headers: str) -> http.Response:
    """Response headers as they arrive in responseheaders (the body is still to come)."""
    response = http.Response.make(200, b"", {"content-type": "text/event-stream; charset=utf-8"})
    response.headers["content-length"] = "123"
    for name, value in headers.items():
        response.headers[name.replace("_", "-")] = value
    return response


def routed(proxy: Proxy, path: str = "/v1/responses", body: Any = RESPONSES_BODY) -> http.HTTPFlow:
    flow = post(path, body)
    proxy.router.request(flow)
    assert METADATA_KEY in flow.metadata
    return flow


def test_translated_sse_gets_a_stream_rewriter_and_chunked_framing(proxy: Proxy) -> None:
    flow = routed(proxy)
    flow.response = sse_response()
    proxy.responses.responseheaders(flow)
    response = flow.response
    assert isinstance(response.stream, StreamRewriter)
    assert "content-length" not in response.headers
    assert response.headers["transfer-encoding"] == "chunked"
    assert response.headers["x-llmitm-endpoint"] == "local"
    assert "x-llmitm-translation" not in response.headers  # per-chunk cost; see responses.py
    assert state_of(flow).plan.label == "responses→chat"
    assert state_of(flow).streamed is True

    stream = response.stream
    pieces = [CHAT_SSE[i : i + 11] for i in range(0, len(CHAT_SSE), 11)]
    returned = [stream(piece) for piece in pieces] + [stream(b"")]
    assert all(isinstance(value, list) and all(value) for value in returned)
    body = b"".join(b"".join(value) for value in returned)
    events, final = sdk_responses_stream(body)
    assert events[0].type == "response.created"
    assert events[-1].type == "response.completed"
    assert final.output_text == "Red, green and blue €"
    assert final.model == "gpt-5"
    assert final.usage is not None and final.usage.total_tokens == 15


def test_http2_clients_get_no_transfer_encoding(proxy: Proxy) -> None:
    flow = routed(proxy)
    flow.request.http_version = "HTTP/2.0"
    flow.response = sse_response()
    proxy.responses.responseheaders(flow)
    assert isinstance(flow.response.stream, StreamRewriter)
    assert "transfer-encoding" not in flow.response.headers
    assert "content-length" not in flow.response.headers


def test_a_gzip_stream_is_decoded_and_its_encoding_dropped(proxy: Proxy) -> None:
    flow = routed(proxy)
    flow.response = sse_response(content_encoding="gzip")
    proxy.responses.responseheaders(flow)
    stream = flow.response.stream
    assert isinstance(stream, StreamRewriter)
    assert "content-encoding" not in flow.response.headers
    packed = gzip.compress(CHAT_SSE)
    body = b"".join(b"".join(stream(piece)) for piece in (packed[:20], packed[20:], b""))
    _events, final = sdk_responses_stream(body)
    assert final.output_text == "Red, green and blue €"


def test_sse_of_a_flow_llmitm_did_not_plan_is_streamed_as_is(proxy: Proxy) -> None:
    flow = post("/v1/chat/completions", {**CHAT_BODY, "model": "claude-3"})
    proxy.router.request(flow)
    flow.response = sse_response()
    proxy.responses.responseheaders(flow)
    assert flow.response.stream is True
    assert flow.response.headers["content-length"] == "123"
    assert "x-llmitm-endpoint" not in flow.response.headers


def test_json_of_a_flow_llmitm_did_not_plan_is_not_streamed(proxy: Proxy) -> None:
    flow = post("/v1/models", b"")
    flow.response = http.Response.make(200, b"{}", {"content-type": "application/json"})
    proxy.responses.responseheaders(flow)
    assert flow.response.stream is False


@pytest.mark.parametrize(
    ("status", "content_type"), [(429, "text/event-stream"), (200, "application/json")]
)
def test_errors_and_json_of_planned_flows_are_buffered(
    proxy: Proxy, status: int, content_type: str
) -> None:
    flow = routed(proxy)
    flow.response = http.Response.make(status, b"", {"content-type": content_type})
    proxy.responses.responseheaders(flow)
    assert flow.response.stream is False
    assert state_of(flow).streamed is False
    assert flow.response.headers["x-llmitm-endpoint"] == "local"


# --- response -------------------------------------------------------------------------------


CHAT_COMPLETION = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": NOW,
    "model": "qwen3:8b",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Red, green and blue."},
            "finish_reason": "stop",
            "logprobs": None,
        }
    ],
    "usage": {"prompt_tokens": 9, "completion_tokens": 6, "total_tokens": 15},
}


def test_a_non_streamed_chat_completion_becomes_a_response(proxy: Proxy) -> None:
    flow = routed(proxy, body={**RESPONSES_BODY, "stream": False})
    flow.response = http.Response.make(
        200, gzip.compress(orjson.dumps(CHAT_COMPLETION)), {"content-type": "application/json"}
    )
    flow.response.headers["content-encoding"] = "gzip"
    proxy.responses.responseheaders(flow)
    proxy.responses.response(flow)
    response = flow.response
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert "content-encoding" not in response.headers
    assert int(response.headers["content-length"]) == len(response.raw_content or b"")
    translated = Response.model_validate(orjson.loads(response.content or b""))
    assert translated.object == "response"
    assert translated.status == "completed"
    assert translated.model == "gpt-5"
    assert translated.output_text == "Red, green and blue."
    assert translated.instructions == "be brief"


def test_an_upstream_429_becomes_an_openai_error_with_its_status(proxy: Proxy) -> None:
    flow = routed(proxy)
    flow.response = http.Response.make(
        429, b'{"error":{"code":429,"message":"Too many requests","type":"unavailable_error"}}'
    )
    flow.response.headers["retry-after"] = "2"
    proxy.responses.responseheaders(flow)
    proxy.responses.response(flow)
    response = flow.response
    assert response.status_code == 429
    assert response.headers["content-type"] == "application/json"
    assert response.headers["retry-after"] == "2"
    error = orjson.loads(response.content or b"")["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"] == "Too many requests"
    assert error["code"] == "rate_limit_exceeded"


def test_a_streamed_flow_is_not_translated_again(proxy: Proxy) -> None:
    flow = routed(proxy)
    flow.response = sse_response()
    proxy.responses.responseheaders(flow)
    flow.response.content = b"already streamed"
    proxy.responses.response(flow)
    assert flow.response.content == b"already streamed"


def test_responses_of_flows_llmitm_did_not_plan_are_untouched(proxy: Proxy) -> None:
    flow = post("/v1/models", b"")
    flow.response = http.Response.make(500, b"<html>oops</html>", {"content-type": "text/html"})
    proxy.responses.responseheaders(flow)
    proxy.responses.response(flow)
    assert flow.response.status_code == 500
    assert flow.response.content == b"<html>oops</html>"


def test_eager_connections_are_turned_lazy() -> None:
    addons = make_addons()
    with taddons.context(Proxyserver(), *addons) as tctx:
        settings = next(a for a in addons if isinstance(a, LlmitmSettings))
        tctx.configure(settings, connection_strategy="eager")
        assert tctx.options.connection_strategy == "lazy"


def test_the_injected_key_is_redacted_from_the_flow_once_sent(proxy: Proxy) -> None:
    """mitmdump's output, mitmweb and saved flows show the flow's request after the fact:
    the endpoint's key must not be there."""
    flow = routed(proxy)
    assert flow.request.headers["authorization"] == "Bearer sk-local"  # what goes upstream
    flow.response = sse_response()
    proxy.responses.responseheaders(flow)
    assert flow.request.headers["authorization"] == f"<redacted: ${KEY_ENV}>"
    assert "sk-local" not in repr(flow.get_state())


def test_the_injected_key_is_redacted_when_the_upstream_fails(proxy: Proxy) -> None:
    flow = routed(proxy)
    proxy.responses.error(flow)
    assert "sk-local" not in repr(flow.get_state())


def test_the_stream_idle_option_overrides_the_file_and_0_gives_it_back(
    proxy: Proxy,
) -> None:
    configured = proxy.settings.config.routing.stream_idle_timeout
    proxy.tctx.configure(proxy.settings, llmitm_stream_idle_timeout=3)
    assert proxy.settings.config.routing.stream_idle_timeout == 3
    assert all(r.stream_idle_timeout is None for r in proxy.settings.config.routes)
    proxy.tctx.configure(proxy.settings, llmitm_stream_idle_timeout=0)
    assert proxy.settings.config.routing.stream_idle_timeout == configured
