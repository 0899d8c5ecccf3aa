"""``llmitm rec verify``: a folder's files against its manifest, its secrets, and every
recording's key recomputed under today's rules (a database: its shared chunks' reference
counts too); exit 1 on any problem."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.console import Console

from llmitm.cli.rec.common import EXIT_FOUND, open_store, progress
from llmitm.cli.rec.scanning import scan_paths
from llmitm.replay.keys import KeyOptions
from llmitm.replay.rekey import request_key
from llmitm.store import folder as folder_files


def add_parser(sub: Any) -> None:
    verify = sub.add_parser("verify", help="manifest, secrets, and keys recomputed today")
    verify.add_argument("folder", nargs="?")
    verify.add_argument("--db")


async def command(args: argparse.Namespace, console: Console) -> int:
    problems: list[str] = []
    options = KeyOptions()
    if args.folder:
        # Missing, unlisted, broken or orphan files and blobs first: reading needs them whole.
        problems += folder_files.folder_problems(Path(args.folder))
        if problems:
            return _report_problems(problems, 0, console)
        manifest = folder_files.read_manifest(Path(args.folder))
        settings = manifest.get("settings", {})
        options = KeyOptions(
            profile=settings.get("profile", "default"), ignore=tuple(settings.get("ignore", ()))
        )
        interactions = folder_files.read_folder(Path(args.folder))
        problems += [f"secret {where}" for where in await scan_paths([Path(args.folder)])]
    else:
        store = await open_store(args.db)
        try:
            # Counts first: a missing chunk would stop the reading below.
            problems += [f"store: {problem}" for problem in await store.content_problems()]
            if problems:
                return _report_problems(problems, 0, console)
            interactions = await store.load_recordings()
        finally:
            await store.close()
    migrate = f"llmitm rec migrate {args.folder}" if args.folder else "llmitm rec migrate --db …"
    for interaction in progress(interactions, "verifying"):
        key = request_key(interaction, options)
        if key is None:
            problems.append(f"{interaction.id}: no client request")
            continue
        if key.key != interaction.key:
            problems.append(
                f"{interaction.id}: key {interaction.key} was recorded, {key.key} is computed "
                f"today (run `{migrate}`)"
            )
    return _report_problems(problems, len(interactions), console)


def _report_problems(problems: list[str], verified: int, console: Console) -> int:
    for problem in problems:
        console.print(f"[red]✗[/] {problem}")
    if not problems:
        console.print(f"[green]✓[/] {verified} recording(s) verified")
    return EXIT_FOUND if problems else 0
