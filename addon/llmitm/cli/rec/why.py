"""``llmitm rec why``: a request's match key, how it was made (what was redacted, dropped,
ignored, made a placeholder), and the nearest recordings in its scope with their differences;
exit 1 when no recording has its key."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console

from llmitm.cli.rec.common import (
    EXIT_FOUND,
    RecError,
    add_key_options,
    key_options,
    load_all,
    print_diff,
)
from llmitm.replay.keys import KeyOptions
from llmitm.replay.model import Interaction
from llmitm.replay.pool import GLOBAL_SCOPE, canonical_diff
from llmitm.replay.rekey import rekey
from llmitm.replay.why import Near, Trace, explain, nearest, parse_request
from llmitm.store import folder as folder_files


def add_parser(sub: Any) -> None:
    why = sub.add_parser(
        "why", help="a request's match key, how it was made, and the nearest recordings"
    )
    why.add_argument(
        "request", help="a request body, request leg or recording file (JSON); - for stdin"
    )
    why.add_argument("--db", help="the store (default: $XDG_DATA_HOME/llmitm/llmitm.db)")
    why.add_argument("--recordings", "--folder", dest="folder", help="a recordings folder")
    why.add_argument("--scope", default=GLOBAL_SCOPE, help=f"default: {GLOBAL_SCOPE}")
    add_key_options(why)
    why.add_argument("--method", help="the request's method (default: the file's, else POST)")
    why.add_argument("--path", help="the request's path (default: the file's, or by its body)")
    why.add_argument("--limit", type=int, default=3, help="nearest recordings shown (default 3)")
    why.add_argument("--json", action="store_true")


async def command(args: argparse.Namespace, console: Console) -> int:
    if args.db and args.folder:
        raise RecError("give --db or --recordings, not both")
    data = _read_request(args.request)
    method, path, headers, content = parse_request(data, args.method, args.path)
    settings: Mapping[str, Any] = {}
    if args.folder:
        settings = folder_files.read_manifest(Path(args.folder)).get("settings", {})
    options = key_options(args, settings)
    trace = explain(method, path, headers, content, options)
    interactions = await load_all(args)
    rekey(interactions, options)  # as a replay does at load: today's rules, not the stored keys
    in_scope = [i for i in interactions if i.scope == args.scope]
    near = nearest(in_scope, args.scope, trace.key, max(1, args.limit))
    found = any(n.same_key for n in near)
    # A request sent without its scope (or with another) is the commonest miss: say so.
    elsewhere = sorted({i.scope for i in interactions if i.key == trace.key.key} - {args.scope})
    if args.json:
        document = _document(args.scope, options, trace, in_scope, near, elsewhere)
        sys.stdout.buffer.write(orjson.dumps(document, option=orjson.OPT_INDENT_2) + b"\n")
    else:
        _print(console, args.scope, options, trace, in_scope, near, elsewhere)
    return 0 if found else EXIT_FOUND


def _read_request(name: str) -> bytes:
    if name == "-":
        return sys.stdin.buffer.read()
    try:
        return Path(name).expanduser().read_bytes()
    except OSError as exc:
        raise RecError(f"{name}: {exc.strerror or exc}") from None


def _document(
    scope: str,
    options: KeyOptions,
    trace: Trace,
    in_scope: Sequence[Interaction],
    near: Sequence[Near],
    elsewhere: Sequence[str],
) -> dict[str, Any]:
    key = trace.key
    return {
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
        "scope": scope,
        "recordings_in_scope": len(in_scope),
        "found": any(n.same_key for n in near),
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


def _print(
    console: Console,
    scope: str,
    options: KeyOptions,
    trace: Trace,
    in_scope: Sequence[Interaction],
    near: Sequence[Near],
    elsewhere: Sequence[str],
) -> None:
    key = trace.key
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
        f"[bold]nearest[/] in scope {scope!r} ({len(in_scope)} recording(s)):", markup=True
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
            print_diff(console, canonical_diff(i.canonical, key.canonical), indent="    ")
    if elsewhere:
        console.print(
            f"[yellow]same key in other scope(s):[/] {', '.join(elsewhere)}",
            markup=True,
            soft_wrap=True,
        )
