"""Conversations in PostgreSQL: the ``conversations`` and ``conversation_items`` tables' SQL
(``store.sqlite_conversations`` is the SQLite twin). Items are JSON bytes in a
per-conversation position order."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import asyncpg
import orjson

from llmitm.responses_api.conversation_records import (
    ConversationDeleted,
    ConversationItemDeleted,
    ConversationItemsAdded,
    ConversationSaved,
    StoredConversation,
)


async def apply_saved(db: asyncpg.Connection, writes: Sequence[ConversationSaved]) -> None:
    await db.executemany(
        "INSERT INTO conversations (id, created_at, metadata, credential) "
        "VALUES ($1, $2, $3, $4) ON CONFLICT (id) DO UPDATE SET metadata = EXCLUDED.metadata",
        [
            (c.id, c.created_at, orjson.dumps(c.metadata), c.credential)
            for c in (w.conversation for w in writes)
        ],
    )


async def apply_deleted(db: asyncpg.Connection, writes: Sequence[ConversationDeleted]) -> None:
    ids = [w.id for w in writes]
    await db.execute("DELETE FROM conversations WHERE id = ANY($1::text[])", ids)
    await db.execute("DELETE FROM conversation_items WHERE conversation_id = ANY($1::text[])", ids)


async def apply_items(db: asyncpg.Connection, writes: Sequence[ConversationItemsAdded]) -> None:
    for write in writes:
        # Lock the conversation so two proxies appending at once take turns: positions
        # continue after the last item, and appends keep their order.
        exists = await db.fetchval(
            "SELECT 1 FROM conversations WHERE id = $1 FOR UPDATE", write.conversation_id
        )
        if not exists:
            continue
        start = await db.fetchval(
            "SELECT COALESCE(MAX(position), -1) + 1 FROM conversation_items "
            "WHERE conversation_id = $1",
            write.conversation_id,
        )
        await db.executemany(
            "INSERT INTO conversation_items (conversation_id, position, item_id, item) "
            "VALUES ($1, $2, $3, $4) ON CONFLICT (conversation_id, position) "
            "DO UPDATE SET item_id = EXCLUDED.item_id, item = EXCLUDED.item",
            [
                (write.conversation_id, start + offset, item["id"], orjson.dumps(item))
                for offset, item in enumerate(write.items)
            ],
        )


async def apply_item_deleted(
    db: asyncpg.Connection, writes: Sequence[ConversationItemDeleted]
) -> None:
    await db.executemany(
        "DELETE FROM conversation_items WHERE conversation_id = $1 AND item_id = $2",
        [(w.conversation_id, w.item_id) for w in writes],
    )


async def read_conversation(
    db: asyncpg.Connection, conversation_id: str, credential: str | None
) -> StoredConversation | None:
    row = await db.fetchrow(
        "SELECT id, created_at, metadata, credential FROM conversations "
        "WHERE id = $1 AND ($2::text IS NULL OR credential = $2)",
        conversation_id,
        credential,
    )
    if row is None:
        return None
    return StoredConversation(str(row[0]), float(row[1]), orjson.loads(row[2]), row[3])


async def read_items(db: asyncpg.Connection, conversation_id: str) -> list[dict[str, Any]]:
    rows = await db.fetch(
        "SELECT item FROM conversation_items WHERE conversation_id = $1 ORDER BY position",
        conversation_id,
    )
    return [orjson.loads(row[0]) for row in rows]
