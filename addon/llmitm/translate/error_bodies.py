"""Upstream HTTP error bodies → the OpenAI error body the client's API expects.

This module owns decoding whatever an upstream answered with (OpenAI and Azure JSON, llama.cpp's
integer codes, vLLM's flat errors, FastAPI ``detail``, ``{"error": "text"}``, HTML or plain
text from a gateway) into ``{"error": {message, type, param, code}}`` with the right status.
Reading the many spellings is :func:`llmitm.wire.errors.normalise_error`'s job; this module
adds the body decoding, the HTTP status rules and the per-API code renames.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import orjson

from llmitm.wire.errors import (
    CONTENT_FILTER,
    CONTEXT_LENGTH_EXCEEDED,
    RESPONSES_CONTENT_FILTER_CODE,
    normalise_error,
    openai_error_body,
)

MAX_MESSAGE_CHARS = 2000
"""Non-JSON bodies (an HTML error page from a gateway) are cut to keep the error readable."""


def _decode(body: Any) -> Any:
    """JSON when the body parses as JSON, else its text."""
    if isinstance(body, bytes | bytearray | memoryview):
        raw = bytes(body)
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            return raw.decode("utf-8", errors="replace")
    if isinstance(body, str):
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            return body
    return body


def _text_message(text: str, status: int) -> str:
    text = text.strip()
    if not text:
        return f"Upstream returned HTTP {status} with an empty body."
    return text if len(text) <= MAX_MESSAGE_CHARS else text[:MAX_MESSAGE_CHARS] + "…"


def _detail_message(detail: Any) -> str:
    """FastAPI's ``detail``: a string, or a list of validation errors with ``msg``."""
    if isinstance(detail, str):
        return detail
    if isinstance(detail, list):
        messages = [entry["msg"] for entry in detail if isinstance(entry, dict) and "msg" in entry]
        if messages:
            return "; ".join(str(message) for message in messages)
    return orjson.dumps(detail).decode()


def _error_payload(decoded: Any, status: int) -> dict[str, Any]:
    """Something :func:`normalise_error` reads without losing the message."""
    if not isinstance(decoded, dict):
        text = decoded if isinstance(decoded, str) else orjson.dumps(decoded).decode()
        # As an object, so the error type follows the status (a bare string is server_error).
        return {"message": _text_message(text, status)}
    error = decoded.get("error")
    if isinstance(error, dict):
        return decoded
    if isinstance(error, str):  # {"error": "model not found"} (Ollama, many small servers)
        return {**decoded, "message": error, "error": None}
    if "message" in decoded:  # flat: vLLM {"object": "error", "message", "type", "code"}
        return decoded
    if "detail" in decoded:
        return {"message": _detail_message(decoded["detail"])}
    return {"message": _text_message(orjson.dumps(decoded).decode(), status)}


def translate_error_body(
    body: Any, status: int, to: Literal["chat", "responses"]
) -> tuple[int, dict[str, Any]]:
    """``(status, body)`` to send a client of API ``to`` for an upstream error.

    The upstream's HTTP status is kept when it is an error status; an error inside a 2xx
    body takes the status the error names (else 500). Context-length errors always get
    ``context_length_exceeded`` (and a 4xx: retrying will not help). An Azure content-filter
    verdict is ``content_filter`` for chat clients and ``invalid_prompt`` for Responses
    clients, a code Codex does not retry.
    """
    if to not in ("chat", "responses"):
        raise ValueError(f"to must be 'chat' or 'responses', not {to!r}")
    error_status = status if 400 <= status <= 599 else None
    error = normalise_error(_error_payload(_decode(body), status), error_status)
    http_status = error_status if error_status is not None else error.status
    if error.code == CONTEXT_LENGTH_EXCEEDED and http_status >= 500:
        http_status = 400
    code = error.code
    if to == "responses" and code == CONTENT_FILTER:
        code = RESPONSES_CONTENT_FILTER_CODE
    error = dataclasses.replace(error, code=code, status=http_status)
    return http_status, openai_error_body(error)
