"""Background Responses calls (``background: true``): llmitm makes the upstream call itself.

:class:`LlmBackground` comes right after the Responses state writer, which has given the
call its id. It stores the run's lease (:mod:`llmitm.responses_api.leases`: how other proxies
sharing the store reach it) and the ``queued`` Response, starts a
:class:`~llmitm.responses_api.background.BackgroundRun` on the flow's translated request
(what it sends and stores: :mod:`llmitm.responses_api.takeover`), and answers the flow
itself: the Response as it stands, or its live event stream through the relay. The run's
tokens are accounted when it finishes, since no flow carries its upstream call.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from mitmproxy import http

from llmitm.addons.responses_state import (
    ResponsesState,
    answer,
    flow_ids,
    open_upstream,
    point_at_relay,
)
from llmitm.addons.state import METADATA_KEY, RESPONSES_CREATE_KEY, FlowState, flow_state
from llmitm.addons.stream_translator import redact_credentials
from llmitm.relay.client import UpstreamRequest
from llmitm.relay.frames import FramesJob
from llmitm.responses_api import answers, takeover
from llmitm.responses_api.answers import LocalAnswer
from llmitm.responses_api.background import BackgroundRun
from llmitm.responses_api.create import CreateCall
from llmitm.responses_api.records import ResponseEvents, RunEnded


class LlmBackground:
    """Takes ``background`` create calls over from their flows."""

    name = "llmitm_background"

    def __init__(self, state: ResponsesState) -> None:
        self.state = state

    async def request(self, flow: http.HTTPFlow) -> None:
        create = flow.metadata.get(RESPONSES_CREATE_KEY)
        state = flow_state(flow)
        if not isinstance(create, CreateCall) or flow.response or state is None:
            return
        # The writer gave a translated call its id; a native endpoint runs its own.
        if create.background and create.response_id is not None:
            await self._take_over(flow, state, create)

    async def _take_over(
        self, flow: http.HTTPFlow, flow_state: FlowState, create: CreateCall
    ) -> None:
        if not create.store:
            answer(flow, answers.invalid(takeover.REFUSAL, "background"))
            return
        upstream = UpstreamRequest(
            method="POST",
            url=flow.request.url,
            headers=[(k, v) for k, v in flow.request.headers.items(multi=True)],
            body=takeover.upstream_body(flow.request.get_content(strict=False)),
        )
        context, plan, state = flow_state.context, flow_state.plan, self.state
        now = time.time()
        record = takeover.queued_record(
            create,
            context,
            create.response_id or flow_ids(flow)("resp"),
            now,
            state.expires_at(now),
        )

        def record_events(batch: list[tuple[int, bytes]]) -> None:
            state.submit(ResponseEvents(record.id, tuple(batch)))

        def record_state(response: dict[str, Any]) -> None:
            state.save(replace(record, response=response))
            if response.get("status") not in answers.TERMINAL_STATUSES:
                return
            state.runs.pop(record.id, None)
            state.submit(RunEnded(record.id))  # after its last save: the lease goes
            usage = takeover.finished_usage(
                response, endpoint=plan.endpoint.name, model=context.model or "", route=plan.route
            )
            if usage is not None:
                state.store.submit(usage)

        run = BackgroundRun(
            record.response, context, record_events=record_events, record_state=record_state
        )
        state.runs[record.id] = run
        # The lease first: a proxy sharing the store that finds the response finds its lease.
        state.run_started(run)
        state.save(record)
        relay = state.relay
        run.start(lambda: open_upstream(upstream, relay))
        # The flow no longer goes upstream: no translation, no credentials on it.
        redact_credentials(flow, flow_state)
        del flow.metadata[METADATA_KEY]
        if flow_state.client_stream:
            await point_at_relay(flow, relay, FramesJob(run.follow()))
        else:
            answer(flow, LocalAnswer(200, run.response))
