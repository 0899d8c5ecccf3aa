"""Both sides of a flow llmitm changed, for mitmproxy's UIs and saved flows.

The router rewrites ``flow.request`` into what goes upstream, and the translator rewrites
``flow.response`` into what the client gets, so without this a translated flow would show the
upstream's request beside the client's answer. Two addons keep the rest:

- :class:`LlmClientSide`, before anything changes the request, keeps a copy of the client's
  request as it came (in memory, beside the flow), and the upstream's status, headers and
  non-streamed body before the translator replaces them;
- :class:`LlmFlowSides`, after every other llmitm addon, watches a streamed upstream body
  (bounded, and only where someone can look at it: mitmproxy's UIs or a file flows are saved
  to), and once the flow has ended keeps what went upstream and what came back in
  ``flow.metadata`` (:mod:`llmitm.exchange.sides`) and puts the client's request back on the
  flow, credentials redacted.

Putting the request back, rather than labelling the flow, is what makes mitmweb's flow list,
its Request tab, a saved flow and a replay from mitmweb all show (and resend) the client's
call; mitmproxy offers no other way to change the path shown in the list. It happens in the
flow's last llmitm hook: the recorder, usage, metrics and the console have read the upstream's
request by then, and mitmproxy's own view and save addons, which come after the script
addons, see the restored one.
"""

from __future__ import annotations

import copy
import logging
import weakref
from dataclasses import dataclass

from mitmproxy import ctx, http

from llmitm.addons.state import SOCKET_KEY, flow_state
from llmitm.addons.streams import flow_stream
from llmitm.exchange.sides import SIDES_KEY, Answered, BoundedBody, Sent, UpstreamSide
from llmitm.wire.paths import classify_path
from llmitm.wire.redact import redact_headers, redact_url

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class _Upstream:
    """The upstream's answer as it came, before the translator changed it."""

    status: int
    headers: tuple[tuple[bytes, bytes], ...]
    """The header fields as they came (mitmproxy's tuple, which a change replaces, not
    edits): decoded only for a side that is kept."""
    body: bytes | None = None
    stream: BoundedBody | None = None


# Beside the flow, not in its metadata: the client's request still holds its credentials.
_CLIENT: weakref.WeakKeyDictionary[http.HTTPFlow, http.Request] = weakref.WeakKeyDictionary()
_UPSTREAM: weakref.WeakKeyDictionary[http.HTTPFlow, _Upstream] = weakref.WeakKeyDictionary()


def client_request(flow: http.HTTPFlow) -> http.Request | None:
    """The client's request as llmitm first saw it, while the flow is live (``None``: not an
    API call llmitm keeps, or the flow has ended and ``flow.request`` is the client's again)."""
    return _CLIENT.get(flow)


def _fields(headers: http.Headers) -> list[tuple[str, str]]:
    return _decoded(headers.fields)


def _decoded(fields: tuple[tuple[bytes, bytes], ...]) -> list[tuple[str, str]]:
    return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in fields]


def _copied(request: http.Request) -> http.Request:
    """``request`` as it is now. Its values are immutable but for its headers, so the copy
    shares them and copies the headers' field list: ~10 µs a request, where ``copy()``'s round
    trip through the request's state took ~50."""
    data = copy.copy(request.data)
    data.headers = http.Headers(request.headers.fields)
    if data.trailers is not None:
        data.trailers = http.Headers(data.trailers.fields)
    kept = copy.copy(request)
    kept.data = data
    return kept


class LlmClientSide:
    """The front half: the client's request as it came, the upstream's answer as it came."""

    name = "llmitm_client_side"

    def request(self, flow: http.HTTPFlow) -> None:
        if flow.response or flow.error or not flow.live or flow.metadata.get(SOCKET_KEY):
            return
        if classify_path(flow.request.path) is None:
            return
        _CLIENT[flow] = _copied(flow.request)

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        response = flow.response
        if response is None or flow not in _CLIENT or flow_state(flow) is None:
            return
        _UPSTREAM[flow] = _Upstream(response.status_code, response.headers.fields)

    def response(self, flow: http.HTTPFlow) -> None:
        upstream = _UPSTREAM.get(flow)
        response = flow.response
        if upstream is None or response is None or response.stream:
            return
        upstream.body = response.get_content(strict=False)  # before the translator's


class LlmFlowSides:
    """The back half: keeps the upstream's side in the flow and gives it the client's request."""

    name = "llmitm_flow_sides"

    def __init__(self) -> None:
        self.keep_streams = False

    def running(self) -> None:
        # A streamed upstream body is kept only where someone can look at it: mitmproxy's and
        # mitmweb's flow view, or flows saved to a file.
        saving = "save_stream_file" in ctx.options and bool(ctx.options.save_stream_file)
        self.keep_streams = saving or ctx.master.addons.get("view") is not None

    def configure(self, updated: set[str]) -> None:
        if "save_stream_file" in updated and ctx.options.save_stream_file:
            self.keep_streams = True

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        upstream = _UPSTREAM.get(flow)
        if upstream is None or not self.keep_streams:
            return
        response = flow.response
        if response is None or not response.stream:
            return
        stream = flow_stream(flow)
        if stream is not None:
            upstream.stream = BoundedBody()
            stream.watch(upstream.stream)

    def response(self, flow: http.HTTPFlow) -> None:
        self._finish(flow)

    def error(self, flow: http.HTTPFlow) -> None:
        self._finish(flow)

    def _finish(self, flow: http.HTTPFlow) -> None:
        client = _CLIENT.pop(flow, None)
        upstream = _UPSTREAM.pop(flow, None)
        if client is None or not _changed(client, flow.request):
            return
        try:
            side = upstream_side(flow, upstream)
            if side is not None:
                flow.metadata[SIDES_KEY] = side.to_state()
            flow.request = _redacted(client)
        except Exception:  # showing both sides must never cost the client its answer
            logger.exception("llmitm: cannot keep both sides of %s", client.pretty_url)


def upstream_side(flow: http.HTTPFlow, upstream: _Upstream | None) -> UpstreamSide | None:
    """What went upstream for ``flow`` and what came back (``None``: llmitm did not route it,
    so nothing went upstream that the flow does not show)."""
    state = flow_state(flow)
    if state is None:
        return None
    routed = state.routed
    relayed = routed.upstream_request if routed is not None else None
    if relayed is not None:  # the flow's own request names llmitm's relay
        sent = Sent.redacted(relayed.method, relayed.url, relayed.headers, relayed.body)
    else:
        request = flow.request
        content = request.get_content(strict=False)
        sent = Sent.redacted(request.method, request.pretty_url, _fields(request.headers), content)
    answered = None
    if upstream is not None:
        body, left_out = upstream.body, 0
        if upstream.stream is not None:
            body, left_out = upstream.stream.body(), upstream.stream.left_out
        headers = _decoded(upstream.headers)
        answered = Answered.redacted(upstream.status, headers, body, left_out)
    plan = state.plan
    return UpstreamSide(plan.client_api, plan.upstream_api, plan.endpoint.name, sent, answered)


def _changed(client: http.Request, now: http.Request) -> bool:
    return (
        client.method != now.method
        or client.url != now.url
        or client.headers.fields != now.headers.fields
        or client.raw_content != now.raw_content
    )


def _redacted(request: http.Request) -> http.Request:
    """``request`` with its credentials replaced, as a saved flow may keep it."""
    request.headers = http.Headers(
        [
            (k.encode("latin-1"), v.encode("latin-1"))
            for k, v in redact_headers(_fields(request.headers))
        ]
    )
    url = redact_url(request.url)
    if url != request.url:
        request.url = url
    return request
