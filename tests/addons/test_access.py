"""Who may use llmitm: browser origins, JSON bodies, client keys, llmitm's own endpoints on
its own address, and no listener beyond loopback without client keys — the pure decisions
(routing.access), the configuration, and the addons in the real addon chain."""

from __future__ import annotations

import inspect
import logging
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from mitmproxy import exceptions, http
from mitmproxy.proxy import mode_specs
from mitmproxy.test import taddons, tflow

from llmitm.addons import make_addons
from llmitm.addons.access import LlmAccess
from llmitm.addons.router import LlmRouter
from llmitm.addons.settings import LlmitmSettings
from llmitm.addons.state import METADATA_KEY
from llmitm.routing.access import (
    Access,
    ClientKey,
    browser_refusal,
    content_type_refusal,
    key_refusal,
    public_listen_refusal,
    route_refusal,
    without_client_key,
)
from llmitm.routing.config import ConfigError, parse_config

ALICE = ClientKey("alice", "ALICE_ENV", "ck-alice")
BOB = ClientKey("bob", "BOB_ENV", "ck-bob", routes=("cheap",))
KEYS = Access(client_keys=(ALICE, BOB))


def headers(**values: str):
    lowered = {name.replace("_", "-").lower(): value for name, value in values.items()}
    return lowered.get


# --- browsers -------------------------------------------------------------------------------


def test_a_request_without_browser_headers_is_no_browser_request() -> None:
    assert browser_refusal(Access(), headers(content_type="application/json")) is None


@pytest.mark.parametrize(
    "sent",
    [{"origin": "https://evil.example"}, {"origin": "null"}, {"sec_fetch_site": "cross-site"}],
)
def test_a_browser_request_from_an_origin_nobody_allowed_is_a_403(sent: dict[str, str]) -> None:
    error = browser_refusal(Access(allowed_origins=("http://localhost:*",)), headers(**sent))
    assert error is not None and error.status == 403 and error.code == "origin_not_allowed"
    assert "allowed_origins" in error.message


def test_an_allowed_origin_is_served_globs_and_case_aside() -> None:
    access = Access(allowed_origins=("http://localhost:*", "https://app.example/"))
    assert browser_refusal(access, headers(origin="http://LOCALHOST:5173")) is None
    assert browser_refusal(access, headers(origin="https://app.example")) is None
    assert browser_refusal(access, headers(origin="https://app.example.evil")) is not None


@given(st.text(min_size=1).filter(lambda o: o.strip().rstrip("/").lower() != "https://ok.example"))
def test_only_the_allowed_origin_passes(origin: str) -> None:
    access = Access(allowed_origins=("https://ok.example",))
    assert browser_refusal(access, headers(origin=origin)) is not None


# --- content types --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None],
)
def test_a_body_that_is_not_said_to_be_json_is_a_415(content_type: str | None) -> None:
    sent = headers(**({"content_type": content_type} if content_type else {}))
    error = content_type_refusal("POST", sent, has_body=True)
    assert error is not None and error.status == 415 and error.param == "content-type"


@pytest.mark.parametrize("content_type", ["application/json", "Application/JSON; charset=utf-8"])
def test_json_bodies_and_bodiless_calls_pass(content_type: str) -> None:
    assert content_type_refusal("POST", headers(content_type=content_type), True) is None
    assert content_type_refusal("GET", headers(content_type="text/plain"), True) is None
    assert content_type_refusal("POST", headers(), has_body=False) is None


# --- client keys ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sent",
    [{"authorization": "Bearer ck-alice"}, {"api_key": "ck-alice"}, {"x_api_key": "ck-alice"}],
)
def test_a_client_key_is_presented_in_any_sdk_spelling(sent: dict[str, str]) -> None:
    assert key_refusal(KEYS, headers(**sent)) == (ALICE, None)


@pytest.mark.parametrize(
    ("sent", "said"),
    [({}, "no key"), ({"authorization": "Bearer sk-upstream"}, "an invalid key"),
     ({"authorization": "Basic ck-alice"}, "no key")],
)  # fmt: skip
def test_without_a_valid_client_key_it_is_a_401(sent: dict[str, str], said: str) -> None:
    key, error = key_refusal(KEYS, headers(**sent))
    assert key is None and error is not None
    assert error.status == 401 and error.code == "invalid_api_key" and said in error.message


def test_without_client_keys_configured_nothing_is_asked() -> None:
    assert key_refusal(Access(), headers()) == (None, None)


def test_a_key_limited_to_routes_is_refused_the_others() -> None:
    assert route_refusal(BOB, "cheap") is None and route_refusal(ALICE, "dear") is None
    error = route_refusal(BOB, "dear")
    assert error is not None and error.status == 403 and error.code == "route_not_allowed"


def test_only_the_client_key_is_taken_off_an_endpoint_key_stays() -> None:
    sent = [("Authorization", "Bearer ck-alice"), ("x-api-key", "ck-alice"), ("x-team", "a")]
    assert without_client_key(sent, ALICE) == [("x-team", "a")]
    injected = [("authorization", "Bearer sk-endpoint"), ("api-key", "ck-alice")]
    assert without_client_key(injected, ALICE) == [("authorization", "Bearer sk-endpoint")]


# --- listening beyond loopback --------------------------------------------------------------


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "[::1]", "localhost", "127.1.2.3"])
def test_loopback_listeners_need_no_client_keys(host: str) -> None:
    assert public_listen_refusal([host], Access(), allowed=False) is None


@pytest.mark.parametrize(("host", "named"), [("0.0.0.0", "0.0.0.0"), ("", "*"), ("10.1.2.3", "10")])
def test_a_public_listener_without_client_keys_is_refused_in_one_line(
    host: str, named: str
) -> None:
    refusal = public_listen_refusal([host], Access(), allowed=False)
    assert refusal is not None and "\n" not in refusal and named in refusal
    assert "client_keys" in refusal and "llmitm_public_listen" in refusal
    assert public_listen_refusal([host], KEYS, allowed=False) is None
    assert public_listen_refusal([host], Access(), allowed=True) is None


# --- configuration --------------------------------------------------------------------------

RAW: dict[str, Any] = {
    "llmitm": {"allowed_origins": ["http://localhost:*"]},
    "endpoints": {"local": {"kind": "compatible", "base_url": "http://127.0.0.1:9/v1"}},
    "routes": [{"name": "cheap", "endpoints": ["local"]}],
    "client_keys": {"alice": {"key_env": "A"}, "bob": {"key_env": "B", "routes": ["cheap"]}},
}


def test_client_keys_come_from_the_environment_never_the_file() -> None:
    config = parse_config(RAW, "llmitm.toml", {"A": "ck-a", "B": "ck-b"})
    assert config.access.allowed_origins == ("http://localhost:*",)
    assert [(k.name, k.key, k.routes) for k in config.access.client_keys] == [
        ("alice", "ck-a", None),
        ("bob", "ck-b", ("cheap",)),
    ]
    assert "ck-a" not in repr(config)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"alice": {"key_env": "UNSET"}},
            "client_keys.alice.key_env: the environment variable UNSET",
        ),
        (
            {"alice": {"key_env": "A", "routes": ["dear"]}},
            "client_keys.alice.routes: expected a route",
        ),
        ({"alice": {"key": "ck-in-the-file"}}, "client_keys.alice.key: unknown key"),
    ],
)
def test_bad_client_keys_fail_at_start_up_naming_the_key(change: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        parse_config({**RAW, "client_keys": change}, "llmitm.toml", {"A": "ck-a"})


# --- the addons in the chain ----------------------------------------------------------------

KEY_ENV = "LLMITM_TEST_ACCESS_ENDPOINT_KEY"
CONFIG = f"""
[llmitm]
allowed_origins = ["http://localhost:*"]

[endpoints.keyed]
kind = "compatible"
base_url = "http://127.0.0.1:9/v1"
apis = ["chat", "responses"]
api_key_env = "{KEY_ENV}"

[endpoints.keyless]
kind = "compatible"
base_url = "http://127.0.0.1:9/v1"
apis = ["chat", "responses"]

[[routes]]
name = "cheap"
models = ["cheap-*"]
endpoints = ["keyless"]

[[routes]]
name = "dear"
models = ["dear-*"]
endpoints = ["keyed"]

[client_keys.alice]
key_env = "LLMITM_TEST_ALICE"

[client_keys.bob]
key_env = "LLMITM_TEST_BOB"
routes = ["cheap"]
"""


class Chain:
    def __init__(self, addons: list[Any]) -> None:
        self.addons = addons
        self.settings = next(a for a in addons if isinstance(a, LlmitmSettings))
        self.router = next(a for a in addons if isinstance(a, LlmRouter))
        self.access = next(a for a in addons if isinstance(a, LlmAccess))

    async def send(self, flow: http.HTTPFlow) -> http.HTTPFlow:
        for addon in self.addons:
            hook = getattr(addon, "request", None)
            if hook is not None and not flow.response:
                result = hook(flow)
                if inspect.isawaitable(result):
                    await result
        return flow


@pytest.fixture
def chain(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(KEY_ENV, "sk-endpoint")
    monkeypatch.setenv("LLMITM_TEST_ALICE", "ck-alice")
    monkeypatch.setenv("LLMITM_TEST_BOB", "ck-bob")
    path = tmp_path / "llmitm.toml"
    path.write_text(CONFIG, encoding="utf-8")
    addons = make_addons()
    with taddons.context(*addons) as tctx:
        chain = Chain(addons)
        tctx.configure(chain.settings, llmitm_config=str(path), llmitm_store="")
        yield chain


def chat(model: str, *, content_type: str | None = "application/json", **sent: str):
    flow = tflow.tflow()
    flow.request.method = "POST"
    flow.request.url = "https://api.openai.com/v1/chat/completions"
    flow.request.headers.clear()
    flow.request.headers["host"] = "api.openai.com"
    if content_type:
        flow.request.headers["content-type"] = content_type
    for name, value in sent.items():
        flow.request.headers[name.replace("_", "-")] = value
    flow.request.content = orjson.dumps(
        {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    )
    return flow


def error_of(flow: http.HTTPFlow) -> tuple[int, str]:
    assert flow.response is not None
    return flow.response.status_code, orjson.loads(flow.response.content or b"")["error"]["code"]


async def test_a_client_key_is_checked_stripped_and_the_endpoint_key_injected(chain: Chain) -> None:
    flow = await chain.send(chat("dear-1", authorization="Bearer ck-alice"))
    assert flow.response is None and METADATA_KEY in flow.metadata
    assert flow.request.headers["authorization"] == "Bearer sk-endpoint"
    assert "ck-alice" not in repr(flow.request.headers)


async def test_a_keyless_endpoint_gets_no_client_key_either(chain: Chain) -> None:
    flow = await chain.send(chat("cheap-1", x_api_key="ck-bob", x_team="a"))
    assert flow.response is None and flow.request.headers["x-team"] == "a"
    assert "ck-bob" not in repr(flow.request.headers)
    assert "authorization" not in flow.request.headers


ALICE_SENDS = {"authorization": "Bearer ck-alice"}


@pytest.mark.parametrize(
    ("flow_args", "expected"),
    [
        ({"authorization": "Bearer sk-someone"}, (401, "invalid_api_key")),
        ({}, (401, "invalid_api_key")),
        ({"authorization": "Bearer ck-bob"}, (403, "route_not_allowed")),
        ({**ALICE_SENDS, "content_type": "text/plain"}, (415, "unsupported_media_type")),
        ({**ALICE_SENDS, "origin": "https://evil.example"}, (403, "origin_not_allowed")),
    ],
)  # fmt: skip
async def test_what_may_not_use_the_proxy_is_answered_in_openais_shape(
    chain: Chain, flow_args: dict[str, str], expected: tuple[int, str]
) -> None:
    flow = await chain.send(chat("dear-1", **flow_args))
    assert error_of(flow) == expected
    assert flow.request.headers.get("authorization") != "Bearer sk-endpoint"


async def test_an_allowed_origin_is_served(chain: Chain) -> None:
    flow = await chain.send(
        chat("dear-1", authorization="Bearer ck-alice", origin="http://localhost:3000")
    )
    assert flow.response is None and flow.request.headers["authorization"] == "Bearer sk-endpoint"


REVERSE = "reverse:http://127.0.0.1:9"


def status(url: str, mode: str, sockname: tuple[str, int], **sent: str) -> http.HTTPFlow:
    flow = tflow.tflow()
    flow.request.method = "GET"
    flow.request.url = url
    flow.request.headers.clear()
    flow.request.headers["host"] = flow.request.host_header or flow.request.pretty_host
    for name, value in sent.items():
        flow.request.headers[name] = value
    flow.client_conn.proxy_mode = mode_specs.ProxyMode.parse(mode)
    flow.client_conn.sockname = sockname
    return flow


@pytest.mark.parametrize(
    ("url", "mode", "host", "answered"),
    [
        ("http://127.0.0.1:8080/_llmitm/status", "regular", None, True),
        ("https://api.openai.com/_llmitm/status", "regular", None, False),
        ("http://127.0.0.1:9/_llmitm/status", REVERSE, "127.0.0.1:9", True),
        ("http://127.0.0.1:8080/_llmitm/status", "regular", "127.0.0.1:8080", True),
        ("http://127.0.0.1:9/_llmitm/status", "regular", "127.0.0.1:9", False),
        ("http://localhost:8080/_llmitm/status", "regular", "localhost:8080", True),
        ("http://status.example:8080/_llmitm/status", "regular", None, False),
        ("http://127.0.0.1:8080/_llmitm/status", "transparent", None, False),
    ],
)  # fmt: skip
async def test_the_status_is_answered_only_on_llmitms_own_address(
    chain: Chain, url: str, mode: str, host: str | None, answered: bool
) -> None:
    flow = status(url, mode, ("127.0.0.1", 8080), authorization="Bearer ck-alice")
    if host is not None:
        flow.request.headers["host"] = host
    await chain.send(flow)
    got = flow.response is not None and flow.response.status_code == 200
    assert got is answered


async def test_the_status_wants_a_client_key_too(chain: Chain) -> None:
    flow = await chain.send(
        status("http://127.0.0.1:8080/_llmitm/status", "regular", ("127.0.0.1", 8080))
    )
    assert error_of(flow) == (401, "invalid_api_key")


def test_a_public_listener_without_client_keys_stops_start_up(
    caplog: pytest.LogCaptureFixture,
) -> None:
    addons = make_addons()
    with taddons.context(*addons) as tctx:
        access = next(a for a in addons if isinstance(a, LlmAccess))
        with caplog.at_level(logging.ERROR):
            tctx.configure(access, listen_host="0.0.0.0")
        assert any("refusing to listen on 0.0.0.0" in r.getMessage() for r in caplog.records)
        access.running()
        with pytest.raises(exceptions.OptionsError, match="without client keys"):
            tctx.configure(access, mode=["regular@0.0.0.0:8081"], listen_host="127.0.0.1")
        tctx.configure(access, llmitm_public_listen=True, mode=["regular@0.0.0.0:8081"])


async def test_a_client_key_on_a_call_llmitm_does_not_guard_does_not_leave_either(
    chain: Chain,
) -> None:
    flow = chat("dear-1", authorization="Bearer ck-alice", x_team="a")
    flow.request.path = "/v1/models"
    flow.request.method = "GET"
    flow.request.content = b""
    await chain.send(flow)
    assert flow.response is None  # passed on, as before
    assert "authorization" not in flow.request.headers and flow.request.headers["x-team"] == "a"
