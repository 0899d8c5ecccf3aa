"""The fleet's shared routing state on a real PostgreSQL server: two "proxies" (two state
objects on one database) share caps, cooldowns and pins; a proxy that stops beating frees its
slots after its lease; an unreachable database is an error within the call's timeout."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator

import pytest

from llmitm.store.fleet import Cooldown, FleetUnavailable, Pin, Slot, is_shared
from llmitm.store.open import open_fleet
from llmitm.store.postgres_fleet import PostgresFleet


class Heard:
    def __init__(self) -> None:
        self.notices: list[tuple[str, dict]] = []
        self.event = asyncio.Event()

    def __call__(self, kind: str, notice: dict) -> None:
        self.notices.append((kind, notice))
        self.event.set()

    async def next(self, kind: str, timeout: float = 5.0) -> dict:
        async with asyncio.timeout(timeout):
            while True:
                for seen, notice in self.notices:
                    if seen == kind:
                        self.notices.remove((seen, notice))
                        return notice
                self.event.clear()
                await self.event.wait()


async def member(dsn: str, lease: float = 10.0) -> tuple[PostgresFleet, Heard]:
    fleet = open_fleet(dsn, lease=lease, timeout=5.0)
    assert isinstance(fleet, PostgresFleet)
    heard = Heard()
    await fleet.open(heard)
    return fleet, heard


@pytest.fixture
async def two(pg_dsn: str) -> AsyncIterator[tuple[PostgresFleet, Heard, PostgresFleet, Heard]]:
    a, heard_a = await member(pg_dsn)
    b, heard_b = await member(pg_dsn)
    yield a, heard_a, b, heard_b
    await a.close()
    await b.close()


async def took(fleet: PostgresFleet, one: Slot) -> bool:
    return (await fleet.take([one]))[one.id]


def slot(n: int, endpoint: str = "e", model: str | None = "m", cap: int | None = 2, model_cap=None):
    return Slot(f"s{n}", endpoint, model, cap, model_cap)


def test_only_database_urls_name_a_fleet() -> None:
    assert is_shared("postgresql://u@h/db") and is_shared("postgres://h/db")
    assert not is_shared("/var/lib/llmitm.db") and not is_shared("") and not is_shared(None)
    assert open_fleet("llmitm.db", lease=10, timeout=1) is None


async def test_a_cap_holds_across_proxies(two) -> None:
    a, _, b, heard_b = two
    assert await took(a, slot(1))
    assert await took(b, slot(2))
    assert not await took(a, slot(3)) and not await took(b, slot(4))
    assert await took(a, slot(5, endpoint="other"))  # another endpoint has its own cap
    assert await a.slots_held() == 3
    await a.release([slot(1)])  # from a full cap: the fleet is told
    assert (await heard_b.next("free"))["endpoint"] == "e"
    assert await took(b, slot(6))
    await a.release([slot(1)])  # twice: nothing more is freed
    assert await b.slots_held() == 3
    for n in (2, 5, 6):
        await a.release([slot(n)])
    assert await a.slots_held() == 0


async def test_only_a_release_from_a_full_cap_is_announced(two) -> None:
    a, heard_a, b, _ = two
    assert await took(a, slot(1, cap=3)) and await took(a, slot(2, cap=3))
    await a.release([slot(1, cap=3)])  # 2 of 3 held: nobody can be waiting
    assert await took(b, slot(3, cap=3)) and await took(b, slot(4, cap=3))
    await b.release([slot(3, cap=3)])  # 3 of 3 held: someone may be waiting
    await b.cool(Cooldown("fence", None, 1.0))  # notices arrive in commit order: a fence
    await heard_a.next("cool")
    assert [kind for kind, _ in heard_a.notices] == ["free"]  # the second release's only
    assert heard_a.notices[0][1]["endpoint"] == "e"


async def test_a_batch_takes_in_order_up_to_the_cap(two) -> None:
    a, _, b, _ = two
    assert await took(b, slot(0, cap=3))
    batch = [slot(n, cap=3) for n in range(1, 4)] + [slot(9, endpoint="d", cap=1)]
    assert await a.take(batch) == {"s1": True, "s2": True, "s3": False, "s9": True}


async def test_a_model_cap_is_checked_with_the_endpoint_cap(two) -> None:
    a, _, b, _ = two
    assert await took(a, slot(1, cap=10, model_cap=1))
    assert not await took(b, slot(2, cap=10, model_cap=1))
    assert await took(b, slot(3, model="other", cap=10, model_cap=1))


async def test_concurrent_takes_never_pass_the_cap(two) -> None:
    a, _, b, _ = two
    results = await asyncio.gather(*(took(f, slot(n, cap=3)) for n, f in enumerate([a, b] * 10)))
    assert sum(results) == 3
    assert await a.slots_held() == 3


async def test_a_dead_proxy_frees_its_slots_after_its_lease(pg_dsn: str) -> None:
    dead, _ = await member(pg_dsn, lease=1.0)
    alive, heard = await member(pg_dsn, lease=1.0)
    try:
        assert await took(dead, slot(1)) and await took(dead, slot(2))
        assert not await took(alive, slot(3))
        members = {m.id: m for m in await alive.members()}
        assert members[dead.proxy].slots == {"e": 2} and members[dead.proxy].alive
        # ``dead`` beats no more; ``alive`` keeps beating. The lease may run out between a
        # take that failed and the beat after it, so the sweep may come in either beat.
        deadline = time.monotonic() + 5
        swept = 0
        while not await took(alive, slot(3)):
            assert time.monotonic() < deadline, "the dead proxy's slots were never freed"
            swept += await alive.heartbeat([])
            await asyncio.sleep(0.1)
        swept += await alive.heartbeat([])
        assert swept == 2  # the sweep deletes the dead one's rows, once
        assert (await heard.next("free"))["endpoint"] is None  # and says so
        assert dead.proxy not in {m.id for m in await alive.members()}
        assert await alive.slots_held() == 1
        # The dead one comes back (its link was down): it joins again with what it holds.
        await dead.heartbeat([slot(1), slot(2)])
        assert await alive.slots_held() == 3
    finally:
        await dead.close()
        await alive.close()


async def test_leaving_frees_slots_at_once(pg_dsn: str) -> None:
    a, _ = await member(pg_dsn)
    b, heard_b = await member(pg_dsn)
    try:
        assert await took(a, slot(1)) and await took(a, slot(2))
        await a.close()
        await heard_b.next("free")
        assert await took(b, slot(3))
    finally:
        await b.close()


async def test_a_cooldown_reaches_the_other_proxy(two) -> None:
    a, _, b, heard_b = two
    await a.cool(Cooldown("e", "m", 30.0, "rate_limited"))
    notice = await heard_b.next("cool")
    assert notice["endpoint"] == "e" and notice["model"] == "m"
    assert 29 < notice["remaining"] <= 30 and notice["reason"] == "rate_limited"
    await a.cool(Cooldown("e", "m", 5.0, "server_error"))  # never shortens
    (cooling,) = await b.cooldowns()
    assert cooling.remaining > 29 and cooling.reason == "rate_limited"
    await b.cool(Cooldown("e", None, 2.0, "connect_error"))
    assert {(c.endpoint, c.model) for c in await a.cooldowns()} == {("e", "m"), ("e", None)}


async def test_pins_are_shared_and_expire(two) -> None:
    a, _, b, _ = two
    await a.pin(
        [
            Pin("response", "resp_1", "x", 60),
            Pin("conversation", "route\x00model\x00c1", "y", 0.2),
            Pin("conversation", "route\x00model\x00c1", "z", 0.2),  # the latest wins
        ]
    )
    assert await b.pinned([("resp_1", "route\x00model\x00c1"), (None, "c2"), ("resp_1", None)]) == [
        {"response": "x", "conversation": "z"},
        {},
        {"response": "x"},
    ]
    assert await b.pinned([]) == []
    await asyncio.sleep(0.3)
    assert await b.pinned([("resp_1", "route\x00model\x00c1")]) == [{"response": "x"}]


async def test_a_take_pins_the_conversations_of_the_slots_it_took(two) -> None:
    a, _, b, _ = two
    assert await took(b, slot(0, cap=2))
    pinned = [
        Slot("s1", "e", "m", 2, None, Pin("conversation", "c1", "e", 60)),
        Slot("s2", "e", "m", 2, None, Pin("conversation", "c2", "e", 60)),  # the cap is full
        Slot("s3", "d", "m", 5, None, Pin("conversation", "c3", "d", 60)),
        Slot("s4", "f", "m", 5, None, Pin("conversation", "c3", "f", 60)),  # c3 again: last
        Slot("s5", "f", "m", 5, None),
    ]
    assert await a.take(pinned) == {"s1": True, "s2": False, "s3": True, "s4": True, "s5": True}
    assert await b.pinned([(None, "c1"), (None, "c2"), (None, "c3")]) == [
        {"conversation": "e"},
        {},
        {"conversation": "f"},
    ]
    # Taken again for another endpoint (a failover's next attempt): the pin moves with it.
    assert await a.take([Slot("s6", "d", "m", 5, None, Pin("conversation", "c1", "d", 60))])
    assert await b.pinned([(None, "c1")]) == [{"conversation": "d"}]
    assert await a.slots_held() == 6


async def test_the_schema_is_made_once(pg_dsn: str, postgres) -> None:
    first, _ = await member(pg_dsn)
    second, _ = await member(pg_dsn)
    await first.close()
    await second.close()
    database = pg_dsn.rsplit("/", 1)[1]
    assert postgres.psql("SELECT version FROM llmitm_fleet_schema", database).split() == ["1", "2"]
    unlogged = postgres.psql(
        "SELECT count(*) FROM pg_class WHERE relname LIKE 'llmitm_fleet_%'"
        " AND relkind = 'r' AND relpersistence = 'u'",
        database,
    )
    assert unlogged.split() == ["4"]  # the routing state; its schema table stays logged


async def test_an_unreachable_database_fails_within_the_timeout() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    fleet = PostgresFleet(f"postgresql://llmitm@127.0.0.1:{port}/x", lease=10, timeout=0.5)
    started = time.monotonic()
    with pytest.raises(FleetUnavailable):
        await fleet.open(lambda kind, notice: None)
    assert time.monotonic() - started < 5
    with pytest.raises(FleetUnavailable):
        await took(fleet, slot(1))
    await fleet.close()
