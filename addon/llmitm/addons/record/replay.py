"""Answering flows from recordings: the lookup, a strict miss, the drift check, paced serving.

Not an addon: the flow recorder looks each request up (:meth:`Replayer.lookup`) and the
record tap serves the hits that wait for the router's plan (:meth:`Replayer.serve`). A hit is
answered at once, or paced through llmitm's loopback relay (``llmitm_replay_timing``, and a
recorded cut of a stream, which only a relayed answer can reproduce).
"""

from __future__ import annotations

import logging
import time

import orjson
from mitmproxy import http

from llmitm.addons.record.flows import Capture, answer, now_us
from llmitm.addons.record.options import RecordSettings
from llmitm.addons.relay import LlmRelay
from llmitm.addons.state import METADATA_KEY, FlowState, set_mint
from llmitm.addons.store import LlmStore
from llmitm.relay.replay_job import ReplayJob
from llmitm.relay.server import RelayServer
from llmitm.replay.capture import ReplayReport, capture_label, miss_text
from llmitm.replay.keys import match_key
from llmitm.replay.model import Interaction
from llmitm.replay.pool import Hit, Miss, ReplayPool, canonical_diff
from llmitm.replay.serve import Answer, drift_error, from_upstream, miss_error, verbatim
from llmitm.store.recordings import ReplayMissRecord
from llmitm.wire.ids import Mint
from llmitm.wire.redact import redact_body

# One logger for every part of recording: log lines keep the name users filter by.
logger = logging.getLogger(__package__)


class Replayer:
    """The loaded recordings (:attr:`pool`) and how flows are answered from them."""

    def __init__(self, store: LlmStore, relay: LlmRelay, report: ReplayReport) -> None:
        self.store = store
        self.shared_relay = relay
        self.report = report
        self.pool = ReplayPool()
        self.relay: RelayServer | None = None
        """The started relay paced answers stream through (set once recordings load)."""

    def lookup(self, flow: http.HTTPFlow, capture: Capture, settings: RecordSettings) -> bool:
        """Look the flow up; ``True`` when the replay took it (a hit, or a strict miss
        answered), ``False`` when it goes on to be recorded."""
        assert capture.key is not None  # a replaying mode keys the request at once
        outcome = self.pool.take(capture.scope, capture.key, settings.exhausted)
        if isinstance(outcome, Hit):
            self.report.hits += 1
            capture.hit = outcome
            # Today's translator re-makes the answer with the recorded ids and times.
            set_mint(flow, Mint(outcome.interaction.minted))
            if settings.replay_from == "client" or "upstream_resp" not in outcome.interaction.legs:
                capture.served = True
                self.deliver(
                    flow, outcome.interaction, verbatim(outcome.interaction), True, settings
                )
            return True  # else the record tap answers once the router has planned the flow
        mode = settings.mode
        if mode == "replay" or (mode == "once" and self.pool.has_scope(capture.scope)):
            self.miss(flow, outcome, settings)
            return True
        return False

    def miss(self, flow: http.HTTPFlow, miss: Miss, settings: RecordSettings) -> None:
        """Answer a strict miss (``llmitm_miss_status``), log it and keep it."""
        where = miss.closest.source if miss.closest is not None else None
        advice = settings.miss_advice
        answer(flow, *miss_error(miss, where, settings.miss_status, advice), None)
        closest = miss.closest
        diff = canonical_diff(closest.canonical, miss.key.canonical) if closest else []
        text = miss_text(
            miss,
            mode=settings.mode,
            profile=settings.key_options.profile,
            loaded=len(self.pool),
            unused=len(self.pool.unused()),
            diff=diff,
            advice=advice,
        )
        logger.error(text)
        self.report.add_miss(miss, diff)
        self.store.submit(
            ReplayMissRecord(
                at_us=now_us(),
                scope=miss.scope,
                key=miss.key.key,
                reason=miss.reason,
                canonical=miss.key.canonical,
                closest_id=closest.id if closest else None,
                closest_canonical=closest.canonical if closest else None,
            )
        )

    def serve(self, flow: http.HTTPFlow, capture: Capture, settings: RecordSettings) -> None:
        """Answer a hit with today's translation of the recorded upstream response, along the
        plan the router made (the flow's state)."""
        assert capture.hit is not None
        interaction = capture.hit.interaction
        state = flow.metadata.pop(METADATA_KEY, None)  # the replay answers, not the translator
        plan = state.plan if isinstance(state, FlowState) else None
        context = state.context if isinstance(state, FlowState) else None
        if self._check_drift(flow, interaction, settings):
            return  # refused: llmitm_strict_drift
        as_recorded = plan is None
        try:
            strip = isinstance(state, FlowState) and state.strip_usage
            answered = from_upstream(interaction, plan, context, strip_usage=strip)
        except Exception:
            logger.exception("llmitm: cannot replay %s; serving the client leg", interaction.id)
            answered, as_recorded = verbatim(interaction), True
        self.deliver(flow, interaction, answered, as_recorded, settings)

    def deliver(
        self,
        flow: http.HTTPFlow,
        interaction: Interaction,
        answered: Answer,
        as_recorded: bool,
        settings: RecordSettings,
    ) -> None:
        """Answer a hit: at once, or paced through the relay; a recorded upstream cut of a
        stream llmitm relayed as it was (``as_recorded``, or no plan) ends abruptly again."""
        truncated = interaction.truncated or ""
        cut = bool(truncated) and (truncated.startswith("client") or not interaction.plan)
        cut = cut and (as_recorded or not interaction.plan)
        if (settings.timing.instant and not cut) or self.relay is None:
            answer(flow, answered.status, answered.headers, answered.body, "hit")
            return
        chunks = answered.chunks
        if chunks is None:
            chunks = [(interaction.ttfb_us or 0, answered.body)]
        arrived = flow.request.timestamp_end or time.time()
        job = ReplayJob(
            status=answered.status,
            headers=[*answered.headers, ("x-llmitm-replay", "hit")],
            chunks=chunks,
            ttfb_us=interaction.ttfb_us,
            timing=settings.timing,
            cut=cut,
            started=time.monotonic() - max(0.0, time.time() - arrived),
        )
        self.shared_relay.point(flow, self.relay.register(job))
        flow.metadata.pop(METADATA_KEY, None)  # played as recorded: nothing to translate

    def _check_drift(
        self, flow: http.HTTPFlow, interaction: Interaction, settings: RecordSettings
    ) -> bool:
        """Warn of (and report) drift; under ``llmitm_strict_drift`` answer it with a 400
        instead of the recording, and say so (``True``)."""
        recorded = interaction.legs.get("upstream_req")
        if recorded is None:
            return False
        now = redact_body(flow.request.get_content(strict=False) or b"")
        options = settings.key_options
        then = match_key(recorded.method or "POST", "/v1/x", [], recorded.content, options)
        today = match_key(flow.request.method, "/v1/x", [], now, options)
        if then.key == today.key:
            return False
        strict = settings.strict_drift
        diff = canonical_diff(then.canonical, today.canonical, limit=30)
        (logger.error if strict else logger.warning)(
            "llmitm: replay drift: the upstream request for %s differs from the recorded "
            "one (%s):\n%s",
            interaction.id,
            capture_label(interaction),
            "\n".join(diff),
        )
        self.report.drift.append({"id": interaction.id, "diff": diff})
        # Kept like a miss, so `llmitm rec diff --last-miss` shows the whole difference.
        self.store.submit(
            ReplayMissRecord(
                at_us=now_us(),
                scope=interaction.scope,
                key=interaction.key,
                reason="drift",
                canonical=today.canonical,
                closest_id=interaction.id,
                closest_canonical=then.canonical,
            )
        )
        if not strict:
            return False
        answer(flow, *drift_error(interaction, diff, interaction.source or None), None)
        return True


def answer_offline(flow: http.HTTPFlow) -> None:
    """Answer, in ``replay``, a request that is no LLM call: replay never goes upstream."""
    url = flow.request.pretty_url
    body = {
        "error": {
            "message": f"llmitm is in replay mode and never goes upstream: {url} is not an "
            "LLM API call it records.",
            "type": "llmitm_replay_offline",
            "param": None,
            "code": "replay_offline",
        }
    }
    headers = [("content-type", "application/json"), ("x-should-retry", "false")]
    answer(flow, 502, headers, orjson.dumps(body), "offline")
