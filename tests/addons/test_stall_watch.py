"""The stall watchdog's timer: it fires once a stream has been silent for its limit, counted
from the stream's last chunk, and never for a stream that ended or was stopped.

The watchdog's effect on real streams (a stalled upstream ended in the client's protocol) is
tested end to end in ``tests/e2e/test_faults.py`` and ``tests/e2e/test_passthrough_stall.py``.
"""

from __future__ import annotations

import asyncio
import types
from time import monotonic
from typing import Any

from llmitm.addons.stall import _Watch

IDLE = 0.15


def _watch(stalled: list[float]) -> tuple[_Watch, Any, Any]:
    flow = types.SimpleNamespace(live=True)
    stream = types.SimpleNamespace(last=monotonic())
    watch = _Watch(flow, None, stream, IDLE, lambda w: stalled.append(monotonic()))  # type: ignore[arg-type]
    return watch, flow, stream


async def test_a_stream_that_keeps_sending_is_not_stalled_and_one_that_stops_is() -> None:
    stalled: list[float] = []
    watch, _, stream = _watch(stalled)
    watch.arm(asyncio.get_running_loop())
    for _ in range(4):  # a chunk every 0.1 s: never silent for 0.15 s
        await asyncio.sleep(0.1)
        stream.last = monotonic()
    assert not stalled
    last = stream.last
    await asyncio.sleep(IDLE + 0.15)
    assert len(stalled) == 1
    assert IDLE <= stalled[0] - last < IDLE + 0.1  # counted from the last chunk
    assert watch.handle is None  # nothing left on the loop


async def test_an_ended_or_stopped_stream_is_never_stalled() -> None:
    stalled: list[float] = []
    ended, flow, _ = _watch(stalled)
    ended.arm(asyncio.get_running_loop())
    flow.live = False
    stopped, _, _ = _watch(stalled)
    stopped.arm(asyncio.get_running_loop())
    stopped.cancel()
    await asyncio.sleep(IDLE + 0.1)
    assert not stalled
    assert ended.handle is None and stopped.handle is None
