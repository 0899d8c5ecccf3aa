"""The Conversations API's sans-IO logic (paths, bodies, errors, pagination, the
``conversation`` of a create call) and its storage, in memory and in SQLite alike."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from openai.types.conversations import Conversation, ConversationDeletedResource
from openai.types.conversations.conversation_item_list import ConversationItemList

from llmitm.responses_api.conversation_records import (
    ConversationDeleted,
    ConversationItemDeleted,
    ConversationItemsAdded,
    ConversationReader,
    ConversationSaved,
    StoredConversation,
)
from llmitm.responses_api.conversations import (
    ConversationCall,
    answer_call,
    conversation_call,
    create,
    inline_conversation,
    turn_items,
)
from llmitm.store import store_for
from llmitm.store.memory_conversations import MemoryConversations
from llmitm.wire.ids import CountingIds
from llmitm.wire.paths import is_llm_call


@pytest.mark.parametrize(
    ("method", "path", "expected"),
    [
        ("POST", "/v1/conversations", ConversationCall("create")),
        ("GET", "/v1/conversations/conv_1", ConversationCall("retrieve", "conv_1")),
        ("POST", "/v1/conversations/conv_1", ConversationCall("update", "conv_1")),
        ("DELETE", "/v1/conversations/conv_1/", ConversationCall("delete", "conv_1")),
        (
            "GET",
            "/v1/conversations/conv_1/items?limit=2&order=asc",
            ConversationCall("list_items", "conv_1", None, [("limit", "2"), ("order", "asc")]),
        ),
        ("POST", "/v1/conversations/conv_1/items", ConversationCall("add_items", "conv_1")),
        ("GET", "/v1/conversations/c/items/msg_1", ConversationCall("item", "c", "msg_1")),
        ("DELETE", "/v1/conversations/c/items/m", ConversationCall("delete_item", "c", "m")),
        ("GET", "/v1/conversations", None),  # no list of conversations in OpenAI's API
        ("PUT", "/v1/conversations/conv_1", None),
        ("POST", "/v1/responses", None),
    ],
)
def test_calls_are_classified(method: str, path: str, expected: ConversationCall | None) -> None:
    assert conversation_call(method, path) == expected


@pytest.mark.parametrize(
    ("path", "llm"),
    [
        ("/v1/conversations", True),
        ("/v1/conversations/conv_1?x=1", True),
        ("/v1/conversations/conv_1/items/msg_1", True),
        ("/v1/conversationsx", False),
        ("/v1/conversations/conv_1/other", False),
    ],
)
def test_conversations_calls_are_llm_calls_for_the_egress_policy(path: str, llm: bool) -> None:
    """``egress = "local"`` answers what is not an LLM call itself: these must reach llmitm's
    Conversations API instead."""
    assert is_llm_call(path) is llm


def new(body: Any = None) -> tuple[StoredConversation, list[dict[str, Any]], Any]:
    outcome = create(body, ids=CountingIds(), now=1_700_000_000.5, credential="alice")
    saved = outcome.writes[0]
    assert isinstance(saved, ConversationSaved)
    added = [w for w in outcome.writes if isinstance(w, ConversationItemsAdded)]
    return saved.conversation, list(added[0].items) if added else [], outcome.answer


def test_create_answers_openais_conversation_object() -> None:
    conversation, items, answer = new(
        {"metadata": {"topic": "t"}, "items": [{"role": "user", "content": "hi"}]}
    )
    assert answer.status == 200
    Conversation.model_validate(answer.body)  # the SDK's own type
    assert answer.body == {
        "id": conversation.id,
        "object": "conversation",
        "created_at": 1_700_000_000,
        "metadata": {"topic": "t"},
    }
    assert conversation.credential == "alice"
    assert items == [
        {
            "id": items[0]["id"],
            "role": "user",
            "content": [{"type": "input_text", "text": "hi"}],
            "type": "message",
            "status": "completed",
        }
    ]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"metadata": {"k": 1}}, "metadata"),
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
        ({"metadata": {"k" * 65: "v"}}, "metadata"),
        ({"items": "hi"}, "items"),
        ({"items": [{"role": "user", "content": "x"}] * 21}, "items"),
        ([1], None),
    ],
)
def test_bad_create_bodies_are_openais_400(body: Any, param: str | None) -> None:
    outcome = create(body, ids=CountingIds(), now=1.0, credential=None)
    assert outcome.answer.status == 400 and outcome.writes == []
    error = outcome.answer.body["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param


def items_of(*texts: str) -> list[dict[str, Any]]:
    return [
        {"id": f"msg_{t}", "type": "message", "role": "user", "content": [], "status": "completed"}
        for t in texts
    ]


def call(action: str, item: str | None = None, **query: str) -> ConversationCall:
    return ConversationCall(action, "conv_1", item, list(query.items()))  # type: ignore[arg-type]


CONVERSATION = StoredConversation("conv_1", 5.0, {"a": "b"}, "alice")


def test_items_are_paged_as_openai_lists_them() -> None:
    items = items_of("a", "b", "c")
    page = answer_call(call("list_items", limit="2"), CONVERSATION, items, None, CountingIds())
    ConversationItemList.model_validate(page.answer.body)
    assert [i["id"] for i in page.answer.body["data"]] == ["msg_c", "msg_b"]  # desc by default
    assert page.answer.body["has_more"] is True
    assert (page.answer.body["first_id"], page.answer.body["last_id"]) == ("msg_c", "msg_b")
    rest = answer_call(
        call("list_items", after="msg_b", include="x"), CONVERSATION, items, None, CountingIds()
    )
    assert [i["id"] for i in rest.answer.body["data"]] == ["msg_a"]
    assert rest.answer.body["has_more"] is False
    bad = answer_call(call("list_items", limit="0"), CONVERSATION, items, None, CountingIds())
    assert bad.answer.status == 400 and bad.answer.body["error"]["param"] == "limit"


def test_update_delete_and_items_answer_and_write() -> None:
    ids = CountingIds()
    items = items_of("a")
    updated = answer_call(call("update"), CONVERSATION, items, {"metadata": {"x": "y"}}, ids)
    assert updated.answer.body["metadata"] == {"x": "y"}
    assert updated.writes == [
        ConversationSaved(StoredConversation("conv_1", 5.0, {"x": "y"}, "alice"))
    ]
    missing = answer_call(call("update"), CONVERSATION, items, {}, ids)
    assert missing.answer.status == 400 and missing.writes == []
    deleted = answer_call(call("delete"), CONVERSATION, items, None, ids)
    ConversationDeletedResource.model_validate(deleted.answer.body)
    assert deleted.answer.body == {
        "id": "conv_1",
        "object": "conversation.deleted",
        "deleted": True,
    }
    assert deleted.writes == [ConversationDeleted("conv_1")]
    added = answer_call(
        call("add_items"), CONVERSATION, items, {"items": [{"role": "user", "content": "b"}]}, ids
    )
    ConversationItemList.model_validate(added.answer.body)
    assert added.answer.body["has_more"] is False and len(added.answer.body["data"]) == 1
    assert added.writes == [ConversationItemsAdded("conv_1", tuple(added.answer.body["data"]))]
    got = answer_call(call("item", "msg_a"), CONVERSATION, items, None, ids)
    assert got.answer.body == items[0]
    gone = answer_call(call("item", "msg_zz"), CONVERSATION, items, None, ids)
    assert gone.answer.status == 404
    assert gone.answer.body["error"]["message"] == "Item with id 'msg_zz' not found."
    dropped = answer_call(call("delete_item", "msg_a"), CONVERSATION, items, None, ids)
    assert dropped.answer.body["object"] == "conversation"
    assert dropped.writes == [ConversationItemDeleted("conv_1", "msg_a")]


def test_a_turn_appends_its_input_then_its_output() -> None:
    own = items_of("q")
    response = {"output": [{"id": "msg_r", "type": "message", "role": "assistant"}, "junk"]}
    assert [i["id"] for i in turn_items(own, response)] == ["msg_q", "msg_r"]


# -- storage, and the create call's conversation ---------------------------------------------


@pytest.fixture(params=["memory", "sqlite", "postgresql"])
async def store(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[ConversationReader, Any]]:
    if request.param == "memory":
        memory = MemoryConversations()
        yield memory, memory.apply
        return
    if request.param == "postgresql":
        database = store_for(request.getfixturevalue("pg_dsn"))
    else:
        database = store_for(tmp_path / "s.db")
    async with database:
        assert isinstance(database, ConversationReader)
        yield database, database.submit


async def test_the_store_keeps_order_metadata_and_owner(
    store: tuple[ConversationReader, Any],
) -> None:
    reader, submit = store
    submit(ConversationSaved(StoredConversation("conv_1", 5.0, {"a": "b"}, "alice")))
    submit(ConversationItemsAdded("conv_1", tuple(items_of("a", "b"))))
    submit(ConversationItemsAdded("conv_1", tuple(items_of("c"))))
    submit(ConversationItemsAdded("conv_gone", tuple(items_of("x"))))  # no such conversation
    submit(ConversationSaved(StoredConversation("conv_1", 5.0, {"n": "m"}, "alice")))
    submit(ConversationItemDeleted("conv_1", "msg_b"))
    assert await reader.conversation("conv_1", "alice") == StoredConversation(
        "conv_1", 5.0, {"n": "m"}, "alice"
    )
    assert await reader.conversation("conv_1", "bob") is None
    assert await reader.conversation("conv_1", None) is not None  # a shared proxy reads all
    assert [i["id"] for i in await reader.conversation_items("conv_1")] == ["msg_a", "msg_c"]
    assert await reader.conversation_items("conv_gone") == []
    submit(ConversationDeleted("conv_1"))
    assert await reader.conversation("conv_1", "alice") is None
    assert await reader.conversation_items("conv_1") == []


async def test_a_create_call_continues_its_conversation(
    store: tuple[ConversationReader, Any],
) -> None:
    reader, submit = store
    submit(ConversationSaved(StoredConversation("conv_1", 5.0, {}, "alice")))
    submit(ConversationItemsAdded("conv_1", tuple(items_of("a"))))
    body: dict[str, Any] = {"model": "m", "input": "next", "conversation": {"id": "conv_1"}}
    target, own, error = await inline_conversation(body, reader, "alice", CountingIds())
    assert error is None and target == "conv_1"
    assert body == {
        "model": "m",
        "input": [
            {"type": "message", "role": "user", "content": []},
            {"id": own[0]["id"], "role": "user", "type": "message",
             "content": [{"type": "input_text", "text": "next"}]},
        ],
    }  # fmt: skip
    for sent, status, param in [
        ({"input": "x", "conversation": "conv_1"}, 404, "conversation"),  # Bob's view
        ({"input": "x", "conversation": 7}, 400, "conversation"),
        ({"input": "x", "conversation": "conv_1", "previous_response_id": "r"}, 400, None),
    ]:
        _, _, refused = await inline_conversation(sent, reader, "bob", CountingIds())
        assert refused is not None and refused.status == status
        assert param is None or refused.param == param
    _, _, unknown = await inline_conversation(
        {"input": "x", "conversation": "conv_9"}, reader, "alice", CountingIds()
    )
    assert unknown is not None and unknown.status == 404 and unknown.code == "not_found"
