"""Replay pacing: recorded offsets to send moments, scaled and capped."""

from __future__ import annotations

import pytest

from llmitm.replay.timing import Timing, parse_timing, schedule


def test_parse() -> None:
    assert parse_timing("instant").instant
    assert parse_timing("realtime", 250) == Timing(1.0, 0.25)
    assert parse_timing("scale:0.5") == Timing(0.5, 0.0)
    for bad in ("scale:0", "scale:x", "fast"):
        with pytest.raises(ValueError, match="instant, realtime or scale"):
            parse_timing(bad)


def flat(result: tuple[float, list[float]]) -> list[float]:
    return [result[0], *result[1]]


def test_schedule_realtime_scaled_and_capped() -> None:
    offsets = [300_000, 350_000, 2_350_000]
    assert flat(schedule(200_000, offsets, Timing(1.0))) == pytest.approx([0.2, 0.3, 0.35, 2.35])
    assert flat(schedule(200_000, offsets, Timing(0.5))) == pytest.approx([0.1, 0.15, 0.175, 1.175])
    # a cap bounds each wait: the two-second stall becomes half a second
    assert flat(schedule(200_000, offsets, Timing(1.0, 0.5))) == pytest.approx(
        [0.2, 0.3, 0.35, 0.85]
    )
    assert schedule(None, offsets, Timing()) == (0.0, [0.0, 0.0, 0.0])
