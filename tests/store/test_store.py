"""The store: usage reads, the non-blocking write queue, SQLite durability and sharing."""

from __future__ import annotations

import asyncio
import logging
import signal
import sqlite3
import stat
import subprocess
import sys
import threading
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from llmitm.exchange.usage import UsageRecord
from llmitm.store import (
    MIGRATIONS,
    Migration,
    SchemaTooNew,
    SqliteStore,
    Store,
    UsageRow,
)
from tests.store.backends import Backend, Note

T0 = datetime(2025, 3, 1, 23, 0, tzinfo=UTC)


def usage(i: int, *, at: datetime = T0, endpoint: str = "e", model: str = "m", route: str = "r"):
    return UsageRecord(at, endpoint, model, route, input_tokens=i, output_tokens=2 * i)


def count(path: Path, table: str = "usage") -> int:
    with sqlite3.connect(path) as db:
        return db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


async def test_usage_rows_grouped_with_since(backend: Backend) -> None:
    day2 = T0 + timedelta(hours=2)  # 01:00 on 2 March, UTC
    async with backend.store() as store:
        store.submit(usage(1, endpoint="azure-eu", model="gpt-5", route="main"))
        store.submit(usage(2, endpoint="azure-eu", model="gpt-4o", route="main"))
        store.submit(usage(4, at=day2, endpoint="openai", model="gpt-5", route="fallback"))
        # A naive time counts as UTC: 2 March too.
        store.submit(usage(8, at=day2.replace(tzinfo=None), endpoint="local", model="gemma"))
        await store.flush()

        by_endpoint = await store.usage_rows(None, "endpoint")
        assert by_endpoint == [
            UsageRow("azure-eu", 2, 3, 0, 6, 0),
            UsageRow("local", 1, 8, 0, 16, 0),
            UsageRow("openai", 1, 4, 0, 8, 0),
        ]
        by_model = {r.key: r.input_tokens for r in await store.usage_rows(None, "model")}
        assert by_model == {"gemma": 8, "gpt-4o": 2, "gpt-5": 5}
        by_day = {r.key: r.requests for r in await store.usage_rows(None, "day")}
        assert by_day == {"2025-03-01": 2, "2025-03-02": 2}
        by_route = {r.key: r.output_tokens for r in await store.usage_rows(None, "route")}
        assert by_route == {"fallback": 8, "main": 6, "r": 16}

        since = await store.usage_rows(datetime(2025, 3, 2, tzinfo=UTC), "endpoint")
        assert [(r.key, r.requests) for r in since] == [("local", 1), ("openai", 1)]
        with pytest.raises(ValueError, match="group_by"):
            await store.usage_rows(None, "user")  # type: ignore[arg-type]


async def test_all_fields_round_trip(backend: Backend) -> None:
    record = UsageRecord(T0, "e", "m", "r", 10, 4, 7, 3)
    async with backend.store() as store:
        store.submit(record)
        await store.flush()
        assert await store.usage_rows(None, "model") == [UsageRow("m", 1, 10, 4, 7, 3)]


async def test_file_is_private_in_wal_mode_with_migrations_applied(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "s.db"
    async with SqliteStore(path) as store:
        assert store.schema_version == len(MIGRATIONS)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)


async def test_batches_drain_up_to_batch_size_per_transaction(backend: Backend) -> None:
    async with backend.store(batch_size=50) as store:
        for i in range(120):
            store.submit(usage(i))
        assert store.stats().queued == 120  # submit only queues
        await store.flush()
        stats = store.stats()
        assert (stats.submitted, stats.written, stats.batches, stats.queued) == (120, 120, 3, 0)
        assert backend.count() == 120


@pytest.mark.timing
async def test_flush_waits_for_a_locked_database_and_submit_does_not(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    async with SqliteStore(path) as store:
        # Another process holds the write lock: the writer waits (busy_timeout) ...
        blocker = sqlite3.connect(path, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        try:
            started = time.perf_counter()
            for i in range(1000):
                store.submit(usage(i))
            elapsed = time.perf_counter() - started
            await asyncio.sleep(0.2)  # the writer is now waiting in BEGIN IMMEDIATE
            started = time.perf_counter()
            store.submit(usage(1000))
            elapsed += time.perf_counter() - started
            assert elapsed < 0.1  # ... but submit never does
            assert count(path) == 0
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        await store.flush()
        assert count(path) == 1001


async def test_a_lock_held_too_long_loses_one_batch_not_the_writer(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "s.db"
    async with SqliteStore(path, busy_timeout=0.02, lock_attempts=2) as store:
        blocker = sqlite3.connect(path, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        try:
            store.submit(usage(1))
            await store.flush()  # settles: given up after two waits, counted, logged
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        store.submit(usage(2))
        await store.flush()
        stats = store.stats()
        assert (stats.written, stats.failed) == (1, 1)
    assert any("lost a batch of 1 write(s) ['usage']" in r.getMessage() for r in caplog.records)
    assert count(path) == 1


async def test_close_persists_everything_submitted(backend: Backend) -> None:
    store = backend.store(batch_size=7)
    await store.open()
    for i in range(200):
        store.submit(usage(i))
    await store.close()
    assert backend.count() == 200
    store.submit(usage(1))  # after close: dropped and counted, never raised
    assert store.stats().dropped == 1


async def test_full_queue_drops_with_one_counted_warning(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="llmitm.store")
    async with backend.store(max_queue=5) as store:
        for i in range(12):
            store.submit(usage(i))
        stats = store.stats()
        assert (stats.submitted, stats.dropped, stats.queued) == (5, 7, 5)
        await store.flush()
        assert store.stats().written == 5
    warnings = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert len(warnings) == 1  # rate-limited: the first drop reports, the rest are counted
    assert "queue is full (5)" in warnings[0]
    assert "'usage'" in warnings[0]


async def test_failing_write_is_logged_and_the_writer_goes_on(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    async with backend.note_store() as store:
        for text in ("one", "bad", "two"):  # one batch, one run: only "bad" is lost
            store.submit(Note(text))
        store.submit(usage(1))
        await store.flush()
        store.submit(Note("three"))
        await store.flush()
        stats = store.stats()
        assert (stats.written, stats.failed) == (4, 1)
    assert backend.query("SELECT text FROM notes") == [("one",), ("two",), ("three",)]
    (failure,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "'note' write failed" in failure.getMessage()
    assert "check constraint" in failure.getMessage().lower()


async def test_unknown_write_kind_is_refused_at_submit(backend: Backend) -> None:
    async with backend.store() as store:
        with pytest.raises(TypeError, match="Note"):
            store.submit(Note("x"))


async def test_migrations_run_once_and_set_the_schema_version(backend: Backend) -> None:
    latest = len(backend.migrations) + 2
    seed = Migration(latest, "seed", ("INSERT INTO notes (text) VALUES ('seeded')",))
    steps = (*backend.migrations, backend.notes_step(), seed)
    for _ in range(2):
        async with backend.store(migrations=steps) as store:
            assert store.schema_version == latest  # type: ignore[attr-defined]
    assert backend.count("notes") == 1
    assert backend.schema_version() == latest
    with pytest.raises(SchemaTooNew, match=f"schema version {latest}"):
        await backend.store().open()  # an older llmitm must not touch a newer database
    with pytest.raises(SchemaTooNew, match=f"schema version {latest}"):
        await backend.store(read_only=True).open()  # nor read it
    with pytest.raises(ValueError, match=f"version {latest + 3}"):
        await backend.store(
            "t", migrations=(*backend.migrations, replace(seed, version=latest + 3))
        ).open()


async def test_submit_from_other_threads(backend: Backend) -> None:
    async with backend.store() as store:

        def work(n: int) -> None:
            for i in range(250):
                store.submit(usage(i, endpoint=f"thread{n}"))

        threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
        for thread in threads:
            thread.start()
        await asyncio.gather(*(asyncio.to_thread(thread.join) for thread in threads))
        await store.flush()
        rows = await store.usage_rows(None, "endpoint")
        assert [(r.key, r.requests) for r in rows] == [(f"thread{n}", 250) for n in range(4)]


async def test_two_stores_share_one_database(backend: Backend) -> None:
    # Two processes' worth of store on one new database: opening at once migrates once,
    # and small batches make their transactions interleave.
    a, b = backend.store(batch_size=5), backend.store(batch_size=5)
    await asyncio.gather(a.open(), b.open())
    try:

        async def write(store: Store, endpoint: str) -> None:
            for i in range(300):
                store.submit(usage(i, endpoint=endpoint))
                if i % 10 == 0:
                    await asyncio.sleep(0)
            await store.flush()

        await asyncio.gather(write(a, "a"), write(b, "b"))
        for store in (a, b):  # each sees the other's writes
            rows = await store.usage_rows(None, "endpoint")
            assert [(r.key, r.requests, r.input_tokens) for r in rows] == [
                ("a", 300, sum(range(300))),
                ("b", 300, sum(range(300))),
            ]
        assert a.stats().failed == b.stats().failed == 0
    finally:
        await asyncio.gather(a.close(), b.close())


# Writes numbered usage rows as fast as it can, each row's fields derived from its number
# and a large model name so transactions take a while; says "ready" after the first commit.
WRITER = """
import asyncio, sys
from datetime import UTC, datetime
from llmitm.exchange.usage import UsageRecord
from llmitm.store import SqliteStore

async def main():
    store = SqliteStore(sys.argv[1], batch_size=20)
    await store.open()
    i = 0
    while True:
        for _ in range(20):
            model = f"m{i}-" + "x" * 4000
            store.submit(UsageRecord(datetime.now(UTC), f"e{i}", model, "r", i, i % 7, 2 * i, 3))
            i += 1
        if i == 20:
            await store.flush()
            print("ready", flush=True)
        # Keep the queue short, as a proxy's traffic would: a drop would leave a gap.
        while store.stats().queued > 100:
            await asyncio.sleep(0.001)

asyncio.run(main())
"""


async def test_sigkill_mid_write_leaves_a_whole_database(tmp_path: Path) -> None:
    path = tmp_path / "killed.db"
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(child.stdout.readline), 20)
        assert line.strip() == "ready"
        await asyncio.sleep(0.4)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        if child.stdout is not None:
            child.stdout.close()
    assert child.returncode == -signal.SIGKILL

    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        rows = db.execute(
            "SELECT input_tokens, endpoint, model, cached_tokens, output_tokens,"
            " reasoning_tokens FROM usage ORDER BY id"
        ).fetchall()
    assert len(rows) >= 20
    # Batches commit in order, so what survived is exactly the first n writes, each whole.
    for n, (i, endpoint, model, cached, output, reasoning) in enumerate(rows):
        assert (i, endpoint, cached, output, reasoning) == (n, f"e{n}", n % 7, 2 * n, 3)
        assert model == f"m{n}-" + "x" * 4000
    async with SqliteStore(path) as store:  # and llmitm opens it again and goes on
        store.submit(usage(1))
        await store.flush()
    assert count(path) == len(rows) + 1


async def test_a_later_step_upgrades_a_database_and_keeps_what_it_held(
    backend: Backend,
) -> None:
    async with backend.store() as store:
        store.submit(usage(3))
    async with backend.note_store() as store:  # a later llmitm: one step more
        assert store.schema_version == len(backend.migrations) + 1  # type: ignore[attr-defined]
        store.submit(Note("after"))
        await store.flush()
        assert [r.input_tokens for r in await store.usage_rows()] == [3]
    assert backend.schema_version() == len(backend.migrations) + 1
    assert backend.query("SELECT text FROM notes") == [("after",)]
