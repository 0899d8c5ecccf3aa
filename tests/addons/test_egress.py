"""The egress policy (``llmitm_egress`` / ``[llmitm] egress``): under ``local`` every request
that is not a routed LLM call is answered by llmitm — telemetry with an empty success, the rest
with an OpenAI-shaped 403 (a 426 for an LLM WebSocket nothing serves) — and raw streams are
closed; under ``pass`` (the default) nothing changes. Run through ``make_addons()`` in
mitmproxy's test context, in the order mitmproxy calls them."""

from __future__ import annotations

import inspect
import logging
import string
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from mitmproxy import http
from mitmproxy.proxy.server_hooks import ServerConnectionHookData
from mitmproxy.test import taddons, tflow

from llmitm.addons import make_addons
from llmitm.addons.egress import LlmEgress, LlmEgressGuard
from llmitm.addons.record import Capture
from llmitm.addons.record import flows as record
from llmitm.addons.settings import LlmitmSettings
from llmitm.addons.state import METADATA_KEY, FlowState
from llmitm.relay.server import RelayServer
from llmitm.replay.keys import match_key
from llmitm.replay.model import Message
from llmitm.replay.pool import Hit
from llmitm.routing.config import ConfigError, parse_config
from llmitm.routing.egress import local_answer, telemetry_kind
from llmitm.store.folder import read_folder
from llmitm.wire.paths import is_llm_call

ROOT = Path(__file__).resolve().parents[2]
KEY_ENV = "LLMITM_TEST_EGRESS_KEY"
CONFIG = f"""
[llmitm]
{{egress}}

[endpoints.local]
kind = "compatible"
base_url = "http://127.0.0.1:11434/v1"
apis = ["chat"]
api_key_env = "{KEY_ENV}"

[[routes]]
models = ["gpt-*"]
endpoints = ["local"]
"""
CHAT = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}


class Chain:
    """make_addons() in a test context; ``send`` runs a flow's request hooks in order."""

    def __init__(self, tctx: taddons.context, addons: list[Any]) -> None:
        self.tctx = tctx
        self.addons = addons
        self.settings = next(a for a in addons if isinstance(a, LlmitmSettings))
        self.egress = next(a for a in addons if isinstance(a, LlmEgress))

    async def send(self, flow: http.HTTPFlow) -> http.HTTPFlow:
        for addon in self.addons:
            hook = getattr(addon, "request", None)
            if hook is not None:
                result = hook(flow)
                if inspect.isawaitable(result):
                    await result
        return flow


def chain_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, egress: str, **options: Any):
    monkeypatch.setenv(KEY_ENV, "sk-local")
    path = tmp_path / "llmitm.toml"
    path.write_text(CONFIG.format(egress=egress), encoding="utf-8")
    addons = make_addons()
    tctx = taddons.context(*addons)
    tctx.__enter__()
    chain = Chain(tctx, addons)
    tctx.configure(chain.settings, llmitm_config=str(path), llmitm_store="", **options)
    return chain


@pytest.fixture
def local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    chain = chain_for(tmp_path, monkeypatch, 'egress = "local"')
    yield chain
    chain.tctx.__exit__(None, None, None)


@pytest.fixture
def passing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    chain = chain_for(tmp_path, monkeypatch, "")
    yield chain
    chain.tctx.__exit__(None, None, None)


def request(method: str, url: str, body: Any = b"", **headers: str) -> http.HTTPFlow:
    flow = tflow.tflow()
    flow.request.method = method
    flow.request.url = url
    flow.request.headers.clear()
    flow.request.headers["host"] = flow.request.pretty_host
    flow.request.headers["authorization"] = "Bearer sk-client"
    if not isinstance(body, bytes):
        flow.request.headers["content-type"] = "application/json"
    for name, value in headers.items():
        flow.request.headers[name.replace("_", "-")] = value
    flow.request.content = body if isinstance(body, bytes) else orjson.dumps(body)
    return flow


def error_of(flow: http.HTTPFlow) -> dict[str, Any]:
    assert flow.response is not None
    assert flow.response.headers["content-type"] == "application/json"
    return orjson.loads(flow.response.content)["error"]


OTLP = "https://ab.chatgpt.com/otlp/v1/metrics"
PLUGINS = "https://api.github.com/repos/openai/plugins"
TRACES = "https://api.openai.com/v1/traces/ingest"


async def test_otlp_exports_get_an_empty_success_in_their_encoding(local: Chain) -> None:
    flow = await local.send(
        request("POST", OTLP, b"\x0a\x00" * 100, content_type="application/x-protobuf")
    )
    assert flow.response is not None
    assert flow.response.status_code == 200
    assert flow.response.headers["content-type"] == "application/x-protobuf"
    assert flow.response.content == b""
    flow = await local.send(
        request("POST", OTLP, {"resourceMetrics": []}, content_type="application/json")
    )
    assert flow.response is not None
    assert (flow.response.status_code, flow.response.content) == (200, b"{}")


async def test_an_agents_trace_upload_gets_no_content(local: Chain) -> None:
    flow = await local.send(request("POST", TRACES, {"data": []}, content_type="application/json"))
    assert flow.response is not None
    assert flow.response.status_code == 204
    assert flow.response.headers["x-llmitm-egress"] == "local"


async def test_anything_else_gets_a_403_naming_the_policy_and_the_way_out(local: Chain) -> None:
    flow = await local.send(request("GET", PLUGINS))
    assert flow.response is not None and flow.response.status_code == 403
    assert flow.response.headers["x-should-retry"] == "false"
    error = error_of(flow)
    assert error["type"] == "permission_error" and error["code"] == "egress_refused"
    assert "GET api.github.com/repos/openai/plugins" in error["message"]
    assert "llmitm_egress=pass" in error["message"] and 'egress = "pass"' in error["message"]


async def test_a_routed_llm_call_goes_to_its_endpoint(local: Chain) -> None:
    flow = await local.send(request("POST", "https://api.openai.com/v1/chat/completions", CHAT))
    assert flow.response is None
    assert flow.request.pretty_url == "http://127.0.0.1:11434/v1/chat/completions"
    state = flow.metadata[METADATA_KEY]
    assert isinstance(state, FlowState) and state.routed is not None


async def test_an_llm_call_no_route_matches_is_refused_not_sent(local: Chain) -> None:
    body = {**CHAT, "model": "claude-3"}
    flow = await local.send(request("POST", "https://api.openai.com/v1/chat/completions", body))
    assert flow.response is not None and flow.response.status_code == 403
    assert "no route matches" in error_of(flow)["message"]
    assert flow.request.pretty_host == "api.openai.com"


async def test_a_state_call_llmitm_answers_keeps_its_own_answer(local: Chain) -> None:
    flow = await local.send(request("GET", "https://api.openai.com/v1/responses/resp_abc"))
    assert flow.response is not None
    # Not stored here and owned by no configured endpoint: the local Responses API's 404.
    assert flow.response.status_code == 404
    assert "x-llmitm-egress" not in flow.response.headers


async def test_websockets_nothing_serves_are_refused_with_an_http_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # llmitm serves Responses sockets itself unless told to pass them (then nothing would).
    local = chain_for(tmp_path, monkeypatch, 'egress = "local"', llmitm_websocket="pass")
    upgrade = {"upgrade": "websocket", "connection": "Upgrade", "sec_websocket_version": "13"}
    flow = await local.send(request("GET", "https://api.openai.com/v1/responses", **upgrade))
    assert flow.response is not None and flow.response.status_code == 426
    assert error_of(flow)["code"] == "egress_websocket_refused"
    flow = await local.send(request("GET", "https://chatgpt.com/backend-api/socket", **upgrade))
    assert flow.response is not None and flow.response.status_code == 403
    local.tctx.__exit__(None, None, None)


async def test_llmitms_own_status_route_still_answers(local: Chain) -> None:
    flow = request("GET", "http://127.0.0.1:8080/_llmitm/status")
    flow.client_conn.sockname = ("127.0.0.1", 8080)  # asked of llmitm's own listener
    flow = await local.send(flow)
    assert flow.response is not None and flow.response.status_code == 200
    assert "local" in orjson.loads(flow.response.content)["endpoints"]


def connecting_to(host: str, port: int) -> ServerConnectionHookData:
    server = tflow.tserver_conn()
    server.address = (host, port)
    return ServerConnectionHookData(server=server, client=tflow.tclient_conn())


async def test_only_configured_endpoints_are_ever_dialled(local: Chain) -> None:
    # What no hook answered — a raw TCP or UDP stream, a tunnel ignore_hosts passes through.
    for host, port in (("ab.chatgpt.com", 443), ("127.0.0.1", 11435), ("api.github.com", 443)):
        data = connecting_to(host, port)
        local.egress.server_connect(data)
        assert data.server.error is not None and "not a configured endpoint" in data.server.error
    endpoint = connecting_to("127.0.0.1", 11434)  # endpoints.local
    local.egress.server_connect(endpoint)
    assert endpoint.server.error is None


async def test_llmitms_relay_is_dialled_too(local: Chain) -> None:
    server = RelayServer()
    await server.start()
    local.egress.relay.server = server
    try:
        data = connecting_to("127.0.0.1", server.port)
        local.egress.server_connect(data)
        assert data.server.error is None
    finally:
        local.egress.relay.server = None
        server.close()


async def test_the_default_passes_everything_through_unchanged(passing: Chain) -> None:
    for flow in (request("POST", OTLP, b"x"), request("GET", PLUGINS), request("POST", TRACES)):
        url = flow.request.pretty_url
        await passing.send(flow)
        assert flow.response is None and flow.request.pretty_url == url
    data = connecting_to("ab.chatgpt.com", 443)
    passing.egress.server_connect(data)
    assert data.server.error is None


async def test_the_option_overrides_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    chain = chain_for(tmp_path, monkeypatch, 'egress = "local"', llmitm_egress="pass")
    try:
        assert (await chain.send(request("GET", PLUGINS))).response is None
        chain.tctx.configure(chain.egress, llmitm_egress="local")
        assert (await chain.send(request("GET", PLUGINS))).response is not None
    finally:
        chain.tctx.__exit__(None, None, None)


async def test_start_up_says_which_policy_is_on(
    local: Chain, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="llmitm.addons.egress"):
        local.egress.running()
    assert "egress: local" in caplog.text


def test_a_bad_policy_in_the_file_names_the_key() -> None:
    with pytest.raises(ConfigError, match=r"f\.toml: llmitm\.egress: expected one of pass, local"):
        parse_config({"llmitm": {"egress": "offline"}}, "f.toml", {})


@pytest.mark.parametrize(
    ("method", "path", "kind"),
    [
        ("POST", "/otlp/v1/metrics", "otlp"),
        ("POST", "/v1/traces", "otlp"),
        ("POST", "/v1/logs?x=1", "otlp"),
        ("POST", "/v1/traces/ingest", "openai-traces"),
        ("GET", "/v1/traces/ingest", None),
        ("POST", "/v1/responses", None),
        ("POST", "/v1/metrics/extra", None),
    ],
)
def test_telemetry_is_told_by_method_and_path(method: str, path: str, kind: str | None) -> None:
    assert telemetry_kind(method, path) == kind


def test_a_refusal_is_openais_error_shape() -> None:
    answer = local_answer("DELETE", "example.com", "/things/1?secret=no", {})
    body = orjson.loads(answer.body)
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert "secret" not in body["error"]["message"]  # the query stays out of the message


async def test_a_replay_hit_the_recorder_serves_later_is_left_to_it(local: Chain) -> None:
    """A hit served from the recorded upstream response is answered after the router (by
    LlmRecordTap), also when no route matches: the guard must not refuse it first."""
    interaction = read_folder(ROOT / "recordings")[0]
    flow = request("POST", "https://api.openai.com/v1/chat/completions", {**CHAT, "model": "x"})
    key = match_key("POST", "/v1/chat/completions", [], flow.request.content)
    capture = Capture("global", key, Message(), 0, hit=Hit(interaction, 1, 1))
    guard = next(a for a in local.addons if isinstance(a, LlmEgressGuard))
    record._CAPTURES[flow] = capture
    guard.request(flow)
    assert flow.response is None
    del record._CAPTURES[flow]
    guard.request(flow)  # the same flow as a miss: refused
    assert flow.response is not None and flow.response.status_code == 403


async def test_other_calls_to_a_configured_endpoint_pass_but_its_telemetry_does_not(
    local: Chain,
) -> None:
    models = await local.send(request("GET", "http://127.0.0.1:11434/v1/models"))
    assert models.response is None  # the llama.cpp server's own model list
    traces = await local.send(request("POST", "http://127.0.0.1:11434/v1/traces", b"x"))
    assert traces.response is not None and traces.response.status_code == 200
    assert traces.response.headers["x-llmitm-egress"] == "local"
    body = {**CHAT, "model": "claude-3"}  # an LLM call there that no route matches
    unrouted = await local.send(request("POST", "http://127.0.0.1:11434/v1/chat/completions", body))
    assert unrouted.response is not None and unrouted.response.status_code == 403


PREFIX = st.lists(
    st.text(alphabet=string.ascii_letters + string.digits + "-_.", min_size=1, max_size=8),
    max_size=4,
).map(lambda parts: "".join(f"/{part}" for part in parts))


@given(prefix=PREFIX, suffix=st.sampled_from(["/otlp/v1/metrics", "/v1/traces", "/v1/logs"]))
def test_otlp_paths_under_any_mount_point_are_telemetry_not_llm_calls(
    prefix: str, suffix: str
) -> None:
    assert telemetry_kind("POST", prefix + suffix) == "otlp"
    assert not is_llm_call(prefix + suffix)


@given(prefix=PREFIX, call=st.sampled_from(["/chat/completions", "/responses", "/responses/r1"]))
def test_llm_calls_under_any_mount_point_are_never_telemetry(prefix: str, call: str) -> None:
    assert is_llm_call(prefix + "/v1" + call)
    assert telemetry_kind("POST", prefix + "/v1" + call) is None


@given(
    method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH"]),
    host=st.text(max_size=20),
    route=st.text(max_size=60).map(lambda text: "/" + text.replace("?", "")),
    query=st.booleans(),
    content_type=st.text(max_size=30),
    upgrade=st.sampled_from(["", "websocket", "h2c"]),
)
def test_every_local_answer_is_well_formed(
    method: str, host: str, route: str, query: bool, content_type: str, upgrade: str
) -> None:
    path = route + ("?key=QUERYSECRET" if query else "")
    answer = local_answer(method, host, path, {"content-type": content_type, "upgrade": upgrade})
    assert answer.status in (200, 204, 403, 426)
    assert ("x-llmitm-egress", "local") in answer.headers
    if answer.status >= 400:
        error = orjson.loads(answer.body)["error"]
        assert error["type"] == "permission_error" and route in error["message"]
        assert "QUERYSECRET" not in error["message"]  # a query may hold a key: never echoed
