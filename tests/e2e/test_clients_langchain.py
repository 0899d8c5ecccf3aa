"""LangChain's ``ChatOpenAI`` (langchain-openai 1.7) through llmitm, over the Chat
Completions API and with ``use_responses_api=True``, with a bound tool, streamed and not:
each over a chat-only and a Responses-only upstream and over every real captured stream,
judged on the message the application gets (its text, tool calls and arguments, reasoning).

LangChain shows a Responses reasoning item's summary (a ``reasoning`` content block) and
ignores raw ``reasoning_text``: an endpoint with ``reasoning_summary = true`` makes it
visible. It ignores a chat delta's ``reasoning_content`` too: ``reasoning_passthrough =
"think-tags"`` brings it into the text.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Iterator
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage
from langchain_openai import ChatOpenAI

from .clients_harness import (
    CONFIG,
    PARAMETERS,
    PROMPT,
    Meaning,
    body_fixtures,
    body_meaning,
    fake_meaning,
    fixture_meaning,
    fixture_server,
    stream_fixtures,
)
from .processes import fake_upstream, llmitm_proxy

pytestmark = pytest.mark.slow

TOOL = {
    "type": "function",
    "function": {"name": "lookup", "description": "Weather", "parameters": PARAMETERS},
}
APIS = ("chat", "responses")
UPSTREAMS = ("chat", "responses")
FIXTURES = stream_fixtures()
BODIES = body_fixtures()
LMSTUDIO = "vercel-ai-lmstudio-responses-reasoning-tool-stream"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    tmp = tmp_path_factory.mktemp("clients-langchain")
    with (
        fake_upstream(tmp, "chat") as chat,
        fake_upstream(tmp, "responses") as responses,
        fixture_server() as fixtures,
    ):
        config = CONFIG.format(chat=chat.url, responses=responses.url, fixtures=fixtures)
        with llmitm_proxy(tmp / "proxy", config=config) as proxy:
            yield {"proxy": proxy.base_url(), "chat": chat.url, "responses": responses.url}


def ask(
    world: dict[str, str],
    model: str,
    *,
    api: str,
    streaming: bool,
    tools: bool = False,
    scenario: str | None = None,
) -> AIMessage:
    """One question as an app asks it: ``invoke``, or ``stream`` with the chunks added up."""
    llm = ChatOpenAI(
        model=model,
        base_url=world["proxy"],
        api_key="sk-langchain",  # type: ignore[arg-type]
        use_responses_api=api == "responses",
        max_retries=0,
        timeout=20,
        default_headers={"x-fake-scenario": scenario} if scenario else None,
    )
    runnable: Any = llm.bind_tools([TOOL]) if tools else llm
    if not streaming:
        return runnable.invoke(PROMPT)
    chunks: list[BaseMessage] = list(runnable.stream(PROMPT))
    return functools.reduce(operator.add, chunks)  # type: ignore[return-value]


def text_of(message: AIMessage) -> str:
    return "".join(
        block.get("text", "") for block in message.content_blocks if block["type"] == "text"
    )


def reasoning_of(message: AIMessage) -> str:
    return "".join(
        block.get("reasoning", "")
        for block in message.content_blocks
        if block["type"] == "reasoning"
    )


def refusal_of(message: AIMessage) -> str:
    blocks = message.content if isinstance(message.content, list) else []
    return str(message.additional_kwargs.get("refusal") or "") + "".join(
        block.get("refusal", "")
        for block in blocks
        if isinstance(block, dict) and block.get("type") == "refusal"
    )


def assert_means(message: AIMessage, expected: Meaning) -> None:
    assert (text_of(message), refusal_of(message)) == (expected.text, expected.refusal)
    assert [(call["name"], call["args"]) for call in message.tool_calls] == expected.calls


@pytest.mark.parametrize("streaming", [False, True], ids=["invoke", "stream"])
@pytest.mark.parametrize("tools", [False, True], ids=["text", "tool"])
@pytest.mark.parametrize("upstream", UPSTREAMS, ids=lambda u: f"over-{u}")
@pytest.mark.parametrize("api", APIS, ids=lambda a: f"client-{a}")
def test_chat_openai_over_a_fake(
    world: dict[str, str], api: str, upstream: str, tools: bool, streaming: bool
) -> None:
    """The message carries what the fake answers when asked directly."""
    expected = fake_meaning(world[upstream], upstream, tools=tools)
    message = ask(world, f"over-{upstream}", api=api, streaming=streaming, tools=tools)
    assert_means(message, expected)
    if tools:
        assert [name for name, _args in expected.calls] == ["lookup"]


@pytest.mark.skipif(not FIXTURES, reason="the real fixtures are not beside the repository")
@pytest.mark.parametrize("api", APIS, ids=lambda a: f"client-{a}")
@pytest.mark.parametrize(("name", "upstream"), FIXTURES, ids=[name for name, _api in FIXTURES])
def test_real_stream_through_chat_openai(
    world: dict[str, str], name: str, upstream: str, api: str
) -> None:
    """A real backend's stream means the same to LangChain, relayed or translated; one that
    failed raises."""
    judge(world, fixture_meaning(name, upstream), name, upstream, api, streaming=True)


@pytest.mark.skipif(not BODIES, reason="the real fixtures are not beside the repository")
@pytest.mark.parametrize("api", APIS, ids=lambda a: f"client-{a}")
@pytest.mark.parametrize(("name", "upstream"), BODIES, ids=[name for name, _api in BODIES])
def test_real_body_through_chat_openai(
    world: dict[str, str], name: str, upstream: str, api: str
) -> None:
    """The same for a real non-streamed answer, with ``invoke``."""
    judge(world, body_meaning(name, upstream), name, upstream, api, streaming=False)


def judge(
    world: dict[str, str], expected: Meaning, name: str, upstream: str, api: str, *, streaming: bool
) -> None:
    model = f"fx-{upstream}/{name}"
    if expected.error:
        with pytest.raises(Exception):  # noqa: B017 - any error the app can catch
            ask(world, model, api=api, streaming=streaming)
        return
    if upstream == "responses" and api == "chat" and expected.reasoning:
        # Translated for a chat client, reasoning takes llmitm's default rendering.
        expected.text = f"<think>\n{expected.reasoning}\n</think>\n\n{expected.text}"
    if upstream == "chat" and api == "responses" and expected.text.startswith("<think>"):
        # Translated for a Responses client, inline think tags become a reasoning item.
        expected.text = expected.text.partition("</think>")[2].lstrip()
    if api == "chat" and streaming:
        # LangChain's chat stream drops refusal deltas (its Responses stream shows them).
        expected.refusal = ""
    assert_means(ask(world, model, api=api, streaming=streaming), expected)


@pytest.mark.parametrize("streaming", [False, True], ids=["invoke", "stream"])
def test_think_tags_bring_chat_reasoning_into_langchains_text(
    world: dict[str, str], streaming: bool
) -> None:
    expected = fake_meaning(world["chat"], "chat", tools=False, scenario="reasoning")
    assert len(expected.reasoning) > 20
    raw = ask(world, "over-chat", api="chat", streaming=streaming, scenario="reasoning")
    assert text_of(raw) == expected.text  # the control: relayed as sent, the reasoning is lost
    assert expected.reasoning not in str(raw.content)
    shown = ask(world, "over-chat-think", api="chat", streaming=streaming, scenario="reasoning")
    assert text_of(shown) == f"<think>\n{expected.reasoning}\n</think>\n\n{expected.text}"


def test_a_chat_backends_reasoning_reaches_langchain_over_responses(
    world: dict[str, str],
) -> None:
    """Translated for a Responses client, chat reasoning arrives as a summary LangChain
    shows."""
    expected = fake_meaning(world["chat"], "chat", tools=False, scenario="reasoning")
    message = ask(world, "over-chat", api="responses", streaming=True, scenario="reasoning")
    assert (reasoning_of(message), text_of(message)) == (expected.reasoning, expected.text)


@pytest.mark.skipif(not FIXTURES, reason="the real fixtures are not beside the repository")
def test_reasoning_summary_shows_raw_reasoning_to_langchain(world: dict[str, str]) -> None:
    """LM Studio's raw reasoning (a captured stream): not shown as sent, shown whole as
    summary."""
    expected = fixture_meaning(LMSTUDIO, "responses")
    assert len(expected.reasoning) > 50
    raw = ask(world, f"fx-responses/{LMSTUDIO}", api="responses", streaming=True)
    assert reasoning_of(raw) == ""
    shown = ask(world, f"fx-summary/{LMSTUDIO}", api="responses", streaming=True)
    assert reasoning_of(shown) == expected.reasoning
    assert_means(shown, expected)
