"""Both sides of a flow in mitmproxy's test harness: the client's request goes back on a flow
llmitm rewrote (credentials redacted) and stays untouched on one it did not, a planned flow
keeps the upstream's request and its streamed answer (bounded), the console's summary line
names both paths, and the content view shows both sides of a flow loaded from a saved file."""

from __future__ import annotations

import io
from dataclasses import replace

import orjson
import pytest
from mitmproxy import contentviews, http
from mitmproxy import io as mitmproxy_io
from mitmproxy.test import taddons, tflow, tutils
from rich.console import Console

from llmitm.addons.console import LlmConsole
from llmitm.addons.contentview import LlmContentview
from llmitm.addons.sides import LlmClientSide, LlmFlowSides, client_request
from llmitm.addons.state import METADATA_KEY, FlowState
from llmitm.exchange.sides import SIDES_KEY, UpstreamSide
from llmitm.exchange.stream import StreamRewriter
from llmitm.routing.config import Endpoint
from llmitm.routing.plan import plan_for_endpoint
from llmitm.translate.context import TranslationContext

KEY = "sk-client-5e4d3c2b1a09f8e7d6c5b4a3"
CLIENT_BODY = orjson.dumps({"model": "m", "input": "Say hello", "stream": True})
UPSTREAM_BODY = orjson.dumps(
    {"model": "m", "messages": [{"role": "user", "content": "Say hello"}], "stream": True}
)
ENDPOINT = Endpoint(
    name="local", kind="compatible", base_url="http://up/v1", apis=frozenset({"chat"})
)
CHUNK = (
    b'data: {"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n'
)


def client_flow() -> http.HTTPFlow:
    request = tutils.treq(method=b"POST", path="/v1/responses", content=CLIENT_BODY)
    request.headers["authorization"] = f"Bearer {KEY}"
    flow = tflow.tflow(req=request)
    flow.live = True
    return flow


def rewrite_upstream(flow: http.HTTPFlow) -> None:
    """What the router does to a translated call."""
    flow.request.url = "http://up/v1/chat/completions"
    flow.request.content = UPSTREAM_BODY
    flow.request.headers["authorization"] = "Bearer <redacted: $KEY>"
    flow.request.headers["api-key"] = "upstream"


def plan(flow: http.HTTPFlow) -> None:
    planned = plan_for_endpoint(ENDPOINT, "responses", "m")
    flow.metadata[METADATA_KEY] = FlowState(
        replace(planned, route="r"), TranslationContext(model="m"), client_stream=True
    )


def test_a_rewritten_flow_gets_the_clients_request_back_redacted() -> None:
    front, back = LlmClientSide(), LlmFlowSides()
    with taddons.context(front, back):
        flow = client_flow()
        front.request(flow)
        rewrite_upstream(flow)
        kept = client_request(flow)
        assert kept is not None and kept.path == "/v1/responses"
        flow.response = tutils.tresp()
        back.response(flow)
    assert flow.request.path == "/v1/responses" and flow.request.content == CLIENT_BODY
    assert flow.request.headers["authorization"] == "Bearer <redacted>"
    assert "api-key" not in flow.request.headers  # the router's headers stay upstream's
    assert SIDES_KEY not in flow.metadata  # not routed: nothing went upstream to show
    assert client_request(flow) is None


def test_an_untouched_flow_and_a_non_api_call_are_left_alone() -> None:
    front, back = LlmClientSide(), LlmFlowSides()
    with taddons.context(front, back):
        flow = client_flow()
        original = flow.request
        front.request(flow)
        flow.response = tutils.tresp()
        back.response(flow)
        assert flow.request is original and KEY in flow.request.headers["authorization"]
        other = tflow.tflow(req=tutils.treq(path="/telemetry"))
        front.request(other)
        assert client_request(other) is None


@pytest.mark.parametrize("keep_streams", [True, False])
def test_a_planned_stream_keeps_what_went_upstream_and_came_back(keep_streams: bool) -> None:
    front, back = LlmClientSide(), LlmFlowSides()
    with taddons.context(front, back):
        back.keep_streams = keep_streams  # True under mitmweb, or with flows saved to a file
        flow = client_flow()
        front.request(flow)
        plan(flow)
        rewrite_upstream(flow)
        flow.response = tutils.tresp(headers=http.Headers(content_type="text/event-stream"))
        flow.response.stream = rewriter = StreamRewriter()
        front.responseheaders(flow)
        back.responseheaders(flow)
        for _ in range(3):
            assert rewriter(CHUNK) == [CHUNK]  # relayed as without it
        rewriter(b"")
        flow.error = None
        back.error(flow)  # a stream that ends in an error keeps its sides too
    side = UpstreamSide.from_state(flow.metadata[SIDES_KEY])
    assert side is not None and side.response is not None
    assert (side.client_api, side.upstream_api, side.endpoint) == ("responses", "chat", "local")
    assert side.request.url == "http://up/v1/chat/completions"
    assert side.request.body == UPSTREAM_BODY
    assert side.response.status == 200 and side.response.kept is keep_streams
    assert side.response.body == (CHUNK * 3 if keep_streams else b"")
    assert flow.request.path == "/v1/responses"


def test_the_console_line_names_the_clients_path_and_the_upstreams() -> None:
    out = Console(file=io.StringIO(), record=True, width=200)
    front, console, back = LlmClientSide(), LlmConsole(out), LlmFlowSides()
    with taddons.context(front, console, back):
        console.running()
        flow = client_flow()
        front.request(flow)
        rewrite_upstream(flow)
        console.request(flow)
        flow.response = tutils.tresp()
        console.response(flow)
        back.response(flow)
        console.done()
    assert " /v1/responses→/v1/chat/completions 200 " in out.export_text()


def saved_and_loaded(flow: http.HTTPFlow) -> http.HTTPFlow:
    buffer = io.BytesIO()
    mitmproxy_io.FlowWriter(buffer).add(flow)
    buffer.seek(0)
    (loaded,) = mitmproxy_io.FlowReader(buffer).stream()
    assert isinstance(loaded, http.HTTPFlow)
    return loaded


def test_the_view_shows_both_sides_of_a_loaded_flow_and_falls_back_on_a_broken_one() -> None:
    front, back = LlmClientSide(), LlmFlowSides()
    with taddons.context(front, back, LlmContentview()):
        flow = client_flow()
        front.request(flow)
        plan(flow)
        rewrite_upstream(flow)
        answer = orjson.dumps({"object": "chat.completion", "choices": []})
        flow.response = http.Response.make(200, answer, {"content-type": "application/json"})
        front.responseheaders(flow)
        front.response(flow)
        back.response(flow)
        loaded = saved_and_loaded(flow)
        request = contentviews.prettify_message(loaded.request, loaded)
        response = contentviews.prettify_message(loaded.response, loaded)
        loaded.metadata[SIDES_KEY] = "from a future version"
        plain = contentviews.prettify_message(loaded.request, loaded)
    assert request.view_name == response.view_name == "llmitm"
    assert "client sent (Responses API) · POST" in request.text
    assert "sent upstream (Chat Completions) · POST http://up/v1/chat/completions" in request.text
    assert "upstream answered (Chat Completions) · 200 application/json from local" in response.text
    assert "client got (Responses API)" in response.text
    assert KEY not in request.text
    assert plain.view_name == "llmitm" and "client sent" not in plain.text
    assert "llmitm · Responses request" in plain.text
