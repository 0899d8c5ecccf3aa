"""The recordings folder on disk: writing it, reading it back, and checking it for ``rec
verify``. The file layout, the JSON shapes and the blobs are :mod:`llmitm.replay.folder`'s
(sans-IO); this module only reads and writes the files.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import orjson

from llmitm.file_modes import make_dir, write_file
from llmitm.replay.folder import (
    BLOBS,
    MANIFEST,
    TIMINGS,
    FolderError,
    blob_refs,
    check_manifest,
    dumps_pretty,
    file_name,
    interaction_from_json,
    interaction_to_json,
    new_manifest,
    resolve_blobs,
    scope_dir,
    share_blobs,
)
from llmitm.replay.model import Interaction


def blob_path(folder: Path, digest: str) -> Path:
    if not re.fullmatch(r"[0-9a-f]{64}", digest):
        raise FolderError(f"blob reference {digest!r} is not a sha256")
    return folder / BLOBS / f"{digest}.json"


def _blob_loader(folder: Path) -> Callable[[str], Any]:
    cache: dict[str, Any] = {}
    loading: set[str] = set()

    def load(digest: str) -> Any:
        if digest not in cache:
            path = blob_path(folder, digest)
            if digest in loading:
                raise FolderError(f"{path}: refers to itself")
            loading.add(digest)
            try:
                # A blob may refer to others (a tool list in a shared body): never to itself.
                cache[digest] = resolve_blobs(orjson.loads(path.read_bytes()), load)
            except FileNotFoundError:
                raise FolderError(f"{path}: missing blob") from None
            except orjson.JSONDecodeError as exc:
                raise FolderError(f"{path}: not JSON ({exc})") from None
            finally:
                loading.discard(digest)
        return cache[digest]

    return load


def _write_if_changed(path: Path, data: bytes, private: bool) -> None:
    # Unchanged files keep their modification time: tools that watch the folder see no churn.
    if not path.is_file() or path.read_bytes() != data:
        write_file(path, data, private=private)


def write_folder(
    folder: Path,
    interactions: Iterable[Interaction],
    settings: dict[str, Any] | None = None,
    timing: str = "coarse",
    *,
    private: bool = True,
) -> list[Path]:
    """Write ``interactions`` as the whole content of ``folder`` (files of earlier runs that
    are not rewritten are removed, blobs no file refers to too); return the interaction files
    written. ``timing``: ``coarse`` (10 ms), ``exact`` or ``none`` (see the module doc).
    Folders and files llmitm creates are owner-only unless ``private`` is false."""
    if timing not in TIMINGS:
        raise ValueError(f"export timing {timing!r}: one of {', '.join(TIMINGS)}")
    make_dir(folder, private=private, parents=True)
    by_scope: dict[str, list[Interaction]] = {}
    for interaction in sorted(interactions, key=lambda i: (i.started_us, i.id)):
        by_scope.setdefault(interaction.scope, []).append(interaction)
    paths: list[Path] = []
    values: list[dict[str, Any]] = []
    for scope in sorted(by_scope):
        directory = folder / scope_dir(scope)
        for index, interaction in enumerate(by_scope[scope]):
            paths.append(directory / file_name(index, interaction))
            values.append(interaction_to_json(interaction, timing))
    values, blobs = share_blobs(values)
    for path, value in zip(paths, values, strict=True):
        make_dir(path.parent, private=private)
        _write_if_changed(path, dumps_pretty(value), private)
    blob_files = []
    if blobs:
        make_dir(folder / BLOBS, private=private)
    for digest in sorted(blobs):
        blob_files.append(blob_path(folder, digest))
        _write_if_changed(blob_files[-1], dumps_pretty(blobs[digest]), private)
    keep = {*paths, *blob_files}
    for stale in folder.glob("*/*.json"):
        if stale not in keep:
            stale.unlink()
    for directory in folder.iterdir():
        if directory.is_dir() and not any(directory.iterdir()):
            directory.rmdir()
    listed = [str(path.relative_to(folder)) for path in paths]
    _write_if_changed(
        folder / MANIFEST, dumps_pretty(new_manifest(listed, settings, timing)), private
    )
    return paths


def read_manifest(folder: Path, *, any_key_version: bool = False) -> dict[str, Any]:
    """The manifest of a folder this llmitm can read; ``any_key_version`` also takes one
    written under another match key version (``rec migrate`` re-keys it)."""
    path = folder / MANIFEST
    if not path.is_file():
        raise FolderError(f"{folder}: no {MANIFEST} (not a recordings folder)")
    try:
        manifest = orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError as exc:
        raise FolderError(f"{path}: not JSON ({exc})") from None
    return check_manifest(manifest, path, any_key_version=any_key_version)


def read_folder(folder: Path, *, any_key_version: bool = False) -> list[Interaction]:
    """Every interaction of a recordings folder, in scope and file order (``any_key_version``:
    see :func:`read_manifest`)."""
    manifest = read_manifest(folder, any_key_version=any_key_version)
    load = _blob_loader(folder)
    interactions = []
    for order, name in enumerate(manifest.get("interactions", [])):
        path = folder / name
        try:
            value = orjson.loads(path.read_bytes())
            if value.get("format", 1) >= 2:  # format 1 had no blobs: take its values as they are
                value = resolve_blobs(value, load)
            interaction = interaction_from_json(value, order)
            interaction.source = str(path)
            interactions.append(interaction)
        except FolderError as exc:
            raise FolderError(f"{path}: {exc}") from None
        except (OSError, orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise FolderError(f"{path}: {exc}") from None
    return interactions


def folder_problems(folder: Path) -> list[str]:
    """What is wrong with a recordings folder, one line each (empty: nothing): an unreadable
    manifest, listed files that are missing or broken, interaction files the manifest does not
    list, blobs referred to but missing, blobs no file refers to, blobs whose content does not
    match their name. For ``rec verify``."""
    try:
        manifest = read_manifest(folder)
    except FolderError as exc:
        return [str(exc)]
    problems: list[str] = []
    listed = [folder / name for name in manifest.get("interactions", [])]
    referrers: dict[str, list[str]] = {}
    load = _blob_loader(folder)
    for path in listed:
        name = str(path.relative_to(folder))
        try:
            value = orjson.loads(path.read_bytes())
        except FileNotFoundError:
            problems.append(f"{name}: listed in {MANIFEST} but missing")
            continue
        except orjson.JSONDecodeError as exc:
            problems.append(f"{name}: not JSON ({exc})")
            continue
        refs = blob_refs(value)
        for digest in refs:
            referrers.setdefault(digest, []).append(name)
        try:
            for digest in refs:
                load(digest)  # missing and broken blobs are reported below, once each
            interaction_from_json(resolve_blobs(value, load) if refs else value)
        except FolderError:
            pass
        except (KeyError, TypeError, ValueError) as exc:
            problems.append(f"{name}: {exc}")
    on_disk = {p for p in folder.glob("*/*.json") if p.parent.name != BLOBS}
    problems += [
        f"{p.relative_to(folder)}: not listed in {MANIFEST}" for p in sorted(on_disk - set(listed))
    ]
    blobs_on_disk = {p.stem: p for p in (folder / BLOBS).glob("*.json")}
    # Blobs that blobs refer to are in use too: follow references from the files down.
    contents: dict[str, Any] = {}
    pending = sorted(referrers)
    while pending:
        digest = pending.pop()
        path = blobs_on_disk.get(digest)
        if path is None or digest in contents:
            continue
        try:
            contents[digest] = orjson.loads(path.read_bytes())
        except orjson.JSONDecodeError as exc:
            contents[digest] = None
            problems.append(f"{path.relative_to(folder)}: not JSON ({exc})")
            continue
        for inner in blob_refs(contents[digest]):
            referrers.setdefault(inner, []).append(str(path.relative_to(folder)))
            pending.append(inner)
    for digest in sorted(referrers):
        path = folder / BLOBS / f"{digest}.json"
        if digest not in blobs_on_disk:
            problems.append(
                f"{path.relative_to(folder)}: missing (referred to by "
                f"{', '.join(sorted(set(referrers[digest])))})"
            )
    for digest, path in sorted(blobs_on_disk.items()):
        where = path.relative_to(folder)
        if digest not in referrers:
            problems.append(f"{where}: orphan blob (no interaction file refers to it)")
        elif (
            contents.get(digest) is not None
            and hashlib.sha256(orjson.dumps(contents[digest])).hexdigest() != digest
        ):
            problems.append(f"{where}: content does not match its name (edited by hand?)")
    return problems
