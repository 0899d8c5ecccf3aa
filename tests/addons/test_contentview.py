"""The llmitm content view through mitmproxy's content view API, on the real fixtures of both
APIs: "auto" picks it for LLM bodies, it shows the assembled conversation, and bad input
never raises into mitmproxy."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from mitmproxy import contentviews, http
from mitmproxy.addons.proxyserver import Proxyserver
from mitmproxy.addons.view import View
from mitmproxy.test import taddons, tflow

from llmitm.addons.contentview import LlmContentview
from tests.helpers.realfixtures import REAL, real_or_skip


@pytest.fixture(autouse=True)
def registered() -> Iterator[None]:
    with taddons.context(LlmContentview()):
        yield


def fixtures(pattern: str) -> list[str]:
    if not REAL.is_dir():
        return []
    return sorted(path.name for path in REAL.glob(pattern) if ".meta." not in path.name)


def response_flow(body: bytes, content_type: str, path: str = "/v1/responses") -> http.HTTPFlow:
    flow = tflow.tflow(resp=True)
    flow.request.path = path
    flow.response.headers["content-type"] = content_type
    flow.response.content = body
    return flow


def show(flow: http.HTTPFlow, message: http.Message | None = None, view: str = "auto"):
    return contentviews.prettify_message(message or flow.response, flow, view_name=view)


@pytest.mark.parametrize("name", fixtures("*.sse"))
def test_every_real_stream_shows_as_a_conversation(name: str) -> None:
    body = (real_or_skip() / name).read_bytes()
    result = show(response_flow(body, "text/event-stream"))
    assert result.view_name == "llmitm"
    assert result.text.startswith("llmitm · ")
    assert " stream" in result.text.splitlines()[0]
    assert " events ─" in result.text  # the tally, with the raw events one view away


@pytest.mark.parametrize("name", fixtures("*.json"))
def test_every_real_json_body_shows_as_a_conversation(name: str) -> None:
    body = (real_or_skip() / name).read_bytes()
    flow = response_flow(body, "application/json", "/v1/chat/completions")
    result = show(flow)
    assert result.view_name == "llmitm", name
    assert result.text.startswith("llmitm · ")


def read(name: str) -> bytes:
    path = real_or_skip() / name
    if not path.exists():
        pytest.skip(f"{path} not present")
    return path.read_bytes()


def test_chat_stream_reasoning_then_a_tool_call_with_pretty_arguments() -> None:
    body = read("vercel-ai-deepseek-reasoning-tool-call-stream.sse")
    text = show(response_flow(body, "text/event-stream", "/v1/chat/completions")).text
    assert "llmitm · Chat Completions stream · model deepseek-reasoner" in text
    assert "finish: tool_calls · usage: 339 in (320 cached) · 83 out (39 reasoning)" in text
    reasoning = text.index("[reasoning]\n  The user is asking for the weather in San Francisco.")
    call = text.index("[tool call] weather  (call_00_ioIn7yN9p1ZOMNpDLwd4MgAF)")
    assert reasoning < call
    assert '  {\n    "location": "San Francisco"\n  }' in text


def test_responses_stream_reasoning_summary_and_function_call() -> None:
    body = read("vercel-ai-responses-reasoning-summary-function-call-stream.sse")
    text = show(response_flow(body, "text/event-stream")).text
    assert "llmitm · Responses stream · model gpt-5.1-codex-max" in text
    assert "finish: completed · usage: 134 in · 28 out" in text
    assert "**Calculating step-by-step using calculator**" in text
    assert '[tool call] calculator  (call_AB6AaRZ1FYZB2RwS6A5vbdqn)\n  {\n    "a": 12,' in text
    assert "32 response.reasoning_summary_text.delta" in text


def test_parallel_tool_calls_stay_apart() -> None:
    text = show(
        response_flow(read("openai-python-chat-parallel-tools-stream.sse"), "text/event-stream")
    ).text
    first = text.index("[tool call] GetWeatherArgs")
    second = text.index("[tool call] get_stock_price")
    assert first < second
    assert '"city": "Edinburgh"' in text[first:second]
    assert '"ticker": "AAPL"' in text[second:]


def test_an_error_inside_a_200_stream_is_shown() -> None:
    text = show(
        response_flow(read("pydantic-ai-openrouter-stream-error.sse"), "text/event-stream")
    ).text
    assert "ERROR: Token limit reached (400)" in text
    assert "finish: length" in text
    # OpenRouter sends reasoning as both "reasoning" and "reasoning_details": shown once.
    assert text.count("We need to respond to a greeting.") == 1


def test_a_failed_responses_stream_is_shown() -> None:
    text = show(response_flow(read("vercel-ai-responses-error-stream.sse"), "text/event-stream"))
    assert text.view_name == "llmitm"
    assert "finish: failed" in text.text
    assert "ERROR:" in text.text


def test_a_request_body_shows_its_messages_and_tools() -> None:
    body = read("client-codex-0.171.0-exec-turn1.request.json")
    flow = tflow.tflow()
    flow.request.path = "/v1/responses"
    flow.request.headers["content-type"] = "application/json"
    flow.request.content = body
    result = show(flow, flow.request)
    assert result.view_name == "llmitm"
    assert result.text.startswith("llmitm · Responses request · model fake-model")
    assert "tools: exec_command, write_stdin" in result.text
    assert "── developer ─" in result.text and "── user ─" in result.text


def test_a_non_streamed_response_with_reasoning_and_tools() -> None:
    body = read("simonw-llm-responses-interleaved-reasoning-tools.json")
    text = show(response_flow(body, "application/json")).text
    assert "finish: completed · usage: 88 in · 65 out (45 reasoning)" in text
    assert "[tool call] db_lookup" in text


def test_other_bodies_keep_mitmproxys_own_views() -> None:
    flow = response_flow(b'{"hello": "world"}', "application/json", "/api/other")
    assert show(flow).view_name == "JSON"
    flow = response_flow(b"data: hello\n\n", "text/event-stream", "/events")
    assert show(flow).view_name != "llmitm"
    # mitmproxy's own views stay one click away for LLM bodies too.
    assert {"raw", "json", "llmitm"} <= set(contentviews.registry.available_views())


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (b'{"messages": [', "application/json"),  # cut JSON that looks like a request
        (
            b'data: {"choices": [1, 2, "x"], "usage": 5}\n\ndata: {"choices"\n\n',
            "text/event-stream",
        ),
        (b"data: \xff\xfe{not json\n\n", "text/event-stream"),
        (
            b'{"object": "response", "output": [null, 3, {"type": 7}], "usage": []}',
            "application/json",
        ),
        (b"\x00\x01binary", "application/octet-stream"),
    ],
)
def test_bad_input_never_raises(body: bytes, content_type: str) -> None:
    flow = response_flow(body, content_type)
    for view in ("auto", "llmitm"):
        result = show(flow, view=view)
        assert result.syntax_highlight != "error", result.text
    assert show(flow, view="llmitm").view_name == "llmitm"


def test_undecodable_content_is_reported_by_mitmproxy_not_us() -> None:
    flow = response_flow(b"", "text/event-stream")
    flow.response.headers["content-encoding"] = "gzip"
    flow.response.raw_content = b"not gzip"
    assert show(flow, view="llmitm").syntax_highlight != "error"


def test_store_streamed_bodies_is_turned_on_only_where_flows_are_kept() -> None:
    addon = LlmContentview()
    with taddons.context(addon, Proxyserver()) as tctx:
        addon.running()  # a test master has no "view" addon, like mitmdump's
        assert tctx.options.store_streamed_bodies is False
        tctx.master.addons.add(View())
        addon.running()
        assert tctx.options.store_streamed_bodies is True
