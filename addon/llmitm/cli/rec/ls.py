"""``llmitm rec ls``: the recordings of the store or of a folder, as a table or JSON.

The table shows each id cut to its shortest unique prefix (``common.short_ids``), never cut
further by a narrow terminal: that prefix is what ``show``, ``diff``, ``export`` and ``prune``
take. The other columns wrap instead."""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console
from rich.table import Table

from llmitm.cli.rec.common import add_source_options, open_store, short_ids, summary
from llmitm.replay.model import Interaction
from llmitm.store import folder as folder_files

COLUMNS = ("when", "scope", "call", "model", "plan", "status", "TTFB ms", "ms")
NARROW = 110
NARROW_DROPS = frozenset({"when", "TTFB ms"})


def add_parser(sub: Any) -> None:
    ls = sub.add_parser("ls", help="list recordings")
    add_source_options(ls)
    ls.add_argument("--scope")
    ls.add_argument("--limit", type=int, default=50, help="the newest N (default 50; 0: all)")
    ls.add_argument("--json", action="store_true")


async def command(args: argparse.Namespace, console: Console) -> int:
    if args.folder:
        interactions = folder_files.read_folder(Path(args.folder))
        every = [i.id for i in interactions]
    else:
        store = await open_store(args.db)
        try:
            interactions = await store.recordings(args.scope, args.limit or None)
            # Prefixes unique among all recordings, not only the ones listed.
            every = [i.id for i in await store.recordings()]
        finally:
            await store.close()
    if args.scope:
        interactions = [i for i in interactions if i.scope == args.scope]
    if args.json:
        sys.stdout.buffer.write(orjson.dumps([summary(i) for i in interactions]) + b"\n")
        return 0
    short = short_ids(every)
    # Narrow terminals lose the columns one reads least, so the rest need not wrap much.
    narrow = console.width < NARROW
    columns = [c for c in COLUMNS if not (narrow and c in NARROW_DROPS)]
    table = Table(title=f"{len(interactions)} recording(s)")
    widest = max((len(short[i.id]) for i in interactions), default=2)
    table.add_column("id", no_wrap=True, min_width=widest)
    for column in columns:
        table.add_column(
            column,
            justify="right" if column.endswith("ms") else "left",
            overflow="fold",  # wrap, never an ellipsis: what is shown can be copied
        )
    for i in interactions:
        cells = {
            "when": _when(i),
            "scope": i.scope,
            "call": f"{i.method} {i.route}" + (" ⇶" if i.stream else ""),
            "model": i.model,
            "plan": i.plan,
            "status": str(i.status) + (" ✂" if i.truncated else ""),
            "TTFB ms": _ms(i.ttfb_us),
            "ms": _ms(i.duration_us),
        }
        table.add_row(short[i.id], *(cells[c] for c in columns))
    console.print(table)
    return 0


def _when(interaction: Interaction) -> str:
    if interaction.source != "db":
        return f"#{interaction.started_us}"
    return datetime.fromtimestamp(interaction.started_us / 1e6, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _ms(value: int | None) -> str:
    return "" if value is None else f"{value / 1000:.1f}"
