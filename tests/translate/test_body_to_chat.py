"""response_to_chat_completion / response_failure: Responses bodies for chat clients."""

from __future__ import annotations

from typing import Any

import pytest

from llmitm.translate.body_to_chat import response_failure, response_to_chat_completion
from llmitm.wire.objects import (
    custom_tool_call_item,
    function_call_item,
    message_item,
    output_text_part,
    reasoning_item,
    refusal_part,
    response_object,
)
from tests.helpers._fixtures_body import MODES, context, load_real, real_cases, validate_chat

USAGE = {
    "input_tokens": 120,
    "input_tokens_details": {"cached_tokens": 64},
    "output_tokens": 80,
    "output_tokens_details": {"reasoning_tokens": 50},
    "total_tokens": 200,
}


def _response(*output: dict[str, Any], status: str = "completed", **fields: Any) -> dict[str, Any]:
    response = response_object(
        response_id="resp_abc", created_at=1_700_000_000, model="gpt-5", status=status
    )
    response["output"] = list(output)
    response["usage"] = USAGE
    response.update(fields)
    return response


def _text(text: str) -> dict[str, Any]:
    return message_item("msg_1", [output_text_part(text)], "completed")


# --- real captured Responses bodies -------------------------------------------------------


def _expected_reasoning(item: dict[str, Any]) -> str:
    texts = [part["text"] for part in item.get("summary") or [] if part.get("text")]
    if not texts:
        texts = [part["text"] for part in item.get("content") or [] if part.get("text")]
    return "\n\n".join(texts)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", real_cases("responses"))
def test_real_responses_bodies_keep_their_meaning(name: str, mode: str) -> None:
    source, _ = load_real(name)
    out = response_to_chat_completion(source, context(mode))
    completion = validate_chat(out)
    choice = completion.choices[0]
    assert len(completion.choices) == 1
    assert completion.id == f"chatcmpl-{source['id']}"
    assert completion.created == source["created_at"]
    assert completion.model == source["model"]

    texts = [
        part["text"]
        for item in source["output"]
        if item["type"] == "message"
        for part in item["content"]
        if part["type"] == "output_text"
    ]
    reasoning = "\n\n".join(
        text
        for text in (_expected_reasoning(i) for i in source["output"] if i["type"] == "reasoning")
        if text
    )
    content = "".join(texts)
    if mode == "think-tags" and reasoning:
        content = f"<think>\n{reasoning}\n</think>\n\n{content}"
    calls = [item for item in source["output"] if item["type"] == "function_call"]
    if not content:  # OpenAI sends null content for a pure tool-call turn
        content = None if calls else ""
    assert choice.message.content == content
    assert (choice.message.model_extra or {}).get(mode) == (reasoning or None)

    assert [
        (c.id, c.function.name, c.function.arguments) for c in choice.message.tool_calls or []
    ] == [(c["call_id"], c["name"], c["arguments"]) for c in calls]
    assert choice.finish_reason == ("tool_calls" if calls else "stop")

    # checklist 24: exact usage, cached and reasoning tokens included.
    usage = source["usage"]
    assert completion.usage is not None
    assert completion.usage.prompt_tokens == usage["input_tokens"]
    assert completion.usage.completion_tokens == usage["output_tokens"]
    assert completion.usage.total_tokens == usage["total_tokens"]
    assert completion.usage.prompt_tokens_details is not None
    assert completion.usage.completion_tokens_details is not None
    assert (
        completion.usage.prompt_tokens_details.cached_tokens
        == usage["input_tokens_details"]["cached_tokens"]
    )
    assert (
        completion.usage.completion_tokens_details.reasoning_tokens
        == usage["output_tokens_details"]["reasoning_tokens"]
    )
    assert response_failure(source) is None


def test_real_azure_reasoning_body_is_plain_text() -> None:
    source, _ = load_real("pydantic-ai-azure-responses-reasoning")
    out = response_to_chat_completion(source, context(model="my-deployment"))
    completion = validate_chat(out)
    assert completion.choices[0].message.content == "Paris"
    assert completion.model == "my-deployment"  # the client's name, not the upstream's
    assert completion.service_tier == "default"
    assert completion.system_fingerprint is None


# --- reasoning, all four modes ------------------------------------------------------------

REASONING = reasoning_item("rs_1", ["First I look.", "Then I answer."])


@pytest.mark.parametrize(
    ("mode", "content", "extra"),
    [
        ("think-tags", "<think>\nFirst I look.\n\nThen I answer.\n</think>\n\nHello", {}),
        ("reasoning_content", "Hello", {"reasoning_content": "First I look.\n\nThen I answer."}),
        ("reasoning", "Hello", {"reasoning": "First I look.\n\nThen I answer."}),
        ("drop", "Hello", {}),
    ],
)
def test_checklist_38_reasoning_summary_per_mode(
    mode: str, content: str, extra: dict[str, str]
) -> None:
    out = response_to_chat_completion(_response(REASONING, _text("Hello")), context(mode))
    message = validate_chat(out).choices[0].message
    assert message.content == content
    assert (message.model_extra or {}) == extra


@pytest.mark.parametrize("mode", MODES)
def test_raw_reasoning_text_content_is_used_without_summary(mode: str) -> None:
    item = {
        "id": "rs_1",
        "type": "reasoning",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": "raw chain of thought"}],
    }
    out = response_to_chat_completion(_response(item, _text("Hi")), context(mode))
    message = out["choices"][0]["message"]
    validate_chat(out)
    if mode == "think-tags":
        assert message["content"] == "<think>\nraw chain of thought\n</think>\n\nHi"
    elif mode == "drop":
        assert message["content"] == "Hi"
        assert "reasoning" not in message and "reasoning_content" not in message
    else:
        assert message[mode] == "raw chain of thought"


def test_encrypted_only_reasoning_adds_nothing() -> None:
    item = {"id": "rs_1", "type": "reasoning", "summary": [], "encrypted_content": "gAAA"}
    out = response_to_chat_completion(_response(item, _text("Hi")), context("think-tags"))
    assert out["choices"][0]["message"]["content"] == "Hi"


def test_interleaved_reasoning_items_are_joined() -> None:
    out = response_to_chat_completion(
        _response(
            reasoning_item("rs_1", ["one"]),
            function_call_item("fc_1", "call_1", "f", "{}", "completed"),
            reasoning_item("rs_2", ["two"]),
            _text("done"),
        ),
        context("reasoning_content"),
    )
    assert out["choices"][0]["message"]["reasoning_content"] == "one\n\ntwo"


def test_think_tags_with_only_tool_calls() -> None:
    out = response_to_chat_completion(
        _response(REASONING, function_call_item("fc_1", "call_1", "f", "{}", "completed")),
        context("think-tags"),
    )
    validate_chat(out)
    content = out["choices"][0]["message"]["content"]
    assert content == "<think>\nFirst I look.\n\nThen I answer.\n</think>\n\n"


# --- text, tool calls, refusal ------------------------------------------------------------


def test_checklist_18_text_before_tool_calls_survives() -> None:
    out = response_to_chat_completion(
        _response(
            _text("Let me check both."),
            function_call_item("fc_1", "call_a", "weather", '{"city":"Paris"}', "completed"),
            function_call_item("fc_2", "call_b", "time", '{"tz":"CET"}', "completed"),
        ),
        context("drop"),
    )
    choice = validate_chat(out).choices[0]
    assert choice.message.content == "Let me check both."
    assert [(c.id, c.function.name, c.function.arguments) for c in choice.message.tool_calls] == [
        ("call_a", "weather", '{"city":"Paris"}'),
        ("call_b", "time", '{"tz":"CET"}'),
    ]
    assert choice.finish_reason == "tool_calls"


def test_text_parts_of_several_messages_concatenate() -> None:
    out = response_to_chat_completion(
        _response(
            message_item(
                "msg_1", [output_text_part("Hello, "), output_text_part("world")], "completed"
            ),
            message_item("msg_2", [output_text_part("!")], "completed"),
        ),
        context(),
    )
    assert validate_chat(out).choices[0].message.content == "Hello, world!"


def test_tool_calls_only_have_null_content() -> None:
    out = response_to_chat_completion(
        _response(function_call_item("fc_1", "call_a", "f", "{}", "completed")), context()
    )
    assert validate_chat(out).choices[0].message.content is None


def test_empty_output_gives_empty_content_and_stop() -> None:
    out = response_to_chat_completion(_response(), context())
    choice = validate_chat(out).choices[0]
    assert choice.message.content == ""
    assert choice.finish_reason == "stop"
    assert choice.message.tool_calls is None


def test_namespaced_call_uses_the_flattened_chat_name() -> None:
    item = function_call_item("fc_1", "call_a", "search", "{}", "completed", namespace="mcp_docs")
    out = response_to_chat_completion(_response(item), context())
    call = validate_chat(out).choices[0].message.tool_calls[0]
    assert call.function.name == "mcp_docs__search"


def test_custom_tool_call_becomes_a_chat_custom_call() -> None:
    item = custom_tool_call_item("ctc_1", "call_p", "apply_patch", "*** Begin Patch", "completed")
    out = response_to_chat_completion(_response(item), context())
    choice = validate_chat(out).choices[0]
    call = choice.message.tool_calls[0]
    assert call.type == "custom"
    assert (call.id, call.custom.name, call.custom.input) == (
        "call_p",
        "apply_patch",
        "*** Begin Patch",
    )
    assert choice.finish_reason == "tool_calls"


def test_refusal_part_becomes_message_refusal() -> None:
    item = message_item("msg_1", [refusal_part("I can't help with that.")], "completed")
    out = response_to_chat_completion(_response(item), context())
    message = validate_chat(out).choices[0].message
    assert message.refusal == "I can't help with that."
    assert message.content is None


def test_hosted_tool_items_are_skipped() -> None:
    search = {"id": "ws_1", "type": "web_search_call", "status": "completed", "action": {}}
    out = response_to_chat_completion(_response(search, _text("Found it.")), context())
    choice = validate_chat(out).choices[0]
    assert choice.message.content == "Found it."
    assert choice.finish_reason == "stop"


def test_url_citations_shift_to_their_place_in_content() -> None:
    cited = output_text_part("See docs.")
    cited["annotations"] = [
        {"type": "url_citation", "start_index": 4, "end_index": 8, "title": "Docs", "url": "u"}
    ]
    item = message_item("msg_1", [output_text_part("Intro. "), cited], "completed")
    plain = response_to_chat_completion(_response(item), context("drop"))
    annotation = validate_chat(plain).choices[0].message.annotations[0]
    content = plain["choices"][0]["message"]["content"]
    assert (
        content[annotation.url_citation.start_index : annotation.url_citation.end_index] == "docs"
    )
    assert (annotation.url_citation.title, annotation.url_citation.url) == ("Docs", "u")

    tagged = response_to_chat_completion(_response(REASONING, item), context("think-tags"))
    annotation = validate_chat(tagged).choices[0].message.annotations[0]
    content = tagged["choices"][0]["message"]["content"]
    assert (
        content[annotation.url_citation.start_index : annotation.url_citation.end_index] == "docs"
    )


def test_output_text_logprobs_reach_the_choice() -> None:
    part = output_text_part("Hi")
    part["logprobs"] = [
        {
            "token": "Hi",
            "bytes": [72, 105],
            "logprob": -0.1,
            "top_logprobs": [{"token": "Hi", "bytes": [72, 105], "logprob": -0.1}],
        }
    ]
    out = response_to_chat_completion(
        _response(message_item("msg_1", [part], "completed")), context()
    )
    logprobs = validate_chat(out).choices[0].logprobs
    assert logprobs is not None and logprobs.content is not None
    assert [(t.token, t.logprob) for t in logprobs.content] == [("Hi", -0.1)]
    assert (
        response_to_chat_completion(_response(_text("x")), context())["choices"][0]["logprobs"]
        is None
    )


# --- status → finish_reason ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("details", "finish_reason"),
    [
        ({"reason": "max_output_tokens"}, "length"),
        ({"reason": "content_filter"}, "content_filter"),
        (None, "length"),
    ],
)
def test_checklist_19_incomplete_maps_to_finish_reason(
    details: dict[str, str] | None, finish_reason: str
) -> None:
    source = _response(_text("cut"), status="incomplete", incomplete_details=details)
    out = response_to_chat_completion(source, context())
    choice = validate_chat(out).choices[0]
    assert choice.finish_reason == finish_reason
    assert choice.message.content == "cut"
    assert response_failure(source) is None


def test_checklist_19_incomplete_with_a_call_is_still_length() -> None:
    source = _response(
        function_call_item("fc_1", "call_a", "f", '{"a":', "incomplete"),
        status="incomplete",
        incomplete_details={"reason": "max_output_tokens"},
    )
    assert response_to_chat_completion(source, context())["choices"][0]["finish_reason"] == (
        "length"
    )


# --- usage ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "usage", [None, {}, {"input_tokens": 5}, {"output_tokens": 3}, "n/a"], ids=repr
)
def test_checklist_24_unknown_usage_is_null(usage: Any) -> None:
    out = response_to_chat_completion(_response(_text("x"), usage=usage), context())
    assert validate_chat(out).usage is None
    assert out["usage"] is None


def test_checklist_24_usage_maps_exactly() -> None:
    out = response_to_chat_completion(_response(_text("x")), context())
    assert out["usage"] == {
        "prompt_tokens": 120,
        "completion_tokens": 80,
        "total_tokens": 200,
        "prompt_tokens_details": {"cached_tokens": 64},
        "completion_tokens_details": {"reasoning_tokens": 50},
    }


# --- failed and cancelled responses --------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "status", "code", "type_"),
    [
        ({"code": "server_error", "message": "boom"}, 500, "server_error", "server_error"),
        (
            {"code": "rate_limit_exceeded", "message": "slow down"},
            429,
            "rate_limit_exceeded",
            "rate_limit_error",
        ),
        (
            {"code": "context_length_exceeded", "message": "too long"},
            400,
            "context_length_exceeded",
            "invalid_request_error",
        ),
        (
            {"code": "invalid_prompt", "message": "flagged"},
            400,
            "invalid_prompt",
            "invalid_request_error",
        ),
        (None, 500, "server_error", "server_error"),
    ],
)
def test_failed_response_is_an_http_error(
    error: dict[str, str] | None, status: int, code: str, type_: str
) -> None:
    source = _response(status="failed", error=error, usage=None)
    failure = response_failure(source)
    assert failure is not None
    assert (failure.status, failure.code, failure.type) == (status, code, type_)
    if error is not None:
        assert failure.message == error["message"]
    # Called anyway, the translator still makes a sane completion.
    out = response_to_chat_completion(source, context())
    assert validate_chat(out).choices[0].finish_reason == "stop"


def test_failed_response_with_partial_calls_does_not_invite_running_them() -> None:
    source = _response(
        function_call_item("fc_1", "call_a", "f", "{", "in_progress"),
        status="failed",
        error={"code": "server_error", "message": "lost"},
    )
    assert response_to_chat_completion(source, context())["choices"][0]["finish_reason"] == "stop"


def test_cancelled_response_is_a_clear_error() -> None:
    failure = response_failure(_response(status="cancelled"))
    assert failure is not None
    assert failure.status == 500
    assert failure.code == "response_cancelled"
    assert "resp_abc" in failure.message and "cancelled" in failure.message


@pytest.mark.parametrize("status", ["completed", "incomplete", "in_progress", "queued"])
def test_non_failed_statuses_are_not_failures(status: str) -> None:
    assert response_failure(_response(status=status)) is None


# --- envelope ------------------------------------------------------------------------------


def test_envelope_fields() -> None:
    out = response_to_chat_completion(_response(_text("x"), service_tier="flex"), context())
    assert out["id"] == "chatcmpl-resp_abc"
    assert out["object"] == "chat.completion"
    assert out["created"] == 1_700_000_000
    assert out["model"] == "gpt-5"
    assert out["system_fingerprint"] is None
    assert out["service_tier"] == "flex"
    assert out["choices"][0]["index"] == 0
    assert out["choices"][0]["message"]["role"] == "assistant"


def test_sparse_body_from_a_small_server_does_not_crash() -> None:
    sparse = {
        "id": "resp_x",
        "status": "completed",
        "output": [{"role": "assistant", "content": [{"type": "output_text", "text": "ok"}]}],
    }
    out = response_to_chat_completion(sparse, context())
    completion = validate_chat(out)
    assert completion.choices[0].message.content == "ok"
    assert completion.usage is None
    assert "service_tier" not in out
