"""Route OpenAI and Azure create calls to their configured endpoint.

In ``request``: classify the path, read the body, pick the route, rewrite URL, credentials and
body (translated when the endpoint speaks the other API), and keep the plan on the flow.
Requests llmitm cannot forward faithfully are answered here with a 400 in OpenAI's shape.
Everything else — other paths, other hosts, requests no route matches — passes untouched.
"""

from __future__ import annotations

import logging

import orjson
from mitmproxy import http

from llmitm.addons.settings import LlmitmSettings
from llmitm.addons.state import METADATA_KEY, FlowState
from llmitm.exchange.request import client_model, parse_body, prepare_request
from llmitm.routing.plan import plan_request
from llmitm.translate.errors import TranslationError
from llmitm.wire.errors import ApiError, openai_error_body
from llmitm.wire.paths import classify_path

logger = logging.getLogger(__name__)


def answer_error(flow: http.HTTPFlow, error: ApiError) -> None:
    """Answer the client locally; the request is not forwarded."""
    flow.response = http.Response.make(
        error.status,
        orjson.dumps(openai_error_body(error)),
        {"content-type": "application/json", "x-should-retry": "false"},
    )


class LlmRouter:
    name = "llmitm_router"

    def __init__(self, settings: LlmitmSettings) -> None:
        self.settings = settings

    def request(self, flow: http.HTTPFlow) -> None:
        if flow.response or flow.error or not flow.live:
            return
        if flow.request.method != "POST":
            return
        classified = classify_path(flow.request.path)
        if classified is None:
            return
        config = self.settings.config
        if not config.routes:
            return  # the embedded default: OpenAI and Azure traffic passes unchanged
        try:
            self._route(flow, classified.api, classified.deployment)
        except TranslationError as exc:
            answer_error(flow, exc.to_api_error())
        except Exception:  # an llmitm bug must cost this request, never the proxy
            logger.exception("llmitm: failed to route %s", flow.request.pretty_url)
            answer_error(
                flow,
                ApiError(
                    message="llmitm failed to prepare this request; see the proxy's log.",
                    type="server_error",
                    code="llmitm_error",
                    status=500,
                ),
            )

    def _route(self, flow: http.HTTPFlow, api: str, deployment: str | None) -> None:
        content = flow.request.get_content(strict=False) or b""
        body = parse_body(content)
        model = client_model(body, deployment)
        plan = plan_request(self.settings.config, api, model, flow.request.pretty_host)  # type: ignore[arg-type]
        if plan is None:
            return
        options = self.settings.translate_options(plan.endpoint)
        prepared = prepare_request(content, body, model, plan, options)
        for warning in prepared.warnings:
            logger.warning("llmitm: %s → %s: %s", model, plan.endpoint.name, warning)
        request = flow.request
        request.url = plan.url
        for header in plan.remove_headers:
            request.headers.pop(header, None)
        for header, value in plan.set_headers.items():
            request.headers[header] = value
        request.headers.pop("content-encoding", None)
        # The stream callable parses SSE: it must see plain bytes, not gzip.
        request.headers["accept-encoding"] = "identity"
        request.content = prepared.content
        flow.metadata[METADATA_KEY] = FlowState(plan, prepared.context, prepared.stream)
