"""Usage accounting in PostgreSQL: the ``usage`` table's SQL (``store.sqlite_usage`` is the
SQLite twin; the rows and the sums are the same)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import asyncpg

from llmitm.exchange.usage import UsageRecord
from llmitm.store.api import GROUP_BY, GroupBy, UsageRow, to_us

# Fixed SQL per grouping, never formatted from the caller's value.
_GROUP_EXPR: dict[GroupBy, str] = {
    "endpoint": "endpoint",
    "model": "model",
    "route": "route",
    "day": "to_char(to_timestamp(at_us / 1000000) AT TIME ZONE 'UTC', 'YYYY-MM-DD')",
}


async def apply_usage(db: asyncpg.Connection, records: Sequence[UsageRecord]) -> None:
    await db.executemany(
        "INSERT INTO usage (at_us, endpoint, model, route, input_tokens, cached_tokens, "
        "output_tokens, reasoning_tokens) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        [
            (to_us(r.at), r.endpoint, r.model, r.route, r.input_tokens, r.cached_tokens,
             r.output_tokens, r.reasoning_tokens)
            for r in records
        ],
    )  # fmt: skip


async def usage_rows(
    db: asyncpg.Connection, since: datetime | None, group_by: GroupBy
) -> list[UsageRow]:
    if group_by not in _GROUP_EXPR:
        raise ValueError(f"group_by must be one of {', '.join(GROUP_BY)}, not {group_by!r}")
    expr = _GROUP_EXPR[group_by]  # from the fixed table above: safe to format into SQL
    sql = f"""
        SELECT {expr} AS key, count(*), sum(input_tokens), sum(cached_tokens),
               sum(output_tokens), sum(reasoning_tokens)
        FROM usage WHERE at_us >= $1 GROUP BY key ORDER BY key
    """
    floor = to_us(since) if since is not None else -(2**63)
    return [
        UsageRow(str(key), int(n), int(i), int(c), int(o), int(r))
        for key, n, i, c, o, r in await db.fetch(sql, floor)
    ]
