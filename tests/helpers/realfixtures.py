"""Real captured request bodies, read in place from ``shared/fixtures/real/``.

The folder sits next to the repository and is never copied in; a checkout without it skips
the tests that need it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

REAL = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "real"


def real_or_skip() -> Path:
    """The fixtures folder, or skip the calling test when this checkout lacks it."""
    if not REAL.is_dir():
        pytest.skip(f"{REAL} not present")
    return REAL


def load_json(name: str) -> Any:
    """One fixture file parsed (skips when missing)."""
    path = real_or_skip() / name
    if not path.exists():
        pytest.skip(f"{path} not present")
    return orjson.loads(path.read_bytes())


def request_fixtures(api: str) -> list[Any]:
    """pytest params: every ``*.request.json`` whose sidecar says it is an ``api`` request.

    Without the folder the single param skips, so the test shows as skipped, not missing.
    """
    if not REAL.is_dir():
        return [pytest.param(None, marks=pytest.mark.skip(reason=f"{REAL} not present"))]
    params = []
    for path in sorted(REAL.glob("*.request.json")):
        meta_path = path.with_name(path.name.removesuffix(".json") + ".meta.json")
        meta = orjson.loads(meta_path.read_bytes()) if meta_path.exists() else {}
        if meta.get("api") == api:
            params.append(pytest.param(path.name, id=path.name.removesuffix(".request.json")))
    return params
