"""Usage accounting in SQLite: how ``UsageRecord`` writes are stored and how usage is summed.

Owns the SQL of the ``usage`` table (created by migration 1); ``store.sqlite`` calls it.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import aiosqlite

from llmitm.exchange.usage import UsageRecord
from llmitm.store.api import GROUP_BY, GroupBy, UsageRow, to_us

# Fixed SQL per grouping: the column expression is chosen from this table, never formatted
# from the caller's value.
_GROUP_EXPR: dict[GroupBy, str] = {
    "endpoint": "endpoint",
    "model": "model",
    "route": "route",
    "day": "strftime('%Y-%m-%d', at_us / 1000000, 'unixepoch')",
}

_INSERT = """
    INSERT INTO usage (at_us, endpoint, model, route,
                       input_tokens, cached_tokens, output_tokens, reasoning_tokens)
    VALUES (?, ?, ?, ?, ?, ?, ?, ?)
"""


async def apply_usage(db: aiosqlite.Connection, records: Sequence[UsageRecord]) -> None:
    await db.executemany(
        _INSERT,
        [
            (
                to_us(r.at),
                r.endpoint,
                r.model,
                r.route,
                r.input_tokens,
                r.cached_tokens,
                r.output_tokens,
                r.reasoning_tokens,
            )
            for r in records
        ],
    )


async def usage_rows(
    db: aiosqlite.Connection, since: datetime | None, group_by: GroupBy
) -> list[UsageRow]:
    if group_by not in _GROUP_EXPR:
        raise ValueError(f"group_by must be one of {', '.join(GROUP_BY)}, not {group_by!r}")
    expr = _GROUP_EXPR[group_by]  # from the fixed table above: safe to format into SQL
    sql = f"""
        SELECT {expr} AS key, count(*),
               sum(input_tokens), sum(cached_tokens),
               sum(output_tokens), sum(reasoning_tokens)
        FROM usage
        WHERE at_us >= ?
        GROUP BY key
        ORDER BY key
    """
    floor = to_us(since) if since is not None else -(2**63)
    async with db.execute(sql, (floor,)) as cursor:
        rows = await cursor.fetchall()
    return [
        UsageRow(
            key=str(key),
            requests=int(n),
            input_tokens=int(i),
            cached_tokens=int(c),
            output_tokens=int(o),
            reasoning_tokens=int(r),
        )
        for key, n, i, c, o, r in rows
    ]
