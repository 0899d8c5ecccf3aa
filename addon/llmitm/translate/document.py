"""Translate a whole document whose kind is read from its content (``llmitm translate``).

A document is a request body, a non-streamed response body, an error body or an SSE stream of
either API. :func:`detect` names it; :func:`translate_document` turns it into the other API
(or, for a Responses stream asked to stay Responses, into a conformant one). Sans-IO: bytes in,
bytes out; the CLI only reads and writes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from llmitm.errors import InputError
from llmitm.translate.body_to_chat import response_failure, response_to_chat_completion
from llmitm.translate.body_to_responses import chat_completion_to_response
from llmitm.translate.context import TranslateOptions, TranslationContext
from llmitm.translate.error_bodies import translate_error_body
from llmitm.translate.errors import TranslationError
from llmitm.translate.pipeline import StreamPipeline
from llmitm.translate.request_to_chat import responses_request_to_chat
from llmitm.translate.request_to_responses import chat_request_to_responses
from llmitm.wire.errors import openai_error_body
from llmitm.wire.sse import DONE_DATA, SSEDecoder

Api = Literal["chat", "responses"]
Kind = Literal[
    "chat-request",
    "responses-request",
    "chat-completion",
    "response",
    "error",
    "chat-stream",
    "responses-stream",
]


class UnreadableInput(InputError, ValueError):
    """The input is none of the documents llmitm knows."""


@dataclass(slots=True)
class Translated:
    kind: Kind
    output: bytes
    warnings: list[str] = field(default_factory=list)


def detect(data: bytes) -> tuple[Kind, Any]:
    """The document's kind, and its parsed JSON for JSON documents (``None`` for streams)."""
    text = data.lstrip()
    if not text:
        raise UnreadableInput("the input is empty")
    if text.startswith((b"{", b"[")):
        try:
            parsed = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            raise UnreadableInput(f"the input is not valid JSON ({exc})") from None
        return _json_kind(parsed), parsed
    return _stream_kind(data), None


def _json_kind(body: Any) -> Kind:
    if not isinstance(body, dict):
        raise UnreadableInput("the JSON input is not an object")
    obj = body.get("object")
    if obj == "chat.completion":
        return "chat-completion"
    if obj == "response":
        return "response"
    if "error" in body and len(body) <= 2:
        return "error"
    if "messages" in body:
        return "chat-request"
    if "input" in body or "instructions" in body or "previous_response_id" in body:
        return "responses-request"
    raise UnreadableInput(
        "the JSON is neither a request (messages / input) nor a response body "
        "(object chat.completion / response) nor an error"
    )


# A stream's kind is read from its first events: this much of it is decoded at first, and
# twice as much each time that holds no event that tells (a stream's first event normally
# does), so a long stream is not decoded a second time just to name it.
_DETECT_BYTES = 1 << 16
# Streams are fed to the pipeline in pieces of this size, as a proxy reads them: one piece of
# many megabytes would have the decoder hold every event of it at once.
_FEED_BYTES = 1 << 14


def _stream_kind(data: bytes) -> Kind:
    size = _DETECT_BYTES
    while True:
        kind = _first_kind(data[:size], whole=size >= len(data))
        if kind is not None:
            return kind
        if size >= len(data):
            raise UnreadableInput(
                "the input is neither JSON nor a server-sent event stream of either API"
            )
        size *= 2


def _first_kind(data: bytes, *, whole: bool) -> Kind | None:
    """The kind its first telling event gives ``data``; ``None`` when no event tells."""
    decoder = SSEDecoder()
    events = decoder.feed(data) + (decoder.close() if whole else [])
    for name, payload in events:
        if payload == DONE_DATA:
            continue
        if name is not None and name.startswith("response."):
            return "responses-stream"
        try:
            obj = orjson.loads(payload)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(obj, dict):
            continue
        event_type = obj.get("type")
        if isinstance(event_type, str) and (
            event_type.startswith("response.") or event_type == "error"
        ):
            return "responses-stream"
        if "choices" in obj or obj.get("object") == "chat.completion.chunk":
            return "chat-stream"
    return None


def translate_document(
    data: bytes,
    to: Api,
    options: TranslateOptions,
    *,
    model: str | None = None,
    include_usage: bool = True,
) -> Translated:
    """Translate ``data`` for a client (or upstream) of API ``to``."""
    kind, body = detect(data)
    context = TranslationContext(options=options, model=model, include_usage=include_usage)
    if kind == "chat-request" and to == "responses":
        mapped = chat_request_to_responses(body, options)
        return Translated(kind, _json(mapped.body), mapped.warnings)
    if kind == "responses-request" and to == "chat":
        mapped = responses_request_to_chat(body, options)
        return Translated(kind, _json(mapped.body), mapped.warnings)
    if kind == "response" and to == "chat":
        failure = response_failure(body)
        if failure is not None:
            return Translated(kind, _json(openai_error_body(failure)))
        return Translated(kind, _json(response_to_chat_completion(body, context)))
    if kind == "chat-completion" and to == "responses":
        return Translated(kind, _json(chat_completion_to_response(body, context)))
    if kind == "error":
        _status, translated = translate_error_body(body, 400, to)
        return Translated(kind, _json(translated))
    if kind == "responses-stream":
        direction = "responses-to-chat" if to == "chat" else "normalise-responses"
        return Translated(kind, _run_stream(data, direction, context))
    if kind == "chat-stream" and to == "responses":
        return Translated(kind, _run_stream(data, "chat-to-responses", context))
    raise UnreadableInput(f"the input is already a {kind.replace('-', ' ')} for the {to} API")


def _run_stream(data: bytes, direction: Any, context: TranslationContext) -> bytes:
    pipeline = StreamPipeline(direction, context)
    feed = pipeline.feed
    out = [pipeline.start()]
    out += [feed(data[at : at + _FEED_BYTES]) for at in range(0, len(data), _FEED_BYTES)]
    out.append(pipeline.close())
    return b"".join(out)


def _json(body: Any) -> bytes:
    return orjson.dumps(body, option=orjson.OPT_INDENT_2) + b"\n"


__all__ = ["Translated", "TranslationError", "UnreadableInput", "detect", "translate_document"]
