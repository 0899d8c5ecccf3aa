"""The per-flow stream callable: upstream chunks in, client chunks out.

mitmproxy calls it once per chunk read from the upstream and once more with ``b""`` at the
end. It returns a list (never ``b""`` mid-stream: on HTTP/1 chunked framing that is the body's
terminator), undoes a content-encoding the upstream applied despite ``accept-encoding:
identity``, and never raises: an exception inside llmitm ends the client's stream with a
terminal error in its protocol instead of a silent cut.
"""

from __future__ import annotations

import logging
import time
import zlib
from array import array
from collections.abc import Callable

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


class StreamTap:
    """What the recorder keeps of a stream while it flows: each call's arrival time (unboxed,
    in an array) and the bytes in and out, in three columns — three C-level appends per chunk
    and no tuple per chunk for the garbage collector to walk (measured cheapest, tap and the
    flow's end together, against tuples and against growing buffers)."""

    __slots__ = ("ins", "outs", "times")

    def __init__(self) -> None:
        self.times = array("d")
        self.ins: list[bytes] = []
        self.outs: list[bytes] = []


class StreamRewriter:
    """Translate one upstream SSE body through ``pipeline``."""

    __slots__ = ("_decode", "_failed", "_started", "observe", "pipeline", "tap")

    def __init__(
        self, pipeline: StreamPipeline | StreamGuard, decode: Decoder | None = None
    ) -> None:
        self.pipeline = pipeline
        self._decode = decode
        self._started = False
        self._failed = False
        self.observe: Callable[[bytes], object] | None = None
        """Gets every upstream chunk first (the live console's ``list.append``: a C call)."""
        self.tap: StreamTap | None = None
        """The recorder's columns: when set, each call notes the time, the chunk in and the
        bytes out; everything else happens at the flow's end."""

    def __call__(self, data: bytes) -> list[bytes]:
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
            tap = self.tap
            if tap is not None:  # inline: a method call would double its cost per chunk
                tap.times.append(time.time())
                tap.ins.append(data)
                tap.outs.append(out)
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
        tap = self.tap
        if tap is not None:
            tap.times.append(time.time())
            tap.ins.append(data)
            tap.outs.append(out)
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
