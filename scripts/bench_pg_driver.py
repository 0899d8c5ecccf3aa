"""Which PostgreSQL driver for the store: asyncpg or psycopg 3 (async), measured on the work
llmitm gives a database, against a real local server started for the run.

Three workloads, each timed as the client process's CPU (what the proxy pays: the driver
runs on the proxy's event loop) and wall time, median of ``--runs``:

- ``batch``: the writer's shape, one transaction of 64 inserted rows (a usage row each, with
  a 2 KiB bytea value, as a recording's chunk) — 200 transactions;
- ``point``: a fleet decision's shape, one short ``UPDATE … RETURNING`` on a counter row —
  2 000 statements, one at a time, as the router takes a slot;
- ``read``: a stored response's shape, one ``SELECT`` by primary key of a 16 KiB value —
  2 000 reads.

    python scripts/bench_pg_driver.py --runs 5

Needs Debian's PostgreSQL server (``make postgresql``) and both drivers installed
(``pip install asyncpg 'psycopg[binary]'``); only the chosen one is a dependency of llmitm.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.helpers.postgres import postgres_server

SCHEMA = [
    "DROP TABLE IF EXISTS rows_",
    "DROP TABLE IF EXISTS counters",
    "DROP TABLE IF EXISTS values_",
    "CREATE TABLE rows_ (id bigserial PRIMARY KEY, endpoint text, model text, "
    "input_tokens int, output_tokens int, body bytea)",
    "CREATE TABLE counters (key text PRIMARY KEY, n int NOT NULL)",
    "CREATE TABLE values_ (id text PRIMARY KEY, body bytea NOT NULL)",
    "INSERT INTO counters VALUES ('endpoint-a', 0)",
]
BATCHES, BATCH_ROWS, POINTS, READS = 200, 64, 2000, 2000
BODY, VALUE = os.urandom(2048), os.urandom(16384)
ROW = ("endpoint-a", "gpt-5", 1200, 300, BODY)


async def asyncpg_runs(dsn: str) -> dict[str, Callable[[], Awaitable[None]]]:
    import asyncpg

    conn = await asyncpg.connect(dsn)
    for statement in SCHEMA:
        await conn.execute(statement)
    await conn.executemany(
        "INSERT INTO values_ VALUES ($1, $2)", [(f"v{i}", VALUE) for i in range(100)]
    )
    insert = (
        "INSERT INTO rows_ (endpoint, model, input_tokens, output_tokens, body) "
        "VALUES ($1, $2, $3, $4, $5)"
    )

    async def batch() -> None:
        for _ in range(BATCHES):
            async with conn.transaction():
                await conn.executemany(insert, [ROW] * BATCH_ROWS)

    async def point() -> None:
        for _ in range(POINTS):
            await conn.fetchval(
                "UPDATE counters SET n = n + 1 WHERE key = $1 RETURNING n", "endpoint-a"
            )

    async def read() -> None:
        for i in range(READS):
            await conn.fetchval("SELECT body FROM values_ WHERE id = $1", f"v{i % 100}")

    return {"batch": batch, "point": point, "read": read}


async def psycopg_runs(dsn: str) -> dict[str, Callable[[], Awaitable[None]]]:
    import psycopg

    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    async with conn.cursor() as cur:
        for statement in SCHEMA:
            await cur.execute(statement)
        await cur.executemany(
            "INSERT INTO values_ VALUES (%s, %s)", [(f"v{i}", VALUE) for i in range(100)]
        )
    insert = (
        "INSERT INTO rows_ (endpoint, model, input_tokens, output_tokens, body) "
        "VALUES (%s, %s, %s, %s, %s)"
    )

    async def batch() -> None:
        for _ in range(BATCHES):
            async with conn.transaction(), conn.cursor() as cur:
                await cur.executemany(insert, [ROW] * BATCH_ROWS)

    async def point() -> None:
        async with conn.cursor() as cur:
            for _ in range(POINTS):
                await cur.execute(
                    "UPDATE counters SET n = n + 1 WHERE key = %s RETURNING n", ("endpoint-a",)
                )
                await cur.fetchone()

    async def read() -> None:
        async with conn.cursor(binary=True) as cur:
            for i in range(READS):
                await cur.execute("SELECT body FROM values_ WHERE id = %s", (f"v{i % 100}",))
                await cur.fetchone()

    return {"batch": batch, "point": point, "read": read}


async def measure(dsn: str, runs: int) -> dict[str, dict[str, tuple[float, float]]]:
    results: dict[str, dict[str, tuple[float, float]]] = {}
    for driver, make in (("asyncpg", asyncpg_runs), ("psycopg", psycopg_runs)):
        workloads = await make(dsn)
        results[driver] = {}
        for name, work in workloads.items():
            cpu, wall = [], []
            for _ in range(runs):
                c0, w0 = time.process_time(), time.perf_counter()
                await work()
                cpu.append(time.process_time() - c0)
                wall.append(time.perf_counter() - w0)
            results[driver][name] = (statistics.median(cpu), statistics.median(wall))
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with postgres_server(durable=True) as server:
        os.environ.update(server.env())
        results = asyncio.run(measure(server.create_database(), args.runs))
    print(f"{'workload':<8} {'driver':<8} {'client CPU ms':>14} {'wall ms':>10}")
    for name in ("batch", "point", "read"):
        for driver in ("asyncpg", "psycopg"):
            cpu, wall = results[driver][name]
            print(f"{name:<8} {driver:<8} {cpu * 1000:>14.1f} {wall * 1000:>10.1f}")
        ratio = results["psycopg"][name][0] / results["asyncpg"][name][0]
        print(f"{'':<8} psycopg / asyncpg client CPU: {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
