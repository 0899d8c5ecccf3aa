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

from typing import Protocol

from llmitm.addons.live_timer import LiveTimer

EVERY = 0.5
"""Seconds between folds. A fold costs ~1 µs a live stream, ~50 ns a delta at 50 deltas a
second; a stream holds at most that half second's deltas one by one."""


class Foldable(Protocol):
    @property
    def finished(self) -> bool: ...
    def fold(self) -> None: ...


class DeltaFolder(LiveTimer[Foldable]):
    """The live normalised streams and the one timer that folds them."""

    def __init__(self, every: float = EVERY) -> None:
        super().__init__(every, _fold)


def _fold(stream: Foldable) -> bool:
    if stream.finished:
        return False
    stream.fold()
    return True
