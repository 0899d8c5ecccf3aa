"""A relay job that plays a recorded answer: head after the recorded time to first byte,
each piece at its recorded offset (scaled, capped), and — when the recording was cut — an
abrupt end instead of a clean one, so a client sees the same truncation it saw live."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass

from llmitm.errors import TransportError
from llmitm.relay.jobs import RelayReply
from llmitm.replay.timing import Timing, schedule


class ReplayCut(TransportError, ConnectionError):
    """Raised to end the relay's connection without the body's terminating chunk."""


@dataclass(slots=True)
class ReplayJob:
    status: int
    headers: Sequence[tuple[str, str]]
    chunks: Sequence[tuple[int, bytes]]
    ttfb_us: int | None
    timing: Timing
    cut: bool = False
    started: float = 0.0
    """``time.monotonic()`` when the client's request arrived (pacing counts from there)."""

    async def serve(self, reply: RelayReply) -> None:
        head, moments = schedule(self.ttfb_us, [t for t, _ in self.chunks], self.timing)
        start = self.started or time.monotonic()
        await _sleep_until(start + head)
        await reply.start(self.status, self.headers)
        for at, (_, data) in zip(moments, self.chunks, strict=True):
            await _sleep_until(start + at)
            reply.write([data])
            await reply.drain()
        if self.cut:
            await reply.drain()
            raise ReplayCut("the recording was cut here")


async def _sleep_until(deadline: float) -> None:
    delay = deadline - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)
