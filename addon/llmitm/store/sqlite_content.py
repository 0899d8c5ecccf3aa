"""The shared chunk table in SQLite: putting values in (``store.content`` cuts them),
reference counting, and reading them back. Recordings (bodies, canonical texts) and the
Responses state (input items, response objects) all keep their large values here, so
a text that is a request body's, a translated body's, a match key's and a stored item's is
one row.

Each chunk row counts its references: one per owner column that names it (a recording leg,
an interaction's canonical text, a stored response…) and one per reference from a recipe.
Owners put their values through a ``Puts`` (``store.content_chunks``: which adds their
references; :class:`SqlitePuts` commits them here) and call
:meth:`ContentStore.release` when they are deleted or replaced; a chunk whose count falls to
zero is deleted, and releases the chunks its recipe refers to in turn. Everything happens in
the writer's transaction, so a crash leaves counts and rows as the last commit had them.
:func:`check` recounts from the owners, for tests and ``rec verify --db``.

A server database implements the same thing with the same statements: the cutting and the
putting back (``store.content``) know no database; the table is ``name bytea primary key``,
the upsert is PostgreSQL's ``ON CONFLICT`` as here, and ``json_each(?)`` over a list of ids
becomes ``= ANY($1)``. Here a commit's check that the chunks it counts on still exist holds
until its upsert because SQLite has one writer at a time (``BEGIN IMMEDIATE``); with
concurrent writers the check must lock those rows (``SELECT … FOR SHARE``), or a release
running beside it could delete one in between.
"""

from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import aiosqlite

from llmitm.store import blob_codec, content
from llmitm.store.content import LEAF, Bases
from llmitm.store.content_chunks import OWNER_COLUMNS, TABLE, Puts, cut

__all__ = ["OWNER_COLUMNS", "TABLE", "ContentStore", "SqlitePuts", "cut"]


class ContentStore:
    """The write side, kept by one store's writer: the recent values each lane slices from."""

    def __init__(self, bases: Bases | None = None) -> None:
        self.bases = bases or Bases()
        self._ready: bool | None = None

    async def ready(self, db: aiosqlite.Connection) -> bool:
        """Whether the schema has the chunk table (a store opened with fewer migration steps
        writes values where it always did)."""
        if self._ready is None:
            self._ready = await has_chunks(db)
        return self._ready

    def session(self) -> SqlitePuts:
        return SqlitePuts(self.bases)

    async def release(self, db: aiosqlite.Connection, names: Iterable[bytes | None]) -> None:
        """Drop one reference per name given (``None`` skipped); delete what nothing uses."""
        counts = Counter(bytes(n) for n in names if n is not None)
        while counts:
            name, count = counts.popitem()
            async with db.execute(
                f"UPDATE {TABLE} SET refs = refs - ? WHERE name = ? RETURNING refs, kind, codec, "
                "CASE WHEN kind = 'recipe' THEN data END",
                (count, name),
            ) as cursor:
                row = await cursor.fetchone()
            if row is None or row[0] > 0:
                continue
            await db.execute(f"DELETE FROM {TABLE} WHERE name = ?", (name,))
            self.bases.forget(name)
            if row[1] != LEAF:
                counts.update(content.children_of(blob_codec.decode(row[2], row[3])))


class SqlitePuts(Puts):
    """:class:`~llmitm.store.content_chunks.Puts` committed to SQLite."""

    async def commit(self, db: aiosqlite.Connection) -> bool:
        """Write the chunks and counts; ``False`` (nothing written, the recent values
        forgotten) when a value was sliced from a chunk that is gone — another process
        (``rec prune``) deleted it — and the values must be put again."""
        rows = self.rows(await self._query(db, self.wanted()))
        if rows is None:
            return False
        if rows:
            await db.executemany(
                f"INSERT INTO {TABLE} (name, kind, refs, size, codec, data) "
                "VALUES (?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (name) DO UPDATE SET refs = refs + excluded.refs",
                rows,
            )
        return True

    async def _query(self, db: aiosqlite.Connection, names: set[bytes]) -> set[bytes]:
        """Which of ``names`` are stored; fills :attr:`replaced` on the way."""
        found: set[bytes] = set()
        listed = list(names)
        replacing = self._replacing
        self.replaced = []
        for start in range(0, max(len(listed), 1), 500):
            part = listed[start : start + 500]
            sql = f"SELECT 0, name FROM {TABLE} WHERE name IN ({','.join('?' * len(part))})"
            params: tuple[Any, ...] = tuple(part)
            if replacing is not None:
                sql += f" UNION ALL SELECT 1, * FROM ({replacing[0]})"
                params += replacing[1]
                replacing = None
            async with db.execute(sql, params) as cursor:
                async for old, name in cursor:
                    if old:
                        self.replaced.append(name)
                    else:
                        found.add(bytes(name))
        return found


_WRITERS: weakref.WeakKeyDictionary[aiosqlite.Connection, ContentStore] = (
    weakref.WeakKeyDictionary()
)


def content_of(db: aiosqlite.Connection) -> ContentStore:
    """The content store of writer connection ``db``: appliers keep their ``(db, writes)``
    shape, and the recent values live as long as the connection."""
    store = _WRITERS.get(db)
    if store is None:
        store = _WRITERS[db] = ContentStore()
    return store


async def has_chunks(db: aiosqlite.Connection) -> bool:
    async with db.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (TABLE,)
    ) as cursor:
        return await cursor.fetchone() is not None


async def read(
    db: aiosqlite.Connection, names: Sequence[bytes], memo: dict[bytes, bytes] | None = None
) -> list[bytes]:
    """The contents of ``names``, in order. ``memo`` carries what was put together across
    calls (one per read of many values: consecutive turns share their slices)."""
    memo = {} if memo is None else memo
    rows: dict[bytes, tuple[str, bytes]] = {}
    todo = {bytes(n) for n in names if bytes(n) not in memo}
    while todo:
        wanted = list(todo)
        todo = set()
        for start in range(0, len(wanted), 500):
            part = wanted[start : start + 500]
            marks = ",".join("?" * len(part))
            sql = f"SELECT name, kind, codec, data FROM {TABLE} WHERE name IN ({marks})"
            async with db.execute(sql, part) as cursor:
                async for name, kind, codec, data in cursor:
                    data = blob_codec.decode(codec, data)
                    rows[bytes(name)] = (kind, data)
                    if kind != LEAF:
                        todo.update(
                            c for c in content.children_of(data) if c not in memo and c not in rows
                        )
        missing = [n for n in wanted if n not in rows]
        if missing:
            raise LookupError(f"chunk {missing[0].hex()} is missing from the store")

    def fetch(name: bytes) -> tuple[str, bytes]:
        return rows[name]

    return [content.assemble(bytes(n), fetch, memo) for n in names]


async def check(db: aiosqlite.Connection) -> list[str]:
    """What is wrong with the chunk table, one line each (empty: nothing): references to
    chunks that are missing, counts that differ from the references found, chunks nothing
    refers to."""
    found: Counter[bytes] = Counter()
    for table, column in OWNER_COLUMNS:
        async with db.execute(f"SELECT {column} FROM {table} WHERE {column} IS NOT NULL") as cursor:
            async for (name,) in cursor:
                found[bytes(name)] += 1
    stored: dict[bytes, int] = {}
    async with db.execute(f"SELECT name, kind, refs, codec, data FROM {TABLE}") as cursor:
        async for name, kind, refs, codec, data in cursor:
            stored[bytes(name)] = refs
            if kind != LEAF:
                found.update(content.children_of(blob_codec.decode(codec, data)))
    return content.reference_problems(found, stored)
