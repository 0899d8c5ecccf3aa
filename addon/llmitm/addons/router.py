"""Route OpenAI and Azure create calls to their configured endpoints.

In ``request``: classify the path, read the body, pick the route, then one of two paths:

- **direct**: a route with one endpoint and no retries. The flow's URL, credentials and body
  are rewritten for that endpoint and mitmproxy forwards it itself (the cheapest path per
  streamed event). Its concurrency slot is taken here — waiting in the bounded queue when
  the endpoint is at its cap, a 429 with ``Retry-After`` when the wait times out — and
  released in ``response`` or ``error``, whichever ends the flow.
- **relayed**: a route with several endpoints, or retries. Every candidate's request is
  prepared here (so a request no endpoint can take gets its 400 at once) and the flow is
  re-pointed at llmitm's relay, whose failover job tries the endpoints in turn
  (``relay.failover``); ``LlmResponses`` learns from the job which one answered.

Requests llmitm cannot forward faithfully are answered here with a 400 in OpenAI's shape.
Everything else — other paths, other hosts, requests no route matches — passes untouched.

In ``response``/``error`` the outcome is reported back to routing: the direct path's
health, and affinity (the endpoint that produced a response id, or served a conversation).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from dataclasses import replace
from typing import Any

import orjson
from mitmproxy import http
from mitmproxy.proxy.server_hooks import ServerConnectionHookData

from llmitm.addons.access import addressed_to_llmitm, client_key_of
from llmitm.addons.relay import LlmRelay
from llmitm.addons.settings import LlmitmSettings
from llmitm.addons.state import (
    METADATA_KEY,
    RESPONSES_CREATE_KEY,
    FlowState,
    Routed,
    flow_mint,
    flow_state,
)
from llmitm.addons.streams import stream_outcome
from llmitm.exchange.request import PreparedRequest, client_model, parse_body, prepare_request
from llmitm.relay.client import HOP_BY_HOP, UpstreamRequest
from llmitm.relay.failover import FailoverJob
from llmitm.relay.server import MAX_HEAD_BYTES
from llmitm.routing.access import route_refusal, without_client_key
from llmitm.routing.affinity import fingerprint
from llmitm.routing.config import Config, Route
from llmitm.routing.engine import Routing
from llmitm.routing.outcomes import Outcome, outcome_for_status
from llmitm.routing.plan import Plan, match_route, plan_for_endpoint
from llmitm.routing.wait import wait_for_slot
from llmitm.translate.errors import TranslationError
from llmitm.translate.validation import validate_request
from llmitm.wire.errors import ApiError, openai_error_body
from llmitm.wire.paths import classify_path

logger = logging.getLogger(__name__)

STATUS_PATH = "/_llmitm/status"
_RELEASE_SAFETY_S = 5.0
_RELAY_HEAD_SLACK = 8192
"""Room in the relay's head limit for the request line and the headers llmitm adds."""
"""A slot left for ``server_disconnected`` is freed after this long whatever happens."""


def answer_error(
    flow: http.HTTPFlow, error: ApiError, headers: dict[str, str] | None = None
) -> None:
    """Answer the client locally; the request is not forwarded."""
    flow.response = http.Response.make(
        error.status,
        orjson.dumps(openai_error_body(error)),
        {"content-type": "application/json", "x-should-retry": "false", **(headers or {})},
    )


class LlmRouter:
    name = "llmitm_router"

    def __init__(self, settings: LlmitmSettings, relay: LlmRelay | None = None) -> None:
        self.settings = settings
        self.relay = relay
        self._routing: Routing | None = None
        self._routing_config: Config | None = None
        self._on_disconnect: dict[str, list[Routed]] = {}
        """Slots to free when an aborted flow's upstream connection closes."""

    @property
    def routing(self) -> Routing:
        """The proxy's routing state, rebuilt when the configuration changes (leases of the
        old one still release into the old one)."""
        config = self.settings.config
        if self._routing is None or self._routing_config is not config:
            self._routing = Routing(config)
            self._routing_config = config
        return self._routing

    # --- request --------------------------------------------------------------------------

    def request(self, flow: http.HTTPFlow) -> Awaitable[None] | None:
        if flow.response or flow.error or not flow.live:
            return None
        if (
            flow.request.method == "GET"
            and flow.request.path == STATUS_PATH
            and addressed_to_llmitm(flow)
        ):
            self._status(flow)
            return None
        if flow.request.method != "POST":
            return None
        classified = classify_path(flow.request.path)
        if classified is None:
            return None
        config = self.settings.config
        if not config.routes:
            return None  # the embedded default: OpenAI and Azure traffic passes unchanged
        started = time.perf_counter()
        try:
            return self._route(flow, classified.api, classified.deployment, started)
        except TranslationError as exc:
            answer_error(flow, exc.to_api_error())
        except Exception:  # an llmitm bug must cost this request, never the proxy
            logger.exception("llmitm: failed to route %s", flow.request.pretty_url)
            state = flow_state(flow)
            if isinstance(state, FlowState) and state.routed is not None:
                state.routed.release()
            answer_error(
                flow,
                ApiError(
                    message="llmitm failed to prepare this request; see the proxy's log.",
                    type="server_error",
                    code="llmitm_error",
                    status=500,
                ),
            )
        return None

    def _route(
        self, flow: http.HTTPFlow, api: str, deployment: str | None, started: float
    ) -> Awaitable[None] | None:
        content = flow.request.get_content(strict=False) or b""
        body = parse_body(content)
        model = client_model(body, deployment)
        config = self.settings.config
        route = match_route(config, model, flow.request.pretty_host)
        if route is None:
            return None
        validate_request(body, api)  # before anything below reads the body
        client_key = client_key_of(flow, self.settings)
        refused = route_refusal(client_key, route.name)
        if refused is not None:
            answer_error(flow, refused)
            return None
        routing = self.routing
        sent_model = route.model or model
        routed = Routed(route=route, model=sent_model)
        previous = body.get("previous_response_id")
        if isinstance(previous, str) and previous:
            routed.previous_response_id = previous
            create = flow.metadata.get(RESPONSES_CREATE_KEY)
            routed.previous_owner = getattr(create, "previous_owner", None)
        relay = self.relay.listening() if self.relay is not None else None
        if routing.relayed(route) and relay is not None:
            if route.affinity:
                conversation = fingerprint(body)
                if conversation is not None:
                    # One conversation per route and model: the same opening sent to another
                    # model is another conversation (and another prompt cache).
                    routed.fingerprint = f"{route.name}\x00{sent_model}\x00{conversation}"
            self._relayed(flow, api, content, body, model, routed, relay, started)
            return None
        endpoint = config.endpoints[route.endpoints[0]]
        plan, prepared = self._prepare(flow, endpoint.name, api, content, body, model, route)
        state = self._rewrite(flow, plan, prepared, routed)
        lease = routing.limiter.try_acquire(endpoint.name, sent_model)
        if lease is not None:
            routed.lease = lease
            routed.overhead = time.perf_counter() - started
            return None
        return self._wait_for_slot(flow, state, routed, started)

    def _prepare(
        self,
        flow: http.HTTPFlow,
        name: str,
        api: str,
        content: bytes,
        body: dict[str, Any],
        model: str,
        route: Route,
    ) -> tuple[Plan, PreparedRequest]:
        endpoint = self.settings.config.endpoints[name]
        plan = plan_for_endpoint(endpoint, api, route.model or model)  # type: ignore[arg-type]
        plan = replace(plan, route=route.name)
        options = self.settings.translate_options(endpoint)
        mint = flow_mint(flow)
        if mint is not None:  # recorded or replayed: ids and times come from the flow's mint
            options = replace(options, ids=mint.id, clock=mint.now)
        prepared = prepare_request(
            content, body, model, plan, options, ask_usage=endpoint.stream_usage
        )
        for warning in prepared.warnings:
            logger.warning("llmitm: %s → %s: %s", model, endpoint.name, warning)
        return plan, prepared

    def _rewrite(
        self, flow: http.HTTPFlow, plan: Plan, prepared: PreparedRequest, routed: Routed
    ) -> FlowState:
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
        routed.endpoint = plan.endpoint.name
        state = FlowState(
            plan, prepared.context, prepared.stream, strip_usage=prepared.strip_usage, routed=routed
        )
        flow.metadata[METADATA_KEY] = state
        return state

    async def _wait_for_slot(
        self, flow: http.HTTPFlow, state: FlowState, routed: Routed, started: float
    ) -> None:
        """The direct path's endpoint is at its cap: wait in the bounded queue, or answer
        429 with ``Retry-After``."""
        limiter = self.routing.limiter
        lease = await wait_for_slot(limiter, [(state.plan.endpoint.name, routed.model)])
        if lease is None:
            retry_after = max(1, round(limiter.wait.retry_after))
            answer_error(
                flow,
                ApiError(
                    message=f"The endpoint {state.plan.endpoint.name} is at its concurrency "
                    f"limit; retry in {retry_after} s.",
                    type="rate_limit_error",
                    code="concurrency_limit",
                    status=429,
                ),
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

    def _relayed(
        self,
        flow: http.HTTPFlow,
        api: str,
        content: bytes,
        body: dict[str, Any],
        model: str,
        routed: Routed,
        relay: Any,
        started: float,
    ) -> None:
        """Prepare every candidate and hand the flow to the relay's failover job."""
        route = routed.route
        requests: dict[str, UpstreamRequest] = {}
        first_error: TranslationError | None = None
        first: tuple[Plan, PreparedRequest] | None = None
        client_headers = [
            (k, v)
            for k, v in flow.request.headers.items(multi=True)
            if k.lower() not in HOP_BY_HOP
            and k.lower() not in {"accept-encoding", "content-encoding"}
        ]
        if _head_size(client_headers) > MAX_HEAD_BYTES - _RELAY_HEAD_SLACK:
            raise TranslationError(
                f"The request's headers exceed the {MAX_HEAD_BYTES // 1024} KiB llmitm relays "
                "to a failover route; send fewer or smaller headers.",
                code="request_header_fields_too_large",
                status=431,
            )
        client_key = client_key_of(flow, self.settings)
        if client_key is not None:  # the proxy's own key goes to no endpoint
            client_headers = without_client_key(client_headers, client_key)
        for name in route.endpoints:
            try:
                plan, prepared = self._prepare(flow, name, api, content, body, model, route)
            except TranslationError as exc:
                first_error = first_error or exc
                continue
            first = first or (plan, prepared)
            routed.candidates[name] = (plan, prepared.context, prepared.strip_usage)
            remove = {name.lower() for name in (*plan.remove_headers, *plan.set_headers)}
            headers = [(k, v) for k, v in client_headers if k.lower() not in remove]
            headers += list(plan.set_headers.items())
            headers.append(("accept-encoding", "identity"))
            requests[name] = UpstreamRequest("POST", plan.url, headers, prepared.content)
        if first is None:
            assert first_error is not None
            raise first_error
        plan, prepared = first
        routing = self.routing
        owner = routing.owner(
            routed.previous_response_id, time.monotonic(), remembered=routed.previous_owner
        )
        owner_required = (
            owner is not None
            and owner in routed.candidates
            and api == "responses"
            and routed.candidates[owner][0].upstream_api == "responses"
        )
        job = FailoverJob(
            routing=routing,
            route=route,
            model=routed.model,
            prepare=requests.get,
            connect_timeout=self.settings.config.routing.connect_timeout,
            tls_context=relay.tls_context,
            previous_response_id=routed.previous_response_id,
            fingerprint=routed.fingerprint,
            owner_required=owner_required,
            stream=prepared.stream,
        )
        routed.job = job
        routed.relayed = True
        state = FlowState(
            plan, prepared.context, prepared.stream, strip_usage=prepared.strip_usage, routed=routed
        )
        flow.metadata[METADATA_KEY] = state
        flow.request.headers["accept-encoding"] = "identity"
        self.relay.point(flow, relay.register(job))  # type: ignore[union-attr]
        routed.overhead = time.perf_counter() - started

    # --- outcomes -------------------------------------------------------------------------

    def response(self, flow: http.HTTPFlow) -> None:
        state = flow_state(flow)
        if not isinstance(state, FlowState) or state.routed is None:
            return
        routed = state.routed
        routed.release()
        routed.forget()  # LlmResponses adopted the winner's plan in responseheaders
        endpoint = routed.endpoint
        response = flow.response
        if endpoint is None or response is None:
            return
        routing = self.routing
        now = time.monotonic()
        if not routed.relayed:
            # The direct path: report what the endpoint did (the relay's job reports its own).
            if state.upstream_cut is not None:
                outcome = Outcome("cut", after_first_byte=True, message=state.upstream_cut)
            else:
                outcome = outcome_for_status(
                    response.status_code, response.headers, wall_now=time.time()
                )
            routing.record(endpoint, outcome, now, routed.model)
        if response.status_code >= 400 or state.upstream_cut is not None:
            return
        if routed.route.affinity and (routed.fingerprint or state.plan.upstream_api == "responses"):
            routing.served(
                endpoint, now, response_id=_response_id(flow, state), fingerprint=routed.fingerprint
            )

    def error(self, flow: http.HTTPFlow) -> None:
        state = flow_state(flow)
        if not isinstance(state, FlowState) or state.routed is None:
            return
        routed = state.routed
        server = flow.server_conn
        if routed.lease is not None and server.connected:
            # The client went away mid-answer: the slot is free once mitmproxy has closed
            # the upstream connection too (right after this hook), not before — or a new
            # request could reach the endpoint while the old one still runs there.
            self._on_disconnect.setdefault(server.id, []).append(routed)
            asyncio.get_running_loop().call_later(_RELEASE_SAFETY_S, routed.release)
        else:
            routed.release()
        routed.forget()
        if not routed.relayed and routed.endpoint is not None and flow.error is not None:
            message = flow.error.msg
            if "client" not in message.lower() and (flow.response is None or not state.streamed):
                # mitmproxy could not reach the endpoint, lost it before the head, or before
                # the end of a plain body (the client got llmitm's 502 for all three).
                kind = "connect_error" if flow.response is None else "server_error"
                self.routing.record(
                    routed.endpoint, Outcome(kind, message=message),
                    time.monotonic(), routed.model,
                )  # fmt: skip

    def server_disconnected(self, data: ServerConnectionHookData) -> None:
        for routed in self._on_disconnect.pop(data.server.id, ()):
            routed.release()

    # --- the status route -----------------------------------------------------------------

    def _status(self, flow: http.HTTPFlow) -> None:
        """``GET /_llmitm/status``: in-flight counters, waiters and cooldowns per endpoint."""
        snapshot = self.routing.snapshot(time.monotonic())
        relay = self.relay.listening() if self.relay is not None else None
        if relay is not None:
            # Relay registrations and connections: 0 again once every flow has ended.
            snapshot["relay"] = relay.stats()
        # The event loop's tasks: back to the idle count once every flow has ended.
        snapshot["process"] = {"asyncio_tasks": len(asyncio.all_tasks())}
        flow.response = http.Response.make(
            200,
            orjson.dumps(snapshot, option=orjson.OPT_INDENT_2),
            {"content-type": "application/json", "cache-control": "no-store"},
        )


def _head_size(headers: list[tuple[str, str]]) -> int:
    """The bytes ``headers`` take in an HTTP/1.1 head ("name: value\\r\\n" each)."""
    return sum(len(name) + len(value) + 4 for name, value in headers)


def _response_id(flow: http.HTTPFlow, state: FlowState) -> str | None:
    """The id of a Responses answer (for ``previous_response_id`` affinity)."""
    if state.plan.client_api != "responses" or state.plan.upstream_api != "responses":
        return None
    response = flow.response
    if response is None:
        return None
    if state.streamed:
        outcome = stream_outcome(flow)
        return outcome.response_id if outcome is not None else None
    content = response.get_content(strict=False)
    if not content:
        return None
    try:
        body = orjson.loads(content)
    except orjson.JSONDecodeError:
        return None
    value = body.get("id") if isinstance(body, dict) else None
    return value if isinstance(value, str) else None
