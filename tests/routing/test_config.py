"""The TOML configuration: every key read, defaults per endpoint kind, credentials from the
environment only, and every mistake reported as a ConfigError naming the file, the key path
and what was expected (never a traceback)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from llmitm.routing.config import (
    Config,
    ConfigError,
    Endpoint,
    Route,
    Settings,
    default_config,
    load_config,
    parse_config,
)
from llmitm.routing.plan import endpoint_url

FULL = """
[llmitm]
reasoning = "reasoning_content"
strict = true
drop_unsupported = true
store = "data/usage.db"

[endpoints.az]
kind = "azure"
base_url = "https://res.openai.azure.com/"
apis = ["responses"]
api_key_env = "AZ_KEY"
auth_header = "X-Custom-Key"
api_version = "2025-04-01-preview"
deployments = { "gpt-5" = "gpt5-prod", "o4-mini" = "o4m" }
non_conformant = ["responses"]
think_open_missing = true
headers = { "x-team" = "llm" }

[endpoints.local]
kind = "compatible"
base_url = "http://127.0.0.1:11434/v1"

[[routes]]
models = ["gpt-5*", "o4-*"]
hosts = ["api.openai.com", "*.azure.com"]
endpoints = ["az", "local"]
model = "gpt-5"
name = "reasoning"

[[routes]]
models = "qwen*"
endpoints = "local"
"""


def write(tmp_path: Path, text: str, name: str = "llmitm.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def endpoint_toml(name: str = "e", **keys: Any) -> dict[str, Any]:
    return {"endpoints": {name: keys}}


def error_of(raw: dict[str, Any], environ: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(raw, "conf/llmitm.toml", environ or {})
    message = str(info.value)
    assert message.startswith("conf/llmitm.toml: "), message
    assert "Traceback" not in message
    return message


# --- valid files ----------------------------------------------------------------------------


def test_every_key_is_read(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, FULL), {"AZ_KEY": "sk-az"})
    assert config.source == str(tmp_path / "llmitm.toml")
    assert config.settings == Settings(
        reasoning="reasoning_content",
        strict=True,
        drop_unsupported=True,
        store=str(tmp_path / "data" / "usage.db"),  # relative to the file's folder
    )
    az = config.endpoints["az"]
    assert az == Endpoint(
        name="az",
        kind="azure",
        base_url="https://res.openai.azure.com",  # the trailing slash is dropped
        apis=frozenset({"responses"}),
        api_key_env="AZ_KEY",
        api_key="sk-az",
        auth_header="x-custom-key",  # header names are case-insensitive: kept lower-case
        api_version="2025-04-01-preview",
        deployments={"gpt-5": "gpt5-prod", "o4-mini": "o4m"},
        non_conformant=frozenset({"responses"}),
        think_open_missing=True,
        headers={"x-team": "llm"},
    )
    assert az.azure_classic
    assert az.deployment_for("gpt-5") == "gpt5-prod"
    assert az.deployment_for("unlisted") == "unlisted"
    assert config.routes == (
        Route(
            models=("gpt-5*", "o4-*"),
            hosts=("api.openai.com", "*.azure.com"),
            endpoints=("az", "local"),
            model="gpt-5",
            name="reasoning",
            named=True,
        ),
        # A single string stands for a one-element list; hosts default to everything; the
        # name defaults to the route's place in the file.
        Route(models=("qwen*",), hosts=("*",), endpoints=("local",), model=None, name="routes[1]"),
    )


def test_the_key_is_not_shown_in_the_endpoint_repr(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, FULL), {"AZ_KEY": "sk-secret-value"})
    assert "sk-secret-value" not in repr(config)


def test_an_empty_file_is_the_embedded_default(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, ""), {})
    assert config.settings == Settings()
    assert config.endpoints == {}
    assert config.routes == ()


def test_default_config_routes_nothing() -> None:
    config = default_config()
    assert isinstance(config, Config)
    assert config.routes == ()
    assert config.endpoints == {}
    assert config.settings.reasoning == "think-tags"
    assert config.settings.strict is False


@pytest.mark.parametrize(
    ("kind", "apis", "auth_header"),
    [
        ("openai", {"chat", "responses"}, "authorization"),
        ("azure", {"chat", "responses"}, "api-key"),
        ("compatible", {"chat"}, "authorization"),
    ],
)
def test_defaults_per_kind(kind: str, apis: set[str], auth_header: str) -> None:
    config = parse_config(endpoint_toml(kind=kind, base_url="https://h/v1"), "f", {})
    endpoint = config.endpoints["e"]
    assert endpoint.apis == frozenset(apis)
    assert endpoint.auth_header == auth_header
    assert endpoint.api_key is None
    assert endpoint.api_key_env is None
    assert endpoint.api_version is None
    assert endpoint.deployments == {}
    assert endpoint.non_conformant == frozenset()
    assert endpoint.think_open_missing is False
    assert endpoint.headers == {}
    assert not endpoint.azure_classic


def test_azure_without_api_version_is_the_v1_form() -> None:
    config = parse_config(endpoint_toml(kind="azure", base_url="https://r.azure.com"), "f", {})
    assert not config.endpoints["e"].azure_classic


@pytest.mark.parametrize(
    "base_url",
    [
        "https://r.azure.com/openai/v1",
        "https://r.azure.com/openai/v1/",
        "https://r.azure.com/openai",
    ],
)
def test_an_azure_base_url_with_the_openai_path_is_not_doubled(base_url: str) -> None:
    endpoint = parse_config(endpoint_toml(kind="azure", base_url=base_url), "f", {}).endpoints["e"]
    assert endpoint_url(endpoint, "responses", "m") == "https://r.azure.com/openai/v1/responses"


def test_an_azure_v1_base_url_with_an_api_version_is_refused() -> None:
    raw = endpoint_toml(kind="azure", base_url="https://r.azure.com/openai/v1")
    raw["endpoints"]["e"]["api_version"] = "2025-04-01-preview"
    with pytest.raises(ConfigError, match=r"f: endpoints\.e\.base_url: expected the resource URL"):
        parse_config(raw, "f", {})


@pytest.mark.parametrize("key", ["models", "hosts"])
def test_a_route_with_an_empty_list_is_refused_rather_than_never_matching(key: str) -> None:
    raw = {
        **endpoint_toml(kind="openai", base_url="https://h"),
        "routes": [{"endpoints": ["e"], key: []}],
    }
    with pytest.raises(ConfigError, match=rf"routes\[0\]\.{key}: expected at least one glob"):
        parse_config(raw, "f", {})


def test_route_defaults_match_every_model_and_host() -> None:
    raw = {**endpoint_toml(kind="openai", base_url="https://h"), "routes": [{"endpoints": ["e"]}]}
    route = parse_config(raw, "f", {}).routes[0]
    assert route == Route(
        models=("*",), hosts=("*",), endpoints=("e",), model=None, name="routes[0]"
    )


# --- credentials ----------------------------------------------------------------------------


def test_credentials_come_from_the_given_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMITM_TEST_KEY", "from-process-env")
    raw = endpoint_toml(kind="openai", base_url="https://h", api_key_env="LLMITM_TEST_KEY")
    config = parse_config(raw, "f", {"LLMITM_TEST_KEY": "from-given-env"})
    assert config.endpoints["e"].api_key == "from-given-env"


def test_load_config_defaults_to_the_process_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLMITM_TEST_KEY", "from-process-env")
    path = write(
        tmp_path,
        '[endpoints.e]\nkind = "openai"\nbase_url = "https://h"\napi_key_env = "LLMITM_TEST_KEY"\n',
    )
    assert load_config(path).endpoints["e"].api_key == "from-process-env"


def test_a_key_written_in_the_file_is_refused() -> None:
    message = error_of(endpoint_toml(kind="openai", base_url="https://h", api_key="sk-in-file"))
    assert "endpoints.e.api_key: unknown key" in message
    assert "api_key_env" in message  # the list of known keys points at the right one
    assert "sk-in-file" not in message


@pytest.mark.parametrize("environ", [{}, {"MISSING_KEY": ""}], ids=["unset", "empty"])
def test_api_key_env_naming_a_missing_variable(environ: dict[str, str]) -> None:
    message = error_of(
        endpoint_toml("az", kind="azure", base_url="https://h", api_key_env="MISSING_KEY"),
        environ,
    )
    assert "endpoints.az.api_key_env" in message
    assert "MISSING_KEY is not set" in message


# --- errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "key", "expected"),
    [
        ({"bogus": 1}, "bogus: unknown key", "known: client_keys, endpoints, llmitm, routes"),
        (
            {"llmitm": {"colour": "red"}},
            "llmitm.colour: unknown key",
            "known: allowed_origins, drop_unsupported",
        ),
        (
            endpoint_toml("az", kind="azure", base_url="https://h", colour="red"),
            "endpoints.az.colour: unknown key",
            "known: api_key_env",
        ),
        (
            {
                **endpoint_toml(kind="openai", base_url="https://h"),
                "routes": [{"endpoints": ["e"], "model_glob": "x"}],
            },
            "routes[0].model_glob: unknown key",
            "endpoints, first_byte_timeout, hosts, model, models",
        ),
    ],
)
def test_unknown_keys(raw: dict[str, Any], key: str, expected: str) -> None:
    message = error_of(raw)
    assert key in message
    assert expected in message


@pytest.mark.parametrize(
    ("raw", "key", "expected"),
    [
        ({"llmitm": 3}, "llmitm", "a table"),
        ({"llmitm": {"reasoning": "loud"}}, "llmitm.reasoning", "one of think-tags"),
        ({"llmitm": {"strict": "yes"}}, "llmitm.strict", "true or false"),
        ({"llmitm": {"drop_unsupported": 1}}, "llmitm.drop_unsupported", "true or false"),
        ({"endpoints": "x"}, "endpoints", "a table"),
        ({"endpoints": {"az": "x"}}, "endpoints.az", "a table"),
        (
            endpoint_toml("az", kind="azure", base_url="https://h", api_version=5),
            "endpoints.az.api_version",
            "a non-empty string",
        ),
        (
            endpoint_toml("az", kind="azure", base_url="https://h", api_version=""),
            "endpoints.az.api_version",
            "a non-empty string",
        ),
        (
            endpoint_toml("az", kind="azure", base_url=42),
            "endpoints.az.base_url",
            "a non-empty string",
        ),
        (
            endpoint_toml("az", kind="azure", base_url="https://h", apis=3),
            "endpoints.az.apis",
            "a string or an array of strings",
        ),
        (
            endpoint_toml("az", kind="azure", base_url="https://h", apis=["chat", "embeddings"]),
            "endpoints.az.apis",
            "one of chat, responses",
        ),
        (
            endpoint_toml("az", kind="azure", base_url="https://h", non_conformant=["x"]),
            "endpoints.az.non_conformant",
            "one of chat, responses",
        ),
        (
            endpoint_toml("az", kind="azure", base_url="https://h", deployments=["a"]),
            "endpoints.az.deployments",
            "a table of strings",
        ),
        (
            endpoint_toml("az", kind="azure", base_url="https://h", deployments={"a": 1}),
            "endpoints.az.deployments",
            "a table of strings",
        ),
        (
            endpoint_toml("az", kind="azure", base_url="https://h", headers={"x": True}),
            "endpoints.az.headers",
            "a table of strings",
        ),
        (
            endpoint_toml("az", kind="azure", base_url="https://h", think_open_missing="no"),
            "endpoints.az.think_open_missing",
            "true or false",
        ),
        (
            endpoint_toml("az", kind="azure", base_url="https://h", auth_header=""),
            "endpoints.az.auth_header",
            "a non-empty string",
        ),
        (
            endpoint_toml("c", kind="compatible", base_url="https://h", api_version="2024"),
            "endpoints.c.kind",
            '"azure" (api_version and deployments are Azure settings)',
        ),
        (
            endpoint_toml("c", kind="openai", base_url="https://h", deployments={"a": "b"}),
            "endpoints.c.kind",
            '"azure"',
        ),
        ({"routes": {"endpoints": ["e"]}}, "routes", "an array of tables ([[routes]])"),
        ({"routes": [1]}, "routes[0]", "a table"),
        (
            {
                **endpoint_toml(kind="openai", base_url="https://h"),
                "routes": [{"endpoints": ["e"], "models": [1]}],
            },
            "routes[0].models",
            "a string or an array of strings",
        ),
        (
            {
                **endpoint_toml(kind="openai", base_url="https://h"),
                "routes": [{"endpoints": ["e"], "hosts": 7}],
            },
            "routes[0].hosts",
            "a string or an array of strings",
        ),
        (
            {
                **endpoint_toml(kind="openai", base_url="https://h"),
                "routes": [{"endpoints": ["e"], "model": 4}],
            },
            "routes[0].model",
            "a non-empty string",
        ),
    ],
)
def test_wrong_types(raw: dict[str, Any], key: str, expected: str) -> None:
    message = error_of(raw)
    assert f": {key}: expected {expected}" in message


@pytest.mark.parametrize("kind", ["nope", None, 3])
def test_unknown_or_missing_kind(kind: Any) -> None:
    keys: dict[str, Any] = {"base_url": "https://h"}
    if kind is not None:
        keys["kind"] = kind
    message = error_of(endpoint_toml("az", **keys))
    assert "endpoints.az.kind: expected one of openai, azure, compatible" in message
    assert repr(kind) in message


@pytest.mark.parametrize(
    ("base_url", "expected"),
    [
        (None, "the endpoint's URL (http:// or https://)"),
        ("ftp://h/v1", "a URL starting with http:// or https://"),
        ("127.0.0.1:11434/v1", "a URL starting with http:// or https://"),
        ("https://", "a URL with a host"),
        ("http:///v1", "a URL with a host"),
        ("http://[::1/v1", "a URL with a host"),
    ],
)
def test_bad_base_url(base_url: str | None, expected: str) -> None:
    keys: dict[str, Any] = {"kind": "compatible"}
    if base_url is not None:
        keys["base_url"] = base_url
    message = error_of(endpoint_toml("local", **keys))
    assert f"endpoints.local.base_url: expected {expected}" in message


def test_an_endpoint_must_speak_some_api() -> None:
    message = error_of(endpoint_toml("local", kind="compatible", base_url="https://h", apis=[]))
    assert "endpoints.local.apis: expected at least one of chat, responses" in message


def test_route_naming_an_undefined_endpoint() -> None:
    raw = {
        **endpoint_toml("local", kind="compatible", base_url="https://h"),
        "routes": [{"endpoints": ["local"]}, {"endpoints": ["local", "azure"]}],
    }
    message = error_of(raw)
    assert "routes[1].endpoints: expected a defined endpoint (local), got 'azure'" in message


def test_route_without_endpoints() -> None:
    message = error_of({"routes": [{"models": ["gpt-*"]}]})
    assert "routes[0].endpoints: expected at least one endpoint name" in message
    message = error_of({"routes": [{"endpoints": []}]})
    assert "routes[0].endpoints: expected at least one endpoint name" in message


def test_route_with_no_endpoints_defined_says_so() -> None:
    message = error_of({"routes": [{"endpoints": ["x"]}]})
    assert "routes[0].endpoints: expected a defined endpoint (none defined), got 'x'" in message


def test_invalid_toml_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, '[endpoints.local]\nkind = "compatible\n')
    with pytest.raises(ConfigError) as info:
        load_config(path, {})
    message = str(info.value)
    assert message.startswith(f"{path}: not valid TOML (")
    assert re.search(r"line \d+", message)


def test_non_utf8_file_is_reported_as_not_toml(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'[llmitm]\nreasoning = "caf\xe9"\n')
    with pytest.raises(ConfigError, match=r"not valid TOML"):
        load_config(path, {})


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as info:
        load_config(path, {})
    assert str(info.value) == f"{path}: the configuration file does not exist"


def test_unreadable_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path, {})  # a directory
    assert str(info.value).startswith(f"{tmp_path}: cannot read the configuration file")


def test_load_config_errors_name_the_real_file(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '[endpoints.az]\nkind = "azure"\nbase_url = "https://h"\napi_version = 2025\n',
        name="team.toml",
    )
    with pytest.raises(ConfigError) as info:
        load_config(path, {})
    assert str(info.value) == (
        f"{path}: endpoints.az.api_version: expected a non-empty string, got 2025"
    )


def test_config_error_is_a_value_error() -> None:
    assert issubclass(ConfigError, ValueError)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("", ""),
        ("/abs/llmitm.db", "/abs/llmitm.db"),
        ("~/u.db", str(Path("~/u.db").expanduser())),
        # A database URL is the store's to resolve, never a path under the file's folder.
        (
            "postgresql://llmitm@db.internal:5432/llmitm",
            "postgresql://llmitm@db.internal:5432/llmitm",
        ),
        ("postgres://u@h/db?sslmode=require", "postgres://u@h/db?sslmode=require"),
    ],
)
def test_the_store_key(tmp_path: Path, value: str, expected: str) -> None:
    config = load_config(write(tmp_path, f'[llmitm]\nstore = "{value}"\n'), {})
    assert config.settings.store == expected


def test_the_store_key_must_be_a_string(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"llmitm\.store: expected a file path"):
        load_config(write(tmp_path, "[llmitm]\nstore = 1\n"), {})


@pytest.mark.parametrize(
    "url", ["postgresql://llmitm:s3cret@db:5432/llmitm", "postgres://u@h/db?password=s3cret"]
)
def test_a_store_url_with_a_password_is_refused_without_repeating_it(
    tmp_path: Path, url: str
) -> None:
    with pytest.raises(ConfigError, match="PGPASSWORD") as info:
        load_config(write(tmp_path, f'[llmitm]\nstore = "{url}"\n'), {})
    assert "s3cret" not in str(info.value)


# --- routing keys (issue 4) --------------------------------------------------------------


ROUTING = """
[routing]
cooldown = 2.5
failure_threshold = 2
max_retry_after = 60
connect_timeout = 3
first_byte_timeout = 20
stream_idle_timeout = 45
timeout = 90
backoff = 0.25
backoff_max = 4
queue_size = 0
queue_timeout = 5
queue_retry_after = 2
affinity_ttl = 600

[endpoints.east]
kind = "azure"
base_url = "https://east.openai.azure.com"
weight = 3
max_concurrency = 16
max_concurrency_per_model = { "gpt-5" = 4 }
stream_usage = false

[endpoints.west]
kind = "azure"
base_url = "https://west.openai.azure.com"

[[routes]]
models = ["gpt-5*"]
endpoints = ["east", "west"]
strategy = "weighted"
attempts = 4
timeout = 30
first_byte_timeout = 15.5
stream_idle_timeout = 7.5
affinity = false
"""


def test_every_routing_key_is_read(tmp_path: Path) -> None:
    from llmitm.routing.config import RoutingSettings

    config = load_config(write(tmp_path, ROUTING), {})
    assert config.routing == RoutingSettings(
        cooldown=2.5,
        failure_threshold=2,
        max_retry_after=60.0,
        connect_timeout=3.0,
        first_byte_timeout=20.0,
        stream_idle_timeout=45.0,
        timeout=90.0,
        backoff=0.25,
        backoff_max=4.0,
        queue_size=0,
        queue_timeout=5.0,
        queue_retry_after=2.0,
        affinity_ttl=600.0,
    )
    east, west = config.endpoints["east"], config.endpoints["west"]
    assert (east.weight, east.max_concurrency, east.stream_usage) == (3.0, 16, False)
    assert east.max_concurrency_per_model == {"gpt-5": 4}
    assert (west.weight, west.max_concurrency, west.stream_usage) == (1.0, None, True)
    (route,) = config.routes
    assert (route.strategy, route.attempts, route.timeout) == ("weighted", 4, 30.0)
    assert (route.first_byte_timeout, route.affinity, route.max_attempts) == (15.5, False, 4)
    assert route.stream_idle_timeout == 7.5


def test_the_stream_idle_timeout_defaults_below_the_clients_own_and_a_route_overrides_it() -> None:
    from llmitm.routing.engine import Routing

    config = parse_config(
        {
            **endpoint_toml(kind="openai", base_url="https://h"),
            "routes": [{"endpoints": ["e"], "models": ["a"]}, {"endpoints": ["e"], **_IDLE}],
        },
        "x.toml",
        {},
    )
    routing = Routing(config)
    # Codex gives up on a silent stream after 300 s, the openai SDKs read for 600 s.
    assert 60 <= routing.stream_idle_timeout(config.routes[0]) < 300
    assert routing.stream_idle_timeout(config.routes[1]) == 2.5


_IDLE = {"stream_idle_timeout": 2.5}


def test_routing_defaults() -> None:
    config = parse_config(endpoint_toml(kind="openai", base_url="https://h"), "x.toml", {})
    assert config.routing.timeout > config.routing.first_byte_timeout > 0
    route = parse_config(
        {**endpoint_toml(kind="openai", base_url="https://h"), "routes": [{"endpoints": "e"}]},
        "x.toml",
        {},
    ).routes[0]
    assert (route.strategy, route.attempts, route.max_attempts, route.affinity) == (
        "failover",
        None,
        1,
        True,
    )


def _with_route(**keys: Any) -> dict[str, Any]:
    return {
        **endpoint_toml(kind="openai", base_url="https://h"),
        "routes": [{"endpoints": ["e"], **keys}],
    }


@pytest.mark.parametrize(
    ("raw", "key", "expected"),
    [
        (_with_route(strategy="random"), "routes[0].strategy", "one of failover, weighted"),
        (_with_route(attempts=0), "routes[0].attempts", "an integer >= 1"),
        (_with_route(attempts=1.5), "routes[0].attempts", "an integer >= 1"),
        (_with_route(timeout=0), "routes[0].timeout", "a number > 0"),
        (_with_route(first_byte_timeout="5s"), "routes[0].first_byte_timeout", "a number > 0"),
        (_with_route(stream_idle_timeout=0), "routes[0].stream_idle_timeout", "a number > 0"),
        (_with_route(affinity="yes"), "routes[0].affinity", "true or false"),
        (endpoint_toml(kind="openai", base_url="https://h", weight=-1), "endpoints.e.weight",
         "a number >= 0"),
        (endpoint_toml(kind="openai", base_url="https://h", weight=True), "endpoints.e.weight",
         "a number >= 0"),
        (endpoint_toml(kind="openai", base_url="https://h", max_concurrency=0),
         "endpoints.e.max_concurrency", "an integer >= 1"),
        (endpoint_toml(kind="openai", base_url="https://h", max_concurrency_per_model={"m": 0}),
         "endpoints.e.max_concurrency_per_model.m", "an integer >= 1"),
        (endpoint_toml(kind="openai", base_url="https://h", max_concurrency_per_model=3),
         "endpoints.e.max_concurrency_per_model", "a table of model = cap"),
        (endpoint_toml(kind="openai", base_url="https://h", stream_usage=1),
         "endpoints.e.stream_usage", "true or false"),
        ({"routing": {"cooldown": -1}}, "routing.cooldown", "a number >= 0"),
        ({"routing": {"timeout": 0}}, "routing.timeout", "a number > 0"),
        ({"routing": {"queue_size": -1}}, "routing.queue_size", "an integer >= 0"),
        ({"routing": {"failure_threshold": 0}}, "routing.failure_threshold", "an integer >= 1"),
        ({"routing": {"affinity_ttl": float("inf")}}, "routing.affinity_ttl", "a number > 0"),
        ({"routing": {"retries": 3}}, "routing.retries: unknown key", "known: affinity_ttl"),
        ({"routing": 3}, "routing", "a table"),
    ],
)  # fmt: skip
def test_wrong_routing_values(raw: dict[str, Any], key: str, expected: str) -> None:
    message = error_of(raw)
    assert key in message
    assert expected in message


def test_the_docs_routing_example_and_the_example_file_load() -> None:
    root = Path(__file__).resolve().parents[2]
    page = (root / "docs" / "routing.md").read_text(encoding="utf-8")
    block = page.split("## A fleet", 1)[1].split("```toml", 1)[1]
    environ = {"AZURE_EAST_KEY": "k1", "AZURE_WEST_KEY": "k2", "OPENAI_API_KEY": "k3"}
    config = parse_config(tomllib.loads(block.split("```", 1)[0]), "routing.md", environ)
    assert [route.endpoints for route in config.routes] == [
        ("azure-east", "azure-west", "openai"),
        ("llamacpp",),
    ]
    assert load_config(root / "examples" / "llmitm.toml", {}).routing.cooldown == 5.0


def test_the_idle_option_overrides_every_route_or_lifts_the_limit() -> None:
    import math

    from llmitm.routing.config import with_stream_idle_timeout
    from llmitm.routing.engine import Routing

    raw = {
        **endpoint_toml(kind="openai", base_url="https://h"),
        "routes": [{"endpoints": ["e"], **_IDLE}, {"endpoints": ["e"]}],
    }
    config = parse_config(raw, "x.toml", {})
    assert with_stream_idle_timeout(config, 0) is config
    for seconds, expected in ((9.0, 9.0), (-1.0, math.inf)):
        changed = Routing(with_stream_idle_timeout(config, seconds))
        assert [changed.stream_idle_timeout(r) for r in changed.config.routes] == [expected] * 2
