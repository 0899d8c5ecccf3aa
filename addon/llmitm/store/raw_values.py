"""Every value a SQLite file holds, read-only, for ``rec check-secrets``.

A secret scan must see what a database really keeps, whatever the schema: each text or blob
value of each table, with recorded bodies (zstd-compressed by :mod:`store.blob_codec`, which
hides them from a scan of the raw file) opened first. Shared chunks (:mod:`store.content`)
are scanned as the values they make up, so a secret cut across two chunks is still whole;
chunk names (binary sha256 digests) are not values.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

from llmitm.errors import StoreError
from llmitm.store import blob_codec, content
from llmitm.store.content_chunks import TABLE as CHUNKS

_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


class UnreadableDatabase(StoreError):
    """The file is not a database SQLite can read."""


def database_values(file: Path) -> Iterator[tuple[str, bool]]:
    """Each text or blob value (as text) and whether it was stored compressed."""
    try:
        connection = sqlite3.connect(f"{file.resolve().as_uri()}?mode=ro", uri=True)
        try:
            tables = [row[0] for row in connection.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'"
            )]  # fmt: skip
            for table in tables:
                if table == CHUNKS:
                    yield from _chunk_values(connection)
                    continue
                cursor = connection.execute(f'SELECT * FROM "{table.replace(chr(34), "")}"')
                names = [column[0] for column in cursor.description]
                for row in cursor:
                    for name, value in zip(names, row, strict=True):
                        if name.endswith("_chunk"):
                            continue  # the name of a chunk, scanned below as its value
                        if isinstance(value, str):
                            yield value, False
                        elif isinstance(value, bytes):
                            plain = _uncompressed(value)
                            yield (plain or value).decode("utf-8", "replace"), plain is not None
        finally:
            connection.close()
    except sqlite3.Error as exc:
        raise UnreadableDatabase(str(exc)) from None


_MEMO_LIMIT = 2048
"""Values kept assembled at most (a recipe's base is mostly the chunk just before it)."""


def _chunk_values(connection: sqlite3.Connection) -> Iterator[tuple[str, bool]]:
    """Each chunk's whole content: a leaf as it is, a recipe put together."""

    def fetch(name: bytes) -> tuple[str, bytes]:
        row = connection.execute(
            f"SELECT kind, codec, data FROM {CHUNKS} WHERE name = ?", (name,)
        ).fetchone()
        if row is None:
            raise UnreadableDatabase(f"chunk {name.hex()} is missing")
        return row[0], blob_codec.decode(row[1], row[2])

    memo: dict[bytes, bytes] = {}
    # Oldest first: a recipe's bases are assembled (and remembered) before it.
    for (name,) in connection.execute(f"SELECT name FROM {CHUNKS} ORDER BY rowid"):
        if len(memo) > _MEMO_LIMIT:
            memo.clear()
        value = content.assemble(bytes(name), fetch, memo)
        yield value.decode("utf-8", "replace"), True


def _uncompressed(value: bytes) -> bytes | None:
    """A zstd frame's content (how the store keeps bodies), else ``None``."""
    if not value.startswith(_ZSTD_MAGIC):
        return None
    try:
        return blob_codec.decode(blob_codec.ZSTD, value)
    except Exception:  # not a frame after all: the raw scan judged its bytes
        return None
