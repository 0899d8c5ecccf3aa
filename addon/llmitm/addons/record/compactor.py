"""Compacts the recording taps of live streams now and then, off the hot path.

A stream callable only appends to its tap's notes (:mod:`llmitm.replay.tap`); every
:data:`EVERY` seconds, while any recorded stream is live, one timer on the event loop
compacts each tap holding at least :data:`AT_LEAST` notes. That bounds what a stream keeps
as small objects to a few hundred, wherever it is in its life, at no cost per chunk: the
timer runs tens of times a second for the whole proxy, not once per chunk per stream.
"""

from __future__ import annotations

from typing import Protocol

from llmitm.addons.live_timer import LiveTimer

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


class TapCompactor(LiveTimer[Compactable]):
    """The live taps and the one timer that compacts them."""

    def __init__(self, every: float = EVERY, at_least: int = AT_LEAST) -> None:
        super().__init__(every, self._compact)
        self.at_least = at_least

    def _compact(self, tap: Compactable) -> bool:
        if tap.pending() >= self.at_least:
            tap.compact()
        return True  # compacted until the recorder lets it go
