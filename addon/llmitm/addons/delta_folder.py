"""Folds what live normalised streams hold for their closing events, now and then, off the
hot path.

A normalised Responses stream keeps each delta's text until its item closes, appended by the
hot path one object a delta (``translate.normalise_fast``: appending is all that path can
afford). Every :data:`EVERY` seconds, while any such stream is live, one timer on the event
loop asks each to join what it holds (``StreamPipeline.fold``): a stream then holds its text
and a few dozen deltas, not ~50 bytes of header a delta for its whole life, at no cost per
chunk.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Protocol

EVERY = 0.5
"""Seconds between folds. A fold costs ~1 µs a live stream, ~50 ns a delta at 50 deltas a
second; a stream holds at most that half second's deltas one by one."""


class Foldable(Protocol):
    @property
    def finished(self) -> bool: ...
    def fold(self) -> None: ...


class DeltaFolder:
    """The set of live streams to fold and the one timer that folds them."""

    def __init__(self, every: float = EVERY) -> None:
        self.every = every
        # Weak: a stream whose flow is gone goes with it.
        self.streams: weakref.WeakSet[Foldable] = weakref.WeakSet()
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def add(self, stream: Foldable) -> None:
        self.streams.add(stream)
        loop = asyncio.get_running_loop()
        # A timer left on a loop that has ended never fires: start one on this loop.
        if self._timer is None or self._loop is not loop:
            self._schedule(loop)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _tick(self) -> None:
        self._timer = None
        for stream in list(self.streams):
            if stream.finished:
                self.streams.discard(stream)
            else:
                stream.fold()
        if self.streams and self._loop is not None:
            self._schedule(self._loop)

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._timer = loop.call_later(self.every, self._tick)
