"""The record builder: builds off the event loop and delivers on it, a build starting only
once the store has fewer than STORE_AHEAD writes waiting and no collection is due after a
burst (or PACE_S has passed), and every build delivered at flush."""

from __future__ import annotations

import asyncio
import threading

import pytest

from llmitm.addons.record import builder as builder_module
from llmitm.addons.record.builder import STORE_AHEAD, RecordBuilder


class Store:
    """Writes waiting, as the recorder reports them to the builder."""

    def __init__(self, behind: int) -> None:
        self.behind = behind

    def waiting(self) -> int:
        return self.behind


async def test_a_build_waits_while_the_store_is_store_ahead_writes_behind() -> None:
    store, delivered = Store(STORE_AHEAD), list[object]()
    builder = RecordBuilder(delivered.append, store.waiting)
    builder.submit(lambda: "built off the loop")
    await asyncio.sleep(0.3)
    assert delivered == [] and builder.waiting == 1
    store.behind = STORE_AHEAD - 1
    for _ in range(100):
        await asyncio.sleep(0.01)
        if delivered:
            break
    assert delivered == ["built off the loop"] and builder.waiting == 0
    builder.flush()


async def test_a_store_that_stays_behind_holds_a_build_for_pace_s_at_most(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(builder_module, "PACE_S", 0.2)
    delivered: list[object] = []
    builder = RecordBuilder(delivered.append, lambda: 10**6)
    builder.submit(lambda: "built anyway")
    await asyncio.sleep(0.1)
    assert delivered == []
    await asyncio.sleep(0.6)
    assert delivered == ["built anyway"]
    builder.flush()


async def test_a_build_waits_for_the_collection_due_after_a_burst(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    due, delivered = [True], list[object]()
    builder = RecordBuilder(delivered.append, collection_due=lambda: due[0])
    builder.submit(lambda: "built after the collection")
    await asyncio.sleep(0.3)
    assert delivered == [] and builder.waiting == 1
    due[0] = False
    for _ in range(100):
        await asyncio.sleep(0.01)
        if delivered:
            break
    assert delivered == ["built after the collection"]
    builder.flush()
    # Never longer than PACE_S, whatever the proxy says.
    monkeypatch.setattr(builder_module, "PACE_S", 0.2)
    due[0], delivered = True, []
    builder = RecordBuilder(delivered.append, collection_due=lambda: due[0])
    builder.submit(lambda: "built anyway")
    await asyncio.sleep(0.7)
    assert delivered == ["built anyway"]
    builder.flush()


async def test_records_are_built_on_the_worker_and_delivered_on_the_loop() -> None:
    threads: list[bool] = []
    delivered: list[object] = []
    builder = RecordBuilder(delivered.append)

    def build() -> str:
        threads.append(threading.current_thread() is threading.main_thread())
        return "record"

    builder.submit(build)
    builder.flush()  # at shutdown: waits for the worker, delivers here
    assert threads == [False] and delivered == ["record"]
