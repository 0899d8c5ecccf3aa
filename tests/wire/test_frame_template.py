"""The byte template of text chunks: learned only where it is unambiguous, read only when the
slot holds exactly one string literal (the pipeline-level equality is in test_fast_path)."""

from __future__ import annotations

import orjson
from hypothesis import given
from hypothesis import strategies as st

from llmitm.wire.frame_template import StringSlotTemplate

PATH = ("choices", 0, "delta", "content")


def _frame(data: bytes) -> tuple[bytes, bytes]:
    frame = b"data: " + data + b"\n\n"
    return frame, frame[6:-2]


def _chunk(content: str, chunk_id: str = "c1") -> bytes:
    return orjson.dumps({"id": chunk_id, "choices": [{"index": 0, "delta": {"content": content}}]})


def test_learns_the_slot_and_reads_other_text() -> None:
    template = StringSlotTemplate.learn(*_frame(_chunk("Hello")), PATH)
    assert template is not None
    assert template.value(_frame(_chunk('a "quoted" \\ é 😀'))[0]) == 'a "quoted" \\ é 😀'
    assert template.value(_frame(_chunk("x", chunk_id="c2"))[0]) is None  # other constant bytes


def test_a_key_lookalike_inside_a_string_is_not_the_slot() -> None:
    data = _chunk("Hello", chunk_id='x","content":"decoy')
    template = StringSlotTemplate.learn(*_frame(data), PATH)
    assert template is not None
    assert b"decoy" in template.prefix
    frame = _frame(data.replace(b'"Hello"', b'"Bye"'))[0]
    assert template.value(frame) == "Bye"


def test_a_duplicate_key_takes_the_slot_that_wins() -> None:
    data = b'{"choices":[{"delta":{"content":"first","content":"second"}}]}'
    template = StringSlotTemplate.learn(*_frame(data), PATH)
    assert template is not None
    assert template.value(_frame(data.replace(b"second", b"other"))[0]) == "other"
    assert template.value(_frame(data.replace(b"first", b"other"))[0]) is None


def test_spaced_and_ascii_escaped_json() -> None:
    data = b'{"id": "c", "choices": [{"delta": {"content": "caf\\u00e9"}}]}'
    template = StringSlotTemplate.learn(*_frame(data), PATH)
    assert template is not None
    assert template.value(_frame(data.replace(b"caf\\u00e9", b"\\ud83d\\ude00"))[0]) == "😀"


def test_no_template_without_a_string_at_the_path() -> None:
    assert StringSlotTemplate.learn(*_frame(b'{"choices":[{"delta":{}}]}'), PATH) is None
    assert StringSlotTemplate.learn(*_frame(b'{"choices":[{"delta":{"content":1}}]}'), PATH) is None
    assert StringSlotTemplate.learn(*_frame(b"[1]"), PATH) is None
    frame, data = _frame(_chunk("a"))
    assert StringSlotTemplate.learn(frame, data[1:], PATH) is None  # data not the frame's line


@given(slot=st.binary(max_size=12))
def test_reads_only_a_lone_string_literal(slot: bytes) -> None:
    template = StringSlotTemplate.learn(*_frame(_chunk("Hello")), PATH)
    assert template is not None
    frame = template.prefix + slot + template.suffix
    try:
        expected = orjson.loads(frame[6:-2])["choices"][0]["delta"]["content"]
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
        expected = None
    value = template.value(frame)
    if value is not None:
        assert value == expected
        assert slot[:1] == b'"' and slot[-1:] == b'"'  # nothing around the literal
    elif type(expected) is str:
        assert slot != slot.strip(b" \t\r\n") or slot[:1] != b'"'  # only padded literals
