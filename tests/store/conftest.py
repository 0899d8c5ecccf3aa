"""The ``backend`` fixture: each test that takes it runs against SQLite and PostgreSQL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.store.backends import Backend


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "sqlite":
        yield Backend("sqlite", tmp_path)
        return
    server = request.getfixturevalue("postgres")
    monkeypatch = request.getfixturevalue("monkeypatch")
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)  # the password reaches llmitm as a user gives it
    made = Backend("postgresql", tmp_path, server.create_database, server.psql)
    yield made
    for dsn in made._databases.values():
        server.drop_database(dsn)
