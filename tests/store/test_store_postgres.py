"""What only the PostgreSQL store has to get right: several proxies writing one database at
once (content chunk counts, the shared keys), a database that is unreachable at start or
goes away mid-run (answers never wait, writes queue up to the bound, losses are counted and
logged, the writer reconnects), and a password that never shows.

The database is the real server of ``tests/helpers/postgres.py``; outages are real too: the
store connects through a TCP relay the test can stop (refusing connections, cutting the
open ones) and start again, or the server ends the store's sessions itself."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from llmitm.exchange.usage import UsageRecord
from llmitm.responses_api.records import (
    PendingResponse,
    ResponseDeleted,
    ResponsePending,
    ResponseSaved,
    RunLease,
    RunStarted,
    StoredResponse,
)
from llmitm.store import store_for
from llmitm.store.location_url import display_location
from llmitm.store.postgres import PostgresStore, StoreUnreachable
from llmitm.store.postgres_migrations import MIGRATIONS as POSTGRES_MIGRATIONS
from llmitm.store.recordings import PruneRecordings, RecordingWrite
from tests.store.backends import Backend
from tests.store.test_store import T0, usage
from tests.store.test_store_content import Conversation, legs


class Relay:
    """A TCP relay from a local port to the database server that can go down and up."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def up(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def down(self) -> None:
        """Refuse new connections and cut the open ones, as a database host that fails."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()
        if server is not None:
            await server.wait_closed()  # returns once every relayed connection is closed

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        self._writers |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.transport.abort()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    def dsn(self, dsn: str) -> str:
        parts = urlsplit(dsn)
        user = parts.netloc.rpartition("@")[0]
        return urlunsplit(parts._replace(netloc=f"{user}@127.0.0.1:{self.port}"))


@pytest.fixture
def pg(pg_backend: Backend) -> Backend:
    return pg_backend


async def test_two_proxies_writing_the_same_content_keep_counts_right(pg: Backend) -> None:
    # Two stores on one database, as two proxies serving the same agent's conversation: the
    # same recordings (same bodies, same chunks) and Responses state from both, interleaved
    # in small batches, then one of them prunes while the other still records.
    conversation = Conversation(seed=12)
    turns = [conversation.next() for _ in range(16)]
    a, b = pg.store(batch_size=3), pg.store(batch_size=3)
    await asyncio.gather(a.open(), b.open())
    try:
        for index, (interaction, record) in enumerate(turns):
            for store in (a, b) if index % 2 else (b, a):
                store.submit(RecordingWrite(interaction))
                store.submit(ResponseSaved(record))
        await asyncio.gather(a.flush(), b.flush())
        assert await a.content_problems() == []
        assert [legs(i) for i in await b.load_recordings()] == [legs(i) for i, _ in turns]
        assert await a.response(turns[5][1].id) == turns[5][1]
        # One prunes and deletes while the other records the next turns.
        more = [conversation.next() for _ in range(6)]
        a.submit(PruneRecordings(before_us=9))
        for interaction, record in more:
            b.submit(RecordingWrite(interaction))
            b.submit(ResponseSaved(record))
            a.submit(ResponseDeleted(record.id))
        await asyncio.gather(a.flush(), b.flush())
        assert await b.content_problems() == []
        kept = [i.id for i, _ in turns[8:]] + [i.id for i, _ in more]
        assert [i.id for i in await a.recordings()] == kept
        assert a.stats().failed == b.stats().failed == 0
    finally:
        await asyncio.gather(a.close(), b.close())


async def test_the_shared_keys_are_made_once_for_every_proxy(pg: Backend) -> None:
    stores = [pg.store() for _ in range(4)]
    await asyncio.gather(*(store.open() for store in stores))  # first opens race
    try:
        seals = {await store.seal_key() for store in stores}  # type: ignore[attr-defined]
        fingerprints = {await store.fingerprint_key() for store in stores}
        assert len(seals) == len(fingerprints) == 1
        assert len(seals.pop() or b"") == 32
        assert pg.count("llmitm_secrets") == 2
    finally:
        await asyncio.gather(*(store.close() for store in stores))
    async with pg.store() as again:  # a restart keeps them: tokens stay valid
        assert await again.fingerprint_key() in fingerprints


async def test_an_unreachable_database_at_start_queues_then_catches_up(
    pg: Backend, postgres: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="llmitm.store")
    relay = Relay(postgres.port)
    await relay.up()
    await relay.down()  # the port is known and nothing listens: connections are refused
    dsn = relay.dsn(pg.location())
    with pytest.raises(StoreUnreachable, match="unreachable"):
        await PostgresStore(dsn).open()  # a command fails at once
    store = PostgresStore(
        dsn, max_queue=50, warn_interval=60, connect_timeout=2, retry_max=0.2, start_offline=True
    )
    await store.open()  # a proxy starts anyway
    try:
        for i in range(80):
            store.submit(usage(i))  # never blocks: 50 wait, 30 are dropped and counted
        stats = store.stats()
        assert (stats.submitted, stats.dropped) == (50, 30)
        with pytest.raises(StoreUnreachable, match="unreachable"):
            await store.usage_rows()  # a read says so rather than answering "nothing"
        await relay.up()  # the database comes back: the writer reconnects and catches up
        await store.flush()
        rows = await store.usage_rows()
        assert [(r.requests, r.input_tokens) for r in rows] == [(50, sum(range(50)))]
        assert store.stats().failed == 0
    finally:
        await store.close()
        await relay.down()
    messages = [r.getMessage() for r in caplog.records]
    assert any("unreachable" in m and "starting without it" in m for m in messages)
    assert [m for m in messages if "dropped 30" in m or "dropped 1 write" in m]
    assert any("connected to the database" in m for m in messages)


async def test_a_database_lost_mid_run_loses_nothing_queued_and_reconnects(
    pg: Backend, postgres: Any
) -> None:
    relay = Relay(postgres.port)
    await relay.up()
    store = PostgresStore(relay.dsn(pg.location()), connect_timeout=2, retry_max=0.2)
    await store.open()
    try:
        store.submit(usage(1, endpoint="before"))
        await store.flush()
        await relay.down()  # the database host fails: the writer's connection is cut
        for i in range(20):
            store.submit(usage(i, endpoint="during"))
        await asyncio.sleep(0.5)  # the writer tries, fails, waits, tries again
        during = store.stats()  # waiting, in the queue or in the writer's hands
        assert (during.written, during.failed, during.dropped) == (1, 0, 0)
        await relay.up()
        await store.flush()
        rows = await store.usage_rows()
        assert [(r.key, r.requests) for r in rows] == [("before", 1), ("during", 20)]
        # The server ends the session itself (a restart, an administrator): the same.
        postgres.psql(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            f"WHERE datname = '{pg.location().rsplit('/', 1)[1]}' AND pid <> pg_backend_pid()"
        )
        store.submit(usage(1, endpoint="after"))
        await store.flush()
        assert [r.key for r in await store.usage_rows()] == ["after", "before", "during"]
        assert store.stats().failed == store.stats().dropped == 0
    finally:
        await store.close()
        await relay.down()


async def test_close_gives_up_on_a_database_that_stays_away(pg: Backend, postgres: Any) -> None:
    relay = Relay(postgres.port)
    await relay.up()
    store = PostgresStore(
        relay.dsn(pg.location()), connect_timeout=1, retry_max=0.1, close_timeout=0.5
    )
    await store.open()
    await relay.down()
    for i in range(5):
        store.submit(usage(i))
    await asyncio.wait_for(store.close(), 10)  # bounded, not a hang
    stats = store.stats()
    assert (stats.written, stats.failed) == (0, 5)  # counted, never silent


async def test_the_password_never_shows(pg: Backend, caplog: pytest.LogCaptureFixture) -> None:
    dsn = pg.location()
    parts = urlsplit(dsn)
    with_password = urlunsplit(parts._replace(netloc=parts.netloc.replace("@", ":hunter2@")))
    store = store_for(with_password)
    assert "hunter2" not in store.location
    assert "hunter2" not in display_location(with_password + "?password=hunter2")
    caplog.set_level(logging.DEBUG)
    # A wrong password is refused at start (waiting does not mend it), and not repeated.
    with pytest.raises(Exception, match="password") as info:
        await store.open()
    assert "hunter2" not in str(info.value)
    assert "hunter2" not in caplog.text
    async with store_for(dsn) as right:  # the password from PGPASSWORD
        right.submit(UsageRecord(T0, "e", "m", "r"))
    assert "hunter2" not in caplog.text


async def test_read_only_over_a_database_no_llmitm_wrote(pg: Backend) -> None:
    async with store_for(pg.location(), read_only=True) as store:
        assert await store.usage_rows() == []
        assert await store.recordings() == []
        assert await store.fingerprint_key() is None
        with pytest.raises(RuntimeError, match="read-only"):
            store.submit(usage(1))
    assert pg.query("SELECT to_regclass('usage') IS NULL") == [("t",)]  # not migrated


async def test_a_database_made_by_schema_step_1_upgrades_to_pending_marks_and_leases(
    pg: Backend,
) -> None:
    record = StoredResponse("r1", {"id": "r1", "status": "completed"}, [], None, 1.0)
    async with PostgresStore(pg.location(), migrations=POSTGRES_MIGRATIONS[:1]) as old:
        old.submit(ResponseSaved(record))
    async with PostgresStore(pg.location(), read_only=True) as reader:
        assert await reader.pending("r1") is None  # no such table yet: nothing pending
        assert await reader.owned_leases("proxy-a") == []
    async with PostgresStore(pg.location()) as store:
        assert store.schema_version == len(POSTGRES_MIGRATIONS) == 2
        store.submit(ResponsePending(PendingResponse("r2", time.time(), None)))
        store.submit(RunStarted(RunLease("r2", "proxy-a", 100.0)))
        assert await store.response("r1") == record  # kept across the upgrade
        assert await store.pending("r2") is not None
        assert await store.run_lease("r2") == RunLease("r2", "proxy-a", 100.0)
    assert pg.schema_version() == 2
