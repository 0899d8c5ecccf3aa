"""The store's part in Responses state shared by several proxies: pending marks, background
run leases (heartbeat, cancel and delete requests, a stale run ended by a reader), the same
rules in memory, in SQLite and in PostgreSQL — and on both databases, several store objects
on one database standing for several proxies: one seal key, one fingerprint key, a lookup
that waits for the other's write, a stale run ended once however many readers race its
owner's heartbeat.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from llmitm.responses_api.records import (
    PendingResponse,
    ResponseDeleted,
    ResponseEvents,
    ResponseOwned,
    ResponseOwner,
    ResponsePending,
    ResponseReader,
    ResponseSaved,
    ResponsesPurged,
    RunCancelRequested,
    RunEnded,
    RunLease,
    RunsHeartbeat,
    RunStarted,
    StaleRunEnded,
    StoredResponse,
)
from llmitm.responses_api.remote_runs import follow, sequence_number, settle
from llmitm.responses_api.waiting import WaitingReader
from llmitm.store import SqliteStore
from llmitm.store.memory_responses import MemoryResponses
from tests.store.backends import Backend


class Memory:
    """The in-memory store behind the writer interface the tests use."""

    def __init__(self) -> None:
        self.state = MemoryResponses()

    def submit(self, write: object) -> None:
        self.state.apply(write)

    async def flush(self) -> None:
        """Nothing to wait for: each write is applied as it is submitted."""


@pytest.fixture(params=["memory", "sqlite", "postgresql"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[object]:
    if request.param == "memory":
        memory = Memory()
        yield memory
        return
    backend = (
        Backend("sqlite", tmp_path)
        if request.param == "sqlite"
        else request.getfixturevalue("pg_backend")
    )
    async with backend.store() as opened:
        yield opened


def reader_of(store: object) -> ResponseReader:
    return store.state if isinstance(store, Memory) else store  # type: ignore[return-value]


def running(rid: str, credential: str | None = "alice") -> StoredResponse:
    response = {"id": rid, "object": "response", "status": "in_progress", "background": True}
    return StoredResponse(rid, response, [], None, 1.0, credential=credential)


async def test_a_pending_mark_lasts_until_the_response_is_stored(store: object) -> None:
    reader = reader_of(store)
    now = time.time()
    store.submit(ResponsePending(PendingResponse("r1", now, "alice")))  # type: ignore[attr-defined]
    assert await reader.pending("r1") == PendingResponse("r1", now, "alice")
    store.submit(ResponseSaved(running("r1")))  # type: ignore[attr-defined]
    assert await reader.pending("r1") is None
    store.submit(ResponsePending(PendingResponse("r2", now - 7200, None)))  # type: ignore[attr-defined]
    assert await reader.pending("r2") is None  # older than PENDING_MAX_AGE: a dead proxy's
    store.submit(ResponsePending(PendingResponse("r3", now, None)))  # type: ignore[attr-defined]
    store.submit(ResponseDeleted("r3"))  # type: ignore[attr-defined]
    assert await reader.pending("r3") is None


async def test_a_lease_is_renewed_by_its_owner_only_and_carries_cancel_requests(
    store: object,
) -> None:
    reader = reader_of(store)
    submit = store.submit  # type: ignore[attr-defined]
    submit(RunStarted(RunLease("r1", "proxy-a", 100.0)))
    submit(RunStarted(RunLease("r2", "proxy-a", 100.0)))
    submit(RunStarted(RunLease("r3", "proxy-b", 100.0)))
    submit(RunsHeartbeat("proxy-a", ("r1", "r2", "r3"), 150.0))
    assert (await reader.run_lease("r1")) == RunLease("r1", "proxy-a", 150.0)
    assert (await reader.run_lease("r3")) == RunLease("r3", "proxy-b", 100.0)  # not a's
    submit(RunCancelRequested("r1", 160.0))
    submit(RunCancelRequested("r1", 170.0, delete=True))  # the first time stays; delete sticks
    submit(RunCancelRequested("r1", 180.0))
    submit(RunCancelRequested("nope", 160.0))  # no lease: nothing to ask
    assert await reader.run_lease("nope") is None
    leases = sorted(await reader.owned_leases("proxy-a"), key=lambda lease: lease.response_id)
    assert leases == [
        RunLease("r1", "proxy-a", 150.0, 160.0, True),
        RunLease("r2", "proxy-a", 150.0),
    ]
    assert [lease.response_id for lease in await reader.owned_leases("proxy-b")] == ["r3"]


async def test_a_run_ending_removes_its_lease_and_honours_a_delete(store: object) -> None:
    reader = reader_of(store)
    submit = store.submit  # type: ignore[attr-defined]
    for rid in ("kept", "deleted"):
        submit(RunStarted(RunLease(rid, "proxy-a", time.time())))
        submit(ResponseSaved(running(rid)))
        submit(ResponseEvents(rid, ((0, b"e0"),)))
    submit(RunCancelRequested("deleted", time.time(), delete=True))
    submit(ResponseDeleted("deleted"))
    submit(ResponseSaved(running("deleted")))  # the owner's last save, after the delete
    for rid in ("kept", "deleted"):
        submit(RunEnded(rid))
        assert await reader.run_lease(rid) is None
    assert await reader.response("kept") is not None
    assert await reader.response("deleted") is None  # not brought back by the last save
    assert await reader.events("deleted") == []


async def test_a_stale_run_is_ended_once_and_only_if_still_stale(store: object) -> None:
    reader = reader_of(store)
    submit = store.submit  # type: ignore[attr-defined]
    submit(RunStarted(RunLease("r1", "proxy-a", 100.0)))
    submit(ResponseSaved(running("r1")))
    submit(ResponseEvents("r1", ((0, b'{"sequence_number":0}'),)))
    failed = StoredResponse(
        "r1", {**running("r1").response, "status": "failed"}, [], None, 1.0, credential="alice"
    )
    submit(StaleRunEnded(failed, ((1, b"failed by b"),), stale_before=90.0))
    assert (await reader.response("r1")).status == "in_progress"  # type: ignore[union-attr]
    assert await reader.run_lease("r1") is not None  # renewed after 90: not stale for it
    submit(StaleRunEnded(failed, ((1, b"failed by b"),), stale_before=110.0))
    submit(StaleRunEnded(failed, ((1, b"failed by c"),), stale_before=110.0))
    assert (await reader.response("r1")).status == "failed"  # type: ignore[union-attr]
    assert await reader.events("r1") == [b'{"sequence_number":0}', b"failed by b"]
    assert await reader.run_lease("r1") is None


async def test_a_reader_settles_a_dead_owners_run_failed_with_a_closing_event(
    store: object,
) -> None:
    reader = reader_of(store)
    submit = store.submit  # type: ignore[attr-defined]
    submit(RunStarted(RunLease("r1", "proxy-a", 1000.0)))
    record = running("r1")
    submit(ResponseSaved(record))
    submit(ResponseEvents("r1", ((0, b'data: {"sequence_number":0}'),)))
    alive = await settle(record, reader, now=1005.0, lease=6.0, submit=submit)
    assert alive is record  # within the lease
    dead = await settle(record, reader, now=1007.0, lease=6.0, submit=submit)
    assert dead.status == "failed" and "no heartbeat for 6 s" in dead.response["error"]["message"]
    stored = await reader.response("r1")
    assert stored is not None and stored.status == "failed"
    events = await reader.events("r1")
    assert [sequence_number(e) for e in events] == [0, 1]
    assert b'"type":"response.failed"' in events[1]


async def test_purge_forgets_old_marks_and_leases(store: object) -> None:
    reader = reader_of(store)
    submit = store.submit  # type: ignore[attr-defined]
    now = time.time()
    submit(RunStarted(RunLease("old", "proxy-a", now - 7200)))
    submit(RunStarted(RunLease("new", "proxy-a", now)))
    submit(ResponsesPurged(now))
    assert await reader.run_lease("old") is None
    assert await reader.run_lease("new") is not None


# -- several store objects on one database: several proxies ---------------------------------


async def test_two_proxies_creating_one_store_at_once_agree_on_its_keys(backend: Backend) -> None:
    stores = [backend.store("fleet") for _ in range(4)]
    await asyncio.gather(*(s.open() for s in stores))
    try:
        seal_keys = {await s.seal_key() for s in stores}
        fingerprint_keys = {await s.fingerprint_key() for s in stores}
    finally:
        await asyncio.gather(*(s.close() for s in stores))
    assert len(seal_keys) == 1 and None not in seal_keys
    assert len(fingerprint_keys) == 1 and None not in fingerprint_keys


async def test_a_lookup_waits_for_a_response_the_other_proxy_is_storing(backend: Backend) -> None:
    async with backend.store("fleet") as a, backend.store("fleet") as b:
        a.submit(ResponsePending(PendingResponse("r1", time.time(), "alice")))
        await a.flush()

        async def store_later() -> None:
            await asyncio.sleep(0.3)  # the answer is still streaming on proxy A
            a.submit(ResponseSaved(running("r1")))

        writing = asyncio.create_task(store_later())
        found = await WaitingReader(b, wait=5.0).chain("r1", credential="alice")
        await writing
        assert [r.id for r in found] == ["r1"]
        # Another credential's pending id is not waited for, nor is it found.
        a.submit(ResponsePending(PendingResponse("r2", time.time(), "alice")))
        await a.flush()
        assert await WaitingReader(b, wait=5.0).response("r2", "bob") is None
        # An id nobody is answering gets only the grace period, then "not found".
        assert await WaitingReader(b, wait=0.2).response("r3") is None
        # A native endpoint's id is not llmitm's to store: no wait.
        a.submit(ResponseOwned(ResponseOwner("r4", "native", time.time())))
        a.submit(ResponsePending(PendingResponse("r4", time.time(), None)))
        await a.flush()
        assert await WaitingReader(b, wait=60.0).response("r4") is None


async def test_a_response_read_while_the_other_proxy_deletes_it_is_found_or_not_never_broken(
    backend: Backend,
) -> None:
    """A read takes a response's row, then the chunks it names; the other proxy's delete
    may release them in between. The reader gets the response or nothing, never an error."""
    history = [{"role": "user", "content": f"turn {k} " + "x" * 3000} for k in range(40)]
    async with backend.store("fleet") as a, backend.store("fleet") as b:
        for round_ in range(20):
            rid = f"r{round_}"
            record = StoredResponse(
                rid, running(rid).response, history, None, 1.0, credential="alice"
            )
            a.submit(ResponseSaved(record))
            await a.flush()
            seen = asyncio.Event()

            async def read(rid: str = rid, seen: asyncio.Event = seen) -> int:
                try:
                    for reads in range(1, 500):  # until the delete shows
                        found = await b.response(rid, "alice")
                        if found is None:
                            return reads
                        assert found.input_items == history
                        seen.set()
                    raise AssertionError("the delete never showed")
                finally:
                    seen.set()  # a read that failed is raised below, not waited for

            reading = asyncio.create_task(read())
            await asyncio.wait_for(seen.wait(), 30)  # reading, then deleted under the reads
            a.submit(ResponseDeleted(rid))
            await a.flush()
            assert await reading > 1


def failed_by(reader: int) -> StoredResponse:
    response = {**running("r1").response, "status": "failed", "error": {"message": str(reader)}}
    return StoredResponse("r1", response, [], None, 1.0, credential="alice")


async def test_readers_racing_the_owners_heartbeat_end_a_stale_run_at_most_once(
    backend: Backend,
) -> None:
    # Proxy A runs r1 and renews its lease while B, C and D each find it stale and end it.
    # Whichever lands first decides: the run is ended by exactly one reader (its closing
    # event alone), or renewed and not ended at all — never two closings, never a lease
    # that outlives the end. Small batches make the proxies' transactions interleave.
    for round_ in range(6):
        rid = f"r{round_}"
        owner, *readers = [backend.store("fleet", batch_size=1) for _ in range(4)]
        await asyncio.gather(*(s.open() for s in (owner, *readers)))
        try:
            owner.submit(RunStarted(RunLease(rid, "proxy-a", 100.0)))
            owner.submit(ResponseSaved(replace(running(rid), id=rid)))
            owner.submit(ResponseEvents(rid, ((0, b"e0"),)))
            await owner.flush()
            if round_ % 2:  # the heartbeat submitted first, or last
                owner.submit(RunsHeartbeat("proxy-a", (rid,), 200.0))
            for k, reader in enumerate(readers, start=1):
                ended = failed_by(k)
                ended = replace(ended, id=rid, response={**ended.response, "id": rid})
                reader.submit(StaleRunEnded(ended, ((k, b"closed by %d" % k),), 150.0))
            if not round_ % 2:
                owner.submit(RunsHeartbeat("proxy-a", (rid,), 200.0))
            await asyncio.gather(*(s.flush() for s in (owner, *readers)))
            lease = await owner.run_lease(rid)
            stored = await owner.response(rid)
            events = await owner.events(rid)
        finally:
            await asyncio.gather(*(s.close() for s in (owner, *readers)))
        assert stored is not None
        if lease is None:  # a reader was first: it alone closed the run
            assert stored.status == "failed"
            (closing,) = events[1:]
            assert closing == b"closed by %s" % stored.response["error"]["message"].encode()
        else:  # the heartbeat was first: nobody ended it
            assert lease.heartbeat_at == 200.0
            assert stored.status == "in_progress" and events == [b"e0"]


@pytest.mark.timing
async def test_waiting_is_bounded(tmp_path: Path) -> None:
    async with SqliteStore(tmp_path / "fleet.db") as a:
        a.submit(ResponsePending(PendingResponse("never", time.time(), None)))
        started = time.monotonic()
        assert await WaitingReader(a, wait=0.5).response("never") is None
        assert 0.5 <= time.monotonic() - started < 1.5
        started = time.monotonic()
        assert await WaitingReader(a, wait=2.0).response("unknown") is None
        assert time.monotonic() - started < 0.5  # not pending: the grace only (0.1 s)


# -- following another proxy's run through the store -----------------------------------------


def frame_of(seq: int) -> bytes:
    return b'event: e\ndata: {"type":"e","sequence_number":%d}\n\n' % seq


async def test_a_follower_gets_new_events_as_they_are_stored_and_stops_at_the_end(
    store: object,
) -> None:
    reader = reader_of(store)
    submit = store.submit  # type: ignore[attr-defined]
    submit(ResponseSaved(running("r1")))
    submit(ResponseEvents("r1", tuple((k, frame_of(k)) for k in range(3))))
    # Stored before the follow starts: a follow that finds no response ends at once, and a
    # loaded writer may not have committed the first batch yet.
    await store.flush()  # type: ignore[attr-defined]

    async def read() -> StoredResponse | None:
        return await reader.response("r1")

    got: list[int] = []

    async def owner() -> None:  # the other proxy, storing as it runs
        for k in range(3, 6):
            await asyncio.sleep(0.02)
            submit(ResponseEvents("r1", ((k, frame_of(k)),)))
        submit(
            ResponseSaved(
                StoredResponse(
                    "r1",
                    {**running("r1").response, "status": "completed"},
                    [],
                    None,
                    1.0,
                    credential="alice",
                )
            )
        )

    running_owner = asyncio.create_task(owner())
    async for data in follow("r1", 1, read=read, reader=reader, poll=0.005):
        got.append(sequence_number(data))
    await running_owner
    assert got == [2, 3, 4, 5]


async def test_a_follower_stops_when_its_client_has_left(store: object) -> None:
    reader = reader_of(store)
    store.submit(ResponseSaved(running("r1")))  # type: ignore[attr-defined]
    left = [False]
    polls = 0

    async def read() -> StoredResponse | None:
        nonlocal polls
        polls += 1
        left[0] = polls >= 3  # never ends by itself: the client leaves after two rounds
        return await reader.response("r1")

    frames = [
        f
        async for f in follow("r1", -1, read=read, reader=reader, gone=lambda: left[0], poll=0.001)
    ]
    assert frames == [] and polls == 3
