"""Responses state in SQLite: how the writes of ``responses_api.records`` are applied and
its reads answered. Owns the SQL of the tables migration 2 creates (``responses``,
``response_events``, ``response_owners``, ``llmitm_secrets``), of the ``credential``
columns migration 6 adds to the first and third, and of migration 9's ``response_pending``
and ``response_runs`` (what proxies sharing the file tell each other); ``store.sqlite``
calls it.

Objects and item lists are stored as JSON blobs: the store never looks inside them, the
local Responses API (sans-IO) does. A chain is one recursive query over
``previous_response_id``.

From schema 8 on, the Response object and the input items are chunks of the shared chunk
table (``store.sqlite_content``, columns ``response_chunk`` and ``input_chunk``): a client
that resends its history each turn stores what the turn adds. Input items are kept without
their ids (a resent item's id may differ from turn to turn, and would break the sharing); the
ids go in ``input_items`` as a JSON list (``null`` for an item whose first key is not its id,
kept whole). An output item's ``response_items`` row holds an empty ``item`` (it is read
from its response); input items are found through ``response_input_ids``, 64-bit keys of
item and response ids, one row where an item first came with its bytes
(``store.input_index``), and else in the responses' id lists.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import aiosqlite
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
from llmitm.store import sqlite_content
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

_COLUMNS = "id, response, input_items, previous_response_id, created_at, expires_at, credential"
_LIVE = "(expires_at IS NULL OR expires_at > ?)"
_LIVE_R = "(r.expires_at IS NULL OR r.expires_at > ?)"
# ``credential IS ?`` with NULL for "anyone's" would match only NULL rows: "? IS NULL OR …".
_OWNED = "(? IS NULL OR credential = ?)"
_OWNED_R = "(? IS NULL OR r.credential = ?)"


async def _release(db: aiosqlite.Connection, where: str, params: tuple[Any, ...]) -> int:
    """Release the chunks of the responses ``where`` selects; how many there were."""
    async with db.execute(
        f"SELECT input_chunk, response_chunk FROM responses WHERE {where}", params
    ) as cursor:
        rows = await cursor.fetchall()
    await sqlite_content.content_of(db).release(db, [name for row in rows for name in row])
    return len(rows)


async def apply_saved(db: aiosqlite.Connection, writes: Sequence[ResponseSaved]) -> None:
    with index_of(db).writing() as index:
        await _save(db, writes, index)


async def _save(
    db: aiosqlite.Connection, writes: Sequence[ResponseSaved], index: InputIndex
) -> None:
    # A response saved twice in one batch: the last save wins, as across batches.
    writes = list({w.record.id: w for w in writes}.values())
    store = sqlite_content.content_of(db)
    chunked = await store.ready(db)
    ids = orjson.dumps([w.record.id for w in writes]).decode()
    values = [serialised(w.record, chunked) for w in writes]
    while True:
        puts = store.session() if chunked else None
        rows, item_rows, input_keys = await sqlite_content.cut(
            saved_weight(values, puts), saved_rows, writes, values, puts, index
        )
        if puts is None:
            break
        # A response is saved again at each status change: it gives up its last save's
        # chunks and items (the query says whether any was saved before: a first save, the
        # common case, then costs two statements fewer, each a round trip to the database).
        puts.replacing(_SAVED_BEFORE, (ids, ids))
        if await puts.commit(db):
            break
    if puts is None or puts.replaced:
        if puts is not None:
            await db.executemany(
                "DELETE FROM response_input_ids WHERE response_key = ?",
                [(id_key(w.record.id),) for w in writes],
            )
        await db.executemany(
            "DELETE FROM response_items WHERE response_id = ?", [(w.record.id,) for w in writes]
        )
    if item_rows:
        await db.executemany(
            "INSERT OR REPLACE INTO response_items (item_id, response_id, item) VALUES (?, ?, ?)",
            item_rows,
        )
    if input_keys:  # an older schema (a store opened with fewer steps) has no such table
        await db.executemany(
            "INSERT OR IGNORE INTO response_input_ids (item_key, response_key) VALUES (?, ?)",
            input_keys,
        )
    columns = f"{_COLUMNS}, input_chunk, response_chunk, id_key" if chunked else _COLUMNS
    marks = ", ".join("?" * len(columns.split(",")))
    await db.executemany(f"INSERT OR REPLACE INTO responses ({columns}) VALUES ({marks})", rows)
    if puts is not None and any(puts.replaced):
        await store.release(db, puts.replaced)
    if await _has_table(db, "response_pending"):
        await db.executemany(
            "DELETE FROM response_pending WHERE id = ?", [(w.record.id,) for w in writes]
        )


# Two rows per response saved before (NULL where a row from before schema 8 holds none).
_SAVED_BEFORE = (
    "SELECT input_chunk FROM responses WHERE id IN (SELECT value FROM json_each(?)) "
    "UNION ALL SELECT response_chunk FROM responses WHERE id IN (SELECT value FROM json_each(?))"
)


async def apply_deleted(db: aiosqlite.Connection, writes: Sequence[ResponseDeleted]) -> None:
    index_of(db).clear()  # a response gone may have held a resent item's index row
    ids = [(w.id,) for w in writes]
    if await sqlite_content.content_of(db).ready(db):
        await _release(
            db,
            "id IN (SELECT value FROM json_each(?))",
            (orjson.dumps([w.id for w in writes]).decode(),),
        )
        await db.executemany(
            "DELETE FROM response_input_ids WHERE response_key = ?",
            [(id_key(w.id),) for w in writes],
        )
    await db.executemany("DELETE FROM responses WHERE id = ?", ids)
    await db.executemany("DELETE FROM response_items WHERE response_id = ?", ids)
    await db.executemany("DELETE FROM response_events WHERE response_id = ?", ids)
    await db.executemany("DELETE FROM response_owners WHERE id = ?", ids)
    if await _has_table(db, "response_pending"):
        await db.executemany("DELETE FROM response_pending WHERE id = ?", ids)


async def apply_events(db: aiosqlite.Connection, writes: Sequence[ResponseEvents]) -> None:
    await db.executemany(
        "INSERT OR IGNORE INTO response_events (response_id, seq, event) VALUES (?, ?, ?)",
        [(w.response_id, seq, event) for w in writes for seq, event in w.events],
    )


async def apply_owned(db: aiosqlite.Connection, writes: Sequence[ResponseOwned]) -> None:
    await db.executemany(
        "INSERT OR REPLACE INTO response_owners "
        "(id, endpoint, created_at, expires_at, credential) VALUES (?, ?, ?, ?, ?)",
        [
            (o.id, o.endpoint, o.created_at, o.expires_at, o.credential)
            for o in (w.owner for w in writes)
        ],
    )


async def apply_purged(db: aiosqlite.Connection, writes: Sequence[ResponsesPurged]) -> None:
    now = max(w.now for w in writes)
    index_of(db).clear()
    if await sqlite_content.content_of(db).ready(db):
        await _release(db, "expires_at <= ?", (now,))
        await db.execute(
            "DELETE FROM response_input_ids WHERE response_key IN "
            "(SELECT id_key FROM responses WHERE expires_at <= ? AND id_key IS NOT NULL)",
            (now,),
        )
    await db.execute(
        "DELETE FROM response_events WHERE response_id IN "
        "(SELECT id FROM responses WHERE expires_at <= ?)",
        (now,),
    )
    await db.execute(
        "DELETE FROM response_items WHERE response_id IN "
        "(SELECT id FROM responses WHERE expires_at <= ?)",
        (now,),
    )
    await db.execute("DELETE FROM responses WHERE expires_at <= ?", (now,))
    await db.execute("DELETE FROM response_owners WHERE expires_at <= ?", (now,))
    if await _has_table(db, "response_pending"):
        old = now - PENDING_MAX_AGE
        await db.execute("DELETE FROM response_pending WHERE created_at < ?", (old,))
        await db.execute("DELETE FROM response_runs WHERE heartbeat_at < ?", (old,))


async def _has_table(db: aiosqlite.Connection, name: str) -> bool:
    """Whether the file has table ``name`` (a store opened with fewer migration steps, in
    tests, or a read-only one over an older file, may not)."""
    async with db.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)
    ) as cursor:
        return await cursor.fetchone() is not None


# -- across proxies: pending marks and background run leases (migration 9) -------------------


async def apply_pending(db: aiosqlite.Connection, writes: Sequence[ResponsePending]) -> None:
    await db.executemany(
        "INSERT OR REPLACE INTO response_pending (id, created_at, credential) VALUES (?, ?, ?)",
        [(w.pending.id, w.pending.created_at, w.pending.credential) for w in writes],
    )


async def apply_run_started(db: aiosqlite.Connection, writes: Sequence[RunStarted]) -> None:
    await db.executemany(
        "INSERT OR REPLACE INTO response_runs (response_id, owner, heartbeat_at, "
        "cancel_requested_at, delete_requested) VALUES (?, ?, ?, NULL, 0)",
        [(w.lease.response_id, w.lease.owner, w.lease.heartbeat_at) for w in writes],
    )


async def apply_heartbeat(db: aiosqlite.Connection, writes: Sequence[RunsHeartbeat]) -> None:
    await db.executemany(
        "UPDATE response_runs SET heartbeat_at = ? WHERE response_id = ? AND owner = ?",
        [(w.at, rid, w.owner) for w in writes for rid in w.response_ids],
    )


async def apply_cancel_requested(
    db: aiosqlite.Connection, writes: Sequence[RunCancelRequested]
) -> None:
    await db.executemany(
        "UPDATE response_runs SET cancel_requested_at = COALESCE(cancel_requested_at, ?), "
        "delete_requested = MAX(delete_requested, ?) WHERE response_id = ?",
        [(w.at, int(w.delete), w.response_id) for w in writes],
    )


async def apply_run_ended(db: aiosqlite.Connection, writes: Sequence[RunEnded]) -> None:
    for w in writes:
        await _end_run(db, w.response_id)


async def _end_run(db: aiosqlite.Connection, response_id: str) -> None:
    """Remove a run's lease; delete its response when a delete was asked while it ran."""
    async with db.execute(
        "DELETE FROM response_runs WHERE response_id = ? RETURNING delete_requested",
        (response_id,),
    ) as cursor:
        row = await cursor.fetchone()
    if row is not None and row[0]:
        await apply_deleted(db, [ResponseDeleted(response_id)])


async def apply_stale_ended(db: aiosqlite.Connection, writes: Sequence[StaleRunEnded]) -> None:
    # The batch holds the write lock (BEGIN IMMEDIATE): no owner's heartbeat can land
    # between this check and the writes after it.
    for w in writes:
        async with db.execute(
            "SELECT 1 FROM response_runs WHERE response_id = ? AND heartbeat_at < ?",
            (w.record.id, w.stale_before),
        ) as cursor:
            if await cursor.fetchone() is None:
                continue
        await apply_saved(db, [ResponseSaved(w.record)])
        await apply_events(db, [ResponseEvents(w.record.id, w.events)])
        await _end_run(db, w.record.id)


async def read_pending(db: aiosqlite.Connection, response_id: str) -> PendingResponse | None:
    if not await _has_table(db, "response_pending"):
        return None
    sql = "SELECT created_at, credential FROM response_pending WHERE id = ? AND created_at >= ?"
    async with db.execute(sql, (response_id, time.time() - PENDING_MAX_AGE)) as cursor:
        row = await cursor.fetchone()
    if row is None:
        return None
    credential = row[1] if isinstance(row[1], str) else None
    return PendingResponse(response_id, float(row[0]), credential)


async def read_run_lease(db: aiosqlite.Connection, response_id: str) -> RunLease | None:
    if not await _has_table(db, "response_runs"):
        return None
    sql = f"SELECT {LEASE_COLUMNS} FROM response_runs WHERE response_id = ?"
    async with db.execute(sql, (response_id,)) as cursor:
        row = await cursor.fetchone()
    return lease_of(row) if row else None


async def read_owned_leases(db: aiosqlite.Connection, owner: str) -> list[RunLease]:
    if not await _has_table(db, "response_runs"):
        return []
    sql = f"SELECT {LEASE_COLUMNS} FROM response_runs WHERE owner = ?"
    async with db.execute(sql, (owner,)) as cursor:
        rows = await cursor.fetchall()
    return [lease_of(row) for row in rows]


async def _chunked(db: aiosqlite.Connection) -> bool:
    """Whether this file has the chunk columns (a read-only one may be older)."""
    async with db.execute(
        "SELECT 1 FROM pragma_table_info('responses') WHERE name = 'input_chunk'"
    ) as cursor:
        return await cursor.fetchone() is not None


async def _columns(db: aiosqlite.Connection, prefix: str = "") -> str:
    extra = ", input_chunk, response_chunk" if await _chunked(db) else ", NULL, NULL"
    return ", ".join(prefix + c.strip() for c in f"{_COLUMNS}{extra}".split(","))


async def _records(db: aiosqlite.Connection, rows: Sequence[Sequence[Any]]) -> list[StoredResponse]:
    names = chunk_names(rows)
    values = iter(await sqlite_content.read(db, names, {})) if names else iter(())
    return records_of(rows, values)


async def read_response(
    db: aiosqlite.Connection, response_id: str, credential: str | None
) -> StoredResponse | None:
    sql = f"SELECT {await _columns(db)} FROM responses WHERE id = ? AND {_LIVE} AND {_OWNED}"
    async with db.execute(sql, (response_id, time.time(), credential, credential)) as cursor:
        row = await cursor.fetchone()
    return (await _records(db, [row]))[0] if row else None


async def read_chain(
    db: aiosqlite.Connection, response_id: str, max_depth: int, credential: str | None
) -> list[StoredResponse]:
    # Walk up previous_response_id; depth orders the result and bounds a (corrupt) cycle.
    # An ancestor that is not the credential's is left out, which breaks the chain there.
    sql = f"""
        WITH RECURSIVE chain(id, depth) AS (
            SELECT id, 0 FROM responses WHERE id = ? AND {_LIVE} AND {_OWNED}
            UNION ALL
            SELECT r.previous_response_id, chain.depth + 1
            FROM responses AS r JOIN chain ON r.id = chain.id
            WHERE r.previous_response_id IS NOT NULL AND chain.depth < ?
        )
        SELECT {await _columns(db, "r.")}
        FROM chain JOIN responses AS r ON r.id = chain.id
        WHERE (r.expires_at IS NULL OR r.expires_at > ?)
            AND (? IS NULL OR r.credential = ?)
        ORDER BY chain.depth DESC
    """
    now = time.time()
    params = (response_id, now, credential, credential, max_depth, now, credential, credential)
    async with db.execute(sql, params) as cursor:
        rows = await cursor.fetchall()
    records = await _records(db, rows)
    # A deleted ancestor ends the chain: keep only the unbroken run ending at response_id.
    unbroken: list[StoredResponse] = []
    for record in reversed(records):
        if unbroken and unbroken[-1].previous_response_id != record.id:
            break
        unbroken.append(record)
    return unbroken[::-1]


async def read_items(
    db: aiosqlite.Connection, item_ids: Sequence[str], credential: str | None
) -> dict[str, dict]:
    found: dict[str, dict] = {}
    chunked = await _chunked(db)
    for item_id in dict.fromkeys(item_ids):
        # The newest of: the item's response_items row (an output item, or any item of a
        # response saved before schema 8), the newest response whose input has it.
        sql = f"""
            SELECT i.item, i.response_id, r.created_at FROM response_items AS i
            JOIN responses AS r ON r.id = i.response_id
            WHERE i.item_id = ? AND {_LIVE_R} AND {_OWNED_R}
            ORDER BY r.created_at DESC LIMIT 1
        """
        params = (item_id, time.time(), credential, credential)
        async with db.execute(sql, params) as cursor:
            row = await cursor.fetchone()
        best: tuple[float, dict[str, Any]] | None = None
        if row and row[0]:
            best = (row[2], orjson.loads(row[0]))
        elif row:
            best = await _item_of(db, row[1], row[2], item_id, credential)
        if chunked:
            sql = f"""
                SELECT r.id, r.created_at FROM response_input_ids AS x
                JOIN responses AS r ON r.id_key = x.response_key
                WHERE x.item_key = ? AND {_LIVE_R} AND {_OWNED_R}
                ORDER BY r.created_at DESC
            """
            params = (id_key(item_id), time.time(), credential, credential)
            async with db.execute(sql, params) as cursor:
                candidates = await cursor.fetchall()
            for response_id, created_at in candidates:
                if best is not None and best[0] >= created_at:
                    break
                hit = await _item_of(db, response_id, created_at, item_id, credential)
                if hit is not None:  # else a key shared by chance: try an older one
                    best = hit
                    break
            if best is None:
                best = await _resent_in(db, item_id, credential)
        if best is not None:
            found[item_id] = best[1]
    return found


async def _resent_in(
    db: aiosqlite.Connection, item_id: str, credential: str | None
) -> tuple[float, dict[str, Any]] | None:
    """The item from the newest response whose input names it, looked for in the ids
    themselves: the response its index row named is gone, and later ones resent it without
    a row of their own (``store.input_index``). Only when no row led to it: a scan."""
    sql = f"""
        SELECT id, created_at FROM responses
        WHERE instr(input_items, ?) > 0 AND {_LIVE} AND {_OWNED}
        ORDER BY created_at DESC
    """
    params = (orjson.dumps(item_id), time.time(), credential, credential)
    async with db.execute(sql, params) as cursor:
        candidates = await cursor.fetchall()
    for response_id, created_at in candidates:
        hit = await _item_of(db, response_id, created_at, item_id, credential)
        if hit is not None:
            return hit
    return None


async def _item_of(
    db: aiosqlite.Connection,
    response_id: str,
    created_at: float,
    item_id: str,
    credential: str | None,
) -> tuple[float, dict[str, Any]] | None:
    item = item_in(await read_response(db, response_id, credential), item_id)
    return None if item is None else (created_at, item)


async def read_events(db: aiosqlite.Connection, response_id: str, after: int) -> list[bytes]:
    sql = "SELECT event FROM response_events WHERE response_id = ? AND seq > ? ORDER BY seq"
    async with db.execute(sql, (response_id, after)) as cursor:
        rows = await cursor.fetchall()
    return [bytes(row[0]) for row in rows]


async def read_owner(db: aiosqlite.Connection, response_id: str) -> ResponseOwner | None:
    sql = (
        "SELECT id, endpoint, created_at, expires_at, credential FROM response_owners "
        f"WHERE id = ? AND {_LIVE}"
    )
    async with db.execute(sql, (response_id, time.time())) as cursor:
        row = await cursor.fetchone()
    if not row:
        return None
    credential = row[4] if isinstance(row[4], str) else None
    return ResponseOwner(str(row[0]), str(row[1]), float(row[2]), row[3], credential)


async def read_seal_key(db: aiosqlite.Connection) -> bytes | None:
    async with db.execute(
        "SELECT value FROM llmitm_secrets WHERE name = ?", (SEAL_KEY_NAME,)
    ) as cursor:
        row = await cursor.fetchone()
    return bytes(row[0]) if row else None
