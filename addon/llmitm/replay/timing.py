"""Replay timing: ``instant`` (the CI default), ``realtime``, or ``scale:F`` (F times the
recorded offsets: ``scale:0.5`` is twice as fast), each with an optional cap on any single
wait, so a recorded five-minute stall cannot stall a debugging session.

Pure: :func:`schedule` turns recorded offsets into the moments a paced replay writes each
piece; the relay job sleeps until them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Timing:
    scale: float = 0.0
    """Multiplier of recorded offsets; 0 is instant."""
    cap_s: float = 0.0
    """Longest single wait in seconds (0: no cap)."""

    @property
    def instant(self) -> bool:
        return self.scale == 0.0


def parse_timing(spec: str, cap_ms: int = 0) -> Timing:
    """``instant`` | ``realtime`` | ``scale:F`` (F > 0), plus a cap in milliseconds."""
    spec = spec.strip().lower()
    if cap_ms < 0:
        raise ValueError("the replay timing cap must be >= 0 ms")
    cap = cap_ms / 1000
    if spec in ("", "instant"):
        return Timing(0.0, cap)
    if spec == "realtime":
        return Timing(1.0, cap)
    if spec.startswith("scale:"):
        try:
            factor = float(spec.partition(":")[2])
        except ValueError:
            factor = -1.0
        if factor > 0:
            return Timing(factor, cap)
    raise ValueError(f"replay timing must be instant, realtime or scale:F (F > 0), not {spec!r}")


def schedule(
    ttfb_us: int | None, offsets_us: list[int], timing: Timing
) -> tuple[float, list[float]]:
    """When to send the head and each piece, in seconds after the request arrived.

    Pieces never go out before the head nor out of order; with a cap, each wait (head, and
    each gap between pieces) is at most the cap."""
    if timing.instant:
        return 0.0, [0.0] * len(offsets_us)

    def wait(seconds: float) -> float:
        seconds = max(0.0, seconds * timing.scale)
        return min(seconds, timing.cap_s) if timing.cap_s else seconds

    head = wait((ttfb_us or 0) / 1e6)
    moments: list[float] = []
    at, previous = head, (ttfb_us or 0) / 1e6
    for offset in offsets_us:
        recorded = offset / 1e6
        at += wait(recorded - previous)
        previous = max(previous, recorded)
        moments.append(at)
    return head, moments
