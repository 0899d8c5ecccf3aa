"""The upstream's side of a flow as plain data: a bounded stream keeps exactly a prefix, the
state survives a deep copy (what mitmproxy's saved flows take) sharing its bodies, credentials
never get in, and a loaded state this version cannot read is no side rather than an error."""

from __future__ import annotations

import copy
from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from llmitm.exchange.sides import Answered, BoundedBody, Sent, UpstreamSide

KEY = "sk-proj-4f1e2d3c4b5a69788796a5b4c3d2e1f0"


@given(st.lists(st.binary(max_size=64), max_size=30), st.integers(min_value=0, max_value=400))
def test_a_bounded_body_keeps_the_first_bytes_and_counts_the_rest(
    chunks: list[bytes], limit: int
) -> None:
    kept = BoundedBody(limit)
    for piece in chunks:
        kept(piece)
    whole = b"".join(chunks)
    assert kept.body() == whole[:limit]
    assert kept.left_out == len(whole) - len(kept.body())
    assert kept.body() is kept.body()  # joined once


def test_the_state_deep_copies_as_plain_data_sharing_its_bodies() -> None:
    body = b'{"model":"m","messages":[]}' * 1000
    answer = b"data: [DONE]\n\n"
    side = UpstreamSide(
        "responses",
        "chat",
        "local",
        Sent.redacted("POST", "http://up/v1/chat/completions", [("content-type", "x")], body),
        Answered.redacted(200, [("content-type", "text/event-stream")], answer, left_out=5),
    )
    state = side.to_state()
    saved = copy.deepcopy(state)
    assert saved["request"]["body"] is body  # kept once: bytes are shared, not copied
    assert UpstreamSide.from_state(saved) == side
    unkept = replace(side, response=Answered.redacted(200, [], None))
    assert unkept.response is not None and not unkept.response.kept
    assert UpstreamSide.from_state(copy.deepcopy(unkept.to_state())) == unkept


def test_credentials_are_redacted_on_the_way_in() -> None:
    sent = Sent.redacted(
        "POST",
        f"https://x.openai.azure.com/openai/v1/responses?api-key={KEY}&api-version=v1",
        [("Authorization", f"Bearer {KEY}"), ("api-key", KEY), ("x-note", f"key {KEY}")],
        b"{}",
    )
    answered = Answered.redacted(401, [("set-cookie", "session=1"), ("x-key", KEY)], b"")
    text = repr((sent, answered))
    assert KEY not in text and "session=1" not in text
    assert "api-version=v1" in sent.url and ("Authorization", "Bearer <redacted>") in sent.headers


def test_a_state_it_cannot_read_is_no_side() -> None:
    assert UpstreamSide.from_state(None) is None
    assert UpstreamSide.from_state({"request": "nonsense"}) is None
    odd = UpstreamSide.from_state(
        {"request": {"method": 1, "headers": [["a", "b"], "bad"], "body": "text"}, "response": 3}
    )
    assert odd is not None and odd.response is None
    assert odd.request == Sent("1", "", (("a", "b"),), b"text")
