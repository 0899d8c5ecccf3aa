"""Normalisation by default: which plans normalise a stream of the client's own API, the
``conformant`` key that turns it off, and the non-streamed chat body's repairs."""

from __future__ import annotations

import re
from typing import Any

import orjson
import pytest

from llmitm.exchange.response import stream_pipeline, translate_body
from llmitm.routing.config import ConfigError, Endpoint, parse_config
from llmitm.routing.plan import plan_for_endpoint
from llmitm.translate.context import TranslateOptions, TranslationContext
from llmitm.translate.guard import StreamGuard
from llmitm.translate.pipeline import StreamPipeline
from llmitm.wire.ids import CountingIds, fixed_clock


def endpoint(kind: str, **keys: Any) -> Endpoint:
    return Endpoint(
        name="e",
        kind=kind,  # type: ignore[arg-type]
        base_url="https://up.example/v1",
        apis=frozenset({"chat", "responses"}),
        **keys,
    )


@pytest.mark.parametrize(
    ("kind", "keys", "chat", "responses"),
    [
        ("compatible", {}, "normalise-chat", "normalise-responses"),
        ("compatible", {"conformant": frozenset({"chat"})}, None, "normalise-responses"),
        ("compatible", {"conformant": frozenset({"chat", "responses"})}, None, None),
        ("openai", {}, None, None),
        ("azure", {}, None, None),
        ("openai", {"non_conformant": frozenset({"chat"})}, "normalise-chat", None),
    ],
)
def test_third_party_streams_are_normalised_unless_trusted(
    kind: str, keys: dict[str, Any], chat: str | None, responses: str | None
) -> None:
    ep = endpoint(kind, **keys)
    assert plan_for_endpoint(ep, "chat", "m").stream_direction == chat
    assert plan_for_endpoint(ep, "responses", "m").stream_direction == responses


def test_a_translated_stream_keeps_its_translation() -> None:
    ep = Endpoint(name="e", kind="compatible", base_url="https://u/v1", apis=frozenset({"chat"}))
    assert plan_for_endpoint(ep, "responses", "m").stream_direction == "chat-to-responses"


def _raw(**keys: Any) -> dict[str, Any]:
    return {"endpoints": {"e": {"kind": "compatible", "base_url": "https://h/v1", **keys}}}


def test_the_conformant_key_is_read() -> None:
    config = parse_config(_raw(conformant=["chat"]), "f", {})
    assert config.endpoints["e"].conformant == frozenset({"chat"})
    assert not config.endpoints["e"].normalises("chat")
    assert config.endpoints["e"].normalises("responses")


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"conformant": ["chatt"]}, "e.conformant: expected one of chat, responses, got 'chatt'"),
        ({"conformant": [1]}, "e.conformant: expected a string or an array of strings"),
        (
            {"conformant": ["chat"], "non_conformant": ["chat"]},
            "not also listed in non_conformant ('chat' is in both)",
        ),
    ],
)
def test_a_wrong_conformant_key_is_a_clear_error(keys: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_config(_raw(**keys), "f", {})


def context() -> TranslationContext:
    return TranslationContext(TranslateOptions(ids=CountingIds(), clock=fixed_clock(1)))


def test_the_stream_pipeline_follows_the_plan_and_strips_usage() -> None:
    plan = plan_for_endpoint(endpoint("compatible"), "chat", "m")
    pipeline = stream_pipeline(plan, context(), strip_usage=True)
    assert isinstance(pipeline, StreamPipeline) and pipeline.direction == "normalise-chat"
    usage = b'data: {"id":"c","choices":[],"usage":{"total_tokens":3}}\n\n'
    text = (
        b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"x"},"finish_reason":"stop"}]}'
        b"\n\n"
    )
    out = pipeline.feed(text) + pipeline.feed(usage) + pipeline.feed(b"data: [DONE]\n\n")
    assert out == text + b"data: [DONE]\n\n" and pipeline.usage == {"total_tokens": 3}
    trusted = plan_for_endpoint(endpoint("openai"), "chat", "m")
    assert isinstance(stream_pipeline(trusted, context()), StreamGuard)


COMPLETION = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "m",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}],
            },
            "finish_reason": None,
        }
    ],
}


def test_a_third_party_chat_body_gets_what_it_left_out() -> None:
    plan = plan_for_endpoint(endpoint("compatible"), "chat", "m")
    status, body = translate_body(200, orjson.dumps(COMPLETION), plan, context())  # type: ignore[misc]
    choice = orjson.loads(body)["choices"][0]
    assert status == 200 and choice["finish_reason"] == "tool_calls"
    assert choice["message"]["tool_calls"][0]["id"].startswith("call_")
    assert choice["message"]["tool_calls"][0]["type"] == "function"


def test_a_complete_or_unreadable_chat_body_keeps_its_bytes() -> None:
    plan = plan_for_endpoint(endpoint("compatible"), "chat", "m")
    complete = orjson.loads(orjson.dumps(COMPLETION))
    complete["choices"][0]["finish_reason"] = "tool_calls"
    complete["choices"][0]["message"]["tool_calls"][0].update(id="call_1", type="function")
    assert translate_body(200, orjson.dumps(complete), plan, context()) is None
    assert translate_body(200, b"data: {}\n\n", plan, context()) is None
    trusted = plan_for_endpoint(endpoint("openai"), "chat", "m")
    assert translate_body(200, orjson.dumps(COMPLETION), trusted, context()) is None
