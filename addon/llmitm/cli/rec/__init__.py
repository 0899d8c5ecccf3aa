"""``llmitm rec``: look at, compare, move and check recordings.

    llmitm rec ls [--db PATH | --folder DIR] [--scope S] [--limit N] [--json]
    llmitm rec show ID [--db PATH | --folder DIR] [--raw | --json] [--timeline]
    llmitm rec diff A B [--db PATH | --folder DIR]   |   llmitm rec diff --last-miss [--db PATH]
    llmitm rec export DIR [--db PATH | --from-folder DIR] [--scope S] [--id ID]… [--umask]
    llmitm rec export FILE --har | --flows [--db PATH | --from-folder DIR]
    llmitm rec import DIR [--db PATH]
    llmitm rec verify (DIR | --db PATH)
    llmitm rec why REQUEST.json|- [--db PATH | --recordings DIR] [--scope S] [--profile P]
                   [--ignore PATH]… [--method M] [--path P] [--json]
    llmitm rec migrate (DIR | --db PATH) [--profile P] [--ignore PATH]…
    llmitm rec check-secrets PATH...
    llmitm rec prune [--db PATH] (--older-than 7d | --scope S | --id ID… | --host H --path P)

``ls`` prints each id as its shortest unique prefix (8 characters at least); every command
that takes an id takes such a prefix. ``show`` prints the conversation by default.

``check-secrets`` and ``export`` name the recording and the field of each credential-shaped
value they find (``01J… request.headers.authorization``), so ``prune --id`` can drop it.

Reads the store read-only except ``import``, ``migrate`` and ``prune``. Problems are one line
on stderr: exit 2 for bad arguments or unreadable input, 1 for a check that found something
(a secret, a key that no longer matches, a difference, no recording for a request). Long work
(export, import, verify, migrate, check-secrets) shows a progress bar on stderr when it is a
terminal, and nothing when it is not: piped output stays clean.

Each subcommand is a module here, with its arguments and its work (``import_`` is ``import``);
``common`` holds what several share, ``scanning`` the search for credential-shaped values.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from types import ModuleType
from typing import Any

from rich.console import Console

from llmitm.cli.rec import (
    check_secrets,
    diff,
    export,
    import_,
    ls,
    migrate,
    prune,
    show,
    verify,
    why,
)
from llmitm.cli.rec.common import EXIT_USAGE, RecError
from llmitm.cli.usage import UsageError
from llmitm.replay import folder as folder_format
from llmitm.replay.why import RequestError

# Each subcommand's module adds its parser and runs it; this order is the order of --help.
_SUBCOMMANDS: dict[str, ModuleType] = {
    "ls": ls,
    "show": show,
    "diff": diff,
    "export": export,
    "import": import_,
    "verify": verify,
    "why": why,
    "migrate": migrate,
    "check-secrets": check_secrets,
    "prune": prune,
}


def add_parser(commands: Any) -> None:
    rec = commands.add_parser(
        "rec",
        help="recordings: ls, show, diff, why, export, import, verify, migrate, check-secrets, "
        "prune",
        description="Look at, compare, move and check recorded interactions.",
    )
    sub = rec.add_subparsers(dest="rec_command", required=True, metavar="SUBCOMMAND")
    for module in _SUBCOMMANDS.values():
        module.add_parser(sub)


def rec_command(args: argparse.Namespace) -> int:
    console = Console(highlight=False)
    try:
        module = _SUBCOMMANDS[args.rec_command]
        return asyncio.run(module.command(args, console))
    except (RecError, UsageError, RequestError, folder_format.FolderError) as exc:
        print(f"llmitm rec {args.rec_command}: {exc}", file=sys.stderr)
        return EXIT_USAGE
