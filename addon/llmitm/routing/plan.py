"""The plan for one request: which endpoint serves it, at which URL, with which credentials,
and which translation its body and response need.

Pure decisions over the configuration and the request's classification; the proxy carries
them out. A request no route matches gets no plan and passes through untouched.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from fnmatch import fnmatchcase
from urllib.parse import urlencode

from llmitm.routing.config import Config, Endpoint, Route
from llmitm.wire.modes import Direction
from llmitm.wire.paths import AZURE_RESPONSES_DEFAULT_VERSION, AZURE_RESPONSES_MIN_VERSION, ApiName

CREDENTIAL_HEADERS = (
    "authorization",
    "api-key",
    "x-api-key",
    "x-goog-api-key",
    "anthropic-api-key",
)
"""Every header a client may carry its key in: all of them go when an endpoint key is
injected, so no client credential reaches an upstream that was not meant to see it."""


@dataclass(frozen=True, slots=True)
class Plan:
    """Where and how one create call goes upstream."""

    client_api: ApiName
    upstream_api: ApiName
    endpoint: Endpoint
    url: str
    upstream_model: str
    set_headers: dict[str, str] = field(default_factory=dict, repr=False)
    remove_headers: tuple[str, ...] = ()
    route: str = ""
    """The route that chose this plan, as usage accounting names it (``Route.label``)."""

    @property
    def translates(self) -> bool:
        return self.client_api != self.upstream_api

    @property
    def stream_direction(self) -> Direction | None:
        """How the upstream's SSE reaches the client (``None``: byte for byte)."""
        if self.client_api == "chat" and self.upstream_api == "responses":
            return "responses-to-chat"
        if self.client_api == "responses" and self.upstream_api == "chat":
            return "chat-to-responses"
        if not self.endpoint.normalises(self.upstream_api):
            return None
        return "normalise-responses" if self.upstream_api == "responses" else "normalise-chat"

    @property
    def label(self) -> str:
        """``chat→responses`` style, for logs and response headers."""
        return f"{self.client_api}→{self.upstream_api}"


def match_route(config: Config, model: str, host: str) -> Route | None:
    """The first route whose model and host globs both match."""
    for route in config.routes:
        if any(fnmatchcase(model, glob) for glob in route.models) and any(
            fnmatchcase(host, glob) for glob in route.hosts
        ):
            return route
    return None


def plan_request(config: Config, client_api: ApiName, model: str, host: str) -> Plan | None:
    """The plan for a create call of ``client_api`` naming ``model``, sent to ``host``."""
    route = match_route(config, model, host)
    if route is None:
        return None
    endpoint = config.endpoints[route.endpoints[0]]
    return replace(plan_for_endpoint(endpoint, client_api, route.model or model), route=route.label)


def plan_for_endpoint(endpoint: Endpoint, client_api: ApiName, model: str) -> Plan:
    upstream_api: ApiName = client_api
    if client_api not in endpoint.apis:
        upstream_api = "responses" if client_api == "chat" else "chat"
    upstream_model = endpoint.deployment_for(model) if endpoint.kind == "azure" else model
    set_headers = dict(endpoint.headers)
    remove_headers: tuple[str, ...] = ()
    if endpoint.api_key:
        # The endpoint's own credential replaces whatever the client sent.
        remove_headers = CREDENTIAL_HEADERS
        value = (
            f"Bearer {endpoint.api_key}"
            if endpoint.auth_header == "authorization"
            else endpoint.api_key
        )
        set_headers[endpoint.auth_header] = value
    return Plan(
        client_api=client_api,
        upstream_api=upstream_api,
        endpoint=endpoint,
        url=endpoint_url(endpoint, upstream_api, upstream_model),
        upstream_model=upstream_model,
        set_headers=set_headers,
        remove_headers=remove_headers,
    )


def endpoint_url(endpoint: Endpoint, api: ApiName, upstream_model: str) -> str:
    """The create URL of ``api`` on ``endpoint`` (Azure: classic or v1 form)."""
    rest = "chat/completions" if api == "chat" else "responses"
    base = endpoint.base_url
    if endpoint.kind != "azure":
        return f"{base}/{rest}"
    if not endpoint.azure_classic:
        return f"{base}/openai/v1/{rest}"
    version = endpoint.api_version or AZURE_RESPONSES_DEFAULT_VERSION
    if api == "chat":
        query = urlencode({"api-version": version})
        return f"{base}/openai/deployments/{upstream_model}/chat/completions?{query}"
    if version < AZURE_RESPONSES_MIN_VERSION:
        version = AZURE_RESPONSES_DEFAULT_VERSION
    return f"{base}/openai/responses?{urlencode({'api-version': version})}"
