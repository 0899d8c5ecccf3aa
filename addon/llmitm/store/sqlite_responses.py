"""Responses state in SQLite: how the writes of ``responses_api.records`` are applied and
its reads answered. Owns the SQL of the tables migration 2 creates (``responses``,
``response_events``, ``response_owners``, ``llmitm_secrets``) and of the ``credential``
columns migration 6 adds to the first and third; ``store.sqlite`` calls it.

Objects and item lists are stored as JSON blobs: the store never looks inside them, the
local Responses API (sans-IO) does. A chain is one recursive query over
``previous_response_id``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import aiosqlite
import orjson

from llmitm.responses_api.records import (
    ResponseDeleted,
    ResponseEvents,
    ResponseOwned,
    ResponseOwner,
    ResponseSaved,
    ResponsesPurged,
    StoredResponse,
)

SEAL_KEY_NAME = "reasoning-seal"

_COLUMNS = "id, response, input_items, previous_response_id, created_at, expires_at, credential"
_LIVE = "(expires_at IS NULL OR expires_at > ?)"
# ``credential IS ?`` with NULL for "anyone's" would match only NULL rows: "? IS NULL OR …".
_OWNED = "(? IS NULL OR credential = ?)"


async def apply_saved(db: aiosqlite.Connection, writes: Sequence[ResponseSaved]) -> None:
    # A response is saved again at each status change: its items are replaced with it.
    await db.executemany(
        "DELETE FROM response_items WHERE response_id = ?", [(w.record.id,) for w in writes]
    )
    await db.executemany(
        "INSERT OR REPLACE INTO response_items (item_id, response_id, item) VALUES (?, ?, ?)",
        [
            (item["id"], w.record.id, orjson.dumps(item))
            for w in writes
            for item in w.record.items()
            if isinstance(item.get("id"), str)
        ],
    )
    await db.executemany(
        f"INSERT OR REPLACE INTO responses ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
        [
            (
                w.record.id,
                orjson.dumps(w.record.response),
                orjson.dumps(w.record.input_items),
                w.record.previous_response_id,
                w.record.created_at,
                w.record.expires_at,
                w.record.credential,
            )
            for w in writes
        ],
    )


async def apply_deleted(db: aiosqlite.Connection, writes: Sequence[ResponseDeleted]) -> None:
    ids = [(w.id,) for w in writes]
    await db.executemany("DELETE FROM responses WHERE id = ?", ids)
    await db.executemany("DELETE FROM response_items WHERE response_id = ?", ids)
    await db.executemany("DELETE FROM response_events WHERE response_id = ?", ids)
    await db.executemany("DELETE FROM response_owners WHERE id = ?", ids)


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


def _record(row: Sequence[object]) -> StoredResponse:
    rid, response, items, previous, created_at, expires_at, credential = row
    return StoredResponse(
        id=str(rid),
        response=orjson.loads(response),  # type: ignore[arg-type]
        input_items=orjson.loads(items),  # type: ignore[arg-type]
        previous_response_id=previous if isinstance(previous, str) else None,
        created_at=float(created_at),  # type: ignore[arg-type]
        expires_at=float(expires_at) if expires_at is not None else None,  # type: ignore[arg-type]
        credential=credential if isinstance(credential, str) else None,
    )


async def read_response(
    db: aiosqlite.Connection, response_id: str, credential: str | None
) -> StoredResponse | None:
    sql = f"SELECT {_COLUMNS} FROM responses WHERE id = ? AND {_LIVE} AND {_OWNED}"
    async with db.execute(sql, (response_id, time.time(), credential, credential)) as cursor:
        row = await cursor.fetchone()
    return _record(row) if row else None


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
        SELECT {", ".join("r." + c.strip() for c in _COLUMNS.split(","))}
        FROM chain JOIN responses AS r ON r.id = chain.id
        WHERE (r.expires_at IS NULL OR r.expires_at > ?)
            AND (? IS NULL OR r.credential = ?)
        ORDER BY chain.depth DESC
    """
    now = time.time()
    params = (response_id, now, credential, credential, max_depth, now, credential, credential)
    async with db.execute(sql, params) as cursor:
        rows = await cursor.fetchall()
    records = [_record(row) for row in rows]
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
    for item_id in dict.fromkeys(item_ids):
        sql = """
            SELECT i.item FROM response_items AS i JOIN responses AS r ON r.id = i.response_id
            WHERE i.item_id = ? AND (r.expires_at IS NULL OR r.expires_at > ?)
                AND (? IS NULL OR r.credential = ?)
            ORDER BY r.created_at DESC LIMIT 1
        """
        params = (item_id, time.time(), credential, credential)
        async with db.execute(sql, params) as cursor:
            row = await cursor.fetchone()
        if row:
            found[item_id] = orjson.loads(row[0])
    return found


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
