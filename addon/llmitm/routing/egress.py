"""Egress policy: what happens to a request that is not a routed LLM call.

An app run through llmitm sends more than its model calls: Codex posts OpenTelemetry metrics
and looks up plugins on GitHub, openai-agents uploads its traces to OpenAI. Under the default
policy ``pass`` they go to their hosts, as without llmitm. Under ``local`` nothing leaves the
machine that llmitm did not route: known telemetry and trace uploads get an empty success
(the exporters stay quiet and do not retry), everything else an OpenAI-shaped 403 that names
the policy and how to change it. A WebSocket upgrade on an LLM API path gets a 426 instead,
which tells a client with an HTTP transport (Codex) to use it at once.

Pure functions over method, path, headers and the configuration; the addon
(``addons/egress.py``) applies them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal, get_args
from urllib.parse import urlsplit

import orjson

from llmitm.wire.errors import ApiError, openai_error_body
from llmitm.wire.paths import is_llm_call

EgressPolicy = Literal["pass", "local"]
EGRESS_POLICIES: tuple[str, ...] = get_args(EgressPolicy)

OPTION = "llmitm_egress"
CONFIG_KEY = "llmitm.egress"

# OTLP/HTTP's signal paths (any host, any mount point: Codex posts to
# ab.chatgpt.com/otlp/v1/metrics) and the OpenAI Agents SDK's trace upload.
_OTLP = re.compile(r"/v1/(?:traces|metrics|logs)/?$")
_OPENAI_TRACES = re.compile(r"/v1/traces/ingest/?$")

TelemetryKind = Literal["otlp", "openai-traces"]


@dataclass(frozen=True, slots=True)
class LocalAnswer:
    """The response llmitm gives in the upstream's place."""

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes
    reason: str
    """Why, in a few words, for the log line."""


def telemetry_kind(method: str, path: str) -> TelemetryKind | None:
    """The kind of telemetry upload ``method path`` is, or ``None``."""
    if method.upper() != "POST":
        return None
    route = path.partition("?")[0]
    if _OPENAI_TRACES.search(route):
        return "openai-traces"
    if _OTLP.search(route):
        return "otlp"
    return None


def describe(policy: EgressPolicy) -> str:
    """The start-up line that says which policy is on."""
    if policy == "local":
        return (
            "egress: local — requests that are not routed LLM calls are answered here "
            "(telemetry: empty success; anything else: 403) and never leave the machine"
        )
    return (
        "egress: pass — requests that are not routed LLM calls go to their hosts "
        f'(--set {OPTION}=local or [llmitm] egress = "local" keeps them here)'
    )


def endpoint_addresses(base_urls: Iterable[str]) -> frozenset[tuple[str, int]]:
    """``(host, port)`` of every configured endpoint's base URL: what ``local`` still
    connects to. Takes the URLs, not the configuration, which imports this module."""
    addresses = set()
    for base_url in base_urls:
        parts = urlsplit(base_url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        addresses.add(((parts.hostname or "").lower(), port))
    return frozenset(addresses)


def local_answer(method: str, host: str, path: str, headers: Mapping[str, str]) -> LocalAnswer:
    """What the ``local`` policy answers to a request nothing in llmitm took.

    ``headers`` are the request's, by lower-case name (``content-type``, ``upgrade``)."""
    kind = telemetry_kind(method, path)
    if kind == "otlp":
        return _otlp_success(headers.get("content-type", ""))
    if kind == "openai-traces":
        return LocalAnswer(204, (("x-llmitm-egress", "local"),), b"", "trace upload dropped")
    target = f"{method.upper()} {host}{path.partition('?')[0]}"
    websocket = headers.get("upgrade", "").lower() == "websocket"
    if websocket and is_llm_call(path):
        return _refusal(
            426,
            f"llmitm's egress policy is local and no route serves this WebSocket ({target}); "
            "use the HTTP transport, which llmitm routes.",
            "egress_websocket_refused",
            "WebSocket refused",
        )
    what = "an LLM call no route matches" if is_llm_call(path) else "not a routed LLM call"
    return _refusal(
        403,
        f"llmitm's egress policy is local: {target} is {what}, so it was answered here and "
        f'not sent. To let such requests through, set {CONFIG_KEY} = "pass" in the '
        f"configuration file or run with --set {OPTION}=pass; to route it, add a route.",
        "egress_refused",
        "refused",
    )


def _otlp_success(content_type: str) -> LocalAnswer:
    """An OTLP export's success: an empty ``Export…ServiceResponse``, which is zero bytes in
    protobuf and ``{}`` in JSON (no ``partial_success``: everything was accepted)."""
    if "json" in content_type.lower():
        headers = (("content-type", "application/json"), ("x-llmitm-egress", "local"))
        return LocalAnswer(200, headers, b"{}", "telemetry dropped")
    headers = (("content-type", "application/x-protobuf"), ("x-llmitm-egress", "local"))
    return LocalAnswer(200, headers, b"", "telemetry dropped")


def _refusal(status: int, message: str, code: str, reason: str) -> LocalAnswer:
    error = ApiError(message=message, type="permission_error", code=code, status=status)
    headers = (
        ("content-type", "application/json"),
        ("x-should-retry", "false"),
        ("x-llmitm-egress", "local"),
    )
    return LocalAnswer(status, headers, orjson.dumps(openai_error_body(error)), reason)
