"""What several ``llmitm rec`` subcommands share: their exit codes and error, the source
options (``--db``/``--folder``) and key options (``--profile``/``--ignore``), opening the store,
finding recordings by id or prefix, the progress bar and a recording's summary row."""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import track

from llmitm.errors import UserError
from llmitm.replay.keys import PROFILES, KeyOptions, parse_ignore
from llmitm.replay.model import Interaction
from llmitm.store import SchemaTooNew, Store, default_store_path, store_for
from llmitm.store import folder as folder_files
from llmitm.store.location_url import display_location, missing

EXIT_FOUND = 1
EXIT_USAGE = 2
PROGRESS_MIN = 20
"""Fewer items than this finish before a progress bar is worth drawing."""


class RecError(UserError, ValueError):
    """One line for the user; exit 2."""


# --- options ---------------------------------------------------------------------------------


def add_source_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--db",
        help="the store: a SQLite file or postgresql://user@host:port/db, password in "
        "PGPASSWORD (default: $XDG_DATA_HOME/llmitm/llmitm.db)",
    )
    parser.add_argument("--folder", help="a recordings folder instead of the store")


def add_key_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--profile",
        choices=PROFILES,
        help="match profile; with --ignore, replaces a folder's settings (default: the "
        "folder's, else default)",
    )
    parser.add_argument(
        "--ignore",
        action="append",
        default=[],
        metavar="PATH",
        help="a dotted body path keys ignore (repeatable, or comma-separated)",
    )


def key_options(args: argparse.Namespace, settings: Mapping[str, Any]) -> KeyOptions:
    """Key options from the command line when it gives any (``--profile default`` alone
    clears a folder's ignore paths), else a folder manifest's ``settings``."""
    ignore = tuple(path for value in args.ignore for path in parse_ignore(value))
    if not args.profile and not ignore:
        profile, ignore = settings.get("profile", "default"), tuple(settings.get("ignore", ()))
    else:
        profile = args.profile or "default"
    try:
        return KeyOptions(profile=profile, ignore=ignore)
    except ValueError as exc:
        raise RecError(str(exc)) from None


# --- sources ---------------------------------------------------------------------------------


def db_location(value: str | None) -> str:
    """The store ``--db`` names (a file or a database URL), else the default file."""
    return value or str(default_store_path())


def progress[T](items: Sequence[T], description: str) -> Iterable[T]:
    """``items`` with a progress bar on stderr while it is a terminal and there are many;
    nothing is drawn otherwise, so piped or captured output stays clean."""
    err = Console(stderr=True)
    hidden = not err.is_terminal or len(items) < PROGRESS_MIN
    return track(items, description=description, console=err, disable=hidden, transient=True)


def must_exist(db: str | None) -> None:
    """Commands that change recordings never create an empty database by mistake."""
    location = db_location(db)
    if missing(location):
        raise RecError(
            f"no database at {display_location(location)} (run the proxy first, or pass --db)"
        )


async def open_store(db: str | None, *, write: bool = False) -> Store:
    store = store_for(db_location(db), read_only=not write)
    path = store.location  # never a password
    try:
        await store.open()
    except FileNotFoundError:
        raise RecError(f"no database at {path} (run the proxy first, or pass --db)") from None
    except SchemaTooNew as exc:
        raise RecError(f"{path}: {exc}") from None
    except Exception as exc:
        raise RecError(f"{path}: cannot open the database ({exc})") from None
    return store


async def load_all(args: argparse.Namespace) -> list[Interaction]:
    if getattr(args, "folder", None):
        return folder_files.read_folder(Path(args.folder))
    store = await open_store(args.db)
    try:
        return await store.load_recordings()
    finally:
        await store.close()


async def find(args: argparse.Namespace, ident: str) -> Interaction:
    """The one recording whose id is or starts with ``ident``, from ``--folder`` or the store."""
    if getattr(args, "folder", None):
        interactions = folder_files.read_folder(Path(args.folder))
        wanted = resolve_id(ident, [i.id for i in interactions])
        return next(i for i in interactions if i.id == wanted)
    store = await open_store(args.db)
    try:
        wanted = resolve_id(ident, [i.id for i in await store.recordings()])
        found = await store.recording(wanted)
    finally:
        await store.close()
    if found is None:  # pruned between the two reads
        raise RecError(f"no recording with id {ident!r}")
    return found


# --- ids -------------------------------------------------------------------------------------

SHORT_ID = 8
"""The fewest characters ``rec ls`` shows of an id (more where recordings share a start)."""
CANDIDATES_SHOWN = 10


def short_ids(ids: Iterable[str], minimum: int = SHORT_ID) -> dict[str, str]:
    """Each id cut to its shortest prefix that no other id starts with, at least ``minimum``
    characters: what ``rec ls`` prints, and what every ``rec`` command taking an id accepts.
    Sorted, an id shares the longest start with a neighbour, so only those are compared."""
    ordered = sorted(set(ids))
    shared = [0] * len(ordered)
    for index in range(1, len(ordered)):
        common = _common_length(ordered[index - 1], ordered[index])
        shared[index - 1] = max(shared[index - 1], common)
        shared[index] = max(shared[index], common)
    return {ident: ident[: max(minimum, shared[index] + 1)] for index, ident in enumerate(ordered)}


def _common_length(a: str, b: str) -> int:
    length = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        length += 1
    return length


def resolve_id(ident: str, ids: Sequence[str]) -> str:
    """The one id of ``ids`` that is ``ident`` or starts with it; a missing or ambiguous
    prefix is a :class:`RecError` (an ambiguous one lists the candidates, shortened)."""
    ident = ident.strip().rstrip("…")  # a prefix copied with the ellipsis of a cut column
    if ident in ids:
        return ident
    matches = sorted({i for i in ids if i.startswith(ident)}) if ident else []
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise RecError(f"no recording with id {ident!r} (llmitm rec ls lists them)")
    shown = short_ids(matches, minimum=len(ident) + 1)
    names = [shown[m] for m in matches[:CANDIDATES_SHOWN]]
    more = len(matches) - len(names)
    listed = ", ".join(names) + (f" and {more} more" if more else "")
    raise RecError(f"{ident!r} starts {len(matches)} recording ids: {listed}; give more of the id")


# --- output ----------------------------------------------------------------------------------


def summary(interaction: Interaction) -> dict[str, Any]:
    return {
        "id": interaction.id,
        "scope": interaction.scope,
        "key": interaction.key,
        "method": interaction.method,
        "route": interaction.route,
        "model": interaction.model,
        "stream": interaction.stream,
        "status": interaction.status,
        "endpoint": interaction.endpoint,
        "plan": interaction.plan,
        "ttfb_ms": None if interaction.ttfb_us is None else interaction.ttfb_us / 1000,
        "duration_ms": None if interaction.duration_us is None else interaction.duration_us / 1000,
        "truncated": interaction.truncated,
        "credential": interaction.credential,
        "source": interaction.source,
    }


def print_diff(console: Console, lines: Iterable[str], indent: str = "") -> None:
    """Diff lines, removals red and additions green."""
    for line in lines:
        style = "red" if line.startswith("-") else "green" if line.startswith("+") else ""
        text = f"{indent}{line}"
        console.print(f"[{style}]{text}[/]" if style else text, markup=bool(style))
