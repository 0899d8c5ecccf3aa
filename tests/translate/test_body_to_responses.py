"""chat_completion_to_response: chat.completion bodies for Responses clients."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmitm.translate.body_to_chat import response_to_chat_completion
from llmitm.translate.body_to_responses import (
    CONTENT_FILTERED_REFUSAL,
    chat_completion_to_response,
)
from llmitm.translate.context import ToolOrigin
from llmitm.translate.think_tags import split_think_tags
from tests.helpers._fixtures_body import (
    MODES,
    NOW,
    context,
    load_real,
    real_cases,
    validate_chat,
    validate_response,
)

USAGE = {
    "prompt_tokens": 339,
    "completion_tokens": 92,
    "total_tokens": 431,
    "prompt_tokens_details": {"cached_tokens": 320},
    "completion_tokens_details": {"reasoning_tokens": 48},
}


def _completion(
    message: dict[str, Any], finish_reason: str | None = "stop", **fields: Any
) -> dict[str, Any]:
    completion = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": "qwen3",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", **message},
                "logprobs": None,
                "finish_reason": finish_reason,
            }
        ],
        "usage": USAGE,
    }
    completion.update(fields)
    return completion


def _call(call_id: str | None, name: str, arguments: Any) -> dict[str, Any]:
    call: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": arguments}}
    if call_id is not None:
        call["id"] = call_id
    return call


def _types(response: dict[str, Any]) -> list[str]:
    return [item["type"] for item in response["output"]]


# --- real captured chat bodies -------------------------------------------------------------


def _expected_reasoning_and_text(message: dict[str, Any]) -> tuple[str, str]:
    """What each real fixture's reasoning spelling should become (one per fixture)."""
    reasoning, text = split_think_tags(message.get("content") or "")
    for key in ("reasoning_content", "reasoning"):
        if message.get(key):
            reasoning = message[key]
    return reasoning, text


@pytest.mark.parametrize("name", real_cases("chat"))
def test_real_chat_bodies_keep_their_meaning(name: str) -> None:
    source, _ = load_real(name)
    out = chat_completion_to_response(source, context())
    response = validate_response(out)
    choice = source["choices"][0]
    message = choice["message"]
    reasoning, text = _expected_reasoning_and_text(message)

    assert response.output_text == text
    assert response.status == "completed"
    assert response.completed_at == int(NOW)
    assert response.created_at == source["created"]
    assert response.model == source["model"]
    reasoning_items = [item for item in out["output"] if item["type"] == "reasoning"]
    if reasoning:
        assert [i["summary"] for i in reasoning_items] == [
            [{"type": "summary_text", "text": reasoning}]
        ]
        assert out["output"][0]["type"] == "reasoning"  # checklist 13: before the message
    else:
        assert reasoning_items == []
    for part in (response.output_text, *(i["summary"][0]["text"] for i in reasoning_items)):
        assert "<think>" not in part and "</think>" not in part

    calls = [item for item in out["output"] if item["type"] == "function_call"]
    assert [(c["call_id"], c["name"], c["arguments"]) for c in calls] == [
        (c["id"], c["function"]["name"], c["function"]["arguments"])
        for c in message.get("tool_calls") or []
    ]
    assert all(c["status"] == "completed" for c in calls)

    # checklist 24: exact usage, cached and reasoning tokens included.
    usage = source["usage"]
    assert response.usage is not None
    assert response.usage.input_tokens == usage["prompt_tokens"]
    assert response.usage.output_tokens == usage["completion_tokens"]
    assert response.usage.total_tokens == usage["total_tokens"]
    assert response.usage.input_tokens_details.cached_tokens == (
        usage.get("prompt_tokens_details") or {}
    ).get("cached_tokens", 0)
    assert response.usage.output_tokens_details.reasoning_tokens == (
        usage.get("completion_tokens_details") or {}
    ).get("reasoning_tokens", 0)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", real_cases("chat"))
def test_real_chat_bodies_round_trip_back_to_chat(name: str, mode: str) -> None:
    """Every reasoning mode renders the reasoning a real backend sent, and nothing else."""
    source, _ = load_real(name)
    response = chat_completion_to_response(source, context())
    back = response_to_chat_completion(response, context(mode))
    message = back["choices"][0]["message"]
    reasoning, text = _expected_reasoning_and_text(source["choices"][0]["message"])
    if mode == "think-tags" and reasoning:
        assert split_think_tags(message["content"]) == (reasoning, text)
    else:
        assert (message["content"] or "") == text
    if mode in ("reasoning_content", "reasoning"):
        assert message.get(mode) == (reasoning or None)
    assert back["choices"][0]["finish_reason"] == source["choices"][0]["finish_reason"]
    assert back["usage"]["prompt_tokens"] == source["usage"]["prompt_tokens"]


def test_real_ollama_reasoning_field_then_tool_call() -> None:
    source, _ = load_real("pydantic-ai-ollama-cloud-tool-call")
    out = chat_completion_to_response(source, context())
    validate_response(out)
    # Empty content next to a tool call makes no message item.
    assert _types(out) == ["reasoning", "function_call"]
    assert out["output"][1]["call_id"] == "call_o2vnpxrw"


# --- reasoning spellings -------------------------------------------------------------------


@pytest.mark.parametrize(
    "message",
    [
        {"content": "Hi", "reasoning_content": "thought"},
        {"content": "Hi", "reasoning": "thought"},
        {"content": "Hi", "reasoning": {"text": "thought"}},
        {"content": "Hi", "reasoning": {"content": "thought"}},
        {"content": "Hi", "reasoning_details": [{"type": "reasoning.text", "text": "thought"}]},
        {
            "content": "Hi",
            "reasoning_details": [
                {"type": "reasoning.summary", "summary": "thought"},
                {"type": "reasoning.encrypted", "data": "opaque"},
            ],
        },
        # OpenRouter sends both; the text must not be doubled.
        {
            "content": "Hi",
            "reasoning": "thought",
            "reasoning_details": [{"type": "reasoning.text", "text": "thought"}],
        },
        {"content": "<think>\nthought\n</think>\n\nHi"},
    ],
    ids=["reasoning_content", "reasoning", "dict-text", "dict-content", "details", "summary",
         "openrouter-both", "think-tags"],
)  # fmt: skip
def test_checklist_13_every_reasoning_spelling_becomes_one_reasoning_item(
    message: dict[str, Any],
) -> None:
    out = chat_completion_to_response(_completion(message), context())
    response = validate_response(out)
    assert _types(out) == ["reasoning", "message"]
    assert out["output"][0]["summary"] == [{"type": "summary_text", "text": "thought"}]
    assert response.output_text == "Hi"


def test_checklist_14_open_tag_missing_is_configurable() -> None:
    source = _completion({"content": "thought\n</think>\n\nHi"})
    with_option = chat_completion_to_response(source, context(think_open_missing=True))
    assert validate_response(with_option).output_text == "Hi"
    assert with_option["output"][0]["summary"][0]["text"] == "thought"
    without = chat_completion_to_response(source, context())
    assert validate_response(without).output_text == "thought\n</think>\n\nHi"


def test_content_given_as_parts_is_read() -> None:
    source = _completion(
        {"content": [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}]}
    )
    assert validate_response(chat_completion_to_response(source, context())).output_text == "Hello"


# --- tool calls ----------------------------------------------------------------------------


def test_checklist_18_text_before_tool_calls_survives() -> None:
    source = _completion(
        {
            "content": "Checking both cities.",
            "tool_calls": [
                _call("call_a", "weather", '{"city":"Paris"}'),
                _call("call_b", "weather", '{"city":"Rome"}'),
            ],
        },
        finish_reason="tool_calls",
    )
    out = chat_completion_to_response(source, context())
    response = validate_response(out)
    assert _types(out) == ["message", "function_call", "function_call"]
    assert response.output_text == "Checking both cities."
    assert [(i["call_id"], i["arguments"]) for i in out["output"][1:]] == [
        ("call_a", '{"city":"Paris"}'),
        ("call_b", '{"city":"Rome"}'),
    ]
    assert response.status == "completed"


def test_checklist_10_ids_are_unique_stable_and_deterministic() -> None:
    source = _completion(
        {
            "content": "<think>t</think>text",
            "tool_calls": [_call("call_a", "f", "{}"), _call(None, "g", "{}")],
        },
        finish_reason="tool_calls",
    )
    first = chat_completion_to_response(source, context())
    second = chat_completion_to_response(source, context())
    assert orjson.dumps(first) == orjson.dumps(second)
    ids = [item["id"] for item in first["output"]]
    assert ids == ["rs_0002", "msg_0003", "fc_0004", "fc_0005"]  # resp_0001 is the response
    assert first["id"] == "resp_0001"
    call_ids = [item["call_id"] for item in first["output"][2:]]
    assert call_ids[0] == "call_a"
    assert call_ids[1].startswith("call_") and call_ids[1] != "call_a"


def test_response_id_comes_from_the_context() -> None:
    out = chat_completion_to_response(_completion({"content": "x"}), context(response_id="resp_s"))
    assert out["id"] == "resp_s"


def test_custom_tool_round_trip_via_context_tools() -> None:
    tools = {"apply_patch": ToolOrigin("custom", "apply_patch")}
    arguments = orjson.dumps({"input": "*** Begin Patch\n*** End Patch"}).decode()
    source = _completion(
        {"content": None, "tool_calls": [_call("call_p", "apply_patch", arguments)]},
        finish_reason="tool_calls",
    )
    out = chat_completion_to_response(source, context(tools=tools))
    validate_response(out)
    item = out["output"][0]
    assert item["type"] == "custom_tool_call"
    assert (item["call_id"], item["name"], item["input"]) == (
        "call_p",
        "apply_patch",
        "*** Begin Patch\n*** End Patch",
    )
    back = response_to_chat_completion(out, context(tools=tools))
    call = back["choices"][0]["message"]["tool_calls"][0]
    assert call == {
        "id": "call_p",
        "type": "custom",
        "custom": {"name": "apply_patch", "input": "*** Begin Patch\n*** End Patch"},
    }


def test_namespaced_function_is_restored() -> None:
    tools = {"mcp_docs__search": ToolOrigin("function", "search", namespace="mcp_docs")}
    source = _completion(
        {"tool_calls": [_call("call_n", "mcp_docs__search", '{"q":"x"}')]},
        finish_reason="tool_calls",
    )
    out = chat_completion_to_response(source, context(tools=tools))
    validate_response(out)
    item = out["output"][0]
    assert (item["type"], item["name"], item["namespace"]) == (
        "function_call",
        "search",
        "mcp_docs",
    )
    back = response_to_chat_completion(out, context(tools=tools))
    assert back["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "mcp_docs__search"


def test_chat_custom_tool_call_becomes_custom_tool_call_item() -> None:
    call = {"id": "call_c", "type": "custom", "custom": {"name": "sql", "input": "SELECT 1"}}
    source = _completion({"tool_calls": [call]}, finish_reason="tool_calls")
    out = chat_completion_to_response(source, context())
    validate_response(out)
    item = out["output"][0]
    assert (item["type"], item["id"], item["call_id"], item["name"], item["input"]) == (
        "custom_tool_call",
        "ctc_0002",
        "call_c",
        "sql",
        "SELECT 1",
    )


def test_parsed_arguments_and_legacy_function_call() -> None:
    parsed = _completion(
        {"tool_calls": [_call("call_d", "f", {"a": 1})]}, finish_reason="tool_calls"
    )
    item = chat_completion_to_response(parsed, context())["output"][0]
    assert orjson.loads(item["arguments"]) == {"a": 1}

    legacy = _completion(
        {"content": None, "function_call": {"name": "f", "arguments": '{"b":2}'}},
        finish_reason="function_call",
    )
    out = chat_completion_to_response(legacy, context())
    validate_response(out)
    assert out["status"] == "completed"
    assert [(i["type"], i["name"], i["arguments"]) for i in out["output"]] == [
        ("function_call", "f", '{"b":2}')
    ]


# --- refusal, length, content filter -------------------------------------------------------


def test_refusal_becomes_a_refusal_part() -> None:
    out = chat_completion_to_response(
        _completion({"content": None, "refusal": "I can't help with that."}), context()
    )
    response = validate_response(out)
    assert out["output"][0]["content"] == [
        {"type": "refusal", "refusal": "I can't help with that."}
    ]
    assert response.output_text == ""
    back = response_to_chat_completion(out, context())
    assert back["choices"][0]["message"]["refusal"] == "I can't help with that."
    assert back["choices"][0]["message"]["content"] is None


def test_checklist_19_length_is_incomplete() -> None:
    out = chat_completion_to_response(_completion({"content": "cut mid"}, "length"), context())
    response = validate_response(out)
    assert response.status == "incomplete"
    assert out["incomplete_details"] == {"reason": "max_output_tokens"}
    assert out["completed_at"] is None
    assert out["output"][0]["status"] == "incomplete"
    assert response.output_text == "cut mid"
    back = response_to_chat_completion(out, context())
    assert back["choices"][0]["finish_reason"] == "length"


def test_checklist_19_content_filter_keeps_partial_text() -> None:
    source = _completion({"content": "partial"}, "content_filter")
    out = chat_completion_to_response(source, context())
    response = validate_response(out)
    assert response.status == "incomplete"
    assert out["incomplete_details"] == {"reason": "content_filter"}
    assert response.output_text == "partial"
    assert response_to_chat_completion(out, context())["choices"][0]["finish_reason"] == (
        "content_filter"
    )


def test_checklist_19_content_filter_with_no_output_says_so() -> None:
    azure = _completion(
        {"content": None},
        "content_filter",
        prompt_filter_results=[{"prompt_index": 0, "content_filter_results": {}}],
    )
    azure["choices"][0]["content_filter_results"] = {
        "violence": {"filtered": True, "severity": "high"}
    }
    out = chat_completion_to_response(azure, context())
    validate_response(out)
    assert out["output"][0]["content"] == [{"type": "refusal", "refusal": CONTENT_FILTERED_REFUSAL}]
    assert out["incomplete_details"] == {"reason": "content_filter"}


def test_checklist_41_azure_body_with_filter_results() -> None:
    azure = _completion(
        {"content": "Paris"},
        prompt_filter_results=[
            {"prompt_index": 0, "content_filter_results": {"hate": {"filtered": False}}}
        ],
    )
    azure["choices"][0]["content_filter_results"] = {"hate": {"filtered": False}}
    assert validate_response(chat_completion_to_response(azure, context())).output_text == "Paris"


@pytest.mark.parametrize(
    "completion",
    [
        {},
        {"choices": []},
        {"choices": None, "id": "", "object": "", "created": 0, "model": ""},
        {"choices": [{"index": 0}]},
        {"choices": [{"index": 0, "message": None, "finish_reason": None}]},
    ],
    ids=repr,
)
def test_degenerate_bodies_do_not_crash(completion: dict[str, Any]) -> None:
    out = chat_completion_to_response(completion, context(model="m"))
    response = validate_response(out)
    assert response.output == []
    assert response.status == "completed"
    assert response.usage is None


def test_only_choice_zero_is_used() -> None:
    source = _completion({"content": "zero"})
    source["choices"].insert(
        0,
        {"index": 1, "message": {"role": "assistant", "content": "one"}, "finish_reason": "stop"},
    )
    assert validate_response(chat_completion_to_response(source, context())).output_text == "zero"


# --- envelope, echo, annotations, logprobs -------------------------------------------------


def test_envelope_echoes_the_request_and_uses_the_client_model() -> None:
    echo = {
        "instructions": "Be brief.",
        "tools": [{"type": "function", "name": "f", "parameters": {}, "strict": True}],
        "store": False,
        "temperature": 0.2,
        "metadata": {"k": "v"},
    }
    out = chat_completion_to_response(
        _completion({"content": "x"}, service_tier="default"),
        context(model="client-model", echo=echo),
    )
    response = validate_response(out)
    assert response.model == "client-model"
    assert response.instructions == "Be brief."
    assert out["tools"] == echo["tools"]
    assert (response.store, response.temperature, response.metadata) == (False, 0.2, {"k": "v"})
    assert response.service_tier == "default"
    assert response.object == "response"


def test_created_falls_back_to_the_clock() -> None:
    out = chat_completion_to_response(_completion({"content": "x"}, created=None), context())
    assert out["created_at"] == int(NOW)


def test_url_citations_map_back_and_follow_removed_think_blocks() -> None:
    for prefix in ("", "<think>hm</think>\n\n"):
        # Chat indices count from the start of the whole content, tags included.
        citation = {"start_index": len(prefix) + 4, "end_index": len(prefix) + 8}
        annotation = {
            "type": "url_citation",
            "url_citation": {**citation, "title": "Docs", "url": "https://d"},
        }
        source = _completion({"content": prefix + "See docs.", "annotations": [annotation]})
        out = chat_completion_to_response(source, context())
        validate_response(out)
        part = next(i for i in out["output"] if i["type"] == "message")["content"][0]
        (mapped,) = part["annotations"]
        assert part["text"][mapped["start_index"] : mapped["end_index"]] == "docs"
        assert (mapped["title"], mapped["url"]) == ("Docs", "https://d")


def test_logprobs_move_to_the_output_text_part() -> None:
    source = _completion({"content": "Hi"})
    source["choices"][0]["logprobs"] = {
        "content": [
            {
                "token": "Hi",
                "logprob": -0.5,
                "bytes": None,
                "top_logprobs": [{"token": "Hi", "logprob": -0.5, "bytes": [72, 105]}],
            }
        ],
        "refusal": None,
    }
    out = chat_completion_to_response(source, context())
    validate_response(out)
    assert out["output"][0]["content"][0]["logprobs"] == [
        {
            "token": "Hi",
            "bytes": [72, 105],
            "logprob": -0.5,
            "top_logprobs": [{"token": "Hi", "bytes": [72, 105], "logprob": -0.5}],
        }
    ]


@pytest.mark.parametrize(
    "usage",
    [None, {}, {"prompt_tokens": 3}, {"completion_tokens": 3, "total_tokens": 3}],
    ids=repr,
)
def test_checklist_24_unknown_usage_is_null(usage: Any) -> None:
    out = chat_completion_to_response(_completion({"content": "x"}, usage=usage), context())
    assert validate_response(out).usage is None


def test_checklist_24_usage_maps_exactly() -> None:
    out = chat_completion_to_response(_completion({"content": "x"}), context())
    assert out["usage"] == {
        "input_tokens": 339,
        "input_tokens_details": {"cached_tokens": 320, "cache_write_tokens": 0},
        "output_tokens": 92,
        "output_tokens_details": {"reasoning_tokens": 48},
        "total_tokens": 431,
    }


def test_checklist_24_cache_writes_survive_both_ways() -> None:
    usage = {**USAGE, "prompt_tokens_details": {"cached_tokens": 320, "cache_write_tokens": 7}}
    out = chat_completion_to_response(_completion({"content": "x"}, usage=usage), context())
    assert validate_response(out).usage.input_tokens_details.cache_write_tokens == 7
    back = response_to_chat_completion(out, context())
    assert back["usage"] == usage


# --- round trip property -------------------------------------------------------------------

_text = st.text(min_size=1).filter(
    lambda s: s.strip() and "<think>" not in s and "</think>" not in s
)
_names = st.from_regex(r"[a-zA-Z0-9_-]{1,64}", fullmatch=True)
# orjson refuses integers past 64 bits.
_arguments = st.dictionaries(
    st.text(max_size=8), st.integers(-(2**53), 2**53) | st.text(max_size=8)
).map(lambda value: orjson.dumps(value).decode())


@st.composite
def _completions(draw: st.DrawFn) -> dict[str, Any]:
    calls = draw(
        st.lists(
            st.tuples(st.uuids().map(lambda u: f"call_{u.hex}"), _names, _arguments), max_size=3
        )
    )
    content = draw(st.none() | _text)
    prompt, completion = draw(st.integers(0, 10**6)), draw(st.integers(0, 10**6))
    message: dict[str, Any] = {"content": content}
    if reasoning := draw(st.none() | _text.map(str.strip)):
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = [_call(i, n, a) for i, n, a in calls]
    finish = "tool_calls" if calls else draw(st.sampled_from(["stop", "length"]))
    usage = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": draw(st.integers(0, prompt))},
        "completion_tokens_details": {"reasoning_tokens": draw(st.integers(0, completion))},
    }
    return _completion(message, finish, usage=usage)


@given(_completions(), st.sampled_from(MODES))
def test_round_trip_keeps_text_calls_and_usage(source: dict[str, Any], mode: str) -> None:
    response = chat_completion_to_response(source, context())
    validate_response(response)
    back = response_to_chat_completion(response, context(mode))
    validate_chat(back)
    original, returned = source["choices"][0], back["choices"][0]
    content = returned["message"]["content"]
    reasoning = original["message"].get("reasoning_content")
    if mode == "think-tags" and reasoning:
        # The wrapper's layout absorbs leading whitespace of the answer; nothing else changes.
        expected = (original["message"]["content"] or "").lstrip()
        assert split_think_tags(content) == (reasoning, expected)
    else:
        assert content == original["message"]["content"] or (
            content == "" and original["message"]["content"] is None
        )
    if mode in ("reasoning_content", "reasoning"):
        assert returned["message"].get(mode) == reasoning
    assert returned["message"].get("tool_calls") == original["message"].get("tool_calls")
    assert returned["finish_reason"] == original["finish_reason"]
    assert back["usage"] == source["usage"]
