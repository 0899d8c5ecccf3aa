"""The local Responses API in front of the router: OpenAI's server state for Responses
clients whose endpoint speaks only Chat Completions (logic in ``llmitm.responses_api``,
storage in ``llmitm.store``, the shared state in :mod:`llmitm.addons.responses_state`).

:class:`LlmResponsesApi`, ``request``: answers state calls (``GET``/``DELETE
…/responses/{id}``, ``…/input_items``, ``…/cancel``) from the store, or sends them to the
native endpoint that owns the id; on a create call it inlines the stored chain of
``previous_response_id`` (or the items of its ``conversation``) into ``input`` (so the
router translates a plain, stateless request) and opens llmitm's own ``encrypted_content``
reasoning tokens. What happens after the router is :mod:`llmitm.addons.responses_writer`
(ids, what gets stored) and :mod:`llmitm.addons.background` (``background`` calls).

Everything stored keeps the credential fingerprint of the request that created it, and every
read is that of the caller's credential unless the configuration says ``responses_scope =
"shared"`` (``llmitm.responses_api.scope``): another key, or none, gets OpenAI's 404 — and a
native endpoint's id is only sent there, with the endpoint's key, for the key that made it.

Reads await the store (they answer the client); writes go through its queue. Proxies may
share the store: a state call on a background response another proxy runs reaches it through
the store — retrieve and ``stream=true`` read what it stored (following new events live), a
cancel or delete is recorded for it to carry out (answered once it has, within the lease), and
a run whose owner died ends ``failed`` (:mod:`llmitm.responses_api.remote_runs`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace

import orjson
from mitmproxy import ctx, exceptions, http
from mitmproxy.addonmanager import Loader

from llmitm.addons.parsed import keep_parsed
from llmitm.addons.responses_state import ResponsesState, answer, flow_ids, point_at_relay
from llmitm.addons.state import RESPONSES_CREATE_KEY, flow_mint
from llmitm.exchange.request import rewrite_headers
from llmitm.relay.frames import FramesJob, iterate
from llmitm.responses_api import answers, remote_runs
from llmitm.responses_api.answers import TERMINAL_STATUSES, LocalAnswer
from llmitm.responses_api.background import BackgroundRun
from llmitm.responses_api.conversations import inline_conversation
from llmitm.responses_api.create import (
    HISTORY_IDS_MARKER,
    SEALED_TYPES,
    CreateCall,
    prepare_create,
)
from llmitm.responses_api.items import resent_of
from llmitm.responses_api.paths import StateCall, classify_state_path, owner_url
from llmitm.responses_api.records import (
    ResponseDeleted,
    ResponseReader,
    RunCancelRequested,
    StoredResponse,
    readable,
)
from llmitm.routing.plan import plan_for_endpoint
from llmitm.store import StoreUnreachable
from llmitm.translate.errors import TranslationError
from llmitm.translate.seen_items import ItemMemo
from llmitm.translate.validation import validate_request
from llmitm.wire.errors import ApiError
from llmitm.wire.growing import GrowingBodies
from llmitm.wire.paths import classify_path

logger = logging.getLogger(__name__)


class LlmResponsesApi:
    """State calls and create-call preparation, before the router."""

    name = "llmitm_responses_api"

    def __init__(self, state: ResponsesState) -> None:
        self.state = state
        # A resent history's items, checked and given ids on an earlier turn.
        self._items = ItemMemo()
        # The last turns' bodies, parsed: a body that extends one is parsed where it is new.
        # What this request path rewrites in place (sealed reasoning and compaction items)
        # is handed out as copies; anything else it changed is found next turn.
        self._bodies = GrowingBodies(checked=True, copied=SEALED_TYPES)

    def load(self, loader: Loader) -> None:
        loader.add_option(
            "llmitm_responses_store",
            bool,
            True,
            "Store Responses created over chat-only endpoints when the request does not say "
            "(OpenAI's default is store=true).",
        )
        loader.add_option(
            "llmitm_responses_ttl",
            int,
            0,
            "Seconds a stored response (and a native id's owner) is kept; 0 keeps them until "
            "deleted.",
        )
        loader.add_option(
            "llmitm_responses_wait_ms",
            int,
            2000,
            "With a store other proxies share: milliseconds a lookup waits for a response "
            "another proxy is still storing before it answers 'not found' (0: no wait).",
        )
        loader.add_option(
            "llmitm_run_lease_ms",
            int,
            6000,
            "With a store other proxies share: milliseconds without a heartbeat after which "
            "a background response's proxy is taken for dead and the response ends failed.",
        )

    def configure(self, updated: set[str]) -> None:
        if "llmitm_responses_store" in updated:
            self.state.store_default = bool(ctx.options.llmitm_responses_store)
        if "llmitm_responses_ttl" in updated:
            self.state.ttl = ctx.options.llmitm_responses_ttl
        if "llmitm_responses_wait_ms" in updated:
            wait = ctx.options.llmitm_responses_wait_ms
            if wait < 0:
                raise exceptions.OptionsError("llmitm_responses_wait_ms must be 0 or more")
            self.state.wait = wait / 1000
        if "llmitm_run_lease_ms" in updated:
            lease = ctx.options.llmitm_run_lease_ms
            if lease < 500:
                raise exceptions.OptionsError("llmitm_run_lease_ms must be at least 500")
            self.state.lease = lease / 1000

    def done(self) -> None:
        # Before the store closes (this addon comes first): a run cut by the shutdown ends
        # failed in the store instead of in_progress forever.
        self.state.stop_runs("llmitm stopped before the background response finished.")

    async def request(self, flow: http.HTTPFlow) -> None:
        if flow.response or flow.error or not flow.live:
            return
        if not self.state.settings.config.routes:
            return  # the embedded default: OpenAI and Azure traffic passes unchanged
        try:
            call = classify_state_path(flow.request.method, flow.request.path)
            if call is not None:
                await self._state_call(flow, call)
            elif flow.request.method == "POST":
                classified = classify_path(flow.request.path)
                if classified is not None and classified.api == "responses":
                    await self._before_create(flow)
        except StoreUnreachable as exc:  # a shared database that is down: say so, and retry
            logger.warning("llmitm: %s: %s", flow.request.pretty_url, exc)
            answer(
                flow,
                answers.error_answer(
                    ApiError(
                        message="llmitm's store is unreachable; try again shortly.",
                        type="server_error",
                        code="llmitm_store_unreachable",
                        status=503,
                    )
                ),
            )
        except Exception:  # an llmitm bug must cost this request, never the proxy
            logger.exception("llmitm: local Responses API failed on %s", flow.request.pretty_url)
            answer(
                flow,
                answers.error_answer(
                    ApiError(
                        message="llmitm's local Responses API failed; see the proxy's log.",
                        type="server_error",
                        code="llmitm_error",
                        status=500,
                    )
                ),
            )

    # -- create calls ---------------------------------------------------------------------

    async def _before_create(self, flow: http.HTTPFlow) -> None:
        content = flow.request.get_content(strict=False) or b""
        try:
            grown = self._bodies.parse(content)
        except orjson.JSONDecodeError:
            return  # the router answers the 400
        body = grown.body
        if not isinstance(body, dict):
            return
        seen = self._items.see(
            body.get("input"), grown.item_bytes if grown.name == "input" else None
        )
        try:
            validate_request(body, "responses", seen)
        except TranslationError:
            return  # the router answers the 400, before anything reads the body
        created_by = await self.state.creator(flow)
        mint = flow_mint(flow)
        create, changed = await prepare_create(
            body,
            await self.state.reader(),
            self.state.seal,
            store_default=self.state.store_default,
            ids=flow_ids(flow),
            known_owner=self.state.known_owner,
            credential=self.state.credential(created_by),
            history_ids=mint is None or mint.marked(HISTORY_IDS_MARKER),
            seen=seen,
            resent=resent_of(grown),
        )
        grown.attach(create.resent)
        if create.previous_foreign:
            # Not sent on: the endpoint, asked with llmitm's key, would find it.
            previous = create.previous_response_id or ""
            answer(flow, answers.error_answer(answers.previous_not_found(previous)))
            return
        if "conversation" in body:
            conversation, turn, error = await inline_conversation(
                body,
                await self.state.conversations(),
                self.state.credential(created_by),
                flow_ids(flow),
                previous_response_id=create.previous_response_id,
                own_items=create.input_items,
            )
            if error is not None:
                answer(flow, answers.error_answer(error))
                return
            create.conversation_id, create.turn_input, changed = conversation, turn, True
        create.created_by = created_by
        if changed:
            flow.request.content = orjson.dumps(body)
        # The router plans with this object rather than parse and validate the bytes again
        # (a changed body is validated again: what was inlined was never checked).
        content = flow.request.get_content(strict=False) or b""
        if changed:
            keep_parsed(flow, content, body, None)
        else:  # its items as parsed: the router may go on from last turn's translation
            keep_parsed(flow, content, body, "responses", grown)
        flow.metadata[RESPONSES_CREATE_KEY] = create

    # -- state calls ----------------------------------------------------------------------

    async def _state_call(self, flow: http.HTTPFlow, call: StateCall) -> None:
        reader = await self.state.reader()
        credential = self.state.credential(await self.state.creator(flow))
        record = await reader.response(call.response_id, credential)
        run = self.state.runs.get(call.response_id)
        if record is None:
            await self._not_stored(flow, call, reader, credential)
            return
        if run is not None:
            # The live run is ahead of the store between status changes.
            record = replace(record, response=run.response)
        else:
            record = await self.state.settle(record, reader)
        if call.action == "retrieve":
            if answers.parse_flag(call.param("stream")):
                await self._stream(flow, call, record, reader, credential)
            else:
                answer(flow, answers.retrieve(record))
        elif call.action == "delete":
            if run is not None:
                run.cancel()
                self.state.runs.pop(record.id, None)
            elif await self._runs_elsewhere(record, reader):
                # Its proxy cancels it, and deletes it again after its last write.
                self.state.submit(RunCancelRequested(record.id, time.time(), delete=True))
            self.state.submit(ResponseDeleted(record.id))
            answer(flow, answers.deleted(record.id))
        elif call.action == "input_items":
            answer(flow, answers.input_items_page(record, call))
        else:
            await self._cancel(flow, record, run, reader, credential)

    async def _runs_elsewhere(self, record: StoredResponse, reader: ResponseReader) -> bool:
        """Whether ``record`` is a background response another proxy is running (a live
        lease: ``settle`` has ended a stale one already)."""
        if not record.background or record.status in TERMINAL_STATUSES:
            return False
        return await reader.run_lease(record.id) is not None

    async def _not_stored(
        self, flow: http.HTTPFlow, call: StateCall, reader: ResponseReader, credential: str | None
    ) -> None:
        owner = self.state.known_owner(call.response_id) or await reader.owner(call.response_id)
        mine = owner is not None and readable(owner.credential, credential)
        endpoint = self.state.settings.config.endpoints.get(owner.endpoint) if mine else None
        if owner is None or endpoint is None:
            answer(flow, answers.not_found(call.response_id))
            return
        # A native endpoint's id: its state is authoritative, the call goes there.
        plan = plan_for_endpoint(endpoint, "responses", "")
        flow.request.url = owner_url(endpoint, call)
        rewrite_headers(flow.request.headers, plan)
        routed = CreateCall(store=False, background=False, include_encrypted=False)
        routed.native_endpoint = endpoint.name
        flow.metadata[RESPONSES_CREATE_KEY] = routed

    async def _cancel(
        self,
        flow: http.HTTPFlow,
        record: StoredResponse,
        run: BackgroundRun | None,
        reader: ResponseReader,
        credential: str | None,
    ) -> None:
        refusal = answers.cancel_refusal(record)
        if refusal is not None:
            answer(flow, refusal)
            return
        if run is not None:
            run.cancel()
            response = run.response
        elif await self._runs_elsewhere(record, reader):
            self.state.submit(RunCancelRequested(record.id, time.time()))
            response = await self._until_ended(record, reader, credential)
        else:
            # Queued or in progress in a process that is gone: nothing runs it any more.
            response = answers.cancelled(record.response)
            self.state.save(replace(record, response=response))
        answer(flow, LocalAnswer(200, response))

    async def _running_elsewhere(
        self, response_id: str, reader: ResponseReader, credential: str | None
    ) -> StoredResponse | None:
        """The response another proxy runs, as it stands (settled); ``None`` once it is
        deleted, or has neither ended nor a lease any more (nothing runs it)."""
        current = await reader.response(response_id, credential)
        if current is None:
            return None
        current = await self.state.settle(current, reader)
        if current.status in TERMINAL_STATUSES or await self._runs_elsewhere(current, reader):
            return current
        return None

    async def _until_ended(
        self, record: StoredResponse, reader: ResponseReader, credential: str | None
    ) -> dict:
        """The Response of ``record`` once the proxy running it has acted on a cancel (its
        lease is read every ``leases.POLL`` seconds), or as it stands after the lease time
        (by then a dead owner's run has been settled failed)."""
        deadline = time.monotonic() + self.state.lease + 1.0
        current: StoredResponse | None = record
        while current is not None and current.status not in TERMINAL_STATUSES:
            if time.monotonic() >= deadline:
                break
            await asyncio.sleep(remote_runs.POLL)
            current = await reader.response(record.id, credential)
            if current is not None:
                current = await self.state.settle(current, reader)
        return (current or record).response

    async def _stream(
        self,
        flow: http.HTTPFlow,
        call: StateCall,
        record: StoredResponse,
        reader: ResponseReader,
        credential: str | None,
    ) -> None:
        starting_after = call.param("starting_after")
        refusal = answers.stream_refusal(record, starting_after)
        if refusal is not None:
            answer(flow, refusal)
            return
        # Sequence numbers start at 0: anything below replays from the start.
        after = max(int(starting_after), -1) if starting_after else -1
        run = self.state.runs.get(record.id)
        if run is not None:
            job: FramesJob = FramesJob(run.follow(after))
        elif await self._runs_elsewhere(record, reader):
            # Another proxy runs it: its events as that proxy stores them, until it ends.
            async def read() -> StoredResponse | None:
                return await self._running_elsewhere(record.id, reader, credential)

            def gone() -> bool:  # the client left: stop reading the store for it
                return job.gone

            job = FramesJob(
                remote_runs.follow(record.id, after, read=read, reader=reader, gone=gone)
            )
        else:
            frames = await reader.events(record.id, after)
            job = FramesJob(iterate(frames))
        await point_at_relay(flow, self.state.relay, job)
