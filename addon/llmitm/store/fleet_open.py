"""Which shared routing state a store location names: the one place that maps a location to
a backend, so the proxy asks for "the fleet of this store" and never names a database."""

from __future__ import annotations

from llmitm.store.fleet import FleetState, is_shared
from llmitm.store.postgres_fleet import PostgresFleet


def open_fleet(location: str | None, *, lease: float, timeout: float) -> FleetState | None:
    """The shared routing state behind the store at ``location``; ``None`` when the store is
    a local file or none (each proxy then decides alone). Not opened yet."""
    if location is None or not is_shared(location):
        return None
    return PostgresFleet(location, lease=lease, timeout=timeout)
