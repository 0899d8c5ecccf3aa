"""Owner-only folders and files for whatever may hold prompts and answers: the store's
folder, recording folders and exports.

The mode is given when the file or folder is created (``os.open``/``mkdir`` with a mode),
never set afterwards, so there is no moment in which another user could open it; the umask
can only narrow it. What already exists keeps the mode its owner gave it. ``private=False``
asks for the umask's modes instead (a folder meant to be shared).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600
UMASK_DIR = 0o777
UMASK_FILE = 0o666


def make_dir(path: Path, *, private: bool = True, parents: bool = False) -> None:
    """Create ``path`` (owner-only unless ``private`` is false) if it does not exist;
    missing parents, when asked for, get the umask's mode like any other folder."""
    if parents:
        path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir(mode=PRIVATE_DIR if private else UMASK_DIR)
    except FileExistsError:
        if not path.is_dir():
            raise


def open_for_writing(path: Path, *, private: bool = True) -> BinaryIO:
    """``path`` opened to be written from its start (created owner-only unless ``private``
    is false)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags, PRIVATE_FILE if private else UMASK_FILE)
    return os.fdopen(fd, "wb")


def write_file(path: Path, data: bytes, *, private: bool = True) -> None:
    """Write ``data`` as the whole of ``path`` (created owner-only unless ``private`` is
    false)."""
    with open_for_writing(path, private=private) as out:
        out.write(data)
