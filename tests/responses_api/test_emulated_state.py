"""``state = "native" | "emulate" | "auto"`` per endpoint: who keeps the Responses state of a
native Responses server, and the stateless request llmitm sends one whose state it keeps."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from llmitm.exchange.request import prepare_request
from llmitm.responses_api.stateless import stored_native_response
from llmitm.routing.config import ConfigError, Endpoint, parse_config
from llmitm.routing.plan import plan_for_endpoint
from llmitm.translate.context import TranslateOptions
from llmitm.translate.errors import TranslationError
from llmitm.translate.stateless import stateless_request
from llmitm.wire.ids import CountingIds, fixed_clock


def config(**keys: Any) -> dict[str, Any]:
    endpoint = {"kind": "compatible", "base_url": "http://127.0.0.1:1/v1", "apis": ["responses"]}
    return {"endpoints": {"e": {**endpoint, **keys}}}


def endpoint(kind: str = "compatible", state: str = "auto") -> Endpoint:
    return Endpoint(
        name="e",
        kind=kind,  # type: ignore[arg-type]
        base_url="https://up.example/v1",
        apis=frozenset({"responses"}),
        state=state,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("kind", "state", "emulates"),
    [
        ("compatible", None, True),
        ("openai", None, False),
        ("azure", None, False),
        ("compatible", "native", False),
        ("openai", "emulate", True),
        ("compatible", "auto", True),
        ("openai", "auto", False),
    ],
)
def test_auto_emulates_for_compatible_servers_only(
    kind: str, state: str | None, emulates: bool
) -> None:
    keys: dict[str, Any] = {"kind": kind}
    if kind == "azure":
        keys["base_url"] = "https://name.openai.azure.com"
    if state is not None:
        keys["state"] = state
    parsed = parse_config(config(**keys), "llmitm.toml", {}).endpoints["e"]
    assert parsed.state == (state or "auto")
    assert parsed.emulates_state is emulates


@pytest.mark.parametrize("bad", ["stateless", "", 1, True])
def test_an_unknown_state_mode_is_a_clear_error(bad: Any) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config(config(state=bad), "llmitm.toml", {})
    message = str(raised.value)
    assert "endpoints.e.state" in message
    assert "native, emulate, auto" in message


def test_stateless_request_drops_the_server_state_fields() -> None:
    body = {
        "model": "m",
        "input": [{"role": "user", "content": "hi"}],
        "store": True,
        "background": True,
        "conversation": "conv_1",
        "temperature": 0,
    }
    assert stateless_request(body) == {
        "model": "m",
        "input": [{"role": "user", "content": "hi"}],
        "temperature": 0,
    }
    assert "store" in body  # a new dict: the client's body is left as it is
    assert stateless_request({"model": "m", "input": "hi"}) is None


def test_an_unresolved_previous_response_id_is_openais_400() -> None:
    with pytest.raises(TranslationError) as raised:
        stateless_request({"model": "m", "input": "hi", "previous_response_id": "resp_gone"})
    error = raised.value
    assert (error.status, error.param, error.code) == (
        400,
        "previous_response_id",
        "previous_response_not_found",
    )
    assert error.message == "Previous response with id 'resp_gone' not found."


def prepared(ep: Endpoint, body: dict[str, Any]) -> dict[str, Any]:
    content = orjson.dumps(body)
    options = TranslateOptions(ids=CountingIds(), clock=fixed_clock(1.0))
    plan = plan_for_endpoint(ep, "responses", "m")
    result = prepare_request(content, body, "m", plan, options)
    parsed: dict[str, Any] = orjson.loads(result.content)
    return parsed


def test_an_emulated_endpoint_is_sent_a_stateless_request() -> None:
    body = {"model": "m", "input": "hi", "store": True, "stream": True}
    assert prepared(endpoint("compatible"), body) == {"model": "m", "input": "hi", "stream": True}


@pytest.mark.parametrize("ep", [endpoint("openai"), endpoint("compatible", "native")])
def test_a_native_state_endpoint_gets_the_state_fields(ep: Endpoint) -> None:
    body = {"model": "m", "input": "hi", "store": True, "previous_response_id": "resp_1"}
    assert prepared(ep, body) == body


def test_a_stored_native_response_carries_what_the_client_sent() -> None:
    server = {"id": "resp_l", "object": "response", "status": "completed", "output": []}
    stored = stored_native_response(server, "resp_prev")
    assert stored == {**server, "store": True, "previous_response_id": "resp_prev"}
    assert "store" not in server
