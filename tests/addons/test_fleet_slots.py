"""Taking slots in a fleet (``addons.fleet_slots``) over a real PostgreSQL database: two
proxies' slot takers in one process share a cap, a waiter is woken by the other's release,
the queue's bounds hold, and an unreachable database costs a decision taken alone (counted,
logged once), never a hang."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import AsyncIterator

import pytest

from llmitm.addons.fleet_link import FleetLink
from llmitm.addons.fleet_slots import SharedSlots, SlotPin
from llmitm.routing.limits import Limiter, WaitPolicy
from llmitm.store.postgres_fleet import PostgresFleet


class Proxy:
    """One proxy's share of the fleet: its link, its slots and its own limiter."""

    def __init__(self, state: PostgresFleet, cap: int = 2, wait: WaitPolicy | None = None):
        self.link = FleetLink(state)
        self.slots = SharedSlots(self.link)
        self.limiter = Limiter({"e": cap, "free": None}, wait=wait or WaitPolicy(10, 5.0))

    async def open(self) -> Proxy:
        def heard(kind: str, notice: dict) -> None:
            if kind == "free":
                self.slots.freed(notice.get("endpoint"))

        await self.link.call(lambda: self.link.state.open(heard), retry=True)
        return self

    async def take(self, *endpoints: str):
        return await self.slots.take(self.limiter, [(e, "m") for e in endpoints])


@pytest.fixture
async def two(pg_dsn: str) -> AsyncIterator[tuple[Proxy, Proxy]]:
    one = await Proxy(PostgresFleet(pg_dsn, lease=10, timeout=5)).open()
    other = await Proxy(PostgresFleet(pg_dsn, lease=10, timeout=5)).open()
    yield one, other
    for proxy in (one, other):
        await proxy.link.drain(5)
        await proxy.link.state.close()


async def test_a_cap_holds_across_two_proxies_and_each_keeps_its_own_count(two) -> None:
    one, other = two
    first, second = await one.take("e"), await other.take("e")
    assert first is not None and second is not None
    assert one.limiter.in_flight("e") == 1 and other.limiter.in_flight("e") == 1
    assert await one.link.state.slots_held() == 2
    # Full across the fleet: the next endpoint of the candidates is taken instead.
    fallback = await one.slots._try(one.limiter, [("e", "m"), ("free", "m")])
    assert fallback is not None and fallback.endpoint == "free"
    assert one.limiter.in_flight("e") == 1  # the local slot it tried was given back
    fallback.release()
    first.release()
    second.release()
    await one.link.drain(5)
    await other.link.drain(5)
    assert await one.link.state.slots_held() == 0
    assert one.link.fallbacks == 0 and other.link.fallbacks == 0


async def test_an_endpoint_without_a_cap_costs_no_database_call(two) -> None:
    one, _ = two
    lease = await one.take("free")
    assert lease is not None and not one.slots.held
    lease.release()


async def test_a_new_conversations_pin_goes_with_its_slot(two) -> None:
    one, other = two
    pin = SlotPin("route\x00m\x00c1", 60)
    first = await one.slots.take(one.limiter, [("e", "m")], pin)
    assert first is not None and pin.endpoint == "e"
    assert await other.link.state.pinned([(None, pin.key)]) == [{"conversation": "e"}]
    # An endpoint without a cap takes no shared slot to carry a pin: the answer writes it.
    other_pin = SlotPin("route\x00m\x00c2", 60)
    free = await one.slots.take(one.limiter, [("free", "m")], other_pin)
    assert free is not None and other_pin.endpoint is None
    assert await other.link.state.pinned([(None, other_pin.key)]) == [{}]
    first.release()
    free.release()


@pytest.mark.timing  # woken within a bound
async def test_a_waiter_is_woken_by_the_other_proxys_release(two) -> None:
    one, other = two
    held = [await one.take("e"), await one.take("e")]
    assert all(held)
    waiting = asyncio.create_task(other.take("e"))
    await asyncio.sleep(0.2)
    assert not waiting.done() and other.slots.waiting == 1
    released = time.monotonic()
    held[0].release()
    lease = await asyncio.wait_for(waiting, 5)
    assert lease is not None and lease.endpoint == "e"
    # A notice, not the one-second poll, woke it (generous for a loaded machine).
    assert time.monotonic() - released < 0.9
    lease.release()
    held[1].release()


async def test_the_wait_is_bounded_and_the_queue_too(pg_dsn: str) -> None:
    state = PostgresFleet(pg_dsn, lease=10, timeout=5)
    proxy = await Proxy(state, cap=1, wait=WaitPolicy(max_waiters=1, timeout=0.3)).open()
    try:
        held = await proxy.take("e")
        assert held is not None
        waiter = asyncio.create_task(proxy.take("e"))
        await asyncio.sleep(0.05)
        assert await proxy.take("e") is None  # the queue (one waiter) is full: at once
        assert await asyncio.wait_for(waiter, 5) is None  # timed out
        assert proxy.slots.waiting == 0
        held.release()
    finally:
        await proxy.link.drain(5)
        await state.close()


@pytest.mark.timing  # never a hang: answers within a bound
async def test_an_unreachable_database_means_deciding_alone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    state = PostgresFleet(f"postgresql://llmitm@127.0.0.1:{port}/x", lease=10, timeout=0.5)
    proxy = Proxy(state, cap=1, wait=WaitPolicy(max_waiters=5, timeout=0.3))
    await proxy.open()
    assert not proxy.link.up
    caplog.set_level(logging.WARNING)
    started = time.monotonic()
    first = await proxy.take("e")
    assert first is not None  # this process's own cap decides
    assert await proxy.take("e") is None  # ... and holds: the wait ends in time
    assert time.monotonic() - started < 3
    assert proxy.link.fallbacks >= 2
    waiting = asyncio.create_task(proxy.take("e"))
    await asyncio.sleep(0.05)
    first.release()  # a local release wakes a local waiter
    second = await asyncio.wait_for(waiting, 2)
    assert second is not None
    second.release()
    await state.close()


async def test_losing_the_database_is_logged_once(
    pg_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    state = PostgresFleet(pg_dsn, lease=10, timeout=0.5)
    proxy = await Proxy(state, cap=100).open()
    assert proxy.link.up
    # The database goes away under the proxy: its connections are closed from outside.
    pool = state._pool
    assert pool is not None
    pool.terminate()
    caplog.set_level(logging.WARNING)
    leases = [await proxy.take("e") for _ in range(5)]
    assert all(leases)
    lost = [r for r in caplog.records if "unreachable" in r.getMessage()]
    assert len(lost) == 1 and proxy.link.fallbacks >= 5
    for lease in leases:
        assert lease is not None
        lease.release()
    state._pool = None
    await state.close()


async def test_a_burst_of_takes_gets_exactly_the_cap(two) -> None:
    one, other = two
    one.limiter = Limiter({"e": 4})
    other.limiter = Limiter({"e": 4})
    tries = [proxy.slots._try(proxy.limiter, [("e", "m")]) for proxy in [one, other] * 6]
    leases = [lease for lease in await asyncio.gather(*tries) if lease is not None]
    assert len(leases) == 4
    assert await one.link.state.slots_held() == 4
    assert one.limiter.in_flight("e") + other.limiter.in_flight("e") == 4
    for lease in leases:
        lease.release()


async def test_a_take_cancelled_mid_call_gives_both_slots_back(two) -> None:
    one, _ = two
    for wait in (0.0, 0.002, 0.01, 0.05):  # before, during and after the database answers
        task = asyncio.create_task(one.take("e"))
        await asyncio.sleep(wait)
        task.cancel()
        try:
            lease = await task
        except asyncio.CancelledError:
            lease = None
        if lease is not None:  # it won the race: an ordinary lease, released as usual
            lease.release()
        await asyncio.sleep(0.1)  # the batch answers, the release batch follows
        await one.link.drain(5)
        assert one.limiter.in_flight("e") == 0, wait
        assert await one.link.state.slots_held() == 0, wait
        assert not one.slots.held, wait
