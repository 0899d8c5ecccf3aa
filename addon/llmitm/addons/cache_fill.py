"""The response cache's back half, after the stream translator: keeps the client's answer of
a miss once it ends complete, and accounts a hit (see :mod:`llmitm.addons.cache`)."""

from __future__ import annotations

import logging
import time

from mitmproxy import http

from llmitm.addons.cache import CACHE_ENDPOINT, PENDING, LlmCacheLookup, Pending
from llmitm.addons.record.flows import fields
from llmitm.addons.state import FlowState, flow_state
from llmitm.addons.store import LlmStore
from llmitm.addons.streams import flow_stream, stream_outcome
from llmitm.exchange.usage import body_tokens, stream_tokens, usage_record
from llmitm.replay import cache
from llmitm.replay.serve import FRAMING
from llmitm.replay.tap import StreamTap

logger = logging.getLogger(__name__)

_NOT_KEPT = FRAMING | {cache.HEADER}


class LlmCacheFill:
    """Keeps complete answers of misses; accounts hits."""

    name = "llmitm_cache_fill"

    def __init__(self, lookup: LlmCacheLookup, store: LlmStore) -> None:
        self.lookup = lookup
        self.store = store

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        pending = PENDING.get(flow)
        response = flow.response
        if pending is None or pending.hit is not None or response is None:
            return
        response.headers[cache.HEADER] = pending.decision.label
        if not pending.decision.write:
            return
        stream = flow_stream(flow)
        if stream is not None:
            pending.tap = tap = StreamTap()
            stream.add_note(tap.note)

    def response(self, flow: http.HTTPFlow) -> None:
        pending = PENDING.get(flow)  # kept: the metrics, after this, ask whether it was a hit
        if pending is None:
            return
        try:
            if pending.hit is not None:
                self._account_hit(pending, pending.hit)
            elif pending.decision.write:
                self._fill(flow, pending)
        except Exception:
            logger.exception("llmitm: cache fill failed for %s", flow.request.pretty_url)

    def error(self, flow: http.HTTPFlow) -> None:
        # A stream whose terminal event was relayed is whole even if the flow then ends in an
        # error: the openai SDK closes a chat stream at ``[DONE]``, and when the body's end
        # comes a moment later mitmproxy ends the flow as "client disconnected". Anything cut
        # before its terminal event fails ``answer_complete`` and is never kept.
        pending = PENDING.pop(flow, None)
        if pending is None or pending.hit is not None or pending.tap is None:
            return
        if pending.decision.write:
            try:
                self._fill(flow, pending)
            except Exception:
                logger.exception("llmitm: cache fill failed for %s", flow.request.pretty_url)

    def _fill(self, flow: http.HTTPFlow, pending: Pending) -> None:
        response = flow.response
        if response is None or (flow.error is not None and pending.tap is None):
            return
        state = flow_state(flow)
        planned = state if isinstance(state, FlowState) else None
        if planned is not None and planned.upstream_cut is not None:
            return
        tap = pending.tap
        if tap is not None:
            kept = tap.finish().unpack()
            _sizes, body = kept.client or kept.upstream
            outcome = stream_outcome(flow)
            tokens = stream_tokens(outcome) if outcome is not None else None
        else:
            if response.stream:
                return  # streamed by something that is not llmitm's: nothing was kept
            body = response.get_content(strict=False) or b""
            tokens = body_tokens(body)
        status = response.status_code
        if not cache.answer_complete(pending.api, pending.stream, status, body):
            return
        headers = [(k, v) for k, v in fields(response.headers) if k.lower() not in _NOT_KEPT]
        endpoint = ""
        if planned is not None:
            routed = planned.routed
            endpoint = (routed.endpoint if routed is not None else None) or (
                planned.plan.endpoint.name
            )
        settings = pending.decision.settings
        private = cache.holds_sealed_reasoning(body)
        entry = cache.Entry(
            status=status,
            headers=headers,
            body=cache.marked_body(pending.stream, body),
            expires=time.monotonic() + pending.decision.ttl,
            credential=pending.credential,
            private=private,
            tokens=tokens,
            model=pending.model,
            endpoint=endpoint,
        )
        key = pending.keys[1] if private else pending.keys[0]
        self.lookup.cache.put(pending.route, key, entry, settings.max_entries)

    def _account_hit(self, pending: Pending, entry: cache.Entry) -> None:
        if entry.tokens is None:
            return
        input_tokens, _cached, output, reasoning = entry.tokens
        self.store.submit(
            usage_record(
                (input_tokens, input_tokens, output, reasoning),
                endpoint=CACHE_ENDPOINT,
                model=entry.model,
                route=pending.route,
            )
        )
