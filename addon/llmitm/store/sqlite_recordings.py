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
  the arrival times as float64 then the lengths (layout 2, see :func:`pack_index`). One blob
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

import hashlib
import struct
import sys
from array import array
from collections.abc import Sequence
from typing import Any

import aiosqlite
import orjson

from llmitm.replay.model import LEGS, Chunk, Interaction, Message, Pieces
from llmitm.store import blob_codec, sqlite_content
from llmitm.store.recordings import (
    DeleteRecordings,
    DeleteScope,
    PruneRecordings,
    RecordingWrite,
    RekeyRecording,
    ReplayMissRecord,
)

# --- chunk index -----------------------------------------------------------------------------


_TIMED = b"LLMIDX\x02\xff"
"""Opens an index of layout 2; as layout 1's first offset it would be ~1400 years before."""


def pack_index(chunks: Sequence[Chunk]) -> bytes:
    """Layout 1, ``(t_us, length)`` of each piece as little-endian int64 pairs, interleaved in
    C; or, for :meth:`Pieces.timed` pieces, layout 2: the magic, the request's end and each
    arrival time as little-endian float64, then the lengths as int64 — copied as they are."""
    if not chunks:
        return b""
    if isinstance(chunks, Pieces) and chunks.times is not None:
        times, sizes = array("d", chunks.times), array("q", chunks.sizes)
        if sys.byteorder == "big":
            times.byteswap()
            sizes.byteswap()
        return b"".join((_TIMED, struct.pack("<d", chunks.t0), times.tobytes(), sizes.tobytes()))
    if isinstance(chunks, Pieces):
        offsets, sizes = chunks.offsets, chunks.sizes
    else:
        offsets, datas = zip(*chunks, strict=True)
        sizes = list(map(len, datas))
    flat = array("q", bytes(16 * len(chunks)))
    flat[0::2] = array("q", offsets)
    flat[1::2] = array("q", sizes)
    if sys.byteorder == "big":
        flat.byteswap()
    return flat.tobytes()


def unpack_chunks(index: bytes, body: bytes) -> list[Chunk]:
    if index.startswith(_TIMED):
        count = (len(index) - 16) // 16
        (t0,) = struct.unpack_from("<d", index, 8)
        times = struct.unpack_from(f"<{count}d", index, 16)
        sizes = struct.unpack_from(f"<{count}q", index, 16 + 8 * count)
        return list(Pieces.timed(times, t0, sizes, body))
    flat = struct.unpack(f"<{len(index) // 8}q", index)
    chunks: list[Chunk] = []
    at = 0
    for i in range(0, len(flat), 2):
        size = flat[i + 1]
        chunks.append((flat[i], body[at : at + size]))
        at += size
    return chunks


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
            _weight(writes), _recording_rows, writes, puts
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
        await db.executemany(
            _INSERT_BLOB, [(d, len(b), *blob_codec.encode(b)) for d, b in blobs.items()]
        )
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


def _weight(writes: Sequence[RecordingWrite]) -> int:
    """The bytes of the whole bodies and canonical texts of ``writes`` (what is cut)."""
    return sum(
        len(w.interaction.canonical)
        + sum(len(m.content or b"") for m in w.interaction.legs.values() if m.chunks is None)
        for w in writes
    )


def _recording_rows(
    writes: Sequence[RecordingWrite], puts: sqlite_content.Puts | None
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], dict[str, bytes]]:
    """The rows of ``writes``; with ``puts``, whole bodies and canonical texts as chunks."""
    interactions: list[tuple[Any, ...]] = []
    messages: list[tuple[Any, ...]] = []
    blobs: dict[str, bytes] = {}
    # Legs that share one chunk list (a passthrough stream's upstream and client legs) are
    # joined and stored once.
    digests: dict[int, str] = {}
    for write in writes:
        i = write.interaction
        canonical: tuple[Any, ...] = (i.canonical,)
        if puts is not None:
            canonical = ("", puts.put(f"canonical:{i.scope}", i.canonical.encode()))
        interactions.append(
            (
                i.id,
                i.session,
                i.started_us,
                i.scope,
                i.key,
                i.key_version,
                i.method,
                i.route,
                i.model,
                int(i.stream),
                canonical[0],
                i.status,
                i.endpoint,
                i.plan,
                i.ttfb_us,
                i.duration_us,
                i.truncated,
                i.error,
                i.mode,
                orjson.dumps(i.minted).decode() if i.minted else None,
                i.credential,
                *canonical[1:],
            )
        )
        for leg, message in i.legs.items():
            chunk: tuple[Any, ...] = ()
            if message.chunks is None and puts is not None:
                # The previous turn's body of this leg is the base a resent history slices.
                digest = ""
                chunk = (puts.put(f"{leg}:{i.scope}", message.content or b""),)
            elif message.chunks is None:
                body = message.content or b""
                digest = hashlib.sha256(body).hexdigest()
                blobs.setdefault(digest, body)
            else:
                # A stream never repeats another (ids, timing), so it is named, not hashed:
                # hashing half a megabyte per recorded stream would be CPU for nothing.
                digest = digests.get(id(message.chunks), "")
                if not digest:
                    digest = digests[id(message.chunks)] = f"stream:{i.id}:{leg}"
                    blobs[digest] = message.body()
                chunk = (None,) if puts is not None else ()
            index_codec, index = blob_codec.RAW, None
            if message.chunks is not None:
                index_codec, index = blob_codec.encode(pack_index(message.chunks))
            messages.append(
                (
                    i.id,
                    leg,
                    message.method,
                    message.url,
                    message.status,
                    orjson.dumps(message.headers).decode(),
                    digest,
                    index,
                    index_codec,
                    *chunk,
                )
            )
    return interactions, messages, blobs


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


def _interaction(row: Sequence[Any], canonical: str) -> Interaction:
    return Interaction(
        id=row[0],
        session=row[1],
        started_us=row[2],
        scope=row[3],
        key=row[4],
        key_version=row[5],
        method=row[6],
        route=row[7],
        model=row[8],
        stream=bool(row[9]),
        canonical=canonical,
        status=row[11],
        endpoint=row[12],
        plan=row[13],
        ttfb_us=row[14],
        duration_us=row[15],
        truncated=row[16],
        error=row[17],
        mode=row[18],
        minted=orjson.loads(row[19]) if row[19] else {},
        credential=row[20],
        source="db",
    )


async def _interactions(
    db: aiosqlite.Connection, rows: Sequence[Sequence[Any]], memo: dict[bytes, bytes]
) -> list[Interaction]:
    """Rows as interactions, their canonical texts read from chunks where they are kept."""
    names = [bytes(row[21]) for row in rows if row[21] is not None]
    texts = iter(await sqlite_content.read(db, names, memo)) if names else iter(())
    return [
        _interaction(row, next(texts).decode() if row[21] is not None else row[10]) for row in rows
    ]


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
        chunked = [bytes(row[10]) for row in rows if row[10] is not None]
        bodies = iter(await sqlite_content.read(db, chunked, memo)) if chunked else iter(())
        for row in rows:
            iid, leg, method, url, status, headers, index, index_codec, codec, data, chunk = row
            if chunk is not None:
                data = next(bodies)
            elif data is None:
                raise LookupError(f"recording {iid}: the body of {leg} is missing")
            else:
                data = blob_codec.decode(codec, data)
            message = Message(
                headers=[(k, v) for k, v in orjson.loads(headers)],
                method=method,
                url=url,
                status=status,
            )
            if index is not None:
                message.chunks = unpack_chunks(blob_codec.decode(index_codec, index), data)
            else:
                message.content = data
            by_id[iid].legs[leg] = message
    for interaction in interactions:
        interaction.legs = {leg: interaction.legs[leg] for leg in LEGS if leg in interaction.legs}


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
