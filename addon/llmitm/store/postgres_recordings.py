"""Recordings in PostgreSQL: how recording writes are stored and recordings read back
(``store.sqlite_recordings`` is the SQLite twin and describes the layout: one
``rec_interactions`` row per interaction, one ``rec_messages`` row per leg, whole bodies and
canonical texts as chunks, streams as named ``rec_blobs`` rows with a packed chunk index).

The rows and the chunk index are built and unpacked by ``store.recording_rows`` (they know no
database); the SQL here is PostgreSQL's. Deleting takes the interactions' row locks
first, so two proxies (or a proxy and ``rec prune``) deleting or re-recording the same
interaction release its chunks once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import asyncpg

from llmitm.replay.model import Interaction
from llmitm.store import postgres_content
from llmitm.store.content_chunks import cut
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

_INTERACTION_COLUMNS = (
    "id", "session", "started_us", "scope", "match_key", "match_key_version", "method", "route",
    "model", "stream", "canonical", "status", "endpoint", "plan", "ttfb_us", "duration_us",
    "truncated", "error", "mode", "minted", "credential", "canonical_chunk",
)  # fmt: skip
_MESSAGE_COLUMNS = (
    "interaction_id", "leg", "method", "url", "status", "headers_json", "body_sha256",
    "chunk_index", "index_codec", "body_chunk",
)  # fmt: skip


def _upsert(table: str, columns: Sequence[str], key: Sequence[str]) -> str:
    """``INSERT … ON CONFLICT (key) DO UPDATE`` of every other column: a row recorded again
    under its id replaces the old one, as SQLite's ``INSERT OR REPLACE``."""
    marks = ", ".join(f"${n}" for n in range(1, len(columns) + 1))
    updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in columns if c not in key)
    return (
        f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks}) "
        f"ON CONFLICT ({', '.join(key)}) DO UPDATE SET {updates}"
    )


_INSERT_INTERACTION = _upsert("rec_interactions", _INTERACTION_COLUMNS, ("id",))
_INSERT_MESSAGE = _upsert("rec_messages", _MESSAGE_COLUMNS, ("interaction_id", "leg"))

# The chunks the recordings ``$1`` hold now, their interaction rows locked.
_CHUNKS_OF_IDS = (
    "SELECT x.c FROM (SELECT id, canonical_chunk FROM rec_interactions "
    "WHERE id = ANY($1::text[]) ORDER BY id FOR UPDATE) AS i, LATERAL ("
    "SELECT i.canonical_chunk AS c UNION ALL "
    "SELECT body_chunk FROM rec_messages WHERE interaction_id = i.id) AS x"
)


async def apply_recordings(db: asyncpg.Connection, writes: Sequence[RecordingWrite]) -> None:
    # One id recorded twice in one batch: the last wins.
    writes = list({w.interaction.id: w for w in writes}.values())
    store = postgres_content.content_of(db)
    ids = [w.interaction.id for w in writes]
    await postgres_content.lock_owners(db, "recording:", ids)
    while True:
        puts = store.session()
        interactions, messages, blobs = await cut(
            recording_weight(writes, puts), recording_rows, writes, puts
        )
        puts.replacing(_CHUNKS_OF_IDS, (ids,))
        if await puts.commit(db):
            break
    if blobs:
        await db.executemany(
            "INSERT INTO rec_blobs (sha256, size, codec, data) VALUES ($1, $2, $3, $4) "
            "ON CONFLICT (sha256) DO UPDATE SET size = EXCLUDED.size, codec = EXCLUDED.codec, "
            "data = EXCLUDED.data",
            [(d, *blob) for d, blob in sorted(blobs.items())],
        )
    await db.executemany(_INSERT_INTERACTION, interactions)
    if any(puts.replaced):  # legs the new recording lacks must not keep released chunks
        await db.execute("DELETE FROM rec_messages WHERE interaction_id = ANY($1::text[])", ids)
    await db.executemany(_INSERT_MESSAGE, messages)
    if any(puts.replaced):
        await store.release(db, puts.replaced)


async def _delete_where(db: asyncpg.Connection, where: str, *params: Any) -> None:
    """Delete the recordings ``where`` selects, releasing their chunks and the stream blobs
    nothing else names."""
    rows = await db.fetch(
        f"SELECT id FROM rec_interactions WHERE {where} ORDER BY id FOR UPDATE", *params
    )
    ids = [row[0] for row in rows]
    if not ids:
        return
    names = await db.fetch(
        "SELECT canonical_chunk FROM rec_interactions WHERE id = ANY($1::text[]) UNION ALL "
        "SELECT body_chunk FROM rec_messages WHERE interaction_id = ANY($1::text[])",
        ids,
    )
    await postgres_content.content_of(db).release(db, [row[0] for row in names])
    digests = await db.fetch(
        "DELETE FROM rec_messages WHERE interaction_id = ANY($1::text[]) RETURNING body_sha256",
        ids,
    )
    await db.execute("DELETE FROM rec_interactions WHERE id = ANY($1::text[])", ids)
    await db.execute(
        "DELETE FROM rec_blobs AS b WHERE sha256 = ANY($1::text[]) "
        "AND NOT EXISTS (SELECT 1 FROM rec_messages AS m WHERE m.body_sha256 = b.sha256)",
        sorted({row[0] for row in digests if row[0]}),
    )


async def apply_delete_scope(db: asyncpg.Connection, writes: Sequence[DeleteScope]) -> None:
    for write in writes:
        await _delete_where(db, "scope = $1", write.scope)


async def apply_delete_ids(db: asyncpg.Connection, writes: Sequence[DeleteRecordings]) -> None:
    ids = sorted({ident for write in writes for ident in write.ids})
    await _delete_where(db, "id = ANY($1::text[])", ids)


async def apply_prune(db: asyncpg.Connection, writes: Sequence[PruneRecordings]) -> None:
    for write in writes:
        await _delete_where(db, "started_us < $1", write.before_us)


async def apply_rekey(db: asyncpg.Connection, writes: Sequence[RekeyRecording]) -> None:
    """New keys for stored recordings; the legs stay as they are (``rec migrate``)."""
    store = postgres_content.content_of(db)
    for w in writes:
        old = await db.fetchval(
            "SELECT canonical_chunk FROM rec_interactions WHERE id = $1 FOR UPDATE", w.id
        )
        while True:
            puts = store.session()
            name = puts.put("canonical:rekey", w.canonical.encode())
            if await puts.commit(db):
                break
        await db.execute(
            "UPDATE rec_interactions SET match_key = $1, match_key_version = $2, "
            "canonical = '', canonical_chunk = $3 WHERE id = $4",
            w.key,
            w.key_version,
            name,
            w.id,
        )
        await store.release(db, [old])


async def apply_misses(db: asyncpg.Connection, writes: Sequence[ReplayMissRecord]) -> None:
    await db.executemany(
        "INSERT INTO rec_misses (at_us, scope, match_key, reason, canonical, closest_id, "
        "closest_canonical) VALUES ($1, $2, $3, $4, $5, $6, $7)",
        [
            (w.at_us, w.scope, w.key, w.reason, w.canonical, w.closest_id, w.closest_canonical)
            for w in writes
        ],
    )


# --- reads -----------------------------------------------------------------------------------

_COLUMNS = ", ".join(_INTERACTION_COLUMNS)


async def _interactions(
    db: asyncpg.Connection, rows: Sequence[Sequence[Any]], memo: dict[bytes, bytes]
) -> list[Interaction]:
    """Rows as interactions, their canonical texts read from chunks where they are kept."""
    names = chunk_names(rows, 21)
    texts = iter(await postgres_content.read(db, names, memo)) if names else iter(())
    return interactions_of(rows, texts)


async def list_interactions(
    db: asyncpg.Connection,
    scope: str | None = None,
    limit: int | None = None,
    memo: dict[bytes, bytes] | None = None,
) -> list[Interaction]:
    """Interactions without their legs, newest last (``limit``: the newest ``limit``)."""
    rows = await db.fetch(
        f"SELECT {_COLUMNS} FROM rec_interactions WHERE ($1::text IS NULL OR scope = $1) "
        "ORDER BY started_us DESC, id DESC LIMIT $2",
        scope,
        limit,
    )
    return await _interactions(db, list(reversed(rows)), memo if memo is not None else {})


async def _attach_legs(
    db: asyncpg.Connection, interactions: list[Interaction], memo: dict[bytes, bytes]
) -> None:
    by_id = {i.id: i for i in interactions}
    if not by_id:
        return
    rows = await db.fetch(
        "SELECT m.interaction_id, m.leg, m.method, m.url, m.status, m.headers_json, "
        "m.chunk_index, m.index_codec, b.codec, b.data, m.body_chunk "
        "FROM rec_messages AS m LEFT JOIN rec_blobs AS b ON b.sha256 = m.body_sha256 "
        "WHERE m.interaction_id = ANY($1::text[])",
        list(by_id),
    )
    chunked = chunk_names(rows, 10)
    bodies = iter(await postgres_content.read(db, chunked, memo)) if chunked else iter(())
    attach_legs(rows, bodies, by_id)
    order_legs(interactions)


async def load_interactions(db: asyncpg.Connection, scope: str | None = None) -> list[Interaction]:
    """Every interaction (of ``scope``) with its legs, in arrival order."""
    memo: dict[bytes, bytes] = {}
    interactions = await list_interactions(db, scope, memo=memo)
    for start in range(0, len(interactions), 500):  # bounded memory per round trip
        await _attach_legs(db, interactions[start : start + 500], memo)
    return interactions


async def get_interaction(db: asyncpg.Connection, ident: str) -> Interaction | None:
    """The interaction whose id is ``ident`` or starts with it (``None`` when ambiguous)."""
    rows = await db.fetch(
        f"SELECT {_COLUMNS} FROM rec_interactions WHERE id LIKE $1 ORDER BY id LIMIT 2",
        ident.replace("%", "").replace("_", "") + "%",
    )
    if len(rows) != 1:
        return None
    memo: dict[bytes, bytes] = {}
    (interaction,) = await _interactions(db, rows, memo)
    await _attach_legs(db, [interaction], memo)
    return interaction


async def request_urls(db: asyncpg.Connection) -> list[tuple[str, str]]:
    """``(id, URL)`` of each recording's client request (``rec prune --host/--path``)."""
    rows = await db.fetch(
        "SELECT interaction_id, url FROM rec_messages WHERE leg = 'client_req' "
        "ORDER BY interaction_id"
    )
    return [(row[0], row[1]) for row in rows]


async def last_miss(db: asyncpg.Connection) -> ReplayMissRecord | None:
    row = await db.fetchrow(
        "SELECT at_us, scope, match_key, reason, canonical, closest_id, closest_canonical "
        "FROM rec_misses ORDER BY id DESC LIMIT 1"
    )
    return ReplayMissRecord(*row) if row else None
