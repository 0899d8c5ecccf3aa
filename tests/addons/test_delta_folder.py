"""The folder's timer: it folds each live stream now and then, drops the finished ones, and
stops when none is left. What folding does to a stream is tested with the normaliser
(``tests/translate/test_normalise_fast.py``)."""

from __future__ import annotations

import asyncio

from llmitm.addons.delta_folder import DeltaFolder


class _Stream:
    def __init__(self) -> None:
        self.finished = False
        self.folds = 0

    def fold(self) -> None:
        self.folds += 1


async def test_live_streams_are_folded_until_they_finish() -> None:
    folder = DeltaFolder(every=0.02)
    live, ending = _Stream(), _Stream()
    folder.add(live)
    folder.add(ending)
    await asyncio.sleep(0.07)
    assert live.folds >= 2 and ending.folds >= 2
    ending.finished = True
    folds = ending.folds
    await asyncio.sleep(0.05)
    assert ending.folds == folds and ending not in folder.live  # dropped, never folded
    live.finished = True
    await asyncio.sleep(0.05)
    assert not folder.live and folder._timer is None  # nothing left: no timer either


async def test_stopping_the_folder_cancels_its_timer() -> None:
    folder = DeltaFolder(every=0.02)
    stream = _Stream()
    folder.add(stream)
    folder.stop()
    await asyncio.sleep(0.05)
    assert stream.folds == 0
