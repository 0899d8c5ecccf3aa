"""Malformed create requests get OpenAI's 400 naming the field before any translation runs,
in-process through the whole addon chain (make_addons() in taddons, the relay listening),
on translating, passthrough and failover routes for both client APIs.

The known cases that once answered ``500 llmitm_error`` or were forwarded with the wrong
types are explicit regressions; a hypothesis fuzz of bodies (types, nesting, sizes) checks
that llmitm never answers a 5xx itself and never lets a hook raise."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mitmproxy import http
from mitmproxy.test import taddons, tflow

from llmitm.addons import make_addons
from llmitm.addons.relay import LlmRelay
from llmitm.addons.settings import LlmitmSettings
from llmitm.relay.server import MAX_HEAD_BYTES
from llmitm.wire.depth import MAX_DEPTH

CONFIG = """
[endpoints.chat-only]
kind = "compatible"
base_url = "http://127.0.0.1:9/v1"
apis = ["chat"]

[endpoints.responses-only]
kind = "openai"
base_url = "http://127.0.0.1:9/v1"
apis = ["responses"]

[[routes]]
models = ["to-chat"]
endpoints = ["chat-only"]

[[routes]]
models = ["to-responses"]
endpoints = ["responses-only"]

[[routes]]
models = ["failover"]
endpoints = ["chat-only", "responses-only"]
"""
ROUTES = ("to-chat", "to-responses", "failover")
"""Per client API, one route translates, one passes through, one fails over."""
PATHS = {
    "responses": "/v1/responses",
    "chat": "/v1/chat/completions",
    "compact": "/v1/responses/compact",
}


class Chain:
    """make_addons() in a taddons context with the relay listening: ``send`` runs a flow's
    ``request`` through every addon in order, as mitmproxy does."""

    def __init__(self, addons: list[Any]) -> None:
        self.addons = addons

    async def send(
        self, api: str, body: Any, headers: dict[str, str] | None = None
    ) -> http.HTTPFlow:
        flow = tflow.tflow()
        request = flow.request
        request.method = "POST"
        request.url = f"https://api.openai.com{PATHS[api]}"
        request.headers.clear()
        request.headers["host"] = "api.openai.com"
        request.headers["content-type"] = "application/json"
        request.headers["authorization"] = "Bearer sk-client"
        for name, value in (headers or {}).items():
            request.headers[name] = value
        request.content = body if isinstance(body, bytes) else orjson.dumps(body)
        for addon in self.addons:
            hook = getattr(addon, "request", None)
            if hook is not None:
                result = hook(flow)
                if inspect.isawaitable(result):
                    await result
        return flow


@pytest.fixture
async def chain(tmp_path: Path) -> Iterator[Chain]:
    path = tmp_path / "llmitm.toml"
    path.write_text(CONFIG, encoding="utf-8")
    addons = make_addons()
    with taddons.context(*addons) as tctx:
        settings = next(a for a in addons if isinstance(a, LlmitmSettings))
        tctx.configure(settings, llmitm_config=str(path), llmitm_store="")
        relay = next(a for a in addons if isinstance(a, LlmRelay))
        await relay.running()  # type: ignore[misc]
        yield Chain(addons)
        relay.done()


def error_of(flow: http.HTTPFlow) -> dict[str, Any]:
    assert flow.response is not None, "forwarded, not refused"
    assert flow.response.headers["content-type"] == "application/json"
    return orjson.loads(flow.response.content or b"")["error"]


def refused(flow: http.HTTPFlow, status: int = 400) -> dict[str, Any]:
    error = error_of(flow)
    assert flow.response is not None and flow.response.status_code == status, error
    assert error["type"] == "invalid_request_error"
    return error


def forwarded(flow: http.HTTPFlow) -> None:
    """Not answered by llmitm, and what goes upstream (or to the relay) is a JSON object."""
    assert flow.response is None, flow.response and flow.response.content
    assert isinstance(orjson.loads(flow.request.content or b""), dict)


def nested(depth: int, leaf: Any = "x") -> Any:
    """``depth`` levels of arrays and objects, alternating, around ``leaf``, as raw JSON (an
    ``orjson.Fragment``: orjson itself writes no more than 254 levels)."""
    head = b"".join(b'{"a":' if level % 2 else b"[" for level in range(depth))
    tail = b"".join(b"}" if level % 2 else b"]" for level in reversed(range(depth)))
    return orjson.Fragment(head + orjson.dumps(leaf) + tail)


def responses_body(model: str, **fields: Any) -> dict[str, Any]:
    return {"model": model, "input": [{"role": "user", "content": "hi"}], **fields}


def chat_body(model: str, **fields: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], **fields}


def body_for(api: str, model: str, **fields: Any) -> dict[str, Any]:
    return (responses_body if api == "responses" else chat_body)(model, **fields)


def function_tool(api: str, parameters: Any) -> dict[str, Any]:
    if api == "responses":
        return {"type": "function", "name": "f", "parameters": parameters}
    return {"type": "function", "function": {"name": "f", "parameters": parameters}}


PARAMETERS_PARAM = {"responses": "tools[0].parameters", "chat": "tools[0].function.parameters"}


# --- the known cases --------------------------------------------------------------------------


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("role", [["user"], {"role": "user"}])
async def test_a_responses_role_that_is_not_a_string_is_a_400(
    chain: Chain, route: str, role: Any
) -> None:
    flow = await chain.send(
        "responses", {"model": route, "input": [{"role": role, "content": "x"}]}
    )
    assert refused(flow)["param"] == "input[0].role"


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("role", [["user"], {"role": "user"}])
async def test_a_chat_role_that_is_not_a_string_is_a_400(
    chain: Chain, route: str, role: Any
) -> None:
    flow = await chain.send("chat", {"model": route, "messages": [{"role": role, "content": "x"}]})
    assert refused(flow)["param"] == "messages[0].role"


@pytest.mark.parametrize("api", ["responses", "chat"])
@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("depth", [MAX_DEPTH, 254, 300, 1000])
async def test_tool_parameters_nested_too_deep_are_a_400(
    chain: Chain, api: str, route: str, depth: int
) -> None:
    # Inside the tool's parameters object: the body's own levels come on top of ``depth``.
    tool = function_tool(api, {"type": "object", "properties": nested(depth)})
    flow = await chain.send(api, body_for(api, route, tools=[tool]))
    error = refused(flow)
    assert error["param"].startswith(PARAMETERS_PARAM[api].partition(".")[0])
    assert str(MAX_DEPTH) in error["message"]


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("depth", [500, 1000])
async def test_input_nested_too_deep_is_a_400(chain: Chain, route: str, depth: int) -> None:
    content = [{"type": "input_text", "text": "x", "extra": nested(depth)}]
    flow = await chain.send(
        "responses", {"model": route, "input": [{"role": "user", "content": content}]}
    )
    assert refused(flow)["param"].startswith("input[0]")


@pytest.mark.parametrize("api", ["responses", "chat"])
@pytest.mark.parametrize("route", ROUTES)
async def test_the_limit_is_exact_and_what_it_takes_is_forwarded(
    chain: Chain, api: str, route: str
) -> None:
    # Body (1) → tools (2) → tool (3) [→ function] → parameters (4) → the nested levels
    # → the leaf {} (1 more).
    around = 5 if api == "responses" else 6
    at_limit = function_tool(api, {"properties": nested(MAX_DEPTH - around, {})})
    forwarded(await chain.send(api, body_for(api, route, tools=[at_limit])))
    over = function_tool(api, {"properties": nested(MAX_DEPTH - around + 1, {})})
    assert refused(await chain.send(api, body_for(api, route, tools=[over])))["param"]


@pytest.mark.parametrize("api", ["responses", "chat"])
@pytest.mark.parametrize("route", ROUTES)
async def test_tool_parameters_as_a_string_are_a_400(chain: Chain, api: str, route: str) -> None:
    tool = function_tool(api, '{"type": "object"}')
    flow = await chain.send(api, body_for(api, route, tools=[tool]))
    error = refused(flow)
    assert error["param"] == PARAMETERS_PARAM[api]
    assert error["code"] == "invalid_type"


@pytest.mark.parametrize("api", ["responses", "chat"])
@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("choice", [1, 0.5, True, ["auto"]])
async def test_a_tool_choice_that_is_not_a_string_or_object_is_a_400(
    chain: Chain, api: str, route: str, choice: Any
) -> None:
    flow = await chain.send(api, body_for(api, route, tool_choice=choice))
    assert refused(flow)["param"] == "tool_choice"


@pytest.mark.parametrize("api", ["responses", "chat"])
async def test_64_kib_of_client_headers_are_relayed_on_a_failover_route(
    chain: Chain, api: str
) -> None:
    headers = {f"x-big-{i}": "v" * 1000 for i in range(80)}
    flow = await chain.send(api, body_for(api, "failover"), headers)
    forwarded(flow)
    assert "/llmitm-relay/" in flow.request.path


async def test_headers_beyond_the_relays_limit_are_a_431(chain: Chain) -> None:
    headers = {f"x-big-{i}": "v" * 10_000 for i in range(MAX_HEAD_BYTES // 10_000 + 1)}
    flow = await chain.send("responses", body_for("responses", "failover"), headers)
    assert refused(flow, 431)["code"] == "request_header_fields_too_large"


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"input": [{"role": ["user"], "content": "x"}]}, "input[0].role"),
        ({"input": [{"role": "user", "content": nested(600)}]}, "input[0].content"),
        ({"tools": [{"type": "function", "name": "f", "parameters": "{}"}]}, "tools[0].parameters"),
        ({"input": [{"type": "compaction", "encrypted_content": 5}]}, "input[0].encrypted_content"),
    ],
)
async def test_compaction_calls_are_validated_too(
    chain: Chain, route: str, fields: dict[str, Any], param: str
) -> None:
    # Both the compact helper and a create call carrying a compaction item.
    compact = await chain.send("compact", responses_body(route, **fields))
    assert refused(compact)["param"].startswith(param)
    create = await chain.send(
        "responses",
        responses_body(route, **fields)
        | {"input": [*fields.get("input", []), {"type": "compaction", "encrypted_content": "x"}]},
    )
    assert refused(create)["param"].startswith(param)


@pytest.mark.parametrize("route", ROUTES)
async def test_a_well_formed_compact_call_is_not_refused(chain: Chain, route: str) -> None:
    flow = await chain.send("compact", responses_body(route))
    forwarded(flow)


@pytest.mark.parametrize("api", ["responses", "chat"])
@pytest.mark.parametrize("route", ROUTES)
async def test_well_formed_requests_still_pass(chain: Chain, api: str, route: str) -> None:
    tool = function_tool(api, {"type": "object", "properties": {"q": {"type": "string"}}})
    flow = await chain.send(
        api, body_for(api, route, tools=[tool], tool_choice="auto", stream=True, temperature=1)
    )
    forwarded(flow)


# --- the fuzz -------------------------------------------------------------------------------

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(
            st.sampled_from(["type", "role", "content", "text", "name", "x"]), children, max_size=3
        )
    ),
    max_leaves=12,
)
ROLES = st.sampled_from(["user", "assistant", "system", "developer", "tool"]) | JSON
PART = st.fixed_dictionaries(
    {
        "type": st.sampled_from(["input_text", "output_text", "text"]) | JSON,
        "text": st.text() | JSON,
    }
)
CONTENT = st.text() | st.lists(PART | JSON, max_size=3) | JSON
ITEM = st.fixed_dictionaries({"role": ROLES, "content": CONTENT}) | st.fixed_dictionaries(
    {
        "type": st.sampled_from(["function_call", "function_call_output", "message", "reasoning"])
        | JSON,
        "call_id": st.text(max_size=5) | JSON,
        "name": st.text(max_size=5) | JSON,
        "arguments": st.text(max_size=5) | JSON,
        "output": CONTENT,
    }
)
PARAMETERS = st.just({"type": "object"}) | JSON | st.integers(1, 1100).map(nested)
TOOLS = st.lists(PARAMETERS, max_size=2)
FIELDS = st.dictionaries(
    st.sampled_from(
        ["stream", "store", "temperature", "tool_choice", "instructions", "max_output_tokens",
         "max_tokens", "n", "stop", "metadata", "previous_response_id", "parallel_tool_calls",
         "text", "reasoning", "response_format", "include"]
    ),
    JSON,
    max_size=4,
)  # fmt: skip


@st.composite
def request_bodies(draw: st.DrawFn) -> tuple[str, bytes]:
    api = draw(st.sampled_from(["responses", "chat"]))
    body: dict[str, Any] = {"model": draw(st.sampled_from(ROUTES))}
    items = draw(st.lists(ITEM | JSON, max_size=4) | JSON)
    body["input" if api == "responses" else "messages"] = (
        items if api == "responses" or draw(st.booleans()) else [{"role": "user", "content": "x"}]
    )
    body.update(draw(FIELDS))
    if draw(st.booleans()):
        body["tools"] = [function_tool(api, parameters) for parameters in draw(TOOLS)] + draw(
            st.lists(JSON, max_size=1)
        )
    if draw(st.booleans()):  # a long conversation
        body.setdefault("instructions", "x" * draw(st.integers(0, 200_000)))
    return api, orjson.dumps(body)


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=request_bodies())
async def test_fuzzed_bodies_never_get_a_5xx_from_llmitm(
    chain: Chain, case: tuple[str, bytes]
) -> None:
    api, content = case
    flow = await chain.send(api, content)
    if flow.response is None:
        forwarded(flow)
        return
    error = error_of(flow)
    assert flow.response.status_code == 400, error
    assert error["type"] == "invalid_request_error"
    assert error["message"]
