"""pytest plugin: record a test suite's OpenAI traffic once, replay it in CI.

Registered as the ``llmitm`` pytest11 entry point. Use the ``llmitm`` fixture in a test (or
``@pytest.mark.usefixtures("llmitm")``); the openai SDK then talks to one llmitm proxy per
session through ``OPENAI_BASE_URL``, scoped per test (``/llmitm-scope/<test id>/v1``), so
parallel and reordered tests never share answers.

Options:
  --llmitm-record-mode   replay (default: never goes upstream, a miss fails the test),
                         once, replay-or-record, rewrite, record, off
  --llmitm-recordings    the recordings folder (default: recordings/ under the rootdir)
  --llmitm-upstream      where recording modes forward (default https://api.openai.com)
  --llmitm-config        an llmitm TOML configuration (routes, endpoints)
  --llmitm-allow-record-in-ci
                         record although CI is set (llmitm refuses to write recordings
                         there otherwise: a CI job should replay, not re-record)

The proxy runs **in the test process**: a mitmproxy master with llmitm's addons on its own
event loop in a daemon thread named ``llmitm`` (:mod:`llmitm.addons.hosts.inprocess`), started on
first use and stopped — writing the folder in recording modes — at the end of the session.
mitmproxy keeps its master in the process-global ``mitmproxy.ctx``: a test that runs its own
mitmproxy master while llmitm's runs would clash with it, so the plugin refuses to start
beside a running master, and re-points ``ctx`` at its own when a finished test left another.

A replay miss answers the SDK with a 400 (``openai.BadRequestError``) that carries the
proxy's message; the test fails with it, and its report gets an ``llmitm`` section with the
misses and llmitm's log lines of that test. A test that swallows the error fails all the
same. ``llmitm.hits``, ``llmitm.misses`` and ``llmitm.exchanges`` list what the test did.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from llmitm.replay.pool import scope_path
from llmitm.routing.config import ConfigError, load_config

if TYPE_CHECKING:
    from llmitm.addons.hosts.inprocess import Exchange, InProcessProxy

LOG_EXCERPT_LINES = 60
MODES = ("replay", "once", "replay-or-record", "rewrite", "record", "off")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("llmitm", "llmitm record and replay")
    group.addoption("--llmitm-record-mode", choices=MODES, default="replay")
    group.addoption("--llmitm-recordings", default=None, metavar="DIR")
    group.addoption("--llmitm-upstream", default="https://api.openai.com", metavar="URL")
    group.addoption("--llmitm-config", default=None, metavar="FILE")
    group.addoption("--llmitm-allow-record-in-ci", action="store_true", default=False)


class _TestLog(logging.Handler):
    """llmitm's log records, kept for the test that runs now (one at a time per process)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        self.lines: list[str] | None = None

    def emit(self, record: logging.LogRecord) -> None:
        lines = self.lines
        if lines is not None:
            lines.append(self.format(record))


@dataclass
class LlmitmProxy:
    """The session's proxy: ``url`` is its reverse listener, ``folder`` the recordings."""

    url: str
    folder: Path
    mode: str
    server: InProcessProxy
    exchanges: dict[str, list[Exchange]]
    log: _TestLog

    def base_url(self, scope: str) -> str:
        return f"{self.url}{scope_path(scope)}/v1"


@dataclass
class LlmitmScope:
    """What the ``llmitm`` fixture gives a test."""

    base_url: str
    scope: str
    proxy: LlmitmProxy
    log: list[str] = field(default_factory=list)
    """llmitm's log lines while this test ran."""

    @property
    def exchanges(self) -> list[Exchange]:
        """The API calls this test made through the proxy, in order."""
        return list(self.proxy.exchanges.get(self.scope, ()))

    @property
    def hits(self) -> list[Exchange]:
        return [e for e in self.exchanges if e.outcome == "hit"]

    @property
    def misses(self) -> list[Exchange]:
        return [e for e in self.exchanges if e.outcome == "miss"]


_SCOPE_KEY = pytest.StashKey[LlmitmScope]()


@pytest.fixture(scope="session")
def llmitm_proxy(pytestconfig: pytest.Config) -> Iterator[LlmitmProxy]:
    from llmitm.addons.hosts.inprocess import InProcessError, InProcessProxy

    option = pytestconfig.getoption
    folder = Path(option("--llmitm-recordings") or pytestconfig.rootpath / "recordings")
    mode = option("--llmitm-record-mode")
    config = option("--llmitm-config")
    if config:
        try:
            load_config(config)
        except ConfigError as exc:
            pytest.fail(f"llmitm: {exc}", pytrace=False)
    exchanges: dict[str, list[Exchange]] = {}
    lock = threading.Lock()

    def note(scope: str, exchange: Exchange) -> None:  # called in the proxy's thread
        with lock:
            exchanges.setdefault(scope, []).append(exchange)

    logger = logging.getLogger("llmitm")
    level = logger.level
    if level == logging.NOTSET:
        logger.setLevel(logging.INFO)  # "n recordings loaded", "wrote n recordings"
    log = _TestLog()
    logger.addHandler(log)
    with tempfile.TemporaryDirectory(prefix="llmitm-pytest-") as scratch:
        settings = {
            "mode": [f"reverse:{option('--llmitm-upstream')}"],
            "listen_host": "127.0.0.1",
            "listen_port": 0,
            "connection_strategy": "lazy",
            "confdir": str(Path(scratch) / "confdir"),
            "llmitm_record": mode,
            "llmitm_recordings": str(folder),
            "llmitm_store": "",
            "llmitm_console": "off",
            "llmitm_allow_record_in_ci": bool(option("--llmitm-allow-record-in-ci")),
        }
        if config:
            settings["llmitm_config"] = config
        server = InProcessProxy(settings, note)
        try:
            try:
                server.start()
            except InProcessError as exc:
                pytest.fail(str(exc), pytrace=False)
            url = f"http://127.0.0.1:{server.port()}"
            yield LlmitmProxy(url, folder, mode, server, exchanges, log)
        finally:
            try:
                server.stop()  # the done hooks write the folder in a recording mode
            finally:
                logger.removeHandler(log)
                logger.setLevel(level)


@pytest.fixture
def llmitm(
    llmitm_proxy: LlmitmProxy, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[LlmitmScope]:
    """Point the openai SDK (``OPENAI_BASE_URL``) at the proxy, in this test's own scope."""
    _reclaim_ctx(llmitm_proxy)
    scope = request.node.nodeid
    base_url = llmitm_proxy.base_url(scope)
    monkeypatch.setenv("OPENAI_BASE_URL", base_url)
    if llmitm_proxy.mode == "replay" and not os.environ.get("OPENAI_API_KEY"):
        monkeypatch.setenv("OPENAI_API_KEY", "sk-llmitm-replay-needs-no-key")
    current = LlmitmScope(base_url, scope, llmitm_proxy)
    request.node.stash[_SCOPE_KEY] = current
    llmitm_proxy.log.lines = current.log
    try:
        yield current
    finally:
        llmitm_proxy.log.lines = None


def _reclaim_ctx(proxy: LlmitmProxy) -> None:
    """A test that made its own mitmproxy master (``taddons.context()`` does) left it in
    ``mitmproxy.ctx``, which llmitm's addons read: point it back at the session's master."""
    from llmitm.addons.hosts.inprocess import reclaim_ctx

    if proxy.server.master is not None:
        reclaim_ctx(proxy.server.master)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> pytest.TestReport:
    report: pytest.TestReport = yield
    current = item.stash.get(_SCOPE_KEY, None)
    if current is None or report.when != "call":
        return report
    misses = current.misses
    if not misses:
        return report
    text = _miss_text(current, misses)
    report.sections.append(("llmitm replay misses", text))
    if report.passed:
        # The code under test caught the 400: the recordings are stale all the same.
        report.outcome = "failed"
        report.longrepr = f"llmitm: {len(misses)} replay miss(es) in a passing test\n{text}"
    return report


def _miss_text(current: LlmitmScope, misses: list[Exchange]) -> str:
    lines = [f"{len(misses)} replay miss(es) in scope {current.scope!r}:"]
    lines += [f"  {m.method} {m.path} -> {m.status}: {m.message}" for m in misses]
    if current.log:
        excerpt = "\n".join(current.log).splitlines()
        cut = excerpt[:LOG_EXCERPT_LINES]
        more = len(excerpt) - len(cut)
        lines += ["llmitm log:", *cut, *([f"… {more} more line(s)"] if more else [])]
    return "\n".join(lines)
