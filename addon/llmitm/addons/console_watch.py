"""What the console watches of a flow: a :class:`Observer` on its stream owner and the
:class:`~llmitm.view.live.FlowInfo` that names it (which side spoke which API, the model, the
endpoint). The observer is on the proxy's hot path: one C call per chunk after the first few.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any
from urllib.parse import urlsplit

from mitmproxy import http

from llmitm.addons.sides import client_request
from llmitm.addons.state import FlowState, flow_state
from llmitm.exchange.request import client_model, parse_body
from llmitm.exchange.stream import StreamRewriter
from llmitm.view.live import TAIL_CHUNKS, FlowInfo, StreamWatch
from llmitm.wire.paths import classify_path

_now = time.time  # mitmproxy's timestamps are epoch seconds

TIMED_CHUNKS = 64
"""Chunks of a stream timed one by one (the first token is among them, nearly always); later
chunks are timed when the console reads them."""


class Observer:
    """The observe hook put on llmitm's own rewriter: times and keeps a stream's first chunks,
    then replaces itself with a plain C-level ``append`` (to the watch's list, or in the lines
    mode to a bounded tail), so the rest of the stream costs one C call per chunk. The flow's
    stream callable stays the rewriter: nothing downstream (usage, cut streams) sees a wrapper.
    """

    __slots__ = (
        "_add_chunk",
        "_add_time",
        "left",
        "number",
        "pending",
        "rewriter",
        "sink",
        "tail",
        "watch",
    )

    def __init__(self, rewriter: StreamRewriter, watch: StreamWatch) -> None:
        self.rewriter = rewriter
        self.watch = watch
        self.pending = watch.pending
        self._add_time = watch.times.append
        self._add_chunk = watch.pending.append
        self.left = TIMED_CHUNKS
        # Until a panel shows the stream, only its last chunks are kept: holding (and later
        # walking) every chunk of dozens of unseen streams cost the proxy ~5% at 64 streams.
        self.tail: deque[bytes] = deque(maxlen=TAIL_CHUNKS)
        self.sink: Any = self.tail.append
        watch.follow, watch.unfollow = self.follow, self.unfollow
        self.number = rewriter.watch(self)

    def __call__(self, data: bytes) -> None:
        self._add_time(_now())
        self._add_chunk(data)
        self.left -= 1
        if not self.left:
            self.rewriter.rewatch(self.number, self.sink)

    def follow(self) -> None:
        """A panel shows the stream now: hand over every chunk from here on (the watch,
        having missed some, reassembles from the tail)."""
        if self.sink == self._add_chunk:
            return
        if self.tail:
            self.watch.behind = True
        self.merge()
        self.sink = self._add_chunk
        if not self.left:
            self.rewriter.rewatch(self.number, self.sink)

    def unfollow(self) -> None:
        """The stream lost its panel: keep only its last chunks again."""
        self.sink = self.tail.append
        if not self.left:
            self.rewriter.rewatch(self.number, self.sink)

    def merge(self) -> None:
        """Hand the kept tail to the watch, after the head (in order; untimed)."""
        if self.tail:
            self.pending += self.tail
            self.tail.clear()


def call_paths(flow: http.HTTPFlow) -> tuple[str, str]:
    """The path the client called and the one llmitm called upstream (queries left out:
    they may hold a key)."""
    upstream = urlsplit(flow.request.path).path
    client = client_request(flow)
    state = flow_state(flow)
    routed = state.routed if state is not None else None
    if routed is not None and routed.upstream_request is not None:
        upstream = urlsplit(routed.upstream_request.url).path  # the flow names the relay
    return (urlsplit(client.path).path if client is not None else upstream), upstream


def flow_info(flow: http.HTTPFlow) -> FlowInfo | None:
    """What the console says about a flow, or ``None`` for flows that are not LLM calls."""
    state = flow_state(flow)
    started = flow.request.timestamp_start or _now()
    if isinstance(state, FlowState):
        plan = state.plan
        return FlowInfo(
            client_api=plan.client_api,
            upstream_api=plan.upstream_api,
            model=state.context.model or plan.upstream_model,
            endpoint=plan.endpoint.name,
            upstream_model=plan.upstream_model,
            route=plan.route,
            started=started,
        )
    classified = classify_path(flow.request.path)
    if classified is None:
        return None
    try:
        model = client_model(parse_body(flow.request.get_content(strict=False) or b""), None)
    except Exception:
        model = ""
    return FlowInfo(
        client_api=classified.api,
        upstream_api=classified.api,
        model=model or classified.deployment or "",
        endpoint=flow.request.pretty_host,
        started=started,
    )
