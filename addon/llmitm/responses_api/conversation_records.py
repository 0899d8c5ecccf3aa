"""The Conversations state as records: what is kept, the writes that change it and the reads
the local Conversations API needs. Nothing here names a database: ``llmitm.store`` applies
the writes and implements :class:`ConversationReader` (SQLite, or memory).

- :class:`StoredConversation`: a conversation's id, creation time, ``metadata`` and the
  credential fingerprint that created it (as on stored responses, :mod:`.records`);
- its items, in the order they were added (each an item object with an ``id``), appended
  by :class:`ConversationItemsAdded` and removed one by one.

Reads take a ``credential`` like the Responses reads: ``None`` reads any conversation, a
fingerprint only that credential's.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, ClassVar


@dataclass(frozen=True, slots=True)
class StoredConversation:
    id: str
    created_at: float
    metadata: dict[str, str] = field(default_factory=dict)
    credential: str | None = None


# -- writes (through the store's queue) ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class ConversationSaved:
    """Insert a conversation or replace its metadata (its items stay)."""

    kind: ClassVar[str] = "conversation"
    conversation: StoredConversation


@dataclass(frozen=True, slots=True)
class ConversationDeleted:
    """Forget a conversation and its items."""

    kind: ClassVar[str] = "conversation_delete"
    id: str


@dataclass(frozen=True, slots=True)
class ConversationItemsAdded:
    """Append items (each with an ``id``) to a conversation, after those it has."""

    kind: ClassVar[str] = "conversation_items"
    conversation_id: str
    items: tuple[dict[str, Any], ...]


@dataclass(frozen=True, slots=True)
class ConversationItemDeleted:
    kind: ClassVar[str] = "conversation_item_delete"
    conversation_id: str
    item_id: str


ConversationWrite = (
    ConversationSaved | ConversationDeleted | ConversationItemsAdded | ConversationItemDeleted
)
CONVERSATION_WRITES: tuple[type, ...] = (
    ConversationSaved,
    ConversationDeleted,
    ConversationItemsAdded,
    ConversationItemDeleted,
)


class ConversationReader(abc.ABC):
    """The reads of the local Conversations API; they see every write submitted before."""

    @abc.abstractmethod
    async def conversation(
        self, conversation_id: str, credential: str | None = None
    ) -> StoredConversation | None:
        """The conversation, or ``None`` (never made, deleted, not ``credential``'s)."""

    @abc.abstractmethod
    async def conversation_items(self, conversation_id: str) -> list[dict[str, Any]]:
        """Its items, oldest first (the caller has checked whose it is)."""
