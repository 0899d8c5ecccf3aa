"""The store's interface: what the rest of llmitm may ask of persistent storage.

This module owns the contract, not an implementation. Nothing here names a database: a
write is a plain dataclass, a read returns plain dataclasses. ``store.sqlite`` is the
embedded implementation, ``store.postgres`` the one a fleet of proxies shares, and
``store.open.store_for`` picks one from where the store lives, so no code above ``store/``
knows which it talks to.

The contract that matters most is ``submit``: it is called from mitmproxy hooks and stream
callables, so it never awaits, never blocks and returns at once even when the database is
slow. Writes are applied later, in order, by the store's own writer; ``flush`` waits for
them.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import TYPE_CHECKING, ClassVar, Literal, Protocol, Self

from llmitm.errors import StoreError

if TYPE_CHECKING:
    from llmitm.replay.model import Interaction
    from llmitm.store.recordings import ReplayMissRecord

GroupBy = Literal["endpoint", "model", "day", "route"]
GROUP_BY: tuple[GroupBy, ...] = ("endpoint", "model", "day", "route")


class Write(Protocol):
    """One unit of data to persist: a small, immutable dataclass.

    ``kind`` names it in logs and statistics. Each backend knows how to apply each kind it
    supports (for SQLite: ``store.sqlite``'s appliers), so a write carries data only and the
    code that makes it never sees the database.
    """

    kind: ClassVar[str]


@dataclass(frozen=True, slots=True)
class UsageRow:
    """Usage summed over one group: ``key`` is the endpoint, model, route or UTC day
    (``YYYY-MM-DD``) the rows share; ``requests`` counts the records summed."""

    key: str
    requests: int
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    reasoning_tokens: int


def to_us(at: datetime) -> int:
    """A usage record's time as every backend's ``usage`` table keeps it: UTC microseconds
    since the epoch; a naive datetime counts as UTC."""
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    delta = at - datetime(1970, 1, 1, tzinfo=UTC)
    # Exact integer arithmetic: timestamp() goes through a float.
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


@dataclass(frozen=True, slots=True)
class StoreStats:
    """Write counters of one store object: each write given to ``submit`` ends up
    written, failed or dropped (``submitted`` counts those accepted into the queue).

    ``dropped`` writes never reached the queue (it was full, or the store was not open);
    ``failed`` writes reached the writer and raised, and were logged with their kind.
    """

    submitted: int = 0
    written: int = 0
    failed: int = 0
    dropped: int = 0
    batches: int = 0
    queued: int = 0


class StoreUnreachable(StoreError, ConnectionError):
    """The store's database cannot be reached now: a read asked while a server database is
    down (writes never raise it: they wait in the queue)."""


class Store(abc.ABC):
    """Persistent storage for usage, stored responses and recordings.

    Lifecycle: ``await open()`` on the event loop that will own the store (mitmproxy's
    ``running``), ``submit`` from anywhere, ``await close()`` at the end (``done``). Also an
    async context manager.
    """

    @abc.abstractmethod
    async def open(self) -> None:
        """Create or upgrade the storage and start the writer."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Stop accepting writes, persist every write already accepted, release resources."""

    @abc.abstractmethod
    def submit(self, write: Write) -> None:
        """Queue ``write`` and return at once; never blocks, never awaits.

        Safe from the event loop (hooks, stream callables) and from other threads. When the
        writer cannot keep up, the write is dropped and counted rather than delaying the
        proxy. Raises ``TypeError`` only for a write kind this store cannot apply (a bug,
        not a runtime condition).
        """

    @abc.abstractmethod
    async def flush(self) -> None:
        """Wait until every write submitted before this call is settled: durable, or failed
        and logged. For tests, shutdown and commands that read what they just wrote."""

    @abc.abstractmethod
    def stats(self) -> StoreStats:
        """A snapshot of the write counters."""

    @abc.abstractmethod
    async def usage_rows(
        self, since: datetime | None = None, group_by: GroupBy = "endpoint"
    ) -> list[UsageRow]:
        """Usage summed per ``group_by`` value, over records at or after ``since`` (all when
        ``None``), ordered by key."""

    def reachable(self) -> bool:
        """Whether the writer holds a working connection now. Only a server database can be
        out of reach (its writes then wait in the queue); a file always answers ``True``."""
        return True

    @property
    @abc.abstractmethod
    def location(self) -> str:
        """Where the store lives, for messages: a file's path, or a server database's URL
        without its password."""

    # -- recordings (store.recordings writes; replay, ``llmitm rec``)

    @abc.abstractmethod
    async def recordings(
        self, scope: str | None = None, limit: int | None = None
    ) -> list[Interaction]:
        """Recorded interactions without their legs, oldest first (``limit``: the newest)."""

    @abc.abstractmethod
    async def load_recordings(self, scope: str | None = None) -> list[Interaction]:
        """Recorded interactions with all four legs, in arrival order (replay, export)."""

    @abc.abstractmethod
    async def recording(self, ident: str) -> Interaction | None:
        """One interaction by id or unique id prefix, with its legs."""

    @abc.abstractmethod
    async def request_urls(self) -> list[tuple[str, str]]:
        """``(id, URL)`` of each recording's client request, without loading the legs."""

    @abc.abstractmethod
    async def last_replay_miss(self) -> ReplayMissRecord | None:
        """The last strict replay miss recorded, if any."""

    @abc.abstractmethod
    async def content_problems(self) -> list[str]:
        """What is wrong with the shared content chunks (missing chunks, reference counts
        that differ from the references found), one line each; empty when all is well."""

    @abc.abstractmethod
    async def fingerprint_key(self) -> bytes | None:
        """The key credential fingerprints are made with, shared by every process using
        this store (``None``: this store keeps none)."""

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
