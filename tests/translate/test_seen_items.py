"""The memo of a resent history's items gives exactly what the whole walks give: the same
refusals (or none) from validation, the same stored items and ids, turn after turn."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmitm.responses_api.item_ids import HistoryIds
from llmitm.responses_api.items import input_items
from llmitm.translate.errors import TranslationError
from llmitm.translate.seen_items import ItemMemo
from llmitm.translate.validation import validate_request
from llmitm.wire.depth import MAX_DEPTH
from llmitm.wire.ids import CountingIds


def nested(levels: int) -> Any:
    value: Any = "deep"
    for _ in range(levels):
        value = [value]
    return value


texts = st.sampled_from(["continue", "ok", "", "ünïcode", "x" * 40])
good = st.one_of(
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
        lambda a: {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": a},
        texts,
    ),
    st.builds(lambda o: {"type": "function_call_output", "call_id": "c1", "output": o}, texts),
    st.builds(lambda t: {"role": "user", "content": t, "id": "msg_client"}, texts),
    st.just({"type": "additional_tools", "tools": [{"type": "function", "name": "f"}]}),
)
bad = st.one_of(
    st.just({"role": "user", "content": 5}),
    st.just({"type": "message", "role": "user", "content": [{"type": "input_text", "text": 1}]}),
    st.just({"type": "function_call_output", "call_id": "c1", "output": [{"text": True}]}),
    st.just({"type": "additional_tools", "tools": [5]}),
    st.just("not an object"),
    st.just({"role": "user", "content": nested(300)}),  # past what orjson serialises
    # Deep, and an item as deep as a body allows: whether it passes depends on its level.
    st.builds(
        lambda n: {"role": "user", "content": nested(n)},
        st.sampled_from([MAX_DEPTH - 4, MAX_DEPTH - 3, MAX_DEPTH - 2]),
    ),
)
items = st.one_of(good, good, good, bad)
tops = st.fixed_dictionaries(
    {"model": st.just("m")},
    optional={
        "instructions": st.sampled_from(["be brief", 3]),
        "tools": st.sampled_from(
            [
                [{"type": "function", "name": "g"}],
                [1],
                [{"type": "function", "name": "d", "parameters": nested(MAX_DEPTH - 2)}],
            ]
        ),
        "temperature": st.sampled_from([0.5, "hot"]),
    },
)
conversations = st.tuples(
    tops, st.lists(st.lists(items, min_size=1, max_size=3), min_size=1, max_size=8)
)


def outcome(body: dict[str, Any], memo: ItemMemo | None) -> tuple[Any, ...]:
    seen = None if memo is None else memo.see(body.get("input"))
    try:
        validate_request(body, "responses", seen)
    except TranslationError as error:
        return ("refused", error.message, error.param, error.code)
    stored = input_items(body["input"], CountingIds(), HistoryIds("fp", seen))
    return ("stored", orjson.dumps(stored))


@settings(max_examples=300, deadline=None)
@given(conversations, st.integers(min_value=1, max_value=4))
def test_the_memo_gives_exactly_the_whole_walks_results(conversation, budget_kib) -> None:
    top, turns = conversation
    memo, small = ItemMemo(), ItemMemo(budget=budget_kib * 1024)
    history: list[Any] = []
    for added in turns:
        history += added
        body = {**top, "input": history}  # fresh objects each time, as a parsed body is
        whole = outcome(copy.deepcopy(body), None)
        assert outcome(copy.deepcopy(body), memo) == whole
        assert outcome(copy.deepcopy(body), small) == whole
        assert outcome(copy.deepcopy(body), memo) == whole  # every item seen now


def test_a_resent_item_is_checked_once_and_an_item_replaced_after_is_not_taken_for_it() -> None:
    memo = ItemMemo()
    first = [{"role": "user", "content": "hi"}]
    seen = memo.see(first)
    assert seen is not None and not seen.valid(first[0])
    validate_request({"model": "m", "input": first}, "responses", seen)
    again = orjson.loads(orjson.dumps(first))
    seen = memo.see(again)
    assert seen is not None and seen.valid(again[0])
    # The same bytes as a new object (an item_reference resolved in place): not known.
    assert not seen.valid({"role": "user", "content": "hi"})
    assert memo.see("a string") is None


def test_a_refused_body_marks_nothing() -> None:
    memo = ItemMemo()
    body = {"model": "m", "input": [{"role": "user", "content": "hi"}], "temperature": "hot"}
    seen = memo.see(body["input"])
    with pytest.raises(TranslationError):
        validate_request(body, "responses", seen)
    again = [{"role": "user", "content": "hi"}]
    seen = memo.see(again)
    assert seen is not None and not seen.valid(again[0])
