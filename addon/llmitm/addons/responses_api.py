"""The local Responses API in mitmproxy: OpenAI's server state for Responses clients whose
endpoint speaks only Chat Completions (logic in ``llmitm.responses_api``, storage in
``llmitm.store``).

Two addons around the router, sharing one :class:`ResponsesState`:

- :class:`LlmResponsesApi` (before the router), ``request``: answers state calls
  (``GET``/``DELETE …/responses/{id}``, ``…/input_items``, ``…/cancel``) from the store, or
  sends them to the native endpoint that owns the id; on a create call it inlines the stored
  chain of ``previous_response_id`` into ``input`` (so the router translates a plain,
  stateless request) and opens llmitm's own ``encrypted_content`` reasoning tokens;
- :class:`LlmResponsesRecorder` (after ``llmitm_responses``): once the router has planned a
  create call, gives a translated response its id (the one of ``response.created``, the
  terminal event, ``GET`` and the chain), takes ``background`` calls over, and in
  ``response`` stores the final Response object (or, for native endpoints, who owns the id).

Everything stored keeps the credential fingerprint of the request that created it, and every
read is that of the caller's credential unless the configuration says ``responses_scope =
"shared"`` (``llmitm.responses_api.scope``): another key, or none, gets OpenAI's 404 — and a
native endpoint's id is only sent there, with the endpoint's key, for the key that made it.

Reads await the store (they answer the client); writes go through its queue.
"""

from __future__ import annotations

import logging
import secrets
import time
import weakref
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import orjson
from mitmproxy import ctx, http
from mitmproxy.addonmanager import Loader

from llmitm.addons.relay import LlmRelay
from llmitm.addons.responses import redact_credentials
from llmitm.addons.settings import LlmitmSettings
from llmitm.addons.state import (
    METADATA_KEY,
    RESPONSES_CREATE_KEY,
    FlowState,
    flow_mint,
    flow_state,
)
from llmitm.addons.store import LlmStore
from llmitm.addons.streams import flow_stream, stream_outcome
from llmitm.exchange.stream import StreamRewriter
from llmitm.relay.client import UpstreamRequest, send
from llmitm.relay.frames import FramesJob, iterate
from llmitm.responses_api import answers
from llmitm.responses_api.answers import LocalAnswer
from llmitm.responses_api.background import BackgroundRun
from llmitm.responses_api.create import CreateCall, prepare_create
from llmitm.responses_api.paths import StateCall, classify_state_path, owner_url
from llmitm.responses_api.records import (
    ResponseDeleted,
    ResponseEvents,
    ResponseOwned,
    ResponseOwner,
    ResponseReader,
    ResponseSaved,
    ResponsesPurged,
    StoredResponse,
    readable,
)
from llmitm.responses_api.scope import creator, reader_credential
from llmitm.responses_api.seal import ReasoningSeal, reasoning_text
from llmitm.routing.affinity import TtlLru
from llmitm.routing.plan import plan_for_endpoint
from llmitm.store.api import UsageRecord, Write
from llmitm.store.memory_responses import MemoryResponses
from llmitm.translate.errors import TranslationError
from llmitm.translate.validation import validate_request
from llmitm.wire.errors import ApiError
from llmitm.wire.ids import IdFactory, Mint, random_id
from llmitm.wire.objects import response_object
from llmitm.wire.paths import classify_path
from llmitm.wire.sse import SSEDecoder
from llmitm.wire.usage import usage_tokens

logger = logging.getLogger(__name__)

CREATE_KEY = RESPONSES_CREATE_KEY
_TERMINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})


def answer(flow: http.HTTPFlow, local: LocalAnswer) -> None:
    flow.response = http.Response.make(
        local.status,
        orjson.dumps(local.body),
        {"content-type": "application/json", **local.headers},
    )


class ResponsesState:
    """What both addons share: the store, the seal, the live background runs."""

    def __init__(self, settings: LlmitmSettings, store: LlmStore, relay: LlmRelay) -> None:
        self.settings = settings
        self.store = store
        self.relay = relay
        self.runs: dict[str, BackgroundRun] = {}
        self.owners: TtlLru[str, ResponseOwner] = TtlLru(100_000, 24 * 3600.0)
        """Native ids this process saw minted → endpoint and creator, for synchronous
        lookups (the store has them all, for as long as the TTL option says)."""
        self.memory = MemoryResponses()
        self._seal: ReasoningSeal | None = None
        self._fingerprint_key: bytes | None = None
        self._purged = False

    async def reader(self) -> ResponseReader:
        """The store's Responses state, or the in-memory one when llmitm keeps no store."""
        store = await self.store.ready()
        if not self._purged:
            self._purged = True
            self.submit(ResponsesPurged(time.time()))
        return store if isinstance(store, ResponseReader) else self.memory

    def submit(self, write: Write) -> None:
        """Hand a write to the store's queue (never awaited), or apply it in memory."""
        if isinstance(self.store.store, ResponseReader):
            self.store.submit(write)
        else:
            self.memory.apply(write)

    async def seal(self) -> ReasoningSeal:
        if self._seal is None:
            key = await (await self.reader()).seal_key()
            # Without a store the key lives as long as the process: tokens then only carry
            # reasoning within one run, which is all a store-less proxy can promise.
            self._seal = ReasoningSeal(key)
        return self._seal

    async def creator(self, flow: http.HTTPFlow) -> str:
        """Who ``flow``'s request is, as stored with what it creates (a fingerprint)."""
        if self._fingerprint_key is None:
            key = await (await self.reader()).fingerprint_key()
            # Without a store the key lives as long as the process, as its state does.
            self._fingerprint_key = key or secrets.token_bytes(32)
        return creator(flow.request.headers.items(multi=True), self._fingerprint_key)

    def credential(self, created_by: str) -> str | None:
        """The credential a request by ``created_by`` reads stored state with."""
        return reader_credential(self.settings.config.settings.responses_scope, created_by)

    def expires_at(self, now: float) -> float | None:
        ttl = ctx.options.llmitm_responses_ttl
        return now + ttl if ttl > 0 else None

    def known_owner(self, response_id: str) -> ResponseOwner | None:
        """The native endpoint known to own ``response_id``, and for whom it minted it."""
        return self.owners.get(response_id, time.monotonic())

    def save(self, record: StoredResponse) -> None:
        self.submit(ResponseSaved(record))


class LlmResponsesApi:
    """State calls and create-call preparation, before the router."""

    name = "llmitm_responses_api"

    def __init__(self, state: ResponsesState) -> None:
        self.state = state

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

    def done(self) -> None:
        # Before the store closes (this addon comes first): a run cut by the shutdown ends
        # failed in the store instead of in_progress forever.
        for run in list(self.state.runs.values()):
            run.abandon("llmitm stopped before the background response finished.")

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
            body = orjson.loads(content)
        except orjson.JSONDecodeError:
            return  # the router answers the 400
        if not isinstance(body, dict):
            return
        try:
            validate_request(body, "responses")
        except TranslationError:
            return  # the router answers the 400, before anything reads the body
        created_by = await self.state.creator(flow)
        create, changed = await prepare_create(
            body,
            content,
            await self.state.reader(),
            self.state.seal,
            store_default=bool(ctx.options.llmitm_responses_store),
            ids=_ids(flow),
            known_owner=self.state.known_owner,
            credential=self.state.credential(created_by),
        )
        if create.previous_foreign:
            # Not sent on: the endpoint, asked with llmitm's key, would find it.
            previous = create.previous_response_id or ""
            answer(flow, answers.error_answer(answers.previous_not_found(previous)))
            return
        create.created_by = created_by
        if changed:
            flow.request.content = orjson.dumps(body)
        flow.metadata[CREATE_KEY] = create

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
        if call.action == "retrieve":
            if answers.parse_flag(call.param("stream")):
                await self._stream(flow, call, record, reader)
            else:
                answer(flow, answers.retrieve(record))
        elif call.action == "delete":
            if run is not None:
                run.cancel()
                self.state.runs.pop(record.id, None)
            self.state.submit(ResponseDeleted(record.id))
            answer(flow, answers.deleted(record.id))
        elif call.action == "input_items":
            answer(flow, answers.input_items_page(record, call))
        else:
            self._cancel(flow, record, run)

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
        for header in plan.remove_headers:
            flow.request.headers.pop(header, None)
        for header, value in plan.set_headers.items():
            flow.request.headers[header] = value
        flow.request.headers["accept-encoding"] = "identity"
        routed = CreateCall(store=False, background=False, include_encrypted=False)
        routed.native_endpoint = endpoint.name
        flow.metadata[CREATE_KEY] = routed

    def _cancel(
        self, flow: http.HTTPFlow, record: StoredResponse, run: BackgroundRun | None
    ) -> None:
        refusal = answers.cancel_refusal(record)
        if refusal is not None:
            answer(flow, refusal)
            return
        if run is not None:
            run.cancel()
            response = run.response
        else:
            # Queued or in progress in a process that is gone: nothing runs it any more.
            response = answers.cancelled(record.response)
            self.state.save(replace(record, response=response))
        answer(flow, LocalAnswer(200, response))

    async def _stream(
        self,
        flow: http.HTTPFlow,
        call: StateCall,
        record: StoredResponse,
        reader: ResponseReader,
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
        else:
            frames = await reader.events(record.id, after)
            job = FramesJob(iterate(frames))
        await point_at_relay(flow, self.state.relay, job)


class LlmResponsesRecorder:
    """After the router and the translator: ids, background takeover, what gets stored."""

    name = "llmitm_responses_recorder"

    def __init__(self, state: ResponsesState) -> None:
        self.state = state

    async def request(self, flow: http.HTTPFlow) -> None:
        create = flow.metadata.get(CREATE_KEY)
        routed_state = flow_state(flow)
        if not isinstance(create, CreateCall) or flow.response or routed_state is None:
            return
        plan = routed_state.plan
        if plan.client_api != "responses":
            return
        routed = routed_state.routed
        if routed is not None and routed.candidates:
            # Relayed: whichever endpoint answers, a translated answer carries the one id.
            contexts = [c for p, c, _ in routed.candidates.values() if p.upstream_api == "chat"]
        elif plan.upstream_api == "responses":
            create.native_endpoint = plan.endpoint.name  # it owns the id it will mint
            return
        else:
            contexts = [routed_state.context]
        if not contexts:
            return
        create.response_id = _ids(flow)("resp")
        sealing = None
        if create.include_encrypted:
            seal, mint = await self.state.seal(), flow_mint(flow)
            sealing = seal.seal if mint is None else _minted_seal(seal, mint)
        for context in contexts:
            context.response_id = create.response_id
            if create.previous_response_id is not None:
                context.echo["previous_response_id"] = create.previous_response_id
            context.echo["store"] = create.store
            context.seal_reasoning = sealing
        if create.background:
            await self._background(flow, routed_state, create)

    async def _background(
        self, flow: http.HTTPFlow, flow_state: FlowState, create: CreateCall
    ) -> None:
        if not create.store:
            answer(
                flow,
                answers.invalid(
                    "Background mode requires store=true; remove store=false or background.",
                    "background",
                ),
            )
            return
        # llmitm makes the upstream call itself: the same translated request, always streamed
        # so progress is stored event by event and a cancel can stop it mid-way.
        chat = orjson.loads(flow.request.get_content(strict=False) or b"{}")
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
        upstream = UpstreamRequest(
            method="POST",
            url=flow.request.url,
            headers=[(k, v) for k, v in flow.request.headers.items(multi=True)],
            body=orjson.dumps(chat),
        )
        context = flow_state.context
        now = time.time()
        queued = response_object(
            response_id=create.response_id or _ids(flow)("resp"),
            created_at=int(now),
            model=context.model or "",
            echo=context.echo,
            status="queued",
        )
        record = StoredResponse(
            id=queued["id"],
            response=queued,
            input_items=create.input_items,
            previous_response_id=create.previous_response_id,
            created_at=now,
            expires_at=self.state.expires_at(now),
            credential=create.created_by,
        )
        state = self.state

        def record_events(batch: list[tuple[int, bytes]]) -> None:
            state.submit(ResponseEvents(record.id, tuple(batch)))

        plan = flow_state.plan

        def record_state(response: dict[str, Any]) -> None:
            state.save(replace(record, response=response))
            if response.get("status") not in answers.TERMINAL_STATUSES:
                return
            state.runs.pop(record.id, None)
            # No flow carries this upstream call, so LlmUsage never sees it: account here.
            tokens = usage_tokens(response.get("usage"))
            if tokens is not None:
                input_tokens, cached, output, reasoning = tokens
                usage = UsageRecord(
                    at=datetime.now(UTC),
                    endpoint=plan.endpoint.name,
                    model=context.model or "",
                    route=plan.route,
                    input_tokens=input_tokens,
                    cached_tokens=cached,
                    output_tokens=output,
                    reasoning_tokens=reasoning,
                )
                state.store.submit(usage)

        state.save(record)
        run = BackgroundRun(queued, context, record_events=record_events, record_state=record_state)
        state.runs[record.id] = run
        relay = state.relay
        run.start(lambda: _open(upstream, relay))
        # The flow no longer goes upstream: no translation, no credentials on it.
        redact_credentials(flow, flow_state)
        del flow.metadata[METADATA_KEY]
        if flow_state.client_stream:
            await point_at_relay(flow, relay, FramesJob(run.follow()))
        else:
            answer(flow, LocalAnswer(200, run.response))

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        create = flow.metadata.get(CREATE_KEY)
        response = flow.response
        if not isinstance(create, CreateCall) or response is None or response.stream is not True:
            return
        if create.response_id is not None and create.store and not create.background:
            # A translated create streamed as is: a replayed hit paced through the relay. No
            # translator holds its final Response, so keep its bytes to store it at the end.
            stream = flow_stream(flow)
            if stream is not None:
                _KEPT[flow] = kept = []
                stream.watch(kept.append)

    def response(self, flow: http.HTTPFlow) -> None:
        create = flow.metadata.get(CREATE_KEY)
        response = flow.response
        if not isinstance(create, CreateCall) or response is None:
            return
        create.native_endpoint = create.native_endpoint or _native_winner(flow)
        try:
            if create.native_endpoint is not None:
                self._remember_owner(flow, create)
            elif create.response_id is not None and create.store and not create.background:
                self._store(flow, create)
        except Exception:  # storing must never cost the client its answer
            logger.exception("llmitm: failed to store the response of %s", flow.request.url)
        _KEPT.pop(flow, None)

    def _store(self, flow: http.HTTPFlow, create: CreateCall) -> None:
        final = final_response(flow)
        if final is None or final.get("id") != create.response_id:
            return
        now = time.time()
        self.state.save(
            StoredResponse(
                id=final["id"],
                response=final,
                input_items=create.input_items,
                previous_response_id=create.previous_response_id,
                created_at=now,
                expires_at=self.state.expires_at(now),
                credential=create.created_by,
            )
        )

    def _remember_owner(self, flow: http.HTTPFlow, create: CreateCall) -> None:
        response = flow.response
        assert response is not None
        if flow.request.method != "POST" or response.status_code >= 400:
            return
        response_id: str | None = None
        outcome = stream_outcome(flow)
        if outcome is not None:
            response_id = outcome.response_id
        else:
            body = _json(response.get_content(strict=False))
            response_id = body.get("id") if isinstance(body, dict) else None
        if not isinstance(response_id, str) or not response_id:
            return
        now = time.time()
        endpoint = create.native_endpoint or ""
        owner = ResponseOwner(
            response_id, endpoint, now, self.state.expires_at(now), create.created_by
        )
        self.state.owners.put(response_id, owner, time.monotonic())
        self.state.submit(ResponseOwned(owner))


_KEPT: weakref.WeakKeyDictionary[http.HTTPFlow, list[bytes]] = weakref.WeakKeyDictionary()
"""The chunks of a stream relayed as it is whose final Response is to be stored."""


def final_response(flow: http.HTTPFlow) -> dict[str, Any] | None:
    """The Response object the client got: the stream translator's terminal one, or the
    translated body."""
    response = flow.response
    if response is None:
        return None
    stream = response.stream
    kept = _KEPT.pop(flow, None)
    if isinstance(stream, StreamRewriter) and not stream.relays_as_is:
        return stream.outcome().final_response
    if response.status_code >= 400:
        return None
    if kept is not None:
        return _terminal_response(b"".join(kept))
    content = response.get_content(strict=False)
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        # A whole stream an addon made (a replayed hit): stored like a live one, so a later
        # previous_response_id in the same run finds it.
        return _terminal_response(content)
    body = _json(content)
    return body if isinstance(body, dict) and body.get("object") == "response" else None


def _terminal_response(content: bytes | None) -> dict[str, Any] | None:
    decoder = SSEDecoder()
    final: dict[str, Any] | None = None
    for _name, data in [*decoder.feed(content or b""), *decoder.close()]:
        event = _json(data)
        if isinstance(event, dict) and event.get("type") in _TERMINAL_EVENTS:
            final = event.get("response") if isinstance(event.get("response"), dict) else final
    return final


def _json(content: bytes | None) -> Any:
    try:
        return orjson.loads(content or b"")
    except orjson.JSONDecodeError:
        return None


async def point_at_relay(flow: http.HTTPFlow, relay: LlmRelay, job: FramesJob) -> None:
    """Stream ``job`` to the client: mitmproxy cannot stream a body an addon makes, so the
    flow goes to the relay, which serves the job."""
    server = await relay.ready()
    flow.request.method = "GET"
    flow.request.content = b""
    relay.point(flow, server.register(job))


async def _open(upstream: UpstreamRequest, relay: LlmRelay) -> Any:
    server = relay.server
    return await send(
        upstream,
        tls_context=server.tls_context if server is not None else None,
        connect_timeout=server.connect_timeout if server is not None else 30.0,
    )


def _ids(flow: http.HTTPFlow) -> IdFactory:
    """The flow's id source: its mint when it is recorded or replayed."""
    mint = flow_mint(flow)
    return random_id if mint is None else mint.id


def _minted_seal(seal: ReasoningSeal, mint: Mint) -> Callable[[dict[str, Any]], str]:
    """Seal through the flow's mint: a replay hands out the recorded token, which this
    process's key cannot open, so the seal is told what it holds for when it comes back."""

    def sealing(item: dict[str, Any]) -> str:
        token: str = mint.take("sealed", lambda: seal.seal(item))
        if mint.replayed(token):
            seal.remember(token, reasoning_text(item))
        return token

    return sealing


def _native_winner(flow: http.HTTPFlow) -> str | None:
    """A relayed flow a native Responses endpoint answered: that endpoint (it owns the id)."""
    state = flow_state(flow)
    routed = state.routed if state is not None else None
    if state is None or routed is None or not routed.relayed:
        return None
    return state.plan.endpoint.name if state.plan.upstream_api == "responses" else None
