"""``llmitm rec prune``: forget recordings older than a span, of a scope, by id, or by the host
and path their request went to."""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from fnmatch import fnmatchcase
from typing import Any
from urllib.parse import urlsplit

from rich.console import Console

from llmitm.cli.rec.common import RecError, must_exist, open_store, resolve_id
from llmitm.cli.usage import parse_since
from llmitm.store.recordings import DeleteRecordings, DeleteScope, PruneRecordings


def add_parser(sub: Any) -> None:
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


async def command(args: argparse.Namespace, console: Console) -> int:
    if not (args.older_than or args.scope or args.ids or args.host or args.path):
        raise RecError(
            "say what to prune: --older-than SPAN, --scope SCOPE, --id ID, or --host HOST "
            "and/or --path GLOB"
        )
    must_exist(args.db)
    store = await open_store(args.db, write=True)
    try:
        known = [i.id for i in await store.recordings()]
        before = len(known)
        ids = [resolve_id(ident, known) for ident in args.ids]
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
