"""OpenAI's answers to state calls on responses llmitm stores: bodies, statuses, errors.

Pure functions of the stored record (or its absence) and the request's parameters; the
shell sends the :class:`LocalAnswer` back and submits the writes it names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from llmitm.responses_api.items import PageError, list_page
from llmitm.responses_api.paths import StateCall
from llmitm.responses_api.records import StoredResponse
from llmitm.wire.errors import ApiError, openai_error_body

TERMINAL_STATUSES = frozenset({"completed", "failed", "incomplete", "cancelled"})


@dataclass(frozen=True, slots=True)
class LocalAnswer:
    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


def error_answer(error: ApiError) -> LocalAnswer:
    return LocalAnswer(error.status, openai_error_body(error), {"x-should-retry": "false"})


def not_found(response_id: str) -> LocalAnswer:
    """OpenAI's 404 for an id it does not have (never stored, ``store: false``, deleted)."""
    return error_answer(
        ApiError(
            message=f"Response with id '{response_id}' not found.",
            type="invalid_request_error",
            param=None,
            code=None,
            status=404,
        )
    )


def previous_not_found(response_id: str) -> ApiError:
    """OpenAI's 400 for a ``previous_response_id`` it does not have."""
    return ApiError(
        message=f"Previous response with id '{response_id}' not found.",
        type="invalid_request_error",
        param="previous_response_id",
        code="previous_response_not_found",
        status=400,
    )


def invalid(message: str, param: str | None, code: str | None = None) -> LocalAnswer:
    return error_answer(
        ApiError(message=message, type="invalid_request_error", param=param, code=code, status=400)
    )


def retrieve(record: StoredResponse) -> LocalAnswer:
    return LocalAnswer(200, record.response)


def deleted(response_id: str) -> LocalAnswer:
    """OpenAI's deletion object."""
    return LocalAnswer(200, {"id": response_id, "object": "response", "deleted": True})


def input_items_page(record: StoredResponse, call: StateCall) -> LocalAnswer:
    try:
        page = list_page(
            record.input_items,
            limit=call.param("limit"),
            order=call.param("order"),
            after=call.param("after"),
        )
    except PageError as exc:
        return invalid(exc.message, exc.param)
    return LocalAnswer(200, page)


def cancel_refusal(record: StoredResponse) -> LocalAnswer | None:
    """Why ``record`` cannot be cancelled (OpenAI's 400), or ``None`` when it can (or already
    is: cancelling a cancelled response returns it again)."""
    if not record.background:
        return invalid("Only responses created with background=true can be cancelled.", None)
    if record.status in TERMINAL_STATUSES and record.status != "cancelled":
        return invalid(f"Cannot cancel a response with status '{record.status}'.", None)
    return None


def cancelled(response: dict[str, Any]) -> dict[str, Any]:
    """The Response object after a cancel."""
    return dict(response, status="cancelled", completed_at=None)


def stream_refusal(record: StoredResponse, starting_after: str | None) -> LocalAnswer | None:
    """Why ``GET ?stream=true`` cannot replay ``record`` (only background responses keep
    their events), or ``None``."""
    if not record.background:
        return invalid(
            "Streaming a stored response is only supported for responses created with "
            "background=true.",
            "stream",
        )
    if starting_after not in (None, ""):
        try:
            int(starting_after)
        except ValueError:
            return invalid("starting_after must be an integer sequence number.", "starting_after")
    return None


def parse_flag(value: str | None) -> bool:
    return (value or "").lower() in ("1", "true", "yes")
