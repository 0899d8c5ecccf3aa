"""A body that extends a kept one parses to exactly what ``orjson.loads`` makes of it, turn
after turn, whatever lies between and around the conversation array, and only a body that
really extends the kept one reuses its parse."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmitm.wire.growing import GrowingBodies, _unchanged

FILLER = "words of a long history " * 200


def item(n: int) -> dict[str, Any]:
    return {"role": "user" if n % 2 else "assistant", "content": f"{n} {FILLER}"}


def body(items: list[Any], **around: Any) -> bytes:
    return orjson.dumps({"model": "m", "input": items, "tools": [{"type": "function"}], **around})


def same(grown: Any, content: bytes) -> bool:
    return orjson.dumps(grown.body) == orjson.dumps(orjson.loads(content))


def twenty_items_kept() -> tuple[GrowingBodies, bytes]:
    """Bodies that keep one of twenty items, and that body's bytes."""
    bodies = GrowingBodies()
    kept = body([item(n) for n in range(20)])
    bodies.parse(kept)
    return bodies, kept


def parses_as_orjson(bodies: GrowingBodies, content: bytes) -> None:
    """``bodies.parse(content)`` gives what ``orjson.loads`` does, keys in its order, or
    refuses what it refuses."""
    try:
        expected = orjson.loads(content)
    except orjson.JSONDecodeError:
        with pytest.raises(orjson.JSONDecodeError):
            bodies.parse(content)
        return
    grown = bodies.parse(content)
    assert orjson.dumps(grown.body) == orjson.dumps(expected)
    assert list(grown.body) == list(expected)


@pytest.mark.parametrize("checked", [False, True])
def test_a_growing_conversation_reuses_the_last_turns_items(checked: bool) -> None:
    bodies = GrowingBodies(checked=checked)
    items: list[Any] = []
    for turn in range(30):
        items += [item(2 * turn), item(2 * turn + 1)]
        content = body(items)
        grown = bodies.parse(content)
        assert same(grown, content)
        assert grown.name == "input"
        # The first turn is parsed whole; the second proves the first's split and reuses it.
        assert grown.reused == (0 if turn == 0 else 2 * turn)
        if checked:
            assert grown.item_bytes == [orjson.dumps(i) for i in items]
        grown.attach([turn] * len(items))
        if turn:
            assert grown.previous == [turn - 1] * (2 * turn)


@pytest.mark.parametrize("checked", [False, True])
def test_fields_after_the_array_may_change_every_turn(checked: bool) -> None:
    """Codex sends per-request metadata after its ``input``: a turn is still the last one's
    items and its own, and the next turn extends it in turn."""
    bodies = GrowingBodies(checked=checked)
    items: list[Any] = []
    for turn in range(12):
        items += [item(2 * turn), item(2 * turn + 1)]
        metadata = {"turn_id": f"t{turn}", "started_ms": 1796015878385 + turn * 977}
        content = body(items, client_metadata=metadata, **({"store": False} if turn % 3 else {}))
        grown = bodies.parse(content)
        assert same(grown, content) and list(grown.body) == list(orjson.loads(content))
        assert grown.reused == (0 if turn == 0 else 2 * turn)
        grown.attach([turn] * len(items))
        if turn:
            assert grown.previous == [turn - 1] * (2 * turn)
        if checked:
            grown.body["client_metadata"]["turn_id"] = "changed by the caller"


def test_a_field_repeated_after_the_array_is_not_carried_to_the_next_turn() -> None:
    bodies = GrowingBodies()
    items = [item(n) for n in range(20)]
    first = body(items)
    bodies.parse(first)
    close = len(first) - len(b'],"tools":[{"type":"function"}]}')
    second = first[:close] + b',{"a":1}],"model":"other"}'
    assert bodies.parse(second).body["model"] == "other"
    third = second[: -len(b'],"model":"other"}')] + b',{"b":2}],"tools":[3]}'
    grown = bodies.parse(third)
    assert same(grown, third) and grown.body["model"] == "m"


@pytest.mark.parametrize(
    "rest",
    [
        # A repeated array key after it: the whole parse takes the later one.
        b',{"a":1}],"input":[0,{"b":2}],"tools":[1]}',
        b'],"input":[{"a":1}],"tools":[1]}',
        # A field before the array repeated after it: the later value wins.
        b',{"a":1}],"model":"other"}',
        b',{"a":1}],"tools":[1],"tools":[2]}',
        b'],"tools":[1]',  # not closed
        b',{"a":1}]}',
        b',{"a":1}] , "tools" : 1 }',  # spaced: parsed whole
        b'],"tools":1}trailing',
        # Spelt otherwise than orjson does, 3 bytes shorter: as long as the last item.
        b',{"a":1},{}],"t":1E3}',
    ],
)
def test_new_fields_after_the_array_are_taken_only_where_they_are(rest: bytes) -> None:
    bodies, kept = twenty_items_kept()
    parses_as_orjson(bodies, kept[: -len(b'],"tools":[{"type":"function"}]}')] + rest)


def test_a_caller_that_changed_an_item_gets_a_whole_parse_next_turn() -> None:
    bodies = GrowingBodies(checked=True)
    items = [item(n) for n in range(20)]
    first = bodies.parse(body(items))
    first.body["input"][3]["content"] = "changed in place"
    first.body["tools"].append("changed too")
    items.append(item(20))
    content = body(items)
    grown = bodies.parse(content)
    assert same(grown, content) and grown.reused == 0
    grown.body["tools"].append("changed")  # the kept fields are a private copy
    items.append(item(21))
    content = body(items)
    again = bodies.parse(content)
    assert same(again, content) and again.reused == 21


def test_items_of_any_type_are_handed_out_copied_by_their_type() -> None:
    """A ``type`` that is not a string (a list, an object: bad input the validator answers
    with a 400 later) is handed out as it is, never a crash."""
    bodies = GrowingBodies(checked=True, copied=frozenset({"reasoning"}))
    items = [
        item(0),
        {"type": [], "content": FILLER},
        {"type": {"a": 1}, "content": FILLER},
        {"type": "reasoning", "content": FILLER},
    ]
    for turn in range(3):
        content = body(items)
        grown = bodies.parse(content)
        assert same(grown, content)
        assert grown.body["input"][3] is not grown._kept.items[3]  # type: ignore[union-attr]
        items.append(item(turn + 1))


@pytest.mark.parametrize(
    "between",
    [
        b'],"input":[{"a":1}',  # closes the array and opens the key again
        b"]],[[0",  # closes the wrapper's arrays
        b"],[0",
        b",0.5",
        b",{}]}",
        b',"tail"',
        b",1",
    ],
)
def test_what_lies_between_is_parsed_where_it_lies(between: bytes) -> None:
    bodies, kept = twenty_items_kept()
    tail = b'],"tools":[{"type":"function"}]}'
    assert kept.endswith(tail)
    parses_as_orjson(bodies, kept[: -len(tail)] + between + tail)


def test_a_split_that_is_not_the_arrays_end_is_never_used() -> None:
    # The key after the array repeats an earlier one whose array ends where the guess does.
    items = [item(n) for n in range(20)]
    tricky = (
        b'{"x":1,"input":'
        + orjson.dumps(items)
        + b',"x":['
        + orjson.dumps(items)[1:-1]
        + b'],"tools":[1]}'
    )
    bodies = GrowingBodies()
    assert same(bodies.parse(tricky), tricky)
    longer = tricky[: -len(b'],"tools":[1]}')] + b"," + orjson.dumps(item(99)) + b'],"tools":[1]}'
    grown = bodies.parse(longer)
    assert same(grown, longer)


def test_spaced_and_small_bodies_are_parsed_whole() -> None:
    bodies = GrowingBodies()
    items = [item(n) for n in range(20)]
    spaced = json.dumps({"model": "m", "input": items, "tools": []}).encode()
    assert same(bodies.parse(spaced), spaced) and len(bodies) == 0
    small = body([item(1)])[:100]
    with pytest.raises(orjson.JSONDecodeError):
        bodies.parse(small)
    assert bodies.parse(b'{"input":[]}').body == {"input": []}


def test_kept_bodies_stay_within_the_budget() -> None:
    bodies = GrowingBodies(budget=600_000)
    for conversation in range(40):
        items = [{"role": "user", "content": f"{conversation} {FILLER}"}] * 20
        bodies.parse(body(items))
    assert len(bodies) > 0 and sum(3 * len(k.data) for k in bodies._kept.entries()) <= 600_000


values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=8,
)
items_st = st.dictionaries(
    st.sampled_from(["role", "content", "type", "id", "x"]), values, min_size=1
)


@settings(max_examples=150, deadline=None)
@given(
    turns=st.lists(
        st.tuples(
            st.lists(items_st, min_size=0, max_size=3),
            # Fields after the array that change from turn to turn (a client's metadata),
            # some of them repeating a field before it.
            st.dictionaries(st.sampled_from(["client_metadata", "model", "z"]), values, max_size=2),
        ),
        min_size=1,
        max_size=6,
    ),
    around=st.dictionaries(
        st.sampled_from(["tools", "store", "metadata", "input"]), values, max_size=3
    ),
    spaced=st.booleans(),
    checked=st.booleans(),
)
def test_random_growing_conversations_parse_as_orjson_does(
    turns: list[tuple[list[dict[str, Any]], dict[str, Any]]],
    around: dict[str, Any],
    spaced: bool,
    checked: bool,
) -> None:
    bodies = GrowingBodies(checked=checked)
    history: list[Any] = [{"content": FILLER * 2}]
    for added, trailing in turns:
        history += added
        fields = {"model": "m", **around, "input": history, "tools": around.get("tools")}
        fields.update(trailing)
        content = (
            json.dumps(fields, separators=(", ", ": ")).encode() if spaced else orjson.dumps(fields)
        )
        assert same(bodies.parse(content), content)


@pytest.mark.parametrize(
    ("now", "verdict"),
    [
        ([{"a": "xy"}, {"b": "z"}], True),
        ([{"a": "xY"}, {"b": "z"}], False),  # a value changed, same length
        ([{"a": "xyz"}, {"b": ""}], False),  # one longer, the next shorter: same total
        ([{"a": "xy"}, {"b": "z"}, {"c": 1}], False),  # one more
        ([{"a": "xy"}], False),  # one fewer
        ([{"a": "xy"}, {"b": 1.0}], False),
        ([{"a": "xy", "b": 1}], False),
    ],
)
def test_items_are_unchanged_only_when_each_serialises_as_it_did(
    now: list[Any], verdict: bool
) -> None:
    before = [orjson.dumps(part) for part in ({"a": "xy"}, {"b": "z"})]
    for group in (1, 2**20):
        assert _unchanged(now, before, group) is verdict
        assert _unchanged([], [], group) is True


@settings(max_examples=300, deadline=None)
@given(before=st.lists(items_st, max_size=5), now=st.lists(items_st, max_size=5))
def test_the_whole_list_check_is_the_item_by_item_one(
    before: list[dict[str, Any]], now: list[dict[str, Any]]
) -> None:
    kept = [orjson.dumps(part) for part in before]
    verdict = [orjson.dumps(part) for part in now] == kept
    # Checked in groups of every size: one item a group, a few, all at once.
    for group in (1, 8, 20, 64, 2**20):
        assert _unchanged(now, kept, group) == verdict
        assert _unchanged(before, kept, group)
