"""The store tests' two backends behind one face: the same test makes a SQLite store (a
file under ``tmp_path``) or a PostgreSQL store (a fresh database on the real server of
``tests/helpers/postgres.py``), and reads what it wrote with that backend's own client
(``sqlite3``, ``psql``), not through the store under test."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from llmitm.store import Migration, Store
from llmitm.store.migrations import MIGRATIONS as SQLITE_MIGRATIONS
from llmitm.store.postgres import PostgresStore
from llmitm.store.postgres_migrations import MIGRATIONS as POSTGRES_MIGRATIONS
from llmitm.store.sqlite import SqliteStore


@dataclass(frozen=True, slots=True)
class Note:
    """A write kind defined outside the store, as later features add them: data, one
    migration, one applier per backend. The CHECK makes "bad" notes fail in the writer."""

    kind: ClassVar[str] = "note"
    text: str


async def _sqlite_notes(db: Any, notes: Sequence[Note]) -> None:
    await db.executemany("INSERT INTO notes (text) VALUES (?)", [(n.text,) for n in notes])


async def _postgres_notes(db: Any, notes: Sequence[Note]) -> None:
    await db.executemany("INSERT INTO notes (text) VALUES ($1)", [(n.text,) for n in notes])


@dataclass
class Backend:
    """One backend for one test: ``location(name)`` is the same database for the same name."""

    name: str
    tmp_path: Path
    new_database: Callable[[], str] | None = None
    psql: Callable[[str, str], str] | None = None
    _databases: dict[str, str] = field(default_factory=dict)

    @property
    def migrations(self) -> tuple[Migration, ...]:
        return SQLITE_MIGRATIONS if self.name == "sqlite" else POSTGRES_MIGRATIONS

    def location(self, name: str = "s") -> str:
        if self.name == "sqlite":
            return str(self.tmp_path / f"{name}.db")
        if name not in self._databases:
            assert self.new_database is not None
            self._databases[name] = self.new_database()
        return self._databases[name]

    def store(self, name: str = "s", **kwargs: Any) -> Store:
        if self.name == "sqlite":
            return SqliteStore(self.location(name), **kwargs)
        return PostgresStore(self.location(name), **kwargs)

    def notes_step(self, version: int | None = None) -> Migration:
        number = version or len(self.migrations) + 1
        return Migration(
            number, "notes", ("CREATE TABLE notes (text TEXT NOT NULL CHECK (text != 'bad'))",)
        )

    def note_store(self, name: str = "s", **kwargs: Any) -> Store:
        applier = _sqlite_notes if self.name == "sqlite" else _postgres_notes
        return self.store(
            name, migrations=(*self.migrations, self.notes_step()), appliers={Note: applier},
            **kwargs,
        )  # fmt: skip

    def query(self, sql: str, name: str = "s") -> list[tuple[str, ...]]:
        """Rows of ``sql`` read by the backend's own client, each value as text."""
        if self.name == "sqlite":
            with sqlite3.connect(self.location(name)) as db:
                return [tuple(str(v) for v in row) for row in db.execute(sql)]
        assert self.psql is not None
        dsn = self.location(name)
        out = self.psql(sql, dsn.rsplit("/", 1)[1])
        return [tuple(line.split("|")) for line in out.splitlines() if line]

    def count(self, table: str = "usage", name: str = "s") -> int:
        return int(self.query(f"SELECT count(*) FROM {table}", name)[0][0])

    def schema_version(self, name: str = "s") -> int:
        sql = (
            "PRAGMA user_version" if self.name == "sqlite" else "SELECT version FROM llmitm_schema"
        )
        return int(self.query(sql, name)[0][0])

    def payload(self, name: str = "s") -> int:
        """Bytes the database keeps in its rows' values (pages hold some slack besides)."""
        if self.name == "sqlite":
            with sqlite3.connect(self.location(name)) as db:
                total = 0
                tables = db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
                for (table,) in tables.fetchall():
                    columns = [row[1] for row in db.execute(f"PRAGMA table_info({table})")]
                    lengths = " + ".join(f"COALESCE(length({c}), 0)" for c in columns)
                    sql = f"SELECT COALESCE(SUM({lengths}), 0) FROM {table}"
                    total += db.execute(sql).fetchone()[0]
                return total
        tables = [row[0] for row in self.query(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'", name
        )]  # fmt: skip
        sums = " + ".join(
            f"(SELECT COALESCE(SUM(pg_column_size(t.*) - 24), 0) FROM {t} AS t)" for t in tables
        )
        return int(self.query(f"SELECT {sums}", name)[0][0])
