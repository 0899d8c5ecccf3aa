"""Error shapes of the two APIs and the mapping between them.

Every provider spells errors a little differently (llama.cpp uses an integer ``code`` and its
own ``type``, OpenRouter puts ``{"code": 400}`` inside a chat chunk, Azure nests content-filter
details in ``innererror``, OpenAI's Responses stream nests ``error`` in the ``error`` event).
:func:`normalise_error` reads any of them into one :class:`ApiError`; the ``*_body`` /
``*_event`` functions write it back out in the shape a client of either API expects, keeping
status, type and code, and renaming codes clients act on (context length, content filter).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
CONTENT_FILTER = "content_filter"
# Codex retries every response.failed code it does not know, five times. A content-filter
# verdict will not change on retry, so Responses clients get OpenAI's non-retryable code.
RESPONSES_CONTENT_FILTER_CODE = "invalid_prompt"

_CONTEXT_HINTS = re.compile(
    r"context[ _-]?(length|size|window)|maximum context|too many tokens|exceed_context_size",
    re.IGNORECASE,
)
_CONTENT_FILTER_HINTS = {
    "content_filter",
    "ResponsibleAIPolicyViolation",
    "content_policy_violation",
}

_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    409: "conflict_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}


@dataclass(frozen=True, slots=True)
class ApiError:
    """One error, independent of the API it came from or goes to."""

    message: str
    type: str = "server_error"
    code: str | None = None
    param: str | None = None
    status: int = 500


def _str_or_none(value: Any) -> str | None:
    if value is None:
        return None
    return value if isinstance(value, str) else str(value)


def _canonical_code(code: str | None, type_: str, message: str, inner: Any) -> str | None:
    """Rename the codes that clients branch on to OpenAI's spelling."""
    inner_code = inner.get("code") if isinstance(inner, dict) else None
    if not isinstance(inner_code, str):
        inner_code = None  # a provider's odd shape (a list, a number) is no filter verdict
    if code in _CONTENT_FILTER_HINTS or inner_code in _CONTENT_FILTER_HINTS:
        return CONTENT_FILTER
    if code == CONTEXT_LENGTH_EXCEEDED or _CONTEXT_HINTS.search(f"{type_} {code or ''} {message}"):
        return CONTEXT_LENGTH_EXCEEDED
    return code


# What an error's code says about its HTTP status when the error itself carries none (a
# mid-stream error event): a rate limit is a 429 and a context overflow a 400, not a 500.
_STATUS_BY_CODE = {
    "rate_limit_exceeded": 429,
    "insufficient_quota": 429,
    CONTEXT_LENGTH_EXCEEDED: 400,
    RESPONSES_CONTENT_FILTER_CODE: 400,
    CONTENT_FILTER: 400,
}


def _status_from(raw: dict[str, Any], fallback: int | None) -> int:
    for key in ("status", "code"):
        value = raw.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and 400 <= value <= 599:
            return value
    code = raw.get("code")
    if isinstance(code, str) and code in _STATUS_BY_CODE:
        return _STATUS_BY_CODE[code]
    return fallback if fallback is not None else 500


def normalise_error(payload: Any, status: int | None = None) -> ApiError:
    """Read an error in any known spelling.

    ``payload`` may be a whole body (``{"error": {...}}``), the inner error object, a Responses
    ``error`` event (nested or flat) or a ``response.failed`` response's ``error``.
    """
    if isinstance(payload, dict) and isinstance(payload.get("error"), dict):
        payload = payload["error"]
    if not isinstance(payload, dict):
        text = _str_or_none(payload) or "Unknown upstream error"
        return ApiError(message=text, status=status or 500)
    message = _str_or_none(payload.get("message")) or "Unknown upstream error"
    raw_code = payload.get("code")
    code = raw_code if isinstance(raw_code, str) else None
    http_status = _status_from(payload, status)
    type_ = _str_or_none(payload.get("type")) or _TYPE_BY_STATUS.get(http_status, "server_error")
    code = _canonical_code(code, type_, message, payload.get("innererror"))
    if code == CONTEXT_LENGTH_EXCEEDED:
        type_ = "invalid_request_error"
        if http_status >= 500:
            http_status = 400
    if code is None and http_status == 429:
        code = "rate_limit_exceeded"
    return ApiError(
        message=message,
        type=type_,
        code=code,
        param=_str_or_none(payload.get("param")),
        status=http_status,
    )


def openai_error_body(error: ApiError) -> dict[str, Any]:
    """The JSON body of an HTTP error response, identical for both APIs."""
    return {
        "error": {
            "message": error.message,
            "type": error.type,
            "param": error.param,
            "code": error.code,
        }
    }


def chat_error_chunk(error: ApiError) -> dict[str, Any]:
    """A mid-stream chat error: openai-python raises ``APIError`` on any chunk with ``error``."""
    return openai_error_body(error)


def responses_error_code(error: ApiError) -> str:
    """The ``response.error.code`` a Responses client sees (never ``None``)."""
    if error.code == CONTENT_FILTER:
        return RESPONSES_CONTENT_FILTER_CODE
    if error.code:
        return error.code
    if error.status == 429:
        return "rate_limit_exceeded"
    return "server_error"


def responses_error_event(error: ApiError, sequence_number: int) -> dict[str, Any]:
    """The ``error`` event, nested as the live API sends it and flat as the spec documents it."""
    code = responses_error_code(error)
    return {
        "type": "error",
        "sequence_number": sequence_number,
        "error": {
            "type": error.type,
            "code": code,
            "message": error.message,
            "param": error.param,
        },
        "code": code,
        "message": error.message,
        "param": error.param,
    }


def response_object_error(error: ApiError) -> dict[str, Any]:
    """The ``error`` field of a failed Response object."""
    return {"code": responses_error_code(error), "message": error.message}
