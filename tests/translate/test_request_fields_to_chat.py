"""Every field of a Responses create request, decided toward a chat upstream.

The list of fields is read from the installed openai SDK (``ResponseCreateParamsBase``), so a
field a new SDK adds fails :func:`test_every_sdk_field_is_decided` until someone decides it.
Each field is sent alone on a minimal request; the test checks what the chat body gains,
whether the proxy log gets a warning, that the source is a request the SDK's types accept
and that the translation is one the chat SDK's types accept.
"""

from __future__ import annotations

from typing import Any

import pytest

from llmitm.translate.context import TranslateOptions
from llmitm.translate.request_to_chat import responses_request_to_chat
from llmitm.wire.ids import CountingIds, fixed_clock
from tests.helpers.request_validation import (
    RESPONSES_PARAMS,
    assert_valid_chat_request,
    assert_valid_responses_request,
)

BASE: dict[str, Any] = {"model": "m", "input": "hi"}
FUNCTION = {
    "type": "function",
    "name": "f",
    "parameters": {"type": "object", "properties": {}},
    "strict": False,
}

# field → (value sent, what the chat body gains: exact fields or just their names,
#          a word the warning must contain or None for no warning)
FIELDS: dict[str, tuple[Any, dict[str, Any] | set[str], str | None]] = {
    "model": ("other", {}, None),  # replaces the base's model, checked below
    "input": ("hello", {}, None),  # becomes the messages (test_request_to_chat.py)
    "instructions": ("be brief", {}, None),  # a system message (test_request_to_chat.py)
    "tools": ([FUNCTION], {"tools"}, None),
    "tool_choice": ("auto", {}, None),  # without tools chat would reject it
    "parallel_tool_calls": (False, {}, None),  # idem; with tools see below
    "text": ({"verbosity": "low"}, {"verbosity": "low"}, None),
    "reasoning": ({"effort": "low", "summary": "auto"}, {"reasoning_effort": "low"}, None),
    "max_output_tokens": (64, {"max_completion_tokens": 64}, None),
    "temperature": (0.5, {"temperature": 0.5}, None),
    "top_p": (0.5, {"top_p": 0.5}, None),
    "user": ("u-1", {"user": "u-1"}, None),
    "safety_identifier": ("s-1", {"safety_identifier": "s-1"}, None),
    "service_tier": ("flex", {"service_tier": "flex"}, None),
    "prompt_cache_key": ("k", {"prompt_cache_key": "k"}, None),
    "prompt_cache_retention": ("24h", {"prompt_cache_retention": "24h"}, None),
    "prompt_cache_options": (
        {"mode": "explicit", "ttl": "30m"},
        {"prompt_cache_options": {"mode": "explicit", "ttl": "30m"}},
        None,
    ),
    "moderation": (
        {"model": "omni-moderation-latest"},
        {"moderation": {"model": "omni-moderation-latest"}},
        None,
    ),
    "top_logprobs": (3, {"logprobs": True, "top_logprobs": 3}, None),
    "include": (["message.output_text.logprobs"], {"logprobs": True}, None),
    "stream": (True, {"stream": True, "stream_options": {"include_usage": True}}, None),
    "stream_options": ({"include_obfuscation": False}, {}, None),
    "metadata": ({"a": "b"}, {}, None),
    "store": (True, {}, None),
    "background": (False, {}, None),
    "background_options": ({"completion_window": "soonest"}, {}, None),
    "truncation": ("auto", {}, None),
    "max_tool_calls": (3, {}, None),
    "previous_response_id": ("resp_1", {}, None),  # resolved by the store into history
    "conversation": ("conv_1", {}, None),  # idem
    "context_management": (
        [{"type": "compaction", "compact_threshold": 1000}],
        {},
        "compacts only on request",
    ),
    "prompt": ({"id": "pmpt_1"}, {}, "prompt"),
    "access_programs": ({"cyber": "standard"}, {}, "access_programs"),
    "image": ({"context_compression": "auto"}, {}, "image"),
}


def translate(body: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    assert_valid_responses_request(body)
    options = TranslateOptions(ids=CountingIds(), clock=fixed_clock(1_700_000_000))
    # An empty history stands for a stored chain the store has already resolved.
    history = [] if "previous_response_id" in body or "conversation" in body else None
    mapped = responses_request_to_chat(body, options, history=history)
    assert_valid_chat_request(mapped.body)
    return mapped.body, mapped.warnings


@pytest.mark.parametrize("field", sorted(RESPONSES_PARAMS))
def test_every_sdk_field_is_decided(field: str) -> None:
    assert field in FIELDS, f"decide what a chat upstream gets for the Responses field {field}"
    value, gains, warning = FIELDS[field]
    base, base_warnings = translate(BASE)
    chat, warnings = translate({**BASE, field: value})
    added = {key: chat[key] for key in chat if chat.get(key) != base.get(key)}
    added.pop("messages", None)  # what input and instructions become is tested elsewhere
    if field == "model":
        assert added == {"model": "other"}
    elif isinstance(gains, set):
        assert set(added) == gains
    else:
        assert added == gains
    new_warnings = [w for w in warnings if w not in base_warnings]
    if warning is None:
        assert new_warnings == []
    else:
        (only,) = new_warnings
        assert warning in only


def test_stream_options_never_reach_chat_as_sent() -> None:
    """include_obfuscation has no chat meaning; streaming always asks for usage instead."""
    chat, warnings = translate(
        {**BASE, "stream": True, "stream_options": {"include_obfuscation": True}}
    )
    assert chat["stream_options"] == {"include_usage": True}
    assert warnings == []


def test_parallel_tool_calls_travel_with_tools() -> None:
    chat, _ = translate({**BASE, "tools": [FUNCTION], "parallel_tool_calls": False})
    assert chat["parallel_tool_calls"] is False


@pytest.mark.parametrize(
    ("include", "top_logprobs", "expected"),
    [
        (["message.output_text.logprobs"], None, {"logprobs": True}),
        (["message.output_text.logprobs"], 0, {"logprobs": True, "top_logprobs": 0}),
        (None, 5, {"logprobs": True, "top_logprobs": 5}),
        (None, 0, {}),  # zero alternatives and no include: nothing asked
    ],
)
def test_logprobs_are_asked_for_by_include_or_top_logprobs(
    include: list[str] | None, top_logprobs: int | None, expected: dict[str, Any]
) -> None:
    body = dict(BASE)
    if include is not None:
        body["include"] = include
    if top_logprobs is not None:
        body["top_logprobs"] = top_logprobs
    chat, _ = translate(body)
    assert {key: chat[key] for key in ("logprobs", "top_logprobs") if key in chat} == expected


@pytest.mark.parametrize(
    "value",
    [
        "reasoning.encrypted_content",  # llmitm seals reasoning itself
        "file_search_call.results",
        "web_search_call.results",
        "web_search_call.action.sources",
        "message.input_image.image_url",
        "computer_call_output.output.image_url",
        "code_interpreter_call.outputs",
    ],
)
def test_other_include_values_ask_the_chat_upstream_for_nothing(value: str) -> None:
    base, _ = translate(BASE)
    chat, warnings = translate({**BASE, "include": [value]})
    assert chat == base
    assert warnings == []


def test_prompt_cache_options_chat_lacks_are_named_and_dropped() -> None:
    chat, warnings = translate(
        {
            **BASE,
            "prompt_cache_options": {
                "mode": "implicit",
                "ttl": "12h",
                "prewarm": True,
                "comparison_response_id": "resp_1",
            },
        }
    )
    assert chat["prompt_cache_options"] == {"mode": "implicit"}
    (warning,) = warnings
    assert all(key in warning for key in ("comparison_response_id", "prewarm", "ttl"))


def test_a_boolean_is_not_a_logprobs_count() -> None:
    options = TranslateOptions(ids=CountingIds(), clock=fixed_clock(1_700_000_000))
    mapped = responses_request_to_chat({**BASE, "top_logprobs": True}, options)
    assert "top_logprobs" not in mapped.body
    assert "logprobs" not in mapped.body
