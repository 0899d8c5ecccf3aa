"""Ids of a resent history's input items: derived from the history, the same every turn,
and a recording made before still replays the ids it was handed."""

from __future__ import annotations

import dataclasses

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from llmitm.responses_api.create import HISTORY_IDS_MARKER, prepare_create
from llmitm.responses_api.item_ids import HistoryIds
from llmitm.responses_api.items import history_input_items, input_items
from llmitm.responses_api.records import ResponseSaved, StoredResponse
from llmitm.responses_api.seal import ReasoningSeal
from llmitm.store.memory_responses import MemoryResponses
from llmitm.store.response_rows import serialised
from llmitm.wire.ids import CountingIds, Mint

MARKER = HISTORY_IDS_MARKER

texts = st.sampled_from(["continue", "ok", "run the tests", "", "ünïcode", "x" * 50])
items = st.one_of(
    st.builds(
        lambda r, t: {"role": r, "content": t}, st.sampled_from(["user", "assistant"]), texts
    ),
    st.builds(
        lambda t: {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": t}],
        },
        texts,
    ),
    st.builds(
        lambda c, a: {"type": "function_call", "call_id": c, "name": "shell", "arguments": a},
        st.sampled_from(["call_1", "call_2"]),
        texts,
    ),
    st.builds(
        lambda c, o: {"type": "function_call_output", "call_id": c, "output": o},
        st.sampled_from(["call_1", "call_2"]),
        texts,
    ),
    st.builds(lambda t: {"role": "user", "content": t, "id": "msg_client"}, texts),
)
# Few distinct items: repeats within a turn are common, as in a real agent's history.
turns = st.lists(st.lists(items, min_size=1, max_size=4), min_size=1, max_size=8)


def without_ids(stored: list[dict]) -> bytes:
    return orjson.dumps([{k: v for k, v in item.items() if k != "id"} for item in stored])


@settings(max_examples=200, deadline=None)
@given(turns)
def test_a_growing_conversation_keeps_its_ids_and_stores_the_same_items(added):
    history: list[dict] = []
    before: list[dict] = []
    for new in added:
        history += new
        derived = input_items(orjson.loads(orjson.dumps(history)), CountingIds(), HistoryIds("fp"))
        minted = input_items(orjson.loads(orjson.dumps(history)), CountingIds())
        # The stored items are those of the minted path but for the ids of items sent without.
        assert without_ids(derived) == without_ids(minted)
        for sent, item, other in zip(history, derived, minted, strict=True):
            if sent.get("id"):
                assert item["id"] == sent["id"]
            else:
                assert item["id"].split("_")[0] == other["id"].split("_")[0]
                assert len(item["id"].split("_", 1)[1]) == 48
        # A resent item keeps the id it had last turn.
        assert [i["id"] for i in derived[: len(before)]] == [i["id"] for i in before]
        # Items sent without an id never share one, equal items included.
        own = [i["id"] for s, i in zip(history, derived, strict=True) if not s.get("id")]
        assert len(set(own)) == len(own)
        before = derived


@settings(max_examples=200, deadline=None)
@given(turns, st.sampled_from(["fp", None]))
def test_resent_items_are_taken_from_the_last_turn_as_they_would_be_made(added, scope):
    # Each turn goes on from what the last one stored (as the create path does with the
    # growing parse's attached values): the items are those made from scratch, and the
    # resent ones are the very objects stored last turn.
    history: list[dict] = []
    resent: list = []
    for new in added:
        history += new
        sent = orjson.loads(orjson.dumps(history))
        made = input_items(orjson.loads(orjson.dumps(history)), CountingIds(), HistoryIds(scope))
        stored, marks = history_input_items(sent, CountingIds(), HistoryIds(scope), scope, resent)
        assert orjson.dumps(stored) == orjson.dumps(made)
        assert [m.stored for m in marks] == stored
        assert all(a is b.stored for a, b in zip(stored, resent, strict=False))
        # The store is given each item's JSON, made when it was new, as the parts of what it
        # would have serialised from the items.
        record = StoredResponse("resp_1", {"id": "resp_1"}, stored, None, 0.0)
        joined = dataclasses.replace(record, input_json=[m.json for m in marks])
        ids, items, response = serialised(joined, chunked=True)
        assert (ids, bytes(items), response) == serialised(record, chunked=True)
        resent = marks


def test_marks_of_another_scope_are_not_taken() -> None:
    items = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    _, theirs = history_input_items(items[:1], CountingIds(), HistoryIds("a"), "a")
    mine, _ = history_input_items(items, CountingIds(), HistoryIds("b"), "b", theirs)
    fresh = input_items(items, CountingIds(), HistoryIds("b"))
    assert mine == fresh and mine[0] is not theirs[0].stored


def test_the_prefix_names_the_item_type_and_another_credential_gets_other_ids():
    sent = [
        {"role": "user", "content": "hi"},
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": "done"},
        {"type": "reasoning", "summary": []},
    ]
    mine = input_items(sent, CountingIds(), HistoryIds("a"))
    theirs = input_items(sent, CountingIds(), HistoryIds("b"))
    assert [i["id"].split("_")[0] for i in mine] == ["msg", "fc", "fco", "rs"]
    assert not {i["id"] for i in mine} & {i["id"] for i in theirs}
    # The same item after another history is another item.
    other = input_items([{"role": "user", "content": "x"}, *sent], CountingIds(), HistoryIds("a"))
    assert not {i["id"] for i in mine} & {i["id"] for i in other[1:]}


def test_a_recording_notes_the_marker_and_only_a_marked_one_replays_with_derived_ids():
    recording = Mint()
    assert recording.marked(MARKER)
    assert recording.tape == {MARKER: [True]}
    assert Mint(recording.tape).marked(MARKER)
    # Made before: its tape has a minted id per input item, handed out again in order.
    old = Mint({"msg": ["msg_recorded1", "msg_recorded2"]})
    assert not old.marked(MARKER)
    assert MARKER not in old.tape
    stored = input_items([{"role": "user", "content": "a"}], old.id)
    assert stored[0]["id"] == "msg_recorded1"
    assert old.id("msg") == "msg_recorded2"  # the answer's message id, as recorded


async def test_a_create_call_derives_ids_only_when_its_input_is_the_whole_conversation():
    memory = MemoryResponses()
    response = {"id": "r1", "object": "response", "output": []}
    memory.apply(ResponseSaved(StoredResponse("r1", response, [], None, 1.0)))

    async def sealer() -> ReasoningSeal:
        return ReasoningSeal()

    async def ids_of(body: dict, derive: bool) -> list[str]:
        create, _ = await prepare_create(
            body, memory, sealer, store_default=True, ids=CountingIds(), history_ids=derive
        )
        return [item["id"] for item in create.input_items]

    whole = [{"role": "user", "content": "continue"}]
    assert (await ids_of({"input": whole}, True))[0].startswith("msg_")
    assert await ids_of({"input": whole}, True) != ["msg_0001"]
    assert await ids_of({"input": whole}, False) == ["msg_0001"]
    chained = {"input": whole, "previous_response_id": "r1"}
    assert await ids_of(chained, True) == ["msg_0001"]  # only the new items: minted
    conversation = {"input": whole, "conversation": "conv_1"}
    assert await ids_of(conversation, True) == ["msg_0001"]


def test_the_memory_store_keeps_the_items_once() -> None:
    # The items' JSON is for a store that serialises; held in memory it is a second copy.
    stored, marks = history_input_items(
        [{"role": "user", "content": "hi"}], CountingIds(), HistoryIds("fp"), "fp"
    )
    record = StoredResponse(
        "resp_1", {"id": "resp_1"}, stored, None, 0.0, input_json=[m.json for m in marks]
    )
    memory = MemoryResponses()
    memory.apply(ResponseSaved(record))
    kept = memory._responses["resp_1"]
    assert kept == record and kept.input_json is None
