"""``llmitm rec ls``: the recordings of the store or of a folder, as a table or JSON."""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console
from rich.table import Table

from llmitm.cli.rec.common import add_source_options, open_store, summary
from llmitm.replay.model import Interaction
from llmitm.store import folder as folder_files


def add_parser(sub: Any) -> None:
    ls = sub.add_parser("ls", help="list recordings")
    add_source_options(ls)
    ls.add_argument("--scope")
    ls.add_argument("--limit", type=int, default=50, help="the newest N (default 50; 0: all)")
    ls.add_argument("--json", action="store_true")


async def command(args: argparse.Namespace, console: Console) -> int:
    if args.folder:
        interactions = folder_files.read_folder(Path(args.folder))
    else:
        store = await open_store(args.db)
        try:
            interactions = await store.recordings(args.scope, args.limit or None)
        finally:
            await store.close()
    if args.scope:
        interactions = [i for i in interactions if i.scope == args.scope]
    if args.json:
        sys.stdout.buffer.write(orjson.dumps([summary(i) for i in interactions]) + b"\n")
        return 0
    table = Table(title=f"{len(interactions)} recording(s)")
    for column in ("id", "when", "scope", "call", "model", "plan", "status", "TTFB ms", "ms"):
        table.add_column(column, justify="right" if column.endswith("ms") else "left")
    for i in interactions:
        status = str(i.status) + (" ✂" if i.truncated else "")
        call = f"{i.method} {i.route}" + (" ⇶" if i.stream else "")
        table.add_row(
            i.id,
            _when(i),
            i.scope,
            call,
            i.model,
            i.plan,
            status,
            _ms(i.ttfb_us),
            _ms(i.duration_us),
        )
    console.print(table)
    return 0


def _when(interaction: Interaction) -> str:
    if interaction.source != "db":
        return f"#{interaction.started_us}"
    return datetime.fromtimestamp(interaction.started_us / 1e6, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _ms(value: int | None) -> str:
    return "" if value is None else f"{value / 1000:.1f}"
