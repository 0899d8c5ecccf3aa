"""The request memo: a growing conversation's redaction and match keys reuse the parts
earlier turns had, and come out exactly as the whole-body functions make them."""

from __future__ import annotations

import json
from collections.abc import Iterator

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmitm.replay.capture import ClientRequest, see_request
from llmitm.replay.keys import KeyOptions, match_key
from llmitm.replay.memo import RequestMemo
from llmitm.wire import growing, spliced
from llmitm.wire.bytes_lru import ENTRY
from llmitm.wire.depth import MAX_DEPTH
from llmitm.wire.redact import PLACEHOLDER, redact_body

KEY = "sk-proj-" + "A1b2C3d4" * 5
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"

# Strings with what redaction and the key's numbering look for: credentials, volatile
# values that repeat across items, and text outside ASCII (escaped by some clients).
TEXTS = st.one_of(
    st.sampled_from(
        [
            "hello",
            f"my key is {KEY}",
            f"Bearer {JWT}",
            "call_abc123def456 then msg_0001aa22bb33",
            "msg_0001aa22bb33",
            "resp_77777777aaaa",
            "2025-01-02T03:04:05Z and 2025-01-02",
            "123e4567-e89b-12d3-a456-426614174000",
            "grüße, 東京",
            PLACEHOLDER,
            "",
        ]
    ),
    st.text(max_size=30),
)
SCALARS = st.one_of(TEXTS, st.sampled_from([True, False, 1, 0, 1.0, None, 2**40]))
NAMES = st.sampled_from(
    ["content", "text", "id", "api_key", "password", "max_tokens", "status", "arguments"]
)


def values(depth: int = 3) -> st.SearchStrategy[object]:
    if depth == 0:
        return SCALARS
    inner = values(depth - 1)
    return st.one_of(
        SCALARS,
        st.lists(inner, max_size=3),
        st.dictionaries(NAMES, inner, max_size=3),
    )


ITEMS = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]), "content": TEXTS}),
    st.fixed_dictionaries(
        {"id": TEXTS, "type": st.just("message"), "content": st.lists(values(2), max_size=3)}
    ),
    st.fixed_dictionaries(
        {
            "type": st.just("message"),
            "content": TEXTS,
            "internal_chat_message_metadata_passthrough": st.dictionaries(NAMES, SCALARS),
        }
    ),
    st.dictionaries(NAMES, values(2), max_size=4),
)
OPTIONS = st.sampled_from(
    [
        KeyOptions(),
        KeyOptions(profile="strict"),
        KeyOptions(profile="loose"),
        KeyOptions(volatile=False),
        KeyOptions(ignore=("tools.*.description", "input.*.content", "temperature")),
        KeyOptions(ignore=("input.0",)),  # names an item by index: the whole body is walked
        KeyOptions(ignore=("*.*.id",)),
    ]
)
SPELLINGS = st.sampled_from(["orjson", "ascii", "indent"])


def spell(body: dict[str, object], spelling: str) -> bytes:
    if spelling == "orjson":
        return orjson.dumps(body)
    if spelling == "ascii":  # every non-ASCII character as a \u escape
        return json.dumps(body).encode()
    return json.dumps(body, indent=1, ensure_ascii=False).encode()


@st.composite
def conversations(draw: st.DrawFn) -> list[bytes]:
    """Bodies of one conversation: each turn resends the last turn's items and adds a few;
    now and then another field, or an earlier item, changes; the metadata after the array
    may change every turn."""
    sequence = draw(st.sampled_from(["input", "messages"]))
    top: dict[str, object] = {}
    if draw(st.booleans()):
        # Bodies that start alike for longer than a growing parse's head, as an agent's do:
        # each is parsed from the last, and the canonical walk goes on from the last's.
        top["metadata"] = {"note": "x" * 600, "id": draw(TEXTS)}
    top |= {
        "model": "gpt-4.1",
        "instructions": draw(TEXTS),
        sequence: [],
        "tools": [{"type": "function", "name": "f", "description": draw(TEXTS)}],
    }
    if draw(st.booleans()):
        top["api_key"] = draw(st.sampled_from([KEY, PLACEHOLDER, ""]))
    bodies = []
    for _ in range(draw(st.integers(2, 6))):
        top[sequence] = [*top[sequence], *draw(st.lists(ITEMS, min_size=1, max_size=3))]
        if draw(st.integers(0, 4)) == 0 and top[sequence]:
            at = draw(st.integers(0, len(top[sequence]) - 1))
            top[sequence][at] = draw(ITEMS)
        if draw(st.integers(0, 4)) == 0:
            top["temperature"] = draw(st.sampled_from([1, 1.0, True, 0.5]))
        if draw(st.booleans()):
            # Per-request metadata after the array, as Codex sends: new on every turn, now
            # and then holding a credential.
            top["client_metadata"] = {
                "turn_id": draw(TEXTS),
                "token": draw(st.sampled_from(["", KEY])),
            }
        bodies.append(spell(top, draw(SPELLINGS)))
    return bodies


@pytest.fixture(autouse=True, scope="module", params=["whole", "grown"])
def parse_growing_bodies(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each test twice: with bodies parsed whole, and with every body (however small) parsed
    from the last one it extends (:mod:`llmitm.wire.growing`)."""
    smallest = growing.SMALLEST
    growing.SMALLEST = 0 if request.param == "grown" else smallest
    yield
    growing.SMALLEST = smallest


def request(content: bytes) -> ClientRequest:
    return ClientRequest("POST", "/v1/responses", "http://x/v1/responses", "x", [], content)


@settings(max_examples=300, deadline=None)
@given(conversations(), st.lists(OPTIONS, min_size=1, max_size=2))
def test_the_memo_gives_exactly_the_whole_body_results(
    bodies: list[bytes], options: list[KeyOptions]
) -> None:
    memo = RequestMemo()
    for content in bodies:
        for option in options:
            whole = see_request(request(content), option, None)
            reused = see_request(request(content), option, None, memo)
            assert reused.key == whole.key
            assert reused.message.content == whole.message.content
            assert reused.clean == whole.clean
        assert memo.redact(content) in (None, redact_body(content))
        parts = memo._parts.kept().values()
        assert memo._parts.held == sum(ENTRY + len(p.data) + p.forms_cost() for p in parts)


@settings(max_examples=60, deadline=None)
@given(conversations())
def test_a_memo_too_small_for_one_body_still_gives_the_same_results(bodies: list[bytes]) -> None:
    memo = RequestMemo(budget=64)
    for content in bodies:
        whole = see_request(request(content), KeyOptions(), None)
        assert see_request(request(content), KeyOptions(), None, memo).key == whole.key
        assert memo._parts.held <= memo._parts.budget


def test_a_resent_history_reuses_its_parts() -> None:
    memo = RequestMemo()
    history = [{"role": "user", "content": f"turn {n} msg_{n:012d}"} for n in range(20)]
    first = orjson.dumps({"model": "m", "input": history})
    second = orjson.dumps({"model": "m", "input": [*history, {"role": "user", "content": "new"}]})
    memo.see(first, KeyOptions())
    kept = memo._parts.kept()
    seen = memo.see(second, KeyOptions())
    assert seen is not None
    # Every item of the first body is the same part, with the canonical form it had.
    assert all(memo._parts.kept()[key] is part for key, part in kept.items())
    assert seen.canonical["input"][19] is kept_form(kept, history[19])
    whole = match_key("POST", "/v1/responses", [], second, KeyOptions())
    reused = match_key(
        "POST", "/v1/responses", [], seen.content, KeyOptions(),
        parsed=seen.body, redacted=True, canonical=seen.canonical,
    )  # fmt: skip
    assert reused == whole
    assert "<id:20>" in whole.canonical and "<id:21>" not in whole.canonical


def kept_form(parts: dict, item: dict) -> object:
    data = orjson.dumps(item)
    (part,) = [p for p in parts.values() if p.data == data]
    return part.keyed[KeyOptions()].form


def test_a_part_holding_a_credential_is_not_kept() -> None:
    memo = RequestMemo()
    body = orjson.dumps({"model": "m", "input": [{"role": "user", "content": f"key {KEY}"}]})
    seen = memo.see(body, KeyOptions())
    assert seen is not None and KEY.encode() not in seen.content
    assert [part.data for part in memo._parts.kept().values()] == [b'"m"']  # the model only


def test_bodies_the_memo_does_not_take() -> None:
    memo = RequestMemo()
    assert memo.see(b'{"model": "m", "prompt": "x"}', KeyOptions()) is None  # no array of items
    assert memo.see(b"[1, 2]", KeyOptions()) is None
    assert memo.see(b"{not json", KeyOptions()) is None
    assert memo.see(b'{"input": []}', KeyOptions(ignore=("input",))) is None
    deep: object = "x"
    for _ in range(MAX_DEPTH):
        deep = [deep]
    assert memo.see(orjson.dumps({"input": [deep]}), KeyOptions()) is None  # redacted as bytes
    # Deeper than orjson writes (255 levels; it reads 1024): not taken either, not raised.
    deeper = b'{"input": [' + b"[" * 300 + b'"x"' + b"]" * 300 + b"]}"
    assert memo.see(deeper, KeyOptions()) is None


def test_parts_alike_at_both_ends_are_told_apart_and_all_kept() -> None:
    # An agent's tool outputs often share their length, their first bytes and their last.
    memo = RequestMemo()
    items = [{"role": "tool", "content": "x" * 200 + f"{n:04d}" + "y" * 200} for n in range(50)]
    body = orjson.dumps({"model": "m", "input": items})
    memo.see(body, KeyOptions())
    kept = memo._parts.kept()
    assert len(kept) == 51  # every item, and the model
    memo.see(body, KeyOptions())
    assert all(memo._parts.kept()[key] is part for key, part in kept.items())


def test_a_key_spliced_from_item_texts_is_the_whole_one_at_its_edges() -> None:
    """An empty conversation array, and a client that sends the text standing in for the
    array while the fields around it are spelt: the same key as the whole body's."""
    memo = RequestMemo()
    for body in (
        {"model": "m", "input": [], "instructions": "x"},
        {"model": "m", "input": [{"role": "user", "content": "hi"}], "include": [spliced.SLOT]},
    ):
        content = orjson.dumps(body)
        whole = see_request(request(content), KeyOptions(), None)
        reused = see_request(request(content), KeyOptions(), None, memo)
        assert reused.key == whole.key


def test_a_walk_goes_on_only_from_the_same_parts() -> None:
    """The canonical walk of a body goes on from the last one's only where its parts are
    the very objects that walk reached through, under the same options."""
    memo = RequestMemo()
    pad = {"note": "x" * 9000}  # past the size a growing parse keeps bodies from
    history = [{"role": "user", "content": f"turn {n} call_{n:012d}"} for n in range(3)]
    memo.see(orjson.dumps({"metadata": pad, "model": "m", "input": history}), KeyOptions())
    grown = memo._bodies.parse(
        orjson.dumps({"metadata": pad, "model": "m", "input": [*history, {"role": "user"}]})
    )
    reached = grown.carried
    assert reached is not None and len(reached.items) == 3
    before, items = list(reached.before), [*reached.items, reached.items[0]]
    assert reached.goes_on(KeyOptions(), before, items)
    assert not reached.goes_on(KeyOptions(profile="strict"), before, items)
    assert not reached.goes_on(KeyOptions(), before, items[:2])
    other = memo._part("input", True, {"role": "user", "content": "other"})
    assert not reached.goes_on(KeyOptions(), before, [other, *items[1:]])
    assert not reached.goes_on(KeyOptions(), [other, *before[1:]], items)
    assert not reached.goes_on(KeyOptions(), [*before, other], items)
