"""``llmitm rec``: look at, compare, move and check recordings.

    llmitm rec ls [--db PATH | --folder DIR] [--scope S] [--limit N] [--json]
    llmitm rec show ID [--db PATH | --folder DIR] [--timeline] [--json]
    llmitm rec diff A B [--db PATH | --folder DIR]   |   llmitm rec diff --last-miss [--db PATH]
    llmitm rec export DIR [--db PATH | --from-folder DIR] [--scope S] [--umask]
    llmitm rec export FILE --har | --flows [--db PATH | --from-folder DIR]
    llmitm rec import DIR [--db PATH]
    llmitm rec verify (DIR | --db PATH)
    llmitm rec why REQUEST.json|- [--db PATH | --recordings DIR] [--scope S] [--profile P]
                   [--ignore PATH]… [--method M] [--path P] [--json]
    llmitm rec migrate (DIR | --db PATH) [--profile P] [--ignore PATH]…
    llmitm rec check-secrets PATH...
    llmitm rec prune [--db PATH] (--older-than 7d | --scope S | --id ID… | --host H --path P)

``check-secrets`` and ``export`` name the recording and the field of each credential-shaped
value they find (``01J… request.headers.authorization``), so ``prune --id`` can drop it.

Reads the store read-only except ``import``, ``migrate`` and ``prune``. Problems are one line
on stderr: exit 2 for bad arguments or unreadable input, 1 for a check that found something
(a secret, a key that no longer matches, a difference, no recording for a request). Long work
(export, import, verify, migrate, check-secrets) shows a progress bar on stderr when it is a
terminal, and nothing when it is not: piped output stays clean.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson
from rich.console import Console
from rich.progress import track
from rich.table import Table

from llmitm.errors import UserError
from llmitm.file_modes import write_file
from llmitm.replay import folder as folder_format
from llmitm.replay.har import to_har
from llmitm.replay.keys import MATCH_KEY_VERSION, PROFILES, KeyOptions, parse_ignore
from llmitm.replay.model import Interaction
from llmitm.replay.pool import GLOBAL_SCOPE, canonical_diff
from llmitm.replay.rekey import rekey, request_key
from llmitm.replay.scan import Finding, scan_patterns, scan_text
from llmitm.replay.scan_fields import Located, locate, recording_ids
from llmitm.replay.why import RequestError, explain, nearest, parse_request
from llmitm.store import SchemaTooNew, SqliteStore, default_store_path
from llmitm.store import folder as folder_files
from llmitm.store.raw_values import UnreadableDatabase, database_values
from llmitm.store.recordings import (
    DeleteRecordings,
    DeleteScope,
    PruneRecordings,
    RecordingWrite,
    RekeyRecording,
)
from llmitm.store.sqlite import SqliteApplier
from llmitm.store.sqlite_recordings import apply_rekey
from llmitm.usage_report import UsageError, parse_since
from llmitm.view.timeline import events_from_chunks
from llmitm.view.timeline import timeline as draw_timeline
from llmitm.wire.sse import SSEDecoder, SSEEvent

EXIT_FOUND = 1
EXIT_USAGE = 2
PROGRESS_MIN = 20
"""Fewer items than this finish before a progress bar is worth drawing."""


class RecError(UserError, ValueError):
    """One line for the user; exit 2."""


def add_parser(commands: Any) -> None:
    rec = commands.add_parser(
        "rec",
        help="recordings: ls, show, diff, why, export, import, verify, migrate, check-secrets, "
        "prune",
        description="Look at, compare, move and check recorded interactions.",
    )
    sub = rec.add_subparsers(dest="rec_command", required=True, metavar="SUBCOMMAND")

    def keyed(parser: argparse.ArgumentParser) -> None:
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

    def source(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--db", help="the store (default: $XDG_DATA_HOME/llmitm/llmitm.db)")
        parser.add_argument("--folder", help="a recordings folder instead of the store")

    ls = sub.add_parser("ls", help="list recordings")
    source(ls)
    ls.add_argument("--scope")
    ls.add_argument("--limit", type=int, default=50, help="the newest N (default 50; 0: all)")
    ls.add_argument("--json", action="store_true")
    show = sub.add_parser("show", help="one recording: its legs, or its stream's timeline")
    source(show)
    show.add_argument("id")
    show.add_argument("--timeline", action="store_true", help="each streamed event with t+ms")
    show.add_argument("--json", action="store_true")
    diff = sub.add_parser("diff", help="the request difference of two recordings, or the last miss")
    source(diff)
    diff.add_argument("ids", nargs="*", metavar="ID")
    diff.add_argument("--last-miss", action="store_true")
    export = sub.add_parser(
        "export", help="write the store's recordings as a folder, a HAR file or a flow file"
    )
    export.add_argument("folder", help="the folder (or, with --har/--flows, the file) to write")
    export.add_argument("--db")
    export.add_argument("--from-folder", help="read a recordings folder instead of the store")
    export.add_argument("--scope")
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
    imp = sub.add_parser("import", help="load a recordings folder into the store")
    imp.add_argument("folder")
    imp.add_argument("--db")
    verify = sub.add_parser("verify", help="manifest, secrets, and keys recomputed today")
    verify.add_argument("folder", nargs="?")
    verify.add_argument("--db")
    why = sub.add_parser(
        "why", help="a request's match key, how it was made, and the nearest recordings"
    )
    why.add_argument(
        "request", help="a request body, request leg or recording file (JSON); - for stdin"
    )
    why.add_argument("--db", help="the store (default: $XDG_DATA_HOME/llmitm/llmitm.db)")
    why.add_argument("--recordings", "--folder", dest="folder", help="a recordings folder")
    why.add_argument("--scope", default=GLOBAL_SCOPE, help=f"default: {GLOBAL_SCOPE}")
    keyed(why)
    why.add_argument("--method", help="the request's method (default: the file's, else POST)")
    why.add_argument("--path", help="the request's path (default: the file's, or by its body)")
    why.add_argument("--limit", type=int, default=3, help="nearest recordings shown (default 3)")
    why.add_argument("--json", action="store_true")
    migrate = sub.add_parser(
        "migrate", help="recompute stored keys under today's key version and profile"
    )
    migrate.add_argument("folder", nargs="?", help="a recordings folder (else the store)")
    migrate.add_argument("--db")
    keyed(migrate)
    secrets = sub.add_parser("check-secrets", help="scan databases or folders for credentials")
    secrets.add_argument("paths", nargs="+", metavar="PATH")
    prune = sub.add_parser(
        "prune", help="forget old recordings, a scope, recordings by id, or by host and path"
    )
    prune.add_argument("--db")
    prune.add_argument("--older-than", help="a span such as 7d, 24h, or YYYY-MM-DD")
    prune.add_argument("--scope")
    prune.add_argument(
        "--id", action="append", default=[], dest="ids", metavar="ID",
        help="a recording's id or unique prefix (repeatable)",
    )  # fmt: skip
    prune.add_argument("--host", help="recordings whose request went to this host (a glob)")
    prune.add_argument("--path", help="recordings whose request path matches this glob")


def rec_command(args: argparse.Namespace) -> int:
    console = Console(highlight=False)
    try:
        handler = _HANDLERS[args.rec_command]
        return asyncio.run(handler(args, console))
    except (RecError, UsageError, RequestError, folder_format.FolderError) as exc:
        print(f"llmitm rec {args.rec_command}: {exc}", file=sys.stderr)
        return EXIT_USAGE


# --- sources ---------------------------------------------------------------------------------


def _db_path(value: str | None) -> Path:
    return Path(value).expanduser() if value else default_store_path()


def _progress[T](items: Sequence[T], description: str) -> Iterable[T]:
    """``items`` with a progress bar on stderr while it is a terminal and there are many;
    nothing is drawn otherwise, so piped or captured output stays clean."""
    err = Console(stderr=True)
    hidden = not err.is_terminal or len(items) < PROGRESS_MIN
    return track(items, description=description, console=err, disable=hidden, transient=True)


def _must_exist(db: str | None) -> None:
    """Commands that change recordings never create an empty database by mistake."""
    path = _db_path(db)
    if not path.is_file():
        raise RecError(f"no database at {path} (run the proxy first, or pass --db)")


async def _open(
    db: str | None, *, write: bool = False, appliers: Mapping[type, SqliteApplier] | None = None
) -> SqliteStore:
    path = _db_path(db)
    store = SqliteStore(path, read_only=not write, appliers=appliers)
    try:
        await store.open()
    except FileNotFoundError:
        raise RecError(f"no database at {path} (run the proxy first, or pass --db)") from None
    except SchemaTooNew as exc:
        raise RecError(f"{path}: {exc}") from None
    except Exception as exc:
        raise RecError(f"{path}: cannot open the database ({exc})") from None
    return store


async def _load_all(args: argparse.Namespace) -> list[Interaction]:
    if getattr(args, "folder", None):
        return folder_files.read_folder(Path(args.folder))
    store = await _open(args.db)
    try:
        return await store.load_recordings()
    finally:
        await store.close()


async def _find(args: argparse.Namespace, ident: str) -> Interaction:
    if getattr(args, "folder", None):
        found = [i for i in folder_files.read_folder(Path(args.folder)) if i.id.startswith(ident)]
    else:
        store = await _open(args.db)
        try:
            ids = [i.id for i in await store.recordings() if i.id.startswith(ident)]
            one = await store.recording(ids[0]) if len(ids) == 1 else None
        finally:
            await store.close()
        found = [one] if one is not None else [None] * len(ids)
    if len(found) != 1 or found[0] is None:
        raise RecError(f"{'no' if not found else 'more than one'} recording with id {ident!r}")
    return found[0]


# --- commands --------------------------------------------------------------------------------


def _when(interaction: Interaction) -> str:
    if interaction.source != "db":
        return f"#{interaction.started_us}"
    return datetime.fromtimestamp(interaction.started_us / 1e6, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _ms(value: int | None) -> str:
    return "" if value is None else f"{value / 1000:.1f}"


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


async def _ls(args: argparse.Namespace, console: Console) -> int:
    if args.folder:
        interactions = folder_files.read_folder(Path(args.folder))
    else:
        store = await _open(args.db)
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


def timeline(interaction: Interaction) -> list[tuple[float, bytes]]:
    """(offset in seconds, one SSE event's bytes) of the stream the client got — what a
    timeline renderer draws. Events split across pieces take the offset of their last piece."""
    message = interaction.legs.get("client_resp") or interaction.legs.get("upstream_resp")
    if message is None or message.chunks is None:
        return []
    decoder = SSEDecoder()
    events: list[tuple[float, bytes]] = []
    for t_us, data in message.chunks:
        for event in decoder.feed(data):
            events.append((t_us / 1e6, _event_bytes(event)))
    return events


def _event_bytes(event: SSEEvent) -> bytes:
    name, data = event
    return (f"event: {name}\n".encode() if name else b"") + b"data: " + data


async def _show(args: argparse.Namespace, console: Console) -> int:
    interaction = await _find(args, args.id)
    if args.timeline:
        events = timeline(interaction)
        if args.json:
            rows = [{"t_ms": round(t * 1000, 3), "event": e.decode("utf-8", "replace")}
                    for t, e in events]  # fmt: skip
            sys.stdout.buffer.write(orjson.dumps(rows) + b"\n")
            return 0
        # The picture first (TTFT, density, stalls), then every event with its time.
        message = interaction.legs.get("client_resp") or interaction.legs.get("upstream_resp")
        chunks = [(t_us / 1e6, data) for t_us, data in (message.chunks or [])] if message else []
        console.print(draw_timeline(events_from_chunks(chunks), width=max(40, console.width - 8)))
        table = Table(title=f"{interaction.id}: {len(events)} event(s)")
        table.add_column("t+ms", justify="right")
        table.add_column("gap", justify="right")
        table.add_column("event")
        previous = 0.0
        for t, event in events:
            text = event.decode("utf-8", "replace")
            table.add_row(f"{t * 1000:.1f}", f"{(t - previous) * 1000:.1f}", text[:160])
            previous = t
        console.print(table)
        return 0
    value = folder_format.interaction_to_json(interaction)
    if args.json:
        sys.stdout.buffer.write(folder_format.dumps_pretty(value))
        return 0
    head = summary(interaction)
    for key, item in head.items():
        console.print(f"[bold]{key:>13}[/]  {item}")
    for leg in ("client_req", "upstream_req", "upstream_resp", "client_resp"):
        message = interaction.legs.get(leg)
        if message is None:
            continue
        what = f"{message.method} {message.url}" if message.method else f"HTTP {message.status}"
        size = len(message.body())
        pieces = f", {len(message.chunks)} piece(s)" if message.chunks is not None else ""
        console.print(f"[bold]{leg:>13}[/]  {what} ({size} bytes{pieces})")
    return 0


async def _diff(args: argparse.Namespace, console: Console) -> int:
    if args.last_miss:
        store = await _open(args.db)
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
        a, b = [await _find(args, ident) for ident in args.ids]
        lines = canonical_diff(a.canonical, b.canonical, limit=400)
    for line in lines:
        style = "red" if line.startswith("-") else "green" if line.startswith("+") else ""
        console.print(f"[{style}]{line}[/]" if style else line, markup=bool(style))
    return EXIT_FOUND if lines else 0


async def _export(args: argparse.Namespace, console: Console) -> int:
    if args.from_folder:
        interactions = folder_files.read_folder(Path(args.from_folder))
        if args.scope:
            interactions = [i for i in interactions if i.scope == args.scope]
    else:
        store = await _open(args.db)
        try:
            interactions = await store.load_recordings(args.scope)
        finally:
            await store.close()
    target = Path(args.folder)
    # Scan what would be written (§5.7: export refuses when anything matches): the files
    # themselves for a folder or a HAR file; each interaction for a flow file (binary).
    if args.har:
        har = orjson.dumps(to_har(interactions), option=orjson.OPT_INDENT_2)
        _refuse_secrets(_locate_text(har, interactions), in_store=not args.from_folder)
    else:
        found = [
            located
            for i in _progress(interactions, "scanning")
            for located in _locate_text(
                folder_format.dumps_pretty(folder_format.interaction_to_json(i)), [i]
            )
        ]
        _refuse_secrets(found, in_store=not args.from_folder)
    private = not args.umask
    if args.har:
        write_file(target, har, private=private)
        console.print(f"wrote {len(interactions)} HAR entr(ies) to {target}")
        return 0
    if args.flows:
        from llmitm.addons.flowfile import write_flows  # the one export that needs mitmproxy

        count = write_flows(target, interactions, private=private)
        console.print(f"wrote {count} flow(s) to {target}")
        return 0
    written = folder_files.write_folder(
        target, interactions, timing=args.export_timing, private=private
    )
    console.print(f"wrote {len(written)} recording(s) to {args.folder}")
    return 0


async def _import(args: argparse.Namespace, console: Console) -> int:
    interactions = folder_files.read_folder(Path(args.folder))
    # Files carry positions, not times (``started_us`` is the file's order): stored as
    # imported now, in that order, or ``prune --older-than`` would take them for 1970's.
    now_us = time.time_ns() // 1000
    for interaction in interactions:
        interaction.started_us += now_us
    store = await _open(args.db, write=True)
    try:
        for interaction in _progress(interactions, "importing"):
            store.submit(RecordingWrite(interaction))
        await store.flush()
    finally:
        await store.close()
    console.print(f"imported {len(interactions)} recording(s) into {store.path}")
    return 0


async def _verify(args: argparse.Namespace, console: Console) -> int:
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
        problems += [f"secret {where}" for where in await _scan_paths([Path(args.folder)])]
    else:
        store = await _open(args.db)
        try:
            interactions = await store.load_recordings()
        finally:
            await store.close()
    migrate = f"llmitm rec migrate {args.folder}" if args.folder else "llmitm rec migrate --db …"
    for interaction in _progress(interactions, "verifying"):
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


_NAMED = 5
"""Hits an export refusal names on its one line (``check-secrets`` lists them all)."""


def _locate_text(data: bytes, interactions: Sequence[Interaction]) -> list[Located]:
    """The findings of ``data`` (what would be written), each named by recording and field."""
    return locate(scan_text(data.decode("utf-8", "replace")), interactions)


def _refuse_secrets(found_in: Iterable[Located], *, in_store: bool) -> None:
    """Raise (nothing written yet) when anything credential-shaped would be written; for
    recordings ``in_store``, say how to prune them."""
    found = list(found_in)
    if not found:
        return
    ids = recording_ids(found)
    named = "; ".join(item.label() for item in found[:_NAMED])
    more = f"; and {len(found) - _NAMED} more" if len(found) > _NAMED else ""
    prune = ""
    if ids and in_store:
        prune = f"; `llmitm rec prune --id {' --id '.join(ids[:_NAMED])}` drops them"
    raise RecError(
        f"refusing to export: {len(found)} credential-shaped value(s) in "
        f"{len(ids)} recording(s): {named}{more}; run `llmitm rec check-secrets` on the "
        f"source for all of them{prune}"
    )


_SQLITE_MAGIC = b"SQLite format 3\x00"


def _scan_file(file: Path) -> list[Finding]:
    data = file.read_bytes()
    text = data.decode("latin-1")
    if not data.startswith(_SQLITE_MAGIC) and not file.name.endswith(("-wal", "-journal")):
        return scan_text(text)
    # SQLite pages put a row's values side by side with no separator (ids, scope and key run
    # into one "random" token), so entropy is judged value by value, through SQLite; the
    # patterns still run over the raw bytes, free pages and WAL frames included.
    found = scan_patterns(text)
    if data.startswith(_SQLITE_MAGIC):
        try:
            for value, compressed in database_values(file):
                found += [f for f in scan_text(value) if compressed or f.kind == "entropy"]
        except UnreadableDatabase:
            return scan_text(text)  # unreadable as a database: judge the bytes as they are
    return found


async def _recordings_in(file: Path, cache: dict[Path, list[Interaction]]) -> list[Interaction]:
    """The recordings ``file`` belongs to (a database, its -wal or -journal, or a file of a
    recordings folder), to name where a finding sits; none when it cannot be read as such."""
    if file.suffix == ".json":
        # A recordings folder is read whole: its files share blobs (``_blobs/``).
        root = next((p for p in file.parents if (p / folder_format.MANIFEST).is_file()), None)
        if root is not None and root not in cache:
            try:
                cache[root] = folder_files.read_folder(root)
            except Exception:  # a broken folder: its findings stay unnamed
                cache[root] = []
        return cache.get(root, []) if root is not None else []
    database = Path(str(file).removesuffix("-wal").removesuffix("-journal"))
    if database not in cache:
        cache[database] = []
        try:
            store = SqliteStore(database, read_only=True)
            await store.open()
            try:
                cache[database] = await store.load_recordings()
            finally:
                await store.close()
        except Exception:  # not an llmitm store (or an unreadable one): findings stay unnamed
            pass
    return cache[database]


async def _scan_paths(paths: Sequence[Path]) -> list[str]:
    """``file: recording field: finding`` for every credential-shaped value in the files (a
    database with its -wal and -journal files: free pages and unflushed frames count too)."""
    found: list[str] = []
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            files += sorted(p for p in path.rglob("*") if p.is_file())
        elif path.is_file():
            files.append(path)
            files += [p for p in (Path(f"{path}-wal"), Path(f"{path}-journal")) if p.is_file()]
        else:
            raise RecError(f"{path}: no such file or folder")
    cache: dict[Path, list[Interaction]] = {}
    for file in _progress(files, "scanning"):
        findings = _scan_file(file)
        if not findings:
            continue
        located = locate(findings, await _recordings_in(file, cache))
        found += [f"{file}: {item.label()}" for item in located]
    return found


async def _check_secrets(args: argparse.Namespace, console: Console) -> int:
    found = await _scan_paths([Path(p).expanduser() for p in args.paths])
    for line in found:
        console.print(f"[red]secret[/] {line}", markup=True, soft_wrap=True)
    if not found:
        console.print("[green]✓[/] no credential-shaped values found")
    return EXIT_FOUND if found else 0


async def _prune(args: argparse.Namespace, console: Console) -> int:
    if not (args.older_than or args.scope or args.ids or args.host or args.path):
        raise RecError(
            "say what to prune: --older-than SPAN, --scope SCOPE, --id ID, or --host HOST "
            "and/or --path GLOB"
        )
    _must_exist(args.db)
    store = await _open(args.db, write=True)
    try:
        before = len(await store.recordings())
        ids = [await _recording_id(store, ident) for ident in args.ids]
        if args.host or args.path:
            ids += _matching(await store.request_urls(), args.host, args.path)
        if ids:
            store.submit(DeleteRecordings(tuple(dict.fromkeys(ids))))
        if args.scope:
            store.submit(DeleteScope(args.scope))
        if args.older_than:
            since = parse_since(args.older_than)
            assert since is not None
            store.submit(PruneRecordings(int(since.timestamp() * 1e6)))
        await store.flush()
        left = len(await store.recordings())
    finally:
        await store.close()
    console.print(f"pruned {before - left}; {left} recording(s) left")
    return 0


async def _recording_id(store: SqliteStore, ident: str) -> str:
    interaction = await store.recording(ident)
    if interaction is None:
        raise RecError(f"no recording {ident} (or the prefix is not unique)")
    return interaction.id


def _matching(urls: Iterable[tuple[str, str]], host: str | None, path: str | None) -> list[str]:
    """The ids whose client request went to ``host`` and ``path`` (globs; either may be
    left out). Hosts compare without case, paths without their query."""
    chosen = []
    for ident, url in urls:
        try:
            parts = urlsplit(url)
        except ValueError:
            continue
        if host and not fnmatchcase((parts.hostname or "").lower(), host.lower()):
            continue
        if path and not fnmatchcase(parts.path or "/", path):
            continue
        chosen.append(ident)
    return chosen


# --- why and migrate -------------------------------------------------------------------------


def _options(args: argparse.Namespace, settings: Mapping[str, Any]) -> KeyOptions:
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


def _read_request(name: str) -> bytes:
    if name == "-":
        return sys.stdin.buffer.read()
    try:
        return Path(name).expanduser().read_bytes()
    except OSError as exc:
        raise RecError(f"{name}: {exc.strerror or exc}") from None


async def _why(args: argparse.Namespace, console: Console) -> int:
    if args.db and args.folder:
        raise RecError("give --db or --recordings, not both")
    data = _read_request(args.request)
    method, path, headers, content = parse_request(data, args.method, args.path)
    settings: Mapping[str, Any] = {}
    if args.folder:
        settings = folder_files.read_manifest(Path(args.folder)).get("settings", {})
    options = _options(args, settings)
    trace = explain(method, path, headers, content, options)
    interactions = await _load_all(args)
    rekey(interactions, options)  # as a replay does at load: today's rules, not the stored keys
    in_scope = [i for i in interactions if i.scope == args.scope]
    near = nearest(in_scope, args.scope, trace.key, max(1, args.limit))
    found = any(n.same_key for n in near)
    key = trace.key
    # A request sent without its scope (or with another) is the commonest miss: say so.
    elsewhere = sorted({i.scope for i in interactions if i.key == key.key} - {args.scope})
    if args.json:
        document = {
            "key": key.key,
            "key_version": key.version,
            "method": key.method,
            "route": key.route,
            "model": key.model,
            "stream": key.stream,
            "profile": options.profile,
            "redacted": trace.redacted,
            "dropped": trace.dropped,
            "ignored": trace.ignored,
            "unmatched_ignores": trace.unmatched_ignores,
            "placeholders": [list(pair) for pair in trace.placeholders],
            "canonical": orjson.loads(key.canonical),
            "scope": args.scope,
            "recordings_in_scope": len(in_scope),
            "found": found,
            "same_key_in_other_scopes": elsewhere,
            "nearest": [
                {
                    "id": n.interaction.id,
                    "same_key": n.same_key,
                    "similarity": round(n.ratio, 4),
                    "source": n.interaction.source,
                    "diff": [] if n.same_key else canonical_diff(
                        n.interaction.canonical, key.canonical
                    ),
                }
                for n in near
            ],
        }  # fmt: skip
        sys.stdout.buffer.write(orjson.dumps(document, option=orjson.OPT_INDENT_2) + b"\n")
        return 0 if found else EXIT_FOUND
    stream = str(key.stream).lower()
    rows = [
        ("request", f"{key.method} {key.route} model={key.model or '-'} stream={stream}"),
        ("key", f"{key.key} (match key version {key.version}, profile {options.profile})"),
        ("redacted", ", ".join(trace.redacted) or "nothing"),
        ("dropped", ", ".join(trace.dropped) + f" (profile {options.profile})"
         if trace.dropped else "nothing"),
        ("ignored", ", ".join(trace.ignored) or "nothing"),
    ]  # fmt: skip
    if trace.unmatched_ignores:
        rows.append(("no match", ", ".join(trace.unmatched_ignores) + " (ignore paths)"))
    rows.append(
        ("volatile", "; ".join(f"{value} → {ph}" for value, ph in trace.placeholders) or "none")
    )
    for name, value in rows:
        console.print(f"[bold]{name:>9}[/]  {value}", markup=True)
    console.print("[bold]canonical[/]", markup=True)
    console.print(key.canonical, markup=False)
    console.print(
        f"[bold]nearest[/] in scope {args.scope!r} ({len(in_scope)} recording(s)):", markup=True
    )
    if not near:
        console.print("  none")
    for n in near:
        i = n.interaction
        mark = "[green]✓ same key[/]" if n.same_key else f"similarity {n.ratio:.3f}"
        where = f" {i.source}" if i.source and i.source != "db" else ""
        console.print(
            f"  {i.id} {i.method} {i.route} model={i.model or '-'}: {mark}{where}",
            markup=True,
            soft_wrap=True,
        )
        if not n.same_key:
            for line in canonical_diff(i.canonical, key.canonical):
                style = "red" if line.startswith("-") else "green" if line.startswith("+") else ""
                text = f"    {line}"
                console.print(f"[{style}]{text}[/]" if style else text, markup=bool(style))
    if elsewhere:
        console.print(
            f"[yellow]same key in other scope(s):[/] {', '.join(elsewhere)}",
            markup=True,
            soft_wrap=True,
        )
    return 0 if found else EXIT_FOUND


def _read_folder_any_version(folder: Path) -> tuple[dict[str, Any], list[Interaction]]:
    """A folder's manifest and interactions whatever match key version wrote them (the one
    reader that does not refuse an old key version: ``migrate`` is how it is brought up)."""
    try:
        manifest = folder_files.read_manifest(folder, any_key_version=True)
        return manifest, folder_files.read_folder(folder, any_key_version=True)
    except folder_format.FolderError as exc:
        raise RecError(str(exc)) from None


async def _migrate(args: argparse.Namespace, console: Console) -> int:
    if args.folder:
        folder = Path(args.folder)
        manifest, interactions = _read_folder_any_version(folder)
        options = _options(args, manifest.get("settings", {}))
        changed = rekey(_progress(interactions, "re-keying"), options)
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
        options = _options(args, {})
        _must_exist(args.db)
        store = await _open(args.db, write=True, appliers={RekeyRecording: apply_rekey})
        try:
            interactions = await store.load_recordings()
            changed = rekey(_progress(interactions, "re-keying"), options)
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
            raise RecError(f"{store.path}: {failed} key update(s) failed (see above)")
        where = str(store.path)
    console.print(
        f"re-keyed {len(changed)} of {len(interactions)} recording(s) in {where} "
        f"(match key version {MATCH_KEY_VERSION}, profile {options.profile}"
        + (f", ignoring {', '.join(options.ignore)})" if options.ignore else ")"),
        soft_wrap=True,
    )
    return 0


def _settings(options: KeyOptions) -> dict[str, Any]:
    return {"profile": options.profile, "ignore": list(options.ignore)}


_HANDLERS = {
    "ls": _ls,
    "show": _show,
    "diff": _diff,
    "export": _export,
    "import": _import,
    "verify": _verify,
    "why": _why,
    "migrate": _migrate,
    "check-secrets": _check_secrets,
    "prune": _prune,
}
