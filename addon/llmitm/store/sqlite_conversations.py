"""Conversations in SQLite: how the writes of ``store.conversations`` are applied and its
reads answered. Owns the SQL of the ``conversations`` and ``conversation_items`` tables
(migration 7); ``store.sqlite`` calls it. Items are JSON blobs, in a per-conversation
position order."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import aiosqlite
import orjson

from llmitm.responses_api.conversation_records import (
    ConversationDeleted,
    ConversationItemDeleted,
    ConversationItemsAdded,
    ConversationSaved,
    StoredConversation,
)

_OWNED = "(? IS NULL OR credential = ?)"


async def apply_saved(db: aiosqlite.Connection, writes: Sequence[ConversationSaved]) -> None:
    await db.executemany(
        "INSERT INTO conversations (id, created_at, metadata, credential) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (id) DO UPDATE SET metadata = excluded.metadata",
        [
            (c.id, c.created_at, orjson.dumps(c.metadata), c.credential)
            for c in (w.conversation for w in writes)
        ],
    )


async def apply_deleted(db: aiosqlite.Connection, writes: Sequence[ConversationDeleted]) -> None:
    ids = [(w.id,) for w in writes]
    await db.executemany("DELETE FROM conversations WHERE id = ?", ids)
    await db.executemany("DELETE FROM conversation_items WHERE conversation_id = ?", ids)


async def apply_items(db: aiosqlite.Connection, writes: Sequence[ConversationItemsAdded]) -> None:
    for write in writes:
        # Positions continue after the conversation's last item: appends keep their order.
        async with db.execute(
            "SELECT COALESCE(MAX(position), -1) FROM conversation_items WHERE conversation_id = ?",
            (write.conversation_id,),
        ) as cursor:
            row = await cursor.fetchone()
        start = int(row[0]) + 1 if row else 0
        await db.executemany(
            "INSERT OR REPLACE INTO conversation_items (conversation_id, position, item_id, item) "
            "SELECT ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM conversations WHERE id = ?)",
            [
                (write.conversation_id, start + offset, item["id"], orjson.dumps(item),
                 write.conversation_id)
                for offset, item in enumerate(write.items)
            ],
        )  # fmt: skip


async def apply_item_deleted(
    db: aiosqlite.Connection, writes: Sequence[ConversationItemDeleted]
) -> None:
    await db.executemany(
        "DELETE FROM conversation_items WHERE conversation_id = ? AND item_id = ?",
        [(w.conversation_id, w.item_id) for w in writes],
    )


async def read_conversation(
    db: aiosqlite.Connection, conversation_id: str, credential: str | None
) -> StoredConversation | None:
    sql = (
        f"SELECT id, created_at, metadata, credential FROM conversations WHERE id = ? AND {_OWNED}"
    )
    async with db.execute(sql, (conversation_id, credential, credential)) as cursor:
        row = await cursor.fetchone()
    if not row:
        return None
    owner = row[3] if isinstance(row[3], str) else None
    return StoredConversation(str(row[0]), float(row[1]), orjson.loads(row[2]), owner)


async def read_items(db: aiosqlite.Connection, conversation_id: str) -> list[dict[str, Any]]:
    sql = "SELECT item FROM conversation_items WHERE conversation_id = ? ORDER BY position"
    async with db.execute(sql, (conversation_id,)) as cursor:
        rows = await cursor.fetchall()
    return [orjson.loads(row[0]) for row in rows]
