"""The ``backend`` fixture: each test that takes it runs against SQLite and PostgreSQL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.store.backends import Backend


@pytest.fixture
def pg_backend(postgres: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    """The PostgreSQL backend: databases on the worker's real server, made as a test asks
    for them and dropped after it, the password in ``PGPASSWORD`` as a user gives it."""
    for name, value in postgres.env().items():
        monkeypatch.setenv(name, value)
    made = Backend("postgresql", tmp_path, postgres.create_database, postgres.psql)
    yield made
    for dsn in made._databases.values():
        postgres.drop_database(dsn)


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "sqlite":
        return Backend("sqlite", tmp_path)
    return request.getfixturevalue("pg_backend")
