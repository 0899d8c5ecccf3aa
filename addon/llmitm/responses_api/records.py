"""The state of the local Responses API as records: what is kept, the writes that change it
and the reads this package needs. Nothing here names a database: ``llmitm.store`` applies the
writes and implements :class:`ResponseReader` (SQLite, or memory when no database is kept).

- :class:`StoredResponse`: one response llmitm answered over a chat-only endpoint — its
  Response object (output included), the input items of its request (with ids), and the id it
  continues. Chains are rebuilt by following ``previous_response_id``.
- events of a background response, numbered by ``sequence_number``, for stream resume;
- :class:`ResponseOwner`: which native Responses endpoint owns an id it minted (its state
  stays there; llmitm only remembers where to send retrieve/delete/… for it);
- the reasoning seal key (:mod:`llmitm.responses_api.seal`), created once with the schema;
- what lets several proxies sharing one store serve each other's responses: a
  :class:`PendingResponse` mark for a response a proxy is answering and will store
  (:mod:`llmitm.responses_api.waiting`), and a :class:`RunLease` per background run — which
  proxy runs it, when that proxy last said it is alive, and whether another proxy asked for
  it to be cancelled or deleted (:mod:`llmitm.responses_api.leases`).

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
from dataclasses import dataclass, field
from typing import Any, ClassVar

import orjson

type ItemJson = tuple[str | None, bytes]
"""An input item as a store keeps it: its id apart, and the rest as JSON (:func:`item_json`)."""


def split_id(item: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """``item`` with its id apart: a string ``id`` that is its first key comes out (the rest,
    rebuilt with the id first, is the item in its order); any other item keeps what it has
    and has ``None`` for id."""
    item_id = item.get("id")
    if isinstance(item_id, str) and next(iter(item)) == "id":
        stripped = dict(item)  # a C-level copy, then one key off: key order is kept
        del stripped["id"]
        return item_id, stripped
    return None, item


def item_json(item: dict[str, Any]) -> ItemJson:
    """:func:`split_id` of ``item``, the rest as ``orjson`` JSON."""
    item_id, rest = split_id(item)
    return item_id, orjson.dumps(rest)


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
    input_json: Sequence[ItemJson] | None = field(default=None, compare=False, repr=False)
    """:func:`item_json` of each of :attr:`input_items`, when the create path made them (a
    resent history's are the last turn's): a store joins them rather than serialise the
    whole history again. ``None``: the store serialises the items."""

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


@dataclass(frozen=True, slots=True)
class PendingResponse:
    """A response a proxy is answering now and will store when it ends: another proxy asked
    for its id waits for it (a bounded time) instead of answering "not found"."""

    id: str
    created_at: float
    credential: str | None = None


@dataclass(frozen=True, slots=True)
class RunLease:
    """The proxy running a background response, as the store sees it.

    ``owner`` is that proxy's random id (one per process); ``heartbeat_at`` the last time it
    said it still runs it (a reader that finds it older than the lease ends the run
    ``failed``); ``cancel_requested_at`` when any proxy asked for a cancel (``None``: never),
    ``delete`` whether that request was a delete (the response goes once the run ends).
    """

    response_id: str
    owner: str
    heartbeat_at: float
    cancel_requested_at: float | None = None
    delete: bool = False

    def stale(self, now: float, lease: float) -> bool:
        return now - self.heartbeat_at > lease


def readable(created_by: str | None, credential: str | None) -> bool:
    """Whether a record ``created_by`` one credential is ``credential``'s (``None``: anyone's)."""
    return credential is None or created_by == credential


# -- writes (through the store's queue) ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class ResponseSaved:
    """Insert or replace a stored response (a later save of the same id wins), and remove
    the id's :class:`ResponsePending` mark."""

    kind: ClassVar[str] = "response"
    record: StoredResponse


@dataclass(frozen=True, slots=True)
class ResponseDeleted:
    """Forget a response, its events, its owner entry and its pending mark — not its run
    lease, which its owner still reads (:class:`RunEnded` removes it)."""

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
    """Drop every record whose ``expires_at`` is before ``now``, every pending mark older
    than ``now - PENDING_MAX_AGE``, and every run lease whose ``heartbeat_at`` is older than
    ``now - PENDING_MAX_AGE`` (a run nobody ended: its owner died and no reader came)."""

    kind: ClassVar[str] = "responses_purge"
    now: float


@dataclass(frozen=True, slots=True)
class ResponsePending:
    """Mark a response as being answered (insert or replace by ``pending.id``). A later
    :class:`ResponseSaved` or :class:`ResponseDeleted` of the id removes the mark;
    :class:`ResponsesPurged` removes marks older than :data:`PENDING_MAX_AGE`."""

    kind: ClassVar[str] = "response_pending"
    pending: PendingResponse


PENDING_MAX_AGE = 3600.0
"""Seconds a pending mark counts: older ones are a proxy that died answering."""


@dataclass(frozen=True, slots=True)
class RunStarted:
    """A background run begins on a proxy: insert or replace its :class:`RunLease`
    (``cancel_requested_at`` ``None``, ``delete`` false). Submitted before the run's first
    :class:`ResponseSaved`, so a reader that finds the response finds its lease."""

    kind: ClassVar[str] = "run_started"
    lease: RunLease


@dataclass(frozen=True, slots=True)
class RunsHeartbeat:
    """``owner`` still runs ``response_ids``: set their leases' ``heartbeat_at`` to ``at``,
    only on leases whose ``owner`` is this one (a lease another proxy ended stays ended)."""

    kind: ClassVar[str] = "runs_heartbeat"
    owner: str
    response_ids: tuple[str, ...]
    at: float


@dataclass(frozen=True, slots=True)
class RunCancelRequested:
    """Ask the proxy running ``response_id`` to cancel it: on its lease (when there is
    one), set ``cancel_requested_at`` to ``at`` unless already set, and ``delete`` to true
    when ``delete`` is (never back to false)."""

    kind: ClassVar[str] = "run_cancel_requested"
    response_id: str
    at: float
    delete: bool = False


@dataclass(frozen=True, slots=True)
class RunEnded:
    """The owner's run reached a terminal status (submitted after its last
    :class:`ResponseSaved` and :class:`ResponseEvents`): remove its lease; when the lease
    says ``delete``, remove the response as :class:`ResponseDeleted` does, in the same
    transaction (it was deleted while it ran, and the owner's last save must not bring it
    back)."""

    kind: ClassVar[str] = "run_ended"
    response_id: str


@dataclass(frozen=True, slots=True)
class StaleRunEnded:
    """A reader ends a run whose owner stopped renewing its lease (killed, or cut off from
    the store). Applied atomically, and only if the run's lease still exists with
    ``heartbeat_at < stale_before``: then ``record`` is saved as by :class:`ResponseSaved`,
    ``events`` are inserted as by :class:`ResponseEvents` (an existing sequence number
    keeps its event) and the lease is removed, as by :class:`RunEnded` (``delete`` honoured).
    Otherwise nothing changes: the owner renewed in time, or another reader ended it first."""

    kind: ClassVar[str] = "run_stale_ended"
    record: StoredResponse
    events: tuple[tuple[int, bytes], ...]
    stale_before: float


RESPONSE_WRITES: tuple[type, ...] = (
    ResponseSaved,
    ResponseDeleted,
    ResponseEvents,
    ResponseOwned,
    ResponsesPurged,
    ResponsePending,
    RunStarted,
    RunsHeartbeat,
    RunCancelRequested,
    RunEnded,
    StaleRunEnded,
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
        """The 32-byte reasoning seal key kept with the schema (``None``: none kept, the
        caller makes one for the process).

        Every proxy sharing the store must read the same key, or a ``store: false`` client's
        sealed reasoning opens only on the proxy that sealed it: the key is made once, when
        the schema is created, in the same transaction, so two proxies creating a store at
        once agree on it (SQLite: ``randomblob(32)`` in the migration, under its lock; a
        server database: ``INSERT … ON CONFLICT DO NOTHING`` then read it back). It is never
        changed afterwards (tokens from before a change would stop opening)."""

    @abc.abstractmethod
    async def pending(self, response_id: str) -> PendingResponse | None:
        """The :class:`PendingResponse` mark of ``response_id`` younger than
        :data:`PENDING_MAX_AGE`, or ``None`` (none, or the response is stored by now)."""

    @abc.abstractmethod
    async def run_lease(self, response_id: str) -> RunLease | None:
        """The lease of the background run of ``response_id`` (``None``: no run, or it
        ended). Callers read the response first, with its credential: the lease has none."""

    @abc.abstractmethod
    async def owned_leases(self, owner: str) -> list[RunLease]:
        """Every lease held by ``owner``, any order: what a proxy polls to learn that another
        one was asked to cancel (or delete) one of its runs, or ended it as stale."""

    @abc.abstractmethod
    async def fingerprint_key(self) -> bytes | None:
        """The key credential fingerprints are made with (``None``: none kept, the caller
        makes one for the process)."""
