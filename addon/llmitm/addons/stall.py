"""End a directly forwarded stream whose upstream went silent.

On the direct path mitmproxy forwards a routed stream itself and waits for the upstream's
next bytes as long as the connection stays open (``tcp_timeout``, 10 minutes, then a bare
close). For each such stream this addon runs one watchdog task: when the stream callable has
seen no chunk for the route's ``stream_idle_timeout``, it notes the stall on the flow and
closes the upstream side of the connection. mitmproxy then meets a body cut short, and
:mod:`llmitm.addons.patches.cut_streams` ends the client's stream with a terminal error in its
protocol; the router counts the cut against the endpoint's health.

A stream no route matched, which llmitm relays as it is, is bounded too, by the global
``stream_idle_timeout``: when its path names a create call's API (``wire.paths.classify_path``)
its owner gets a :class:`~llmitm.translate.guard.StreamGuard` of that API before the first
chunk (bytes relayed untouched), which ends a stalled stream with a terminal error in that
protocol — an upstream's own cut still reaches the client as it is; on other paths a stall
closes the client's connection.

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
from llmitm.addons.stream_translator import is_event_stream
from llmitm.addons.streams import flow_stream
from llmitm.exchange.stream import StreamRewriter
from llmitm.routing.config import stream_idle_limit
from llmitm.translate.guard import StreamGuard
from llmitm.wire.paths import classify_path, is_llm_call

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
        if response is None:
            return
        if state is None:
            self._watch_unrouted(flow, response)
            return
        if not state.streamed:
            return
        routed = state.routed
        stream = response.stream
        if routed is None or routed.relayed or not isinstance(stream, StreamRewriter):
            return
        idle = stream_idle_limit(self.settings.config, routed.route)
        if math.isinf(idle):
            return  # the limit was lifted (llmitm_stream_idle_timeout < 0)
        self._start(flow, state, stream, idle)

    def _watch_unrouted(self, flow: http.HTTPFlow, response: http.Response) -> None:
        """An LLM call's SSE no route matched: guarded (when its API is known) and watched."""
        if response.stream is not True or response.status_code >= 400:
            return  # buffered, or streamed by an addon outside llmitm
        if not is_llm_call(flow.request.path) or not is_event_stream(response):
            return
        idle = self.settings.config.routing.stream_idle_timeout
        if math.isinf(idle):
            return
        stream = flow_stream(flow)
        assert stream is not None  # a stream that was True gets a rewriter
        classified = classify_path(flow.request.path)
        if classified is not None:
            stream.translate_with(StreamGuard(classified.api))
            # Still relayed as it is for everyone else: an upstream's own cut stays the
            # client's to see, and the Responses state writer keeps reading the raw chunks.
            # Only a stall this watch ends is answered by the guard (``_watch``).
            stream.relays_as_is = True
        self._start(flow, None, stream, idle)

    def _start(
        self, flow: http.HTTPFlow, state: FlowState | None, stream: StreamRewriter, idle: float
    ) -> None:
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
        self, flow: http.HTTPFlow, state: FlowState | None, stream: StreamRewriter, idle: float
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
            if state is not None:
                state.upstream_cut = message
            elif isinstance(stream.pipeline, StreamGuard):
                stream.relays_as_is = False  # the guard ends it with its API's terminal error
            self._watches.pop(flow.id, None)
            close_server_side(flow)
            return


def close_server_side(flow: http.HTTPFlow) -> None:
    """Close the flow's upstream connection, so mitmproxy sees the body end early."""
    if not connections.close_server_side(flow):
        logger.debug("llmitm: cannot close the upstream of %s; killing it", flow.id)
        if flow.killable:
            flow.kill()
