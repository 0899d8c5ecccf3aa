"""End a rewritten stream in the client's protocol when its upstream is cut mid-body, and
answer an API call whose upstream failed before its head with an OpenAI-shaped error.

mitmproxy 12 answers an upstream that dies mid-stream (connection reset, broken chunked
framing) by closing the client's connection: the client sees a transport error, not an error
in its API, and Codex or the openai SDK cannot tell it from a network hiccup. This module
teaches mitmproxy's ``HttpStream`` one thing: when the upstream side of a flow fails while
llmitm's :class:`~llmitm.exchange.stream.StreamRewriter` is streaming its body, end the
message as if the upstream had finished. The rewriter is then called with ``b""`` as at any
end, sees no terminal event, and appends one in the client's protocol (an error chunk and
``[DONE]``; ``error`` + ``response.failed``); the client's connection stays healthy — for
HTTP/1, HTTP/2 and TLS clients alike, since mitmproxy's own client layer frames it.

Before the head has reached the client (the upstream refused the connection, reset it,
answered bytes that are not HTTP, or cut a plain body short), mitmproxy answers with its HTML
``502 Bad Gateway`` page. For an API call (``wire.paths.is_llm_call``) this module sends
:func:`~llmitm.wire.gateway_errors.gateway_error` as JSON instead, after the ``error`` hook
has run as usual (the router counts the failure, the recorder keeps the flow); the answer is
an ordinary response, so the client's keep-alive connection serves its next request. When
llmitm itself closed the upstream because no head came within ``first_byte_timeout``
(:mod:`llmitm.addons.first_byte`), the answer is that addon's 504 ``upstream_timeout``.

It replaces a method of mitmproxy's HTTP layer and builds events from its private
``proxy.layers.http._events`` module, so both are imported guarded: :func:`install` applies
the patch once per process, only changes API calls (and, mid-body, flows whose stream llmitm
rewrites), and when a name it needs is gone logs once and leaves mitmproxy's own behaviour in
place (a cut stream closes the client's connection; a failure before the head gets
mitmproxy's HTML 502 page). It is pinned by ``mitmproxy < 13`` and by the end-to-end tests of
cut and refused upstreams, which fail if an upgrade changes the method it wraps.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Generator
from typing import Any

import orjson
from mitmproxy import flow as mitmflow
from mitmproxy import http
from mitmproxy.connection import ConnectionState

from llmitm.addons.first_byte import timeout_answer
from llmitm.addons.patches.fallback import degrade
from llmitm.addons.state import flow_state
from llmitm.exchange.stream import StreamRewriter
from llmitm.wire.gateway_errors import gateway_error, gateway_error_body
from llmitm.wire.paths import is_llm_call

try:
    from mitmproxy.proxy.layers.http import DropStream, HttpErrorHook, HttpStream, SendHttp
    from mitmproxy.proxy.layers.http._events import (
        ErrorCode,
        ResponseData,
        ResponseEndOfMessage,
        ResponseHeaders,
        ResponseProtocolError,
    )

    _original = HttpStream.handle_protocol_error
    # The states and helpers the replacement calls, checked here rather than at a cut.
    for _name in ("state_stream_response_body", "state_done", "state_errored", "check_killed"):
        getattr(HttpStream, _name)
    MISSING: str | None = None
except (ImportError, AttributeError) as exc:  # renamed or moved in this mitmproxy
    MISSING = str(exc)

logger = logging.getLogger(__name__)

PATCH = "cut upstream streams"

_ANSWERS: weakref.WeakKeyDictionary[http.HTTPFlow, http.Response] = weakref.WeakKeyDictionary()
"""The JSON answer of a flow whose upstream failed before its answer reached the client,
from just before its ``error`` hook (which runs before the answer is sent) until the flow
is gone."""


def gateway_answer(flow: http.HTTPFlow) -> http.Response | None:
    """The response the client of ``flow`` gets. For an upstream that failed before its
    answer reached the client, that is llmitm's JSON error, known from the ``error`` hook
    on, where ``flow.response`` is still unset or the upstream's head of a body cut short
    (addons read it as what the upstream sent). The recorder keeps this one."""
    answer = _ANSWERS.get(flow)
    return flow.response if answer is None else answer


def _handle_protocol_error(self: Any, event: Any) -> Generator[Any, Any, None]:
    flow = self.flow
    if (
        isinstance(event, ResponseProtocolError)
        and self.server_state == self.state_stream_response_body
        and flow.response is not None
        and isinstance(flow.response.stream, StreamRewriter)
        and not flow.response.stream.relays_as_is
    ):
        logger.warning(
            "llmitm: %s: the upstream stream was cut (%s); ending the client's stream with "
            "an error in its protocol",
            flow.request.pretty_url,
            event.message,
        )
        state = flow_state(flow)
        if state is not None and state.upstream_cut is None:
            state.upstream_cut = event.message  # a stall watchdog has said why already
        yield from self.state_stream_response_body(ResponseEndOfMessage(self.stream_id))
        return
    if isinstance(event, ResponseProtocolError) and _may_answer(self):
        yield from _answer_gateway_error(self, event)
        return
    yield from _original(self, event)


def _may_answer(stream: Any) -> bool:
    """Nothing of the answer has reached the client, which waits for it, on an API call."""
    return (
        stream.client_state == stream.state_done
        and stream.server_state
        not in (stream.state_stream_response_body, stream.state_done, stream.state_errored)
        and bool(stream.context.client.state & ConnectionState.CAN_WRITE)
        and is_llm_call(stream.flow.request.path)
    )


def _answer_gateway_error(stream: Any, event: ResponseProtocolError) -> Generator[Any, Any, None]:
    """What mitmproxy does for an upstream error before the head, with a JSON answer where
    it would send its HTML page: the error hook, then a whole response, then the end."""
    flow = stream.flow
    flow.error = mitmflow.Error(event.message)
    # Made before the hook, so the recorder (which records at the hook) keeps the answer the
    # client gets; set as the flow's response only after it (the router reads a response
    # there as a head the upstream sent).
    answer = _ANSWERS[flow] = _gateway_answer(flow, event)
    yield HttpErrorHook(flow)
    if (yield from stream.check_killed(False)):
        _ANSWERS.pop(flow, None)
        return
    answer.timestamp_end = time.time()
    flow.response = answer
    client = stream.context.client
    yield SendHttp(ResponseHeaders(stream.stream_id, answer, False), client)
    yield SendHttp(ResponseData(stream.stream_id, answer.content or b""), client)
    stream.server_state = stream.state_errored
    flow.live = False
    yield DropStream(stream.stream_id)
    yield SendHttp(ResponseEndOfMessage(stream.stream_id), client)


def _gateway_answer(flow: http.HTTPFlow, event: ResponseProtocolError) -> http.Response:
    """The JSON answer for an upstream that failed before its head."""
    headers = {"content-type": "application/json", "x-llmitm-endpoint": "llmitm"}
    timed_out = timeout_answer(flow)  # llmitm itself closed it: no head in first_byte_timeout
    if timed_out is not None:
        status, body = timed_out.status, orjson.dumps(timed_out.body)
        headers["x-should-retry"] = "false"
    else:
        reached = event.code != ErrorCode.CONNECT_FAILED
        error = gateway_error(event.message, reached=reached)
        logger.warning(
            "llmitm: %s: the upstream failed before its answer (%s); answering %d %s",
            flow.request.pretty_url,
            event.message,
            error.status,
            error.code,
        )
        status, body = error.status, gateway_error_body(error)
    answer = http.Response.make(status, body, headers)
    answer.timestamp_end = time.time()
    return answer


def install() -> bool:
    """Apply once per process (mitmproxy may load the addons more than once); ``False``, with
    one warning per process, when this mitmproxy lacks what the patch needs."""
    if MISSING is not None:
        degrade(
            PATCH,
            f"the HTTP layer internals it wraps ({MISSING})",
            "a stream cut mid-body closes the client's connection and an upstream failure "
            "before the head gets mitmproxy's own 502 page",
        )
        return False
    if HttpStream.handle_protocol_error is not _handle_protocol_error:
        HttpStream.handle_protocol_error = _handle_protocol_error  # type: ignore[method-assign]
    return True
