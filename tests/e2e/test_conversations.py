"""The Conversations API emulated by a real llmitm process over a chat-only backend (the
fake upstream), through the real clients: openai-agents' ``OpenAIConversationsSession`` and
``Runner.run(conversation_id=…)``, and openai-python's ``client.conversations``.

The backend keeps nothing: whatever a second turn knows of the first, llmitm's store gave
it. What the chat upstream was sent is read back from the fake (``/_requests``).
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx2 as httpx
import openai
import orjson
import pytest

pytest.importorskip("agents", reason="openai-agents is in the e2e extra (make e2e-deps)")

from agents import Agent, OpenAIResponsesModel, Runner, set_tracing_disabled
from agents.memory import OpenAIConversationsSession

from .processes import TWO_ENDPOINTS as CONFIG
from .processes import Proxy, Upstream, fake_upstream, llmitm_proxy

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Proxy, Upstream]]:
    set_tracing_disabled(True)
    tmp = tmp_path_factory.mktemp("conversations")
    with (
        fake_upstream(tmp, "chat") as chat,
        fake_upstream(tmp, "responses") as responses,
        llmitm_proxy(tmp, config=CONFIG.format(chat=chat.url, responses=responses.url)) as proxy,
    ):
        yield proxy, chat
        assert "Traceback" not in proxy.log_text(), proxy.log_text()[-3000:]


@pytest.fixture
def proxy(stack: tuple[Proxy, Upstream]) -> Proxy:
    httpx.post(f"{stack[1].url}/_reset")
    return stack[0]


def chat_messages(upstream: Upstream) -> list[list[tuple[str, str]]]:
    """Each request the chat upstream got, as (role, text) pairs."""
    sent = orjson.loads(httpx.get(f"{upstream.url}/_requests").content)
    return [
        [(m["role"], m["content"] if isinstance(m["content"], str) else str(m["content"]))
         for m in request["body"]["messages"]]
        for request in sent
    ]  # fmt: skip


def agent(client: openai.AsyncOpenAI) -> Agent:
    return Agent(
        name="echo",
        instructions="Answer briefly.",
        model=OpenAIResponsesModel(model="over-chat", openai_client=client),
    )


def async_client(proxy: Proxy, key: str = "sk-conv") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=proxy.base_url(), api_key=key, max_retries=0, timeout=30)


async def test_agents_conversations_session_over_a_chat_backend(
    proxy: Proxy, stack: tuple[Proxy, Upstream]
) -> None:
    client = async_client(proxy)
    try:
        session = OpenAIConversationsSession(openai_client=client)
        first = await Runner.run(agent(client), "Remember the word kiwi.", session=session)
        second = await Runner.run(agent(client), "Which word?", session=session)
        items = await session.get_items()
        conversation = await client.conversations.retrieve(await session._get_session_id())
    finally:
        await client.close()

    assert first.final_output and second.final_output
    assert conversation.object == "conversation"
    # The session's items: both questions and both answers, in order.
    roles = [(item.get("role"), item.get("type")) for item in items]
    assert roles == [("user", "message"), ("assistant", "message")] * 2
    assert "kiwi" in str(items[0]["content"]) and "Which word" in str(items[2]["content"])
    # The second run's upstream request carried the first run (the backend keeps nothing).
    _first_sent, second_sent = chat_messages(stack[1])
    assert [role for role, _ in second_sent] == ["system", "user", "assistant", "user"]
    assert "kiwi" in second_sent[1][1] and second_sent[2][1] == str(first.final_output)


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
async def test_agents_runs_chained_by_conversation_id(
    proxy: Proxy, stack: tuple[Proxy, Upstream], streamed: bool
) -> None:
    """``conversation`` on ``responses.create``: llmitm puts the items before the input and
    appends the turn's input and output once it is answered."""
    client = async_client(proxy)
    try:
        created = await client.conversations.create(metadata={"topic": "fruit"})
        first = await Runner.run(agent(client), "Remember kiwi.", conversation_id=created.id)
        if streamed:
            running = Runner.run_streamed(agent(client), "Which word?", conversation_id=created.id)
            [_ async for _ in running.stream_events()]
            assert running.is_complete
        else:
            await Runner.run(agent(client), "Which word?", conversation_id=created.id)
        page = await client.conversations.items.list(created.id, order="asc")
    finally:
        await client.close()

    _first_sent, second_sent = chat_messages(stack[1])
    assert [role for role, _ in second_sent] == ["system", "user", "assistant", "user"]
    assert second_sent[2][1] == str(first.final_output)
    assert [item.type for item in page.data] == ["message"] * 4
    assert [item.role for item in page.data] == ["user", "assistant"] * 2  # type: ignore[union-attr]


def test_conversations_crud_and_items_pagination(proxy: Proxy) -> None:
    with openai.OpenAI(
        base_url=proxy.base_url(), api_key="sk-conv", max_retries=0, timeout=30
    ) as client:
        made = client.conversations.create(
            items=[{"type": "message", "role": "user", "content": f"n{i}"} for i in range(3)],
            metadata={"k": "v"},
        )
        got = client.conversations.retrieve(made.id)
        updated = client.conversations.update(made.id, metadata={"k": "w"})
        added = client.conversations.items.create(
            made.id, items=[{"type": "message", "role": "user", "content": "n3"}]
        )
        first = client.conversations.items.list(made.id, order="asc", limit=2)
        every = [item.id for item in client.conversations.items.list(made.id, order="asc", limit=2)]
        newest = client.conversations.items.list(made.id, limit=1)
        one = client.conversations.items.retrieve(added.data[0].id, conversation_id=made.id)
        after_delete = client.conversations.items.delete(first.data[0].id, conversation_id=made.id)
        left = client.conversations.items.list(made.id, order="asc")
        other = openai.OpenAI(base_url=proxy.base_url(), api_key="sk-else", max_retries=0)
        with other, pytest.raises(openai.NotFoundError):
            other.conversations.retrieve(made.id)  # another key's conversation
        deleted = client.conversations.delete(made.id)
        with pytest.raises(openai.NotFoundError) as gone:
            client.conversations.retrieve(made.id)
        with pytest.raises(openai.NotFoundError):
            client.conversations.items.list(made.id)
        with pytest.raises(openai.NotFoundError):
            client.responses.create(model="over-chat", input="hi", conversation=made.id)

    assert made.id.startswith("conv_") and made.object == "conversation"
    assert got.metadata == {"k": "v"} and updated.metadata == {"k": "w"}
    assert added.object == "list" and [i.content[0].text for i in added.data] == ["n3"]  # type: ignore[union-attr]
    assert [i.content[0].text for i in first.data] == ["n0", "n1"]  # type: ignore[union-attr]
    assert first.has_more is True and first.first_id == first.data[0].id
    assert first.last_id == first.data[1].id
    assert len(every) == 4 and len(set(every)) == 4  # auto-pagination over `after`
    assert [i.content[0].text for i in newest.data] == ["n3"]  # type: ignore[union-attr]
    assert one.id == added.data[0].id
    assert after_delete.id == made.id and after_delete.object == "conversation"
    assert [i.content[0].text for i in left.data] == ["n1", "n2", "n3"]  # type: ignore[union-attr]
    assert (deleted.id, deleted.object, deleted.deleted) == (made.id, "conversation.deleted", True)
    assert gone.value.status_code == 404
    assert gone.value.body == {  # type: ignore[comparison-overlap]
        "message": f"Conversation with id '{made.id}' not found.",
        "type": "invalid_request_error",
        "param": None,
        "code": "not_found",
    }
