"""``llmitm_egress``: what becomes of requests that are not routed LLM calls.

Two addons share the policy (:mod:`llmitm.routing.egress` decides each answer):

``LlmEgress`` (first in line, before the recorder) owns the option and says at start-up which
policy is on. Under ``local`` it answers every request that is not an LLM call at all —
telemetry, trace uploads, plugin look-ups, a WebSocket to anywhere — before any other addon
sees it, so such a request is neither forwarded nor recorded nor looked up in a replay. A
``CONNECT`` itself is let through: the requests inside the tunnel are decided one by one, and
under the lazy connection strategy llmitm sets nothing is dialled before they are. As a
backstop, ``server_connect`` refuses every connection to anything but a configured endpoint
and llmitm's relay: raw TCP and UDP streams, tunnels ``ignore_hosts`` passes through unseen.

``LlmEgressGuard`` (after the router) answers the LLM calls that nothing in llmitm took: no
route matched, no replay hit, no stored response, no relay. A request that is no LLM call but
already goes to a configured endpoint (the llama.cpp server's own model list) is left alone,
unless it is telemetry. Under ``pass`` both do nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Set
from typing import cast

from mitmproxy import ctx, http
from mitmproxy.addonmanager import Loader
from mitmproxy.proxy.server_hooks import ServerConnectionHookData

from llmitm.addons.choices import check_choices
from llmitm.addons.record import replay_hit
from llmitm.addons.relay import LlmRelay
from llmitm.addons.settings import LlmitmSettings
from llmitm.addons.state import RESPONSES_CREATE_KEY, FlowState, flow_state
from llmitm.addons.status import STATUS_PATH
from llmitm.routing.egress import (
    EGRESS_POLICIES,
    OPTION,
    EgressPolicy,
    LocalAnswer,
    describe,
    endpoint_addresses,
    local_answer,
    telemetry_kind,
)
from llmitm.wire.paths import is_llm_call

logger = logging.getLogger(__name__)


class LlmEgress:
    """Option ``llmitm_egress``; answers what is not an LLM call under ``local``."""

    name = "llmitm_egress"

    def __init__(self, settings: LlmitmSettings, relay: LlmRelay) -> None:
        self.settings = settings
        self.relay = relay

    @property
    def policy(self) -> EgressPolicy:
        """The option when set, else the configuration file's ``[llmitm] egress``."""
        # The option's choices are "" and the policies.
        return cast(EgressPolicy, ctx.options.llmitm_egress or self.settings.config.settings.egress)

    def load(self, loader: Loader) -> None:
        loader.add_option(
            OPTION,
            str,
            "",
            "Requests that are not routed LLM calls: pass (to their hosts) or local (answered "
            "here: an empty success for telemetry, a 403 otherwise). Empty: the file's "
            "llmitm.egress, else pass.",
            choices=["", *EGRESS_POLICIES],
        )

    def configure(self, updated: Set[str]) -> None:
        check_choices(updated, {OPTION: ("", *EGRESS_POLICIES)})

    def running(self) -> None:
        logger.info("llmitm: %s", describe(self.policy))

    def request(self, flow: http.HTTPFlow) -> None:
        if flow.response or flow.error or not flow.live or self.policy != "local":
            return
        request = flow.request
        if is_llm_call(request.path) or request.path == STATUS_PATH:
            return  # LlmEgressGuard decides, once routing has had its say
        if self.is_relay(request.host, request.port):
            return  # a WebSocket llmitm serves itself: its calls are decided one by one
        bound_for_endpoint = self.is_endpoint(request.host, request.port)
        if bound_for_endpoint and telemetry_kind(request.method, request.path) is None:
            return  # already going where the configuration points (a model list, a health check)
        answer_locally(flow, _answer_for(request))

    def server_connect(self, data: ServerConnectionHookData) -> None:
        # The backstop: whatever got this far (a raw TCP or UDP stream, a tunnel that
        # ignore_hosts passes through unseen, a flow nothing answered) dials only what the
        # configuration names, and llmitm's own relay.
        address = data.server.address
        if address is None or self.policy != "local":
            return
        if self.is_relay(*address[:2]) or self.is_endpoint(*address[:2]):
            return
        target = f"{address[0]}:{address[1]}"
        logger.info(
            "llmitm: egress local: not connecting to %s (not a configured endpoint)", target
        )
        data.server.error = (
            f"llmitm's egress policy is local: {target} is not a configured endpoint ({OPTION})"
        )

    def is_relay(self, host: str, port: int) -> bool:
        server = self.relay.listening()
        return server is not None and (host, port) == ("127.0.0.1", server.port)

    def is_endpoint(self, host: str, port: int) -> bool:
        endpoints = self.settings.config.endpoints.values()
        return (host.lower(), port) in endpoint_addresses(e.base_url for e in endpoints)


class LlmEgressGuard:
    """Under ``local``, answers the LLM calls no route, replay, stored state or relay took."""

    name = "llmitm_egress_guard"

    def __init__(self, egress: LlmEgress) -> None:
        self.egress = egress

    def request(self, flow: http.HTTPFlow) -> None:
        if flow.response or flow.error or not flow.live or self.egress.policy != "local":
            return
        if not is_llm_call(flow.request.path):
            return  # LlmEgress has decided it
        if self._handled_here(flow) or self.egress.is_relay(flow.request.host, flow.request.port):
            return  # an unrouted call to an endpoint's host is refused too: it is not routed
        answer_locally(flow, _answer_for(flow.request))

    def _handled_here(self, flow: http.HTTPFlow) -> bool:
        state = flow_state(flow)
        if isinstance(state, FlowState) and state.routed is not None:
            return True  # the router sent it to a configured endpoint
        create = flow.metadata.get(RESPONSES_CREATE_KEY)
        if getattr(create, "native_endpoint", None):
            return True  # a state call sent to the configured endpoint that owns the response
        # The recorder answers it (LlmRecordTap, after the translator); a flow pointed at the
        # relay (a paced replay, a served socket) is told by its target.
        return replay_hit(flow)


def answer_locally(flow: http.HTTPFlow, answer: LocalAnswer) -> None:
    request = flow.request
    logger.info(
        "llmitm: egress local: %s %s%s — %s",
        request.method,
        request.pretty_host,
        request.path.partition("?")[0],
        answer.reason,
    )
    flow.response = http.Response.make(
        answer.status, answer.body, [(k.encode(), v.encode()) for k, v in answer.headers]
    )


def _answer_for(request: http.Request) -> LocalAnswer:
    headers = {name: request.headers.get(name, "") for name in ("content-type", "upgrade")}
    return local_answer(request.method, request.pretty_host, request.path, headers)
