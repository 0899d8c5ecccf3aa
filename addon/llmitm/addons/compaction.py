"""Responses compaction over endpoints that have none (logic in
``llmitm.responses_api.compaction``).

Two addons around the router:

- :class:`LlmCompaction` (after ``llmitm_responses_api``, before the router), ``request``: a
  ``…/responses/compact`` call, or a create call carrying a ``compaction_trigger`` item, whose
  route has an endpoint that is not a native OpenAI/Azure Responses endpoint becomes an
  ordinary summarisation create call, which the router routes, translates and fails over
  like any other (and the recorder records). A route of native endpoints only gets the call
  as it is: a compact call goes to its first endpoint's own ``/responses/compact``;
- :class:`LlmCompactionAnswer` (after the translator, before ``llmitm_responses_state``,
  which stores what it makes), ``response``: the summary becomes the compaction answer the
  client asked for, sealed into the ``compaction`` item's ``encrypted_content``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import Any

import orjson
from mitmproxy import http

from llmitm.addons.parsed import peek_parsed
from llmitm.addons.responses_state import ResponsesState, answer
from llmitm.addons.state import flow_mint
from llmitm.responses_api import answers
from llmitm.responses_api.compaction import (
    COMPACTION,
    ITEM_TYPES,
    TRIGGER,
    CompactionCall,
    CompactionError,
    compacted_response,
    compaction_item,
    create_path,
    drop_unopened,
    event_stream,
    has_trigger,
    no_summary,
    summary_request,
    summary_text,
    triggered_events,
    triggered_response,
)
from llmitm.responses_api.create import prepare_create
from llmitm.routing.config import Endpoint
from llmitm.routing.plan import match_route, plan_for_endpoint
from llmitm.translate.errors import TranslationError
from llmitm.translate.validation import validate_request
from llmitm.wire.errors import ApiError
from llmitm.wire.ids import random_id
from llmitm.wire.paths import classify_path

logger = logging.getLogger(__name__)

COMPACTION_KEY = "llmitm_compaction"


def is_native(endpoint: Endpoint) -> bool:
    """An endpoint that runs compactions itself: OpenAI's or Azure's Responses API."""
    return endpoint.kind in ("openai", "azure") and "responses" in endpoint.apis


class LlmCompaction:
    """Compaction calls become summarisation calls, before the router plans them."""

    name = "llmitm_compaction"

    def __init__(self, state: ResponsesState) -> None:
        self.state = state

    def request(self, flow: http.HTTPFlow) -> Awaitable[None] | None:
        # Synchronous until a compaction is seen: every other create call pays two checks.
        if flow.response or flow.error or not flow.live or flow.request.method != "POST":
            return None
        if not self.state.settings.config.routes:
            return None  # the embedded default: OpenAI and Azure traffic passes unchanged
        compact_to = create_path(flow.request.path)
        content = flow.request.get_content(strict=False) or b""
        if compact_to is None and not _may_compact(flow, content):
            return None
        try:
            body = orjson.loads(content)
        except orjson.JSONDecodeError:
            body = None
        if not isinstance(body, dict):
            if compact_to is not None:
                answer(flow, answers.invalid("The request body must be a JSON object.", None))
            return None  # a create call: the router answers the 400
        return self._guarded(flow, body, compact_to)

    async def _guarded(
        self, flow: http.HTTPFlow, body: dict[str, Any], compact_to: str | None
    ) -> None:
        try:
            await self._compaction(flow, body, compact_to)
        except CompactionError as exc:
            answer(flow, answers.error_answer(exc.error))
        except TranslationError as exc:
            answer(flow, answers.error_answer(exc.to_api_error()))
        except Exception:  # an llmitm bug must cost this request, never the proxy
            logger.exception("llmitm: compaction failed on %s", flow.request.pretty_url)
            answer(flow, answers.error_answer(_llmitm_error()))

    async def _compaction(
        self, flow: http.HTTPFlow, body: dict[str, Any], compact_to: str | None
    ) -> None:
        config = self.state.settings.config
        model = body.get("model")
        route = match_route(
            config, model if isinstance(model, str) else "", flow.request.pretty_host
        )
        if route is None:
            return  # not routed: passes through untouched
        validate_request(body, "responses")  # a compact call has a create call's shape
        endpoints = [config.endpoints[name] for name in route.endpoints]
        if all(is_native(endpoint) for endpoint in endpoints):
            if compact_to is not None:
                _to_native(flow, body, endpoints[0], route.model)
            return  # a create call: the router sends it on as it is
        if compact_to is None and not has_trigger(body):
            self._drop_unopened(flow, body, endpoints[0].name)
            return
        if compact_to is not None:
            await self._inline(flow, body)
        request, call = summary_request(body, "compact" if compact_to else "trigger")
        call.endpoint = endpoints[0].name
        if compact_to is not None:
            flow.request.path = compact_to
        flow.request.content = orjson.dumps(request)
        flow.metadata[COMPACTION_KEY] = call

    def _drop_unopened(self, flow: http.HTTPFlow, body: dict[str, Any], endpoint: str) -> None:
        dropped = drop_unopened(body.get("input"))
        if dropped:
            logger.warning(
                "llmitm: %s → %s: dropped %d compaction item(s) llmitm cannot open (another "
                "provider's, or sealed under another store's key): their summary is lost",
                body.get("model"),
                endpoint,
                dropped,
            )
            flow.request.content = orjson.dumps(body)

    async def _inline(self, flow: http.HTTPFlow, body: dict[str, Any]) -> None:
        """A compact call is a create call to ``llmitm_responses_api`` too: references,
        ``previous_response_id`` and llmitm's sealed items become plain conversation."""
        mint = flow_mint(flow)
        await prepare_create(
            body,
            await self.state.reader(),
            self.state.seal,
            store_default=False,
            ids=random_id if mint is None else mint.id,
            known_owner=self.state.known_owner,
            credential=self.state.credential(await self.state.creator(flow)),
        )
        previous = body.get("previous_response_id")
        if isinstance(previous, str) and previous:
            raise CompactionError(answers.previous_not_found(previous))


class LlmCompactionAnswer:
    """The summary becomes the compaction answer, once the translator has made it a
    Response object."""

    name = "llmitm_compaction_answer"

    def __init__(self, state: ResponsesState) -> None:
        self.state = state

    def response(self, flow: http.HTTPFlow) -> Awaitable[None] | None:
        call = flow.metadata.get(COMPACTION_KEY)
        response = flow.response
        if not isinstance(call, CompactionCall) or response is None:
            return None
        if response.status_code >= 400:
            return None  # the endpoint's (or llmitm's) error, already in OpenAI's shape
        return self._guarded(flow, call)

    async def _guarded(self, flow: http.HTTPFlow, call: CompactionCall) -> None:
        try:
            self._answer(flow, call, await self._result(flow, call))
        except CompactionError as exc:
            answer(flow, answers.error_answer(exc.error))
        except Exception:  # an llmitm bug must cost this request, never the proxy
            logger.exception("llmitm: compaction answer failed on %s", flow.request.pretty_url)
            answer(flow, answers.error_answer(_llmitm_error()))

    async def _result(self, flow: http.HTTPFlow, call: CompactionCall) -> dict[str, Any]:
        assert flow.response is not None
        try:
            summarised = orjson.loads(flow.response.get_content(strict=False) or b"")
        except orjson.JSONDecodeError:
            summarised = None
        text = summary_text(summarised)
        if not text:
            raise CompactionError(no_summary(call.endpoint))
        seal = await self.state.seal()
        mint = flow_mint(flow)
        ids = random_id if mint is None else mint.id
        if mint is None:
            token = seal.seal_text(text, COMPACTION)
        else:
            # A replay hands out the recorded token, sealed under the recording process's
            # key: the seal is told what it holds, for when the client sends it back.
            token = mint.take(COMPACTION, lambda: seal.seal_text(text, COMPACTION))
            if mint.replayed(token):
                seal.remember(token, text, COMPACTION)
        item = compaction_item(ids("cmp"), token)
        if call.form == "compact":
            return compacted_response(summarised, call, item, ids)
        return triggered_response(summarised, call, item)

    def _answer(self, flow: http.HTTPFlow, call: CompactionCall, result: dict[str, Any]) -> None:
        response = flow.response
        assert response is not None
        if call.stream:
            response.headers["content-type"] = "text/event-stream; charset=utf-8"
            response.content = event_stream(triggered_events(result))
        else:
            response.headers["content-type"] = "application/json"
            response.content = orjson.dumps(result)


_COMPACTION_TYPES = frozenset({*ITEM_TYPES, TRIGGER})


def _may_compact(flow: http.HTTPFlow, content: bytes) -> bool:
    """Whether a request that is not a compact call may hold compaction items or a trigger:
    a Responses create call whose input has an item of such a type — read off the body
    LlmResponsesApi parsed when there is one (a search of the bytes for the name costs
    ~1 ms a MB of history, on every turn), else looked for in the bytes."""
    if not _is_responses_create(flow):
        return False
    parsed = peek_parsed(flow, content)
    if parsed is None:
        return b'"compaction' in content
    items = parsed.get("input")
    return isinstance(items, list) and any(
        isinstance(item, dict) and item.get("type") in _COMPACTION_TYPES for item in items
    )


def _is_responses_create(flow: http.HTTPFlow) -> bool:
    classified = classify_path(flow.request.path)
    return classified is not None and classified.api == "responses"


def _to_native(
    flow: http.HTTPFlow, body: dict[str, Any], endpoint: Endpoint, alias: str | None
) -> None:
    """The compact call as it is, on ``endpoint``'s own compact path, with its credentials."""
    model = alias or str(body.get("model") or "")
    plan = plan_for_endpoint(endpoint, "responses", model)
    url, sep, query = plan.url.partition("?")
    flow.request.url = f"{url}/compact{sep}{query}"
    for header in plan.remove_headers:
        flow.request.headers.pop(header, None)
    for header, value in plan.set_headers.items():
        flow.request.headers[header] = value
    if plan.upstream_model != body.get("model"):
        body["model"] = plan.upstream_model  # an alias, or an Azure deployment
        flow.request.content = orjson.dumps(body)


def _llmitm_error() -> ApiError:
    return ApiError(
        message="llmitm failed to run this compaction; see the proxy's log.",
        type="server_error",
        code="llmitm_error",
        status=500,
    )
