"""Concurrency slots across a fleet: a cap of N holds for all proxies together.

A request takes this process's slot first (the limiter: cheap, and what ``least-busy`` and the
status route read), then — only for an endpoint or endpoint-model that has a cap — a slot row
in the shared state, atomically under the cap summed over every live proxy (the takes asked in
one turn of the event loop, a burst of requests, in one statement). The lease it
gets frees both on release: the local count at once, the shared row in the background, with
the other releases of the next few milliseconds in one statement (a request never waits for
a release to reach the database).

When every candidate is full across the fleet, the request waits, bounded as the routing
settings say (``queue_size`` waiters in this proxy, ``queue_timeout`` seconds): it is woken
when a slot frees — by NOTIFY from any proxy, first waiter first (FIFO within a proxy; across
proxies, whoever asks first after the release) — or re-tries every :data:`POLL_S` in case a
notice was lost; at the end, the usual 429 with ``Retry-After``.

A new conversation's pin goes with its request's take (:class:`SlotPin`): the endpoint is
known once its slot is, the pin is in the shared table before the request reaches the
endpoint, and it costs neither a statement of its own nor a wait before the answer ends.

When the shared state does not answer, a slot is this process's alone (the link counts the
decision) and a waiter keeps waiting on this process's releases. A shared release that fails
is kept and retried by the upkeep, so no row is left behind while this proxy lives; after its
death the fleet frees its rows once its lease runs out.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from llmitm.addons.fleet_link import FleetLink
from llmitm.routing.limits import Key, Lease, Limiter
from llmitm.store.fleet import Pin, Slot

POLL_S = 1.0
"""A waiter re-tries at least this often, notice or not."""
RELEASE_BATCH_S = 0.01
"""Shared releases within this long go in one statement. This proxy's own count is freed at
once (its waiters are woken at once); other proxies see the slot free this much later."""


@dataclass(slots=True)
class SlotPin:
    """A request's new conversation (``key``), to pin to the endpoint of the shared slot it
    takes, with the take."""

    key: str
    ttl: float
    endpoint: str | None = None
    """The endpoint of the last slot the fleet gave with this pin: where the shared table
    pins it (``None``: not written; a slot taken alone, or on an endpoint without a cap, has
    no shared row to carry it)."""

    def on(self, endpoint: str) -> Pin:
        return Pin("conversation", self.key, endpoint, self.ttl)


@dataclass(eq=False, slots=True)
class _Waiter:
    endpoints: frozenset[str]
    woken: asyncio.Event = field(default_factory=asyncio.Event)


class SharedSlots:
    """Slots of one proxy in its fleet."""

    def __init__(self, link: FleetLink) -> None:
        self.link = link
        self.held: dict[str, Slot] = {}
        """Shared slots this proxy holds, by id (re-announced if the fleet forgot us)."""
        self.taking: list[tuple[Slot, asyncio.Future[bool | None]]] = []
        """Slots to take in the next batch, with who waits for each."""
        self.releasing: dict[str, Slot] = {}
        """Slots to free in the next batch."""
        self.unreleased: dict[str, Slot] = {}
        """Slots whose shared release failed (or is on its way): the upkeep retries them."""
        self._waiters: list[_Waiter] = []
        self._ids = itertools.count(1)
        self._prefix = os.urandom(6).hex()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    async def take(
        self, limiter: Limiter, candidates: Sequence[Key], pin: SlotPin | None = None
    ) -> Lease | None:
        """A slot on the first of ``candidates`` with room across the fleet, else the first
        freed within the queue's timeout; ``None`` when the queue is full or time is up.
        ``pin`` goes with the shared slot taken (``pin.endpoint`` says whether it went)."""
        lease = await self._try(limiter, candidates, pin)
        if lease is not None:
            return lease
        wait = limiter.wait
        if len(self._waiters) >= wait.max_waiters:
            return None
        waiter = _Waiter(frozenset(endpoint for endpoint, _ in candidates))
        self._waiters.append(waiter)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait.timeout
        try:
            while (remaining := deadline - loop.time()) > 0:
                waiter.woken.clear()
                with contextlib.suppress(TimeoutError):  # a poll: re-try without a notice
                    await asyncio.wait_for(waiter.woken.wait(), min(remaining, POLL_S))
                lease = await self._try(limiter, candidates, pin)
                if lease is not None:
                    return lease
            return None
        finally:
            self._waiters.remove(waiter)

    async def _try(
        self, limiter: Limiter, candidates: Sequence[Key], pin: SlotPin | None = None
    ) -> Lease | None:
        for endpoint, model in candidates:
            lease = limiter.try_acquire(endpoint, model)
            if lease is None:
                continue
            cap = limiter.cap(endpoint)
            model_cap = limiter.cap(endpoint, model) if model is not None else None
            if cap is None and model_cap is None:
                lease.then(lambda endpoint=endpoint: self.freed(endpoint))
                if pin is not None:
                    pin.endpoint = None  # no shared row: the answer shares it
                return lease
            slot = Slot(
                f"{self._prefix}-{next(self._ids)}",
                endpoint,
                model,
                cap,
                model_cap,
                None if pin is None else pin.on(endpoint),
            )
            self.held[slot.id] = slot  # before the call: a timed-out take may still land
            asked = self.link.up
            try:
                taken = await self._take(slot)
            except BaseException:  # cancelled (the client left): the shared slot is given
                lease.release()  # back once its batch has answered (``_take``)
                raise
            if taken is False:
                del self.held[slot.id]
                lease.release()
                continue
            if pin is not None:
                pin.endpoint = endpoint if taken else None
            if taken is None:  # decided alone
                if asked:  # the call may have landed before it timed out: free that row
                    self._release(slot)
                else:
                    del self.held[slot.id]
            lease.then(lambda slot=slot: self._free(slot))
            return lease
        return None

    async def _take(self, slot: Slot) -> bool | None:
        """Whether the fleet gave ``slot``; ``None`` when it did not answer. Takes asked in
        one turn of the event loop (a burst of requests) go in one statement."""
        future: asyncio.Future[bool | None] = asyncio.get_running_loop().create_future()
        if not self.taking:
            self.link.spawn(self._take_batch(), "llmitm fleet take")
        self.taking.append((slot, future))
        try:
            return await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():  # answered as it was cancelled
                self._give_back(slot, future.result())
            raise  # else the batch gives it back when it answers

    async def _take_batch(self) -> None:
        await asyncio.sleep(0)
        batch, self.taking = self.taking, []
        slots = [slot for slot, _ in batch]
        taken: dict[str, bool] | None = None
        try:
            taken = await self.link.call(lambda: self.link.state.take(slots))
        finally:
            for slot, future in batch:
                result = None if taken is None else taken.get(slot.id, False)
                if future.cancelled():  # nobody wants it any more
                    self._give_back(slot, result)
                elif not future.done():
                    future.set_result(result)

    def _give_back(self, slot: Slot, taken: bool | None) -> None:
        """A shared slot whose request went away: free it if it was (or may have been) taken.
        Only after its take answered, so the release cannot overtake the insert."""
        if taken is False:
            self.held.pop(slot.id, None)
        else:
            self._release(slot)

    def _free(self, slot: Slot) -> None:
        if slot.id in self.held:
            self._release(slot)
        self.freed(slot.endpoint)

    def _release(self, slot: Slot) -> None:
        self.held.pop(slot.id, None)
        if not self.releasing:
            self.link.spawn(self._release_batch(), "llmitm fleet release")
        self.releasing[slot.id] = slot

    async def _release_batch(self) -> None:
        await asyncio.sleep(RELEASE_BATCH_S)
        slots, self.releasing = self.releasing, {}
        self.unreleased.update(slots)
        await self.release_shared(list(slots.values()))

    async def release_shared(self, slots: list[Slot]) -> None:
        """Free shared rows; kept for the upkeep to retry when the link is down."""
        if not self.link.up or not slots:
            return
        done = await self.link.call(lambda: self._released(slots))
        if done:
            for slot in slots:
                self.unreleased.pop(slot.id, None)

    async def _released(self, slots: list[Slot]) -> bool:
        await self.link.state.release(slots)
        return True

    def freed(self, endpoint: str | None) -> None:
        """A slot on ``endpoint`` (``None``: some endpoints) freed here or elsewhere: wake
        the first waiter that wants it, or every waiter."""
        for waiter in self._waiters:
            if waiter.woken.is_set():
                continue
            if endpoint is None or endpoint in waiter.endpoints:
                waiter.woken.set()
                if endpoint is not None:
                    return
