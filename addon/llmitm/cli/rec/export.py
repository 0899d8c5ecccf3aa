"""``llmitm rec export``: the store's (or a folder's) recordings written as a recordings folder,
a HAR file or a mitmproxy flow file — refused, before anything is written, when what would be
written holds a credential-shaped value."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console

from llmitm.cli.rec.common import open_store, progress, resolve_id
from llmitm.cli.rec.scanning import locate_text, refuse_secrets
from llmitm.file_modes import write_file
from llmitm.replay import folder as folder_format
from llmitm.replay.har import to_har
from llmitm.store import folder as folder_files


def add_parser(sub: Any) -> None:
    export = sub.add_parser(
        "export", help="write the store's recordings as a folder, a HAR file or a flow file"
    )
    export.add_argument("folder", help="the folder (or, with --har/--flows, the file) to write")
    export.add_argument("--db")
    export.add_argument("--from-folder", help="read a recordings folder instead of the store")
    export.add_argument("--scope")
    export.add_argument(
        "--id", action="append", default=[], dest="ids", metavar="ID",
        help="only this recording, by id or unique prefix (repeatable)",
    )  # fmt: skip
    kind = export.add_mutually_exclusive_group()
    kind.add_argument("--har", action="store_true", help="HAR 1.2 (browser dev tools)")
    kind.add_argument("--flows", action="store_true", help="a mitmproxy flow file (mitmweb)")
    export.add_argument(
        "--umask",
        action="store_true",
        help="create files and folders with the umask's modes (default: owner-only, since "
        "recordings hold prompts)",
    )
    export.add_argument(
        "--export-timing",
        choices=folder_format.TIMINGS,
        default="coarse",
        help="chunk offsets in a folder: coarse (10 ms, the default: re-recording churns "
        "less), exact, or none",
    )


async def command(args: argparse.Namespace, console: Console) -> int:
    if args.from_folder:
        interactions = folder_files.read_folder(Path(args.from_folder))
        if args.scope:
            interactions = [i for i in interactions if i.scope == args.scope]
    else:
        store = await open_store(args.db)
        try:
            interactions = await store.load_recordings(args.scope)
        finally:
            await store.close()
    if args.ids:
        known = [i.id for i in interactions]
        wanted = {resolve_id(ident, known) for ident in args.ids}
        interactions = [i for i in interactions if i.id in wanted]
    target = Path(args.folder)
    # Scan what would be written (export refuses when anything matches): the files
    # themselves for a folder or a HAR file; each interaction for a flow file (binary).
    if args.har:
        har = orjson.dumps(to_har(interactions), option=orjson.OPT_INDENT_2)
        refuse_secrets(locate_text(har, interactions), in_store=not args.from_folder)
    else:
        found = [
            located
            for i in progress(interactions, "scanning")
            for located in locate_text(
                folder_format.dumps_pretty(folder_format.interaction_to_json(i)), [i]
            )
        ]
        refuse_secrets(found, in_store=not args.from_folder)
    private = not args.umask
    if args.har:
        write_file(target, har, private=private)
        console.print(f"wrote {len(interactions)} HAR entr(ies) to {target}")
        return 0
    if args.flows:
        from llmitm.addons.hosts.flowfile import write_flows  # the one export that needs mitmproxy

        count = write_flows(target, interactions, private=private)
        console.print(f"wrote {count} flow(s) to {target}")
        return 0
    written = folder_files.write_folder(
        target, interactions, timing=args.export_timing, private=private
    )
    console.print(f"wrote {len(written)} recording(s) to {args.folder}")
    return 0
