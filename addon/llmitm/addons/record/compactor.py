"""Compacts the recording taps of live streams now and then, off the hot path.

A stream callable only appends to its tap's notes (:mod:`llmitm.replay.tap`); every
:data:`EVERY` seconds, while any recorded stream is live, one timer on the event loop
compacts each tap holding at least :data:`AT_LEAST` notes. That bounds what a stream keeps
as small objects to a few hundred, wherever it is in its life, at no cost per chunk: the
timer runs tens of times a second for the whole proxy, not once per chunk per stream.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Protocol

EVERY = 0.02
"""Seconds between compactions (a busy proxy relays a few hundred chunks in that time)."""
AT_LEAST = 24
"""Notes a tap must hold to be compacted (8 chunks of a translated stream). Small: what a
live recorded stream holds is mostly its chunks not compacted yet (a few hundred bytes each,
and each kept alive among the proxy's short-lived objects), while 8 events still compress
about 8×. At 64 chunks a time a recorded stream grew the proxy's peak RSS by ~120 KiB at 64
concurrent streams; at 8, ~95 KiB (``scripts/bench_big_request.py``, docs/speed.md)."""


class Compactable(Protocol):
    def pending(self) -> int: ...
    def compact(self) -> None: ...


class TapCompactor:
    """The set of live taps and the one timer that compacts them."""

    def __init__(self, every: float = EVERY, at_least: int = AT_LEAST) -> None:
        self.every = every
        self.at_least = at_least
        # Weak: a flow that ends without reaching the recorder's hooks takes its tap along.
        self.taps: weakref.WeakSet[Compactable] = weakref.WeakSet()
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def add(self, tap: Compactable) -> None:
        self.taps.add(tap)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a hook called from a test): taps compact at the end
            return
        # A timer left on a loop that has ended never fires: start one on this loop.
        if self._timer is None or self._loop is not loop:
            self._schedule(loop)

    def discard(self, tap: Compactable | None) -> None:
        if tap is not None:
            self.taps.discard(tap)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _tick(self) -> None:
        self._timer = None
        at_least = self.at_least
        for tap in list(self.taps):
            if tap.pending() >= at_least:
                tap.compact()
        if self.taps and self._loop is not None:
            self._schedule(self._loop)

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._timer = loop.call_later(self.every, self._tick)
