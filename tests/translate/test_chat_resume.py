"""A growing history's translation to chat that goes on from the last turn's gives exactly
the whole translation: the same upstream body, byte for byte, and the same warnings, turn
after turn, whatever the items and however they join across the turns' boundary."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmitm.exchange.request import prepare_request
from llmitm.responses_api.create import SEALED_TYPES
from llmitm.routing.config import Endpoint
from llmitm.routing.plan import plan_for_endpoint
from llmitm.translate.context import TranslateOptions
from llmitm.translate.errors import TranslationError
from llmitm.wire import growing
from llmitm.wire.growing import GrowingBodies
from llmitm.wire.ids import CountingIds, fixed_clock

CHAT = Endpoint(
    name="e",
    kind="compatible",
    base_url="https://up.example/v1",
    apis=frozenset({"chat"}),
)
PLAN = plan_for_endpoint(CHAT, "responses", "m")
PADDING = {"note": "x" * 600}
"""Metadata first in every body (dropped for a chat upstream): bodies that start alike for
more than the bytes a growing parse finds its last body by."""

texts = st.sampled_from(["", "ok", "continue", "grüße — “quoted”", "x" * 30])
parts = st.one_of(
    st.builds(lambda t: {"type": "input_text", "text": t}, texts),
    st.builds(lambda t: {"type": "output_text", "text": t}, texts),
    st.builds(lambda t: {"type": "refusal", "refusal": t}, texts),
    st.just({"type": "input_image", "image_url": "data:image/png;base64,AAAA"}),
    st.just({"type": "surprise"}),
)
call_ids = st.sampled_from(["c1", "c2"])
ITEMS = st.one_of(
    st.builds(
        lambda r, t: {"role": r, "content": t},
        st.sampled_from(["user", "assistant", "system", "developer"]),
        texts,
    ),
    st.builds(
        lambda r, p: {"type": "message", "role": r, "content": p},
        st.sampled_from(["user", "assistant", "system"]),
        st.lists(parts, max_size=3),
    ),
    st.builds(
        lambda c, a: {"type": "function_call", "call_id": c, "name": "shell", "arguments": a},
        call_ids,
        st.one_of(texts, st.just({"cmd": "ls"})),
    ),
    st.builds(
        lambda c, t: {"type": "custom_tool_call", "call_id": c, "name": "patch", "input": t},
        call_ids,
        texts,
    ),
    st.builds(
        lambda c, o: {"type": "function_call_output", "call_id": c, "output": o},
        call_ids,
        st.one_of(texts, st.lists(parts, max_size=2)),
    ),
    st.builds(
        lambda t: {"type": "reasoning", "summary": [{"type": "summary_text", "text": t}]},
        texts,
    ),
    st.builds(
        lambda t: {"type": "reasoning", "content": [{"type": "reasoning_text", "text": t}]},
        texts,
    ),
    st.just({"type": "additional_tools", "tools": [{"type": "function", "name": "added"}]}),
    st.just({"type": "web_search_call", "id": "ws_1", "status": "completed"}),
    st.just({"type": "item_reference", "id": "msg_1"}),
    st.just({"role": "tool", "content": "a role chat has and Responses has not"}),
)


@st.composite
def conversations(draw: st.DrawFn) -> list[bytes]:
    """One conversation's bodies: each turn resends the last one's items and adds a few; now
    and then the instructions change, or the history is sent whole as another; the fields
    after the items (instructions, tools, metadata) differ from turn to turn."""
    instructions = draw(st.sampled_from([None, "Be brief.", ""]))
    items: list[Any] = []
    bodies = []
    for _ in range(draw(st.integers(1, 7))):
        items = [*items, *draw(st.lists(ITEMS, min_size=1, max_size=3))]
        if draw(st.integers(0, 5)) == 0:
            instructions = draw(st.sampled_from([None, "Be brief.", "Be thorough."]))
        body: dict[str, Any] = {"metadata": PADDING, "model": "m", "input": items}
        if instructions is not None:
            body["instructions"] = instructions
        if draw(st.booleans()):
            body["tools"] = [{"type": "function", "name": "shell"}]
        if draw(st.booleans()):
            body["stream"] = True
        if draw(st.booleans()):
            # Per-request metadata after the items, as Codex sends: new on every turn.
            body["client_metadata"] = {"turn_id": draw(st.uuids()).hex}
        bodies.append(orjson.dumps(body))
    return bodies


@pytest.fixture(autouse=True)
def every_body_grows() -> Any:
    """Every body, however small, parsed from the last one it extends."""
    smallest = growing.SMALLEST
    growing.SMALLEST = 0
    yield
    growing.SMALLEST = smallest


def options() -> TranslateOptions:
    return TranslateOptions(ids=CountingIds(), clock=fixed_clock(1_750_000_000))


def prepared(content: bytes, bodies: GrowingBodies | None) -> tuple[bytes, list[str]] | str:
    """The upstream body and the warnings, or the refusal, for ``content`` (from a growing
    parse that carries the translation when ``bodies`` is given)."""
    grown = bodies.parse(content) if bodies is not None else None
    body = grown.body if grown is not None else orjson.loads(content)
    try:
        result = prepare_request(content, body, "m", PLAN, options(), grown=grown)
    except TranslationError as exc:
        return exc.message
    return result.content, result.warnings


def prepared_twice(content: bytes, bodies: GrowingBodies) -> list[tuple[bytes, list[str]] | str]:
    """What two endpoints of a failover route are sent for one growing parse: each goes on
    from the same last turn."""
    grown = bodies.parse(content)
    results: list[tuple[bytes, list[str]] | str] = []
    for _ in range(2):
        try:
            result = prepare_request(content, grown.body, "m", PLAN, options(), grown=grown)
        except TranslationError as exc:
            results.append(exc.message)
        else:
            results.append((result.content, result.warnings))
    return results


@settings(max_examples=400, deadline=None)
@given(conversations())
def test_going_on_from_the_last_turn_gives_the_whole_translation(bodies: list[bytes]) -> None:
    growing_bodies = GrowingBodies(checked=True, copied=SEALED_TYPES)
    for content in bodies:
        whole = prepared(content, None)
        assert prepared_twice(content, growing_bodies) == [whole, whole]


CALL = {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{}"}
IMAGE = {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}


@pytest.mark.parametrize(
    ("last", "following"),
    [
        pytest.param(
            {"type": "function_call_output", "call_id": "c1", "output": [IMAGE]},
            {"role": "user", "content": "and?"},
            id="a tool's image waiting for the run of tool results to end",
        ),
        pytest.param(
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "hmm"}]},
            {"role": "assistant", "content": "so"},
            id="reasoning waiting for the assistant's message",
        ),
        pytest.param(
            {"role": "assistant", "content": "let me look"},
            CALL,
            id="a call joining the assistant's text",
        ),
        pytest.param(CALL, {"role": "assistant", "content": "then"}, id="text joining calls"),
        pytest.param(
            {"type": "web_search_call", "id": "ws_1", "status": "completed"},
            {"type": "web_search_call", "id": "ws_2", "status": "completed"},
            id="hosted tool items dropped on both sides",
        ),
    ],
)
def test_what_joins_across_the_turns_boundary(last: Any, following: Any) -> None:
    history: list[Any] = [{"role": "user", "content": "go"}, CALL, last]
    growing_bodies = GrowingBodies(checked=True, copied=SEALED_TYPES)
    for items in (history, [*history, following], [*history, following, following]):
        content = orjson.dumps({"metadata": PADDING, "model": "m", "input": items})
        whole = prepared(content, None)
        assert prepared_twice(content, growing_bodies) == [whole, whole]


def test_a_resent_history_goes_on_from_the_last_turn() -> None:
    """The second turn translates only its new items: its resent messages are the last
    turn's objects, spelt once."""
    history: list[Any] = [
        {"role": "user", "content": "list the files"},
        {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
        {"role": "assistant", "content": "one file"},
    ]
    bodies = GrowingBodies(checked=True, copied=SEALED_TYPES)
    first = bodies.parse(orjson.dumps({"metadata": PADDING, "model": "m", "input": history}))
    prepare_request(b"", first.body, "m", PLAN, options(), grown=first)
    history.append({"role": "user", "content": "and now?"})
    content = orjson.dumps({"metadata": PADDING, "model": "m", "input": history})
    second = bodies.parse(content)
    resume = second.carried
    assert resume is not None and resume.count == 4
    result = prepare_request(content, second.body, "m", PLAN, options(), grown=second)
    assert result.content == prepared(content, None)[0]
    carried = second._kept.carried if second._kept is not None else None
    assert carried is not None and carried.count == 5
    # The user's, the calls' and the tool's messages are the last turn's objects; the last
    # assistant's, which a later item could have joined, was copied before it could change.
    assert len(resume.messages) == 4
    assert all(a is b for a, b in zip(carried.messages[:3], resume.messages[:3], strict=True))
    assert carried.messages[3] is not resume.messages[3]
    assert carried.messages[3] == resume.messages[3]
    assert all(a is b for a, b in zip(carried.texts[:3], resume.texts[:3], strict=True))
