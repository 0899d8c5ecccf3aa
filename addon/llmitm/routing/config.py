"""The configuration file: endpoints, routes and translation settings, read once at start-up.

One TOML file (stdlib ``tomllib``)::

    [llmitm]
    reasoning = "think-tags"          # how reasoning reaches chat clients
    egress = "local"                  # answer what is not a routed LLM call here (default pass)
    responses_scope = "shared"        # stored responses readable by every client key
                                      # (default "credential": only by the key that made them)
    unmatched = "reject"              # a model no route takes: 404 (default "pass": forward)
    models = "upstream"               # GET /v1/models: the upstream's (default "config")

    [endpoints.local]
    kind = "compatible"               # openai | azure | compatible
    base_url = "http://127.0.0.1:11434/v1"
    apis = ["chat"]                   # the API(s) it speaks
    state = "auto"                    # Responses state: native | emulate | auto

    [[routes]]
    models = ["gpt-*"]                # model globs (and/or hosts = [...])
    endpoints = ["local"]
    model = "qwen3:8b"                # optional alias sent upstream
    cache = { ttl = "1h", max_entries = 1000 }   # optional response cache (replay.cache)

    [client_keys.alice]               # optional: the proxy's own keys (routing.access)
    key_env = "LLMITM_KEY_ALICE"
    routes = ["routes[0]"]            # optional: the routes this key may use

Secrets are never in the file: an endpoint names the environment variable that holds its key
(``api_key_env``), and so does a client key (``key_env``). Every mistake fails at start-up as
a :class:`ConfigError` naming the file, the key and what was expected — never a traceback.
With no file, :func:`default_config` lets OpenAI and Azure traffic pass through unchanged.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, get_args
from urllib.parse import urlsplit

from llmitm.errors import UserError
from llmitm.routing.access import RESPONSES_SCOPES, Access, ClientKey, ResponsesScope
from llmitm.routing.egress import EGRESS_POLICIES, EgressPolicy
from llmitm.routing.strategies import STRATEGIES, StrategyName
from llmitm.wire.modes import REASONING_MODES, ReasoningMode
from llmitm.wire.paths import ApiName

EndpointKind = Literal["openai", "azure", "compatible"]
ENDPOINT_KINDS: tuple[str, ...] = get_args(EndpointKind)
API_NAMES: tuple[str, ...] = ("chat", "responses")
StateMode = Literal["native", "emulate", "auto"]
STATE_MODES: tuple[str, ...] = get_args(StateMode)
UnmatchedPolicy = Literal["pass", "reject"]
UNMATCHED_POLICIES: tuple[str, ...] = get_args(UnmatchedPolicy)
ModelsSource = Literal["config", "upstream"]
MODELS_SOURCES: tuple[str, ...] = get_args(ModelsSource)
CacheScope = Literal["credential", "shared"]
CACHE_SCOPES: tuple[str, ...] = get_args(CacheScope)
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*")


class ConfigError(UserError, ValueError):
    """A configuration file llmitm cannot use; the message names file, key and expectation."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One upstream server and how to talk to it."""

    name: str
    kind: EndpointKind
    base_url: str
    apis: frozenset[ApiName]
    api_key_env: str | None = None
    api_key: str | None = field(default=None, repr=False)
    auth_header: str = "authorization"
    api_version: str | None = None
    """Azure: set → the classic form (``/openai/deployments/…?api-version=…``); unset → v1."""
    deployments: Mapping[str, str] = field(default_factory=dict)
    """Azure: model name → deployment name (unlisted models use their own name)."""
    non_conformant: frozenset[ApiName] = frozenset()
    """APIs whose streams are normalised even on an ``openai``/``azure`` endpoint."""
    conformant: frozenset[ApiName] = frozenset()
    """APIs whose streams a ``compatible`` endpoint gets relayed as they are (trusted)."""
    think_open_missing: bool = False
    reasoning_passthrough: ReasoningMode | None = None
    """How reasoning in this endpoint's chat streams reaches chat clients (``think-tags``,
    ``reasoning_content``, ``reasoning``, ``drop``); set, the streams are normalised even
    when trusted. ``None``: the fields as the backend sent them."""
    reasoning_summary: bool = False
    """Raw ``reasoning_text`` of this endpoint's Responses streams reaches Responses clients
    as reasoning summary events (set, the streams are normalised even when trusted)."""
    headers: Mapping[str, str] = field(default_factory=dict)
    weight: float = 1.0
    """Share of a ``weighted`` route's first attempts (0: only as a fallback)."""
    max_concurrency: int | None = None
    """Requests in flight at once on this endpoint (``None``: no cap)."""
    max_concurrency_per_model: Mapping[str, int] = field(default_factory=dict)
    """Caps per upstream model (deployment) name, within ``max_concurrency``."""
    stream_usage: bool = True
    """Ask a chat upstream for the usage chunk (``stream_options.include_usage``) when the
    client did not, for accounting; the chunk is stripped before the client sees it."""
    state: StateMode = "auto"
    """Who keeps Responses state (``previous_response_id``, retrieve, ``input_items``,
    ``background``, cancel) for this endpoint's native Responses API: ``native`` (the
    server), ``emulate`` (llmitm, sending the server stateless requests) or ``auto``
    (emulate for ``compatible`` servers, which mostly keep none; native for OpenAI, Azure)."""

    @property
    def azure_classic(self) -> bool:
        return self.kind == "azure" and self.api_version is not None

    def deployment_for(self, model: str) -> str:
        return self.deployments.get(model, model)

    @property
    def emulates_state(self) -> bool:
        """Whether llmitm keeps the Responses state of this endpoint's native Responses API."""
        if self.state == "auto":
            return self.kind == "compatible"
        return self.state == "emulate"

    def normalises(self, api: ApiName) -> bool:
        """Whether this endpoint's streams of ``api`` are repaired on their way to a client of
        the same API: by default those of third-party (``compatible``) servers."""
        if api in self.non_conformant:
            return True
        # A reasoning rendering asked for needs the normaliser, trusted endpoint or not.
        if api == "chat" and self.reasoning_passthrough is not None:
            return True
        if api == "responses" and self.reasoning_summary:
            return True
        return self.kind == "compatible" and api not in self.conformant


def parse_duration(value: Any) -> float:
    """Seconds from ``"1h"``, ``"30m"``, ``"45s"``, ``"500ms"``, ``"2d"`` or a plain number of
    seconds; ``ValueError`` for anything else, zero or a negative span."""
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (match := _DURATION.fullmatch(value)):
        seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2) or "s"]
    else:
        raise ValueError(f"not a duration: {value!r}")
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"not a positive duration: {value!r}")
    return seconds


@dataclass(frozen=True, slots=True)
class CacheSettings:
    """A route's response cache (``cache = { ttl = "1h", max_entries = 1000 }``), or the
    settings a request that opts in on a route without one gets (the defaults)."""

    ttl: float = 3600.0
    """Seconds an answer is served from the cache after it was stored."""
    max_entries: int = 1000
    """Answers kept for the route at most (the least recently used goes first)."""
    scope: CacheScope = "credential"
    """Who is served a cached answer: only the credential whose request filled it, or
    (``shared``) every client of the route — except an answer holding sealed reasoning,
    which stays its credential's."""


@dataclass(frozen=True, slots=True)
class Route:
    """Which requests go to which endpoints."""

    models: tuple[str, ...] = ("*",)
    hosts: tuple[str, ...] = ("*",)
    endpoints: tuple[str, ...] = ()
    model: str | None = None
    """Alias: the model name sent upstream instead of the client's."""
    name: str = ""
    """How usage accounting and logs name the route (default ``routes[i]``)."""
    strategy: StrategyName = "failover"
    """How the first endpoint is chosen: ``failover`` (in order), ``weighted``, ``least-busy``."""
    attempts: int | None = None
    """Attempts in all per request (``None``: each endpoint once). More than the endpoints
    means retries with backoff."""
    timeout: float | None = None
    """Seconds after which no new attempt starts (``None``: ``[routing] timeout``)."""
    first_byte_timeout: float | None = None
    """Seconds an attempt may wait for its first byte (``None``: ``[routing]``'s)."""
    stream_idle_timeout: float | None = None
    """Seconds a started stream may go without a byte (``None``: ``[routing]``'s)."""
    affinity: bool = True
    """Keep conversations on the endpoint that served them while it is healthy."""
    named: bool = False
    """The file gave ``name`` (else it is ``routes[i]``, which says nothing across files)."""
    cache: CacheSettings | None = None
    """The route's response cache (``None``: only requests that ask for it are cached)."""

    @property
    def label(self) -> str:
        """How usage and the console name the route: its name, or when unnamed its pattern
        (``gpt-*,o3``, ``* @ *.azure.com``), so the first unnamed routes of two configurations
        stay apart instead of both being ``routes[0]``."""
        if self.named:
            return self.name
        models = ",".join(self.models)
        return models if self.hosts == ("*",) else f"{models} @ {','.join(self.hosts)}"

    @property
    def max_attempts(self) -> int:
        return self.attempts if self.attempts is not None else len(self.endpoints)


@dataclass(frozen=True, slots=True)
class RoutingSettings:
    """``[routing]``: health, waiting, timeouts and affinity shared by every route."""

    cooldown: float = 5.0
    """Seconds a failing endpoint rests (a 429 rests for what the upstream asked)."""
    failure_threshold: int = 1
    """Failures in a row that start a cooldown."""
    max_retry_after: float = 300.0
    """Upper bound of a cooldown or wait taken from an upstream's Retry-After."""
    connect_timeout: float = 10.0
    first_byte_timeout: float = 120.0
    """Seconds an attempt waits for the upstream's first byte before trying elsewhere."""
    stream_idle_timeout: float = 240.0
    """Seconds a streamed answer may go without a byte from the upstream once it started;
    then llmitm ends the client's stream with an error in its protocol. Below Codex's own
    stream idle limit (300 s) and the openai SDKs' read timeout (600 s), so the client hears
    llmitm's error instead of timing out on its own."""
    timeout: float = 300.0
    """The budget: seconds after a request's arrival past which no new attempt starts."""
    backoff: float = 0.5
    """The first retry's pause on an endpoint already tried (doubles, with jitter)."""
    backoff_max: float = 8.0
    queue_size: int = 100
    """Requests that may wait for a slot when every endpoint is at its cap."""
    queue_timeout: float = 30.0
    """Seconds a request waits for a slot before it gets a 429."""
    queue_retry_after: float = 1.0
    """The ``Retry-After`` of that 429."""
    affinity_ttl: float = 300.0
    """Seconds a conversation stays pinned to its endpoint after its last turn."""
    fleet_lease: float = 10.0
    """With a shared store (a fleet): seconds a proxy that stopped heartbeating (killed, cut
    off) still counts as alive; then its concurrency slots are free for the others. It
    heartbeats every third of it."""
    fleet_timeout: float = 0.5
    """With a shared store: seconds any one call to the shared routing state may take before
    the proxy decides alone (per process) instead."""


@dataclass(frozen=True, slots=True)
class Settings:
    reasoning: ReasoningMode = "think-tags"
    strict: bool = False
    drop_unsupported: bool = False
    store: str | None = None
    """The store: a SQLite file (``~`` expanded, relative to the file's folder) or a
    PostgreSQL URL (``postgresql://user@host:port/db``, kept as written, never with a
    password); ``""`` disables it; ``None``: the option or the default location decides."""
    egress: EgressPolicy = "pass"
    """Requests that are not routed LLM calls: ``pass`` or ``local`` (routing.egress)."""
    responses_scope: ResponsesScope = "credential"
    """Whose stored Responses state a client reads: its own credential's, or everyone's
    (``shared``, a single-tenant proxy) — :mod:`llmitm.responses_api.scope`."""
    allowed_origins: tuple[str, ...] = ()
    """Browser origins (globs) whose requests are served (routing.access)."""
    unmatched: UnmatchedPolicy = "pass"
    """A create call no route takes: ``pass`` (to the host it names) or ``reject`` (a 404
    in OpenAI's shape naming the routes' models)."""
    models: ModelsSource = "config"
    """Who answers ``GET /v1/models`` when there are routes: llmitm from the configuration
    (routing.models), or the upstream the call names."""


@dataclass(frozen=True, slots=True)
class Config:
    source: str = "<embedded defaults>"
    settings: Settings = Settings()
    endpoints: Mapping[str, Endpoint] = field(default_factory=dict)
    routes: tuple[Route, ...] = ()
    routing: RoutingSettings = RoutingSettings()
    access: Access = field(default_factory=Access)


def default_config() -> Config:
    """No file: nothing is routed, OpenAI and Azure traffic passes through unchanged."""
    return Config()


def stream_idle_limit(config: Config, route: Route) -> float:
    """Seconds a started stream on ``route`` may go without an upstream byte."""
    if route.stream_idle_timeout is not None:
        return route.stream_idle_timeout
    return config.routing.stream_idle_timeout


def with_stream_idle_timeout(config: Config, seconds: float) -> Config:
    """``config`` under the ``llmitm_stream_idle_timeout`` option: ``0`` leaves it as it is,
    a positive number becomes every route's idle limit, a negative one lifts the limit
    (``math.inf``: streams may stay silent for as long as the connection lives)."""
    if seconds == 0:
        return config
    limit = math.inf if seconds < 0 else seconds
    routes = tuple(replace(route, stream_idle_timeout=None) for route in config.routes)
    routing = replace(config.routing, stream_idle_timeout=limit)
    return replace(config, routes=routes, routing=routing)


def load_config(path: str | Path, environ: Mapping[str, str] | None = None) -> Config:
    """Read and validate ``path``; credentials are looked up in ``environ`` (the process
    environment by default)."""
    source = str(path)
    try:
        raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{source}: the configuration file does not exist") from None
    except OSError as exc:
        raise ConfigError(
            f"{source}: cannot read the configuration file ({exc.strerror})"
        ) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{source}: not valid TOML ({exc})") from None
    return parse_config(raw, source, os.environ if environ is None else environ)


def parse_config(raw: Mapping[str, Any], source: str, environ: Mapping[str, str]) -> Config:
    reader = _Reader(source)
    reader.only_keys(raw, "", {"llmitm", "endpoints", "routes", "routing", "client_keys"})
    settings = _settings(reader, reader.table(raw, "llmitm"), Path(source).parent)
    routing = _routing(reader, reader.table(raw, "routing"))
    endpoints_raw = reader.table(raw, "endpoints")
    endpoints = {
        name: _endpoint(
            reader, name, reader.table(endpoints_raw, name, prefix="endpoints."), environ
        )
        for name in endpoints_raw
    }
    routes_raw = raw.get("routes", [])
    if not isinstance(routes_raw, list):
        reader.fail("routes", "an array of tables ([[routes]])", routes_raw)
    routes = tuple(
        _route(reader, f"routes[{index}]", entry, endpoints)
        for index, entry in enumerate(routes_raw)
    )
    keys_raw = reader.table(raw, "client_keys")
    route_names = {route.name for route in routes}
    client_keys = tuple(
        _client_key(
            reader, name, reader.table(keys_raw, name, prefix="client_keys."), route_names, environ
        )
        for name in keys_raw
    )
    access = Access(allowed_origins=settings.allowed_origins, client_keys=client_keys)
    return Config(
        source=source,
        settings=settings,
        endpoints=endpoints,
        routes=routes,
        routing=routing,
        access=access,
    )


class _Reader:
    """Typed reads with errors that name the file and the key."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, key: str, expected: str, got: Any) -> None:
        raise ConfigError(f"{self.source}: {key}: expected {expected}, got {got!r}")

    def only_keys(self, table: Mapping[str, Any], prefix: str, allowed: set[str]) -> None:
        for key in table:
            if key not in allowed:
                names = ", ".join(sorted(allowed))
                raise ConfigError(f"{self.source}: {prefix}{key}: unknown key (known: {names})")

    def table(self, raw: Mapping[str, Any], key: str, prefix: str = "") -> Mapping[str, Any]:
        value = raw.get(key, {})
        if not isinstance(value, dict):
            self.fail(prefix + key, "a table", value)
        return value

    def string(self, raw: Mapping[str, Any], key: str, where: str, default: Any = None) -> Any:
        value = raw.get(key, default)
        if value is not default and not (isinstance(value, str) and value):
            self.fail(f"{where}.{key}", "a non-empty string", value)
        return value

    def boolean(self, raw: Mapping[str, Any], key: str, where: str, default: bool) -> bool:
        value = raw.get(key, default)
        if not isinstance(value, bool):
            self.fail(f"{where}.{key}", "true or false", value)
        return value

    def strings(
        self,
        raw: Mapping[str, Any],
        key: str,
        where: str,
        default: tuple[str, ...],
        *,
        non_empty: bool = False,
    ) -> tuple[str, ...]:
        value = raw.get(key, default)
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) and v for v in value):
            self.fail(f"{where}.{key}", "a string or an array of strings", value)
        if non_empty and not value:
            # An empty list would make a route that silently never matches.
            self.fail(f"{where}.{key}", "at least one glob (leave the key out for all)", value)
        return tuple(value)

    def number(
        self,
        raw: Mapping[str, Any],
        key: str,
        where: str,
        default: Any,
        *,
        minimum: float = 0.0,
        positive: bool = False,
    ) -> Any:
        """A number (int or float) >= ``minimum`` (> 0 when ``positive``)."""
        value = raw.get(key, default)
        if value is default:
            return value
        bad = isinstance(value, bool) or not isinstance(value, int | float)
        if bad or not math.isfinite(value) or value < minimum or (positive and value <= 0):
            self.fail(
                f"{where}.{key}", "a number > 0" if positive else f"a number >= {minimum:g}", value
            )
        return float(value)

    def integer(
        self, raw: Mapping[str, Any], key: str, where: str, default: Any, *, minimum: int = 1
    ) -> Any:
        value = raw.get(key, default)
        if value is default:
            return value
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            self.fail(f"{where}.{key}", f"an integer >= {minimum}", value)
        return value

    def choice(self, value: Any, key: str, choices: tuple[str, ...]) -> Any:
        if value not in choices:
            self.fail(key, "one of " + ", ".join(choices), value)
        return value

    def string_map(self, raw: Mapping[str, Any], key: str, where: str) -> dict[str, str]:
        value = raw.get(key, {})
        if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            self.fail(f"{where}.{key}", "a table of strings", value)
        return dict(value)


def _is_database_url(value: str) -> bool:
    """A PostgreSQL URL rather than a file path: resolved by the store, not against the
    file's folder (store.open tells the backends apart the same way)."""
    return "://" in value and urlsplit(value).scheme in ("postgresql", "postgres")


def _refuse_password(reader: _Reader, url: str) -> None:
    """A configuration file is read by more people than its database's password should be:
    the password comes from the environment. The error never repeats the URL."""
    parts = urlsplit(url)
    in_query = any(p.lower().startswith("password=") for p in parts.query.split("&"))
    if parts.password is not None or in_query:
        raise ConfigError(
            f"{reader.source}: llmitm.store: the URL holds a password; remove it and set the "
            "PGPASSWORD environment variable instead"
        )


def _settings(reader: _Reader, raw: Mapping[str, Any], folder: Path) -> Settings:
    reader.only_keys(
        raw,
        "llmitm.",
        {
            "reasoning",
            "strict",
            "drop_unsupported",
            "store",
            "egress",
            "responses_scope",
            "allowed_origins",
            "unmatched",
            "models",
        },
    )
    store = raw.get("store")
    if store is not None:
        if not isinstance(store, str):
            reader.fail(
                "llmitm.store", 'a file path, a postgresql:// URL, or "" to keep no store', store
            )
        if _is_database_url(store):
            _refuse_password(reader, store)
        elif store:
            store = str(folder / Path(store).expanduser())  # an absolute path stays itself
    reasoning = reader.choice(
        raw.get("reasoning", "think-tags"), "llmitm.reasoning", REASONING_MODES
    )
    return Settings(
        reasoning=reasoning,
        strict=reader.boolean(raw, "strict", "llmitm", False),
        drop_unsupported=reader.boolean(raw, "drop_unsupported", "llmitm", False),
        store=store,
        egress=reader.choice(raw.get("egress", "pass"), "llmitm.egress", EGRESS_POLICIES),
        responses_scope=reader.choice(
            raw.get("responses_scope", "credential"), "llmitm.responses_scope", RESPONSES_SCOPES
        ),
        allowed_origins=reader.strings(raw, "allowed_origins", "llmitm", ()),
        unmatched=reader.choice(
            raw.get("unmatched", "pass"), "llmitm.unmatched", UNMATCHED_POLICIES
        ),
        models=reader.choice(raw.get("models", "config"), "llmitm.models", MODELS_SOURCES),
    )


_ENDPOINT_KEYS = {
    "kind",
    "base_url",
    "apis",
    "api_key_env",
    "auth_header",
    "api_version",
    "deployments",
    "non_conformant",
    "conformant",
    "think_open_missing",
    "reasoning_passthrough",
    "reasoning_summary",
    "headers",
    "weight",
    "max_concurrency",
    "max_concurrency_per_model",
    "stream_usage",
    "state",
}
_DEFAULT_APIS: dict[str, tuple[str, ...]] = {
    "openai": API_NAMES,
    "azure": API_NAMES,
    "compatible": ("chat",),
}


def _azure_resource_root(
    reader: _Reader, where: str, base_url: str, api_version: str | None
) -> str:
    """Azure's resource URL, as llmitm builds both API forms from it. A base URL copied from
    Azure's v1 docs (``…/openai/v1``) means the v1 form; its path is dropped, not doubled."""
    lowered = base_url.lower()
    if lowered.endswith("/openai/v1"):
        if api_version is not None:
            reader.fail(
                where,
                "the resource URL (https://NAME.openai.azure.com) with api_version, "
                "or …/openai/v1 without it",
                base_url,
            )
        return base_url[: -len("/openai/v1")]
    if lowered.endswith("/openai"):
        return base_url[: -len("/openai")]
    return base_url


def _endpoint(
    reader: _Reader, name: str, raw: Mapping[str, Any], environ: Mapping[str, str]
) -> Endpoint:
    where = f"endpoints.{name}"
    reader.only_keys(raw, where + ".", _ENDPOINT_KEYS)
    kind = reader.choice(raw.get("kind"), f"{where}.kind", ENDPOINT_KINDS)
    base_url = reader.string(raw, "base_url", where)
    if base_url is None:
        reader.fail(f"{where}.base_url", "the endpoint's URL (http:// or https://)", None)
    if not base_url.startswith(("http://", "https://")):
        reader.fail(f"{where}.base_url", "a URL starting with http:// or https://", base_url)
    try:
        host = urlsplit(base_url).hostname
    except ValueError:  # "http://[::1" and the like
        host = None
    if not host:
        reader.fail(f"{where}.base_url", "a URL with a host", base_url)
    apis = reader.strings(raw, "apis", where, _DEFAULT_APIS[kind])
    if not apis:
        # An endpoint that speaks nothing would be sent the other API's translation.
        reader.fail(f"{where}.apis", "at least one of " + ", ".join(API_NAMES), apis)
    for api in apis:
        reader.choice(api, f"{where}.apis", API_NAMES)
    non_conformant = reader.strings(raw, "non_conformant", where, ())
    for api in non_conformant:
        reader.choice(api, f"{where}.non_conformant", API_NAMES)
    conformant = reader.strings(raw, "conformant", where, ())
    for api in conformant:
        reader.choice(api, f"{where}.conformant", API_NAMES)
        if api in non_conformant:
            reader.fail(
                f"{where}.conformant",
                f"APIs not also listed in non_conformant ({api!r} is in both)",
                conformant,
            )
    api_key_env = reader.string(raw, "api_key_env", where)
    api_key = None
    if api_key_env is not None:
        api_key = environ.get(api_key_env)
        if not api_key:
            raise ConfigError(
                f"{reader.source}: {where}.api_key_env: the environment variable "
                f"{api_key_env} is not set (it must hold the endpoint's key)"
            )
    default_header = "api-key" if kind == "azure" else "authorization"
    api_version = reader.string(raw, "api_version", where)
    deployments = reader.string_map(raw, "deployments", where)
    if kind != "azure" and (api_version or deployments):
        reader.fail(
            f"{where}.kind", '"azure" (api_version and deployments are Azure settings)', kind
        )
    base_url = base_url.rstrip("/")
    if kind == "azure":
        base_url = _azure_resource_root(reader, f"{where}.base_url", base_url, api_version)
    return Endpoint(
        name=name,
        kind=kind,
        base_url=base_url,
        apis=frozenset(apis),  # type: ignore[arg-type]
        api_key_env=api_key_env,
        api_key=api_key,
        auth_header=reader.string(raw, "auth_header", where, default_header).lower(),
        api_version=api_version,
        deployments=deployments,
        non_conformant=frozenset(non_conformant),  # type: ignore[arg-type]
        conformant=frozenset(conformant),  # type: ignore[arg-type]
        think_open_missing=reader.boolean(raw, "think_open_missing", where, False),
        reasoning_passthrough=_reasoning_passthrough(reader, raw, where),
        reasoning_summary=reader.boolean(raw, "reasoning_summary", where, False),
        headers=reader.string_map(raw, "headers", where),
        weight=reader.number(raw, "weight", where, 1.0),
        max_concurrency=reader.integer(raw, "max_concurrency", where, None),
        max_concurrency_per_model=_caps(reader, raw, where),
        stream_usage=reader.boolean(raw, "stream_usage", where, True),
        state=reader.choice(raw.get("state", "auto"), f"{where}.state", STATE_MODES),
    )


def _reasoning_passthrough(
    reader: _Reader, raw: Mapping[str, Any], where: str
) -> ReasoningMode | None:
    value = raw.get("reasoning_passthrough")
    if value is None:
        return None
    return reader.choice(value, f"{where}.reasoning_passthrough", REASONING_MODES)


def _caps(reader: _Reader, raw: Mapping[str, Any], where: str) -> dict[str, int]:
    value = raw.get("max_concurrency_per_model", {})
    if not isinstance(value, dict):
        reader.fail(f"{where}.max_concurrency_per_model", "a table of model = cap", value)
    for model in value:
        reader.integer(value, model, f"{where}.max_concurrency_per_model", None)
    return dict(value)


def _route(reader: _Reader, where: str, raw: Any, endpoints: Mapping[str, Endpoint]) -> Route:
    if not isinstance(raw, dict):
        reader.fail(where, "a table", raw)
    reader.only_keys(raw, where + ".", _ROUTE_KEYS)
    names = reader.strings(raw, "endpoints", where, ())
    if not names:
        reader.fail(f"{where}.endpoints", "at least one endpoint name", raw.get("endpoints"))
    for name in names:
        if name not in endpoints:
            known = ", ".join(sorted(endpoints)) or "none defined"
            reader.fail(f"{where}.endpoints", f"a defined endpoint ({known})", name)
    return Route(
        models=reader.strings(raw, "models", where, ("*",), non_empty=True),
        hosts=reader.strings(raw, "hosts", where, ("*",), non_empty=True),
        endpoints=names,
        model=reader.string(raw, "model", where),
        name=reader.string(raw, "name", where, where),
        strategy=reader.choice(raw.get("strategy", "failover"), f"{where}.strategy", STRATEGIES),
        attempts=reader.integer(raw, "attempts", where, None),
        timeout=reader.number(raw, "timeout", where, None, positive=True),
        first_byte_timeout=reader.number(raw, "first_byte_timeout", where, None, positive=True),
        stream_idle_timeout=reader.number(raw, "stream_idle_timeout", where, None, positive=True),
        affinity=reader.boolean(raw, "affinity", where, True),
        named="name" in raw,
        cache=_cache(reader, f"{where}.cache", raw.get("cache")),
    )


_CACHE_KEYS = {"ttl", "max_entries", "scope"}


def _cache(reader: _Reader, where: str, raw: Any) -> CacheSettings | None:
    """A route's ``cache``: a table, or ``true`` for the defaults, ``false`` for none."""
    if raw is None or raw is False:
        return None
    if raw is True:
        return CacheSettings()
    if not isinstance(raw, dict):
        reader.fail(where, 'a table such as { ttl = "1h", max_entries = 1000 }, or true', raw)
    reader.only_keys(raw, where + ".", _CACHE_KEYS)
    defaults = CacheSettings()
    ttl = defaults.ttl
    if "ttl" in raw:
        try:
            ttl = parse_duration(raw["ttl"])
        except ValueError:
            reader.fail(
                f"{where}.ttl", 'a duration such as "1h", "30m", "45s" or seconds', raw["ttl"]
            )
    return CacheSettings(
        ttl=ttl,
        max_entries=reader.integer(raw, "max_entries", where, defaults.max_entries),
        scope=reader.choice(raw.get("scope", defaults.scope), f"{where}.scope", CACHE_SCOPES),
    )


def _client_key(
    reader: _Reader,
    name: str,
    raw: Mapping[str, Any],
    route_names: set[str],
    environ: Mapping[str, str],
) -> ClientKey:
    where = f"client_keys.{name}"
    reader.only_keys(raw, where + ".", {"key_env", "routes"})
    key_env = reader.string(raw, "key_env", where)
    if key_env is None:
        reader.fail(f"{where}.key_env", "the environment variable that holds the key", None)
    key = environ.get(key_env, "")
    if not key:
        raise ConfigError(
            f"{reader.source}: {where}.key_env: the environment variable {key_env} is not set "
            "(it must hold the client key)"
        )
    routes = None
    if "routes" in raw:
        routes = reader.strings(raw, "routes", where, ())
        for route in routes:
            if route not in route_names:
                known = ", ".join(sorted(route_names)) or "none defined"
                reader.fail(f"{where}.routes", f"a route name ({known})", route)
    return ClientKey(name=name, key_env=key_env, key=key, routes=routes)


_ROUTE_KEYS = {
    "models",
    "hosts",
    "endpoints",
    "model",
    "name",
    "strategy",
    "attempts",
    "timeout",
    "first_byte_timeout",
    "stream_idle_timeout",
    "affinity",
    "cache",
}
_POSITIVE = {
    "connect_timeout",
    "first_byte_timeout",
    "stream_idle_timeout",
    "timeout",
    "affinity_ttl",
    "fleet_lease",
    "fleet_timeout",
}
_INTEGERS = {"failure_threshold": 1, "queue_size": 0}


def _routing(reader: _Reader, raw: Mapping[str, Any]) -> RoutingSettings:
    """``[routing]``: every key a number of seconds except the two counts."""
    defaults = RoutingSettings()
    keys = set(RoutingSettings.__dataclass_fields__)
    reader.only_keys(raw, "routing.", keys)
    values: dict[str, Any] = {}
    for key in keys:
        default = getattr(defaults, key)
        if key in _INTEGERS:
            values[key] = reader.integer(raw, key, "routing", default, minimum=_INTEGERS[key])
        else:
            values[key] = reader.number(raw, key, "routing", default, positive=key in _POSITIVE)
    return RoutingSettings(**values)
