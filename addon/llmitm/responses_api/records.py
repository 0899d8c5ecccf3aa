"""The state of the local Responses API as records: what is kept, the writes that change it
and the reads this package needs. Nothing here names a database: ``llmitm.store`` applies the
writes and implements :class:`ResponseReader` (SQLite, or memory when no database is kept).

- :class:`StoredResponse`: one response llmitm answered over a chat-only endpoint — its
  Response object (output included), the input items of its request (with ids), and the id it
  continues. Chains are rebuilt by following ``previous_response_id``.
- events of a background response, numbered by ``sequence_number``, for stream resume;
- :class:`ResponseOwner`: which native Responses endpoint owns an id it minted (its state
  stays there; llmitm only remembers where to send retrieve/delete/… for it);
- the reasoning seal key (:mod:`llmitm.responses_api.seal`), created once with the schema.

Each record keeps the ``credential`` that created it: an HMAC fingerprint
(:mod:`llmitm.replay.fingerprint`, under the store's own key) or ``"anonymous"``, never the
credential itself. Every read takes a ``credential``: ``None`` reads any record (a
shared, single-tenant proxy), a fingerprint reads only that credential's records — a record made by
an older llmitm, which kept no credential, belongs to nobody and is read only by ``None``.

Times are seconds since the epoch (floats); ``expires_at`` ``None`` means kept until deleted.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar


@dataclass(frozen=True, slots=True)
class StoredResponse:
    id: str
    response: dict[str, Any]
    """The Response object as a client gets it from ``GET`` (``output`` included)."""
    input_items: list[dict[str, Any]]
    """This request's own input items, each with an ``id`` (not the ancestors')."""
    previous_response_id: str | None
    created_at: float
    expires_at: float | None = None
    credential: str | None = None
    """Who created it (fingerprint or ``"anonymous"``); ``None``: an older llmitm's row."""

    @property
    def status(self) -> str:
        return str(self.response.get("status") or "")

    @property
    def background(self) -> bool:
        return self.response.get("background") is True

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at

    def items(self) -> list[dict[str, Any]]:
        """Its input items, then its output items."""
        output = self.response.get("output")
        items = [*self.input_items, *(output if isinstance(output, list) else [])]
        return [item for item in items if isinstance(item, dict)]


@dataclass(frozen=True, slots=True)
class ResponseOwner:
    id: str
    endpoint: str
    created_at: float
    expires_at: float | None = None
    credential: str | None = None
    """The client credential that had the endpoint mint the id (as on :class:`StoredResponse`)."""


def readable(created_by: str | None, credential: str | None) -> bool:
    """Whether a record ``created_by`` one credential is ``credential``'s (``None``: anyone's)."""
    return credential is None or created_by == credential


# -- writes (through the store's queue) ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class ResponseSaved:
    """Insert or replace a stored response (a later save of the same id wins)."""

    kind: ClassVar[str] = "response"
    record: StoredResponse


@dataclass(frozen=True, slots=True)
class ResponseDeleted:
    """Forget a response, its events and its owner entry."""

    kind: ClassVar[str] = "response_delete"
    id: str


@dataclass(frozen=True, slots=True)
class ResponseEvents:
    """Stream events of a (background) response, as ``(sequence_number, JSON bytes)``."""

    kind: ClassVar[str] = "response_events"
    response_id: str
    events: tuple[tuple[int, bytes], ...]


@dataclass(frozen=True, slots=True)
class ResponseOwned:
    kind: ClassVar[str] = "response_owner"
    owner: ResponseOwner


@dataclass(frozen=True, slots=True)
class ResponsesPurged:
    """Drop every record whose ``expires_at`` is before ``now``."""

    kind: ClassVar[str] = "responses_purge"
    now: float


RESPONSE_WRITES: tuple[type, ...] = (
    ResponseSaved,
    ResponseDeleted,
    ResponseEvents,
    ResponseOwned,
    ResponsesPurged,
)


class ResponseReader(abc.ABC):
    """The reads of the local Responses API. Implementations see every write submitted
    before the call (they flush first), so a client that reads right after its create
    finds what it created."""

    @abc.abstractmethod
    async def response(
        self, response_id: str, credential: str | None = None
    ) -> StoredResponse | None:
        """The stored response, or ``None`` (never stored, deleted, not ``credential``'s)."""

    @abc.abstractmethod
    async def chain(
        self, response_id: str, max_depth: int = 10_000, credential: str | None = None
    ) -> list[StoredResponse]:
        """``response_id`` and its ancestors, oldest first (empty when it is unknown). The
        walk stops at an ancestor that is no longer stored, or is not ``credential``'s."""

    @abc.abstractmethod
    async def items(
        self, item_ids: Sequence[str], credential: str | None = None
    ) -> dict[str, dict[str, Any]]:
        """Stored input or output items by id (for ``item_reference``) of
        ``credential``'s responses; unknown ids are left out."""

    @abc.abstractmethod
    async def events(self, response_id: str, after: int = -1) -> list[bytes]:
        """The stored events with ``sequence_number > after``, in order (JSON bytes)."""

    @abc.abstractmethod
    async def owner(self, response_id: str) -> ResponseOwner | None:
        """The native endpoint that owns ``response_id``, when llmitm saw it mint it (any
        credential's: the caller compares :attr:`ResponseOwner.credential`, since a foreign
        id must be refused, not sent to the endpoint as an unknown one)."""

    @abc.abstractmethod
    async def seal_key(self) -> bytes | None:
        """The 32-byte reasoning seal key kept with the schema (``None``: none yet)."""

    @abc.abstractmethod
    async def fingerprint_key(self) -> bytes | None:
        """The key credential fingerprints are made with (``None``: none kept, the caller
        makes one for the process)."""
