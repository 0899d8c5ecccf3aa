"""The store: the only code in llmitm that touches a database.

``api`` is the interface (``Store``, the write and row dataclasses) that the rest of llmitm
programs against; ``sqlite`` is the embedded SQLite implementation; ``writer`` is the
non-blocking write queue every backend shares; ``migrations`` holds the SQLite schema steps.
``content`` cuts large values (request bodies, canonical texts, stored input items) into
content-addressed chunks shared across turns and across recordings and Responses state;
``content_chunks`` turns a writer's values into the chunk table's rows, and
``sqlite_content`` keeps them, reference-counted, in one table. ``postgres`` (with its
``postgres_*`` modules) is the same store over a PostgreSQL database that several proxies
share; ``open.store_for`` picks the backend from where the store lives.
"""

from llmitm.store.api import (
    GROUP_BY,
    GroupBy,
    Store,
    StoreStats,
    StoreUnreachable,
    UsageRow,
    Write,
)
from llmitm.store.location import default_store_path
from llmitm.store.location_url import is_server_url
from llmitm.store.migrations import MIGRATIONS, Migration, SchemaTooNew
from llmitm.store.open import store_for
from llmitm.store.sqlite import DEFAULT_APPLIERS, SqliteApplier, SqliteStore

__all__ = [
    "DEFAULT_APPLIERS",
    "GROUP_BY",
    "MIGRATIONS",
    "GroupBy",
    "Migration",
    "SchemaTooNew",
    "SqliteApplier",
    "SqliteStore",
    "Store",
    "StoreStats",
    "StoreUnreachable",
    "UsageRow",
    "Write",
    "default_store_path",
    "is_server_url",
    "store_for",
]
