"""Read a whole body (JSON or SSE, either API) into a ``Conversation``, leniently.

What the content view calls on every body mitmproxy shows it: cheap sniffing decides whether
the bytes look like an LLM API body at all, and reading never raises on bad input.
"""

from __future__ import annotations

import orjson

from llmitm.view.conversation import Conversation, StreamAssembler, assemble_body
from llmitm.wire.sse import SSEDecoder

SNIFF_BYTES = 4096
_STREAM_MARKERS = (b'"chat.completion.chunk"', b'"choices"', b"response.", b'"error"')
_JSON_MARKERS = (
    b'"chat.completion"',
    b'"choices"',
    b'"object":"response"',
    b'"object": "response"',
    b'"messages"',
    b'"input"',
    b'"instructions"',
    b'"error"',
)


def looks_like_stream(data: bytes) -> bool:
    """An SSE body that names either API's events in its first few kilobytes."""
    head = data[:SNIFF_BYTES]
    return b"data:" in head and any(marker in head for marker in _STREAM_MARKERS)


def looks_like_json(data: bytes) -> bool:
    head = data[:SNIFF_BYTES].lstrip()
    return head.startswith(b"{") and any(marker in head for marker in _JSON_MARKERS)


def read_stream(data: bytes) -> Conversation:
    """Every event of an SSE body through the assembler (malformed events are counted)."""
    assembler = StreamAssembler()
    decoder = SSEDecoder()
    for _name, payload in decoder.feed(data) + decoder.close():
        assembler.feed_data(payload)
    return assembler.close()


def read_document(data: bytes) -> Conversation | None:
    """The conversation in ``data``, or ``None`` when it is no LLM API body."""
    text = data.lstrip()
    if text.startswith(b"{"):
        try:
            body = orjson.loads(text)
        except orjson.JSONDecodeError:
            return None
        return assemble_body(body)
    if looks_like_stream(data):
        conversation = read_stream(data)
        return conversation if conversation.api is not None or conversation.error else None
    return None
