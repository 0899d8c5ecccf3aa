"""Finding credential-shaped values for ``check-secrets``, ``verify`` and ``export``: in files
(a database judged value by value, with its -wal and -journal; a folder's files), or in what an
export would write, each finding named by the recording and field it sits in."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from llmitm.cli.rec.common import RecError, progress
from llmitm.replay import folder as folder_format
from llmitm.replay.model import Interaction
from llmitm.replay.scan import Finding, scan_patterns, scan_text
from llmitm.replay.scan_fields import Located, locate, recording_ids
from llmitm.store import folder as folder_files
from llmitm.store import store_for
from llmitm.store.raw_values import UnreadableDatabase, database_values

_NAMED = 5
"""Hits an export refusal names on its one line (``check-secrets`` lists them all)."""

_SQLITE_MAGIC = b"SQLite format 3\x00"


async def scan_paths(paths: Sequence[Path]) -> list[str]:
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
    for file in progress(files, "scanning"):
        findings = _scan_file(file)
        if not findings:
            continue
        located = locate(findings, await _recordings_in(file, cache))
        found += [f"{file}: {item.label()}" for item in located]
    return found


def locate_text(data: bytes, interactions: Sequence[Interaction]) -> list[Located]:
    """The findings of ``data`` (what would be written), each named by recording and field."""
    return locate(scan_text(data.decode("utf-8", "replace")), interactions)


def refuse_secrets(found_in: Iterable[Located], *, in_store: bool) -> None:
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
            store = store_for(database, read_only=True)
            await store.open()
            try:
                cache[database] = await store.load_recordings()
            finally:
                await store.close()
        except Exception:  # not an llmitm store (or an unreadable one): findings stay unnamed
            pass
    return cache[database]
