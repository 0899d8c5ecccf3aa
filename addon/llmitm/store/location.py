"""Where the store lives when nobody says: the user's data folder (XDG), shared by the proxy
and ``llmitm usage`` so both find the same file."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def default_store_path(environ: Mapping[str, str] | None = None) -> Path:
    """``$XDG_DATA_HOME/llmitm/llmitm.db``, or ``~/.local/share/llmitm/llmitm.db``."""
    env = os.environ if environ is None else environ
    data_home = env.get("XDG_DATA_HOME", "")
    # The XDG spec says a relative value is invalid and must be ignored.
    base = Path(data_home) if os.path.isabs(data_home) else Path("~/.local/share").expanduser()
    return base / "llmitm" / "llmitm.db"
