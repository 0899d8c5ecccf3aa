"""chat_request_to_responses: chat requests for Responses-only upstreams.

Also the round trips chat → Responses → chat and Responses → chat → Responses, on real
requests and on generated conversations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmitm.translate.context import TranslateOptions
from llmitm.translate.errors import TranslationError
from llmitm.translate.request_to_chat import responses_request_to_chat
from llmitm.translate.request_to_responses import chat_request_to_responses
from tests.helpers.realfixtures import load_json, request_fixtures
from tests.helpers.request_validation import (
    assert_valid_chat_request,
    assert_valid_responses_request,
)

OPTIONS = TranslateOptions()


def to_responses(body: dict[str, Any], options: TranslateOptions = OPTIONS) -> tuple[dict, Any]:
    mapped = chat_request_to_responses(body, options)
    assert_valid_responses_request(mapped.body)
    return mapped.body, mapped


def to_chat(body: dict[str, Any]) -> dict[str, Any]:
    mapped = responses_request_to_chat(body, OPTIONS)
    assert_valid_chat_request(mapped.body)
    return mapped.body


def chat(*messages: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"model": "o3", "messages": list(messages), **fields}


USER = {"role": "user", "content": "hi"}


def tool_call(call_id: str, name: str = "get_weather", arguments: str = "{}") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


# --- real captured requests ----------------------------------------------------------------


@pytest.mark.parametrize("name", request_fixtures("chat"))
def test_real_chat_requests_become_valid_responses_requests(name: str) -> None:
    """Checklist 40 included: the produced input carries no item ids."""
    body = load_json(name)
    result, mapped = to_responses(body)
    assert result["model"] == body["model"] == mapped.context.model
    assert result["store"] is False
    assert bool(result.get("stream")) == bool(body.get("stream"))
    wants_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    assert mapped.context.include_usage == (wants_usage and bool(body.get("stream")))
    call_ids = [
        call["id"] for message in body["messages"] for call in message.get("tool_calls") or []
    ]
    assert [item["call_id"] for item in result["input"] if item["type"] == "function_call"] == (
        call_ids
    )


@pytest.mark.parametrize("name", request_fixtures("chat"))
def test_real_chat_requests_round_trip(name: str) -> None:
    """Checklist 29: chat → Responses → chat keeps messages, tool calls and their ids."""
    body = load_json(name)
    result, _ = to_responses(body)
    back = to_chat(result)
    original = [_normalised(message) for message in body["messages"]]
    # A chat client's empty assistant turn before its tool calls is the same turn.
    original = [m for m in original if not (m["role"] == "assistant" and m == _EMPTY_ASSISTANT)]
    assert [_normalised(message) for message in back["messages"]] == original
    # Chat's default strict=false is spelt out on the way (Responses would try strict mode).
    assert back.get("tools", []) == [
        {"type": "function", "function": {"strict": False, **tool["function"]}}
        for tool in body.get("tools") or []
    ]


_EMPTY_ASSISTANT = {"role": "assistant", "content": None}


def _normalised(message: dict[str, Any]) -> dict[str, Any]:
    """A chat message without the fields the round trip legitimately drops or spells apart."""
    result = {key: value for key, value in message.items() if value is not None}
    result.pop("name", None)
    result.pop("reasoning", None)  # OpenAI refuses reasoning items it did not issue.
    if result["role"] == "assistant":
        result["content"] = result.get("content") or None
        if "tool_calls" in result and not result["tool_calls"]:
            del result["tool_calls"]
    return result


def test_agents_chat_loop_keeps_its_meaning() -> None:
    body = load_json("client-openai-agents-chat-tool-loop-turn2-stream.request.json")
    result, _ = to_responses(body)
    assert result["instructions"] == "Use the tool."
    assert result["input"] == [
        {"type": "message", "role": "user", "content": "Weather in Paris?"},
        {
            "type": "function_call",
            "call_id": "call_fake1",
            "name": "get_weather",
            "arguments": '{"city":"Paris"}',
        },
        {"type": "function_call_output", "call_id": "call_fake1", "output": "Sunny in Paris"},
    ]
    tool = body["tools"][0]["function"]
    assert result["tools"] == [{"type": "function", **tool}]


# --- messages ------------------------------------------------------------------------------


def test_checklist_30_leading_system_messages_become_instructions() -> None:
    result, _ = to_responses(
        chat(
            {"role": "system", "content": "One."},
            {"role": "system", "content": [{"type": "text", "text": "Two."}]},
            USER,
            {"role": "system", "content": "Later."},
            {"role": "developer", "content": [{"type": "text", "text": "Dev."}]},
        )
    )
    assert result["instructions"] == "One.\n\nTwo."
    assert result["input"] == [
        {"type": "message", "role": "user", "content": "hi"},
        {"type": "message", "role": "system", "content": "Later."},
        {"type": "message", "role": "developer", "content": "Dev."},
    ]


def test_user_parts_map_to_input_parts() -> None:
    parts = [
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}},
        {"type": "image_url", "image_url": {"url": "https://x/a.png", "detail": "high"}},
        {"type": "file", "file": {"file_id": "file-1"}},
        {
            "type": "file",
            "file": {"file_data": "data:application/pdf;base64,AA", "filename": "a.pdf"},
        },
        {"type": "input_audio", "input_audio": {"data": "AAA", "format": "mp3"}},
    ]
    result, _ = to_responses(chat({"role": "user", "content": parts}))
    assert result["input"][0]["content"] == [
        {"type": "input_text", "text": "look"},
        {"type": "input_image", "image_url": "data:image/png;base64,AA", "detail": "auto"},
        {"type": "input_image", "image_url": "https://x/a.png", "detail": "high"},
        {"type": "input_file", "file_id": "file-1"},
        {"type": "input_file", "file_data": "data:application/pdf;base64,AA", "filename": "a.pdf"},
        {"type": "input_audio", "input_audio": {"data": "AAA", "format": "mp3"}},
    ]


def test_checklist_40_assistant_history_carries_no_ids() -> None:
    result, _ = to_responses(
        chat(
            USER,
            {
                "role": "assistant",
                "content": [{"type": "text", "text": "Let me check."}],
                "refusal": None,
                "reasoning_content": "secret thoughts",
                "tool_calls": [tool_call("call_1", arguments='{"a":1}'), tool_call("call_2")],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "one"},
            {
                "role": "tool",
                "tool_call_id": "call_2",
                "content": [{"type": "text", "text": "two"}],
            },
            {"role": "assistant", "content": None, "refusal": "I can't."},
        )
    )
    assert result["input"][1:] == [
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Let me check."}],
        },
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": '{"a":1}',
        },
        {"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "one"},
        {"type": "function_call_output", "call_id": "call_2", "output": "two"},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "refusal", "refusal": "I can't."}],
        },
    ]
    assert "secret thoughts" not in str(result)


def test_checklist_26_custom_tool_calls_and_outputs() -> None:
    result, _ = to_responses(
        chat(
            USER,
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_p",
                        "type": "custom",
                        "custom": {"name": "apply_patch", "input": "*** Begin"},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_p", "content": "Done"},
            tools=[
                {
                    "type": "custom",
                    "custom": {
                        "name": "apply_patch",
                        "description": "Patch.",
                        "format": {"type": "text"},
                    },
                }
            ],
            tool_choice={"type": "custom", "custom": {"name": "apply_patch"}},
        )
    )
    assert result["input"][1:] == [
        {
            "type": "custom_tool_call",
            "call_id": "call_p",
            "name": "apply_patch",
            "input": "*** Begin",
        },
        {"type": "custom_tool_call_output", "call_id": "call_p", "output": "Done"},
    ]
    assert result["tools"] == [
        {
            "type": "custom",
            "name": "apply_patch",
            "description": "Patch.",
            "format": {"type": "text"},
        }
    ]
    assert result["tool_choice"] == {"type": "custom", "name": "apply_patch"}


# --- tools and format --------------------------------------------------------------------------


def test_web_search_options_become_a_web_search_tool() -> None:
    options = {
        "search_context_size": "low",
        "user_location": {"type": "approximate", "approximate": {"city": "Paris", "country": "FR"}},
    }
    result, _ = to_responses(chat(USER, web_search_options=options))
    assert result["tools"] == [
        {
            "type": "web_search",
            "search_context_size": "low",
            "user_location": {"type": "approximate", "city": "Paris", "country": "FR"},
        }
    ]


def test_tool_choice_reverse_mapping() -> None:
    tools = [{"type": "function", "function": {"name": "get_weather"}}]
    cases: list[tuple[Any, Any]] = [
        ("auto", "auto"),
        ("none", "none"),
        ("required", "required"),
        (
            {"type": "function", "function": {"name": "get_weather"}},
            {"type": "function", "name": "get_weather"},
        ),
        (
            {
                "type": "allowed_tools",
                "allowed_tools": {
                    "mode": "auto",
                    "tools": [{"type": "function", "function": {"name": "get_weather"}}],
                },
            },
            {
                "type": "allowed_tools",
                "mode": "auto",
                "tools": [{"type": "function", "name": "get_weather"}],
            },
        ),
    ]
    for choice, expected in cases:
        result, _ = to_responses(chat(USER, tools=tools, tool_choice=choice))
        assert result["tool_choice"] == expected


def test_checklist_28_response_format_becomes_text_format() -> None:
    body = load_json("openai-python-chat-refusal-stream.request.json")
    result, _ = to_responses(body)
    schema = body["response_format"]["json_schema"]
    assert result["text"] == {"format": {"type": "json_schema", **schema}}
    back = to_chat(result)
    assert back["response_format"] == body["response_format"]

    described = {"name": "A", "description": "An A.", "schema": {"type": "object"}, "strict": False}
    result, _ = to_responses(
        chat(
            USER,
            response_format={"type": "json_schema", "json_schema": described},
            verbosity="high",
        )
    )
    assert result["text"] == {"format": {"type": "json_schema", **described}, "verbosity": "high"}
    result, _ = to_responses(chat(USER, response_format={"type": "json_object"}))
    assert result["text"] == {"format": {"type": "json_object"}}


# --- parameters --------------------------------------------------------------------------------


def test_parameters_are_renamed() -> None:
    result, mapped = to_responses(
        chat(
            USER,
            max_completion_tokens=900,
            max_tokens=100,
            reasoning_effort="high",
            temperature=0.5,
            top_p=0.8,
            metadata={"k": "v"},
            service_tier="priority",
            prompt_cache_key="pk",
            safety_identifier="sid",
            user="u",
            store=True,
            logprobs=True,
            top_logprobs=2,
            n=1,
            frequency_penalty=0,
            presence_penalty=0.0,
            modalities=["text"],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert result == {
        "model": "o3",
        "input": [{"type": "message", "role": "user", "content": "hi"}],
        "max_output_tokens": 900,
        "reasoning": {"effort": "high", "summary": "auto"},
        "temperature": 0.5,
        "top_p": 0.8,
        "metadata": {"k": "v"},
        "service_tier": "priority",
        "prompt_cache_key": "pk",
        "safety_identifier": "sid",
        "user": "u",
        "include": ["message.output_text.logprobs"],
        "top_logprobs": 2,
        "store": True,
        "stream": True,
    }
    assert mapped.context.include_usage is True
    assert mapped.warnings == []


def test_max_tokens_is_used_without_max_completion_tokens() -> None:
    result, _ = to_responses(chat(USER, max_tokens=300))
    assert result["max_output_tokens"] == 300


def test_output_limit_below_the_responses_minimum_is_raised() -> None:
    body = load_json("pydantic-ai-openrouter-stream-error.request.json")
    result, mapped = to_responses(body)
    assert result["max_output_tokens"] == 16
    assert any("16" in warning for warning in mapped.warnings)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("seed", 7),
        ("frequency_penalty", 0.5),
        ("presence_penalty", -1),
        ("logit_bias", {"50256": -100}),
        ("modalities", ["text", "audio"]),
        ("audio", {"voice": "alloy", "format": "wav"}),
        ("prediction", {"type": "content", "content": "x"}),
    ],
)
def test_fields_without_equivalent_are_dropped_or_refused(field: str, value: Any) -> None:
    result, mapped = to_responses(chat(USER, **{field: value}))
    assert field not in result
    assert any(field in warning for warning in mapped.warnings)
    with pytest.raises(TranslationError) as caught:
        chat_request_to_responses(chat(USER, **{field: value}), TranslateOptions(strict=True))
    assert caught.value.param == field


def test_n_and_stop_are_refused_unless_dropping_is_allowed() -> None:
    for field, value in (("n", 2), ("stop", ["\n"]), ("stop", "END")):
        with pytest.raises(TranslationError) as caught:
            chat_request_to_responses(chat(USER, **{field: value}), OPTIONS)
        assert (caught.value.status, caught.value.param) == (400, field)
        assert field in caught.value.message
        result, mapped = to_responses(
            chat(USER, **{field: value}), TranslateOptions(drop_unsupported=True)
        )
        assert field not in result
        assert any(field in warning for warning in mapped.warnings)
    result, _ = to_responses(chat(USER, stop=[], n=1))
    assert "stop" not in result


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"messages": [USER]}, "model", "missing_required_parameter"),
        (chat(), "messages", "missing_required_parameter"),
        (
            chat({"role": "function", "name": "f", "content": "x"}),
            "messages",
            "unsupported_parameter",
        ),
        (
            chat(USER, {"role": "assistant", "function_call": {"name": "f", "arguments": "{}"}}),
            "messages",
            "unsupported_parameter",
        ),
        (chat(USER, functions=[{"name": "f"}]), "functions", "unsupported_parameter"),
        (chat({"role": "tool", "content": "x"}), "messages", "missing_required_parameter"),
        (
            chat(
                USER,
                {
                    "role": "assistant",
                    "tool_calls": [{"type": "function", "function": {"name": "f"}}],
                },
            ),
            "messages",
            "missing_required_parameter",
        ),
        (chat({"role": "robot", "content": "x"}), "messages", "invalid_value"),
        (
            chat({"role": "user", "content": [{"type": "video"}]}),
            "messages[0].content[0]",
            "invalid_value",
        ),
        (chat(USER, tools=[{"type": "retrieval"}]), "tools", "invalid_value"),
        (chat(USER, response_format={"type": "xml"}), "response_format", "invalid_value"),
    ],
)
def test_untranslatable_requests_are_400s(body: Any, param: str, code: str) -> None:
    with pytest.raises(TranslationError) as caught:
        chat_request_to_responses(body, OPTIONS)
    error = caught.value
    assert (error.status, error.param, error.code) == (400, param, code)
    assert error.message.endswith(".")


# --- generated conversations round-trip both ways (checklist 29) ---------------------------------

NAMES = st.from_regex(r"[a-zA-Z0-9_-]{1,64}", fullmatch=True)


@dataclass
class Call:
    call_id: str
    name: str
    arguments: str
    result: str


@dataclass
class Step:
    text: str | None
    calls: list[Call]


@dataclass
class Conversation:
    system: str | None
    exchanges: list[tuple[str, list[Step]]]

    def chat_messages(self) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = []
        if self.system is not None:
            messages.append({"role": "system", "content": self.system})
        for user_text, steps in self.exchanges:
            messages.append({"role": "user", "content": user_text})
            for step in steps:
                message: dict[str, Any] = {"role": "assistant", "content": step.text}
                if step.calls:
                    message["tool_calls"] = [
                        {
                            "id": call.call_id,
                            "type": "function",
                            "function": {"name": call.name, "arguments": call.arguments},
                        }
                        for call in step.calls
                    ]
                messages.append(message)
                messages.extend(
                    {"role": "tool", "tool_call_id": call.call_id, "content": call.result}
                    for call in step.calls
                )
        return messages

    def responses_items(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        for user_text, steps in self.exchanges:
            items.append({"type": "message", "role": "user", "content": user_text})
            for step in steps:
                if step.text is not None:
                    items.append(
                        {
                            "type": "message",
                            "role": "assistant",
                            "content": [{"type": "output_text", "text": step.text}],
                        }
                    )
                items.extend(
                    {
                        "type": "function_call",
                        "call_id": call.call_id,
                        "name": call.name,
                        "arguments": call.arguments,
                    }
                    for call in step.calls
                )
                items.extend(
                    {"type": "function_call_output", "call_id": call.call_id, "output": call.result}
                    for call in step.calls
                )
        return items


@st.composite
def conversations(draw: st.DrawFn) -> Conversation:
    counter = iter(range(10_000))
    id_prefix = st.text(st.characters(codec="ascii", categories=("L", "N", "P")), max_size=8)
    arguments = st.one_of(
        st.dictionaries(
            st.text(max_size=5), st.integers(-(2**63), 2**63 - 1) | st.text(max_size=5), max_size=3
        ).map(lambda value: orjson.dumps(value).decode()),
        st.text(max_size=20),  # historical arguments may be anything, even invalid JSON
    )
    call = st.builds(
        lambda prefix, name, args, result: Call(f"{prefix}{next(counter)}", name, args, result),
        id_prefix,
        NAMES,
        arguments,
        st.text(max_size=20),
    )
    tool_step = st.builds(
        Step, st.none() | st.text(min_size=1), st.lists(call, min_size=1, max_size=3)
    )
    final_step = st.builds(Step, st.text(min_size=1), st.just([]))
    steps = st.tuples(st.lists(tool_step, max_size=2), st.lists(final_step, max_size=1)).map(
        lambda pair: pair[0] + pair[1]
    )
    exchanges = st.lists(st.tuples(st.text(max_size=20), steps), min_size=1, max_size=3)
    return Conversation(draw(st.none() | st.text(min_size=1)), draw(exchanges))


@settings(max_examples=150, deadline=None)
@given(conversations())
def test_checklist_29_generated_conversations_round_trip_both_ways(
    conversation: Conversation,
) -> None:
    chat_body = {"model": "m", "messages": conversation.chat_messages()}
    responses_body: dict[str, Any] = {"model": "m", "input": conversation.responses_items()}
    if conversation.system is not None:
        responses_body["instructions"] = conversation.system

    forward, _ = to_responses(chat_body)
    assert {k: forward[k] for k in ("model", "input")} == {
        "model": "m",
        "input": responses_body["input"],
    }
    assert forward.get("instructions") == responses_body.get("instructions")

    backward = to_chat(responses_body)
    assert backward["messages"] == chat_body["messages"]

    assert to_chat(forward)["messages"] == chat_body["messages"]
    again, _ = to_responses(backward)
    assert again["input"] == responses_body["input"]
