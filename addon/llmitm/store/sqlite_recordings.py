"""Recordings in SQLite: how recording writes are stored and how recordings are read back.

Owns the SQL that reads and writes the ``rec_*`` tables (created by the ``recordings``
migration in ``store.migrations``). Layout:

- ``rec_interactions``: one row per interaction (key, scope, route, timing, truncation …);
- ``rec_messages``: one row per leg; its body is a ``rec_blobs`` row: content-addressed
  (sha256) for whole bodies, so a long system prompt sent a thousand times is stored once;
  named ``stream:<interaction>:<leg>`` for streams (never equal to another), and shared by
  a passthrough stream's upstream and client legs;
- a streamed leg keeps its pieces' split points and offsets in ``chunk_index``: packed
  little-endian int64 pairs ``(t_us, length)`` (layout 1), or, as recording writes them now,
  the arrival times as float64 then the lengths (layout 2, see ``store.recording_rows``). One blob
  and one small index per stream, not a row per piece: recording a 2000-event stream is a
  handful of inserts;
- bodies and indexes from 1 KiB are zstd-compressed (``store.blob_codec``; the ``codec`` and
  ``index_codec`` columns say how each is stored);
- from schema 8 on, a whole body and the canonical text are chunks of the shared chunk table
  (``store.sqlite_content``: ``body_chunk``, ``canonical_chunk``), cut so that a turn that
  resends the history stores only what it adds; ``body_sha256`` and ``canonical`` are then
  empty. Streams stay named ``rec_blobs`` rows: nothing repeats them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import aiosqlite
import orjson

from llmitm.replay.model import Interaction
from llmitm.store import sqlite_content
from llmitm.store.recording_rows import (
    attach_legs,
    chunk_names,
    interactions_of,
    order_legs,
    recording_rows,
    recording_weight,
)
from llmitm.store.recordings import (
    DeleteRecordings,
    DeleteScope,
    PruneRecordings,
    RecordingWrite,
    RekeyRecording,
    ReplayMissRecord,
)

# --- writes ----------------------------------------------------------------------------------

_INSERT_INTERACTION = """
    INSERT OR REPLACE INTO rec_interactions (
        id, session, started_us, scope, match_key, match_key_version, method, route, model,
        stream, canonical, status, endpoint, plan, ttfb_us, duration_us, truncated, error, mode,
        minted, credential{chunk_column}
    ) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?{chunk_mark})
"""
_INSERT_MESSAGE = """
    INSERT OR REPLACE INTO rec_messages
        (interaction_id, leg, method, url, status, headers_json, body_sha256, chunk_index,
         index_codec{chunk_column})
    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?{chunk_mark})
"""
_INSERT_BLOB = "INSERT OR IGNORE INTO rec_blobs (sha256, size, codec, data) VALUES (?, ?, ?, ?)"


async def apply_recordings(db: aiosqlite.Connection, writes: Sequence[RecordingWrite]) -> None:
    # One id recorded twice in one batch: the last wins, as INSERT OR REPLACE has it.
    writes = list({w.interaction.id: w for w in writes}.values())
    store = sqlite_content.content_of(db)
    chunked = await store.ready(db)
    ids = orjson.dumps([w.interaction.id for w in writes]).decode()
    while True:
        puts = store.session() if chunked else None
        interactions, messages, blobs = await sqlite_content.cut(
            recording_weight(writes, puts), recording_rows, writes, puts
        )
        if puts is None:
            break
        # A recording stored again under its id (INSERT OR REPLACE) gives up its old chunks.
        puts.replacing(_CHUNKS_OF_IDS, (ids, ids))
        if await puts.commit(db):
            break
    columns = (
        {"chunk_column": ", canonical_chunk", "chunk_mark": ", ?"}
        if chunked
        else {"chunk_column": "", "chunk_mark": ""}
    )
    if blobs:
        await db.executemany(_INSERT_BLOB, [(d, *blob) for d, blob in blobs.items()])
    await db.executemany(_INSERT_INTERACTION.format(**columns), interactions)
    replaced = puts is not None and any(puts.replaced)
    if replaced:  # legs the new recording lacks must not keep released chunks
        await db.execute(
            "DELETE FROM rec_messages WHERE interaction_id IN (SELECT value FROM json_each(?))",
            (ids,),
        )
    if chunked:
        columns["chunk_column"] = ", body_chunk"
    await db.executemany(_INSERT_MESSAGE.format(**columns), messages)
    if replaced:
        await store.release(db, puts.replaced)  # type: ignore[union-attr]


_CHUNKS_OF_IDS = (
    "SELECT canonical_chunk FROM rec_interactions WHERE id IN (SELECT value FROM json_each(?)) "
    "UNION ALL SELECT body_chunk FROM rec_messages "
    "WHERE interaction_id IN (SELECT value FROM json_each(?))"
)


async def _release_chunks(
    db: aiosqlite.Connection, where: str, params: tuple[Any, ...], *, legs: bool = True
) -> None:
    """Release the chunks of the recordings ``where`` selects (before they are deleted or
    replaced): their canonical texts and, with ``legs``, their bodies."""
    # One query, not two: the writer pays a thread round trip per statement.
    sql = (
        f"SELECT canonical_chunk FROM rec_interactions WHERE {where} "
        "AND canonical_chunk IS NOT NULL"
    )
    if legs:
        sql += (
            " UNION ALL SELECT body_chunk FROM rec_messages WHERE body_chunk IS NOT NULL "
            f"AND interaction_id IN (SELECT id FROM rec_interactions WHERE {where})"
        )
        params = (*params, *params)
    async with db.execute(sql, params) as cursor:
        names: list[bytes | None] = [row[0] async for row in cursor]
    await sqlite_content.content_of(db).release(db, names)


_DELETE_ORPHAN_BLOBS = """
    DELETE FROM rec_blobs WHERE sha256 NOT IN (SELECT body_sha256 FROM rec_messages)
"""


async def _delete_where(db: aiosqlite.Connection, where: str, params: tuple[Any, ...]) -> None:
    if await sqlite_content.content_of(db).ready(db):
        await _release_chunks(db, where, params)
    await db.execute(
        f"DELETE FROM rec_messages WHERE interaction_id IN "
        f"(SELECT id FROM rec_interactions WHERE {where})",
        params,
    )
    await db.execute(f"DELETE FROM rec_interactions WHERE {where}", params)
    await db.execute(_DELETE_ORPHAN_BLOBS)


async def apply_delete_scope(db: aiosqlite.Connection, writes: Sequence[DeleteScope]) -> None:
    for write in writes:
        await _delete_where(db, "scope = ?", (write.scope,))


async def apply_delete_ids(db: aiosqlite.Connection, writes: Sequence[DeleteRecordings]) -> None:
    ids = [ident for write in writes for ident in write.ids]
    for start in range(0, len(ids), 500):  # SQLite's limit on bound parameters
        part = tuple(ids[start : start + 500])
        await _delete_where(db, f"id IN ({','.join('?' * len(part))})", part)


async def request_urls(db: aiosqlite.Connection) -> list[tuple[str, str]]:
    """``(id, URL)`` of each recording's client request (``rec prune --host/--path``)."""
    async with db.execute(
        "SELECT interaction_id, url FROM rec_messages WHERE leg = 'client_req' "
        "ORDER BY interaction_id"
    ) as cursor:
        return [(row[0], row[1]) for row in await cursor.fetchall()]


async def apply_prune(db: aiosqlite.Connection, writes: Sequence[PruneRecordings]) -> None:
    for write in writes:
        await _delete_where(db, "started_us < ?", (write.before_us,))


async def apply_rekey(db: aiosqlite.Connection, writes: Sequence[RekeyRecording]) -> None:
    """New keys for stored recordings; the legs stay as they are (``rec migrate``)."""
    store = sqlite_content.content_of(db)
    if await store.ready(db):
        for w in writes:
            await _release_chunks(db, "id = ?", (w.id,), legs=False)
            while True:
                puts = store.session()
                name = puts.put("canonical:rekey", w.canonical.encode())
                if await puts.commit(db):
                    break
            await db.execute(
                "UPDATE rec_interactions SET match_key = ?, match_key_version = ?, "
                "canonical = '', canonical_chunk = ? WHERE id = ?",
                (w.key, w.key_version, name, w.id),
            )
        return
    await db.executemany(
        "UPDATE rec_interactions SET match_key = ?, match_key_version = ?, canonical = ? "
        "WHERE id = ?",
        [(w.key, w.key_version, w.canonical, w.id) for w in writes],
    )


async def apply_misses(db: aiosqlite.Connection, writes: Sequence[ReplayMissRecord]) -> None:
    await db.executemany(
        "INSERT INTO rec_misses (at_us, scope, match_key, reason, canonical, closest_id, "
        "closest_canonical) VALUES (?, ?, ?, ?, ?, ?, ?)",
        [
            (w.at_us, w.scope, w.key, w.reason, w.canonical, w.closest_id, w.closest_canonical)
            for w in writes
        ],
    )


# --- reads -----------------------------------------------------------------------------------

_COLUMNS = (
    "id, session, started_us, scope, match_key, match_key_version, method, route, model, "
    "stream, canonical, status, endpoint, plan, ttfb_us, duration_us, truncated, error, mode, "
    "minted, credential, canonical_chunk"
)
# A database opened read-only is not migrated: one written before migration 4 lacks its
# columns, which read as NULL (and raw bodies), one before 8 has no chunks.
_COLUMNS_7 = _COLUMNS.replace("canonical_chunk", "NULL")
_COLUMNS_3 = _COLUMNS_7.replace("minted, credential", "NULL, NULL")
_BLOB_COLUMNS = "m.chunk_index, m.index_codec, b.codec, b.data, m.body_chunk"
_BLOB_COLUMNS_7 = _BLOB_COLUMNS.replace("m.body_chunk", "NULL")
_BLOB_COLUMNS_3 = "m.chunk_index, '', '', b.data, NULL"


async def _has_column(db: aiosqlite.Connection, table: str, column: str) -> bool:
    async with db.execute(
        f"SELECT 1 FROM pragma_table_info('{table}') WHERE name = ?", (column,)
    ) as cursor:
        return await cursor.fetchone() is not None


async def _schema(db: aiosqlite.Connection) -> int:
    """3, 4 or 8: the recordings schema a (perhaps read-only, unmigrated) file has."""
    if await _has_column(db, "rec_interactions", "canonical_chunk"):
        return 8
    return 4 if await _has_column(db, "rec_interactions", "minted") else 3


async def _columns(db: aiosqlite.Connection) -> str:
    return {3: _COLUMNS_3, 4: _COLUMNS_7, 8: _COLUMNS}[await _schema(db)]


async def _interactions(
    db: aiosqlite.Connection, rows: Sequence[Sequence[Any]], memo: dict[bytes, bytes]
) -> list[Interaction]:
    """Rows as interactions, their canonical texts read from chunks where they are kept."""
    names = chunk_names(rows, 21)
    texts = iter(await sqlite_content.read(db, names, memo)) if names else iter(())
    return interactions_of(rows, texts)


async def list_interactions(
    db: aiosqlite.Connection,
    scope: str | None = None,
    limit: int | None = None,
    memo: dict[bytes, bytes] | None = None,
) -> list[Interaction]:
    """Interactions without their legs, newest last (``limit``: the newest ``limit``)."""
    where, params = ("WHERE scope = ?", (scope,)) if scope is not None else ("", ())
    columns = await _columns(db)
    sql = f"SELECT {columns} FROM rec_interactions {where} ORDER BY started_us DESC, id DESC"
    if limit is not None:
        sql += f" LIMIT {int(limit):d}"
    async with db.execute(sql, params) as cursor:
        rows = await cursor.fetchall()
    return await _interactions(db, list(reversed(rows)), memo if memo is not None else {})


async def _attach_legs(
    db: aiosqlite.Connection, interactions: list[Interaction], memo: dict[bytes, bytes]
) -> None:
    by_id = {i.id: i for i in interactions}
    if not by_id:
        return
    ids = list(by_id)
    blob_columns = {3: _BLOB_COLUMNS_3, 4: _BLOB_COLUMNS_7, 8: _BLOB_COLUMNS}[await _schema(db)]
    for start in range(0, len(ids), 500):
        part = ids[start : start + 500]
        marks = ",".join("?" * len(part))
        sql = (
            "SELECT m.interaction_id, m.leg, m.method, m.url, m.status, m.headers_json, "
            f"{blob_columns} FROM rec_messages m LEFT JOIN rec_blobs b "
            f"ON b.sha256 = m.body_sha256 WHERE m.interaction_id IN ({marks})"
        )
        async with db.execute(sql, part) as cursor:
            rows = list(await cursor.fetchall())
        chunked = chunk_names(rows, 10)
        bodies = iter(await sqlite_content.read(db, chunked, memo)) if chunked else iter(())
        attach_legs(rows, bodies, by_id)
    order_legs(interactions)


async def load_interactions(
    db: aiosqlite.Connection, scope: str | None = None
) -> list[Interaction]:
    """Every interaction (of ``scope``) with its legs, in arrival order."""
    memo: dict[bytes, bytes] = {}
    interactions = await list_interactions(db, scope, memo=memo)
    await _attach_legs(db, interactions, memo)
    return interactions


async def get_interaction(db: aiosqlite.Connection, ident: str) -> Interaction | None:
    """The interaction whose id is ``ident`` or starts with it (``None`` when ambiguous)."""
    async with db.execute(
        f"SELECT {await _columns(db)} FROM rec_interactions WHERE id LIKE ? ORDER BY id LIMIT 2",
        (ident.replace("%", "").replace("_", "") + "%",),
    ) as cursor:
        rows = list(await cursor.fetchall())
    if len(rows) != 1:
        return None
    memo: dict[bytes, bytes] = {}
    (interaction,) = await _interactions(db, rows, memo)
    await _attach_legs(db, [interaction], memo)
    return interaction


async def read_fingerprint_key(db: aiosqlite.Connection) -> bytes | None:
    """The key of credential fingerprints (replay.fingerprint), made with the schema."""
    async with db.execute(
        "SELECT value FROM llmitm_secrets WHERE name = 'credential-fingerprint'"
    ) as cursor:
        row = await cursor.fetchone()
    return bytes(row[0]) if row else None


async def last_miss(db: aiosqlite.Connection) -> ReplayMissRecord | None:
    async with db.execute(
        "SELECT at_us, scope, match_key, reason, canonical, closest_id, closest_canonical "
        "FROM rec_misses ORDER BY id DESC LIMIT 1"
    ) as cursor:
        row = await cursor.fetchone()
    return ReplayMissRecord(*row) if row else None
