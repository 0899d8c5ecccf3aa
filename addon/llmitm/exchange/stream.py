"""The per-flow stream callable: upstream chunks in, client chunks out.

mitmproxy calls it once per chunk read from the upstream and once more with ``b""`` at the
end. It returns a list (never ``b""`` mid-stream: on HTTP/1 chunked framing that is the body's
terminator), undoes a content-encoding the upstream applied despite ``accept-encoding:
identity``, and never raises: an exception inside llmitm ends the client's stream with a
terminal error in its protocol instead of a silent cut.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable
from time import monotonic

from llmitm.exchange.tap import Note, now
from llmitm.translate.guard import StreamGuard
from llmitm.translate.pipeline import StreamPipeline
from llmitm.wire.errors import ApiError

logger = logging.getLogger(__name__)

Decoder = Callable[[bytes], bytes]


def decoder_for(content_encoding: str | None) -> Decoder | None:
    """An incremental decoder for ``content-encoding`` (``None`` for identity)."""
    encoding = (content_encoding or "identity").strip().lower()
    if encoding in ("", "identity"):
        return None
    if encoding in ("gzip", "x-gzip"):
        return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress
    if encoding == "deflate":
        return zlib.decompressobj().decompress
    if encoding == "br":
        import brotli  # a mitmproxy dependency

        return brotli.Decompressor().process
    if encoding == "zstd":
        try:
            import zstandard
        except ImportError:
            raise ValueError("content-encoding zstd needs the zstandard package") from None
        return zstandard.ZstdDecompressor().decompressobj().decompress
    raise ValueError(f"unsupported content-encoding {encoding!r}")


class StreamRewriter:
    """Translate one upstream SSE body through ``pipeline``."""

    __slots__ = ("_decode", "_failed", "_started", "last", "note", "observe", "pipeline")

    def __init__(
        self, pipeline: StreamPipeline | StreamGuard, decode: Decoder | None = None
    ) -> None:
        self.pipeline = pipeline
        self._decode = decode
        self._started = False
        self._failed = False
        self.last = monotonic()
        """When the upstream last sent a chunk (a stall watchdog reads it; one C call)."""
        self.observe: Callable[[bytes], object] | None = None
        """Gets every upstream chunk first (the live console's ``list.append``: a C call)."""
        self.note: Note | None = None
        """Gets the time, the chunk in and the bytes out of every call when recording (a
        :class:`~llmitm.exchange.tap.StreamTap`'s ``list.extend``: a C call)."""

    def __call__(self, data: bytes) -> list[bytes]:
        self.last = monotonic()
        if self.observe is not None:
            self.observe(data)
        if self._failed:
            return []
        if self._started and data and self._decode is None:
            # The hot path, once per upstream chunk.
            try:
                out = self.pipeline.feed(data)
            except Exception:
                logger.exception("llmitm: stream translation failed; ending the client's stream")
                out = self._fail()
            note = self.note
            if note is not None:
                note((now(), data, out))
            return [out] if out else []
        out = b""
        try:
            if not self._started:
                self._started = True
                # Kept even when this chunk fails: the pipeline counts it as sent, so the
                # error that follows must not arrive without the response.created before it.
                out = self.pipeline.start()
            out += self._translate(data)
        except Exception:
            logger.exception("llmitm: stream translation failed; ending the client's stream")
            out += self._fail()
        note = self.note
        if note is not None:
            note((now(), data, out))
        return [out] if out else []

    def _translate(self, data: bytes) -> bytes:
        if not data:
            return self.pipeline.close()
        if self._decode is not None:
            data = self._decode(data)
        return self.pipeline.feed(data)

    def _fail(self) -> bytes:
        self._failed = True
        error = ApiError(
            message="llmitm failed to translate the upstream stream; see the proxy's log.",
            type="server_error",
            code="llmitm_error",
            status=500,
        )
        try:
            return self.pipeline.fail(error)
        except Exception:
            logger.exception("llmitm: could not even end the stream cleanly")
            return b""
