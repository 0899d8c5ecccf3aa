"""Property tests of request validation (hypothesis): what :func:`validate_request` lets
through, every reader of a request body takes — each translator, the compatible-server
rewrite, the affinity fingerprint and the local Responses API's copy of ``input`` — ending
in a body or a TranslationError (a 400), never another exception, and every body written
is one orjson can write. Bodies are drawn around the documented shapes with wrong types
and deep nesting mixed in, and the Codex capture (real traffic) is mutated field by field."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmitm.routing.affinity import fingerprint
from llmitm.translate.context import TranslateOptions
from llmitm.translate.errors import TranslationError
from llmitm.translate.request_to_chat import responses_request_to_chat
from llmitm.translate.request_to_responses import chat_request_to_responses
from llmitm.translate.responses_compat import responses_request_for_compatible
from llmitm.translate.validation import validate_request
from llmitm.wire.depth import MAX_DEPTH

REAL = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "real"
CODEX = REAL / "client-codex-0.171.0-exec-turn1.request.json"
OPTIONS = TranslateOptions()
EXAMPLES = settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def nested(depth: int) -> Any:
    value: Any = "x"
    for level in range(depth):
        value = {"a": value} if level % 2 else [value]
    return value


# Integers as a parsed body holds them: orjson reads a literal beyond 64 bits as a float, so
# an int that orjson cannot write back never reaches a reader.
INTEGERS = st.integers(-(2**63), 2**64 - 1)
SCALAR = st.none() | st.booleans() | INTEGERS | st.floats(allow_nan=False) | st.text(max_size=6)
JSON = st.recursive(
    SCALAR,
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(
            st.sampled_from(["type", "role", "content", "text", "name", "parameters", "function"]),
            children,
            max_size=3,
        )
    ),
    max_leaves=10,
) | st.sampled_from([MAX_DEPTH - 6, MAX_DEPTH - 1, MAX_DEPTH, 300]).map(nested)
ROLE = st.sampled_from(["user", "assistant", "system", "developer", "tool"]) | JSON
PART = st.fixed_dictionaries(
    {"type": st.sampled_from(["input_text", "output_text", "text", "refusal"]) | JSON},
    optional={"text": st.text(max_size=6) | JSON},
)
CONTENT = st.text(max_size=6) | st.lists(PART | JSON, max_size=3) | JSON
RESPONSES_ITEM = st.fixed_dictionaries(
    {"role": ROLE}, optional={"type": st.just("message") | JSON, "content": CONTENT}
) | st.fixed_dictionaries(
    {"type": st.sampled_from(["function_call", "function_call_output", "reasoning"]) | JSON},
    optional={
        "call_id": st.text(max_size=4) | JSON,
        "name": st.text(max_size=4) | JSON,
        "arguments": st.text(max_size=4) | JSON,
        "output": CONTENT,
        "summary": JSON,
    },
)
CHAT_MESSAGE = st.fixed_dictionaries(
    {"role": ROLE},
    optional={
        "content": CONTENT,
        "name": st.text(max_size=4) | JSON,
        "tool_call_id": st.text(max_size=4) | JSON,
        "tool_calls": st.lists(
            st.fixed_dictionaries(
                {"id": st.text(max_size=4) | JSON, "type": st.just("function") | JSON},
                optional={
                    "function": st.fixed_dictionaries(
                        {
                            "name": st.text(max_size=4) | JSON,
                            "arguments": st.text(max_size=4) | JSON,
                        }
                    )
                    | JSON
                },
            ),
            max_size=2,
        )
        | JSON,
    },
)
PARAMETERS = st.just({"type": "object", "properties": {}}) | JSON
RESPONSES_TOOL = st.fixed_dictionaries(
    {"type": st.sampled_from(["function", "custom", "web_search"]) | JSON},
    optional={
        "name": st.text(min_size=1, max_size=4) | JSON,
        "parameters": PARAMETERS,
        "strict": JSON,
    },
)
CHAT_TOOL = st.fixed_dictionaries(
    {"type": st.just("function") | JSON},
    optional={
        "function": st.fixed_dictionaries(
            {"name": st.text(min_size=1, max_size=4) | JSON}, optional={"parameters": PARAMETERS}
        )
        | JSON
    },
)
COMMON = {
    "stream": st.booleans() | JSON,
    "temperature": st.floats(0, 2) | JSON,
    "tool_choice": st.sampled_from(["auto", "none", "required"]) | JSON,
    "parallel_tool_calls": st.booleans() | JSON,
    "metadata": JSON,
}
RESPONSES_BODY = st.fixed_dictionaries(
    {"model": st.just("m")},
    optional={
        **COMMON,
        "input": st.text(max_size=6) | st.lists(RESPONSES_ITEM | JSON, max_size=4) | JSON,
        "instructions": st.text(max_size=6) | JSON,
        "tools": st.lists(RESPONSES_TOOL | JSON, max_size=3) | JSON,
        "max_output_tokens": st.integers(1, 100) | JSON,
        "text": JSON,
        "reasoning": JSON,
        "include": JSON,
    },
)
CHAT_BODY = st.fixed_dictionaries(
    {"model": st.just("m"), "messages": st.lists(CHAT_MESSAGE | JSON, max_size=4) | JSON},
    optional={
        **COMMON,
        "tools": st.lists(CHAT_TOOL | JSON, max_size=3) | JSON,
        "max_tokens": st.integers(1, 100) | JSON,
        "stop": JSON,
        "n": st.integers(1, 2) | JSON,
        "response_format": JSON,
    },
)


def valid(body: dict[str, Any], api: str) -> bool:
    try:
        validate_request(body, api)
    except TranslationError as exc:
        assert exc.status == 400 and exc.param, exc.message  # always names the field
        return False
    return True


def readers_take(body: dict[str, Any], translate: Any) -> None:
    """Every reader ends in a body orjson can write, or in a TranslationError."""
    fingerprint(body)
    copy.deepcopy(body.get("input"))
    try:
        mapped = translate(copy.deepcopy(body), OPTIONS)
    except TranslationError:
        return
    orjson.dumps(mapped.body)


@EXAMPLES
@given(body=RESPONSES_BODY)
def test_a_responses_body_that_passes_validation_is_taken_by_every_reader(
    body: dict[str, Any],
) -> None:
    if valid(body, "responses"):
        orjson.dumps(body)
        readers_take(body, responses_request_to_chat)
        readers_take(body, responses_request_for_compatible)


@EXAMPLES
@given(body=CHAT_BODY)
def test_a_chat_body_that_passes_validation_is_taken_by_every_reader(body: dict[str, Any]) -> None:
    if valid(body, "chat"):
        orjson.dumps(body)
        readers_take(body, chat_request_to_responses)


FIELD_VALUES = st.sampled_from(
    [None, 1, 1.5, True, "s", [], {}, ["user"], {"role": "user"}]
) | st.sampled_from([MAX_DEPTH, 400]).map(nested)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_mutated_codex_request_is_refused_by_name_or_taken(data: st.DataObject) -> None:
    body = orjson.loads(CODEX.read_bytes())
    # Replace one value somewhere in the real request (a field, an item, a tool, a part).
    target: Any = body
    path: list[str | int] = []
    for _ in range(data.draw(st.integers(1, 4))):
        if isinstance(target, dict) and target:
            key = data.draw(st.sampled_from(sorted(target)))
        elif isinstance(target, list) and target:
            key = data.draw(st.integers(0, len(target) - 1))
        else:
            break
        path.append(key)
        if not isinstance(target[key], dict | list):
            break
        target = target[key]
    container = body
    for key in path[:-1]:
        container = container[key]
    if path:
        container[path[-1]] = data.draw(FIELD_VALUES)
    if valid(body, "responses"):
        readers_take(body, responses_request_to_chat)
        readers_take(body, responses_request_for_compatible)


def test_the_codex_request_itself_is_valid() -> None:
    body = orjson.loads(CODEX.read_bytes())
    validate_request(body, "responses")


def test_tools_declared_in_an_additional_tools_item_are_checked_like_top_level_ones() -> None:
    item = {"type": "additional_tools", "tools": [{"type": "namespace", "name": "n", "tools": [
        {"type": "function", "name": "f", "parameters": "{}"}]}]}  # fmt: skip
    with pytest.raises(TranslationError) as raised:
        validate_request({"model": "m", "input": [item]}, "responses")
    assert raised.value.param == "input[0].tools[0].tools[0].parameters"


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_a_refusal_names_the_innermost_field_it_checks(api: str) -> None:
    if api == "responses":
        body = {
            "model": "m",
            "input": [{"role": "user", "content": [{"type": "input_text", "text": 5}]}],
        }
        param = "input[0].content[0].text"
    else:
        body = {
            "model": "m",
            "messages": [
                {
                    "role": "assistant",
                    "tool_calls": [
                        {"id": "c", "type": "function", "function": {"name": "f", "arguments": {}}}
                    ],
                }
            ],
        }
        param = "messages[0].tool_calls[0].function.arguments"
    with pytest.raises(TranslationError) as raised:
        validate_request(body, api)
    assert raised.value.param == param and raised.value.code == "invalid_type"


@pytest.mark.parametrize(
    ("item", "param"),
    [
        ({"type": "function_call_output", "call_id": "c", "output": [{"type": "input_text"}, 3]},
         "input[1].output[1]"),
        ({"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": True}]},
         "input[1].content[1].type"),
        ({"role": "user", "content": "a", "name": 1.5}, "input[1].name"),
        ({"type": "function_call", "call_id": "c", "name": "f", "arguments": False},
         "input[1].arguments"),
    ],
)  # fmt: skip
def test_the_per_item_fast_path_still_names_what_it_refuses(
    item: dict[str, object], param: str
) -> None:
    # Items are checked field by field with exact JSON types first; what that lets through
    # to the full check must still be refused with its full name.
    body = {"model": "m", "input": [{"role": "user", "content": "hi"}, item]}
    with pytest.raises(TranslationError) as raised:
        validate_request(body, "responses")
    assert raised.value.param == param


def test_nulls_and_unknown_fields_of_items_and_parts_pass() -> None:
    item = {"role": "user", "content": [{"type": "input_text", "text": None, "x": 1}], "y": {}}
    validate_request(
        {"model": "m", "input": [item, {"type": "reasoning", "summary": None}]}, "responses"
    )
