"""The shared chunk table in PostgreSQL: the same content-addressed, reference-counted
chunks as ``store.sqlite_content`` (whose docstring describes them), written by several
proxies at once.

What differs from SQLite is concurrency. SQLite has one writer at a time; here each proxy's
writer runs its own transaction beside the others', so:

- a commit's check of which chunks already exist locks the rows it finds
  (``SELECT … FOR UPDATE``, in name order) until its transaction ends. A release running in
  another proxy cannot then drop such a chunk to zero and delete it before this commit counts
  its reference; a chunk deleted before the check is simply not found and is written anew
  (or, when this proxy only had a slice of it, the values are put again, as after
  ``rec prune``). The lock is exclusive rather than shared: two commits that both share-lock
  a chunk and then both upsert it would deadlock upgrading their locks;
- the upsert adds to the count (``ON CONFLICT … DO UPDATE SET refs = refs + EXCLUDED.refs``),
  so two proxies inserting the same new chunk at once end with the sum of their references;
- a release decrements under the row's lock (``UPDATE … RETURNING``) and deletes only a row
  at zero, in name order too. Locks taken in a consistent order make deadlocks rare; the
  store retries a batch PostgreSQL picked as a deadlock's victim.
"""

from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import Iterable, Sequence

import asyncpg

from llmitm.store import blob_codec, content
from llmitm.store.content import LEAF, Bases
from llmitm.store.content_chunks import OWNER_COLUMNS, TABLE, Puts

__all__ = [
    "OWNER_COLUMNS",
    "PgContentStore",
    "PgPuts",
    "check",
    "content_of",
    "lock_owners",
    "read",
]


class PgContentStore:
    """The write side, kept by one store's writer connection: the recent values each lane
    slices from (as ``sqlite_content.ContentStore``)."""

    def __init__(self, bases: Bases | None = None) -> None:
        self.bases = bases or Bases()

    def session(self) -> PgPuts:
        return PgPuts(self.bases)

    async def release(self, db: asyncpg.Connection, names: Iterable[bytes | None]) -> None:
        """Drop one reference per name given (``None`` skipped); delete what nothing uses."""
        counts = Counter(bytes(n) for n in names if n is not None)
        while counts:
            name = min(counts)  # name order: the same lock order in every proxy
            count = counts.pop(name)
            row = await db.fetchrow(
                f"UPDATE {TABLE} SET refs = refs - $1 WHERE name = $2 RETURNING refs, kind, "
                "codec, CASE WHEN kind = 'recipe' THEN data END",
                count,
                name,
            )
            if row is None or row[0] > 0:
                continue
            await db.execute(f"DELETE FROM {TABLE} WHERE name = $1 AND refs <= 0", name)
            self.bases.forget(name)
            if row[1] != LEAF:
                counts.update(content.children_of(blob_codec.decode(row[2], row[3])))


class PgPuts(Puts):
    """The values one applier call stores (``content_chunks.Puts``), committed with a locking
    existence check. :meth:`replacing` takes a query with ``$n`` parameters here."""

    async def commit(self, db: asyncpg.Connection) -> bool:
        rows = self.rows(await self._locked(db, self.wanted()))
        if rows is None:
            return False
        if rows:
            rows.sort()  # name order, as every lock here is taken
            await db.executemany(
                f"INSERT INTO {TABLE} (name, kind, refs, size, codec, data) "
                "VALUES ($1, $2, $3, $4, $5, $6) "
                f"ON CONFLICT (name) DO UPDATE SET refs = {TABLE}.refs + EXCLUDED.refs",
                rows,
            )
        return True

    async def _locked(self, db: asyncpg.Connection, names: set[bytes]) -> set[bytes]:
        """Which of ``names`` are stored, locked till the transaction ends; fills
        :attr:`replaced` on the way."""
        self.replaced = []
        if self._replacing is not None:
            sql, params = self._replacing
            self.replaced = [row[0] for row in await db.fetch(sql, *params)]
        if not names:
            return set()
        rows = await db.fetch(
            f"SELECT name FROM {TABLE} WHERE name = ANY($1::bytea[]) ORDER BY name FOR UPDATE",
            sorted(names),
        )
        return {bytes(row[0]) for row in rows}


async def lock_owners(db: asyncpg.Connection, namespace: str, ids: Sequence[str]) -> None:
    """Take, till the transaction ends, a lock on each owner id (``namespace``-qualified)
    that is about to be written again. A row's old chunks are read, its new ones counted
    and the old released in one transaction; when two proxies write the same id (a response
    saved by both, an interaction recorded by both) and the row does not exist yet, there
    is no row to lock, and each would release nothing while the second overwrote the
    first's references. An advisory lock per id (taken in one order everywhere) makes them
    take turns; an unrelated id sharing a hash only waits a moment."""
    await db.execute(
        "SELECT pg_advisory_xact_lock(k) FROM (SELECT DISTINCT hashtextextended($1 || x, 0) AS k "
        "FROM unnest($2::text[]) AS x ORDER BY k) AS keys",
        namespace,
        list(ids),
    )


_WRITERS: weakref.WeakKeyDictionary[asyncpg.Connection, PgContentStore] = (
    weakref.WeakKeyDictionary()
)


def content_of(db: asyncpg.Connection) -> PgContentStore:
    """The content store of writer connection ``db`` (a reconnect starts a fresh one: the
    recent values are only a hint)."""
    store = _WRITERS.get(db)
    if store is None:
        store = _WRITERS[db] = PgContentStore()
    return store


async def read(
    db: asyncpg.Connection, names: Sequence[bytes], memo: dict[bytes, bytes] | None = None
) -> list[bytes]:
    """The contents of ``names``, in order (``memo`` as in ``sqlite_content.read``)."""
    memo = {} if memo is None else memo
    rows: dict[bytes, tuple[str, bytes]] = {}
    todo = {bytes(n) for n in names if bytes(n) not in memo}
    while todo:
        wanted = list(todo)
        todo = set()
        found = await db.fetch(
            f"SELECT name, kind, codec, data FROM {TABLE} WHERE name = ANY($1::bytea[])", wanted
        )
        for name, kind, codec, data in found:
            data = blob_codec.decode(codec, data)
            rows[bytes(name)] = (kind, data)
            if kind != LEAF:
                todo.update(c for c in content.children_of(data) if c not in memo and c not in rows)
        missing = [n for n in wanted if n not in rows]
        if missing:
            raise LookupError(f"chunk {missing[0].hex()} is missing from the store")

    def fetch(name: bytes) -> tuple[str, bytes]:
        return rows[name]

    return [content.assemble(bytes(n), fetch, memo) for n in names]


async def check(db: asyncpg.Connection) -> list[str]:
    """What is wrong with the chunk table (``sqlite_content.check``), read in one snapshot
    (a repeatable-read transaction) so writers running beside it do not show as errors."""
    async with db.transaction(isolation="repeatable_read", readonly=True):
        found: Counter[bytes] = Counter()
        for table, column in OWNER_COLUMNS:
            for (name,) in await db.fetch(
                f"SELECT {column} FROM {table} WHERE {column} IS NOT NULL"
            ):
                found[bytes(name)] += 1
        stored: dict[bytes, int] = {}
        for name, kind, refs, codec, data in await db.fetch(
            f"SELECT name, kind, refs, codec, data FROM {TABLE}"
        ):
            stored[bytes(name)] = refs
            if kind != LEAF:
                found.update(content.children_of(blob_codec.decode(codec, data)))
    return content.reference_problems(found, stored)
