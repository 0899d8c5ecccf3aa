"""The model list a configuration serves (routing.models) and the ``unmatched`` and ``models``
keys: which names are listed for which host, the Azure forms, the 404s' wording, and that
every listed name is one the router really takes (a property over generated configs)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmitm.routing.config import Config, ConfigError, parse_config
from llmitm.routing.models import (
    ModelsCall,
    find_model,
    list_body,
    models_call,
    served_models,
    serves_host,
    unknown_model,
    unmatched_error,
)
from llmitm.routing.plan import match_route

CONFIG: dict[str, Any] = {
    "endpoints": {
        "local": {"kind": "compatible", "base_url": "http://127.0.0.1:1/v1"},
        "az": {
            "kind": "azure",
            "base_url": "https://res.openai.azure.com",
            "api_version": "2024-10-21",
            "deployments": {"gpt-4o-mini": "mini-prod"},
        },
    },
    "routes": [
        {"models": ["gpt-4o", "local-*"], "endpoints": ["local"], "model": "qwen3:8b"},
        {"models": ["gpt-4o-mini"], "hosts": ["*.openai.azure.com"], "endpoints": ["az"]},
        {"models": ["qwen3:8b"], "endpoints": ["local", "az"], "name": "fleet"},
    ],
}


def config(raw: dict[str, Any] | None = None) -> Config:
    return parse_config(raw or CONFIG, "llmitm.toml", {})


@pytest.mark.parametrize(
    ("path", "call"),
    [
        ("/v1/models", ModelsCall("openai")),
        ("/v1/models/", ModelsCall("openai")),
        ("/v1/models/gpt-4o", ModelsCall("openai", "gpt-4o")),
        ("/v1/models/meta-llama/Llama-3?x=1", ModelsCall("openai", "meta-llama/Llama-3")),
        ("/v1/models/qwen3%3A8b", ModelsCall("openai", "qwen3:8b")),
        ("/models", ModelsCall("openai")),
        ("/api/v1/models", ModelsCall("openai")),
        ("/openai/v1/models", ModelsCall("openai")),
        ("/openai/models?api-version=2024-10-21", ModelsCall("azure-models")),
        ("/openai/deployments?api-version=2022-12-01", ModelsCall("azure-deployments")),
        ("/openai/deployments/mini-prod", ModelsCall("azure-deployments", "mini-prod")),
    ],
)
def test_model_list_paths(path: str, call: ModelsCall) -> None:
    assert models_call(path) == call


@pytest.mark.parametrize(
    "path",
    ["/v1/chat/completions", "/api/models", "/hub/models/x", "/v1/modelsx", "/openai/files"],
)
def test_other_paths_are_no_model_list(path: str) -> None:
    assert models_call(path) is None


def test_exact_names_and_aliases_are_listed_globs_are_not() -> None:
    models = served_models(config(), "api.openai.com")
    assert [m.id for m in models] == ["gpt-4o", "qwen3:8b"]
    gpt, qwen = models
    assert (gpt.route, gpt.upstream_model, gpt.endpoints) == ("routes[0]", "qwen3:8b", ("local",))
    # The alias is listed under the route that takes the name, not the one that sends it.
    assert (qwen.route, qwen.endpoints) == ("fleet", ("local", "az"))


def test_the_host_decides_which_routes_list() -> None:
    models = served_models(config(), "res.openai.azure.com")
    assert [m.id for m in models] == ["gpt-4o", "gpt-4o-mini", "qwen3:8b"]
    mini = models[1]
    assert mini.deployment == "mini-prod" and mini.endpoints == ("az",)


def test_a_deployment_map_lists_its_models_where_a_route_takes_them() -> None:
    raw = {
        "endpoints": CONFIG["endpoints"],
        "routes": [{"models": ["gpt-*"], "endpoints": ["az"]}],
    }
    assert [m.id for m in served_models(config(raw), "any")] == ["gpt-4o-mini"]


def test_only_globs_list_nothing_but_the_host_is_served() -> None:
    raw = {"endpoints": CONFIG["endpoints"], "routes": [{"endpoints": ["local"]}]}
    assert served_models(config(raw), "api.openai.com") == []
    assert serves_host(config(raw), "api.openai.com")
    assert serves_host(config(), "example.com")  # routes[0] takes every host


def test_list_bodies_have_openais_and_azures_shapes() -> None:
    models = served_models(config(), "res.openai.azure.com")
    body = list_body(ModelsCall("openai"), models, 1700000000)
    assert body["object"] == "list"
    assert body["data"][0] == {
        "id": "gpt-4o",
        "object": "model",
        "created": 1700000000,
        "owned_by": "local",
        "llmitm": {"route": "routes[0]", "endpoints": ["local"], "upstream_model": "qwen3:8b"},
    }
    deployments = list_body(ModelsCall("azure-deployments"), models, 1)["data"]
    assert deployments[1]["id"] == "mini-prod" and deployments[1]["model"] == "gpt-4o-mini"
    assert {d["object"] for d in deployments} == {"deployment"}


def test_one_model_by_name_or_deployment() -> None:
    models = served_models(config(), "res.openai.azure.com")
    assert find_model(ModelsCall("openai", "gpt-4o-mini"), models) is models[1]
    assert find_model(ModelsCall("azure-deployments", "mini-prod"), models) is models[1]
    assert find_model(ModelsCall("openai", "mini-prod"), models) is None


def test_the_404s_name_the_routes_patterns() -> None:
    error = unknown_model(config(), "gpt-5")
    assert (error.status, error.code, error.param) == (404, "model_not_found", "model")
    assert "gpt-5" in error.message and "gpt-4o, local-*, gpt-4o-mini, qwen3:8b" in error.message
    error = unmatched_error(config(), "gpt-5", "api.openai.com")
    assert error.status == 404 and error.code == "model_not_found"
    assert "api.openai.com" in error.message and "local-*" in error.message


def test_unmatched_and_models_keys_default_and_validate() -> None:
    settings = config().settings
    assert (settings.unmatched, settings.models) == ("pass", "config")
    raw = {**CONFIG, "llmitm": {"unmatched": "reject", "models": "upstream"}}
    settings = config(raw).settings
    assert (settings.unmatched, settings.models) == ("reject", "upstream")
    with pytest.raises(ConfigError, match=r"llmitm\.unmatched: expected one of pass, reject"):
        config({**CONFIG, "llmitm": {"unmatched": "drop"}})
    with pytest.raises(ConfigError, match=r"llmitm\.models: expected one of config, upstream"):
        config({**CONFIG, "llmitm": {"models": "both"}})


names = st.text(alphabet="abc-*?", min_size=1, max_size=4)


@given(
    routes=st.lists(
        st.fixed_dictionaries(
            {"models": st.lists(names, min_size=1, max_size=3)},
            optional={"model": st.text(alphabet="abc", min_size=1, max_size=3)},
        ),
        min_size=1,
        max_size=4,
    ),
    host=st.sampled_from(["api.openai.com", "x.openai.azure.com"]),
)
def test_every_listed_model_is_one_the_router_takes_by_that_route(
    routes: list[dict[str, Any]], host: str
) -> None:
    raw = {
        "endpoints": {"e": {"kind": "compatible", "base_url": "http://127.0.0.1:1/v1"}},
        "routes": [{**route, "endpoints": ["e"]} for route in routes],
    }
    cfg = config(raw)
    listed = served_models(cfg, host)
    assert len({m.id for m in listed}) == len(listed)
    for model in listed:
        route = match_route(cfg, model.id, host)
        assert route is not None and route.name == model.route
    exact = {g for r in cfg.routes for g in r.models if not any(c in g for c in "*?[")}
    assert exact <= {m.id for m in listed}  # every exact pattern is listed (hosts are "*")
