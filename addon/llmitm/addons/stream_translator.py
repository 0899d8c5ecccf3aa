"""Turn the upstream's answer into the client's: streams through a per-flow rewriter installed
in ``responseheaders`` (with framing fixed), whole bodies and errors in ``response``."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from mitmproxy import ctx, http
from mitmproxy.addonmanager import Loader

from llmitm.addons.delta_folder import DeltaFolder
from llmitm.addons.patches.coalesce import coalesce_client_writes
from llmitm.addons.patches.headers import indexed_headers
from llmitm.addons.state import FlowState, Routed, flow_state
from llmitm.exchange.response import stream_pipeline, translate_body
from llmitm.exchange.stream import StreamRewriter, decoder_for
from llmitm.routing.plan import CREDENTIAL_HEADERS

logger = logging.getLogger(__name__)


def is_event_stream(response: http.Response) -> bool:
    return response.headers.get("content-type", "").lower().startswith("text/event-stream")


def _refuse(reason: str) -> Callable[[bytes], bytes]:
    def refuse(_data: bytes) -> bytes:
        raise ValueError(reason)

    return refuse


def redact_credentials(flow: http.HTTPFlow, state: FlowState) -> None:
    """The request has gone upstream: replace the injected key on the flow, and any client
    credential still on it (a relayed flow keeps the client's headers), so mitmdump's
    output, mitmweb and saved flows never show either."""
    endpoint = state.plan.endpoint
    if not endpoint.api_key:
        return  # the client's own key went upstream; the flow shows what was sent
    headers = flow.request.headers
    for name in CREDENTIAL_HEADERS:
        if name in headers and name != endpoint.auth_header:
            headers[name] = "<redacted: client credential>"
    if endpoint.auth_header in headers:
        headers[endpoint.auth_header] = f"<redacted: ${endpoint.api_key_env}>"


def _adopt_winner(state: FlowState, routed: Routed) -> None:
    """A relayed flow: take the plan of the endpoint that answered (candidates may speak
    different APIs, so the translator depends on it)."""
    assert routed.job is not None
    result = routed.job.result
    routed.attempts = result.attempts
    routed.overhead += result.overhead
    routed.endpoint = result.endpoint
    routed.upstream_request = result.request
    if result.endpoint is not None:
        state.plan, state.context, state.strip_usage = routed.candidates[result.endpoint]


FACTS_KEY = "llmitm_facts"
"""``flow.metadata`` key of the per-flow facts as plain data (for saved flows, the console
and recordings, which cannot keep llmitm's objects)."""


def set_facts(flow: http.HTTPFlow, routed: Routed, extra: float) -> None:
    """The per-flow facts as response headers and metadata. On a streamed flow mitmproxy
    looks the headers up for every chunk; :func:`indexed_headers` keeps that a dict lookup
    however many there are."""
    assert flow.response is not None
    routed.overhead += extra
    endpoint = routed.endpoint or "llmitm"
    overhead_ms = round(routed.overhead * 1000, 2)
    headers = flow.response.headers
    headers["x-llmitm-endpoint"] = endpoint
    headers["x-llmitm-attempts"] = str(routed.attempts)
    headers["x-llmitm-overhead-ms"] = f"{overhead_ms:.2f}"
    flow.metadata[FACTS_KEY] = {
        "endpoint": endpoint,
        "attempts": routed.attempts,
        "overhead_ms": overhead_ms,
        "route": routed.route.name,
    }


class LlmStreamTranslator:
    name = "llmitm_stream_translator"

    def __init__(self) -> None:
        self.folder = DeltaFolder()
        """Joins what live normalised Responses streams hold for their closing events."""

    def done(self) -> None:
        self.folder.stop()

    def load(self, loader: Loader) -> None:
        loader.add_option(
            "llmitm_batch_writes",
            bool,
            True,
            "Send a streamed response's events that were read from the upstream together in "
            "one write to the client instead of one write each (fewer system calls and client "
            "wake-ups; nothing waits for data that has not arrived).",
        )

    def _stream_started(self, flow: http.HTTPFlow) -> None:
        if ctx.options.llmitm_batch_writes:
            coalesce_client_writes(flow)

    def error(self, flow: http.HTTPFlow) -> None:
        state = flow_state(flow)
        if state is not None:
            redact_credentials(flow, state)

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        response = flow.response
        if response is None:
            return
        state = flow_state(flow)
        if state is not None:
            redact_credentials(flow, state)
        if state is None:
            if is_event_stream(response) and not response.stream:
                response.stream = True  # relay SSE live instead of buffering it whole
                self._stream_started(flow)
            return
        started = time.perf_counter()
        routed = state.routed
        if routed is not None:
            if routed.job is not None:
                _adopt_winner(state, routed)
            if routed.relayed:
                # The relay closes its own connection after each answer; that is hop-by-hop
                # and must not make mitmproxy close the client's keep-alive connection.
                response.headers.pop("connection", None)
            set_facts(flow, routed, time.perf_counter() - started)
            if routed.endpoint is None:
                return  # llmitm's own error (no endpoint answered): already in OpenAI's shape
        else:
            response.headers["x-llmitm-endpoint"] = state.plan.endpoint.name
        if response.status_code >= 400 or not is_event_stream(response):
            return  # buffered; translated whole in response()
        state.streamed = True
        pipeline = stream_pipeline(state.plan, state.context, strip_usage=state.strip_usage)
        try:
            decode = decoder_for(response.headers.get("content-encoding"))
        except ValueError as exc:
            # Relaying bytes the client cannot read as its own API would be a silent wrong
            # answer: the rewriter's first call fails and ends the stream with this error.
            logger.error("llmitm: %s: %s", flow.request.url, exc)
            decode = _refuse(str(exc))
        owner = response.stream
        if isinstance(owner, StreamRewriter):
            owner.translate_with(pipeline, decode)  # keeps whoever watches it already
        else:
            response.stream = StreamRewriter(pipeline, decode)
        self._stream_started(flow)
        if getattr(pipeline, "holds_deltas", False):
            self.folder.add(pipeline)
        response.headers.pop("content-encoding", None)
        response.headers.pop("content-length", None)
        if flow.request.http_version.startswith("HTTP/1"):
            # Without framing an HTTP/1 client can only read to connection close.
            response.headers["transfer-encoding"] = "chunked"
        response.headers = indexed_headers(response.headers)

    def response(self, flow: http.HTTPFlow) -> None:
        state = flow_state(flow)
        response = flow.response
        if state is None or response is None or state.streamed:
            return
        if state.routed is not None and state.routed.endpoint is None:
            return  # llmitm answered itself (all attempts failed, or over the cap)
        try:
            translated = translate_body(
                response.status_code, response.get_content(strict=False), state.plan, state.context
            )
        except Exception:
            logger.exception("llmitm: failed to translate the response of %s", flow.request.url)
            return
        if translated is None:
            return
        status, content = translated
        response.status_code = status
        response.headers.pop("content-encoding", None)
        response.headers["content-type"] = "application/json"
        response.content = content
