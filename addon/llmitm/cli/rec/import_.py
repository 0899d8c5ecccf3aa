"""``llmitm rec import``: a recordings folder loaded into the store, stamped as imported now.
(The trailing underscore: ``import`` is a keyword.)"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from llmitm.cli.rec.common import open_store, progress
from llmitm.store import folder as folder_files
from llmitm.store.recordings import RecordingWrite


def add_parser(sub: Any) -> None:
    imp = sub.add_parser("import", help="load a recordings folder into the store")
    imp.add_argument("folder")
    imp.add_argument("--db")


async def command(args: argparse.Namespace, console: Console) -> int:
    interactions = folder_files.read_folder(Path(args.folder))
    # Files carry positions, not times (``started_us`` is the file's order): stored as
    # imported now, in that order, or ``prune --older-than`` would take them for 1970's.
    now_us = time.time_ns() // 1000
    for interaction in interactions:
        interaction.started_us += now_us
    store = await open_store(args.db, write=True)
    try:
        for interaction in progress(interactions, "importing"):
            store.submit(RecordingWrite(interaction))
        await store.flush()
    finally:
        await store.close()
    console.print(f"imported {len(interactions)} recording(s) into {store.location}")
    return 0
