"""End a directly forwarded stream whose upstream went silent.

On the direct path mitmproxy forwards a routed stream itself and waits for the upstream's
next bytes as long as the connection stays open (``tcp_timeout``, 10 minutes, then a bare
close). For each such stream this addon sets one timer (:class:`_Watch`): when the stream
callable has seen no chunk for the route's ``stream_idle_timeout``, it notes the stall on the
flow and closes the upstream side of the connection. mitmproxy then meets a body cut short, and
:mod:`llmitm.addons.patches.cut_streams` ends the client's stream with a terminal error in its
protocol; the router counts the cut against the endpoint's health.

A stream no route matched, which llmitm relays as it is, is bounded too, by the global
``stream_idle_timeout``: when its path names a create call's API (``wire.paths.classify_path``)
its owner gets a :class:`~llmitm.translate.guard.StreamGuard` of that API before the first
chunk (bytes relayed untouched), which ends a stalled stream with a terminal error in that
protocol — an upstream's own cut still reaches the client as it is; on other paths a stall
closes the client's connection.

The hot path pays one assignment per chunk (the rewriter's ``last`` timestamp); the
watchdog's timer fires at the earliest moment a stall could be due and reads that timestamp.
Relayed streams are bounded inside the relay (``relay_body(idle=...)``) and are not watched.

Closing one server connection goes through mitmproxy's connection handler
(:mod:`llmitm.addons.patches.connections`); when the registry is not as expected the flow is
killed instead, which still frees everything it holds.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable
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
        watch = _Watch(flow, state, stream, idle, self._stalled)
        self._watches[flow.id] = watch
        watch.arm(asyncio.get_running_loop())

    def response(self, flow: http.HTTPFlow) -> None:
        self._stop(flow)

    def error(self, flow: http.HTTPFlow) -> None:
        self._stop(flow)

    def done(self) -> None:
        for watch in self._watches.values():
            watch.cancel()
        self._watches.clear()

    def _stop(self, flow: http.HTTPFlow) -> None:
        watch = self._watches.pop(flow.id, None)
        if watch is not None:
            watch.cancel()

    def _stalled(self, watch: _Watch) -> None:
        flow, stream = watch.flow, watch.stream
        message = stall_message(watch.idle)
        logger.warning(
            "llmitm: %s: %s; ending the client's stream with an error in its protocol",
            flow.request.pretty_url,
            message,
        )
        if watch.state is not None:
            watch.state.upstream_cut = message
        elif isinstance(stream.pipeline, StreamGuard):
            stream.relays_as_is = False  # the guard ends it with its API's terminal error
        self._watches.pop(flow.id, None)
        close_server_side(flow)


class _Watch:
    """One stream's watchdog: a timer at the earliest moment the stream could have stalled,
    set again from the last chunk's time while chunks keep coming. A timer rather than a
    task: a task sleeping in a coroutine held ~1.5 KiB (the task, its frame, its future and
    context, its name) for every open stream."""

    __slots__ = ("flow", "handle", "idle", "on_stall", "state", "stream")

    def __init__(
        self,
        flow: http.HTTPFlow,
        state: FlowState | None,
        stream: StreamRewriter,
        idle: float,
        on_stall: Callable[[_Watch], None],
    ) -> None:
        self.flow = flow
        self.state = state
        self.stream = stream
        self.idle = idle
        self.on_stall = on_stall
        self.handle: asyncio.TimerHandle | None = None

    def arm(self, loop: asyncio.AbstractEventLoop) -> None:
        silent = monotonic() - self.stream.last
        self.handle = loop.call_later(max(0.0, self.idle - silent), self._check, loop)

    def cancel(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None

    def _check(self, loop: asyncio.AbstractEventLoop) -> None:
        self.handle = None
        if not self.flow.live:
            return
        if monotonic() - self.stream.last < self.idle:
            self.arm(loop)
            return
        self.on_stall(self)


def close_server_side(flow: http.HTTPFlow) -> None:
    """Close the flow's upstream connection, so mitmproxy sees the body end early."""
    if not connections.close_server_side(flow):
        logger.debug("llmitm: cannot close the upstream of %s; killing it", flow.id)
        if flow.killable:
            flow.kill()
