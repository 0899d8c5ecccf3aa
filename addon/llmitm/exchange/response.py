"""The client's view of a planned create call's response.

Non-streamed bodies and error bodies are translated whole here; streams get a
:class:`~llmitm.translate.pipeline.StreamPipeline` that the proxy feeds chunk by chunk.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from llmitm.routing.plan import Plan
from llmitm.translate.body_to_chat import response_failure, response_to_chat_completion
from llmitm.translate.body_to_responses import chat_completion_to_response
from llmitm.translate.chat_normalise import repair_chat_completion
from llmitm.translate.context import TranslationContext
from llmitm.translate.error_bodies import translate_error_body
from llmitm.translate.guard import StreamGuard
from llmitm.translate.pipeline import StreamPipeline
from llmitm.translate.responses_compat import restore_response_calls
from llmitm.translate.think_summary import response_reasoning_as_summary
from llmitm.wire.errors import ApiError, openai_error_body


@dataclass(frozen=True, slots=True)
class StreamOutcome:
    """What a finished stream was, as the client got it."""

    response_id: str | None
    """The Response id the stream named (a Responses client's stream), for its owner and
    affinity."""
    final_response: dict[str, Any] | None
    """The Response object llmitm made for the client (its terminal event's), to store."""
    usage: dict[str, Any] | None
    """The upstream's usage, in either API's shape, also when the client did not see it."""


def stream_pipeline(
    plan: Plan, context: TranslationContext, *, strip_usage: bool = False
) -> StreamPipeline | StreamGuard:
    """The translator for the upstream's SSE (a normaliser for a third-party server's stream
    of the client's own API), or a guard that relays it byte for byte and only makes sure it
    ends with a terminal event. With ``strip_usage``, either drops the usage chunk llmitm
    asked for on the client's behalf."""
    direction = plan.stream_direction
    if direction is None and context.tools:
        # Calls of tools renamed for a third-party Responses server are restored on the way
        # back, which takes parsed events.
        direction = "normalise-responses"
    if direction is None:
        return StreamGuard(plan.client_api, strip_usage=strip_usage)
    return StreamPipeline(direction, context, strip_usage=strip_usage)


def translate_body(
    status: int, content: bytes | None, plan: Plan, context: TranslationContext
) -> tuple[int, bytes] | None:
    """The status and body the client gets, or ``None`` when the upstream's stand as they are.

    Errors always come out OpenAI-shaped in the client's protocol (llama.cpp's integer codes,
    Azure's content-filter details and plain-text gateway errors included)."""
    if status >= 400:
        parsed = _json_or_text(content)
        new_status, body = translate_error_body(parsed, status, plan.client_api)
        return new_status, orjson.dumps(body)
    if plan.stream_direction == "normalise-chat":
        return _repaired_chat_body(status, content, context)
    summarise = not plan.translates and context.options.reasoning_summary
    if not plan.translates and not context.tools and not summarise:
        return None
    body = _json_object(content)
    if isinstance(body, tuple):
        return body
    if not plan.translates:
        # A native Responses answer whose calls of renamed tools go back to the client's,
        # and whose raw reasoning becomes summary when the endpoint asks for it.
        restore_response_calls(body, context)
        if summarise:
            response_reasoning_as_summary(body)
        return status, orjson.dumps(body)
    if plan.client_api == "chat":
        failure = response_failure(body)
        if failure is not None:
            return failure.status, orjson.dumps(openai_error_body(failure))
        return status, orjson.dumps(response_to_chat_completion(body, context))
    return status, orjson.dumps(chat_completion_to_response(body, context))


def _repaired_chat_body(
    status: int, content: bytes | None, context: TranslationContext
) -> tuple[int, bytes] | None:
    """A third-party chat server's body with what it left out filled in; ``None`` (its own
    bytes) when nothing was missing, or when it is no JSON object: a body llmitm cannot read
    is relayed as it came, as without normalisation (a stream sent with the wrong
    content type, say)."""
    try:
        body = orjson.loads(content or b"")
    except orjson.JSONDecodeError:
        return None
    if type(body) is not dict or not repair_chat_completion(body, context):
        return None
    return status, orjson.dumps(body)


def _json_object(content: bytes | None) -> dict[str, Any] | tuple[int, bytes]:
    """The upstream's body as a JSON object, or the 502 that says it is not one."""
    try:
        body = orjson.loads(content or b"")
    except orjson.JSONDecodeError:
        return _upstream_garbage("The upstream answered with a body that is not JSON.")
    if not isinstance(body, dict):
        return _upstream_garbage("The upstream answered with JSON that is not an object.")
    return body


def _json_or_text(content: bytes | None) -> Any:
    if not content:
        return ""  # an empty body: the error says so (None would read as the message "null")
    try:
        return orjson.loads(content)
    except orjson.JSONDecodeError:
        return content.decode("utf-8", "replace")


def _upstream_garbage(message: str) -> tuple[int, bytes]:
    error = ApiError(message=message, type="server_error", code="bad_upstream_response", status=502)
    return 502, orjson.dumps(openai_error_body(error))
