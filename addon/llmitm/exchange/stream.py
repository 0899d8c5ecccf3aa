"""The per-flow stream callable: upstream chunks in, client chunks out, and who watches them.

One :class:`StreamRewriter` owns a flow's stream. mitmproxy calls it once per chunk read from
the upstream and once more with ``b""`` at the end. It returns a list (never ``b""``
mid-stream: on HTTP/1 chunked framing that is the body's terminator), undoes a
content-encoding the upstream applied despite ``accept-encoding: identity``, and never
raises: an exception inside llmitm ends the client's stream with a terminal error in its
protocol instead of a silent cut.

Everyone else observes it instead of wrapping it: *watchers* get each upstream chunk first
(the live console, a state writer keeping a replayed stream's bytes), *notes* get the time,
the chunk in and the bytes out of every call (recording), and :meth:`StreamRewriter.outcome`
says at the end what the stream was (its Response id, final Response and usage). With one
observer of a kind the hot path makes one call, usually a C one (``list.append``/``extend``).
A stream relayed as it is (no translation, no guard) gets a rewriter only when someone
observes it; otherwise mitmproxy relays it itself.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable
from time import monotonic
from time import time as now
from typing import Any

from llmitm.exchange.response import StreamOutcome
from llmitm.translate.protocol import ClientStream
from llmitm.wire.errors import ApiError

logger = logging.getLogger(__name__)

MAX_PART = 1 << 20
"""The largest piece handed to mitmproxy: a bigger output is sent in pieces of this size.
asyncio's socket transport (CPython 3.12's ``_SelectorSocketTransport``) keeps a buffered
write as it was given and, after each partial send, copies its unsent rest: one 100 MiB
write to a client that reads a few MiB at a time cost seconds of copying."""


def _pieces(out: bytes) -> list[bytes]:
    """``out`` as pieces of at most :data:`MAX_PART` bytes."""
    return [out[start : start + MAX_PART] for start in range(0, len(out), MAX_PART)]


Decoder = Callable[[bytes], bytes]
Watcher = Callable[[bytes], object]
Note = Callable[[tuple[float, bytes, bytes]], object]
"""What the rewriter calls per chunk for recording, with ``(time, chunk in, bytes out)``:
usually a tap's ``list.extend`` (:mod:`llmitm.replay.tap`)."""
"""Gets every upstream chunk before it is translated (a C call where it can be)."""


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
        import zstandard  # a dependency of llmitm's (replay.tap)

        return zstandard.ZstdDecompressor().decompressobj().decompress
    raise ValueError(f"unsupported content-encoding {encoding!r}")


class PassThrough:
    """The :class:`~llmitm.translate.protocol.ClientStream` of a stream relayed as it is:
    each chunk goes out as it came, nothing is added at the end, nothing is known of it."""

    __slots__ = ()

    finished = False
    usage = None
    response_id = None
    final_response = None
    knows_final_response = False

    def start(self) -> bytes:
        return b""

    def feed(self, chunk: bytes) -> bytes:
        return chunk

    def close(self) -> bytes:
        return b""

    def fail(self, error: ApiError) -> bytes:
        return b""


class Ended:
    """What an ended stream's pipeline is replaced by: the facts it knew at its end, and
    nothing of the translator, its buffers, templates and decoders (which a finished flow
    would otherwise hold until Python's cycle collector gets to mitmproxy's flow objects)."""

    __slots__ = ("final_response", "finished", "knows_final_response", "response_id", "usage")

    def __init__(self, pipeline: ClientStream) -> None:
        # getattr: a bare ClientStream (a test's, a guard's) may know only some of them.
        self.finished: bool = getattr(pipeline, "finished", False)
        self.usage: dict[str, Any] | None = getattr(pipeline, "usage", None)
        self.response_id: str | None = getattr(pipeline, "response_id", None)
        self.final_response: dict[str, Any] | None = getattr(pipeline, "final_response", None)
        self.knows_final_response: bool = getattr(pipeline, "knows_final_response", False)

    def start(self) -> bytes:
        return b""

    def feed(self, chunk: bytes) -> bytes:
        return b""

    def close(self) -> bytes:
        return b""

    def fail(self, error: ApiError) -> bytes:
        return b""


class StreamRewriter:
    """Translate one upstream SSE body through ``pipeline`` (``None``: relay it as it is)."""

    __slots__ = (
        "_decode",
        "_failed",
        "_feed_parts",
        "_notes",
        "_relays",
        "_started",
        "_watchers",
        "last",
        "note",
        "observe",
        "pipeline",
        "relays_as_is",
    )

    def __init__(self, pipeline: ClientStream | None = None, decode: Decoder | None = None) -> None:
        self.pipeline: ClientStream = PassThrough() if pipeline is None else pipeline
        self.relays_as_is = pipeline is None
        """No translation and no guard: a cut upstream is the client's to see as it is."""
        self._feed_parts: Callable[[bytes], list[bytes]] | None = getattr(
            self.pipeline, "feed_parts", None
        )
        """The pipeline's ``feed`` as a list of parts, where it has one: an event held
        across reads then goes out without a copy of its size."""
        self._relays = _relaying(self.pipeline, decode)
        """The pipeline when it may have a ``relay`` armed (see :meth:`__call__`)."""
        self._decode = decode
        self._started = False
        self._failed = False
        self._watchers: list[Watcher | None] = []  # None: unwatched (numbers stay)
        self._notes: list[Note] = []
        self.last = monotonic()
        """When the upstream last sent a chunk (a stall watchdog reads it; one C call)."""
        self.observe: Watcher | None = None
        """What the hot path calls with every upstream chunk: the one watcher, or all."""
        self.note: Note | None = None
        """What the hot path calls with ``(time, chunk in, bytes out)``: the one note, or all."""

    def translate_with(self, pipeline: ClientStream, decode: Decoder | None = None) -> None:
        """Translate (or guard) a stream that was to be relayed as it is, keeping whoever
        watches it; only before its first chunk."""
        assert not self._started, "a stream's translation is chosen before its first chunk"
        self.pipeline = pipeline
        self.relays_as_is = False
        self._feed_parts = getattr(pipeline, "feed_parts", None)
        self._relays = _relaying(pipeline, decode)
        self._decode = decode

    def watch(self, watcher: Watcher) -> int:
        """Call ``watcher`` with every upstream chunk; the number :meth:`rewatch` takes."""
        self._watchers.append(watcher)
        self.observe = _one_or_all([w for w in self._watchers if w is not None])
        return len(self._watchers) - 1

    def rewatch(self, number: int, watcher: Watcher) -> None:
        """Put ``watcher`` in the place of watcher ``number`` (a watcher that becomes a
        cheaper one after a stream's first chunks)."""
        self._watchers[number] = watcher
        self.observe = _one_or_all([w for w in self._watchers if w is not None])

    def unwatch(self, number: int) -> None:
        """Stop calling watcher ``number`` (one that has seen what it wanted); the others
        keep their numbers. With none left, the hot path calls nothing."""
        self._watchers[number] = None
        watching = [watcher for watcher in self._watchers if watcher is not None]
        self.observe = _one_or_all(watching) if watching else None

    def add_note(self, note: Note) -> None:
        """Call ``note`` with ``(time, chunk in, bytes out)`` of every call."""
        self._notes.append(note)
        self.note = _one_or_all(self._notes)

    def outcome(self) -> StreamOutcome:
        """What the stream was, once it has ended."""
        pipeline = self.pipeline
        return StreamOutcome(pipeline.response_id, pipeline.final_response, pipeline.usage)

    def __call__(self, data: bytes) -> list[bytes]:
        self.last = monotonic()
        if self.observe is not None:
            self.observe(data)
        if self._failed:
            return []
        if self._started and data and self._decode is None:
            # The hot path, once per upstream chunk.
            relays = self._relays
            feed_parts = self._feed_parts
            try:
                relay = relays.relay if relays is not None else None
                if relay is not None and relay(data):
                    # One event that goes out as it came (a conformant delta): the pipeline's
                    # one Python call for it.
                    note = self.note
                    if note is not None:
                        note((now(), data, data))
                    return [data] if len(data) <= MAX_PART else _pieces(data)
                if feed_parts is None:
                    out = self.pipeline.feed(data)
                else:
                    # mitmproxy sends each part as it is: no copy of a huge event.
                    parts = feed_parts(data)
                    note = self.note
                    if note is not None:
                        note((now(), data, parts[0] if len(parts) == 1 else b"".join(parts)))
                    if len(parts) == 1:
                        return parts if len(parts[0]) <= MAX_PART else _pieces(parts[0])
                    return [piece for part in parts for piece in _pieces(part)]
            except Exception:
                logger.exception("llmitm: stream translation failed; ending the client's stream")
                out = self._fail()
            note = self.note
            if note is not None:
                note((now(), data, out))
            if len(out) > MAX_PART:
                return _pieces(out)
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
        if not data:
            self._release()
        if len(out) > MAX_PART:
            return _pieces(out)
        return [out] if out else []

    def _release(self) -> None:
        """After the stream's last call (mitmproxy's empty chunk): of the translation, keep
        only what it was. (Watchers and notes stay: what they keep is their owners'.)"""
        self.pipeline = Ended(self.pipeline)  # type: ignore[assignment]
        self._decode = self._feed_parts = self._relays = None

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


def _relaying(pipeline: ClientStream, decode: Decoder | None) -> Any:
    """``pipeline`` when it can relay chunks as they are before :meth:`feed_parts` (it has a
    ``relay`` attribute) and they reach it undecoded; else ``None``."""
    return pipeline if decode is None and hasattr(pipeline, "relay") else None


def _one_or_all(calls: list[Callable[[Any], object]]) -> Any:
    """The one call itself (no wrapper on the hot path), or one that makes them all."""
    if len(calls) == 1:
        return calls[0]
    every = tuple(calls)

    def all_of(value: Any) -> None:
        for call in every:
            call(value)

    return all_of
