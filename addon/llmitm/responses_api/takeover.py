"""What a background create call becomes once llmitm takes it over from the flow.

The upstream call is the flow's translated request, always streamed with usage so progress
is stored event by event, a cancel can stop it mid-way and its tokens can be accounted. The
first stored record is the ``queued`` Response; the last status gives the usage row (no
flow carries this upstream call, so the usage addon never sees it).
"""

from __future__ import annotations

from typing import Any

import orjson

from llmitm.exchange.usage import UsageRecord, usage_record
from llmitm.responses_api.answers import TERMINAL_STATUSES
from llmitm.responses_api.create import CreateCall
from llmitm.responses_api.records import StoredResponse
from llmitm.translate.context import TranslationContext
from llmitm.wire.objects import response_object
from llmitm.wire.usage import usage_tokens

REFUSAL = "Background mode requires store=true; remove store=false or background."


def upstream_body(content: bytes | None) -> bytes:
    """The translated request body, streamed and asking for the usage chunk."""
    chat = orjson.loads(content or b"{}")
    chat["stream"] = True
    chat["stream_options"] = {"include_usage": True}
    return orjson.dumps(chat)


def queued_record(
    create: CreateCall,
    context: TranslationContext,
    response_id: str,
    now: float,
    expires_at: float | None,
) -> StoredResponse:
    """The stored record of the run before its first upstream byte."""
    queued = response_object(
        response_id=response_id,
        created_at=int(now),
        model=context.model or "",
        echo=context.echo,
        status="queued",
    )
    return StoredResponse(
        id=queued["id"],
        response=queued,
        input_items=create.input_items,
        input_json=create.input_json,
        previous_response_id=create.previous_response_id,
        created_at=now,
        expires_at=expires_at,
        credential=create.created_by,
    )


def finished_usage(
    response: dict[str, Any], *, endpoint: str, model: str, route: str
) -> UsageRecord | None:
    """The usage row of a run whose Response reached a terminal status with usage."""
    if response.get("status") not in TERMINAL_STATUSES:
        return None
    tokens = usage_tokens(response.get("usage"))
    if tokens is None:
        return None
    return usage_record(tokens, endpoint=endpoint, model=model, route=route)
