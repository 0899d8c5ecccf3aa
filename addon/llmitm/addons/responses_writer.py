"""What the local Responses API does after the router: it gives a translated Responses call
its id and stores the finished one (:class:`LlmResponsesStateWriter`).

Once the router has planned a create call, a translated response gets the id of its
``response.created``, its terminal event, ``GET`` and the chain. In ``response`` (or in
``error``, when the client left after the terminal event) the final Response object is
stored — or, for a native endpoint, who owns the id it minted, unless the endpoint's
``state`` is emulated: then its own Response, as the client got it, is stored under its id.
A ``background`` call is taken over just after, by :mod:`llmitm.addons.background`. A stored
call's id is marked pending in the store as it goes upstream, for the other proxies that
may share the store (:mod:`llmitm.responses_api.waiting`).
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable
from typing import Any

import orjson
from mitmproxy import http

from llmitm.addons.responses_state import ResponsesState, flow_ids
from llmitm.addons.state import RESPONSES_CREATE_KEY, flow_mint, flow_state
from llmitm.addons.streams import flow_stream, stream_outcome
from llmitm.exchange.stream import StreamRewriter
from llmitm.responses_api.conversation_records import ConversationItemsAdded
from llmitm.responses_api.conversations import turn_items
from llmitm.responses_api.create import CreateCall
from llmitm.responses_api.records import (
    PendingResponse,
    ResponseOwned,
    ResponseOwner,
    ResponsePending,
    StoredResponse,
)
from llmitm.responses_api.seal import ReasoningSeal, reasoning_text
from llmitm.responses_api.stateless import stored_native_response
from llmitm.wire.ids import Mint
from llmitm.wire.sse import SSEDecoder

logger = logging.getLogger(__name__)

_TERMINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})


class LlmResponsesStateWriter:
    """After the router and the translator: ids, and what gets stored."""

    name = "llmitm_responses_state"

    def __init__(self, state: ResponsesState) -> None:
        self.state = state

    async def request(self, flow: http.HTTPFlow) -> None:
        create = flow.metadata.get(RESPONSES_CREATE_KEY)
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
        create.response_id = flow_ids(flow)("resp")
        if create.store and self.state.shared:
            # Another proxy sharing the store, asked for this id before this one stores it,
            # waits for it (llmitm.responses_api.waiting) rather than answer "not found".
            pending = PendingResponse(create.response_id, time.time(), create.created_by)
            self.state.submit(ResponsePending(pending))
        sealing = None
        if create.include_encrypted:
            seal, mint = await self.state.seal(), flow_mint(flow)
            sealing = seal.seal if mint is None else _minted_seal(seal, mint)
        for context in contexts:
            context.response_id = create.response_id
            if create.previous_response_id is not None:
                context.echo["previous_response_id"] = create.previous_response_id
            context.echo["store"] = create.store
            if create.conversation_id is not None:
                context.echo["conversation"] = {"id": create.conversation_id}
            context.seal_reasoning = sealing

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        create = flow.metadata.get(RESPONSES_CREATE_KEY)
        response = flow.response
        if not isinstance(create, CreateCall) or response is None or not response.stream:
            return
        native = self._native(flow, create)
        keeps = self._stores(create, native) or create.conversation_id is not None
        # A translated create streamed as is (a replayed hit paced through the relay), or a
        # native server's stream that no translator reads (guarded or relayed as it is):
        # keep its bytes to store its final Response (or its conversation's items) at the
        # end. A normalised stream's translator holds that Response already.
        if keeps and (response.stream is True or native is not None):
            stream = flow_stream(flow)
            if stream is not None and not stream.pipeline.knows_final_response:
                _KEPT[flow] = kept = []
                stream.watch(kept.append)

    def response(self, flow: http.HTTPFlow) -> None:
        create = flow.metadata.get(RESPONSES_CREATE_KEY)
        response = flow.response
        if not isinstance(create, CreateCall) or response is None:
            return
        create.native_endpoint = create.native_endpoint or _native_winner(flow)
        native = self._native(flow, create)
        try:
            if native is False:
                self._remember_owner(flow, create)
            stores = self._stores(create, native)
            if stores or (create.conversation_id is not None and self._finishes(create, native)):
                self._keep(flow, create, native=native is not None, store=stores)
        except Exception:  # storing must never cost the client its answer
            logger.exception("llmitm: failed to store the response of %s", flow.request.url)
        _KEPT.pop(flow, None)

    def error(self, flow: http.HTTPFlow) -> None:
        # A client may hang up at the terminal event, before the body's end (or the upstream
        # may drop the connection there): the Response it was given is whole and is stored
        # as if the flow had ended cleanly. A stream cut before its terminal event has no
        # final Response, so nothing of it is stored.
        response = flow.response
        if response is not None and response.stream:
            self.response(flow)
        _KEPT.pop(flow, None)

    def _native(self, flow: http.HTTPFlow, create: CreateCall) -> bool | None:
        """``None``: llmitm translated the call; else whether the native endpoint that
        answers it has its state kept by llmitm (``state`` emulated)."""
        name = create.native_endpoint or _native_winner(flow)
        if name is None:
            return None
        endpoint = self.state.settings.config.endpoints.get(name)
        return endpoint is not None and endpoint.emulates_state

    @staticmethod
    def _finishes(create: CreateCall, native: bool | None) -> bool:
        """Whether this flow carries the call's final Response: not a background call
        llmitm runs itself, nor one a native server runs on (an emulated server was sent it
        without ``background``, so it answers in the request)."""
        if native is None:
            return create.response_id is not None and not create.background
        return native or not create.background

    def _stores(self, create: CreateCall, native: bool | None) -> bool:
        """Whether llmitm stores the flow's final Response (not a server that keeps its own)."""
        return create.store and native is not False and self._finishes(create, native)

    def _keep(self, flow: http.HTTPFlow, create: CreateCall, *, native: bool, store: bool) -> None:
        final = final_response(flow, native=native)
        if final is None:
            return
        if native:
            # The server's own id names it; the fields it was not sent are the client's.
            if not isinstance(final.get("id"), str) or not final["id"]:
                return
            final = stored_native_response(final, create.previous_response_id)
        elif final.get("id") != create.response_id:
            return
        if create.conversation_id is not None:
            final["conversation"] = {"id": create.conversation_id}
            added = turn_items(create.turn_input, final)
            self.state.submit(ConversationItemsAdded(create.conversation_id, added))
        if not store:
            return
        now = time.time()
        self.state.save(
            StoredResponse(
                id=final["id"],
                response=final,
                input_items=create.input_items,
                input_json=create.input_json,
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


def final_response(flow: http.HTTPFlow, *, native: bool = False) -> dict[str, Any] | None:
    """The Response object the client got: the stream translator's terminal one, or the
    translated body (``native``: the server's own as its stream's normaliser completed it,
    else as its kept bytes or its body hold it)."""
    response = flow.response
    if response is None:
        return None
    stream = response.stream
    kept = _KEPT.pop(flow, None)
    # A body an addon made whole (a replayed hit answered at once) never went through the
    # stream owner, even when one was set up for it: it is read from the body.
    streamed = response.raw_content is None
    if not native and streamed and isinstance(stream, StreamRewriter) and not stream.relays_as_is:
        return stream.outcome().final_response
    if response.status_code >= 400:
        return None
    if streamed and isinstance(stream, StreamRewriter) and stream.pipeline.knows_final_response:
        # A native server's stream, normalised: the Response its client got, not the
        # server's raw one, and without parsing the stream a second time.
        return stream.outcome().final_response
    if streamed and kept is not None:
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
