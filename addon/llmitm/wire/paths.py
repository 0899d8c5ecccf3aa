"""Which API a request path speaks, and the path the same call takes on another API.

OpenAI (``/v1/chat/completions``, ``/v1/responses``), Azure classic
(``/openai/deployments/{d}/chat/completions?api-version=…``, ``/openai/responses?api-version=…``)
and Azure v1 (``/openai/v1/…``). Anything else is not ours and passes through untouched.
openai-python's ``AzureOpenAI`` only inserts ``/deployments/{model}`` for chat (not for
Responses), where the model in the body is the deployment name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal
from urllib.parse import parse_qs, urlencode

ApiName = Literal["chat", "responses"]
PathForm = Literal["openai", "azure-classic", "azure-v1"]

# Azure's Responses API needs an api-version of at least this date; chat clients often pin an
# older one that only knows chat completions.
AZURE_RESPONSES_MIN_VERSION = "2025-03-01-preview"
AZURE_RESPONSES_DEFAULT_VERSION = "2025-04-01-preview"

_AZURE_CLASSIC_CHAT = re.compile(
    r"^(?P<prefix>.*?)/openai/deployments/(?P<dep>[^/]+)/chat/completions/?$"
)
_AZURE_CLASSIC_RESPONSES = re.compile(r"^(?P<prefix>.*?)/openai/responses/?$")
_AZURE_V1 = re.compile(r"^(?P<prefix>.*?)/openai/v1/(?P<rest>chat/completions|responses)/?$")
_OPENAI = re.compile(r"^(?P<prefix>.*?)/(?P<rest>chat/completions|responses)/?$")
# Calls on one stored object: Responses state calls (``{id}``, ``{id}/input_items``,
# ``{id}/cancel``) and the Responses helpers ``compact`` and ``input_tokens``, which take
# the same place as an id; stored chat completions (``{id}``, ``{id}/messages``).
_OBJECT_CALL = re.compile(
    r"/(?:responses/[A-Za-z0-9_\-.]+(?:/input_items|/cancel)?"
    r"|chat/completions/[A-Za-z0-9_\-.]+(?:/messages)?"
    r"|conversations(?:/[A-Za-z0-9_\-.]+(?:/items(?:/[A-Za-z0-9_\-.]+)?)?)?)/?$"
)


@dataclass(frozen=True, slots=True)
class ClassifiedPath:
    """A create call of one of the two APIs."""

    api: ApiName
    form: PathForm
    prefix: str
    """Everything before the API part (``/v1``, a gateway's mount point, …)."""
    deployment: str | None = None
    api_version: str | None = None


def classify_path(path: str) -> ClassifiedPath | None:
    """The API of a ``POST`` path with its query, or ``None`` when it is not a create call."""
    route, _, query = path.partition("?")
    api_version = _api_version(query)
    match = _AZURE_CLASSIC_CHAT.match(route)
    if match:
        return ClassifiedPath("chat", "azure-classic", match["prefix"], match["dep"], api_version)
    match = _AZURE_V1.match(route)
    if match:
        return ClassifiedPath(_api(match["rest"]), "azure-v1", match["prefix"], None, api_version)
    match = _AZURE_CLASSIC_RESPONSES.match(route)
    if match:
        return ClassifiedPath("responses", "azure-classic", match["prefix"], None, api_version)
    match = _OPENAI.match(route)
    if match:
        return ClassifiedPath(_api(match["rest"]), "openai", match["prefix"], None, api_version)
    return None


def is_llm_call(path: str) -> bool:
    """Whether ``path`` (with its query) is a call of the chat or Responses API, in any
    method: a create call (also the WebSocket transport's ``GET``), a state call on a stored
    response or chat completion, a Conversations call, ``compact`` or ``input_tokens``.
    Telemetry, trace uploads and everything else an app sends through the proxy are not."""
    route = path.partition("?")[0]
    return classify_path(route) is not None or _OBJECT_CALL.search(route) is not None


def translated_path(classified: ClassifiedPath, to: ApiName) -> tuple[str, str | None]:
    """The path for the same call on API ``to`` (with its query), and the model the body must
    name — Azure classic chat carries the deployment in the path, Responses in the body."""
    if classified.api == to:
        raise ValueError("the path already speaks that API")
    prefix = classified.prefix
    if classified.form == "azure-v1":
        query = f"?api-version={classified.api_version}" if classified.api_version else ""
        return f"{prefix}/openai/v1/{_rest(to)}{query}", None
    if classified.form == "azure-classic":
        if to == "responses":
            version = classified.api_version or AZURE_RESPONSES_DEFAULT_VERSION
            if version < AZURE_RESPONSES_MIN_VERSION:
                version = AZURE_RESPONSES_DEFAULT_VERSION
            return f"{prefix}/openai/responses?{urlencode({'api-version': version})}", (
                classified.deployment
            )
        raise ValueError(
            "an Azure classic chat path needs a deployment name: route the request to an "
            "endpoint whose configuration maps the model to a deployment"
        )
    return f"{prefix}/{_rest(to)}", None


def _api(rest: str) -> ApiName:
    return "chat" if rest.startswith("chat") else "responses"


def _rest(api: ApiName) -> str:
    return "chat/completions" if api == "chat" else "responses"


def _api_version(query: str) -> str | None:
    values = parse_qs(query).get("api-version")
    return values[0] if values else None
