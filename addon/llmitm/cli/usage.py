"""``llmitm usage``: token usage from the store, as a rich table or JSON.

Reads the store read-only (never migrates a database a running proxy is writing): a SQLite
file, or a PostgreSQL database given as ``--db postgresql://…`` (password from
``PGPASSWORD``). Argument and database problems are one line on stderr and exit status 2.
"""

from __future__ import annotations

import asyncio
import re
import sys
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

from llmitm.errors import UserError
from llmitm.store import GROUP_BY, SchemaTooNew, UsageRow, default_store_path, store_for
from llmitm.store.location_url import display_location

EXIT_USAGE = 2
_RELATIVE = re.compile(r"(\d+)([dhm])")
_UNITS = {"d": "days", "h": "hours", "m": "minutes"}
_COLUMNS = ("requests", "input_tokens", "cached_tokens", "output_tokens", "reasoning_tokens")


class UsageError(UserError, ValueError):
    """Bad arguments or an unreadable database: one line for the user."""


def parse_since(value: str | None, now: datetime | None = None) -> datetime | None:
    """``YYYY-MM-DD`` (UTC midnight), or ``7d`` / ``24h`` / ``30m`` before ``now``."""
    if value is None:
        return None
    now = now or datetime.now(UTC)
    relative = _RELATIVE.fullmatch(value.strip())
    if relative:
        return now - timedelta(**{_UNITS[relative.group(2)]: int(relative.group(1))})
    try:
        day = datetime.strptime(value.strip(), "%Y-%m-%d")
    except ValueError:
        raise UsageError(
            f"--since: expected YYYY-MM-DD or a span such as 7d, 24h, 30m; got {value!r}"
        ) from None
    return day.replace(tzinfo=UTC)


async def read_rows(db: str, since: datetime | None, by: str) -> list[UsageRow]:
    store = store_for(db, read_only=True)
    db = store.location  # never the password, if the URL had one
    try:
        await store.open()
    except FileNotFoundError:
        raise UsageError(f"no usage database at {db} (run the proxy first, or pass --db)") from None
    except SchemaTooNew as exc:
        raise UsageError(f"{db}: {exc}") from None
    except Exception as exc:  # not a database, unreadable, unreachable, …
        raise UsageError(f"{db}: cannot read the database ({exc})") from None
    try:
        return await store.usage_rows(since, by)  # type: ignore[arg-type]
    except Exception as exc:
        raise UsageError(f"{db}: cannot read usage ({exc})") from None
    finally:
        await store.close()


def totals(rows: list[UsageRow]) -> dict[str, int]:
    return {column: sum(getattr(row, column) for row in rows) for column in _COLUMNS}


def as_json(db: str, since: datetime | None, by: str, rows: list[UsageRow]) -> bytes:
    document: dict[str, Any] = {
        "db": str(db),
        "since": since.isoformat() if since else None,
        "by": by,
        "rows": [asdict(row) for row in rows],
        "total": totals(rows),
    }
    return orjson.dumps(document, option=orjson.OPT_INDENT_2) + b"\n"


def print_table(db: str, since: datetime | None, by: str, rows: list[UsageRow]) -> None:
    from rich.console import Console
    from rich.table import Table

    span = f" since {since:%Y-%m-%d %H:%M} UTC" if since else ""
    table = Table(title=f"Token usage by {by}{span}", caption=str(db), show_footer=bool(rows))
    total = totals(rows)
    table.add_column(by, footer="total")
    for column in _COLUMNS:
        label = column.removesuffix("_tokens")
        table.add_column(label, justify="right", footer=f"{total[column]:,}")
    for row in rows:
        table.add_row(row.key or "(none)", *(f"{getattr(row, c):,}" for c in _COLUMNS))
    console = Console()
    if not rows:
        console.print(f"No usage recorded{span} in {db}.")
        return
    console.print(table)


def add_parser(commands: Any) -> None:
    usage = commands.add_parser(
        "usage",
        help="token usage recorded by the proxy, summed per endpoint, model, day or route",
        description="Sum the token usage the proxy recorded (read-only; safe while it runs).",
    )
    usage.add_argument(
        "--db",
        help="the store: a SQLite file or postgresql://user@host:port/db, password in "
        "PGPASSWORD (default: $XDG_DATA_HOME/llmitm/llmitm.db)",
    )
    usage.add_argument("--since", help="YYYY-MM-DD (UTC), or a span such as 7d, 24h, 30m")
    # Checked by the command, not argparse: a mistake is one line, exit 2.
    usage.add_argument("--by", default="endpoint", help="endpoint (default), model, day, route")
    usage.add_argument("--json", action="store_true", help="JSON for machines")


def usage_command(db: str | None, since: str | None, by: str, json: bool) -> int:
    try:
        if by not in GROUP_BY:
            raise UsageError(f"--by: expected one of {', '.join(GROUP_BY)}; got {by!r}")
        floor = parse_since(since)
        location = db or str(default_store_path())
        rows = asyncio.run(read_rows(location, floor, by))
        path = display_location(location)
    except UsageError as exc:
        print(f"llmitm usage: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if json:
        sys.stdout.buffer.write(as_json(path, floor, by, rows))
        sys.stdout.buffer.flush()
    else:
        print_table(path, floor, by, rows)
    return 0
