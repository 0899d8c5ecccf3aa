"""End a rewritten stream in the client's protocol when its upstream is cut mid-body.

mitmproxy 12 answers an upstream that dies mid-stream (connection reset, broken chunked
framing) by closing the client's connection: the client sees a transport error, not an error
in its API, and Codex or the openai SDK cannot tell it from a network hiccup. This module
teaches mitmproxy's ``HttpStream`` one thing: when the upstream side of a flow fails while
llmitm's :class:`~llmitm.exchange.stream.StreamRewriter` is streaming its body, end the
message as if the upstream had finished. The rewriter is then called with ``b""`` as at any
end, sees no terminal event, and appends one in the client's protocol (an error chunk and
``[DONE]``; ``error`` + ``response.failed``); the client's connection stays healthy — for
HTTP/1, HTTP/2 and TLS clients alike, since mitmproxy's own client layer frames it.

It replaces a private mitmproxy method, so it is applied only once, only changes flows whose
stream llmitm rewrites, and is pinned by ``mitmproxy < 13`` and by the end-to-end test of a
cut stream, which fails if an upgrade changes the method it wraps.
"""

from __future__ import annotations

import logging
from collections.abc import Generator
from typing import Any

from mitmproxy.proxy.layers.http import HttpStream
from mitmproxy.proxy.layers.http._events import ResponseEndOfMessage, ResponseProtocolError

from llmitm.addons.state import flow_state
from llmitm.exchange.stream import StreamRewriter

logger = logging.getLogger(__name__)

_original = HttpStream.handle_protocol_error


def _handle_protocol_error(self: Any, event: Any) -> Generator[Any, Any, None]:
    flow = self.flow
    if (
        isinstance(event, ResponseProtocolError)
        and self.server_state == self.state_stream_response_body
        and flow.response is not None
        and isinstance(flow.response.stream, StreamRewriter)
    ):
        logger.warning(
            "llmitm: %s: the upstream stream was cut (%s); ending the client's stream with "
            "an error in its protocol",
            flow.request.pretty_url,
            event.message,
        )
        state = flow_state(flow)
        if state is not None:
            state.upstream_cut = event.message
        yield from self.state_stream_response_body(ResponseEndOfMessage(self.stream_id))
        return
    yield from _original(self, event)


def install() -> None:
    """Apply once per process (mitmproxy may load the addons more than once)."""
    if HttpStream.handle_protocol_error is not _handle_protocol_error:
        HttpStream.handle_protocol_error = _handle_protocol_error  # type: ignore[method-assign]
