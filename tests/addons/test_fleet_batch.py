"""Fleet calls gathered per turn of the event loop (``addons.fleet_batch``) over a real
PostgreSQL database: a burst of pin look-ups and new pins is one statement each, every caller
gets its own answer, and a caller of a batch the database does not answer decides alone."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from llmitm.addons.fleet_batch import TurnBatch
from llmitm.addons.fleet_link import FleetLink
from llmitm.store.fleet import Pin
from llmitm.store.postgres_fleet import PostgresFleet


class Counted:
    """A real fleet state's ``pin`` and ``pinned``, counting the calls that reach it."""

    def __init__(self, state: PostgresFleet) -> None:
        self.state = state
        self.calls: list[int] = []
        self.while_out: list[asyncio.Task] = []
        """Asks made while a call is out (``also``), started by that call."""
        self.also: TurnBatch | None = None

    async def pinned(self, asked: Sequence[tuple[str | None, str | None]]):
        self.calls.append(len(asked))
        if self.also is not None and len(self.calls) == 1:
            batch = self.also
            self.while_out = [
                asyncio.create_task(batch.ask((None, f"c{n}"))) for n in range(10, 20)
            ]
        return await self.state.pinned(asked)

    async def pin_all(self, asked: Sequence[Sequence[Pin]]) -> list[None]:
        self.calls.append(len(asked))
        await self.state.pin([pin for pins in asked for pin in pins])
        return [None] * len(asked)


async def test_a_burst_is_one_call_and_each_caller_gets_its_answer(pg_dsn: str) -> None:
    state = PostgresFleet(pg_dsn, lease=10, timeout=5)
    link = FleetLink(state)
    await link.call(lambda: state.open(lambda kind, notice: None), retry=True)
    try:
        counted = Counted(state)
        pins = TurnBatch(link, counted.pin_all, "pins")
        lookups = TurnBatch(link, counted.pinned, "lookups")
        written = [[Pin("conversation", f"c{n}", f"e{n % 3}", 60)] for n in range(20)]
        assert await asyncio.gather(*(pins.ask(p) for p in written)) == [None] * 20
        answers = await asyncio.gather(*(lookups.ask((None, f"c{n}")) for n in range(21)))
        assert answers == [{"conversation": f"e{n % 3}"} for n in range(20)] + [{}]
        assert counted.calls == [20, 21]  # one call per burst, not one per caller
    finally:
        await state.close()


async def test_questions_asked_while_a_call_is_out_go_together_in_the_next(
    pg_dsn: str,
) -> None:
    state = PostgresFleet(pg_dsn, lease=10, timeout=5)
    link = FleetLink(state)
    await link.call(lambda: state.open(lambda kind, notice: None), retry=True)
    try:
        await state.pin([Pin("conversation", f"c{n}", "e", 60) for n in range(20)])
        counted = Counted(state)
        lookups = TurnBatch(link, counted.pinned, "lookups")
        counted.also = lookups
        first = await asyncio.gather(*(lookups.ask((None, f"c{n}")) for n in range(5)))
        later = await asyncio.gather(*counted.while_out)
        assert first == [{"conversation": "e"}] * 5 and later == [{"conversation": "e"}] * 10
        assert counted.calls == [5, 10]
    finally:
        await state.close()


async def test_an_unanswered_batch_leaves_every_caller_to_decide_alone(pg_dsn: str) -> None:
    state = PostgresFleet(pg_dsn, lease=10, timeout=5)
    link = FleetLink(state)  # never opened: the link is down
    lookups = TurnBatch(link, state.pinned, "lookups")
    answers = await asyncio.gather(*(lookups.ask(("resp_1", None)) for _ in range(5)))
    assert answers == [None] * 5
    assert link.fallbacks == 5  # each caller's decision is counted, though one call failed
