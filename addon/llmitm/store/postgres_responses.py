"""Responses state in PostgreSQL: how the writes of ``responses_api.records`` are applied and
its reads answered (``store.sqlite_responses`` is the SQLite twin and describes the layout:
the Response object and the input items as chunks, input items found by 64-bit id keys).

The rows are built by the SQLite module's functions (they know no database); the SQL is
PostgreSQL's. A response saved again (each status change) takes its own row's lock first
(``FOR UPDATE`` in the replaced-chunks query), so two proxies saving one response do not
release its old chunks twice.

Schema step 2 adds what proxies sharing the database tell each other (``response_pending``,
``response_runs``; SQLite's step 9). Every time in them is the writing proxy's clock, as in
SQLite, never the database's: a heartbeat is compared with the reading proxy's ``now``, so
proxies on several hosts need synchronised clocks (NTP); a skew of ``s`` seconds makes a
lease look ``s`` seconds older or younger to the other proxy. The conditional writes hold
under concurrent proxies without a table lock: a cancel request is one ``UPDATE``; a stale
run is ended by one ``DELETE … WHERE heartbeat_at < $2 RETURNING`` of its lease, which takes
the row's lock and re-checks the condition on the newest row version, so an owner's
heartbeat committed first keeps the run alive, one after it updates nothing, and of two
readers (or a reader and the owner's ``RunEnded``) exactly one removes the lease and writes.
Every write to a lease first takes its response's advisory lock (``_lock_runs``), the lock a
save takes, so a batch that saves a response and touches its lease, in either order, queues
behind another proxy's instead of deadlocking with it.
"""

from __future__ import annotations

import os
import time
import weakref
from collections.abc import Sequence
from typing import Any

import asyncpg
import orjson

from llmitm.responses_api.records import (
    PENDING_MAX_AGE,
    PendingResponse,
    ResponseDeleted,
    ResponseEvents,
    ResponseOwned,
    ResponseOwner,
    ResponsePending,
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
from llmitm.store import postgres_content
from llmitm.store.content_chunks import cut
from llmitm.store.input_index import InputIndex, index_of
from llmitm.store.response_rows import (
    LEASE_COLUMNS,
    SEAL_KEY_NAME,
    chunk_names,
    id_key,
    item_in,
    lease_of,
    records_of,
    saved_rows,
    saved_weight,
    serialised,
)

_COLUMNS = (
    "id, response, input_items, previous_response_id, created_at, expires_at, credential, "
    "input_chunk, response_chunk"
)
_R_COLUMNS = ", ".join(f"r.{c.strip()}" for c in _COLUMNS.split(","))
# ``$n::text IS NULL OR credential = $n``: NULL asks for anyone's rows.
_LIVE = "(expires_at IS NULL OR expires_at > $2)"
_OWNED = "($3::text IS NULL OR credential = $3)"


# Writer connections known to see schema step 2's tables (once there, they stay).
_ACROSS_PROXIES: weakref.WeakSet[asyncpg.Connection] = weakref.WeakSet()


async def _across_proxies(db: asyncpg.Connection) -> bool:
    """Whether the database has step 2's tables: a store opened with fewer steps (an older
    database kept at its version, in tests) saves and deletes without them."""
    if db in _ACROSS_PROXIES:
        return True
    if await db.fetchval("SELECT to_regclass('response_runs') IS NOT NULL"):
        _ACROSS_PROXIES.add(db)
        return True
    return False


async def apply_saved(db: asyncpg.Connection, writes: Sequence[ResponseSaved]) -> None:
    with index_of(db).writing() as index:
        await _save(db, writes, index)


async def _save(db: asyncpg.Connection, writes: Sequence[ResponseSaved], index: InputIndex) -> None:
    # A response saved twice in one batch: the last save wins, as across batches.
    writes = list({w.record.id: w for w in writes}.values())
    store = postgres_content.content_of(db)
    ids = [w.record.id for w in writes]
    await postgres_content.lock_owners(db, "response:", ids)
    values = [serialised(w.record, True) for w in writes]
    while True:
        puts = store.session()
        rows, item_rows, input_keys = await cut(
            saved_weight(values, puts), saved_rows, writes, values, puts, index
        )
        # The chunks the last save of these responses held, their rows locked.
        puts.replacing(
            "SELECT c FROM (SELECT input_chunk, response_chunk FROM responses "
            "WHERE id = ANY($1::text[]) ORDER BY id FOR UPDATE) AS r, "
            "unnest(ARRAY[r.input_chunk, r.response_chunk]) AS c",
            (ids,),
        )
        if await puts.commit(db):
            break
    if puts.replaced:
        await db.execute(
            "DELETE FROM response_input_ids WHERE response_key = ANY($1::bigint[])",
            [id_key(i) for i in ids],
        )
        await db.execute("DELETE FROM response_items WHERE response_id = ANY($1::text[])", ids)
    if item_rows:
        await db.executemany(
            "INSERT INTO response_items (item_id, response_id, item) VALUES ($1, $2, $3) "
            "ON CONFLICT (item_id, response_id) DO UPDATE SET item = EXCLUDED.item",
            item_rows,
        )
    if input_keys:
        await db.executemany(
            "INSERT INTO response_input_ids (item_key, response_key) VALUES ($1, $2) "
            "ON CONFLICT DO NOTHING",
            sorted(set(input_keys)),
        )
    await db.executemany(
        f"INSERT INTO responses ({_COLUMNS}, id_key) "
        "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) ON CONFLICT (id) DO UPDATE SET "
        "response = EXCLUDED.response, input_items = EXCLUDED.input_items, "
        "previous_response_id = EXCLUDED.previous_response_id, "
        "created_at = EXCLUDED.created_at, expires_at = EXCLUDED.expires_at, "
        "credential = EXCLUDED.credential, input_chunk = EXCLUDED.input_chunk, "
        "response_chunk = EXCLUDED.response_chunk, id_key = EXCLUDED.id_key",
        rows,
    )
    if any(puts.replaced):
        await store.release(db, puts.replaced)
    if await _across_proxies(db):
        await db.execute("DELETE FROM response_pending WHERE id = ANY($1::text[])", ids)


async def _delete(db: asyncpg.Connection, ids: list[str]) -> None:
    """Delete the responses ``ids`` with everything they own (not their run leases, which
    their owners still read), releasing their chunks. Only
    the rows locked here give up chunks and go: a save of the same id by another proxy
    waits for this (or this for it) on the id's lock, so none is deleted unreleased."""
    if not ids:
        return
    index_of(db).clear()  # a response gone may have held a resent item's index row
    await postgres_content.lock_owners(db, "response:", ids)
    rows = await db.fetch(
        "SELECT id, input_chunk, response_chunk FROM responses WHERE id = ANY($1::text[]) "
        "ORDER BY id FOR UPDATE",
        ids,
    )
    found = [row[0] for row in rows]
    await postgres_content.content_of(db).release(db, [n for row in rows for n in row[1:]])
    await db.execute(
        "DELETE FROM response_input_ids WHERE response_key = ANY($1::bigint[])",
        [id_key(i) for i in found],
    )
    await db.execute("DELETE FROM responses WHERE id = ANY($1::text[])", found)
    for table, column in (
        ("response_items", "response_id"),
        ("response_events", "response_id"),
        ("response_owners", "id"),
    ):
        await db.execute(f"DELETE FROM {table} WHERE {column} = ANY($1::text[])", ids)
    if await _across_proxies(db):
        await db.execute("DELETE FROM response_pending WHERE id = ANY($1::text[])", ids)


async def apply_deleted(db: asyncpg.Connection, writes: Sequence[ResponseDeleted]) -> None:
    await _delete(db, list(dict.fromkeys(w.id for w in writes)))


async def apply_events(db: asyncpg.Connection, writes: Sequence[ResponseEvents]) -> None:
    await db.executemany(
        "INSERT INTO response_events (response_id, seq, event) VALUES ($1, $2, $3) "
        "ON CONFLICT DO NOTHING",
        [(w.response_id, seq, event) for w in writes for seq, event in w.events],
    )


async def apply_owned(db: asyncpg.Connection, writes: Sequence[ResponseOwned]) -> None:
    await db.executemany(
        "INSERT INTO response_owners (id, endpoint, created_at, expires_at, credential) "
        "VALUES ($1, $2, $3, $4, $5) ON CONFLICT (id) DO UPDATE SET "
        "endpoint = EXCLUDED.endpoint, created_at = EXCLUDED.created_at, "
        "expires_at = EXCLUDED.expires_at, credential = EXCLUDED.credential",
        [
            (o.id, o.endpoint, o.created_at, o.expires_at, o.credential)
            for o in (w.owner for w in writes)
        ],
    )


async def apply_purged(db: asyncpg.Connection, writes: Sequence[ResponsesPurged]) -> None:
    now = max(w.now for w in writes)
    expired = await db.fetch("SELECT id FROM responses WHERE expires_at <= $1 ORDER BY id", now)
    await _delete(db, [row[0] for row in expired])
    await db.execute("DELETE FROM response_owners WHERE expires_at <= $1", now)
    if not await _across_proxies(db):
        return
    old = now - PENDING_MAX_AGE
    await db.execute("DELETE FROM response_pending WHERE created_at < $1", old)
    await db.execute("DELETE FROM response_runs WHERE heartbeat_at < $1", old)


# -- across proxies: pending marks and background run leases (schema step 2) ----------------


async def apply_pending(db: asyncpg.Connection, writes: Sequence[ResponsePending]) -> None:
    await db.executemany(
        "INSERT INTO response_pending (id, created_at, credential) VALUES ($1, $2, $3) "
        "ON CONFLICT (id) DO UPDATE SET "
        "created_at = EXCLUDED.created_at, credential = EXCLUDED.credential",
        [(w.pending.id, w.pending.created_at, w.pending.credential) for w in writes],
    )


async def _lock_runs(db: asyncpg.Connection, ids: Sequence[str]) -> None:
    """The advisory locks of responses ``ids`` (those ``apply_saved`` takes), before their
    leases' row locks: one order everywhere."""
    await postgres_content.lock_owners(db, "response:", ids)


async def apply_run_started(db: asyncpg.Connection, writes: Sequence[RunStarted]) -> None:
    await _lock_runs(db, [w.lease.response_id for w in writes])
    await db.executemany(
        "INSERT INTO response_runs (response_id, owner, heartbeat_at, cancel_requested_at, "
        "delete_requested) VALUES ($1, $2, $3, NULL, FALSE) ON CONFLICT (response_id) DO UPDATE "
        "SET owner = EXCLUDED.owner, heartbeat_at = EXCLUDED.heartbeat_at, "
        "cancel_requested_at = NULL, delete_requested = FALSE",
        [(w.lease.response_id, w.lease.owner, w.lease.heartbeat_at) for w in writes],
    )


async def apply_heartbeat(db: asyncpg.Connection, writes: Sequence[RunsHeartbeat]) -> None:
    # Only the owner's leases: one another proxy ended (and removed) stays ended.
    await _lock_runs(db, [rid for w in writes for rid in w.response_ids])
    await db.executemany(
        "UPDATE response_runs SET heartbeat_at = $1 "
        "WHERE response_id = ANY($2::text[]) AND owner = $3",
        [(w.at, list(w.response_ids), w.owner) for w in writes],
    )


async def apply_cancel_requested(
    db: asyncpg.Connection, writes: Sequence[RunCancelRequested]
) -> None:
    # One statement per request: two proxies asking at once keep the first time, and a
    # delete asked by either sticks.
    await _lock_runs(db, [w.response_id for w in writes])
    await db.executemany(
        "UPDATE response_runs SET cancel_requested_at = COALESCE(cancel_requested_at, $1), "
        "delete_requested = delete_requested OR $2 WHERE response_id = $3",
        [(w.at, w.delete, w.response_id) for w in writes],
    )


async def apply_run_ended(db: asyncpg.Connection, writes: Sequence[RunEnded]) -> None:
    ids = list(dict.fromkeys(w.response_id for w in writes))
    await _lock_runs(db, ids)
    rows = await db.fetch(
        "DELETE FROM response_runs WHERE response_id = ANY($1::text[]) "
        "RETURNING response_id, delete_requested",
        ids,
    )
    # Deleted while it ran: the owner's last save must not bring it back.
    await _delete(db, sorted(row[0] for row in rows if row[1]))


async def apply_stale_ended(db: asyncpg.Connection, writes: Sequence[StaleRunEnded]) -> None:
    for w in writes:
        await _lock_runs(db, [w.record.id])
        ended = await db.fetchrow(
            "DELETE FROM response_runs WHERE response_id = $1 AND heartbeat_at < $2 "
            "RETURNING delete_requested",
            w.record.id,
            w.stale_before,
        )
        if ended is None:  # renewed in time, or ended by its owner or another reader
            continue
        await apply_saved(db, [ResponseSaved(w.record)])
        await apply_events(db, [ResponseEvents(w.record.id, w.events)])
        if ended[0]:
            await _delete(db, [w.record.id])


async def _records(db: asyncpg.Connection, rows: Sequence[Sequence[Any]]) -> list[StoredResponse]:
    names = chunk_names(rows)
    values = iter(await postgres_content.read(db, names, {})) if names else iter(())
    return records_of(rows, values)


async def read_response(
    db: asyncpg.Connection, response_id: str, credential: str | None
) -> StoredResponse | None:
    row = await db.fetchrow(
        f"SELECT {_COLUMNS} FROM responses WHERE id = $1 AND {_LIVE} AND {_OWNED}",
        response_id,
        time.time(),
        credential,
    )
    return (await _records(db, [row]))[0] if row else None


async def read_chain(
    db: asyncpg.Connection, response_id: str, max_depth: int, credential: str | None
) -> list[StoredResponse]:
    # Walk up previous_response_id; depth orders the result and bounds a (corrupt) cycle.
    # An ancestor that is not the credential's is left out, which breaks the chain there.
    sql = f"""
        WITH RECURSIVE chain(id, depth) AS (
            SELECT id, 0 FROM responses WHERE id = $1 AND {_LIVE} AND {_OWNED}
            UNION ALL
            SELECT r.previous_response_id, chain.depth + 1
            FROM responses AS r JOIN chain ON r.id = chain.id
            WHERE r.previous_response_id IS NOT NULL AND chain.depth < $4
        )
        SELECT {_R_COLUMNS}
        FROM chain JOIN responses AS r ON r.id = chain.id
        WHERE (r.expires_at IS NULL OR r.expires_at > $2)
            AND ($3::text IS NULL OR r.credential = $3)
        ORDER BY chain.depth DESC
    """
    rows = await db.fetch(sql, response_id, time.time(), credential, max_depth)
    records = await _records(db, rows)
    # A deleted ancestor ends the chain: keep only the unbroken run ending at response_id.
    unbroken: list[StoredResponse] = []
    for record in reversed(records):
        if unbroken and unbroken[-1].previous_response_id != record.id:
            break
        unbroken.append(record)
    return unbroken[::-1]


async def read_items(
    db: asyncpg.Connection, item_ids: Sequence[str], credential: str | None
) -> dict[str, dict]:
    found: dict[str, dict] = {}
    for item_id in dict.fromkeys(item_ids):
        # The newest of: the item's response_items row (an output item: read from its
        # response), the newest response whose input has it (by key, confirmed by id).
        now = time.time()
        row = await db.fetchrow(
            "SELECT i.item, i.response_id, r.created_at FROM response_items AS i "
            "JOIN responses AS r ON r.id = i.response_id "
            "WHERE i.item_id = $1 AND (r.expires_at IS NULL OR r.expires_at > $2) "
            "AND ($3::text IS NULL OR r.credential = $3) ORDER BY r.created_at DESC LIMIT 1",
            item_id,
            now,
            credential,
        )
        best: tuple[float, dict[str, Any]] | None = None
        if row and row[0]:
            best = (row[2], orjson.loads(row[0]))
        elif row:
            best = await _item_of(db, row[1], row[2], item_id, credential)
        candidates = await db.fetch(
            "SELECT r.id, r.created_at FROM response_input_ids AS x "
            "JOIN responses AS r ON r.id_key = x.response_key "
            "WHERE x.item_key = $1 AND (r.expires_at IS NULL OR r.expires_at > $2) "
            "AND ($3::text IS NULL OR r.credential = $3) ORDER BY r.created_at DESC",
            id_key(item_id),
            now,
            credential,
        )
        for response_id, created_at in candidates:
            if best is not None and best[0] >= created_at:
                break
            hit = await _item_of(db, response_id, created_at, item_id, credential)
            if hit is not None:  # else a key shared by chance: try an older one
                best = hit
                break
        if best is None:
            best = await _resent_in(db, item_id, now, credential)
        if best is not None:
            found[item_id] = best[1]
    return found


async def _resent_in(
    db: asyncpg.Connection, item_id: str, now: float, credential: str | None
) -> tuple[float, dict[str, Any]] | None:
    """The item from the newest response whose input names it, looked for in the ids
    themselves: the response its index row named is gone, and later ones resent it without
    a row of their own (``store.input_index``). Only when no row led to it: a scan."""
    candidates = await db.fetch(
        "SELECT id, created_at FROM responses WHERE position($1::bytea IN input_items) > 0 "
        "AND (expires_at IS NULL OR expires_at > $2) "
        "AND ($3::text IS NULL OR credential = $3) ORDER BY created_at DESC",
        orjson.dumps(item_id),
        now,
        credential,
    )
    for response_id, created_at in candidates:
        hit = await _item_of(db, response_id, created_at, item_id, credential)
        if hit is not None:
            return hit
    return None


async def _item_of(
    db: asyncpg.Connection,
    response_id: str,
    created_at: float,
    item_id: str,
    credential: str | None,
) -> tuple[float, dict[str, Any]] | None:
    item = item_in(await read_response(db, response_id, credential), item_id)
    return None if item is None else (created_at, item)


async def read_events(db: asyncpg.Connection, response_id: str, after: int) -> list[bytes]:
    rows = await db.fetch(
        "SELECT event FROM response_events WHERE response_id = $1 AND seq > $2 ORDER BY seq",
        response_id,
        after,
    )
    return [bytes(row[0]) for row in rows]


async def read_owner(db: asyncpg.Connection, response_id: str) -> ResponseOwner | None:
    row = await db.fetchrow(
        "SELECT id, endpoint, created_at, expires_at, credential FROM response_owners "
        "WHERE id = $1 AND (expires_at IS NULL OR expires_at > $2)",
        response_id,
        time.time(),
    )
    if row is None:
        return None
    return ResponseOwner(str(row[0]), str(row[1]), float(row[2]), row[3], row[4])


async def read_pending(db: asyncpg.Connection, response_id: str) -> PendingResponse | None:
    row = await db.fetchrow(
        "SELECT created_at, credential FROM response_pending WHERE id = $1 AND created_at >= $2",
        response_id,
        time.time() - PENDING_MAX_AGE,
    )
    return PendingResponse(response_id, float(row[0]), row[1]) if row else None


async def read_run_lease(db: asyncpg.Connection, response_id: str) -> RunLease | None:
    row = await db.fetchrow(
        f"SELECT {LEASE_COLUMNS} FROM response_runs WHERE response_id = $1", response_id
    )
    return lease_of(row) if row else None


async def read_owned_leases(db: asyncpg.Connection, owner: str) -> list[RunLease]:
    rows = await db.fetch(f"SELECT {LEASE_COLUMNS} FROM response_runs WHERE owner = $1", owner)
    return [lease_of(row) for row in rows]


async def read_secret(db: asyncpg.Connection, name: str) -> bytes | None:
    value = await db.fetchval("SELECT value FROM llmitm_secrets WHERE name = $1", name)
    return bytes(value) if value is not None else None


async def ensure_secrets(db: asyncpg.Connection, names: Sequence[str]) -> None:
    """Make each key once for every proxy on the database: the first insert wins, the
    others' random values are thrown away by ``ON CONFLICT DO NOTHING``, and everyone
    reads back the one that is stored."""
    await db.executemany(
        "INSERT INTO llmitm_secrets (name, value) VALUES ($1, $2) ON CONFLICT DO NOTHING",
        [(name, os.urandom(32)) for name in names],
    )


SECRET_NAMES = (SEAL_KEY_NAME, "credential-fingerprint")
