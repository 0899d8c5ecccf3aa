"""The owner's side of a background run shared through the store: its lease.

A proxy running background responses (:class:`~llmitm.responses_api.background.BackgroundRun`)
keeps, for each, a :class:`~llmitm.responses_api.records.RunLease` in the store, so that the
other proxies sharing it can tell a live run from a dead one and reach it.
:class:`RunKeeper` does it, while the process has runs:

- every ``lease / 5`` seconds it renews their heartbeat (one write for all its runs);
- every ``poll`` seconds it reads its leases: a run another proxy asked to cancel (or delete)
  is cancelled here, within ``poll`` plus a store read; a run whose lease is gone (after a
  round saw it) was ended as stale by another proxy (this one failed to renew in time), and
  stops without writing.

A reader finding a lease older than ``lease`` seconds ends the run ``failed``
(:mod:`llmitm.responses_api.remote_runs`). Heartbeats are wall-clock times: proxies on
several hosts need synchronised clocks (NTP), well within the lease.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from llmitm.responses_api.background import BackgroundRun
from llmitm.responses_api.records import ResponseReader, RunLease, RunsHeartbeat, RunStarted

logger = logging.getLogger(__name__)

DEFAULT_LEASE = 6.0
"""Seconds without a heartbeat after which a run is taken for dead."""

POLL = 0.25
"""Seconds between two reads of this proxy's leases (the bound on noticing a cancel)."""


class RunKeeper:
    """Renews the leases of ``runs`` (this proxy's live runs, by response id) and carries
    out what other proxies asked of them."""

    def __init__(
        self,
        owner: str,
        runs: Mapping[str, BackgroundRun],
        *,
        submit: Callable[[Any], None],
        reader: Callable[[], Awaitable[ResponseReader]],
        lease: float = DEFAULT_LEASE,
        poll: float = POLL,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        self.owner = owner
        self.runs = runs
        self.lease = lease
        self.poll = min(poll, lease / 5)
        self._submit = submit
        self._reader = reader
        self._clock = clock
        self._sleep = sleep
        self._task: asyncio.Task[None] | None = None
        self._beat = 0.0
        self._seen: set[str] = set()
        """Runs whose lease a round has read: only those can have lost it (a lease whose
        write never made it, a dropped or failed one, is not another proxy's doing)."""

    def started(self, run: BackgroundRun) -> None:
        """``run`` begins here: its lease, before its first saved state (submit this first)."""
        self._submit(RunStarted(RunLease(run.id, self.owner, self._clock())))
        if self._task is None or self._task.done():
            self._beat = self._clock()
            self._task = asyncio.get_running_loop().create_task(
                self._keep(), name="llmitm background run leases"
            )

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _keep(self) -> None:
        failing = False
        while self.runs:
            await self._sleep(self.poll)
            try:
                await self.tick()
            except Exception:  # a store that cannot be read now may be readable next time
                if not failing:  # once a streak, not four times a second
                    logger.warning("llmitm: cannot read the background runs' leases", exc_info=True)
                failing = True
            else:
                if failing:
                    logger.warning("llmitm: the background runs' leases are readable again")
                failing = False

    async def tick(self) -> None:
        """One round: renew the heartbeat when due, act on what the leases say."""
        now = self._clock()
        if now - self._beat >= self.lease / 5:
            self._beat = now
            self._submit(RunsHeartbeat(self.owner, tuple(self.runs), now))
        reader = await self._reader()
        leases = {lease.response_id: lease for lease in await reader.owned_leases(self.owner)}
        self._seen &= set(self.runs)
        for response_id, run in list(self.runs.items()):
            lease = leases.get(response_id)
            if run.finished:
                continue
            if lease is not None:
                self._seen.add(response_id)
                if lease.cancel_requested_at is not None:
                    run.cancel()
            elif response_id in self._seen:
                logger.warning(
                    "llmitm: background response %s was ended by another proxy "
                    "(this one did not renew its lease within %g s)",
                    response_id,
                    self.lease,
                )
                run.lose()
