"""The router's direct path: a route with one endpoint and no retries, forwarded by mitmproxy.

The flow's URL, credentials and body are rewritten for the endpoint (the cheapest path per
streamed event), and its concurrency slot is taken — waiting in the bounded queue when the
endpoint is at its cap, a 429 with ``Retry-After`` when the wait times out. Requests llmitm
cannot forward are answered locally with an error in OpenAI's shape (:func:`answer_error`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Any

import orjson
from mitmproxy import http

from llmitm.addons.state import METADATA_KEY, FlowState, Routed, flow_mint
from llmitm.exchange.request import PreparedRequest, prepare_for_endpoint, rewrite_headers
from llmitm.routing.config import Endpoint, Route
from llmitm.routing.limits import Limiter
from llmitm.routing.plan import Plan
from llmitm.routing.wait import SlotTaker, over_cap_error, take_slot
from llmitm.translate.context import TranslateOptions
from llmitm.wire.errors import ApiError, openai_error_body
from llmitm.wire.growing import Grown
from llmitm.wire.sized import right_sized

logger = logging.getLogger(__name__)


def answer_error(
    flow: http.HTTPFlow, error: ApiError, headers: dict[str, str] | None = None
) -> None:
    """Answer the client locally; the request is not forwarded."""
    flow.response = http.Response.make(
        error.status,
        orjson.dumps(openai_error_body(error)),
        {"content-type": "application/json", "x-should-retry": "false", **(headers or {})},
    )


def prepare_direct(
    flow: http.HTTPFlow,
    endpoint: Endpoint,
    api: str,
    content: bytes,
    body: dict[str, Any],
    model: str,
    route: Route,
    options: TranslateOptions,
    grown: Grown | None = None,
) -> tuple[Plan, PreparedRequest]:
    """What ``endpoint`` is sent for this flow (its ids and clock from the flow's mint when it
    is recorded or replayed; ``grown``: the growing parse ``body`` is, unchanged since)."""
    mint = flow_mint(flow)
    if mint is not None:
        options = replace(options, ids=mint.id, clock=mint.now)
    plan, prepared = prepare_for_endpoint(
        endpoint, api, route, content, body, model, options, grown=grown
    )
    for warning in prepared.warnings:
        logger.warning("llmitm: %s → %s: %s", model, endpoint.name, warning)
    return plan, prepared


def point_at_endpoint(
    flow: http.HTTPFlow, plan: Plan, prepared: PreparedRequest, routed: Routed
) -> FlowState:
    """Rewrite the flow for the endpoint mitmproxy forwards it to; the flow's state."""
    flow.request.url = plan.url
    rewrite_headers(flow.request.headers, plan, new_body=True)
    # The flow keeps this body to its end: not in orjson's oversized buffer.
    flow.request.content = right_sized(prepared.content)
    routed.endpoint = plan.endpoint.name
    state = FlowState(
        plan, prepared.context, prepared.stream, strip_usage=prepared.strip_usage, routed=routed
    )
    flow.metadata[METADATA_KEY] = state
    return state


async def wait_for_endpoint(
    flow: http.HTTPFlow,
    state: FlowState,
    routed: Routed,
    limiter: Limiter,
    started: float,
    take: SlotTaker | None = None,
) -> None:
    """The endpoint's slot, taken with the fleet's (``take``) or waited for in the bounded
    queue when it is at its cap; else a 429 with ``Retry-After``."""
    candidates = [(state.plan.endpoint.name, routed.model)]
    lease = await (take(candidates) if take is not None else take_slot(limiter, candidates))
    if lease is None:
        error, retry_after = over_cap_error(state.plan.endpoint.name, limiter.wait.retry_after)
        answer_error(
            flow,
            error,
            {
                "retry-after": str(retry_after),
                "x-llmitm-endpoint": "llmitm",
                "x-llmitm-attempts": "0",
                "x-llmitm-overhead-ms": f"{(time.perf_counter() - started) * 1000:.2f}",
            },
        )
        routed.endpoint = None
        return
    routed.lease = lease
    if not flow.live or flow.error:
        routed.release()  # the client left while it waited
    routed.overhead = time.perf_counter() - started
