"""The record tap: the back half of recording and replay, after the router and translator.

It answers the replay hits that wait for the router's plan, notes the upstream request the
router built, hooks the stream (one note per chunk: its time and the bytes in and out,
nothing else on the hot path) and, when the flow ends — finished, aborted by the client or
cut by the upstream — reads the flow's plain values, has
:func:`llmitm.replay.capture.build_interaction` make the redacted record, its streamed
bodies compressed as the store keeps them, and hands it to the flow recorder (which queues
it for the store's writer, never awaited).
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING

from mitmproxy import http

from llmitm.addons.patches.cut_streams import gateway_answer
from llmitm.addons.record.compactor import TapCompactor
from llmitm.addons.record.flows import Capture, SentRequest, capture_of, fields
from llmitm.addons.state import FlowState, flow_mint, flow_state
from llmitm.addons.streams import flow_stream
from llmitm.replay.capture import ClientResponse, FlowEnd, build_interaction, relayed_request
from llmitm.replay.model import Interaction, new_id
from llmitm.replay.tap import Frames, StreamTap, pieces
from llmitm.store.recording_rows import encode_pieces

if TYPE_CHECKING:
    from llmitm.addons.record.recorder import LlmFlowRecorder

logger = logging.getLogger(__package__)


class LlmRecordTap:
    """Serves from-upstream replay hits, hooks streams, records at the end."""

    name = "llmitm_record_tap"

    def __init__(self, recorder: LlmFlowRecorder) -> None:
        self.recorder = recorder
        self.compactor = TapCompactor()

    def done(self) -> None:
        self.compactor.stop()

    def request(self, flow: http.HTTPFlow) -> None:
        capture = capture_of(flow)
        if capture is None:
            return
        if capture.hit is not None:
            if flow.response is None and not capture.served:
                capture.served = True
                self.recorder.replay.serve(flow, capture, self.recorder.settings)
            return
        if not capture.record or flow.response is not None:
            return  # answered locally (a bad request): nothing went upstream
        capture.forwarded = True
        request = flow.request
        # References to the request the router built, its head decoded and redacted with its
        # body by the record's builder (a dozen strings per flow less while it streams).
        capture.upstream_sent = SentRequest(
            request.method,
            request.pretty_url,
            fields(request.headers),
            request.get_content(strict=False),
        )

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        capture = capture_of(flow)
        response = flow.response
        if capture is None or not capture.forwarded or response is None:
            return
        stream = flow_stream(flow)
        if stream is not None:
            capture.tap = tap = StreamTap()
            stream.add_note(tap.note)
            self.compactor.add(tap)
        elif callable(response.stream):
            logger.debug("llmitm: not recording the body of an unknown stream callable")

    def response(self, flow: http.HTTPFlow) -> None:
        self._finish(flow)

    def error(self, flow: http.HTTPFlow) -> None:
        self._finish(flow)

    def _finish(self, flow: http.HTTPFlow) -> None:
        capture = capture_of(flow)
        if capture is None or not capture.record or capture.done:
            return
        capture.done = True
        self.compactor.discard(capture.tap)
        recorder = self.recorder
        try:
            end, frames = flow_end(flow, capture)
        except Exception:
            logger.exception("llmitm: cannot record %s", flow.request.pretty_url)
            return
        # The id is the flow's now (the console's summary line names it); the record, whose
        # redaction and key cost CPU in proportion to the bodies, is built off the loop.
        capture.recorded = interaction_id = new_id(capture.started_us)
        session, mode = recorder.session, recorder.settings.mode

        def build() -> Interaction:
            capture.see()
            capture.see_sent()
            streamed = end if frames is None else with_pieces(end, frames)
            interaction = build_interaction(
                capture,
                streamed,
                session=session,
                mode=mode,
                interaction_id=interaction_id,
                memo=capture.memo,
            )
            # Compressed here, on the builder's thread, not whole until the store's writer
            # takes the record on the event loop.
            for message in interaction.legs.values():
                encode_pieces(message)
            return interaction

        recorder.builder.submit(build)


def with_pieces(end: FlowEnd, frames: Frames) -> FlowEnd:
    """``end`` with the pieces of its stream (decompressed here, by the builder)."""
    kept = frames.unpack()
    client = kept.client
    return replace(
        end,
        upstream_stream=pieces(kept.times, end.t0, *kept.upstream),
        client_stream=pieces(kept.times, end.t0, *client) if client is not None else None,
    )


def flow_end(flow: http.HTTPFlow, capture: Capture) -> tuple[FlowEnd, Frames | None]:
    """The plain values a finished flow holds, for :func:`build_interaction`, and its
    stream's frames, still compressed (:func:`with_pieces` makes them the end's pieces)."""
    # An upstream that failed before its head: the flow ends at its error hook, before the
    # JSON answer the client gets is its response; that answer is what is kept.
    request, response = flow.request, gateway_answer(flow)
    t0 = request.timestamp_end or request.timestamp_start
    tap = capture.tap
    frames = tap.finish() if tap is not None else None
    client: ClientResponse | None = None
    if response is not None:
        content: bytes | None = None
        if tap is None:  # a streamed body is the tap's
            with contextlib.suppress(ValueError):
                content = response.get_content(strict=False)
        client = ClientResponse(
            status=response.status_code,
            headers=fields(response.headers),
            content=content,
            started=response.timestamp_start,
            ended=response.timestamp_end or time.time(),
        )
    state = flow_state(flow)
    planned = state if isinstance(state, FlowState) else None
    routed = planned.routed if planned is not None else None
    relayed = None
    if routed is not None and routed.upstream_request is not None:
        sent = routed.upstream_request
        relayed = relayed_request(sent.method, sent.url, sent.headers, sent.body)
    mint = flow_mint(flow)
    return FlowEnd(
        t0=t0,
        response=client,
        error=flow.error.msg if flow.error is not None else None,
        endpoint=planned.plan.endpoint.name if planned is not None else None,
        plan=(planned.plan.label if planned.plan.translates else "passthrough") if planned else "",
        upstream_cut=planned.upstream_cut if planned is not None else None,
        relayed=relayed,
        minted=mint.tape if mint is not None else None,
    ), frames
