"""Bytes kept for a flow's life are held in an allocation of their own size."""

from __future__ import annotations

import tracemalloc

import orjson

from llmitm.wire.sized import FIT_BELOW, right_sized


def held_by(make: object) -> int:
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = make()  # type: ignore[operator]
        return tracemalloc.get_traced_memory()[0] - before if kept else 0
    finally:
        tracemalloc.stop()


def test_a_small_orjson_body_is_copied_to_its_size() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "x" * 3000}], "stream": True}
    data = orjson.dumps(body)
    fitted = right_sized(data)
    assert fitted == data and fitted is not data
    assert held_by(lambda: right_sized(orjson.dumps(body))) < len(data) + 256
    # what it saves: orjson's own buffer is bigger than what it wrote
    assert held_by(lambda: orjson.dumps(body)) > 2 * len(data)


def test_a_big_body_is_kept_as_it_is() -> None:
    data = b"x" * FIT_BELOW
    assert right_sized(data) is data
