"""Choosing the store from where it lives: the one place that maps a location to a backend,
so the proxy and the commands above ``store/`` never name one.

A ``postgresql://`` or ``postgres://`` URL is a PostgreSQL database (``store.postgres``);
anything else is a SQLite file path (``store.sqlite``). Only a server database has shared
routing state (``open_fleet``): proxies on one SQLite file each decide alone. The PostgreSQL
driver is imported only when a URL asks for it.
"""

from __future__ import annotations

from pathlib import Path

from llmitm.store.api import Store
from llmitm.store.fleet import FleetState
from llmitm.store.location_url import is_server_url


def store_for(
    location: str | Path, *, read_only: bool = False, start_offline: bool = False
) -> Store:
    """The store at ``location``: a PostgreSQL database for a URL, else a SQLite file
    (``~`` expanded). ``read_only`` as the backends define it (no migration, no writes);
    ``start_offline``: a server database that cannot be reached at ``open`` is waited for in
    the background (the proxy) instead of failing the open (the commands). A file is never
    out of reach."""
    text = str(location)
    if is_server_url(text):
        from llmitm.store.postgres import PostgresStore

        return PostgresStore(text, read_only=read_only, start_offline=start_offline)
    from llmitm.store.sqlite import SqliteStore

    return SqliteStore(Path(text).expanduser(), read_only=read_only)


def open_fleet(location: str | None, *, lease: float, timeout: float) -> FleetState | None:
    """The shared routing state behind the store at ``location``; ``None`` when the store is
    a local file or none (each proxy then decides alone). Not opened yet."""
    if location is None or not is_server_url(location):
        return None
    from llmitm.store.postgres_fleet import PostgresFleet

    return PostgresFleet(location, lease=lease, timeout=timeout)
