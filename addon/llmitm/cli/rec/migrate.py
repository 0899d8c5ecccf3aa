"""``llmitm rec migrate``: every stored key recomputed under today's match key version and the
profile given (or the folder's), in a recordings folder or in the store."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.console import Console

from llmitm.cli.rec.common import (
    RecError,
    add_key_options,
    key_options,
    must_exist,
    open_store,
    progress,
)
from llmitm.replay import folder as folder_format
from llmitm.replay.keys import MATCH_KEY_VERSION, KeyOptions
from llmitm.replay.model import Interaction
from llmitm.replay.rekey import rekey
from llmitm.store import folder as folder_files
from llmitm.store.recordings import RekeyRecording


def add_parser(sub: Any) -> None:
    migrate = sub.add_parser(
        "migrate", help="recompute stored keys under today's key version and profile"
    )
    migrate.add_argument("folder", nargs="?", help="a recordings folder (else the store)")
    migrate.add_argument("--db")
    add_key_options(migrate)


async def command(args: argparse.Namespace, console: Console) -> int:
    if args.folder:
        folder = Path(args.folder)
        manifest, interactions = _read_folder_any_version(folder)
        options = key_options(args, manifest.get("settings", {}))
        changed = rekey(progress(interactions, "re-keying"), options)
        old_version = manifest.get("match_key_version")
        if (
            changed
            or old_version != MATCH_KEY_VERSION
            or _settings(options) != manifest.get("settings")
        ):
            timing = manifest.get("timing", "exact")  # as the folder was written
            folder_files.write_folder(folder, interactions, _settings(options), timing=timing)
        where = str(folder)
    else:
        options = key_options(args, {})
        must_exist(args.db)
        store = await open_store(args.db, write=True)
        try:
            interactions = await store.load_recordings()
            changed = rekey(progress(interactions, "re-keying"), options)
            for interaction in changed:
                store.submit(
                    RekeyRecording(
                        interaction.id,
                        interaction.key,
                        interaction.key_version,
                        interaction.canonical,
                    )
                )
            await store.flush()
            failed = store.stats().failed
        finally:
            await store.close()
        if failed:
            raise RecError(f"{store.location}: {failed} key update(s) failed (see above)")
        where = store.location
    console.print(
        f"re-keyed {len(changed)} of {len(interactions)} recording(s) in {where} "
        f"(match key version {MATCH_KEY_VERSION}, profile {options.profile}"
        + (f", ignoring {', '.join(options.ignore)})" if options.ignore else ")"),
        soft_wrap=True,
    )
    return 0


def _read_folder_any_version(folder: Path) -> tuple[dict[str, Any], list[Interaction]]:
    """A folder's manifest and interactions whatever match key version wrote them (the one
    reader that does not refuse an old key version: ``migrate`` is how it is brought up)."""
    try:
        manifest = folder_files.read_manifest(folder, any_key_version=True)
        return manifest, folder_files.read_folder(folder, any_key_version=True)
    except folder_format.FolderError as exc:
        raise RecError(str(exc)) from None


def _settings(options: KeyOptions) -> dict[str, Any]:
    return {"profile": options.profile, "ignore": list(options.ignore)}
