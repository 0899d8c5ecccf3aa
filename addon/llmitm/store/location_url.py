"""Where a store lives, as text: a SQLite file's path or a PostgreSQL URL. Pure string work
(no driver), shared by the factory (``store.open``), the PostgreSQL store and the commands'
messages; a password is only ever detected here, to be removed or refused."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

SERVER_SCHEMES = ("postgresql", "postgres")


def is_server_url(location: str) -> bool:
    """Whether ``location`` names a database server rather than a file."""
    return "://" in location and urlsplit(location).scheme in SERVER_SCHEMES


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


def display_location(location: str | Path) -> str:
    """``location`` as messages show it: a file's path with ``~`` expanded, a database URL
    without its password."""
    text = str(location)
    return without_password(text) if is_server_url(text) else str(Path(text).expanduser())


def missing(location: str | Path) -> bool:
    """Whether ``location`` is a file that does not exist (a server database is never
    "missing" before it is asked)."""
    text = str(location)
    return not is_server_url(text) and not Path(text).expanduser().is_file()
