"""Every value a SQLite file holds, read-only, for ``rec check-secrets``.

A secret scan must see what a database really keeps, whatever the schema: each text or blob
value of each table, with recorded bodies (zstd-compressed by :mod:`store.blob_codec`, which
hides them from a scan of the raw file) opened first.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

from llmitm.errors import StoreError
from llmitm.store import blob_codec

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
                for row in connection.execute(f'SELECT * FROM "{table.replace(chr(34), "")}"'):
                    for value in row:
                        if isinstance(value, str):
                            yield value, False
                        elif isinstance(value, bytes):
                            plain = _uncompressed(value)
                            yield (plain or value).decode("utf-8", "replace"), plain is not None
        finally:
            connection.close()
    except sqlite3.Error as exc:
        raise UnreadableDatabase(str(exc)) from None


def _uncompressed(value: bytes) -> bytes | None:
    """A zstd frame's content (how the store keeps bodies), else ``None``."""
    if not value.startswith(_ZSTD_MAGIC):
        return None
    try:
        return blob_codec.decode(blob_codec.ZSTD, value)
    except Exception:  # not a frame after all: the raw scan judged its bytes
        return None
