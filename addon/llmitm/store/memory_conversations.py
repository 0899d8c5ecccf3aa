"""Conversations in memory, for a proxy that keeps no store (``llmitm_store=""``): the same
reads and writes as SQLite, lost when the process ends. Bounded: past
``max_conversations`` the oldest conversations (and their items) are forgotten first."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from llmitm.responses_api.conversation_records import (
    ConversationDeleted,
    ConversationItemDeleted,
    ConversationItemsAdded,
    ConversationReader,
    ConversationSaved,
    StoredConversation,
)
from llmitm.responses_api.records import readable


class MemoryConversations(ConversationReader):
    def __init__(self, max_conversations: int = 10_000) -> None:
        self.max_conversations = max_conversations
        self._conversations: OrderedDict[str, StoredConversation] = OrderedDict()
        self._items: dict[str, list[dict[str, Any]]] = {}

    def apply(self, write: object) -> None:
        """Apply one write of ``store.conversations`` (others are not this store's)."""
        if isinstance(write, ConversationSaved):
            conversation = write.conversation
            self._conversations[conversation.id] = conversation
            self._items.setdefault(conversation.id, [])
            while len(self._conversations) > self.max_conversations:
                old, _ = self._conversations.popitem(last=False)
                self._items.pop(old, None)
        elif isinstance(write, ConversationDeleted):
            self._conversations.pop(write.id, None)
            self._items.pop(write.id, None)
        elif isinstance(write, ConversationItemsAdded):
            if write.conversation_id in self._conversations:
                self._items[write.conversation_id].extend(write.items)
        elif isinstance(write, ConversationItemDeleted):
            items = self._items.get(write.conversation_id, [])
            items[:] = [item for item in items if item.get("id") != write.item_id]

    async def conversation(
        self, conversation_id: str, credential: str | None = None
    ) -> StoredConversation | None:
        found = self._conversations.get(conversation_id)
        return found if found is not None and readable(found.credential, credential) else None

    async def conversation_items(self, conversation_id: str) -> list[dict[str, Any]]:
        return list(self._items.get(conversation_id, []))
