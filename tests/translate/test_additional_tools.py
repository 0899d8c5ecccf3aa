"""Codex's configuring input items: ``additional_tools`` and ``configuration_update``.

Codex in its default configuration declares its tools in an ``additional_tools`` input item
(namespaces of ``custom`` and ``function`` tools) with no top-level ``tools``, and sets the
reasoning effort with a ``configuration_update`` item. Both directions are checked: toward a
chat upstream (the tools become chat functions whose calls come back as the client's items)
and toward a third-party Responses server (the tools hoisted to top-level functions, the calls
restored in its stream and JSON answers) — with property tests over random tool sets, as the
openai SDK's Responses stream helper sees the result.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmitm.exchange.request import prepare_request
from llmitm.exchange.response import stream_pipeline, translate_body
from llmitm.routing.config import Endpoint
from llmitm.routing.plan import plan_for_endpoint
from llmitm.translate.body_to_responses import chat_completion_to_response
from llmitm.translate.context import TranslateOptions, TranslationContext
from llmitm.translate.errors import TranslationError
from llmitm.translate.guard import StreamGuard
from llmitm.translate.pipeline import StreamPipeline
from llmitm.translate.request_to_chat import responses_request_to_chat
from llmitm.translate.responses_compat import (
    needs_rewrite,
    responses_request_for_compatible,
    restore_response_calls,
)
from llmitm.translate.tools import CHAT_NAME_PATTERN
from llmitm.wire.ids import CountingIds, fixed_clock
from tests.helpers.codex_parser import sse_json_events
from tests.helpers.oracle import sdk_responses_stream
from tests.translate.test_stream_to_responses import assert_conformant

NOW = 1_700_000_000
SCRIPT_GRAMMAR = {"type": "grammar", "syntax": "lark", "definition": "start: /[\\s\\S]+/"}


def options() -> TranslateOptions:
    return TranslateOptions(ids=CountingIds(), clock=fixed_clock(NOW))


def codex_body(tools: list[dict[str, Any]], *extra_items: dict[str, Any]) -> dict[str, Any]:
    """A request shaped like Codex 0.171's default one (no top-level tools)."""
    return {
        "model": "gpt-6.2-sol",
        "stream": True,
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "reasoning": {"effort": "medium", "context": "all_turns"},
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "text": {"verbosity": "low"},
        "input": [
            {"type": "additional_tools", "id": "at_1", "role": "developer", "tools": tools},
            {
                "type": "message",
                "role": "developer",
                "content": [{"type": "input_text", "text": "Be brief."}],
            },
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "ls"}]},
            {"type": "configuration_update", "reasoning": {"effort": "low"}},
            *extra_items,
        ],
    }


CODEX_TOOLS = [
    {
        "type": "namespace",
        "name": "functions",
        "description": "",
        "tools": [
            {
                "type": "custom",
                "name": "exec",
                "description": "Run a script.",
                "format": SCRIPT_GRAMMAR,
            },
            {
                "type": "function",
                "name": "wait",
                "description": "Wait for a cell.",
                "strict": False,
                "parameters": {"type": "object", "properties": {"cell_id": {"type": "string"}}},
            },
        ],
    },
    {
        "type": "namespace",
        "name": "clock",
        "description": "Time.",
        "tools": [{"type": "function", "name": "sleep", "parameters": {"type": "object"}}],
    },
]


# --- toward a chat upstream ------------------------------------------------------------------


def test_additional_tools_become_chat_functions_and_the_update_sets_the_effort() -> None:
    mapped = responses_request_to_chat(codex_body(CODEX_TOOLS), options())
    chat = mapped.body
    names = [tool["function"]["name"] for tool in chat["tools"]]
    assert names == ["functions__exec", "functions__wait", "clock__sleep"]
    exec_tool = chat["tools"][0]["function"]
    assert exec_tool["parameters"]["required"] == ["input"]
    assert "lark grammar" in exec_tool["parameters"]["properties"]["input"]["description"]
    assert chat["tool_choice"] == "auto"
    assert chat["parallel_tool_calls"] is False
    assert chat["reasoning_effort"] == "low"  # the update, not the top-level "medium"
    # Neither configuring item is conversation, and nothing is reported as dropped.
    assert [m["role"] for m in chat["messages"]] == ["system", "user"]
    assert mapped.warnings == []


def test_a_tool_loop_in_history_replays_as_chat_calls_of_the_same_names() -> None:
    body = codex_body(
        CODEX_TOOLS,
        {
            "type": "custom_tool_call",
            "call_id": "call_1",
            "name": "exec",
            "namespace": "functions",
            "input": "text(1)",
        },
        {"type": "custom_tool_call_output", "call_id": "call_1", "output": "1"},
    )
    chat = responses_request_to_chat(body, options()).body
    assistant, tool = chat["messages"][-2:]
    [call] = assistant["tool_calls"]
    assert call["function"] == {"name": "functions__exec", "arguments": '{"input":"text(1)"}'}
    assert tool == {"role": "tool", "tool_call_id": "call_1", "content": "1"}


def test_a_tool_declared_again_by_a_later_item_is_one_function() -> None:
    """A conversation resent whole carries each turn's item; the newest definition wins."""
    newer = json.loads(json.dumps(CODEX_TOOLS))
    newer[1]["tools"][0]["description"] = "Sleep (newer)."
    body = codex_body(CODEX_TOOLS)
    body["input"].append({"type": "additional_tools", "tools": newer})
    chat = responses_request_to_chat(body, options()).body
    names = [tool["function"]["name"] for tool in chat["tools"]]
    assert names == ["functions__exec", "functions__wait", "clock__sleep"]
    assert chat["tools"][2]["function"]["description"] == "Sleep (newer)."


def test_two_different_tools_with_one_chat_name_are_refused() -> None:
    clash = [{"type": "function", "name": "functions__exec", "parameters": {"type": "object"}}]
    body = codex_body(CODEX_TOOLS)
    body["input"].append({"type": "additional_tools", "tools": clash})
    with pytest.raises(TranslationError, match="both become the chat function 'functions__exec'"):
        responses_request_to_chat(body, options())


def test_hosted_tools_inside_additional_tools_are_dropped_with_a_warning() -> None:
    tools = [*CODEX_TOOLS, {"type": "web_search"}]
    mapped = responses_request_to_chat(codex_body(tools), options())
    assert len(mapped.body["tools"]) == 3
    assert mapped.warnings == [
        "dropped hosted tool 'web_search' (input[0].tools[2]): a chat upstream cannot run it"
    ]
    strict = TranslateOptions(strict=True)
    with pytest.raises(TranslationError, match="hosted 'web_search' tool"):
        responses_request_to_chat(codex_body(tools), strict)


def test_additional_tools_without_a_tool_list_is_a_400() -> None:
    body = codex_body(CODEX_TOOLS)
    body["input"][0]["tools"] = {"not": "a list"}
    with pytest.raises(TranslationError, match=r"input\[0\]\.tools must be an array") as info:
        responses_request_to_chat(body, options())
    assert info.value.to_api_error().status == 400


def test_an_update_of_something_else_is_reported() -> None:
    body = codex_body(CODEX_TOOLS)
    body["input"][3]["model"] = "other"
    mapped = responses_request_to_chat(body, options())
    assert mapped.warnings == [
        "ignored input[3].model: llmitm applies only reasoning from an update"
    ]


# --- toward a third-party Responses server ----------------------------------------------------


def test_compatible_rewrite_hoists_the_tools_and_keeps_only_items_the_server_reads() -> None:
    body = codex_body(
        CODEX_TOOLS,
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAA"},
        {
            "type": "custom_tool_call",
            "id": "ctc_1",
            "call_id": "call_1",
            "name": "exec",
            "namespace": "functions",
            "input": "text(1)",
        },
        {"type": "custom_tool_call_output", "call_id": "call_1", "output": "1"},
        {"type": "function_call", "call_id": "call_2", "name": "sleep", "namespace": "clock",
         "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_2", "output": "slept"},
    )  # fmt: skip
    assert needs_rewrite(body)
    mapped = responses_request_for_compatible(body, options())
    sent = mapped.body
    assert [tool["name"] for tool in sent["tools"]] == [
        "functions__exec",
        "functions__wait",
        "clock__sleep",
    ]
    assert all(tool["type"] == "function" for tool in sent["tools"])
    assert sent["reasoning"] == {"effort": "low", "context": "all_turns"}
    kinds = [item["type"] for item in sent["input"]]
    assert kinds == ["message", "message"] + ["function_call", "function_call_output"] * 2
    # Chat templates often know no "developer" role: system, as the chat translation sends.
    assert [item["role"] for item in sent["input"][:2]] == ["system", "user"]
    custom_call, custom_output, call, _ = sent["input"][2:]
    assert custom_call == {
        "type": "function_call",
        "id": "ctc_1",
        "call_id": "call_1",
        "name": "functions__exec",
        "arguments": '{"input":"text(1)"}',
    }
    assert custom_output == {"type": "function_call_output", "call_id": "call_1", "output": "1"}
    assert call["name"] == "clock__sleep" and "namespace" not in call
    assert mapped.warnings == [
        "dropped 1 reasoning input item(s): the endpoint's Responses API cannot replay them"
    ]
    assert body["input"][0]["type"] == "additional_tools"  # the client's body is left alone


def test_a_plain_request_needs_no_rewrite() -> None:
    body = {
        "model": "m",
        "input": [{"type": "message", "role": "user", "content": "hi"}],
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
        "tool_choice": "auto",
    }
    assert not needs_rewrite(body)


def test_an_assistant_turn_without_a_type_gets_one() -> None:
    """llama.cpp reads a role-only item as an input message, and refuses an assistant one."""
    body = {
        "model": "m",
        "input": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "output_text", "text": "hello"}]},
            {"role": "user", "content": "again"},
        ],
    }
    assert needs_rewrite(body)
    sent = responses_request_for_compatible(body, options()).body
    assert [item.get("type") for item in sent["input"]] == ["message"] * 3
    assert sent["input"][1]["content"] == body["input"][1]["content"]


def test_a_tool_output_with_an_image_keeps_its_text_for_the_server() -> None:
    """Codex's exec can return images (its ``image()`` helper); llama.cpp takes only text
    tool outputs and would refuse the whole turn."""
    image = {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}
    text = {"type": "input_text", "text": "done"}
    body = codex_body(
        CODEX_TOOLS,
        {"type": "custom_tool_call", "call_id": "c", "name": "exec", "namespace": "functions",
         "input": "image(x)"},
        {"type": "custom_tool_call_output", "call_id": "c", "output": [text, image]},
    )  # fmt: skip
    mapped = responses_request_for_compatible(body, options())
    assert mapped.body["input"][-1] == {
        "type": "function_call_output",
        "call_id": "c",
        "output": [text],
    }
    assert mapped.warnings == [
        "dropped non-text output of input[5]: the endpoint's Responses API takes only text "
        "tool outputs"
    ]


def test_a_named_tool_choice_uses_the_flattened_name() -> None:
    body = codex_body(CODEX_TOOLS)
    body["tool_choice"] = {"type": "custom", "name": "exec", "namespace": "functions"}
    sent = responses_request_for_compatible(body, options()).body
    assert sent["tool_choice"] == {"type": "function", "name": "functions__exec"}


# --- property tests: any tool set, both directions --------------------------------------------

_name = st.from_regex(r"[a-z][a-z0-9_]{0,12}", fullmatch=True).filter(lambda n: "__" not in n)
_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30)


@st.composite
def tool_sets(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[tuple[str | None, str, str]]]:
    """Tools as Codex nests them, and every callable one as ``(namespace, name, kind)``."""
    declared: list[dict[str, Any]] = []
    callable_tools: list[tuple[str | None, str, str]] = []
    seen: set[str] = set()
    for namespace in draw(st.lists(_name | st.none(), min_size=1, max_size=3)):
        inner: list[dict[str, Any]] = []
        for name in draw(st.lists(_name, min_size=1, max_size=3)):
            flat = f"{namespace}__{name}" if namespace else name
            if flat in seen:
                continue
            seen.add(flat)
            kind = draw(st.sampled_from(["custom", "function"]))
            tool: dict[str, Any] = {"type": kind, "name": name}
            if kind == "function":
                tool["parameters"] = {"type": "object", "properties": {}}
            inner.append(tool)
            callable_tools.append((namespace, name, kind))
        if namespace is None:
            declared += inner
        else:
            declared.append({"type": "namespace", "name": namespace, "tools": inner})
    return declared, callable_tools


def _expected(calls: list[tuple[str | None, str, str]], payloads: list[str]) -> list[tuple]:
    return [
        (namespace, name, "custom_tool_call" if kind == "custom" else "function_call", payload)
        for (namespace, name, kind), payload in zip(calls, payloads, strict=True)
    ]


def _arguments(kind: str, payload: str) -> str:
    return json.dumps({"input": payload}) if kind == "custom" else payload


def _seen(output: list[Any]) -> list[tuple]:
    """``(namespace, name, type, input-or-arguments)`` of each call, from SDK objects or dicts."""
    items = [item if isinstance(item, dict) else item.model_dump() for item in output]
    return [
        (
            item.get("namespace"),
            item["name"],
            item["type"],
            item["input"] if item["type"] == "custom_tool_call" else item["arguments"],
        )
        for item in items
        if item["type"] in ("function_call", "custom_tool_call")
    ]


def _payloads(draw: st.DrawFn, calls: list[tuple[str | None, str, str]]) -> list[str]:
    return [
        draw(_text) if kind == "custom" else json.dumps({"x": draw(_text)}) for _, _, kind in calls
    ]


def _chat_stream(chat_names: list[str], arguments: list[str]) -> bytes:
    """A chat upstream's stream calling each function once, arguments in two pieces."""
    frames = []
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": NOW, "model": "m"}
    for index, (name, args) in enumerate(zip(chat_names, arguments, strict=True)):
        half = len(args) // 2
        for piece, head in ((args[:half], True), (args[half:], False)):
            call: dict[str, Any] = {"index": index, "function": {"arguments": piece}}
            if head:
                call.update(id=f"call_{index}", type="function")
                call["function"]["name"] = name
            delta = {"role": "assistant", "tool_calls": [call]}
            frames.append(dict(base, choices=[{"index": 0, "delta": delta}]))
    frames.append(dict(base, choices=[{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]))
    body = b"".join(b"data: " + json.dumps(frame).encode() + b"\n\n" for frame in frames)
    return body + b"data: [DONE]\n\n"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_additional_tools_round_trip_over_a_chat_upstream(data: st.DataObject) -> None:
    """Every tool of any ``additional_tools`` set gets a valid, distinct chat name, and a
    chat call of that name comes back — streamed and as JSON — as the item the client
    declared: its namespace, its name, its type, its input or arguments."""
    declared, calls = data.draw(tool_sets())
    mapped = responses_request_to_chat(codex_body(declared), options())
    chat_names = [tool["function"]["name"] for tool in mapped.body["tools"]]
    assert len(chat_names) == len(calls) == len(set(chat_names))
    assert all(CHAT_NAME_PATTERN.fullmatch(name) for name in chat_names)
    payloads = _payloads(data.draw, calls)
    arguments = [_arguments(kind, p) for (_, _, kind), p in zip(calls, payloads, strict=True)]
    expected = _expected(calls, payloads)

    pipeline = StreamPipeline("chat-to-responses", mapped.context)
    raw = _chat_stream(chat_names, arguments)
    sse = pipeline.start() + pipeline.feed(raw) + pipeline.close()
    assert_conformant(sse_json_events(sse))
    _events, response = sdk_responses_stream(sse)
    assert _seen(response.output) == expected

    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": a}}
            for i, (n, a) in enumerate(zip(chat_names, arguments, strict=True))
        ],
    }
    completion = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": NOW,
        "model": "m",
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
    }
    assert _seen(chat_completion_to_response(completion, mapped.context)["output"]) == expected


def _server_stream(names: list[str], arguments: list[str]) -> bytes:
    """A llama.cpp-like Responses stream (no sequence numbers, no output indexes) calling each
    function once."""
    head = {"id": "resp_1", "object": "response", "status": "in_progress"}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": head},
        {"type": "response.in_progress", "response": head},
    ]
    items = []
    for index, (name, args) in enumerate(zip(names, arguments, strict=True)):
        added = {"type": "function_call", "id": f"fc_{index}", "call_id": f"call_{index}",
                 "name": name, "arguments": "", "status": "in_progress"}  # fmt: skip
        done = dict(added, arguments=args, status="completed")
        items.append(done)
        events += [
            {"type": "response.output_item.added", "item": added},
            {"type": "response.function_call_arguments.delta", "item_id": f"fc_{index}",
             "delta": args},
            {"type": "response.function_call_arguments.done", "item_id": f"fc_{index}",
             "arguments": args},
            {"type": "response.output_item.done", "item": done},
        ]  # fmt: skip
    response = {"id": "resp_1", "object": "response", "status": "completed", "output": items}
    events.append({"type": "response.completed", "response": response})
    return b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_additional_tools_round_trip_over_a_compatible_responses_server(
    data: st.DataObject,
) -> None:
    """The same over a third-party Responses server: the tools arrive as top-level functions,
    and the server's calls of them reach the client as the items it declared, in a stream
    the SDK's helper accepts and in a JSON answer."""
    declared, calls = data.draw(tool_sets())
    mapped = responses_request_for_compatible(codex_body(declared), options())
    sent = mapped.body
    assert all(item["type"] == "message" for item in sent["input"])
    names = [tool["name"] for tool in sent["tools"]]
    assert all(tool["type"] == "function" for tool in sent["tools"])
    assert len(names) == len(calls) == len(set(names))
    payloads = _payloads(data.draw, calls)
    arguments = [_arguments(kind, p) for (_, _, kind), p in zip(calls, payloads, strict=True)]
    expected = _expected(calls, payloads)

    pipeline = StreamPipeline("normalise-responses", mapped.context)
    sse = pipeline.start() + pipeline.feed(_server_stream(names, arguments)) + pipeline.close()
    assert_conformant(sse_json_events(sse))
    _events, response = sdk_responses_stream(sse)
    assert _seen(response.output) == expected

    body = {"id": "resp_1", "object": "response", "status": "completed", "output": [
        {"type": "function_call", "id": f"fc_{i}", "call_id": f"call_{i}", "name": n,
         "arguments": a, "status": "completed"}
        for i, (n, a) in enumerate(zip(names, arguments, strict=True))
    ]}  # fmt: skip
    restore_response_calls(body, mapped.context)
    assert _seen(body["output"]) == expected


def test_an_unrenamed_context_leaves_the_server_stream_alone() -> None:
    """Plain function tools need no restoring: the stream keeps the server's names."""
    context = TranslationContext(options())
    pipeline = StreamPipeline("normalise-responses", context)
    raw = _server_stream(["lookup"], ['{"q": 1}'])
    _events, response = sdk_responses_stream(pipeline.feed(raw) + pipeline.close())
    assert _seen(response.output) == [(None, "lookup", "function_call", '{"q": 1}')]


# --- the exchange: which endpoints get the rewrite --------------------------------------------


def _endpoint(kind: str) -> Endpoint:
    return Endpoint(
        name="e",
        kind=kind,  # type: ignore[arg-type]
        base_url="http://127.0.0.1:9/v1",
        apis=frozenset({"responses"}),
    )


@pytest.mark.parametrize("kind", ["openai", "azure"])
def test_openai_and_azure_endpoints_get_codex_shapes_byte_for_byte(kind: str) -> None:
    body = codex_body(CODEX_TOOLS)
    content = orjson.dumps(body)
    plan = plan_for_endpoint(_endpoint(kind), "responses", "gpt-6.2-sol")
    prepared = prepare_request(content, body, "gpt-6.2-sol", plan, options())
    if kind == "openai":
        assert prepared.content == content
    else:  # Azure gets its deployment name, nothing else changes
        assert orjson.loads(prepared.content)["input"] == body["input"]
    assert prepared.context.tools == {}
    assert isinstance(stream_pipeline(plan, prepared.context), StreamGuard)


def test_a_compatible_endpoint_gets_the_rewrite_and_its_answers_are_restored() -> None:
    body = codex_body(CODEX_TOOLS)
    plan = plan_for_endpoint(_endpoint("compatible"), "responses", "gpt-6.2-sol")
    prepared = prepare_request(orjson.dumps(body), body, "gpt-6.2-sol", plan, options())
    sent = orjson.loads(prepared.content)
    assert [tool["name"] for tool in sent["tools"]][:1] == ["functions__exec"]
    assert all(item["type"] == "message" for item in sent["input"])

    pipeline = stream_pipeline(plan, prepared.context)
    assert isinstance(pipeline, StreamPipeline)  # even for a conformant server: calls to restore
    raw = _server_stream(["functions__exec"], ['{"input": "text(1)"}'])
    _events, response = sdk_responses_stream(pipeline.feed(raw) + pipeline.close())
    assert _seen(response.output) == [("functions", "exec", "custom_tool_call", "text(1)")]

    answer = {"id": "resp_1", "object": "response", "status": "completed", "output": [
        {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "clock__sleep",
         "arguments": "{}", "status": "completed"}]}  # fmt: skip
    translated = translate_body(200, orjson.dumps(answer), plan, prepared.context)
    assert translated is not None
    status, content = translated
    assert status == 200
    assert _seen(orjson.loads(content)["output"]) == [("clock", "sleep", "function_call", "{}")]


def test_a_plain_request_to_a_compatible_endpoint_is_forwarded_as_is() -> None:
    body = {"model": "m", "input": "hi", "stream": True}
    content = orjson.dumps(body)
    plan = plan_for_endpoint(_endpoint("compatible"), "responses", "m")
    prepared = prepare_request(content, body, "m", plan, options())
    assert prepared.content == content
    assert translate_body(200, b'{"output": []}', plan, prepared.context) is None
