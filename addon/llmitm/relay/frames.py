"""A local relay job: serve SSE frames that llmitm produces itself (a background response
as it runs, or its stored events), since mitmproxy cannot stream a body an addon makes."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Iterable

from llmitm.relay.jobs import RelayReply

_HEADERS = [("content-type", "text/event-stream"), ("cache-control", "no-cache")]


class FramesJob:
    """Write each frame of ``frames`` as it comes; stop when the client has left."""

    def __init__(self, frames: AsyncIterable[bytes]) -> None:
        self.frames = frames
        self._reply: RelayReply | None = None

    @property
    def gone(self) -> bool:
        """Whether the client has left: for ``frames`` that wait on something else between
        two frames (a store they poll), and should stop doing so."""
        return self._reply is not None and self._reply.gone

    async def serve(self, reply: RelayReply) -> None:
        self._reply = reply
        await reply.start(200, _HEADERS)
        async for data in self.frames:
            if reply.gone:
                return  # the client left; a background run goes on without it
            reply.write([data])
            await reply.drain()


async def iterate(frames: Iterable[bytes]) -> AsyncIterator[bytes]:
    """Stored frames as an async iterable."""
    for data in frames:
        yield data
