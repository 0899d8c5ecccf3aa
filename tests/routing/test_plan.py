"""The routing plan: upstream URLs for every endpoint kind and Azure form, the model sent
upstream (alias, deployment), the translation direction, credential replacement and route
matching in order."""

from __future__ import annotations

from typing import Any

import pytest

from llmitm.routing.config import Config, Endpoint, parse_config
from llmitm.routing.plan import (
    CREDENTIAL_HEADERS,
    Plan,
    endpoint_url,
    match_route,
    plan_for_endpoint,
    plan_request,
)
from llmitm.wire.paths import AZURE_RESPONSES_DEFAULT_VERSION


def endpoint(kind: str = "compatible", **keys: Any) -> Endpoint:
    apis = keys.pop("apis", ("chat", "responses") if kind != "compatible" else ("chat",))
    return Endpoint(
        name=keys.pop("name", "e"),
        kind=kind,  # type: ignore[arg-type]
        base_url=keys.pop("base_url", "https://up.example/v1"),
        apis=frozenset(apis),
        **keys,
    )


def config(text_routes: list[dict[str, Any]], **endpoints: dict[str, Any]) -> Config:
    raw = {"endpoints": endpoints, "routes": text_routes}
    return parse_config(raw, "test.toml", {"KEY_A": "sk-a", "KEY_B": "sk-b"})


# --- URLs -----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["openai", "compatible"])
@pytest.mark.parametrize(
    ("api", "rest"), [("chat", "/chat/completions"), ("responses", "/responses")]
)
def test_openai_and_compatible_urls_append_the_api(kind: str, api: str, rest: str) -> None:
    ep = endpoint(kind, base_url="http://127.0.0.1:11434/v1")
    assert endpoint_url(ep, api, "m") == "http://127.0.0.1:11434/v1" + rest  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("api", "rest"), [("chat", "chat/completions"), ("responses", "responses")]
)
def test_azure_v1_urls(api: str, rest: str) -> None:
    ep = endpoint("azure", base_url="https://res.openai.azure.com")
    assert not ep.azure_classic
    assert endpoint_url(ep, api, "dep") == f"https://res.openai.azure.com/openai/v1/{rest}"  # type: ignore[arg-type]


def test_azure_classic_chat_url_names_the_deployment_and_version() -> None:
    ep = endpoint("azure", base_url="https://res.openai.azure.com", api_version="2024-10-21")
    assert endpoint_url(ep, "chat", "gpt4o-prod") == (
        "https://res.openai.azure.com/openai/deployments/gpt4o-prod/chat/completions"
        "?api-version=2024-10-21"
    )


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ("2025-03-01-preview", "2025-03-01-preview"),  # the minimum is kept
        ("2025-04-01-preview", "2025-04-01-preview"),
        ("2026-01-01-preview", "2026-01-01-preview"),
        ("2024-10-21", AZURE_RESPONSES_DEFAULT_VERSION),  # too old for Responses: raised
        ("2025-02-01-preview", AZURE_RESPONSES_DEFAULT_VERSION),
    ],
)
def test_azure_classic_responses_url_has_no_deployment_and_a_new_enough_version(
    version: str, expected: str
) -> None:
    ep = endpoint("azure", base_url="https://res.openai.azure.com", api_version=version)
    assert endpoint_url(ep, "responses", "dep") == (
        f"https://res.openai.azure.com/openai/responses?api-version={expected}"
    )


def test_azure_classic_chat_keeps_an_old_version() -> None:
    ep = endpoint("azure", base_url="https://r", api_version="2023-05-15")
    assert endpoint_url(ep, "chat", "d").endswith("?api-version=2023-05-15")


# --- model ----------------------------------------------------------------------------------


def test_azure_deployment_map_names_the_upstream_model_and_the_path() -> None:
    ep = endpoint(
        "azure",
        base_url="https://r",
        api_version="2024-10-21",
        deployments={"gpt-4o": "gpt4o-prod"},
    )
    plan = plan_for_endpoint(ep, "chat", "gpt-4o")
    assert plan.upstream_model == "gpt4o-prod"
    assert (
        plan.url
        == "https://r/openai/deployments/gpt4o-prod/chat/completions?api-version=2024-10-21"
    )
    unlisted = plan_for_endpoint(ep, "chat", "o4-mini")
    assert unlisted.upstream_model == "o4-mini"
    assert "/deployments/o4-mini/" in unlisted.url


def test_deployment_map_is_azure_only() -> None:
    # A compatible endpoint never renames the model (the map cannot be set there anyway).
    plan = plan_for_endpoint(endpoint("compatible"), "chat", "gpt-4o")
    assert plan.upstream_model == "gpt-4o"


def test_route_alias_replaces_the_model_sent_upstream() -> None:
    cfg = config(
        [{"models": ["gpt-*"], "endpoints": ["local"], "model": "qwen3:8b"}],
        local={"kind": "compatible", "base_url": "http://127.0.0.1:11434/v1"},
    )
    plan = plan_request(cfg, "chat", "gpt-4o", "api.openai.com")
    assert plan is not None
    assert plan.upstream_model == "qwen3:8b"
    assert plan.url == "http://127.0.0.1:11434/v1/chat/completions"


def test_alias_goes_through_the_deployment_map() -> None:
    cfg = config(
        [{"endpoints": ["az"], "model": "gpt-5"}],
        az={
            "kind": "azure",
            "base_url": "https://r",
            "api_version": "2025-04-01-preview",
            "deployments": {"gpt-5": "gpt5-prod"},
        },
    )
    plan = plan_request(cfg, "chat", "anything", "h")
    assert plan is not None
    assert plan.upstream_model == "gpt5-prod"
    assert "/deployments/gpt5-prod/" in plan.url


# --- translation direction ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("client", "apis", "upstream", "direction", "label"),
    [
        ("chat", ("chat",), "chat", None, "chat→chat"),
        ("responses", ("responses",), "responses", None, "responses→responses"),
        ("chat", ("chat", "responses"), "chat", None, "chat→chat"),
        ("responses", ("chat", "responses"), "responses", None, "responses→responses"),
        ("responses", ("chat",), "chat", "chat-to-responses", "responses→chat"),
        ("chat", ("responses",), "responses", "responses-to-chat", "chat→responses"),
    ],
)
def test_translation_happens_only_when_the_endpoint_lacks_the_clients_api(
    client: str, apis: tuple[str, ...], upstream: str, direction: str | None, label: str
) -> None:
    plan = plan_for_endpoint(endpoint("openai", apis=apis), client, "m")  # type: ignore[arg-type]
    assert plan.client_api == client
    assert plan.upstream_api == upstream
    assert plan.translates is (client != upstream)
    assert plan.stream_direction == direction
    assert plan.label == label
    rest = "/chat/completions" if upstream == "chat" else "/responses"
    assert plan.url == "https://up.example/v1" + rest


def test_non_conformant_responses_endpoint_gets_its_stream_normalised() -> None:
    ep = endpoint("compatible", apis=("chat", "responses"), non_conformant=frozenset({"responses"}))
    plan = plan_for_endpoint(ep, "responses", "m")
    assert not plan.translates
    assert plan.stream_direction == "normalise-responses"
    # A chat client of the same third-party endpoint gets its stream normalised too (by
    # default, see tests/exchange/test_chat_normalise_wiring.py).
    assert plan_for_endpoint(ep, "chat", "m").stream_direction == "normalise-chat"


def test_chat_client_translated_to_a_non_conformant_responses_upstream_is_translated() -> None:
    ep = endpoint("compatible", apis=("responses",), non_conformant=frozenset({"responses"}))
    assert plan_for_endpoint(ep, "chat", "m").stream_direction == "responses-to-chat"


# --- credentials ----------------------------------------------------------------------------


def test_bearer_key_replaces_the_clients_credentials() -> None:
    plan = plan_for_endpoint(endpoint("openai", api_key="sk-up"), "chat", "m")
    assert plan.set_headers == {"authorization": "Bearer sk-up"}
    assert set(plan.remove_headers) == set(CREDENTIAL_HEADERS)
    assert {"authorization", "api-key", "x-api-key"} <= set(plan.remove_headers)


def test_azure_key_goes_in_api_key() -> None:
    plan = plan_for_endpoint(
        endpoint("azure", api_key="az-secret", auth_header="api-key"), "responses", "m"
    )
    assert plan.set_headers == {"api-key": "az-secret"}
    assert "authorization" in plan.remove_headers
    assert "api-key" in plan.remove_headers


def test_custom_auth_header_gets_the_bare_key() -> None:
    plan = plan_for_endpoint(
        endpoint("compatible", api_key="k", auth_header="x-api-key"), "chat", "m"
    )
    assert plan.set_headers == {"x-api-key": "k"}


def test_without_a_key_the_clients_credentials_stay() -> None:
    plan = plan_for_endpoint(endpoint("compatible", headers={"x-team": "llm"}), "chat", "m")
    assert plan.remove_headers == ()
    assert plan.set_headers == {"x-team": "llm"}


def test_extra_headers_are_sent_with_the_key() -> None:
    plan = plan_for_endpoint(
        endpoint("openai", api_key="sk", headers={"OpenAI-Organization": "org-1"}), "chat", "m"
    )
    assert plan.set_headers == {"OpenAI-Organization": "org-1", "authorization": "Bearer sk"}


def test_key_is_not_in_the_plans_repr() -> None:
    plan = plan_for_endpoint(endpoint("openai", api_key="sk-hidden"), "chat", "m")
    assert "sk-hidden" not in repr(plan)


def test_config_file_keys_reach_the_plan() -> None:
    cfg = config(
        [{"endpoints": ["az"]}],
        az={"kind": "azure", "base_url": "https://r", "api_key_env": "KEY_A"},
    )
    plan = plan_request(cfg, "chat", "m", "h")
    assert plan is not None
    assert plan.set_headers == {"api-key": "sk-a"}


# --- route matching -------------------------------------------------------------------------


ROUTED = config(
    [
        {"models": ["gpt-5*", "o4-*"], "hosts": ["*.azure.com"], "endpoints": ["a"]},
        {"models": ["gpt-5*"], "endpoints": ["b"]},
        {"hosts": ["localhost"], "endpoints": ["b"], "model": "local-model"},
    ],
    a={"kind": "azure", "base_url": "https://a.example", "api_key_env": "KEY_A"},
    b={"kind": "compatible", "base_url": "https://b.example/v1", "api_key_env": "KEY_B"},
)


@pytest.mark.parametrize(
    ("model", "host", "index"),
    [
        ("gpt-5", "res.openai.azure.com", 0),
        ("o4-mini", "res.openai.azure.com", 0),
        ("gpt-5-codex", "api.openai.com", 1),  # first route's host glob fails: next route
        ("gpt-4o", "localhost", 2),
        ("gpt-5", "localhost", 1),  # order decides, not specificity
        ("o4-mini", "api.openai.com", None),
        ("GPT-5", "api.openai.com", None),  # globs are case-sensitive
    ],
)
def test_first_route_whose_model_and_host_globs_match(
    model: str, host: str, index: int | None
) -> None:
    route = match_route(ROUTED, model, host)
    assert route is (ROUTED.routes[index] if index is not None else None)


def test_plan_request_uses_the_routes_first_endpoint() -> None:
    plan = plan_request(ROUTED, "responses", "gpt-5", "res.openai.azure.com")
    assert isinstance(plan, Plan)
    assert plan.endpoint.name == "a"
    assert plan.url == "https://a.example/openai/v1/responses"
    assert plan.set_headers == {"api-key": "sk-a"}

    plan = plan_request(ROUTED, "responses", "gpt-5", "api.openai.com")
    assert plan is not None
    assert plan.endpoint.name == "b"
    assert plan.upstream_api == "chat"
    assert plan.url == "https://b.example/v1/chat/completions"
    assert plan.set_headers == {"authorization": "Bearer sk-b"}


def test_no_route_no_plan() -> None:
    assert plan_request(ROUTED, "chat", "o4-mini", "api.openai.com") is None
    assert plan_request(Config(), "chat", "gpt-5", "api.openai.com") is None
