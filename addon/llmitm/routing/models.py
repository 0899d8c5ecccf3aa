"""The models a configuration serves, and the answers to the model-list calls about them.

``GET /v1/models`` (and ``/v1/models/{id}``, Azure's ``/openai/models`` and
``/openai/deployments``) is answered from the configuration when it has routes: a client that
asks which models it may use hears the names llmitm would route, not the upstream's list
(which may be another vendor's, or unreachable offline).

A name is listed when a route would take it, for the host the list was asked of: every route
pattern that is an exact name (no glob character), every alias a route sends upstream, and
every model an Azure endpoint maps to a deployment. A glob (``gpt-*``) lists nothing itself:
there is no finite set to show. The same module words the 404 a model no route takes gets
when the configuration says ``unmatched = "reject"``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any, Literal
from urllib.parse import unquote

from llmitm.routing.config import Config, Route
from llmitm.routing.plan import match_route
from llmitm.wire.errors import ApiError

ModelsForm = Literal["openai", "azure-models", "azure-deployments"]

_GLOB = re.compile(r"[*?\[]")
# The mount points a model list is answered under: OpenAI's /v1, Azure's /openai and
# /openai/v1, a bare /models, and a gateway's prefix ending in /v1 (/api/v1/models).
_MODELS = re.compile(r"^(?P<prefix>(?:.*/v1|/openai(?:/v1)?)?)/models(?:/(?P<id>[^?]+))?/?$")
_DEPLOYMENTS = re.compile(r"^(?:.*)?/openai/deployments(?:/(?P<id>[^/?]+))?/?$")


@dataclass(frozen=True, slots=True)
class ModelsCall:
    """A model-list call: the list (``model`` is ``None``) or one model, in one API's form."""

    form: ModelsForm
    model: str | None = None


@dataclass(frozen=True, slots=True)
class ServedModel:
    """A model name a client may send, and where the configuration sends it."""

    id: str
    route: str
    endpoints: tuple[str, ...]
    upstream_model: str
    """The name the route sends upstream (the alias, or the client's name)."""
    deployment: str | None = None
    """The Azure deployment that serves it, when the route's first endpoint is Azure."""


def models_call(path: str) -> ModelsCall | None:
    """The model-list call ``path`` (with its query) makes, or ``None``."""
    route = path.partition("?")[0]
    match = _DEPLOYMENTS.match(route)
    if match:
        model = match["id"]
        return ModelsCall("azure-deployments", unquote(model) if model else None)
    match = _MODELS.match(route)
    if match is None:
        return None
    model = match["id"]
    form: ModelsForm = "azure-models" if match["prefix"] == "/openai" else "openai"
    return ModelsCall(form, unquote(model).rstrip("/") if model else None)


def serves_host(config: Config, host: str) -> bool:
    """Whether any route takes calls sent to ``host`` (else its model list is not ours)."""
    return any(fnmatchcase(host, glob) for route in config.routes for glob in route.hosts)


def served_models(config: Config, host: str) -> list[ServedModel]:
    """Every model name a route of ``config`` takes from ``host``, once, in config order."""
    # The names clients are told to send first, then the upstream names routes send, then
    # the models an Azure endpoint maps (listed when the route taking them goes there).
    names = [g for route in config.routes for g in route.models if not _GLOB.search(g)]
    names += [route.model for route in config.routes if route.model]
    candidates: list[tuple[str, str | None]] = [(name, None) for name in names]
    for endpoint in config.endpoints.values():
        candidates += [(model, endpoint.name) for model in endpoint.deployments]
    served: dict[str, ServedModel] = {}
    for name, via in candidates:
        if name in served:
            continue
        route = match_route(config, name, host)
        if route is not None and (via is None or via in route.endpoints):
            served[name] = _served(config, route, name)
    return list(served.values())


def _served(config: Config, route: Route, name: str) -> ServedModel:
    upstream = route.model or name
    first = config.endpoints[route.endpoints[0]]
    deployment = first.deployment_for(upstream) if first.kind == "azure" else None
    return ServedModel(name, route.name, route.endpoints, upstream, deployment)


def model_object(model: ServedModel, created: int) -> dict[str, Any]:
    """One entry of OpenAI's model list; ``llmitm`` says where the route sends it."""
    return {
        "id": model.id,
        "object": "model",
        "created": created,
        "owned_by": model.endpoints[0],
        "llmitm": {
            "route": model.route,
            "endpoints": list(model.endpoints),
            "upstream_model": model.upstream_model,
        },
    }


def deployment_object(model: ServedModel, created: int) -> dict[str, Any]:
    """One entry of Azure's classic deployments list."""
    return {
        "id": model.deployment or model.id,
        "model": model.id,
        "object": "deployment",
        "owner": "organization-owner",
        "status": "succeeded",
        "created_at": created,
        "updated_at": created,
    }


def list_body(call: ModelsCall, models: list[ServedModel], created: int) -> dict[str, Any]:
    """The list answer of ``call``'s form."""
    make = deployment_object if call.form == "azure-deployments" else model_object
    return {"object": "list", "data": [make(model, created) for model in models]}


def find_model(call: ModelsCall, models: list[ServedModel]) -> ServedModel | None:
    """The model ``call`` asks about (a deployments call may name the deployment)."""
    for model in models:
        if call.model == model.id or (
            call.form == "azure-deployments" and call.model == model.deployment
        ):
            return model
    return None


def one_body(call: ModelsCall, model: ServedModel, created: int) -> dict[str, Any]:
    if call.form == "azure-deployments":
        return deployment_object(model, created)
    return model_object(model, created)


def route_patterns(config: Config) -> str:
    """The routes' model patterns, for an error message (``gpt-4o, local-*``)."""
    seen: dict[str, None] = {}
    for route in config.routes:
        for glob in route.models:
            seen.setdefault(glob, None)
    return ", ".join(seen) or "none"


def unknown_model(config: Config, model: str) -> ApiError:
    """The 404 of a model-list call about a model no route serves."""
    return ApiError(
        message=f"The model '{model}' does not exist here: llmitm's routes serve "
        f"{route_patterns(config)}.",
        type="invalid_request_error",
        code="model_not_found",
        status=404,
        param="model",
    )


def unmatched_error(config: Config, model: str, host: str) -> ApiError:
    """The 404 a create call gets under ``unmatched = "reject"`` when no route takes it."""
    return ApiError(
        message=f"No route of llmitm's configuration takes the model '{model}' on {host} "
        f"(route models: {route_patterns(config)}); it is not forwarded "
        '(unmatched = "reject").',
        type="invalid_request_error",
        code="model_not_found",
        status=404,
        param="model",
    )
