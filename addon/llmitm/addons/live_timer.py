"""One event-loop timer that visits a weak set of live things every so often, off the hot
path, and stops once none is left: the record tap's compactor and the normaliser's delta
folder run their per-stream housekeeping this way, for the whole proxy at once, not per chunk.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable


class LiveTimer[T]:
    """``visit`` each live member every ``every`` seconds; a member ``visit`` answers
    ``False`` for is let go (a member whose flow is gone goes by itself: the set is weak)."""

    def __init__(self, every: float, visit: Callable[[T], bool]) -> None:
        self.every = every
        self.visit = visit
        self.live: weakref.WeakSet[T] = weakref.WeakSet()  # type: ignore[type-var]
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def add(self, member: T) -> None:
        self.live.add(member)  # type: ignore[arg-type]
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a hook called from a test): nothing visits it
            return
        # A timer left on a loop that has ended never fires: start one on this loop.
        if self._timer is None or self._loop is not loop:
            self._schedule(loop)

    def discard(self, member: T | None) -> None:
        if member is not None:
            self.live.discard(member)  # type: ignore[arg-type]

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _tick(self) -> None:
        self._timer = None
        visit = self.visit
        for member in list(self.live):
            if not visit(member):
                self.live.discard(member)
        if self.live and self._loop is not None:
            self._schedule(self._loop)

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._timer = loop.call_later(self.every, self._tick)
