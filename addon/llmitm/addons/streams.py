"""The flow's one stream owner, as addons find it: :func:`flow_stream` and :func:`stream_outcome`.

The stream translator addon decides, in ``responseheaders``, how a flow's body streams: a
:class:`~llmitm.exchange.stream.StreamRewriter` that translates or guards it, or ``True`` (a
stream nothing in llmitm changes, which mitmproxy relays itself). Addons after it that want
the chunks attach to the rewriter through :func:`flow_stream`, which gives an untouched
stream a rewriter that relays it as it is; nobody replaces or wraps ``response.stream``.
"""

from __future__ import annotations

import orjson
from mitmproxy import http

from llmitm.addons.state import FlowState
from llmitm.exchange.response import StreamOutcome
from llmitm.exchange.stream import StreamRewriter


def flow_stream(flow: http.HTTPFlow) -> StreamRewriter | None:
    """The flow's stream owner, to observe (``None``: the body is not streamed, or an
    addon outside llmitm streams it)."""
    response = flow.response
    if response is None:
        return None
    stream = response.stream
    if isinstance(stream, StreamRewriter):
        return stream
    if stream is True:
        response.stream = rewriter = StreamRewriter()
        return rewriter
    return None


def stream_outcome(flow: http.HTTPFlow) -> StreamOutcome | None:
    """What the flow's stream was, once it has ended (``None``: it was not llmitm's)."""
    response = flow.response
    stream = response.stream if response is not None else None
    return stream.outcome() if isinstance(stream, StreamRewriter) else None


def answered_response_id(flow: http.HTTPFlow, state: FlowState) -> str | None:
    """The id of a Responses answer the upstream made itself (for ``previous_response_id``
    affinity): from the stream's outcome, or the body."""
    if state.plan.client_api != "responses" or state.plan.upstream_api != "responses":
        return None
    response = flow.response
    if response is None:
        return None
    if state.streamed:
        outcome = stream_outcome(flow)
        return outcome.response_id if outcome is not None else None
    content = response.get_content(strict=False)
    if not content:
        return None
    try:
        body = orjson.loads(content)
    except orjson.JSONDecodeError:
        return None
    value = body.get("id") if isinstance(body, dict) else None
    return value if isinstance(value, str) else None
