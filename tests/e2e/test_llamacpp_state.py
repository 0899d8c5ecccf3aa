"""llmitm keeps the Responses state of llama.cpp's own Responses API (``state`` = ``auto``,
which emulates for a ``compatible`` endpoint): a real llama.cpp server on Gemma-3-270M, a
real llmitm process, openai-agents and the openai SDK as the clients.

llama.cpp answers ``previous_response_id`` with an error and keeps nothing to retrieve. With
llmitm in front, an agent chains two runs by ``previous_response_id``, and the stored
response is retrieved and its input items listed. The ``native*`` route is the same server
with ``state = "native"``: the control, on which the second run still fails.

The model babbles; the tests assert on structure and on token counts (the second request
carries the first turn, so it is longer), never on content.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator

import openai
import pytest

pytest.importorskip("agents", reason="openai-agents is in the e2e extra (make e2e-deps)")

from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, set_tracing_disabled

from .processes import Proxy, llmitm_proxy

pytestmark = pytest.mark.slow

CONFIG = """
[endpoints.llama]
kind = "compatible"
base_url = "{llama}/v1"
apis = ["responses"]
non_conformant = ["responses"]

[endpoints.llama-native]
kind = "compatible"
base_url = "{llama}/v1"
apis = ["responses"]
non_conformant = ["responses"]
state = "native"

[[routes]]
models = ["emulated*"]
endpoints = ["llama"]

[[routes]]
models = ["native*"]
endpoints = ["llama-native"]
"""


@pytest.fixture(scope="module")
def proxy(llama_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    set_tracing_disabled(True)
    tmp = tmp_path_factory.mktemp("llamacpp-state")
    with llmitm_proxy(tmp, config=CONFIG.format(llama=llama_server)) as proxy:
        yield proxy
        assert "Traceback" not in proxy.log_text(), proxy.log_text()[-3000:]


def agent_for(proxy: Proxy, model: str) -> tuple[Agent, openai.AsyncOpenAI]:
    client = openai.AsyncOpenAI(
        base_url=proxy.base_url(), api_key="sk-llama", max_retries=0, timeout=120
    )
    agent = Agent(
        name="greeter",
        instructions="Answer in one short sentence.",
        model=OpenAIResponsesModel(model=model, openai_client=client),
        model_settings=ModelSettings(max_tokens=4, temperature=0),
    )
    return agent, client


async def test_agent_chains_two_runs_over_llama_responses(proxy: Proxy) -> None:
    agent, client = agent_for(proxy, "emulated")
    try:
        first = await Runner.run(agent, "Say hi.")
        streaming = Runner.run_streamed(
            agent, "Say bye.", previous_response_id=first.last_response_id
        )
        [_ async for _ in streaming.stream_events()]
        assert streaming.is_complete
        second_id = streaming.last_response_id
        assert second_id and second_id != first.last_response_id
        one = await client.responses.retrieve(first.last_response_id)
        two = await client.responses.retrieve(second_id)
    finally:
        await client.close()

    # llama.cpp's own ids, stored by llmitm, and the chain behind them.
    assert two.previous_response_id == first.last_response_id
    assert one.output_text and two.output_text
    assert one.usage is not None and two.usage is not None
    # llama.cpp was sent the first turn again (input and answer) before the new question.
    assert two.usage.input_tokens > one.usage.input_tokens + one.usage.output_tokens
    with sqlite3.connect(proxy.log.with_name("llmitm.db")) as db:
        parents = dict(db.execute("SELECT id, previous_response_id FROM responses").fetchall())
    assert parents[second_id] == first.last_response_id


def test_retrieve_and_input_items_in_front_of_llama(proxy: Proxy) -> None:
    with openai.OpenAI(
        base_url=proxy.base_url(), api_key="sk-llama", max_retries=0, timeout=120
    ) as client:
        created = client.responses.create(
            model="emulated",
            input=[
                {"role": "user", "content": "Say hi."},
                {"role": "user", "content": "Then say bye."},
            ],
            max_output_tokens=4,
        )
        got = client.responses.retrieve(created.id)
        items = client.responses.input_items.list(created.id, order="asc", limit=1)
        rest = client.responses.input_items.list(created.id, order="asc", after=items.data[0].id)
        client.responses.delete(created.id)
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(created.id)
        other = openai.OpenAI(base_url=proxy.base_url(), api_key="sk-other", max_retries=0)
        with other, pytest.raises(openai.NotFoundError):
            other.responses.retrieve(got.id)  # another key's response does not exist for it

    assert got.id == created.id and got.output_text == created.output_text
    assert [item.content[0].text for item in items.data] == ["Say hi."]  # type: ignore[union-attr]
    assert items.has_more is True
    assert [item.content[0].text for item in rest.data] == ["Then say bye."]  # type: ignore[union-attr]
    assert rest.has_more is False


async def test_native_state_is_llamas_and_fails_the_chain(proxy: Proxy) -> None:
    """The control: left to llama.cpp, the chain's second run is refused by the server."""
    agent, client = agent_for(proxy, "native")
    try:
        first = await Runner.run(agent, "Say hi.")
        with pytest.raises(openai.APIStatusError):
            await Runner.run(agent, "Say bye.", previous_response_id=first.last_response_id)
    finally:
        await client.close()
