"""State calls on a stored response, in OpenAI's and Azure's path forms:

- ``GET    …/responses/{id}`` (query ``stream``, ``starting_after``, ``include[]``)
- ``DELETE …/responses/{id}``
- ``GET    …/responses/{id}/input_items`` (``limit``, ``order``, ``after``, ``include[]``)
- ``POST   …/responses/{id}/cancel``

with ``…`` = ``/v1`` (or any mount point), Azure classic ``/openai`` (``?api-version=…``) or
Azure v1 ``/openai/v1``. Create calls are :func:`llmitm.wire.paths.classify_path`'s.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import parse_qsl, urlencode

from llmitm.routing.config import Endpoint
from llmitm.wire.paths import AZURE_RESPONSES_DEFAULT_VERSION, AZURE_RESPONSES_MIN_VERSION, PathForm

Action = Literal["retrieve", "delete", "input_items", "cancel"]

_ID = r"(?P<id>[A-Za-z0-9_\-.]+)"
_REST = r"(?P<rest>/input_items|/cancel)?/?$"
_AZURE_V1 = re.compile(rf"^(?P<prefix>.*?)/openai/v1/responses/{_ID}{_REST}")
_AZURE_CLASSIC = re.compile(rf"^(?P<prefix>.*?)/openai/responses/{_ID}{_REST}")
_OPENAI = re.compile(rf"^(?P<prefix>.*?)/responses/{_ID}{_REST}")

_ACTIONS: dict[tuple[str, str | None], Action] = {
    ("GET", None): "retrieve",
    ("DELETE", None): "delete",
    ("GET", "/input_items"): "input_items",
    ("POST", "/cancel"): "cancel",
}


@dataclass(frozen=True, slots=True)
class StateCall:
    action: Action
    response_id: str
    form: PathForm
    query: list[tuple[str, str]] = field(default_factory=list)

    def param(self, name: str) -> str | None:
        """The last value of query parameter ``name`` (``include[]`` style names too)."""
        values = [value for key, value in self.query if key == name]
        return values[-1] if values else None

    @property
    def suffix(self) -> str:
        return {"input_items": "/input_items", "cancel": "/cancel"}.get(self.action, "")


def classify_state_path(method: str, path: str) -> StateCall | None:
    """The state call ``method path`` makes, or ``None`` when it is not one."""
    route, _, query = path.partition("?")
    for pattern, form in (
        (_AZURE_V1, "azure-v1"),
        (_AZURE_CLASSIC, "azure-classic"),
        (_OPENAI, "openai"),
    ):
        match = pattern.match(route)
        if match is None:
            continue
        action = _ACTIONS.get((method.upper(), match["rest"]))
        if action is None:
            return None
        pairs = parse_qsl(query, keep_blank_values=True)
        return StateCall(action, match["id"], form, pairs)  # type: ignore[arg-type]
    return None


def owner_url(endpoint: Endpoint, call: StateCall) -> str:
    """The URL of ``call`` on the native endpoint that owns the response."""
    rest = f"responses/{call.response_id}{call.suffix}"
    query = [(k, v) for k, v in call.query if k != "api-version"]
    base = endpoint.base_url
    if endpoint.kind != "azure":
        url = f"{base}/{rest}"
    elif not endpoint.azure_classic:
        url = f"{base}/openai/v1/{rest}"
    else:
        version = endpoint.api_version or AZURE_RESPONSES_DEFAULT_VERSION
        if version < AZURE_RESPONSES_MIN_VERSION:
            version = AZURE_RESPONSES_DEFAULT_VERSION
        url = f"{base}/openai/{rest}"
        query.insert(0, ("api-version", version))
    return f"{url}?{urlencode(query)}" if query else url
