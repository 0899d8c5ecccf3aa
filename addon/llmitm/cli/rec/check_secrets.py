"""``llmitm rec check-secrets``: every credential-shaped value in databases or folders, named
by file, recording and field; exit 1 when there is any."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.console import Console

from llmitm.cli.rec.common import EXIT_FOUND
from llmitm.cli.rec.scanning import scan_paths


def add_parser(sub: Any) -> None:
    secrets = sub.add_parser("check-secrets", help="scan databases or folders for credentials")
    secrets.add_argument("paths", nargs="+", metavar="PATH")


async def command(args: argparse.Namespace, console: Console) -> int:
    found = await scan_paths([Path(p).expanduser() for p in args.paths])
    for line in found:
        console.print(f"[red]secret[/] {line}", markup=True, soft_wrap=True)
    if not found:
        console.print("[green]✓[/] no credential-shaped values found")
    return EXIT_FOUND if found else 0
