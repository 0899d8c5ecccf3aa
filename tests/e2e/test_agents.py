"""openai-agents through a real llmitm process: a function-tool loop in both directions.

The agent's model is ``OpenAIResponsesModel`` over a chat-only upstream (llmitm translates
Responses → chat and the answers back) and ``OpenAIChatCompletionsModel`` over a
Responses-only upstream (chat → Responses), each with ``Runner.run`` and
``Runner.run_streamed``. The upstream is the deterministic fake: with tools declared it asks
for one call of the first tool, then answers "Tool result: <output>" once the tool's result
comes back, so a passing loop proves that the call reached the agent intact and that its
result went back upstream in the upstream's own API.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from typing import Any

import httpx2 as httpx
import openai
import orjson
import pytest

# openai-agents comes with the e2e extra: without it (the dev extra alone) this module is
# skipped rather than breaking the collection of every other test.
pytest.importorskip("agents", reason="openai-agents is in the e2e extra (make e2e-deps)")

from agents import (
    Agent,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from agents.models.interface import Model

from .processes import TWO_ENDPOINTS as CONFIG
from .processes import Proxy, Upstream, fake_upstream, llmitm_proxy

pytestmark = pytest.mark.slow


TOOL_PREFIX = "agents-tool-ok"
calls: list[str] = []


@function_tool
def lookup_code(topic: str) -> str:
    """Look up the secret code for a topic.

    Args:
        topic: what to look the code up for.
    """
    calls.append(topic)
    return f"{TOOL_PREFIX}:{topic}"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Proxy, Upstream, Upstream]]:
    set_tracing_disabled(True)
    tmp = tmp_path_factory.mktemp("agents")
    with (
        fake_upstream(tmp, "chat") as chat,
        fake_upstream(tmp, "responses") as responses,
        llmitm_proxy(tmp, config=CONFIG.format(chat=chat.url, responses=responses.url)) as proxy,
    ):
        yield proxy, chat, responses


@pytest.fixture
def proxy(stack: tuple[Proxy, Upstream, Upstream]) -> Proxy:
    for upstream in stack[1:]:
        httpx.post(f"{upstream.url}/_reset")
    calls.clear()
    return stack[0]


def upstream_requests(upstream: Upstream) -> list[dict]:
    return orjson.loads(httpx.get(f"{upstream.url}/_requests").content)


async def run_agent(model: Model, streamed: bool) -> str:
    agent = Agent(
        name="coder",
        instructions="Use lookup_code, then answer with what it returned.",
        model=model,
        tools=[lookup_code],
    )
    if not streamed:
        result = await Runner.run(agent, "What is the code for x?")
        return str(result.final_output)
    streaming = Runner.run_streamed(agent, "What is the code for x?")
    kinds = [event.type async for event in streaming.stream_events()]
    assert "raw_response_event" in kinds and "run_item_stream_event" in kinds
    assert streaming.is_complete
    return str(streaming.final_output)


def client_for(proxy: Proxy) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=proxy.base_url(), api_key="sk-agents", max_retries=0)


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
async def test_responses_model_over_chat_upstream(
    proxy: Proxy, stack: tuple[Proxy, Upstream, Upstream], streamed: bool
) -> None:
    _proxy, chat, responses = stack
    client = client_for(proxy)
    try:
        model = OpenAIResponsesModel(model="over-chat", openai_client=client)
        final = await run_agent(model, streamed)
    finally:
        await client.close()

    assert calls == ["x"], "the tool ran once, with the upstream's arguments"
    assert f"{TOOL_PREFIX}:x" in final

    first, second = upstream_requests(chat)
    assert upstream_requests(responses) == []
    for sent in (first, second):
        assert sent["path"] == "/v1/chat/completions"
        assert sent["body"]["model"] == "over-chat"
        assert bool(sent["body"].get("stream")) is streamed
        if streamed:
            assert sent["body"]["stream_options"] == {"include_usage": True}
        [tool] = sent["body"]["tools"]
        assert tool["type"] == "function" and tool["function"]["name"] == "lookup_code"
        assert "input" not in sent["body"] and "instructions" not in sent["body"]
        assert sent["body"]["messages"][0]["role"] in ("system", "developer")
    messages = second["body"]["messages"]
    assistant, tool_message = messages[-2:]
    [tool_call] = assistant["tool_calls"]
    assert tool_call["type"] == "function"
    assert tool_call["function"]["name"] == "lookup_code"
    assert orjson.loads(tool_call["function"]["arguments"]) == {"topic": "x"}
    assert tool_message["role"] == "tool"
    assert tool_message["tool_call_id"] == tool_call["id"]
    assert f"{TOOL_PREFIX}:x" in str(tool_message["content"])
    assert "Traceback" not in proxy.log_text()


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
async def test_chat_model_over_responses_upstream(
    proxy: Proxy, stack: tuple[Proxy, Upstream, Upstream], streamed: bool
) -> None:
    _proxy, chat, responses = stack
    client = client_for(proxy)
    try:
        model = OpenAIChatCompletionsModel(model="over-responses", openai_client=client)
        final = await run_agent(model, streamed)
    finally:
        await client.close()

    assert calls == ["x"]
    assert f"{TOOL_PREFIX}:x" in final

    first, second = upstream_requests(responses)
    assert upstream_requests(chat) == []
    for sent in (first, second):
        assert sent["path"] == "/v1/responses"
        assert sent["body"]["model"] == "over-responses"
        assert bool(sent["body"].get("stream")) is streamed
        assert "messages" not in sent["body"]
        assert sent["body"]["instructions"].startswith("Use lookup_code")
        [tool] = sent["body"]["tools"]
        assert tool["type"] == "function" and tool["name"] == "lookup_code"
    items = second["body"]["input"]
    call = next(item for item in items if item.get("type") == "function_call")
    output = next(item for item in items if item.get("type") == "function_call_output")
    assert call["name"] == "lookup_code"
    assert orjson.loads(call["arguments"]) == {"topic": "x"}
    assert output["call_id"] == call["call_id"]
    assert f"{TOOL_PREFIX}:x" in str(output["output"])
    assert items.index(call) < items.index(output)
    assert "Traceback" not in proxy.log_text()


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
async def test_responses_model_multi_turn_with_previous_response_id_over_chat_upstream(
    proxy: Proxy, stack: tuple[Proxy, Upstream, Upstream], streamed: bool
) -> None:
    """Two agent turns chained by ``previous_response_id`` (the agent sends only the new
    items; every model call inside a turn chains on the one before): llmitm stores each
    response and rebuilds the whole conversation for the chat upstream."""
    _proxy, chat, _responses = stack
    client = client_for(proxy)
    agent = Agent(
        name="coder",
        instructions="Use lookup_code, then answer with what it returned.",
        model=OpenAIResponsesModel(model="over-chat", openai_client=client),
        tools=[lookup_code],
    )
    try:
        previous = None
        for question in ("What is the code for x?", "And for y?"):
            if streamed:
                running = Runner.run_streamed(
                    agent, question, previous_response_id=previous, auto_previous_response_id=True
                )
                [_ async for _ in running.stream_events()]
                result: Any = running
            else:
                result = await Runner.run(
                    agent, question, previous_response_id=previous, auto_previous_response_id=True
                )
            previous = result.last_response_id
            assert previous
        final = str(result.final_output)
    finally:
        await client.close()

    assert calls == ["x", "x"]  # the fake fills every string argument with "x"
    assert f"{TOOL_PREFIX}:x" in final
    sent = upstream_requests(chat)
    assert len(sent) == 4  # two model calls per turn: the tool call, then the answer
    last = sent[-1]["body"]["messages"]
    conversation = [
        (m["role"], m.get("content") if m["role"] != "assistant" or not m.get("tool_calls")
         else orjson.loads(m["tool_calls"][0]["function"]["arguments"])["topic"])
        for m in last
    ]  # fmt: skip
    assert conversation == [
        ("system", "Use lookup_code, then answer with what it returned."),
        ("user", "What is the code for x?"),
        ("assistant", "x"),
        ("tool", f"{TOOL_PREFIX}:x"),
        ("assistant", f"Tool result: {TOOL_PREFIX}:x"),
        ("user", "And for y?"),
        ("assistant", "x"),
        ("tool", f"{TOOL_PREFIX}:x"),
    ]
    # The agent sent previous_response_id, not the history: the stored chain says so.
    # (A read through the proxy first: it waits for the writes queued before it.)
    assert httpx.get(f"{proxy.base_url()}/responses/resp_flush").status_code == 404
    with sqlite3.connect(proxy.log.with_name("llmitm.db")) as db:
        parents = dict(db.execute("SELECT id, previous_response_id FROM responses").fetchall())
    chain = [previous]
    while parents.get(chain[-1]):
        chain.append(parents[chain[-1]])
    assert len(chain) == 4, chain
    assert "Traceback" not in proxy.log_text()
