"""The Conversations API (``/v1/conversations`` and its ``/items``), answered by llmitm
from its store whatever the backend (logic in :mod:`llmitm.responses_api.conversations`,
storage in :mod:`llmitm.store.conversations`).

:class:`LlmConversations`, ``request``: a Conversations call is answered here and goes
nowhere. A conversation belongs to the credential that created it, as stored responses do
(``llmitm.responses_api.scope``): another key gets OpenAI's 404. The ``conversation`` of a
``responses.create`` is :mod:`llmitm.addons.responses_api`'s; the turn's items are appended
by :mod:`llmitm.addons.responses_writer`.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import orjson
from mitmproxy import http

from llmitm.addons.responses_state import ResponsesState, answer, flow_ids
from llmitm.responses_api import answers, conversations
from llmitm.wire.errors import ApiError

logger = logging.getLogger(__name__)


class LlmConversations:
    """Answers Conversations calls from the store."""

    name = "llmitm_conversations"

    def __init__(self, state: ResponsesState) -> None:
        self.state = state

    async def request(self, flow: http.HTTPFlow) -> None:
        if flow.response or flow.error or not flow.live:
            return
        if not self.state.settings.config.routes:
            return  # the embedded default: OpenAI's own Conversations API answers
        call = conversations.conversation_call(flow.request.method, flow.request.path)
        if call is None:
            return
        try:
            await self._answer(flow, call)
        except Exception:  # an llmitm bug must cost this request, never the proxy
            logger.exception("llmitm: Conversations API failed on %s", flow.request.pretty_url)
            failed = ApiError(
                message="llmitm's local Conversations API failed; see the proxy's log.",
                type="server_error",
                code="llmitm_error",
                status=500,
            )
            answer(flow, answers.error_answer(failed))

    async def _answer(self, flow: http.HTTPFlow, call: conversations.ConversationCall) -> None:
        body = _body(flow)
        if body is _INVALID:
            answer(flow, answers.invalid("The request body is not valid JSON.", None))
            return
        created_by = await self.state.creator(flow)
        ids = flow_ids(flow)
        if call.action == "create":
            outcome = conversations.create(body, ids=ids, now=time.time(), credential=created_by)
        else:
            reader = await self.state.conversations()
            target = call.conversation_id or ""
            found = await reader.conversation(target, self.state.credential(created_by))
            if found is None:
                answer(flow, conversations.not_found(target))
                return
            items = await reader.conversation_items(target)
            outcome = conversations.answer_call(call, found, items, body, ids)
        for write in outcome.writes:
            self.state.submit(write)
        answer(flow, outcome.answer)


_INVALID: Any = object()


def _body(flow: http.HTTPFlow) -> Any:
    content = flow.request.get_content(strict=False)
    if not content:
        return None
    try:
        return orjson.loads(content)
    except orjson.JSONDecodeError:
        return _INVALID
