"""``llmitm rec diff``: how the requests of two recordings differ, or how the last replay miss
differs from its closest recording; exit 1 when they differ."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console

from llmitm.cli.rec.common import (
    EXIT_FOUND,
    RecError,
    add_source_options,
    find,
    open_store,
    print_diff,
)
from llmitm.replay.pool import canonical_diff


def add_parser(sub: Any) -> None:
    diff = sub.add_parser("diff", help="the request difference of two recordings, or the last miss")
    add_source_options(diff)
    diff.add_argument("ids", nargs="*", metavar="ID")
    diff.add_argument("--last-miss", action="store_true")


async def command(args: argparse.Namespace, console: Console) -> int:
    if args.last_miss:
        store = await open_store(args.db)
        try:
            miss = await store.last_replay_miss()
        finally:
            await store.close()
        if miss is None:
            raise RecError("no replay miss recorded in this database")
        console.print(
            f"last miss: scope={miss.scope} key={miss.key} ({miss.reason}); "
            f"closest recording: {miss.closest_id or 'none'}"
        )
        lines = canonical_diff(miss.closest_canonical or "", miss.canonical, limit=400)
    else:
        if len(args.ids) != 2:
            raise RecError("give two recording ids, or --last-miss")
        a, b = [await find(args, ident) for ident in args.ids]
        lines = canonical_diff(a.canonical, b.canonical, limit=400)
    print_diff(console, lines)
    return EXIT_FOUND if lines else 0
