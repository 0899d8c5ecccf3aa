"""responses_request_to_chat: Responses requests for chat-only upstreams."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from llmitm.translate.context import ToolOrigin, TranslateOptions, TranslationContext
from llmitm.translate.errors import TranslationError
from llmitm.translate.request_to_chat import responses_request_to_chat
from llmitm.translate.tools import chat_function_name, restore_call
from llmitm.wire.objects import ECHOED_REQUEST_FIELDS
from tests.helpers.realfixtures import load_json, request_fixtures
from tests.helpers.request_validation import CHAT_NAME, assert_valid_chat_request

OPTIONS = TranslateOptions()
CODEX = "client-codex-0.171.0-exec-turn1.request.json"


def to_chat(body: dict[str, Any], **kwargs: Any) -> tuple[dict[str, Any], Any]:
    mapped = responses_request_to_chat(body, kwargs.pop("options", OPTIONS), **kwargs)
    assert_valid_chat_request(mapped.body)
    return mapped.body, mapped


def request(*items: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"model": "gpt-5", "input": list(items), **fields}


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": text}


def call(call_id: str, name: str = "get_weather", arguments: str = '{"city":"Paris"}') -> dict:
    return {"type": "function_call", "call_id": call_id, "name": name, "arguments": arguments}


def output(call_id: str, text: str = "Sunny") -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": text}


def assistant(text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


FUNCTION_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    "strict": True,
}


def _texts(messages: list[dict[str, Any]]) -> list[str]:
    texts = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            texts.extend(part["text"] for part in content if part.get("type") == "text")
    return texts


# --- real captured requests ----------------------------------------------------------------


@pytest.mark.parametrize("name", request_fixtures("responses"))
def test_real_responses_requests_become_valid_chat_requests(name: str) -> None:
    body = load_json(name)
    chat, mapped = to_chat(body)
    assert chat["model"] == body["model"] == mapped.context.model
    assert mapped.context.echo == {k: body[k] for k in ECHOED_REQUEST_FIELDS if k in body}
    assert bool(chat.get("stream")) == bool(body.get("stream"))
    if body.get("stream"):
        assert chat["stream_options"] == {"include_usage": True}
    text = "\0".join(_texts(chat["messages"]))
    for item in body["input"] if isinstance(body["input"], list) else []:
        for part in item.get("content") if isinstance(item.get("content"), list) else []:
            assert part["text"] in text


def test_codex_request_keeps_its_meaning() -> None:
    """Checklist 26/27: Codex's namespace tools flattened, web_search dropped, no ids leak."""
    body = load_json(CODEX)
    chat, mapped = to_chat(body)

    assert [m["role"] for m in chat["messages"]] == ["system", "system", "user", "user"]
    developer = body["input"][0]["content"][0]["text"]
    assert chat["messages"][0]["content"] == developer
    assert chat["messages"][-1]["content"] == "Say hi"

    names = [tool["function"]["name"] for tool in chat["tools"]]
    assert "exec_command" in names
    namespace = next(tool for tool in body["tools"] if tool["type"] == "namespace")
    for inner in namespace["tools"]:
        flat = f"multi_agent_v1__{inner['name']}"
        assert flat in names
        assert mapped.context.tools[flat] == ToolOrigin(
            "function", inner["name"], namespace="multi_agent_v1"
        )
    assert all(tool["type"] == "function" for tool in chat["tools"])
    assert len(chat["tools"]) == len(body["tools"]) - 2 + len(namespace["tools"])
    assert any("web_search" in warning for warning in mapped.warnings)

    serialized = orjson.dumps(chat).decode()
    for item in body["input"]:
        assert item["id"] not in serialized
    for dropped in ("client_metadata", "include", "store", "reasoning", "prompt_cache_retention"):
        assert dropped not in chat
    assert chat["prompt_cache_key"] == body["prompt_cache_key"]
    assert chat["parallel_tool_calls"] is True
    assert chat["tool_choice"] == "auto"
    assert mapped.context.echo["tools"] == body["tools"]
    assert mapped.context.echo["store"] is False
    # Nothing Codex sends is unknown to the mapper, so the proxy log stays quiet.
    assert mapped.warnings == [
        "dropped hosted tool 'web_search' (tools[8]): a chat upstream cannot run it"
    ]


def test_codex_namespaced_call_restores_to_its_namespace() -> None:
    body = load_json(CODEX)
    _, mapped = to_chat(body)
    item = restore_call(
        "fc_1", "call_1", "multi_agent_v1__spawn_agent", "{}", "completed", mapped.context
    )
    assert item["name"] == "spawn_agent"
    assert item["namespace"] == "multi_agent_v1"


# --- messages --------------------------------------------------------------------------------


def test_string_input_is_one_user_message() -> None:
    chat, _ = to_chat({"model": "m", "input": "Hello"})
    assert chat["messages"] == [{"role": "user", "content": "Hello"}]


def test_checklist_30_instructions_become_the_first_system_message() -> None:
    history = [user("earlier"), assistant("reply")]
    chat, _ = to_chat(
        request(user("now"), instructions="Be brief.", previous_response_id="resp_1"),
        history=history,
    )
    assert chat["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "earlier"},
        {"role": "assistant", "content": "reply"},
        {"role": "user", "content": "now"},
    ]


def test_checklist_30_empty_instructions_add_no_system_message() -> None:
    chat, _ = to_chat(request(user("hi"), instructions=""))
    assert chat["messages"] == [{"role": "user", "content": "hi"}]


def test_developer_messages_become_system_messages() -> None:
    chat, _ = to_chat(
        request(
            {
                "type": "message",
                "role": "developer",
                "content": [
                    {"type": "input_text", "text": "rule one"},
                    {"type": "input_text", "text": "rule two"},
                ],
            },
            {"role": "system", "content": "plain"},
            user("go"),
        )
    )
    assert chat["messages"][:2] == [
        {"role": "system", "content": "rule one\n\nrule two"},
        {"role": "system", "content": "plain"},
    ]


def test_items_without_type_status_or_content_are_accepted() -> None:
    """vLLM #45273: items may omit type and status, assistant content may be empty."""
    chat, _ = to_chat(
        request(
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": []},
            {"role": "assistant", "content": ""},
            {"role": "user", "content": [{"type": "input_text", "text": "again"}]},
        )
    )
    assert chat["messages"] == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": ""},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": "again"},
    ]


def test_content_parts_map_to_chat_parts() -> None:
    chat, mapped = to_chat(
        request(
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "look"},
                    {"type": "input_image", "image_url": "https://x/a.png", "detail": "low"},
                    {"type": "input_image", "file_id": "file-img"},
                    {
                        "type": "input_file",
                        "file_data": "data:application/pdf;base64,AA",
                        "filename": "a.pdf",
                    },
                    {"type": "input_file", "file_id": "file-1"},
                    {"type": "input_audio", "input_audio": {"data": "AAA", "format": "wav"}},
                    {"type": "input_file", "file_url": "https://x/a.pdf"},
                ],
            }
        )
    )
    assert chat["messages"][0]["content"] == [
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": "https://x/a.png", "detail": "low"}},
        {"type": "file", "file": {"file_id": "file-img"}},
        {
            "type": "file",
            "file": {"file_data": "data:application/pdf;base64,AA", "filename": "a.pdf"},
        },
        {"type": "file", "file": {"file_id": "file-1"}},
        {"type": "input_audio", "input_audio": {"data": "AAA", "format": "wav"}},
    ]
    assert any("file_url" in warning for warning in mapped.warnings)


def test_assistant_parts_join_and_refusal_moves_to_its_field() -> None:
    chat, _ = to_chat(
        request(
            user("q"),
            {
                "role": "assistant",
                "content": [
                    {"type": "output_text", "text": "Hel"},
                    {"type": "output_text", "text": "lo"},
                    {"type": "refusal", "refusal": "No."},
                ],
            },
        )
    )
    assert chat["messages"][1] == {"role": "assistant", "content": "Hello", "refusal": "No."}


# --- tool calls in history (checklist 29) ---------------------------------------------------


def test_checklist_29_calls_and_outputs_keep_their_ids() -> None:
    body = load_json("client-openai-agents-responses-tool-loop-turn2.request.json")
    chat, _ = to_chat(body)
    assert chat["messages"] == [
        {"role": "system", "content": "Use the tool."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_fake1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_fake1", "content": "Sunny in Paris"},
    ]
    assert "fc_fake1" not in orjson.dumps(chat).decode()


def test_checklist_29_consecutive_calls_merge_into_the_preceding_text() -> None:
    chat, _ = to_chat(
        request(
            user("two cities"),
            assistant("Checking both."),
            call("call_a", arguments='{"city":"Paris"}'),
            call("call_b", arguments='{"city":"Rome"}'),
            output("call_a", "Sunny"),
            output("call_b", "Rainy"),
        )
    )
    turn = chat["messages"][1]
    assert turn["content"] == "Checking both."
    assert [c["id"] for c in turn["tool_calls"]] == ["call_a", "call_b"]
    assert [m["tool_call_id"] for m in chat["messages"][2:]] == ["call_a", "call_b"]
    assert len(chat["messages"]) == 4


def test_checklist_29_text_after_pending_calls_joins_their_message() -> None:
    chat, _ = to_chat(request(user("q"), call("call_a"), assistant("waiting"), output("call_a")))
    assert chat["messages"][1]["content"] == "waiting"
    assert chat["messages"][2]["role"] == "tool"


def test_invalid_historical_arguments_are_forwarded_verbatim() -> None:
    chat, _ = to_chat(
        request(user("q"), call("call_a", arguments='{"city": "Par'), output("call_a"))
    )
    assert chat["messages"][1]["tool_calls"][0]["function"]["arguments"] == '{"city": "Par'


def test_function_output_parts() -> None:
    """Text parts join into the tool message; media follows the tool run as a user message."""
    text_parts = [{"type": "input_text", "text": '{"a":'}, {"type": "input_text", "text": "1}"}]
    image = {"type": "input_image", "image_url": "https://x/y.png", "detail": "auto"}
    chat, mapped = to_chat(
        request(
            user("q"),
            call("call_a"),
            call("call_b"),
            {"type": "function_call_output", "call_id": "call_a", "output": text_parts},
            {"type": "function_call_output", "call_id": "call_b", "output": [image]},
            assistant("I see it."),
        )
    )
    assert chat["messages"][2] == {"role": "tool", "tool_call_id": "call_a", "content": '{"a":1}'}
    assert chat["messages"][3] == {"role": "tool", "tool_call_id": "call_b", "content": ""}
    assert chat["messages"][4] == {
        "role": "user",
        "content": [
            {"type": "text", "text": "Content returned by tool call call_b:"},
            {"type": "image_url", "image_url": {"url": "https://x/y.png", "detail": "auto"}},
        ],
    }
    assert chat["messages"][5]["content"] == "I see it."
    assert any("call_b" not in w and "input[4]" in w for w in mapped.warnings)


def test_namespaced_call_in_history_uses_the_flattened_name() -> None:
    chat, _ = to_chat(
        request(
            user("q"), {**call("call_a", name="spawn"), "namespace": "agents"}, output("call_a")
        )
    )
    assert chat["messages"][1]["tool_calls"][0]["function"]["name"] == "agents__spawn"


# --- reasoning ----------------------------------------------------------------------------


def test_reasoning_attaches_to_the_next_assistant_message() -> None:
    summary = {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [
            {"type": "summary_text", "text": "First."},
            {"type": "summary_text", "text": "Second."},
        ],
        "encrypted_content": "opaque",
    }
    raw = {
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": "ignored"}],
        "content": [{"type": "reasoning_text", "text": "raw thoughts"}],
    }
    chat, _ = to_chat(
        request(user("q"), summary, call("call_a"), output("call_a"), raw, assistant("done"))
    )
    assert chat["messages"][1]["reasoning_content"] == "First.\n\nSecond."
    assert chat["messages"][3] == {
        "role": "assistant",
        "content": "done",
        "reasoning_content": "raw thoughts",
    }
    assert "opaque" not in orjson.dumps(chat).decode()


def test_reasoning_without_a_following_assistant_message_is_dropped() -> None:
    reasoning = {"type": "reasoning", "summary": [{"type": "summary_text", "text": "hmm"}]}
    chat, _ = to_chat(request(user("q"), reasoning, user("more")))
    assert "hmm" not in orjson.dumps(chat).decode()
    chat, _ = to_chat(request(user("q"), reasoning))
    assert chat["messages"] == [{"role": "user", "content": "q"}]


# --- tools (checklist 26, 27) ----------------------------------------------------------------


def test_checklist_26_flat_function_tools_become_nested() -> None:
    chat, mapped = to_chat(
        request(user("q"), tools=[FUNCTION_TOOL, {"type": "function", "name": "ping"}])
    )
    assert chat["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather for a city.",
                "parameters": FUNCTION_TOOL["parameters"],
                "strict": True,
            },
        },
        {
            "type": "function",
            "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}},
        },
    ]
    assert mapped.context.tools == {}


def test_checklist_26_custom_tool_roundtrip() -> None:
    grammar = {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}
    apply_patch = {
        "type": "custom",
        "name": "apply_patch",
        "description": "Patch files.",
        "format": grammar,
    }
    history = [
        user("fix it"),
        {
            "type": "custom_tool_call",
            "call_id": "call_p",
            "name": "apply_patch",
            "input": "*** Begin",
        },
        {"type": "custom_tool_call_output", "call_id": "call_p", "output": "Done"},
    ]
    chat, mapped = to_chat(
        request(
            *history, tools=[apply_patch], tool_choice={"type": "custom", "name": "apply_patch"}
        )
    )

    function = chat["tools"][0]["function"]
    assert function["name"] == "apply_patch"
    assert function["description"] == "Patch files."
    parameters = function["parameters"]
    assert parameters["required"] == ["input"]
    assert parameters["additionalProperties"] is False
    assert parameters["properties"]["input"]["type"] == "string"
    assert "start: /.+/" in parameters["properties"]["input"]["description"]
    assert mapped.context.tools["apply_patch"] == ToolOrigin("custom", "apply_patch")
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "apply_patch"}}

    tool_call = chat["messages"][1]["tool_calls"][0]
    assert tool_call["id"] == "call_p"
    assert orjson.loads(tool_call["function"]["arguments"]) == {"input": "*** Begin"}
    assert chat["messages"][2] == {"role": "tool", "tool_call_id": "call_p", "content": "Done"}

    # The upstream's answer goes back to the client as the custom call it declared.
    restored = restore_call(
        "ctc_1", "call_q", "apply_patch", '{"input":"*** Begin Patch"}', "completed", mapped.context
    )
    assert restored["type"] == "custom_tool_call"
    assert restored["input"] == "*** Begin Patch"


def test_checklist_27_hosted_tools_never_reach_a_chat_upstream() -> None:
    hosted = [
        {"type": "web_search"},
        {"type": "web_search_preview"},
        {"type": "file_search", "vector_store_ids": ["vs_1"]},
        {"type": "code_interpreter", "container": {"type": "auto"}},
        {"type": "image_generation"},
        {"type": "mcp", "server_label": "x", "server_url": "https://x"},
        {
            "type": "computer_use_preview",
            "display_width": 1,
            "display_height": 1,
            "environment": "linux",
        },
        {"type": "local_shell"},
        {"type": "tool_search"},
    ]
    chat, mapped = to_chat(request(user("q"), tools=[*hosted, FUNCTION_TOOL]))
    assert [tool["function"]["name"] for tool in chat["tools"]] == ["get_weather"]
    assert len(mapped.warnings) == len(hosted)

    chat, mapped = to_chat(
        request(user("q"), tools=hosted, tool_choice="required", parallel_tool_calls=True)
    )
    assert "tools" not in chat
    assert "tool_choice" not in chat
    assert "parallel_tool_calls" not in chat
    assert any("tool_choice" in warning for warning in mapped.warnings)


def test_checklist_27_hosted_tool_is_refused_in_strict_mode() -> None:
    with pytest.raises(TranslationError) as caught:
        responses_request_to_chat(
            request(user("q"), tools=[{"type": "web_search"}]), TranslateOptions(strict=True)
        )
    assert caught.value.status == 400
    assert caught.value.param == "tools"
    assert "web_search" in caught.value.message


def test_hosted_input_items_are_dropped_with_a_warning() -> None:
    chat, mapped = to_chat(
        request(
            user("q"),
            {"type": "web_search_call", "id": "ws_1", "status": "completed"},
            {"type": "web_search_call", "id": "ws_2", "status": "completed"},
            {"type": "mcp_list_tools", "id": "mcpl_1", "server_label": "x", "tools": []},
            assistant("answer"),
        )
    )
    assert [m["role"] for m in chat["messages"]] == ["user", "assistant"]
    assert "dropped 2 web_search_call input item(s)" in mapped.warnings[1]
    assert "mcp_list_tools" in mapped.warnings[0]


def test_long_and_exotic_names_are_shortened_deterministically() -> None:
    long_name = "x" * 80
    tools = [
        {"type": "function", "name": long_name},
        {"type": "function", "name": "files.read"},
        {
            "type": "namespace",
            "name": "mcp.server",
            "description": "",
            "tools": [{"type": "function", "name": "go"}],
        },
    ]
    chat, mapped = to_chat(
        request(user("q"), call("call_a", name="files.read"), output("call_a"), tools=tools)
    )
    names = [tool["function"]["name"] for tool in chat["tools"]]
    assert all(CHAT_NAME.fullmatch(name) for name in names)
    assert names == [
        chat_function_name(long_name),
        chat_function_name("files.read"),
        chat_function_name("go", "mcp.server"),
    ]
    assert len(set(names)) == 3
    assert mapped.context.tools[names[0]] == ToolOrigin("function", long_name)
    assert mapped.context.tools[names[1]] == ToolOrigin("function", "files.read")
    assert mapped.context.tools[names[2]] == ToolOrigin("function", "go", namespace="mcp.server")
    assert chat["messages"][1]["tool_calls"][0]["function"]["name"] == names[1]
    # Same name on the next turn, and distinct names stay distinct after shortening.
    assert chat_function_name(long_name) == names[0]
    assert chat_function_name("x" * 81) != names[0]


def test_colliding_flattened_names_are_refused() -> None:
    tools = [
        {"type": "function", "name": "ns__tool"},
        {
            "type": "namespace",
            "name": "ns",
            "description": "",
            "tools": [{"type": "function", "name": "tool"}],
        },
    ]
    with pytest.raises(TranslationError) as caught:
        responses_request_to_chat(request(user("q"), tools=tools), OPTIONS)
    assert caught.value.param == "tools"


def test_tool_choice_mapping() -> None:
    namespace = {
        "type": "namespace",
        "name": "crm",
        "description": "",
        "tools": [{"type": "function", "name": "find"}],
    }
    tools = [FUNCTION_TOOL, namespace, {"type": "web_search"}]
    cases: list[tuple[Any, Any]] = [
        ("none", "none"),
        ("required", "required"),
        (
            {"type": "function", "name": "get_weather"},
            {"type": "function", "function": {"name": "get_weather"}},
        ),
        (
            {"type": "function", "name": "find", "namespace": "crm"},
            {"type": "function", "function": {"name": "crm__find"}},
        ),
        (
            {
                "type": "allowed_tools",
                "mode": "required",
                "tools": [{"type": "function", "name": "get_weather"}, {"type": "web_search"}],
            },
            {
                "type": "allowed_tools",
                "allowed_tools": {
                    "mode": "required",
                    "tools": [{"type": "function", "function": {"name": "get_weather"}}],
                },
            },
        ),
        ({"type": "web_search_preview"}, "auto"),
        ({"type": "mcp", "server_label": "x"}, "auto"),
    ]
    for choice, expected in cases:
        chat, _ = to_chat(request(user("q"), tools=tools, tool_choice=choice))
        assert chat["tool_choice"] == expected, choice


# --- format and parameters (checklist 28) ------------------------------------------------------


def test_checklist_28_json_schema_format_keeps_every_field() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    text = {
        "format": {
            "type": "json_schema",
            "name": "A",
            "description": "An A.",
            "schema": schema,
            "strict": True,
        },
        "verbosity": "low",
    }
    chat, _ = to_chat(request(user("q"), text=text))
    assert chat["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "A", "description": "An A.", "schema": schema, "strict": True},
    }
    assert chat["verbosity"] == "low"
    chat, _ = to_chat(request(user("q"), text={"format": {"type": "json_object"}}))
    assert chat["response_format"] == {"type": "json_object"}
    chat, _ = to_chat(request(user("q"), text={"format": {"type": "text"}}))
    assert "response_format" not in chat


def test_parameters_are_renamed_and_proxy_fields_stay_behind() -> None:
    body = request(
        user("q"),
        max_output_tokens=500,
        reasoning={"effort": "high", "summary": "auto"},
        temperature=0.2,
        top_p=0.9,
        user="u-1",
        service_tier="flex",
        prompt_cache_key="k",
        safety_identifier="s",
        top_logprobs=3,
        include=["message.output_text.logprobs", "reasoning.encrypted_content"],
        metadata={"a": "b"},
        store=True,
        background=False,
        truncation="auto",
        max_tool_calls=3,
        stream=False,
    )
    chat, mapped = to_chat(body)
    assert chat == {
        "model": "gpt-5",
        "messages": [{"role": "user", "content": "q"}],
        "max_completion_tokens": 500,
        "reasoning_effort": "high",
        "temperature": 0.2,
        "top_p": 0.9,
        "user": "u-1",
        "service_tier": "flex",
        "prompt_cache_key": "k",
        "safety_identifier": "s",
        "logprobs": True,
        "top_logprobs": 3,
    }
    assert mapped.warnings == []
    assert set(mapped.context.echo) == {
        "max_output_tokens", "reasoning", "temperature", "top_p", "user", "service_tier",
        "prompt_cache_key", "safety_identifier", "top_logprobs", "metadata", "store",
        "background", "truncation", "max_tool_calls",
    }  # fmt: skip
    assert mapped.context.tools == {}
    assert isinstance(mapped.context, TranslationContext)


def test_streaming_always_asks_for_usage() -> None:
    chat, _ = to_chat(
        request(user("q"), stream=True, stream_options={"include_obfuscation": False})
    )
    assert chat["stream"] is True
    assert chat["stream_options"] == {"include_usage": True}


def test_unknown_fields_are_reported() -> None:
    _, mapped = to_chat(request(user("q"), prompt={"id": "pmpt_1"}, frobnicate=1))
    assert any("prompt" in warning for warning in mapped.warnings)
    assert any("frobnicate" in warning for warning in mapped.warnings)


# --- errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"input": "hi"}, "model", "missing_required_parameter"),
        ({"model": 3, "input": "hi"}, "model", "missing_required_parameter"),
        (
            request(user("q"), previous_response_id="resp_1"),
            "previous_response_id",
            "previous_response_not_found",
        ),
        (request(user("q"), conversation="conv_1"), "conversation", "previous_response_not_found"),
        (request({"type": "item_reference", "id": "msg_1"}), "input", "unsupported_parameter"),
        (request({"content": "no role"}), "input", "missing_required_parameter"),
        (request({"role": "robot", "content": "x"}), "input", "invalid_value"),
        (request(call("")), "input", "missing_required_parameter"),
        ({"model": "m", "input": []}, "input", "missing_required_parameter"),
        (request(user("q"), text={"format": {"type": "yaml"}}), "text.format", "invalid_value"),
    ],
)
def test_untranslatable_requests_are_400s(body: Any, param: str, code: str) -> None:
    with pytest.raises(TranslationError) as caught:
        responses_request_to_chat(body, OPTIONS)
    error = caught.value
    assert (error.status, error.param, error.code) == (400, param, code)
    assert error.message.endswith(".")
    assert error.to_body()["error"]["param"] == param


def test_item_reference_message_points_at_the_store() -> None:
    with pytest.raises(TranslationError, match="store"):
        responses_request_to_chat(request({"type": "item_reference", "id": "msg_1"}), OPTIONS)


def test_non_object_body_is_refused() -> None:
    with pytest.raises(TranslationError):
        responses_request_to_chat([], OPTIONS)  # type: ignore[arg-type]


def test_previous_response_id_with_history_is_accepted() -> None:
    chat, mapped = to_chat(request(user("next"), previous_response_id="resp_1"), history=[])
    assert chat["messages"] == [{"role": "user", "content": "next"}]
    assert mapped.context.echo["previous_response_id"] == "resp_1"
