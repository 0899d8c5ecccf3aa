"""Input items found by id, with a history resent every turn indexed once: each item gets
an index row where it first comes with its bytes, every reader still finds every item (also
once that response is deleted or expired, or under another credential), and a changed item
under the same id is found as it now is."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from llmitm.responses_api.records import (
    ResponseDeleted,
    ResponseSaved,
    ResponsesPurged,
    StoredResponse,
    item_json,
)
from llmitm.store.input_index import InputIndex
from tests.store.backends import Backend

EXPIRES = 4e9  # turn t's response expires at EXPIRES + t: only a purge given a time ends it


class Conversation:
    """A client resending its items with their ids and bytes, as a proxy's request memo hands
    them on: the same bytes objects turn after turn."""

    def __init__(self, credential: str | None = None, name: str = "resp") -> None:
        self.credential = credential
        self.name = name
        self.items: list[dict[str, Any]] = []
        self.made: list[tuple[str | None, bytes]] = []
        self.turn = 0

    def add(self, item: dict[str, Any]) -> None:
        self.items.append(item)
        self.made.append(item_json(item))

    def next(self) -> StoredResponse:
        self.turn += 1
        t = self.turn
        for role in ("user", "assistant"):
            self.add({"id": f"msg_{t}_{role}", "type": "message", "role": role,
                      "content": f"turn {t}, the {role}'s words " * 4})  # fmt: skip
        return self.record()

    def record(self, status: str = "in_progress") -> StoredResponse:
        response_id = f"{self.name}_{self.turn}"
        response = {"id": response_id, "object": "response", "status": status, "output": []}
        turn, credential, made = float(self.turn), self.credential, list(self.made)
        return StoredResponse(
            response_id, response, list(self.items), None, turn, EXPIRES + turn, credential,
            input_json=made,
        )  # fmt: skip


async def test_a_resent_history_is_indexed_once_and_every_item_found(backend: Backend) -> None:
    conversation = Conversation()
    async with backend.store() as store:
        saved = [conversation.next() for _ in range(30)]
        for record in saved:
            store.submit(ResponseSaved(record))
        await store.flush()
        # The items, handed to the store as their parts, read back as they were.
        for record in saved[::7]:
            assert await store.response(record.id) == record
        # One row an item, where it first came: not one an item a turn (930 rows).
        assert backend.count("response_input_ids") == 60
        items = conversation.items
        assert await store.items([i["id"] for i in items]) == {i["id"]: i for i in items}
        # The last response saved again as its status changes keeps its rows.
        store.submit(ResponseSaved(conversation.record("completed")))
        await store.flush()
        assert backend.count("response_input_ids") == 60
        assert await store.items(["msg_30_user"]) == {"msg_30_user": items[-2]}


async def test_an_item_changed_under_its_id_is_found_as_it_now_is(backend: Backend) -> None:
    conversation = Conversation()
    async with backend.store() as store:
        for _ in range(5):
            store.submit(ResponseSaved(conversation.next()))
        edited = {**conversation.items[0], "content": "the user's words, edited"}
        conversation.items[0] = edited
        conversation.made[0] = item_json(edited)
        store.submit(ResponseSaved(conversation.next()))
        await store.flush()
        assert backend.count("response_input_ids") == 10 + 1 + 2
        assert await store.items(["msg_1_user"]) == {"msg_1_user": edited}


async def test_items_outlive_the_response_that_indexed_them(backend: Backend) -> None:
    conversation = Conversation()
    async with backend.store() as store:
        for _ in range(10):
            store.submit(ResponseSaved(conversation.next()))
        store.submit(ResponseDeleted("resp_1"))
        await store.flush()
        first = conversation.items[:2]
        # Its rows went with it; later responses resent the items without rows of their own.
        assert await store.items(["msg_1_user", "msg_1_assistant"]) == {i["id"]: i for i in first}
        store.submit(ResponsesPurged(now=EXPIRES + 5.5))  # resp_2 … resp_5 expire
        await store.flush()
        assert await store.response("resp_5") is None
        assert await store.items(["msg_3_user"]) == {"msg_3_user": conversation.items[4]}
        assert await store.items(["msg_missing"]) == {}
        # A delete or purge forgets where items were indexed: the next turn indexes them all.
        before = backend.count("response_input_ids")
        store.submit(ResponseSaved(conversation.next()))
        await store.flush()
        assert backend.count("response_input_ids") == before + 22


async def test_each_credential_finds_its_own_items(backend: Backend) -> None:
    ours, theirs = Conversation("fp-ours", "ours"), Conversation("fp-theirs", "theirs")
    async with backend.store() as store:
        for _ in range(3):
            store.submit(ResponseSaved(ours.next()))
            theirs.next()
        theirs.items[0] = {**theirs.items[0], "content": "theirs"}
        theirs.made[0] = item_json(theirs.items[0])
        store.submit(ResponseSaved(theirs.record()))
        await store.flush()
        # The same ids under another credential are indexed for it.
        assert backend.count("response_input_ids") == 6 + 6
        assert await store.items(["msg_1_user"], "fp-ours") == {"msg_1_user": ours.items[0]}
        assert await store.items(["msg_1_user"], "fp-theirs") == {"msg_1_user": theirs.items[0]}
        store.submit(ResponseDeleted("theirs_3"))
        await store.flush()
        assert await store.items(["msg_2_user"], "fp-theirs") == {}
        assert await store.items(["msg_2_user"], "fp-ours") == {"msg_2_user": ours.items[2]}


def key_of(item_id: str) -> int:
    return hash(item_id)


def test_an_item_is_indexed_again_when_forgotten_or_not_kept_as_bytes() -> None:
    conversation = Conversation()
    index = InputIndex(max_items=4)
    assert len(index.rows(conversation.next(), 1, key_of)) == 2
    assert len(index.rows(conversation.next(), 2, key_of)) == 2
    assert len(index.rows(conversation.next(), 3, key_of)) == 2
    # Four remembered: turn 1's items were forgotten first, and come back as new.
    assert [key for key, _ in index.rows(conversation.next(), 4, key_of)] == [
        key_of(i) for i in ("msg_1_user", "msg_1_assistant", "msg_4_user", "msg_4_assistant")
    ]
    unkept = StoredResponse("resp_x", {}, conversation.items, None, 9.0)
    assert len(index.rows(unkept, 9, key_of)) == len(conversation.items)


@pytest.mark.parametrize("failing", [False, True])
def test_a_failed_write_forgets_where_items_were_indexed(failing: bool) -> None:
    conversation = Conversation()
    index = InputIndex()
    with pytest.raises(RuntimeError) if failing else contextlib.nullcontext(), index.writing():
        index.rows(conversation.next(), 1, key_of)
        if failing:
            raise RuntimeError("the transaction rolled back")
    again = conversation.record()
    assert len(index.rows(again, 2, key_of)) == (2 if failing else 0)


def test_the_least_recently_saved_credential_is_forgotten_first() -> None:
    ours, theirs = Conversation("fp-ours", "ours"), Conversation("fp-theirs", "theirs")
    index = InputIndex(max_items=4)
    assert len(index.rows(ours.next(), 1, key_of)) == 2
    theirs.next()
    assert len(index.rows(theirs.next(), 2, key_of)) == 4  # four items: ours are forgotten
    assert len(index.rows(theirs.record(), 3, key_of)) == 0
    assert len(index.rows(ours.record(), 4, key_of)) == 2
