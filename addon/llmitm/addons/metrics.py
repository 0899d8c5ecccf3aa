"""``GET /_llmitm/metrics``: llmitm's metrics in Prometheus's text format.

Each create call adds its facts once, when its flow ends (``response`` or ``error``), from what
llmitm already knows then: the plan, the per-flow facts (attempts), the stream owner's outcome
(usage) or the body, and mitmproxy's timestamps. A streamed call's time to first chunk comes
from a watcher on its stream owner that notes the first chunk's time and then steps aside for
a C builtin, so later chunks cost one C call. Gauges (health, cooldowns, concurrency, queue,
replay hits and misses) are read from routing and the recorder when scraped.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import orjson
from mitmproxy import http

from llmitm.addons.access import addressed_to_llmitm
from llmitm.addons.cache import CACHE_ENDPOINT, cache_hit
from llmitm.addons.record import LlmFlowRecorder, replay_hit
from llmitm.addons.router import LlmRouter
from llmitm.addons.state import FlowState, flow_state
from llmitm.addons.stream_translator import FACTS_KEY
from llmitm.addons.streams import flow_stream, stream_outcome
from llmitm.exchange.stream import StreamRewriter
from llmitm.observe.metrics import (
    CONTENT_TYPE,
    PROVIDERS,
    CallFacts,
    Metrics,
    ProxyState,
    proxy_state,
)
from llmitm.replay.cache import ResponseCache
from llmitm.wire.paths import classify_path
from llmitm.wire.usage import usage_tokens

logger = logging.getLogger(__name__)

METRICS_PATH = "/_llmitm/metrics"


class _FirstChunk:
    """Notes when a stream's first chunk arrives, then stops watching (the stream's other
    chunks then cost it nothing)."""

    __slots__ = ("at", "number", "rewriter")

    def __init__(self, rewriter: StreamRewriter) -> None:
        self.at: float | None = None
        self.rewriter = rewriter
        self.number = rewriter.watch(self)

    def __call__(self, data: bytes) -> None:
        self.at = time.time()  # mitmproxy's timestamps are epoch seconds
        self.rewriter.unwatch(self.number)


_FIRST_CHUNKS: weakref.WeakKeyDictionary[http.HTTPFlow, _FirstChunk] = weakref.WeakKeyDictionary()


class LlmMetrics:
    """Measures each create call when its flow ends (after the stream translator)."""

    name = "llmitm_metrics"

    def __init__(
        self, router: LlmRouter, recorder: LlmFlowRecorder, cache: ResponseCache | None = None
    ) -> None:
        self.router = router
        self.recorder = recorder
        self.cache = cache
        self.metrics = Metrics()
        self.sinks: list[Callable[[http.HTTPFlow, CallFacts], None]] = []
        """Others that want each call's facts (traces)."""

    def state(self) -> ProxyState:
        """Routing's and the recorder's numbers now (on the event loop, where they change)."""
        report = self.recorder.report
        snapshot = self.router.routing.snapshot(time.monotonic())
        state = proxy_state(snapshot, report.hits, len(report.misses))
        if self.cache is not None:
            stats = self.cache.stats
            state = replace(
                state,
                cache_hits=stats.hits,
                cache_misses=stats.misses,
                cache_entries=len(self.cache),
            )
        return state

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        response = flow.response
        if response is None or not response.stream or not _is_call(flow):
            return
        rewriter = flow_stream(flow)
        if rewriter is not None:
            _FIRST_CHUNKS[flow] = _FirstChunk(rewriter)

    def response(self, flow: http.HTTPFlow) -> None:
        self._observe(flow)

    def error(self, flow: http.HTTPFlow) -> None:
        self._observe(flow)

    def _observe(self, flow: http.HTTPFlow) -> None:
        if not _is_call(flow):
            return
        try:
            facts = call_facts(flow, _FIRST_CHUNKS.pop(flow, None))
        except Exception:  # metrics must never cost the client its answer
            logger.exception("llmitm: failed to measure %s", flow.request.pretty_url)
            return
        self.metrics.observe(facts)
        for sink in self.sinks:
            try:
                sink(flow, facts)
            except Exception:
                logger.exception("llmitm: failed to report %s", flow.request.pretty_url)


class LlmMetricsEndpoint:
    """Serves the scrape, before the recorder and egress could answer it as foreign."""

    name = "llmitm_metrics_endpoint"

    def __init__(self, measured: LlmMetrics) -> None:
        self.measured = measured

    def request(self, flow: http.HTTPFlow) -> Awaitable[None] | None:
        if flow.response or flow.error or not flow.live:
            return None
        request = flow.request
        if request.method != "GET" or request.path.partition("?")[0] != METRICS_PATH:
            return None
        if not addressed_to_llmitm(flow):
            return None
        return self._scrape(flow)

    async def _scrape(self, flow: http.HTTPFlow) -> None:
        # Rendering costs ~1.7 ms per model, endpoint and API seen: off the event loop, so
        # streams keep going during a scrape.
        state = self.measured.state()
        text = await asyncio.to_thread(self.measured.metrics.exposition, state)
        flow.response = http.Response.make(
            200, text, {"content-type": CONTENT_TYPE, "cache-control": "no-store"}
        )


def _is_call(flow: http.HTTPFlow) -> bool:
    """A create call: routed (a relayed one's request now names the relay), or by its path."""
    if flow_state(flow) is not None:
        return True
    return flow.request.method == "POST" and classify_path(flow.request.path) is not None


def call_facts(flow: http.HTTPFlow, first: _FirstChunk | None) -> CallFacts:
    """What the finished create call ``flow`` was."""
    request, response = flow.request, flow.response
    state = flow_state(flow)
    started = request.timestamp_start
    ended = (response.timestamp_end if response is not None else None) or time.time()
    facts = flow.metadata.get(FACTS_KEY) or {}
    usage, response_model = _answer_facts(flow, state)
    tokens = usage_tokens(usage)
    if isinstance(state, FlowState):
        plan = state.plan
        api, provider, route = plan.client_api, PROVIDERS[plan.endpoint.kind], plan.route
        request_model = state.context.model or plan.upstream_model
        endpoint = (state.routed.endpoint if state.routed else plan.endpoint.name) or "llmitm"
        response_model = response_model or plan.upstream_model
    else:
        classified = classify_path(request.path)
        assert classified is not None  # _is_call
        api, provider, route = classified.api, "", ""
        request_model = _request_model(request) or classified.deployment or ""
        # Unrouted: forwarded as it was, or answered by llmitm without an upstream.
        forwarded = flow.server_conn.timestamp_start is not None
        endpoint = "passthrough" if forwarded else "llmitm"
    if replay_hit(flow):
        endpoint = "replay"
    elif cache_hit(flow):
        endpoint = CACHE_ENDPOINT
    attempts = facts.get("attempts", 1)
    return CallFacts(
        api=api,
        provider=provider or _provider_of_host(request.pretty_host),
        endpoint=endpoint,
        request_model=request_model,
        response_model=response_model or request_model,
        route=route,
        duration=max(0.0, ended - started) if started else None,
        first_chunk=max(0.0, first.at - started) if first and first.at and started else None,
        input_tokens=tokens[0] if tokens else None,
        output_tokens=tokens[2] if tokens else None,
        error_type=_error_type(flow, state),
        attempts=attempts if isinstance(attempts, int) else 1,
    )


def _answer_facts(flow: http.HTTPFlow, state: FlowState | None) -> tuple[Any, str | None]:
    """The answer's usage and model: from the stream owner's outcome, or the body."""
    response = flow.response
    if response is None or response.status_code >= 400:
        return None, None
    outcome = stream_outcome(flow)
    if outcome is not None:
        final = outcome.final_response or {}
        model = final.get("model")
        return outcome.usage, model if isinstance(model, str) else None
    content = response.get_content(strict=False)
    if not content or not content.lstrip().startswith(b"{"):
        return None, None
    try:
        body = orjson.loads(content)
    except orjson.JSONDecodeError:
        return None, None
    if not isinstance(body, dict):
        return None, None
    model = body.get("model")
    return body.get("usage"), model if isinstance(model, str) else None


def _request_model(request: http.Request) -> str | None:
    try:
        body = orjson.loads(request.get_content(strict=False) or b"")
    except orjson.JSONDecodeError:
        return None
    model = body.get("model") if isinstance(body, dict) else None
    return model if isinstance(model, str) else None


def _provider_of_host(host: str) -> str:
    if host.endswith(".openai.azure.com"):
        return PROVIDERS["azure"]
    if host == "api.openai.com":
        return PROVIDERS["openai"]
    return PROVIDERS["compatible"]


def _error_type(flow: http.HTTPFlow, state: FlowState | None) -> str:
    if flow.error is not None:
        return "aborted"
    if isinstance(state, FlowState) and state.upstream_cut is not None:
        return "cut"
    response = flow.response
    if response is not None and response.status_code >= 400:
        return str(response.status_code)
    return ""
