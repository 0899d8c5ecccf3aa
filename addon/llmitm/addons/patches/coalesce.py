"""Send the client, in one write, the events of a stream that llmitm read in one go.

mitmproxy writes every chunk of a streamed response to the client's socket as soon as the
stream callable returns it: one ``send()`` per SSE event, each waking the client. When the
upstream is ahead of the proxy (a burst after a stall, many concurrent streams, the unpaced
streams of ``scripts/bench_proxy.py``) one read from the upstream holds many events, and those
sends are a large part of the proxy's cost: plain mitmdump spends a quarter of its time per
event in them (py-spy), and each microsecond a translator adds cost ~2.5 µs of CPU in all
(the client, idle sooner, needs a wake-up per send; measured with a busy-looping stream
callable in plain mitmdump).

:func:`coalesce_client_writes` makes the client connection of a flow llmitm streams collect
what mitmproxy writes during one turn of the event loop and send it as one piece at the end of
that turn — or at once past :data:`MAX_PENDING` bytes, so a long burst is sent in pieces as it
is translated. Nothing waits for data that has not arrived: an event read alone (a paced model
stream) is sent within the same turn, microseconds later; and the first
:data:`UNBATCHED_WRITES` writes of each stream go out at once, so its first tokens never wait.
Bytes and their order on the wire are unchanged, only fewer ``send()`` calls carry them;
closing and half-closing flush first.

It wraps the ``write`` of mitmproxy's asyncio ``StreamWriter`` for the client connection (found
through mitmproxy's connection registry, :mod:`.connections`), so it is pinned by ``mitmproxy <
13``; if the registry is not as expected (its start-up check logs that once) it does nothing and
the stream is sent unbatched.
"""

from __future__ import annotations

import asyncio
import logging

from mitmproxy import http

from llmitm.addons.patches.connections import client_writer

logger = logging.getLogger(__name__)

UNBATCHED_WRITES = 32
"""Writes of each new stream sent at once, unbatched: its first events (the first tokens)
wait for nothing; batching pays off once a stream is flowing."""

MAX_PENDING = 8 * 1024
"""Bytes held before they are sent without waiting for the end of the loop turn: ~40 events,
which bounds the wait of the first of a burst to ~1 ms of translating on a slow machine."""


class _Batcher:
    """Stands in for one ``StreamWriter``'s ``write``, ``write_eof`` and ``close``."""

    __slots__ = (
        "_close",
        "_loop",
        "_pending",
        "_size",
        "_write",
        "_write_eof",
        "unbatched",
        "writer",
    )

    def __init__(self, writer: asyncio.StreamWriter, loop: asyncio.AbstractEventLoop) -> None:
        self.writer = writer
        self._loop = loop
        self._write = writer.write
        self._write_eof = writer.write_eof
        self._close = writer.close
        self._pending: list[bytes] = []
        self._size = 0
        self.unbatched = UNBATCHED_WRITES

    def write(self, data: bytes) -> None:
        pending = self._pending
        if self.unbatched:
            self.unbatched -= 1
            if not pending:
                self._write(data)
                return
        if not pending:
            self._loop.call_soon(self.flush)
        pending.append(data)
        self._size += len(data)
        if self._size >= MAX_PENDING:
            self.flush()

    def flush(self) -> None:
        pending = self._pending
        if not pending:
            return
        self._pending = []
        self._size = 0
        if self.writer.is_closing():
            return  # as mitmproxy does: nothing is written to a closing connection
        self._write(pending[0] if len(pending) == 1 else b"".join(pending))

    def write_eof(self) -> None:
        self.flush()
        self._write_eof()

    def close(self) -> None:
        self.flush()
        self._close()


def coalesce_client_writes(flow: http.HTTPFlow) -> bool:
    """Batch the client connection's writes from now on (once per connection); ``False`` if
    the connection is not an asyncio socket mitmproxy writes to directly (left as it is)."""
    writer = client_writer(flow)
    if writer is None:
        logger.debug("llmitm: no client writer to batch for %s", flow.request.pretty_url)
        return False
    if type(writer) is not asyncio.StreamWriter:
        return False  # WireGuard/local modes write through mitmproxy_rs
    batcher = getattr(writer.write, "__self__", None)
    if isinstance(batcher, _Batcher):
        batcher.unbatched = UNBATCHED_WRITES  # a new stream on a connection already batched
        return True
    batcher = _Batcher(writer, asyncio.get_running_loop())
    writer.write = batcher.write  # type: ignore[method-assign]
    writer.write_eof = batcher.write_eof  # type: ignore[method-assign]
    writer.close = batcher.close  # type: ignore[method-assign]
    return True
