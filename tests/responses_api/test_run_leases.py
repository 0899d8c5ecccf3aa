"""The owner's side of a background run's lease (:class:`RunKeeper`): one heartbeat for all
its runs, a cancel or delete asked by another proxy carried out, and a run another proxy
ended as stale stopped without another write. Runs are real :class:`BackgroundRun` objects
over an upstream that never ends; the store is the in-memory one, to the same rules as
SQLite (``tests/store/test_responses_across_proxies.py``)."""

from __future__ import annotations

import asyncio
from typing import Any

from llmitm.responses_api.background import BackgroundRun
from llmitm.responses_api.leases import RunKeeper
from llmitm.responses_api.records import (
    ResponseReader,
    RunCancelRequested,
    RunLease,
    StaleRunEnded,
    StoredResponse,
)
from llmitm.store.memory_responses import MemoryResponses
from llmitm.translate.context import TranslationContext
from llmitm.wire.objects import response_object


class Hanging:
    """An upstream that sends its headers, then nothing."""

    status = 200

    async def relay_body(self, write: Any, drain: Any) -> None:
        await asyncio.Event().wait()


def make_run(rid: str, saved: list[dict[str, Any]]) -> BackgroundRun:
    context = TranslationContext(model="m", response_id=rid, echo={"background": True})
    queued = response_object(response_id=rid, created_at=5, model="m", echo=context.echo)
    return BackgroundRun(queued, context, record_events=lambda _e: None, record_state=saved.append)


async def test_the_keeper_renews_cancels_and_lets_go() -> None:
    store = MemoryResponses()
    clock = [1000.0]

    async def reader() -> ResponseReader:
        return store

    saved: dict[str, list[dict[str, Any]]] = {rid: [] for rid in ("r1", "r2", "r3")}
    runs = {rid: make_run(rid, saved[rid]) for rid in saved}
    keeper = RunKeeper(
        "proxy-a", runs, submit=store.apply, reader=reader, lease=5.0, clock=lambda: clock[0]
    )

    async def opener() -> Hanging:
        return Hanging()

    for run in runs.values():
        keeper.started(run)
        run.start(opener)
    keeper.stop()  # the test drives the rounds itself
    await asyncio.sleep(0)
    assert await store.run_lease("r1") == RunLease("r1", "proxy-a", 1000.0)

    lost = make_run("r4", [])
    runs["r4"] = lost  # its lease was never written (a dropped write): not taken for lost
    clock[0] = 1001.0  # lease / 5 later: a heartbeat for every run
    await keeper.tick()
    assert not lost.finished
    del runs["r4"]
    assert {lease.heartbeat_at for lease in await store.owned_leases("proxy-a")} == {1001.0}
    clock[0] = 1001.5  # too soon for the next one
    await keeper.tick()
    assert {lease.heartbeat_at for lease in await store.owned_leases("proxy-a")} == {1001.0}

    store.apply(RunCancelRequested("r1", 1001.6))  # from another proxy
    record = StoredResponse("r2", dict(runs["r2"].response, status="failed"), [], None, 1.0)
    store.apply(StaleRunEnded(record, (), stale_before=2000.0))  # another proxy gave up on r2
    await keeper.tick()
    assert runs["r1"].response["status"] == "cancelled" and saved["r1"][-1]["status"] == "cancelled"
    assert runs["r2"].finished and all(s["status"] != "failed" for s in saved["r2"])
    assert not runs["r3"].finished  # untouched
    runs["r3"].cancel()
    await asyncio.gather(*(r.task for r in runs.values() if r.task), return_exceptions=True)
