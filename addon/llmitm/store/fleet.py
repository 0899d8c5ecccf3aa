"""The fleet's shared routing state: what every proxy using one shared database must agree on.

This module owns the contract, not an implementation: concurrency slots held across proxies,
the proxies' membership (heartbeats), cooldowns and affinity pins that one proxy learns and
the others use. ``store.postgres_fleet`` implements it on PostgreSQL; ``store.open`` picks
the implementation from the store's location, so nothing above ``store/`` learns which
database it talks to. A store that is a local file (SQLite) or none has no fleet: each proxy
decides alone, from its own memory, as it always did.

Every method may raise :class:`FleetUnavailable` (the database is unreachable, or did not
answer within the call's timeout); callers fall back to deciding alone. No method waits
longer than the timeout the state was opened with.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from llmitm.errors import StoreError
from llmitm.store.location_url import is_server_url

"""Store locations that name a shared database server rather than a local file."""


class FleetUnavailable(StoreError):
    """The shared state could not be reached or did not answer in time."""


@dataclass(frozen=True, slots=True)
class Slot:
    """One request's concurrency slot in the shared table: ``caps`` are the endpoint's and the
    endpoint-model's (``None``: no cap), checked together when the slot is taken."""

    id: str
    endpoint: str
    model: str | None
    cap: int | None
    model_cap: int | None
    pin: Pin | None = None
    """An affinity to remember for every proxy once this slot is taken (its ``endpoint`` is
    this slot's): a new conversation's, known where the request goes before it gets there."""


@dataclass(frozen=True, slots=True)
class Member:
    """One proxy of the fleet as the shared state sees it."""

    id: str
    host: str
    pid: int
    alive: bool
    heartbeat_age: float
    """Seconds since its last heartbeat (database time)."""
    slots: dict[str, int] = field(default_factory=dict)
    """Slots it holds, per endpoint."""


@dataclass(frozen=True, slots=True)
class Cooldown:
    """An endpoint (``model`` ``None``) or endpoint-model resting for ``remaining`` more
    seconds, because ``reason`` (an outcome kind) was seen by some proxy."""

    endpoint: str
    model: str | None
    remaining: float
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Pin:
    """An affinity: ``kind`` ``"response"`` (a response id → the endpoint that minted it) or
    ``"conversation"`` (a conversation key → the endpoint that served its last turn)."""

    kind: str
    key: str
    endpoint: str
    ttl: float


Notice = Callable[[str, dict[str, object]], None]
"""What a proxy hears from the others: ``("free", {"endpoint": …})`` when a slot frees,
``("cool", {"endpoint", "model", "remaining", "reason"})`` when a cooldown starts."""


class FleetState(abc.ABC):
    """The shared routing state of one proxy's fleet (``proxy`` is this proxy's id)."""

    proxy: str
    lease: float
    """Seconds without a heartbeat after which a proxy counts as dead and its slots free."""

    @abc.abstractmethod
    async def open(self, on_notice: Notice) -> None:
        """Create or upgrade the shared tables, join the fleet, and start hearing
        :data:`Notice` s (``on_notice`` is called on the event loop)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Leave the fleet: this proxy's slots are freed at once, not after the lease."""

    @abc.abstractmethod
    async def heartbeat(self, held: Sequence[Slot]) -> int:
        """Prove this proxy alive for another lease, and free the slots of proxies whose
        lease ran out; how many slots were freed. ``held`` are the slots this proxy still
        holds: if the fleet had already counted it dead (its database link was down for a
        whole lease), it joins again with them, since those requests are still running."""

    @abc.abstractmethod
    async def take(self, slots: Sequence[Slot]) -> dict[str, bool]:
        """Take each of ``slots`` (by id: whether it was taken) if its endpoint and
        endpoint-model are under their caps across the whole fleet — atomically (two proxies
        never both take the last one), first come first served among slots of one endpoint.
        The pin of each slot taken is put as :meth:`pin` puts it, in the same call (of one
        key's pins among the slots taken, the last one's)."""

    @abc.abstractmethod
    async def release(self, slots: Sequence[Slot]) -> None:
        """Free slots (idempotent); for each whose cap was full, tell the fleet it is free."""

    @abc.abstractmethod
    async def cool(self, cooldown: Cooldown) -> None:
        """Start (or extend: never shorten) a cooldown for every proxy."""

    @abc.abstractmethod
    async def cooldowns(self) -> list[Cooldown]:
        """Every cooldown still running."""

    @abc.abstractmethod
    async def pin(self, pins: Sequence[Pin]) -> None:
        """Remember affinities for every proxy (a pin put again refreshes its TTL)."""

    @abc.abstractmethod
    async def pinned(self, asked: Sequence[tuple[str | None, str | None]]) -> list[dict[str, str]]:
        """For each ``(response id, conversation key)`` asked (several requests' questions in
        one call), the live pins of either, by kind."""

    @abc.abstractmethod
    async def members(self) -> list[Member]:
        """The proxies of the fleet, alive or not yet swept, with the slots they hold."""

    @abc.abstractmethod
    async def slots_held(self) -> int:
        """Slots held across the fleet by live proxies (0 once every request ended)."""


def is_shared(location: str | None) -> bool:
    """Whether a store location names a shared database server (a fleet's store)."""
    return location is not None and is_server_url(location)
