"""``llmitm rec``: look at, compare, move and check recordings.

    llmitm rec ls [--db PATH | --folder DIR] [--scope S] [--limit N] [--json]
    llmitm rec show ID [--db PATH | --folder DIR] [--timeline] [--json]
    llmitm rec diff A B [--db PATH | --folder DIR]   |   llmitm rec diff --last-miss [--db PATH]
    llmitm rec export DIR [--db PATH | --from-folder DIR] [--scope S]
    llmitm rec export FILE --har | --flows [--db PATH | --from-folder DIR]
    llmitm rec import DIR [--db PATH]
    llmitm rec verify (DIR | --db PATH)
    llmitm rec check-secrets PATH...
    llmitm rec prune [--db PATH] (--older-than 7d | --scope S)

Reads the store read-only except ``import`` and ``prune``. Problems are one line on stderr:
exit 2 for bad arguments or unreadable input, 1 for a check that found something (a
secret, a key that no longer matches, a difference).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console
from rich.progress import track
from rich.table import Table

from llmitm.replay import folder as folder_format
from llmitm.replay.har import to_har
from llmitm.replay.keys import KeyOptions, match_key
from llmitm.replay.model import Interaction
from llmitm.replay.pool import canonical_diff
from llmitm.replay.redact import find_secrets
from llmitm.store import SchemaTooNew, SqliteStore, default_store_path
from llmitm.store.recordings import DeleteScope, PruneRecordings, RecordingWrite
from llmitm.usage_report import UsageError, parse_since
from llmitm.view.timeline import events_from_chunks
from llmitm.view.timeline import timeline as draw_timeline
from llmitm.wire.sse import SSEDecoder, SSEEvent

EXIT_FOUND = 1
EXIT_USAGE = 2


class RecError(ValueError):
    """One line for the user; exit 2."""


def add_parser(commands: Any) -> None:
    rec = commands.add_parser(
        "rec",
        help="recordings: ls, show, diff, export, import, verify, check-secrets, prune",
        description="Look at, compare, move and check recorded interactions.",
    )
    sub = rec.add_subparsers(dest="rec_command", required=True, metavar="SUBCOMMAND")

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
    imp = sub.add_parser("import", help="load a recordings folder into the store")
    imp.add_argument("folder")
    imp.add_argument("--db")
    verify = sub.add_parser("verify", help="manifest, secrets, and keys recomputed today")
    verify.add_argument("folder", nargs="?")
    verify.add_argument("--db")
    secrets = sub.add_parser("check-secrets", help="scan databases or folders for credentials")
    secrets.add_argument("paths", nargs="+", metavar="PATH")
    prune = sub.add_parser("prune", help="forget old recordings, or a scope")
    prune.add_argument("--db")
    prune.add_argument("--older-than", help="a span such as 7d, 24h, or YYYY-MM-DD")
    prune.add_argument("--scope")


def rec_command(args: argparse.Namespace) -> int:
    console = Console(highlight=False)
    try:
        handler = _HANDLERS[args.rec_command]
        return asyncio.run(handler(args, console))
    except (RecError, UsageError, folder_format.FolderError) as exc:
        print(f"llmitm rec {args.rec_command}: {exc}", file=sys.stderr)
        return EXIT_USAGE


# --- sources ---------------------------------------------------------------------------------


def _db_path(value: str | None) -> Path:
    return Path(value).expanduser() if value else default_store_path()


async def _open(db: str | None, *, write: bool = False) -> SqliteStore:
    path = _db_path(db)
    store = SqliteStore(path, read_only=not write)
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
        return folder_format.read_folder(Path(args.folder))
    store = await _open(args.db)
    try:
        return await store.load_recordings()
    finally:
        await store.close()


async def _find(args: argparse.Namespace, ident: str) -> Interaction:
    if getattr(args, "folder", None):
        found = [i for i in folder_format.read_folder(Path(args.folder)) if i.id.startswith(ident)]
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
        "source": interaction.source,
    }


async def _ls(args: argparse.Namespace, console: Console) -> int:
    if args.folder:
        interactions = folder_format.read_folder(Path(args.folder))
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
        interactions = folder_format.read_folder(Path(args.from_folder))
        if args.scope:
            interactions = [i for i in interactions if i.scope == args.scope]
    else:
        store = await _open(args.db)
        try:
            interactions = await store.load_recordings(args.scope)
        finally:
            await store.close()
    hits = [hit for i in interactions for hit in _secrets_in(folder_format.interaction_to_json(i))]
    if hits:
        raise RecError(f"refusing to export: {len(hits)} credential-shaped value(s) found")
    target = Path(args.folder)
    if args.har:
        target.write_bytes(orjson.dumps(to_har(interactions), option=orjson.OPT_INDENT_2))
        console.print(f"wrote {len(interactions)} HAR entr(ies) to {target}")
        return 0
    if args.flows:
        from llmitm.addons.flowfile import write_flows  # the one export that needs mitmproxy

        console.print(f"wrote {write_flows(target, interactions)} flow(s) to {target}")
        return 0
    written = folder_format.write_folder(target, interactions)
    console.print(f"wrote {len(written)} recording(s) to {args.folder}")
    return 0


async def _import(args: argparse.Namespace, console: Console) -> int:
    interactions = folder_format.read_folder(Path(args.folder))
    store = await _open(args.db, write=True)
    try:
        for interaction in track(interactions, description="importing", console=console):
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
        manifest = folder_format.read_manifest(Path(args.folder))
        settings = manifest.get("settings", {})
        options = KeyOptions(
            profile=settings.get("profile", "default"), ignore=tuple(settings.get("ignore", ()))
        )
        interactions = folder_format.read_folder(Path(args.folder))
        problems += [f"secret {where}" for where in _scan_paths([Path(args.folder)])]
    else:
        store = await _open(args.db)
        try:
            interactions = await store.load_recordings()
        finally:
            await store.close()
    for interaction in track(interactions, description="verifying", console=console):
        request = interaction.legs.get("client_req")
        if request is None:
            problems.append(f"{interaction.id}: no client request")
            continue
        path = request.url.split("://", 1)[-1].partition("/")[2]
        key = match_key(request.method, "/" + path, request.headers, request.content, options)
        if key.key != interaction.key:
            problems.append(
                f"{interaction.id}: key {interaction.key} was recorded, {key.key} is computed "
                "today (re-record, or re-export after `llmitm rec import`)"
            )
    for problem in problems:
        console.print(f"[red]✗[/] {problem}")
    if not problems:
        console.print(f"[green]✓[/] {len(interactions)} recording(s) verified")
    return EXIT_FOUND if problems else 0


def _secrets_in(value: Any) -> list[str]:
    return find_secrets(orjson.dumps(value).decode())


def _scan_paths(paths: Sequence[Path]) -> list[str]:
    """``file: pattern…`` for every credential-shaped value in the files (a database is read
    as raw bytes, with its -wal file: free pages and unflushed frames count too)."""
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
    for file in files:
        text = file.read_bytes().decode("latin-1")
        for secret in find_secrets(text):
            found.append(f"{file}: {secret[:6]}…({len(secret)} chars)")
    return found


async def _check_secrets(args: argparse.Namespace, console: Console) -> int:
    found = _scan_paths([Path(p).expanduser() for p in args.paths])
    for line in found:
        console.print(f"[red]secret[/] {line}", markup=True)
    if not found:
        console.print("[green]✓[/] no credential-shaped values found")
    return EXIT_FOUND if found else 0


async def _prune(args: argparse.Namespace, console: Console) -> int:
    if not args.older_than and not args.scope:
        raise RecError("say what to prune: --older-than SPAN and/or --scope SCOPE")
    store = await _open(args.db, write=True)
    try:
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
    console.print(f"pruned; {left} recording(s) left")
    return 0


_HANDLERS = {
    "ls": _ls,
    "show": _show,
    "diff": _diff,
    "export": _export,
    "import": _import,
    "verify": _verify,
    "check-secrets": _check_secrets,
    "prune": _prune,
}
