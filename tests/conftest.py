"""How the suite runs on several pytest-xdist workers (``make test`` runs ``pytest -n N
--dist loadfile``; see the Makefile). Without ``-n`` none of this does anything.

Which worker runs what (``work_unit``): each test module is one unit of work, so its tests
run on one worker, in file order, and a module-scoped fixture (a proxy, fake upstreams, the
Node clients' run) starts once, as in a serial run. The modules that use llama.cpp's server
(``LLAMA_MODULES``) are one unit together: one worker starts one server for all of them, and
their CPU-bound generation does not run on several workers at once, where two cores cannot
keep up with Codex's and the SDK's timeouts. A module whose tests share nothing can be split
(``SHARDS``). The units are handed out in the order the workers list the tests, which
``pytest_collection_modifyitems`` makes the slowest first (llama.cpp's unit, then the other
modules marked ``slow``: tests/e2e, the docs' commands), so that no long unit starts last and
runs alone at the end.

(The scheduler is this file's rather than xdist's ``loadgroup`` with ``xdist_group`` marks:
xdist 3.8 passes the group in the test's node id, which pytest 9.2 no longer lets a plugin
change, so under pytest 9.2 those marks silently group nothing.)

mitmproxy's default CA (``~/.mitmproxy``) is made once, by the controller, before any worker
starts. Every llmitm process a test starts has its own ``confdir`` except those the docs'
pages run (tests/docs), which use the default as a newcomer's would; on a fresh machine two
of them starting at once would both find no CA and both write one (mitmproxy writes the key
file in place, not atomically), and one could read the other's half-written key or trust a
CA the other overwrote. A machine that has run mitmproxy before already has its CA.
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFDIR = Path("~/.mitmproxy")

# The test modules that use the session fixture ``llama_server`` (tests/e2e/conftest.py); the
# layout test keeps this list whole.
LLAMA_FIXTURE = "llama_server"
LLAMA_MODULES = frozenset(
    {
        "tests/e2e/test_codex_default.py",
        "tests/e2e/test_compaction.py",
        "tests/e2e/test_harness.py",
        "tests/e2e/test_llamacpp.py",
        "tests/e2e/test_llamacpp_state.py",
        "tests/e2e/test_request_fields_llamacpp.py",
    }
)
LLAMA_UNIT = "tests/e2e (llama.cpp)"

# Modules split into several units (module -> units): each test goes to one by a hash of its
# id, each unit starts the module's fixtures for itself. Only for modules whose tests depend
# on no other test's state or order.
SHARDS: dict[str, int] = {
    # One page per test, each in its own folder with its own stand-ins and proxy port.
    "tests/docs/test_docs_commands.py": 3,
}


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def work_unit(nodeid: str) -> str:
    """The unit of work a test belongs to (all of a unit's tests run on one worker)."""
    module = module_of(nodeid)
    if module in LLAMA_MODULES:
        return LLAMA_UNIT
    shards = SHARDS.get(module, 1)
    if shards > 1:
        return f"{module}#{zlib.crc32(nodeid.encode()) % shards}"
    return module


def _is_xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def _is_xdist_controller(config: pytest.Config) -> bool:
    """The process that starts workers (``-n N`` with N > 0)."""
    return not _is_xdist_worker(config) and bool(getattr(config.option, "numprocesses", None))


def pytest_configure(config: pytest.Config) -> None:
    if not _is_xdist_controller(config):
        return
    confdir = DEFAULT_CONFDIR.expanduser()
    if (confdir / "mitmproxy-ca.pem").exists():
        return
    # mitmproxy's own routine (what mitmdump runs at start when the CA is missing), with
    # mitmproxy's defaults: basename "mitmproxy", a 2048-bit key.
    from mitmproxy.certs import CertStore

    CertStore.from_store(os.fspath(confdir), "mitmproxy", 2048)


@pytest.hookimpl(optionalhook=True)  # an xdist hook: without xdist, never called
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile`` with this file's units instead of xdist's one per file."""
    if config.getvalue("dist") != "loadfile":
        return None  # xdist's own
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return UnitScheduling(config, log)


def _is_slow(item: pytest.Item) -> bool:
    # tests/e2e/conftest.py marks its tests slow in a hook that may run after this one.
    return item.nodeid.startswith("tests/e2e/") or item.get_closest_marker("slow") is not None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not _is_xdist_worker(config):
        return  # a serial run keeps pytest's own order
    slow = {module_of(item.nodeid) for item in items if _is_slow(item)}
    # Stable: modules stay whole and in file order, llama.cpp's unit first, then the other
    # slow ones. Every worker sorts the same collection the same way, as xdist requires.
    items.sort(
        key=lambda item: (
            work_unit(item.nodeid) != LLAMA_UNIT,
            module_of(item.nodeid) not in slow,
        )
    )


@pytest.fixture(scope="session")
def postgres() -> Any:
    """A real PostgreSQL server for this worker (tests/helpers/postgres.py), started on first
    use and stopped at the end of the session."""
    from tests.helpers.postgres import postgres_server

    with postgres_server() as server:
        yield server


@pytest.fixture
def pg_dsn(postgres: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A fresh, empty database on the worker's server: its DSN (no password in it), with the
    password in ``PGPASSWORD`` for this test, as a user of llmitm would pass it."""
    dsn = postgres.create_database()
    for name, value in postgres.env().items():
        monkeypatch.setenv(name, value)
    yield dsn
    postgres.drop_database(dsn)
