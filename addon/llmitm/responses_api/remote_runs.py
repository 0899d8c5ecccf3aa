"""A reader's side of a background run that another proxy (or a process now gone) owns:
what it looks like, how to follow it, and ending it when its owner is dead.

- :func:`settle`: a ``queued``/``in_progress`` background response whose run's lease is
  older than the lease time is ended ``failed`` for everyone (a conditional write,
  :class:`~llmitm.responses_api.records.StaleRunEnded`, with a closing ``response.failed``
  event): its owner was killed, or lost the store.
- :func:`follow`: its events from the store, from any sequence number, then each new one as
  the owner stores it (read every ``poll`` seconds) until the response reaches a terminal
  status or is deleted.

A record without a lease (stored by a proxy from before leases, or whose lease was purged)
is left as it is.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Any

from llmitm.responses_api.answers import TERMINAL_STATUSES
from llmitm.responses_api.background import failed, frame
from llmitm.responses_api.records import ResponseReader, StaleRunEnded, StoredResponse

POLL = 0.05
"""Seconds between two reads of a run followed from the store."""

_SEQUENCE = re.compile(rb'"sequence_number":(-?\d+)')


async def settle(
    record: StoredResponse,
    reader: ResponseReader,
    *,
    now: float,
    lease: float,
    submit: Callable[[Any], None],
) -> StoredResponse:
    """``record`` as every proxy must see it: ended ``failed`` (and that submitted) when it
    is a running background response whose owner has not renewed its lease for ``lease``
    seconds; else as it is."""
    if not record.background or record.status in TERMINAL_STATUSES:
        return record
    run = await reader.run_lease(record.id)
    if run is None or not run.stale(now, lease):
        return record
    stored = await reader.events(record.id)
    next_seq = sequence_number(stored[-1]) + 1 if stored else 0
    error = {
        "code": "server_error",
        "message": (
            "The llmitm proxy running this background response stopped "
            f"(no heartbeat for {lease:g} s)."
        ),
    }
    response = failed(record.response, error)
    event = {"type": "response.failed", "response": response, "sequence_number": next_seq}
    ended = replace(record, response=response)
    submit(StaleRunEnded(ended, ((next_seq, frame(event)),), now - lease))
    return ended


async def follow(
    response_id: str,
    after: int,
    *,
    read: Callable[[], Awaitable[StoredResponse | None]],
    reader: ResponseReader,
    gone: Callable[[], bool] = lambda: False,
    poll: float = POLL,
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
) -> AsyncIterator[bytes]:
    """The stored events of ``response_id`` after sequence number ``after``, then each new
    one, until the response is terminal or gone, or ``gone()`` says the client left. ``read``
    gives the response as it stands (settled: a dead owner's run ends failed, and this
    follow with it)."""
    position = after
    while not gone():
        # The state first, then the events: an owner stores its last events before its
        # terminal state, so a terminal state read here has all its events stored.
        record = await read()
        frames = await reader.events(response_id, position)
        for data in frames:
            yield data
        if frames:
            last = sequence_number(frames[-1])
            position = last if last >= 0 else position + len(frames)
        if record is None or record.status in TERMINAL_STATUSES:
            return
        if not frames:
            await sleep(poll)


def sequence_number(data: bytes) -> int:
    """The ``sequence_number`` of a stored event frame (``-1`` when it has none). A key
    inside a JSON string is escaped (``\\"``), so the first unescaped one is the event's."""
    match = _SEQUENCE.search(data)
    return int(match[1]) if match else -1
