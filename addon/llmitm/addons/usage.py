"""Token usage accounting: one ``UsageRecord`` per planned flow whose upstream reported usage.

Written in ``response``, which mitmproxy runs after a stream's last chunk has gone through
the rewriter; the write goes through the store's queue and is never awaited here. A chat stream
relayed unchanged whose client did not ask for ``stream_options.include_usage`` is accounted
too: the router asked the upstream for the usage chunk and the stream guard strips it.

A stream that ends in ``error`` is accounted as well when its upstream had reported usage by
then: a client may hang up as soon as it has the last event (the openai SDK stops reading a
chat stream at ``[DONE]``, before the upstream's body has ended, and mitmproxy then ends the
flow with "Client disconnected"), and the tokens are spent all the same. A flow that ends
without usage (an error status, a stream cut or aborted before its usage, an endpoint with
``stream_usage = false``) is not recorded: the table holds only what an upstream reported.
Such flows are counted in ``without_usage``. The endpoint is the one that answered (after
failover, not the route's first).
"""

from __future__ import annotations

import logging

from mitmproxy import http

from llmitm.addons.state import FlowState, flow_state
from llmitm.addons.store import LlmStore
from llmitm.addons.streams import stream_outcome
from llmitm.exchange.usage import Tokens, body_tokens, stream_tokens, usage_record

logger = logging.getLogger(__name__)


def flow_tokens(flow: http.HTTPFlow, state: FlowState) -> Tokens | None:
    response = flow.response
    if response is None or response.status_code >= 400:
        return None
    if state.streamed:
        outcome = stream_outcome(flow)
        return stream_tokens(outcome) if outcome is not None else None
    return body_tokens(response.get_content(strict=False))


class LlmUsage:
    name = "llmitm_usage"

    def __init__(self, store: LlmStore) -> None:
        self.store = store
        self.recorded = 0
        self.without_usage = 0

    def response(self, flow: http.HTTPFlow) -> None:
        state = flow_state(flow)
        if isinstance(state, FlowState):
            self._account(flow, state)

    def error(self, flow: http.HTTPFlow) -> None:
        state = flow_state(flow)
        if isinstance(state, FlowState) and state.streamed:
            self._account(flow, state)

    def _account(self, flow: http.HTTPFlow, state: FlowState) -> None:
        if state.accounted:
            return
        state.accounted = True
        try:
            tokens = flow_tokens(flow, state)
        except Exception:  # accounting must never cost the client its answer
            logger.exception("llmitm: failed to read the usage of %s", flow.request.pretty_url)
            return
        if tokens is None:
            self.without_usage += 1
            logger.debug("llmitm: %s: no usage to record", flow.request.pretty_url)
            return
        self.recorded += 1
        self.store.submit(
            usage_record(
                tokens,
                endpoint=state.plan.endpoint.name,
                model=state.context.model or "",
                route=state.plan.route,
            )
        )
