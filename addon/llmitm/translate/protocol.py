"""The two shapes a stream translation has, as the code that drives one types against them.

:class:`EventTranslator` is a translator's: parsed upstream events in, client frames out (the
h11-like state machines of :mod:`~llmitm.translate.stream_to_chat`,
:mod:`~llmitm.translate.stream_to_responses`, :mod:`~llmitm.translate.normalise` and
:mod:`~llmitm.translate.chat_normalise`).
:class:`ClientStream` is the bytes-level one the proxy's stream callable drives: upstream
bytes in, client bytes out (:class:`~llmitm.translate.pipeline.StreamPipeline` around a
translator, or :class:`~llmitm.translate.guard.StreamGuard` relaying bytes as they are).

Both say what a finished stream was: its usage, the Response id and the final Response object
the client got (``None`` where the stream has none: a chat client's stream, an untranslated
one).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from llmitm.wire.errors import ApiError

FastFrame = Callable[[dict[str, Any], bytes, bytes], bytes | None]
"""A translator's shortcut for one parsed event: ``(event, raw chunk, data)`` to the client's
bytes, or ``None`` to take the general path."""
FastChunk = Callable[[bytes], bytes | None]
"""A translator's shortcut for one raw chunk, before it is parsed."""


class StreamFacts(Protocol):
    """What a stream is known to have been once it has ended."""

    @property
    def finished(self) -> bool: ...
    @property
    def usage(self) -> dict[str, Any] | None: ...
    @property
    def response_id(self) -> str | None: ...
    @property
    def final_response(self) -> dict[str, Any] | None: ...


class EventTranslator(StreamFacts, Protocol):
    """Parsed upstream events in, the client's frames out."""

    fast_frame: FastFrame | None
    fast_chunk: FastChunk | None

    def feed(self, event: dict[str, Any]) -> list[Any]: ...
    def close(self) -> list[Any]: ...
    def fail(self, error: ApiError) -> list[Any]: ...


class ClientStream(StreamFacts, Protocol):
    """Upstream bytes in, the client's bytes out."""

    knows_final_response: bool
    """Whether :attr:`final_response` is the Response the client's stream ended with: then
    whoever stores it need not keep the stream's bytes to find it again."""

    def start(self) -> bytes: ...
    def feed(self, chunk: bytes) -> bytes: ...
    def close(self) -> bytes: ...
    def fail(self, error: ApiError) -> bytes: ...
