"""Bound the wait for a directly forwarded call's answer head by ``first_byte_timeout``.

On the direct path mitmproxy sends the request and waits for the upstream's head as long as
the connection stays open (``tcp_timeout``, minutes). For each routed flow mitmproxy forwards
itself, this addon runs one timer from the end of the ``request`` hooks (after the router's
slot wait): when no head has come within the route's ``first_byte_timeout``, it notes the
timeout on the flow and closes the upstream side of the connection. mitmproxy then meets an
upstream failure before the head, and :mod:`llmitm.addons.patches.cut_streams` answers the
504 ``upstream_timeout`` error of :func:`timeout_answer` (the failover job's answer to the
same ending); the router counts a ``timeout`` against the endpoint's health.

Relayed flows are bounded inside the relay and not watched; a stream once begun is the stall
watch's (:mod:`llmitm.addons.stall`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time

from mitmproxy import http

from llmitm.addons.patches import connections
from llmitm.addons.settings import LlmitmSettings
from llmitm.addons.state import FlowState, flow_state
from llmitm.routing.attempts import AttemptsError
from llmitm.routing.first_byte import first_byte_error, first_byte_limit, first_byte_message

logger = logging.getLogger(__name__)


class LlmFirstByteWatch:
    name = "llmitm_first_byte_watch"

    def __init__(self, settings: LlmitmSettings) -> None:
        self.settings = settings
        self._timers: dict[str, asyncio.TimerHandle] = {}

    def request(self, flow: http.HTTPFlow) -> None:
        if flow.response or flow.error or not flow.live:
            return
        state = flow_state(flow)
        routed = state.routed if state is not None else None
        if state is None or routed is None or routed.relayed or routed.endpoint is None:
            return  # not forwarded by mitmproxy to a routed endpoint
        limit = first_byte_limit(self.settings.config, routed.route)
        if math.isinf(limit):
            return
        self._timers[flow.id] = asyncio.get_running_loop().call_later(
            limit, self._expire, flow, state, limit
        )

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        self._stop(flow)

    def response(self, flow: http.HTTPFlow) -> None:
        self._stop(flow)

    def error(self, flow: http.HTTPFlow) -> None:
        self._stop(flow)

    def done(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()

    def _stop(self, flow: http.HTTPFlow) -> None:
        timer = self._timers.pop(flow.id, None)
        if timer is not None:
            timer.cancel()

    def _expire(self, flow: http.HTTPFlow, state: FlowState, limit: float) -> None:
        self._timers.pop(flow.id, None)
        if not flow.live or flow.response is not None or flow.error is not None:
            return
        state.head_timeout = first_byte_message(limit)
        logger.warning(
            "llmitm: %s: %s; answering 504 upstream_timeout",
            flow.request.pretty_url,
            state.head_timeout,
        )
        if not connections.close_server_side(flow) and flow.killable:
            flow.kill()  # the registry is not as expected: still frees what the flow holds


def timeout_answer(flow: http.HTTPFlow) -> AttemptsError | None:
    """The client's answer when this addon ended the wait for the head (``None``: it did not)."""
    state = flow_state(flow)
    if state is None or state.head_timeout is None:
        return None
    model = state.routed.model if state.routed is not None else None
    started = flow.request.timestamp_start
    return first_byte_error(
        state.plan.endpoint.name, state.head_timeout, started, time.time(), model
    )
