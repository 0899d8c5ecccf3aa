"""Both sides of a translated flow, as mitmproxy saves it (``-w``, what mitmweb's export and
``save_stream_file`` write): the flow's request is the client's own call again, the upstream's
request and answer are kept beside it, the llmitm content view shows all four from the loaded
file, neither the endpoint's key nor the client's reaches the file, and the console's
summary line names both paths."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest
from mitmproxy import contentviews, io
from mitmproxy.test import taddons

from llmitm.addons.contentview import LlmContentview
from llmitm.exchange.sides import SIDES_KEY, UpstreamSide

from .processes import fake_upstream, llmitm_proxy

pytestmark = pytest.mark.slow

ENDPOINT_KEY = "sk-endpoint-7f3a9c2e11d04b5a"
CLIENT_KEY = "sk-client-0c9d8e7f6a5b4c3d"
CONFIG = """
[endpoints.chat-only]
kind = "compatible"
base_url = "{url}/v1"
apis = ["chat"]
api_key_env = "LLMITM_TEST_SIDES_KEY"

[[routes]]
models = ["over-chat*"]
endpoints = ["chat-only"]
"""


def test_a_saved_translated_flow_keeps_both_sides(tmp_path: Path) -> None:
    saved = tmp_path / "flows.mitm"
    with (
        fake_upstream(tmp_path, "chat") as upstream,
        llmitm_proxy(
            tmp_path,
            config=CONFIG.format(url=upstream.url),
            # mitmdump keeps a streamed body only when told to (mitmweb does by itself).
            extra=["-w", str(saved), "--set", "store_streamed_bodies=true"],
            env={"LLMITM_TEST_SIDES_KEY": ENDPOINT_KEY},
        ) as proxy,
    ):
        client = openai.OpenAI(base_url=proxy.base_url(), api_key=CLIENT_KEY, max_retries=0)
        with client.responses.stream(model="over-chat", input="Say hello") as stream:
            assert stream.get_final_response().output_text == "Hello from the fake upstream."
        assert client.responses.create(model="over-chat", input="Again").output_text
        log = proxy.log_text()
    assert "Traceback" not in log, log
    # The console's summary line names the client's path and the upstream's.
    assert log.count(" responses→chat /v1/responses→/v1/chat/completions 200 ") == 2, log
    raw = saved.read_bytes()
    assert ENDPOINT_KEY.encode() not in raw and CLIENT_KEY.encode() not in raw

    with saved.open("rb") as file:
        flows = list(io.FlowReader(file).stream())
    assert [flow.request.path for flow in flows] == ["/v1/responses"] * 2
    sides = [UpstreamSide.from_state(flow.metadata.get(SIDES_KEY)) for flow in flows]
    for side in sides:
        assert side is not None and side.response is not None
        assert (side.client_api, side.upstream_api, side.endpoint) == (
            "responses",
            "chat",
            "chat-only",
        )
        assert side.request.url == f"{upstream.url}/v1/chat/completions"
        assert b'"messages"' in side.request.body and side.response.status == 200
    streamed, whole = sides
    assert streamed is not None and whole is not None
    assert b"chat.completion.chunk" in streamed.response.body  # the upstream's own stream
    assert b"data: [DONE]" in streamed.response.body
    assert b'"object":"chat.completion"' in whole.response.body.replace(b" ", b"")
    assert b"response.completed" in flows[0].response.content  # and the client's

    with taddons.context(LlmContentview()):
        request_view = contentviews.prettify_message(flows[0].request, flows[0])
        response_view = contentviews.prettify_message(flows[0].response, flows[0])
    assert request_view.view_name == response_view.view_name == "llmitm"
    request_text, response_text = request_view.text, response_view.text
    assert "client sent (Responses API) · POST http://127.0.0.1:9/v1/responses" in request_text
    assert f"sent upstream (Chat Completions) · POST {upstream.url}" in request_text
    assert "llmitm · Responses request" in request_text
    assert "llmitm · Chat Completions request" in request_text
    assert "upstream answered (Chat Completions) · 200 text/event-stream" in response_text
    assert "client got (Responses API) · 200 text/event-stream" in response_text
    assert response_text.count("Hello from the fake upstream.") == 2
