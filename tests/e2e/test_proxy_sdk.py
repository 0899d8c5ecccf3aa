"""The openai SDK through a real llmitm process, in both translation directions.

Reverse mode (the SDK's base URL points at llmitm) for all four streaming entry points and the
non-streamed calls; the upstream is the deterministic fake, one chat-only and one
Responses-only endpoint behind routes chosen by model name. Scenarios and faults travel in
the ``x-fake-scenario`` header, which llmitm forwards untouched.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx2 as httpx
import openai
import orjson
import pytest

from .processes import TWO_ENDPOINTS as CONFIG
from .processes import Proxy, Upstream, fake_upstream, llmitm_proxy

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Proxy, Upstream, Upstream]]:
    tmp = tmp_path_factory.mktemp("sdk")
    with (
        fake_upstream(tmp, "chat") as chat,
        fake_upstream(tmp, "responses") as responses,
        llmitm_proxy(tmp, config=CONFIG.format(chat=chat.url, responses=responses.url)) as proxy,
    ):
        yield proxy, chat, responses


@pytest.fixture
def client(stack: tuple[Proxy, Upstream, Upstream]) -> openai.OpenAI:
    proxy, chat, responses = stack
    for upstream in (chat, responses):
        httpx.post(f"{upstream.url}/_reset")
    return openai.OpenAI(base_url=proxy.base_url(), api_key="sk-client", max_retries=0)


def scenario(name: str) -> dict[str, dict[str, str]]:
    return {"extra_headers": {"x-fake-scenario": name}}


def upstream_requests(upstream: Upstream) -> list[dict]:
    return orjson.loads(httpx.get(f"{upstream.url}/_requests").content)


# -- Responses client over a chat-only upstream ------------------------------------------------


def test_responses_stream_helper_over_chat_upstream(client: openai.OpenAI, stack) -> None:
    _proxy, chat, _responses = stack
    with client.responses.stream(
        model="over-chat", input="Say hello", **scenario("reasoning")
    ) as stream:
        events = [event.type for event in stream]
        final = stream.get_final_response()
    assert events[0] == "response.created"
    assert events[-1] == "response.completed"
    assert final.status == "completed"
    assert [item.type for item in final.output] == ["reasoning", "message"]
    assert final.output_text
    assert final.usage is not None and final.usage.output_tokens > 0
    assert final.model == "over-chat"
    (sent,) = upstream_requests(chat)
    assert sent["path"] == "/v1/chat/completions"
    assert sent["body"]["stream_options"] == {"include_usage": True}
    assert sent["body"]["messages"][-1] == {"role": "user", "content": "Say hello"}


def test_responses_create_stream_over_chat_upstream_tool_call(client: openai.OpenAI) -> None:
    tools = [
        {
            "type": "function",
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        }
    ]
    stream = client.responses.create(
        model="over-chat", input="Weather?", tools=tools, stream=True, **scenario("tool-loop")
    )
    events = list(stream)
    done = [e.item for e in events if e.type == "response.output_item.done"]
    terminal = events[-1]
    assert terminal.type == "response.completed"
    assert [item.type for item in done] == ["function_call"]
    assert done[0].name == "get_weather"
    assert orjson.loads(done[0].arguments) == {"city": "x"}
    assert [item.model_dump() for item in terminal.response.output] == [
        item.model_dump() for item in done
    ]
    sequence = [e.sequence_number for e in events]
    assert sequence == list(range(len(events)))


def test_responses_create_non_streamed_over_chat_upstream(client: openai.OpenAI) -> None:
    response = client.responses.create(model="over-chat", input="hi", **scenario("text"))
    assert response.status == "completed"
    assert response.output_text == "Hello from the fake upstream."


def test_responses_length_becomes_incomplete(client: openai.OpenAI) -> None:
    with client.responses.stream(model="over-chat", input="hi", **scenario("length")) as stream:
        events = [event.type for event in stream]
    assert events[-1] == "response.incomplete"


# -- chat client over a Responses-only upstream ------------------------------------------------


def test_chat_stream_helper_over_responses_upstream(client: openai.OpenAI, stack) -> None:
    _proxy, _chat, responses = stack
    with client.chat.completions.stream(
        model="over-responses",
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
        **scenario("reasoning"),
    ) as stream:
        for _event in stream:
            pass
        final = stream.get_final_completion()
    message = final.choices[0].message
    assert message.content.startswith("<think>\n")
    assert message.content.endswith("Hello from the fake upstream.")
    assert final.choices[0].finish_reason == "stop"
    (sent,) = upstream_requests(responses)
    assert sent["path"] == "/v1/responses"
    assert sent["body"]["instructions"] == "Be brief."
    assert sent["body"]["model"] == "over-responses"


def test_chat_create_stream_with_usage_over_responses_upstream(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model="over-responses",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options={"include_usage": True},
            **scenario("tools-parallel"),
        )
    )
    calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert sorted({tc.index for tc in calls}) == [0, 1]
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finish == ["tool_calls"]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None


def test_chat_create_non_streamed_over_responses_upstream(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model="over-responses", messages=[{"role": "user", "content": "hi"}], **scenario("text")
    )
    assert completion.choices[0].message.content == "Hello from the fake upstream."
    assert completion.usage is not None


# -- errors ---------------------------------------------------------------------------------


def test_checklist_21_upstream_429_before_first_byte_keeps_status_and_retry_after(
    client: openai.OpenAI,
) -> None:
    with pytest.raises(openai.RateLimitError) as caught:
        client.responses.create(
            model="over-chat", input="hi", stream=True, **scenario("text;status=429;retry_after=7")
        )
    assert caught.value.status_code == 429
    assert caught.value.response.headers["retry-after"] == "7"
    assert caught.value.body["code"] == "rate_limit_exceeded" or caught.value.body["type"]


def test_cut_after_first_byte_ends_with_a_terminal_error(client: openai.OpenAI) -> None:
    """An upstream that dies mid-stream: the client gets an error in its protocol (an API
    error, not a transport error), never a clean end and never a hang."""
    with (
        pytest.raises(openai.APIError) as caught,
        client.responses.stream(
            model="over-chat", input="hi", **scenario("text;events=50;disconnect_after=5")
        ) as stream,
    ):
        for _event in stream:
            pass
    assert not isinstance(caught.value, openai.APIConnectionError)
    assert "ended without a finish_reason" in caught.value.message
    with pytest.raises(openai.APIError) as caught:
        for _chunk in client.chat.completions.create(
            model="over-responses",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            **scenario("text;events=50;disconnect_after=5"),
        ):
            pass
    assert not isinstance(caught.value, openai.APIConnectionError)
    assert "ended before a terminal event" in caught.value.message


def test_cut_passthrough_stream_also_ends_in_its_protocol(client: openai.OpenAI) -> None:
    """Same API in and out (no translation): the guard still closes a cut stream."""
    with pytest.raises(openai.APIError) as caught:
        for _chunk in client.chat.completions.create(
            model="over-chat",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            **scenario("text;events=50;disconnect_after=5"),
        ):
            pass
    assert not isinstance(caught.value, openai.APIConnectionError)


def test_mid_stream_error_reaches_the_client_in_its_protocol(client: openai.OpenAI) -> None:
    with (
        pytest.raises(openai.APIError),
        client.responses.stream(
            model="over-chat", input="hi", **scenario("error-midstream")
        ) as stream,
    ):
        for _event in stream:
            pass


def test_invalid_json_is_answered_locally_and_not_forwarded(stack) -> None:
    proxy, chat, _responses = stack
    httpx.post(f"{chat.url}/_reset")
    reply = httpx.post(
        f"{proxy.base_url()}/responses",
        content=b"{not json",
        headers={"content-type": "application/json"},
    )
    assert reply.status_code == 400
    assert reply.json()["error"]["type"] == "invalid_request_error"
    assert reply.headers["x-should-retry"] == "false"
    assert upstream_requests(chat) == []


def test_missing_model_is_a_400(stack) -> None:
    proxy, _chat, _responses = stack
    reply = httpx.post(f"{proxy.base_url()}/chat/completions", json={"messages": []})
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == "model"


def test_untranslatable_request_is_a_400_naming_the_field(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model="over-responses", messages=[{"role": "user", "content": "hi"}], n=2
        )
    assert caught.value.body["param"] == "n"


def test_other_paths_pass_through(stack) -> None:
    proxy, _chat, _responses = stack
    # Not a create call: forwarded to the reverse target (nothing listens there): an error,
    # but from mitmproxy's passthrough, not an llmitm 400. (The model list is llmitm's own.)
    reply = httpx.get(f"{proxy.base_url()}/files")
    assert reply.status_code == 502


def test_proxy_survives_all_of_the_above(client: openai.OpenAI, stack) -> None:
    proxy, _chat, _responses = stack
    assert proxy.process.poll() is None
    response = client.responses.create(model="over-chat", input="hi", **scenario("text"))
    assert response.output_text == "Hello from the fake upstream."
    assert "Traceback" not in proxy.log_text()


def test_a_client_that_aborts_mid_stream_harms_nothing(client: openai.OpenAI, stack) -> None:
    """The client hangs up after a few events of a long translated stream: the proxy logs no
    traceback and the next request is served."""
    proxy, _chat, _responses = stack
    stream = client.responses.create(
        model="over-chat",
        input="hi",
        stream=True,
        **scenario("text;events=2000;event_delay_ms=1"),
    )
    for index, _event in enumerate(stream):
        if index == 5:
            break
    stream.close()
    response = client.responses.create(model="over-chat", input="hi", **scenario("text"))
    assert response.output_text == "Hello from the fake upstream."
    assert proxy.process.poll() is None
    assert "Traceback" not in proxy.log_text()
