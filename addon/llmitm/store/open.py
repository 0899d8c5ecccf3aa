"""Choosing the store from where it lives: the one place that maps a location to a backend,
so the proxy and the commands above ``store/`` never name one.

A ``postgresql://`` or ``postgres://`` URL is a PostgreSQL database (``store.postgres``);
anything else is a SQLite file path (``store.sqlite``). The PostgreSQL driver is imported
only when a URL asks for it.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from llmitm.store.api import Store

SERVER_SCHEMES = ("postgresql", "postgres")


def is_server_url(location: str) -> bool:
    """Whether ``location`` names a database server rather than a file."""
    return "://" in location and urlsplit(location).scheme in SERVER_SCHEMES


def store_for(location: str | Path, *, read_only: bool = False) -> Store:
    """The store at ``location``: a PostgreSQL database for a URL, else a SQLite file
    (``~`` expanded). ``read_only`` as the backends define it (no migration, no writes)."""
    text = str(location)
    if is_server_url(text):
        from llmitm.store.postgres import PostgresStore

        return PostgresStore(text, read_only=read_only)
    from llmitm.store.sqlite import SqliteStore

    return SqliteStore(Path(text).expanduser(), read_only=read_only)


def missing(location: str | Path) -> bool:
    """Whether ``location`` is a file that does not exist (a server database is never
    "missing" before it is asked)."""
    text = str(location)
    return not is_server_url(text) and not Path(text).expanduser().is_file()


def without_password(url: str) -> str:
    """``url`` as it may be shown or logged: any password removed (never the whole DSN)."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        user, _, host = netloc.rpartition("@")
        netloc = f"{user.partition(':')[0]}@{host}"
    query = "&".join(
        p for p in parts.query.split("&") if p and not p.lower().startswith("password=")
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def has_password(url: str) -> bool:
    """Whether ``url`` carries a password (in its user part or as ``?password=``)."""
    parts = urlsplit(url)
    in_query = any(p.lower().startswith("password=") for p in parts.query.split("&"))
    return parts.password is not None or in_query
