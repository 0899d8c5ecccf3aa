"""End a directly forwarded stream whose upstream went silent.

On the direct path mitmproxy forwards a routed stream itself and waits for the upstream's
next bytes as long as the connection stays open (``tcp_timeout``, 10 minutes, then a bare
close). For each such stream this addon runs one watchdog task: when the stream callable has
seen no chunk for the route's ``stream_idle_timeout``, it notes the stall on the flow and
closes the upstream side of the connection. mitmproxy then meets a body cut short, and
:mod:`llmitm.addons.patches.cut_streams` ends the client's stream with a terminal error in its
protocol; the router counts the cut against the endpoint's health.

The hot path pays one assignment per chunk (the rewriter's ``last`` timestamp); the
watchdog sleeps until the earliest moment a stall could be due and reads that timestamp.
Relayed streams are bounded inside the relay (``relay_body(idle=...)``) and are not watched.

Closing one server connection goes through mitmproxy's connection handler
(:mod:`llmitm.addons.patches.connections`); when the registry is not as expected the flow is
killed instead, which still frees everything it holds.
"""

from __future__ import annotations

import asyncio
import logging
import math
from time import monotonic

from mitmproxy import http

from llmitm.addons.patches import connections
from llmitm.addons.settings import LlmitmSettings
from llmitm.addons.state import FlowState, flow_state
from llmitm.exchange.stream import StreamRewriter
from llmitm.routing.config import stream_idle_limit

logger = logging.getLogger(__name__)


def stall_message(idle: float) -> str:
    return f"the upstream sent nothing for {idle:g} s"


class LlmStallWatch:
    name = "llmitm_stall_watch"

    def __init__(self, settings: LlmitmSettings) -> None:
        self.settings = settings
        self._watches: dict[str, asyncio.Task[None]] = {}

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        state = flow_state(flow)
        response = flow.response
        if not isinstance(state, FlowState) or response is None or not state.streamed:
            return
        routed = state.routed
        stream = response.stream
        if routed is None or routed.relayed or not isinstance(stream, StreamRewriter):
            return
        idle = stream_idle_limit(self.settings.config, routed.route)
        if math.isinf(idle):
            return  # the limit was lifted (llmitm_stream_idle_timeout < 0)
        self._watches[flow.id] = asyncio.get_running_loop().create_task(
            self._watch(flow, state, stream, idle), name=f"llmitm stall watch {flow.id}"
        )

    def response(self, flow: http.HTTPFlow) -> None:
        self._stop(flow)

    def error(self, flow: http.HTTPFlow) -> None:
        self._stop(flow)

    def done(self) -> None:
        for task in self._watches.values():
            task.cancel()
        self._watches.clear()

    def _stop(self, flow: http.HTTPFlow) -> None:
        task = self._watches.pop(flow.id, None)
        if task is not None:
            task.cancel()

    async def _watch(
        self, flow: http.HTTPFlow, state: FlowState, stream: StreamRewriter, idle: float
    ) -> None:
        while flow.live:
            silent = monotonic() - stream.last
            if silent < idle:
                await asyncio.sleep(idle - silent)
                continue
            message = stall_message(idle)
            logger.warning(
                "llmitm: %s: %s; ending the client's stream with an error in its protocol",
                flow.request.pretty_url,
                message,
            )
            state.upstream_cut = message
            self._watches.pop(flow.id, None)
            close_server_side(flow)
            return


def close_server_side(flow: http.HTTPFlow) -> None:
    """Close the flow's upstream connection, so mitmproxy sees the body end early."""
    if not connections.close_server_side(flow):
        logger.debug("llmitm: cannot close the upstream of %s; killing it", flow.id)
        if flow.killable:
            flow.kill()
