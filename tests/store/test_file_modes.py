"""Whatever may hold prompts is owner-only even under ``umask 000``: the store's folder and
database files, recording folders and every export (``--umask`` asks for the umask's modes)."""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmitm.cli import main
from llmitm.file_modes import make_dir, write_file
from llmitm.store import SqliteStore
from llmitm.store import folder as folder_files

ROOT = Path(__file__).resolve().parents[2]
RECORDINGS = ROOT / "recordings"


@pytest.fixture
def umask_000() -> Iterator[None]:
    previous = os.umask(0)
    try:
        yield
    finally:
        os.umask(previous)


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_helpers_are_owner_only_or_the_umask_when_asked(tmp_path: Path, umask_000: None) -> None:
    make_dir(tmp_path / "a" / "b", parents=True)
    write_file(tmp_path / "a" / "b" / "f", b"x")
    assert mode(tmp_path / "a" / "b") == 0o700 and mode(tmp_path / "a" / "b" / "f") == 0o600
    make_dir(tmp_path / "shared", private=False)
    write_file(tmp_path / "shared" / "f", b"x", private=False)
    assert mode(tmp_path / "shared") == 0o777 and mode(tmp_path / "shared" / "f") == 0o666


def test_what_exists_keeps_its_mode(tmp_path: Path, umask_000: None) -> None:
    (tmp_path / "mine").mkdir(mode=0o755)
    (tmp_path / "mine" / "f").write_bytes(b"old")
    (tmp_path / "mine" / "f").chmod(0o644)
    make_dir(tmp_path / "mine")
    write_file(tmp_path / "mine" / "f", b"new")
    assert mode(tmp_path / "mine") == 0o755 and mode(tmp_path / "mine" / "f") == 0o644
    assert (tmp_path / "mine" / "f").read_bytes() == b"new"


async def test_the_store_folder_and_its_files_are_owner_only(
    tmp_path: Path, umask_000: None
) -> None:
    path = tmp_path / "data" / "llmitm" / "llmitm.db"
    store = SqliteStore(path)
    await store.open()
    try:
        assert mode(path.parent) == 0o700
        files = [p for p in path.parent.iterdir() if p.name.startswith("llmitm.db")]
        assert path in files and len(files) >= 2  # the database and its WAL companions
        assert {mode(p) for p in files} == {0o600}
    finally:
        await store.close()


def tree_modes(root: Path) -> tuple[set[int], set[int]]:
    dirs = {mode(root)} | {mode(p) for p in root.rglob("*") if p.is_dir()}
    files = {mode(p) for p in root.rglob("*") if p.is_file()}
    return dirs, files


def test_a_written_recordings_folder_is_owner_only(tmp_path: Path, umask_000: None) -> None:
    interactions = folder_files.read_folder(RECORDINGS)
    folder_files.write_folder(tmp_path / "out", interactions)
    dirs, files = tree_modes(tmp_path / "out")
    assert dirs == {0o700} and files == {0o600}
    folder_files.write_folder(tmp_path / "shared", interactions, private=False)
    assert tree_modes(tmp_path / "shared") == ({0o777}, {0o666})


@pytest.mark.parametrize("kind", ["folder", "--har", "--flows"])
def test_rec_export_is_owner_only_unless_asked(
    tmp_path: Path, umask_000: None, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "recordings"
    shutil.copytree(RECORDINGS, source)
    flag = [] if kind == "folder" else [kind]
    private, shared = tmp_path / "private.out", tmp_path / "shared.out"
    assert main(["rec", "export", str(private), "--from-folder", str(source), *flag]) == 0
    assert main(["rec", "export", str(shared), "--from-folder", str(source), *flag, "--umask"]) == 0
    capsys.readouterr()
    if kind == "folder":
        assert tree_modes(private) == ({0o700}, {0o600})
        assert tree_modes(shared) == ({0o777}, {0o666})
    else:
        assert mode(private) == 0o600 and private.stat().st_size
        assert mode(shared) == 0o666
