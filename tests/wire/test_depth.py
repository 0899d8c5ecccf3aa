"""The one nesting limit (wire.depth) and what the recorder does with a body beyond it: the
match key and the redacted body are still made (the flow and its 400 are recorded), and a
secret-named field is still redacted although the body is too deep to walk."""

from __future__ import annotations

import orjson
import pytest

from llmitm.replay.keys import match_key
from llmitm.wire.depth import MAX_DEPTH, deep_path, exceeds
from llmitm.wire.redact import redact_body


def deep_bytes(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


@pytest.mark.parametrize("depth", [1, 2, MAX_DEPTH - 1, MAX_DEPTH])
def test_up_to_the_limit_is_not_too_deep(depth: int) -> None:
    value = orjson.loads(deep_bytes(depth))
    assert not exceeds(value)
    assert deep_path(value) is None


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 255, 1024])
def test_beyond_the_limit_is_too_deep(depth: int) -> None:
    assert exceeds(orjson.loads(deep_bytes(depth)))


def test_scalars_are_no_depth() -> None:
    assert not exceeds("x") and not exceeds(None) and deep_path(3) is None


def test_a_limit_of_any_depth_is_measured_without_the_stack() -> None:
    value: list = []
    for _ in range(200_000):  # far past the recursion limit
        value = [value]
    assert exceeds(value, 150_000)
    assert not exceeds(value, 200_001)


def test_the_deep_path_names_the_field_in_openai_spelling() -> None:
    body = {
        "model": "m",
        "tools": [{"name": "f", "parameters": {"p": orjson.loads(deep_bytes(200))}}],
    }
    assert exceeds(body)
    assert deep_path(body) == "tools[0].parameters.p..."
    assert deep_path({"input": [[[]]]}, limit=3) == "input[0][0]"


def test_a_too_deep_body_gets_a_match_key_from_its_bytes() -> None:
    content = b'{"model":"m","input":' + deep_bytes(1000) + b"}"
    key = match_key("POST", "/v1/responses", [], content)
    other = match_key("POST", "/v1/responses", [], content.replace(b'"m"', b'"n"'))
    assert key.key != other.key and key.model == "m"
    assert "sha256:" in key.canonical


def test_a_too_deep_body_is_redacted_in_its_bytes() -> None:
    content = (
        b'{"api_key": "hunter2", "session_token":"t0k", "max_tokens": "7", "q": "keep",'
        b' "x": ' + deep_bytes(1000) + b', "k": "sk-abcdefghijklmnopqrstuvwx"}'
    )
    redacted = redact_body(content)
    assert redacted is not None
    assert b"hunter2" not in redacted and b"t0k" not in redacted and b"sk-abc" not in redacted
    assert b'"api_key": "<redacted>"' in redacted and b'"q": "keep"' in redacted
    assert b'"max_tokens": "7"' in redacted
    assert deep_bytes(1000) in redacted


def test_a_body_within_the_limit_is_redacted_as_before() -> None:
    content = orjson.dumps({"api_key": "hunter2", "input": "hi"})
    assert orjson.loads(redact_body(content) or b"") == {"api_key": "<redacted>", "input": "hi"}
