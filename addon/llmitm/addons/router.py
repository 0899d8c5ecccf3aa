"""Route OpenAI and Azure create calls to their configured endpoints.

In ``request``: classify the path, read the body, pick the route, then one of two paths:

- **direct**: a route with one endpoint and no retries. The flow's URL, credentials and body
  are rewritten for that endpoint and mitmproxy forwards it itself (the cheapest path per
  streamed event). Its concurrency slot is taken here (``addons.direct``: waiting in the
  bounded queue when the endpoint is at its cap, a 429 with ``Retry-After`` when the wait
  times out) and released in ``response`` or ``error``, whichever ends the flow.
- **relayed**: a route with several endpoints, or retries. Every candidate's request is
  prepared here (so a request no endpoint can take gets its 400 at once; ``addons.relayed``)
  and the flow is re-pointed at llmitm's relay, whose failover job tries the endpoints in
  turn (``relay.failover``); ``LlmStreamTranslator`` learns from the job which one answered.

Requests llmitm cannot forward faithfully are answered here with a 400 in OpenAI's shape.
Everything else — other paths, other hosts, requests no route matches — passes untouched.

In ``response``/``error`` the outcome is reported back to routing: the direct path's
health, and affinity (the endpoint that produced a response id, or served a conversation).

The decisions are the core's: which endpoint (``Routing.choose``), what each candidate is
sent (``exchange.request``), what an ending was (``routing.outcomes``) and what affinity
keys on (``routing.affinity``); this addon reads the flow and applies them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from mitmproxy import http
from mitmproxy.proxy.server_hooks import ServerConnectionHookData

from llmitm.addons.access import client_key_of
from llmitm.addons.direct import answer_error, point_at_endpoint, prepare_direct, wait_for_endpoint
from llmitm.addons.fleet import LlmFleet
from llmitm.addons.parsed import take_parsed
from llmitm.addons.relay import LlmRelay
from llmitm.addons.relayed import hand_over, relayed_headers
from llmitm.addons.settings import LlmitmSettings
from llmitm.addons.state import (
    METADATA_KEY,
    RESPONSES_CREATE_KEY,
    FlowState,
    Routed,
    flow_state,
)
from llmitm.addons.streams import answered_response_id
from llmitm.exchange.request import (
    PreparedRequest,
    client_model,
    parse_body,
)
from llmitm.relay.server import RelayServer
from llmitm.routing.access import route_refusal
from llmitm.routing.affinity import conversation_key, remembers_turn
from llmitm.routing.config import Config
from llmitm.routing.engine import Routing
from llmitm.routing.first_byte import first_byte_outcome
from llmitm.routing.outcomes import direct_outcome, transport_outcome
from llmitm.routing.plan import Plan, match_route
from llmitm.translate.errors import TranslationError
from llmitm.translate.validation import validate_request
from llmitm.wire.errors import ApiError
from llmitm.wire.paths import classify_path

logger = logging.getLogger(__name__)

_RELEASE_SAFETY_S = 5.0
"""A slot left for ``server_disconnected`` is freed after this long whatever happens."""


_PREPARE_FAILED = ApiError(
    message="llmitm failed to prepare this request; see the proxy's log.",
    type="server_error",
    code="llmitm_error",
    status=500,
)


class LlmRouter:
    name = "llmitm_router"

    def __init__(
        self, settings: LlmitmSettings, relay: LlmRelay | None = None, fleet: LlmFleet | None = None
    ) -> None:
        self.settings = settings
        self.relay = relay
        self.fleet = fleet
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
            if self.fleet is not None:
                self.fleet.attach(self._routing)
        return self._routing

    # --- request --------------------------------------------------------------------------

    def request(self, flow: http.HTTPFlow) -> Awaitable[None] | None:
        if flow.response or flow.error or not flow.live:
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
            answer_error(flow, _PREPARE_FAILED)
        return None

    def _route(
        self, flow: http.HTTPFlow, api: str, deployment: str | None, started: float
    ) -> Awaitable[None] | None:
        content = flow.request.get_content(strict=False) or b""
        parsed = take_parsed(flow, content)  # LlmResponsesApi's, when it read these bytes
        body, validated, grown = parsed if parsed is not None else (parse_body(content), None, None)
        model = client_model(body, deployment)
        route = match_route(self.settings.config, model, flow.request.pretty_host)
        if route is None:
            return None
        if validated != api:
            validate_request(body, api)  # before anything below reads the body
        refused = route_refusal(client_key_of(flow, self.settings), route.name)
        if refused is not None:
            answer_error(flow, refused)
            return None
        routed = Routed(route=route, model=route.model or model)
        previous = body.get("previous_response_id")
        if isinstance(previous, str) and previous:
            routed.previous_response_id = previous
            create = flow.metadata.get(RESPONSES_CREATE_KEY)
            routed.previous_owner = getattr(create, "previous_owner", None)

        def prepare(name: str) -> tuple[Plan, PreparedRequest]:
            endpoint = self.settings.config.endpoints[name]
            options = self.settings.translate_options(endpoint)
            return prepare_direct(flow, endpoint, api, content, body, model, route, options, grown)

        relay = self.relay.listening() if self.relay is not None else None
        routing = self.routing
        if routing.relayed(route) and relay is not None:
            if route.affinity:
                routed.fingerprint = conversation_key(route.name, routed.model, body)
                now = time.monotonic()
                if (
                    self.fleet is not None
                    and self.fleet.active
                    and not routing.knows(routed.previous_response_id, routed.fingerprint, now)
                ):
                    return self._relayed_after_lookup(flow, api, prepare, routed, relay, started)
            self._relayed(flow, api, prepare, routed, relay, started)
            return None
        order = routing.choose(route, routed.model, time.monotonic(), single_attempt=True)
        state = point_at_endpoint(flow, *prepare(order.endpoints[0]), routed)
        endpoint, limiter = state.plan.endpoint.name, routing.limiter
        take = self.fleet.taker(routing) if self.fleet is not None else None
        lease = limiter.try_acquire(endpoint, routed.model)
        if lease is not None and (take is None or not limiter.capped(endpoint, routed.model)):
            routed.lease = lease  # no cap to share: this process's count is all there is
            routed.overhead = time.perf_counter() - started
            return None
        if lease is not None:
            lease.release()  # the fleet's slot is taken with this process's, below
        return wait_for_endpoint(flow, state, routed, limiter, started, take)

    async def _relayed_after_lookup(
        self,
        flow: http.HTTPFlow,
        api: str,
        prepare: Callable[[str], tuple[Plan, PreparedRequest]],
        routed: Routed,
        relay: RelayServer,
        started: float,
    ) -> None:
        """The relayed path once the fleet said where this conversation lives."""
        assert self.fleet is not None
        try:
            await self.fleet.lookup(self.routing, routed.previous_response_id, routed.fingerprint)
            self._relayed(flow, api, prepare, routed, relay, started)
        except TranslationError as exc:
            answer_error(flow, exc.to_api_error())
        except Exception:  # an llmitm bug must cost this request, never the proxy
            logger.exception("llmitm: failed to route %s", flow.request.pretty_url)
            answer_error(flow, _PREPARE_FAILED)

    def _relayed(
        self,
        flow: http.HTTPFlow,
        api: str,
        prepare: Callable[[str], tuple[Plan, PreparedRequest]],
        routed: Routed,
        relay: RelayServer,
        started: float,
    ) -> None:
        """Prepare every candidate and hand the flow to the relay's failover job."""
        assert self.relay is not None  # ``relay`` is what it listens with
        client = flow.request.headers.items(multi=True)
        headers = relayed_headers(client, client_key_of(flow, self.settings))
        config = self.settings.config
        routing = self.routing
        take = None
        if self.fleet is not None:
            routed.slot_pin = self.fleet.slot_pin(routing, routed.fingerprint)
            take = self.fleet.taker(routing, routed.slot_pin)
        job, state = hand_over(routed, api, prepare, headers, routing, config, relay, take)
        flow.metadata[METADATA_KEY] = state
        flow.request.headers["accept-encoding"] = "identity"
        self.relay.point(flow, relay.register(job))
        routed.overhead = time.perf_counter() - started

    # --- outcomes -------------------------------------------------------------------------

    def response(self, flow: http.HTTPFlow) -> Awaitable[None] | None:
        state = flow_state(flow)
        if not isinstance(state, FlowState) or state.routed is None:
            return None
        routed = state.routed
        routed.release()
        routed.forget()  # LlmStreamTranslator adopted the winner's plan in responseheaders
        endpoint = routed.endpoint
        response = flow.response
        if endpoint is None or response is None:
            return None
        routing = self.routing
        now = time.monotonic()
        if not routed.relayed:
            # The direct path: report what the endpoint did (the relay's job reports its own).
            outcome = direct_outcome(
                response.status_code, response.headers, cut=state.upstream_cut, wall_now=time.time()
            )
            routing.record(endpoint, outcome, now, routed.model)
        if response.status_code >= 400 or state.upstream_cut is not None:
            return None
        if not remembers_turn(routed.route.affinity, routed.fingerprint, state.plan.upstream_api):
            return None
        response_id = answered_response_id(flow, state)
        new = routing.served(endpoint, now, response_id=response_id, fingerprint=routed.fingerprint)
        if self.fleet is not None and self.fleet.active:
            # A new pin is shared before the client hears the end of this answer, so its next
            # turn finds it on any proxy (a new conversation's went with its slot); a refresh
            # goes with the next batch.
            return self.fleet.share_turn(
                routing, endpoint, response_id, routed.fingerprint, new, routed.slot_pin
            )
        return None

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
            outcome = transport_outcome(
                flow.error.msg, got_head=flow.response is not None, streamed=state.streamed
            )
            if state.head_timeout is not None:  # LlmFirstByteWatch closed it
                outcome = first_byte_outcome(state.head_timeout)
            if outcome is not None:
                self.routing.record(routed.endpoint, outcome, time.monotonic(), routed.model)

    def server_disconnected(self, data: ServerConnectionHookData) -> None:
        for routed in self._on_disconnect.pop(data.server.id, ()):
            routed.release()
