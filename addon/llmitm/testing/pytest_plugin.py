"""pytest plugin: record a test suite's OpenAI traffic once, replay it in CI.

Registered as the ``llmitm`` pytest11 entry point. Use the ``llmitm`` fixture in a test (or
``@pytest.mark.usefixtures("llmitm")``); the openai SDK then talks to one llmitm proxy per
session through ``OPENAI_BASE_URL``, scoped per test (``/llmitm-scope/<test id>/v1``), so
parallel and reordered tests never share answers.

Settings, each a command-line option and an ini setting of the same name with ``_`` (the
command line wins; ``pytest --help`` lists them with their help):
  --llmitm-record-mode   replay (default: never goes upstream, a miss fails the test),
                         once, replay-or-record, rewrite, record, off
  --llmitm-recordings    the recordings folder (default: recordings/ under the rootdir)
  --llmitm-upstream      where recording modes forward (default https://api.openai.com)
  --llmitm-config        an llmitm TOML configuration (routes, endpoints)
  --llmitm-match-ignore  a dotted request-body path match keys ignore (repeatable)
  --llmitm-allow-record-in-ci
                         record although CI is set (llmitm refuses to write recordings
                         there otherwise: a CI job should replay, not re-record)

``@pytest.mark.llmitm(record_mode=…, scope=…, match_ignore=[…])`` sets them for one test (or
a module, a class) and wins over both, as pytest-recording's ``vcr`` marker does; ``scope``
names the recordings the test uses (tests with one scope share them). The
``pytest_llmitm_before_record`` hook (:mod:`llmitm.testing.hooks`) filters or edits what is
recorded.

The proxy runs **in the test process**: a mitmproxy master with llmitm's addons on its own
event loop in a daemon thread named ``llmitm`` (:mod:`llmitm.addons.hosts.inprocess`), started on
first use and stopped — writing the folder in recording modes — at the end of the session.
A test whose marker asks for another record mode or other ignored fields gets a proxy with
those settings: the running one stops (writing what it recorded) and the new one reads the
folder, so the recordings stay one folder. mitmproxy keeps its master in the
process-global ``mitmproxy.ctx``: a test that runs its own mitmproxy master while llmitm's
runs would clash with it, so the plugin refuses to start beside a running master, and
re-points ``ctx`` at its own when a finished test left another.

A replay miss answers the SDK with a 400 (``openai.BadRequestError``) that carries the
proxy's message, whose advice names this plugin's switches; the test fails with it, and its
report gets an ``llmitm`` section with the misses and llmitm's log lines of that test. A test
that swallows the error fails all the same. ``llmitm.hits``, ``llmitm.misses`` and
``llmitm.exchanges`` list what the test did.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from llmitm.replay.keys import parse_ignore
from llmitm.replay.pool import scope_path
from llmitm.routing.config import ConfigError, load_config
from llmitm.testing import hooks

if TYPE_CHECKING:
    from llmitm.addons.hosts.inprocess import Exchange, InProcessProxy
    from llmitm.replay.model import Interaction

LOG_EXCERPT_LINES = 60
MODES = ("replay", "once", "replay-or-record", "rewrite", "record", "off")
MARKER_ARGS = ("record_mode", "scope", "match_ignore")
MISS_ADVICE = (
    "Record it with --llmitm-record-mode=replay-or-record (or "
    '@pytest.mark.llmitm(record_mode="replay-or-record") on the test), or make a field not '
    'count with --llmitm-match-ignore=PATH (or @pytest.mark.llmitm(match_ignore=["PATH"])).'
)
MARKER_HELP = (
    "llmitm(record_mode=None, scope=None, match_ignore=None): llmitm record and replay "
    "settings for this test, over --llmitm-* and the llmitm_* ini settings. record_mode: "
    f"{', '.join(MODES)}; scope: the name of the recordings the test uses (default: its "
    "node id); match_ignore: dotted request-body paths match keys ignore."
)


@dataclass(frozen=True, slots=True)
class _Option:
    """One setting: ``--llmitm-<name>`` on the command line, ``llmitm_<name>`` in the ini."""

    name: str
    help: str
    ini_type: str | None = None
    default: Any = None
    metavar: str | None = None

    @property
    def flag(self) -> str:
        return "--llmitm-" + self.name

    @property
    def ini(self) -> str:
        return "llmitm_" + self.name.replace("-", "_")


OPTIONS = (
    _Option(
        "record-mode",
        f"replay (the default: never goes upstream, a miss fails the test), once (replay a "
        f"scope that has recordings, record one that has none), replay-or-record, rewrite "
        f"(re-record each scope), record, off (no proxy work). One of: {', '.join(MODES)}.",
        default="replay",
        metavar="MODE",
    ),
    _Option(
        "recordings",
        "The recordings folder replay reads and recording modes write at the end of the "
        "session (default: recordings/ under the rootdir).",
        metavar="DIR",
    ),
    _Option(
        "upstream",
        "Where recording modes forward the calls (default: https://api.openai.com).",
        default="https://api.openai.com",
        metavar="URL",
    ),
    _Option(
        "config",
        "An llmitm TOML configuration (endpoints, routes) for the proxy.",
        metavar="FILE",
    ),
    _Option(
        "match-ignore",
        "A dotted request-body path match keys ignore, e.g. messages.0.content or "
        "tools.*.description (repeatable, or comma-separated).",
        ini_type="linelist",
        default=[],
        metavar="PATH",
    ),
    _Option(
        "allow-record-in-ci",
        "Record although CI is set; llmitm refuses to write recordings there otherwise (a "
        "CI job should replay, not re-record).",
        ini_type="bool",
        default=False,
    ),
)
_BY_NAME = {option.name: option for option in OPTIONS}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("llmitm", "llmitm record and replay")
    for option in OPTIONS:
        # Every default is None: unset on the command line means "ask the ini".
        if option.ini_type == "bool":
            group.addoption(option.flag, action="store_true", default=None, help=option.help)
        elif option.ini_type == "linelist":
            group.addoption(
                option.flag, action="append", default=None, metavar=option.metavar,
                help=option.help,
            )  # fmt: skip
        else:
            choices = MODES if option.name == "record-mode" else None
            group.addoption(
                option.flag, default=None, choices=choices, metavar=option.metavar,
                help=option.help,
            )  # fmt: skip
        ini_help = f"{option.help} (the command line's {option.flag} wins)"
        parser.addini(option.ini, ini_help, type=option.ini_type, default=option.default)  # type: ignore[arg-type]


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hooks)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER_HELP)
    mode = setting(config, "record-mode")
    if mode not in MODES:
        raise pytest.UsageError(
            f"llmitm_record_mode = {mode!r} in the ini file: expected one of {', '.join(MODES)}"
        )


def setting(config: pytest.Config, name: str) -> Any:
    """The command line's value of a setting when given, else the ini file's (or default)."""
    option = _BY_NAME[name]
    given = config.getoption(option.flag)
    if given is not None:
        return given
    value = config.getini(option.ini)
    return value if value not in ("", None) else option.default


@dataclass(frozen=True, slots=True)
class ProxySettings:
    """What a proxy is started with that a marker may change for one test."""

    mode: str
    match_ignore: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ScopeSettings:
    proxy: ProxySettings
    scope: str


def scope_settings(item: pytest.Item, session: ProxySettings) -> ScopeSettings:
    """The session's settings under the closest ``llmitm`` marker's (a test's over its
    class's over its module's)."""
    marker = item.get_closest_marker("llmitm")
    scope = item.nodeid
    if marker is None:
        return ScopeSettings(session, scope)
    if marker.args:
        pytest.fail(f"llmitm marker: takes keywords only ({', '.join(MARKER_ARGS)})", False)
    unknown = sorted(set(marker.kwargs) - set(MARKER_ARGS))
    if unknown:
        pytest.fail(
            f"llmitm marker: unknown argument(s) {', '.join(unknown)}; it takes "
            f"{', '.join(MARKER_ARGS)}",
            pytrace=False,
        )
    proxy = session
    mode = marker.kwargs.get("record_mode")
    if mode is not None:
        if mode not in MODES:
            pytest.fail(
                f"llmitm marker: record_mode={mode!r}; expected one of {', '.join(MODES)}", False
            )
        proxy = replace(proxy, mode=mode)
    ignore = marker.kwargs.get("match_ignore")
    if ignore is not None:
        paths = [ignore] if isinstance(ignore, str) else list(ignore)
        proxy = replace(proxy, match_ignore=_ignore_paths(paths))
    scope = marker.kwargs.get("scope") or scope
    if not isinstance(scope, str):
        pytest.fail(f"llmitm marker: scope must be a string, not {scope!r}", pytrace=False)
    return ScopeSettings(proxy, scope)


def _ignore_paths(values: list[str]) -> tuple[str, ...]:
    try:
        return tuple(path for value in values for path in parse_ignore(str(value)))
    except ValueError as exc:
        pytest.fail(f"llmitm: match_ignore: {exc}", pytrace=False)


def _import_proxy() -> Any:
    """llmitm's in-process host, imported with the DeprecationWarnings that mitmproxy's
    ldap3 dependency raises about pyasn1 names silenced (they are not the user's to fix);
    any other warning still reaches the user's summary."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", r"(tagMap|typeMap) is deprecated", DeprecationWarning, r"ldap3(\.|$)"
        )
        from llmitm.addons.hosts import inprocess
    return inprocess


def _before_record(config: pytest.Config) -> Callable[[Interaction], Interaction | None] | None:
    """The ``pytest_llmitm_before_record`` implementations as one filter, each fed what the
    one before returned (pluggy would collect their results instead); ``None`` when there
    are none, so the recorder keeps its fast path."""
    caller = config.hook.pytest_llmitm_before_record
    if not caller.get_hookimpls():
        return None

    def run(interaction: Interaction) -> Interaction | None:
        # pluggy calls the last registered first: keep its order.
        current: Interaction | None = interaction
        for impl in reversed(caller.get_hookimpls()):
            current = impl.function(**{name: current for name in impl.argnames})
            if current is None:
                return None
        return current

    return run


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


class LlmitmProxy:
    """The session's proxy: ``url`` is its reverse listener, ``folder`` the recordings.

    One runs at a time (mitmproxy's ``ctx`` holds one master per process); :meth:`use`
    swaps it for one with other settings when a marked test asks for them.
    """

    def __init__(
        self,
        base: dict[str, Any],
        folder: Path,
        settings: ProxySettings,
        before_record: Callable[[Interaction], Interaction | None] | None,
        log: _TestLog,
    ) -> None:
        self.base = base
        self.folder = folder
        self.session = settings
        """The command line's and the ini's settings; a marker changes ``settings``."""
        self.settings = settings
        self.before_record = before_record
        self.log = log
        self.exchanges: dict[str, list[Exchange]] = {}
        self.server: InProcessProxy | None = None
        self.url = ""
        self._lock = threading.Lock()

    @property
    def mode(self) -> str:
        return self.settings.mode

    def base_url(self, scope: str) -> str:
        return f"{self.url}{scope_path(scope)}/v1"

    def use(self, settings: ProxySettings) -> None:
        """A running proxy with ``settings``: the current one, or a new one after the
        current one stopped (and wrote the folder in a recording mode)."""
        if self.server is not None and settings == self.settings:
            return
        self.stop()
        inprocess = _import_proxy()
        self.settings = settings
        options = {
            **self.base,
            "llmitm_record": settings.mode,
            "llmitm_match_ignore": list(settings.match_ignore),
        }
        server = inprocess.InProcessProxy(options, self._note, self.before_record)
        failure = None
        try:
            server.start()
        except inprocess.InProcessError as exc:
            failure = str(exc)
        if failure is not None:  # outside the except: no "during handling of" chain
            pytest.fail(failure, pytrace=False)
        self.server = server
        self.url = f"http://127.0.0.1:{server.port()}"

    def stop(self) -> None:
        server, self.server = self.server, None
        if server is not None:
            server.stop()  # the done hooks write the folder in a recording mode

    def _note(self, scope: str, exchange: Exchange) -> None:  # called in the proxy's thread
        with self._lock:
            self.exchanges.setdefault(scope, []).append(exchange)


@dataclass
class LlmitmScope:
    """What the ``llmitm`` fixture gives a test."""

    base_url: str
    scope: str
    proxy: LlmitmProxy
    log: list[str] = field(default_factory=list)
    """llmitm's log lines while this test ran."""

    @property
    def mode(self) -> str:
        """The record mode this test runs in (the marker's, else the session's)."""
        return self.proxy.mode

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
    """The session's in-process proxy, started by the first test that uses ``llmitm``."""
    recordings = setting(pytestconfig, "recordings")
    folder = pytestconfig.rootpath / (recordings or "recordings")  # an absolute one wins
    config = setting(pytestconfig, "config")
    if config:
        config = str(pytestconfig.rootpath / config)
        try:
            load_config(config)
        except ConfigError as exc:
            pytest.fail(f"llmitm: {exc}", pytrace=False)
    ignore = setting(pytestconfig, "match-ignore")
    session = ProxySettings(setting(pytestconfig, "record-mode"), _ignore_paths(ignore))
    logger = logging.getLogger("llmitm")
    level = logger.level
    if level == logging.NOTSET:
        logger.setLevel(logging.INFO)  # "n recordings loaded", "wrote n recordings"
    log = _TestLog()
    logger.addHandler(log)
    with tempfile.TemporaryDirectory(prefix="llmitm-pytest-") as scratch:
        base: dict[str, Any] = {
            "mode": [f"reverse:{setting(pytestconfig, 'upstream')}"],
            "listen_host": "127.0.0.1",
            "listen_port": 0,
            "connection_strategy": "lazy",
            "confdir": str(Path(scratch) / "confdir"),
            "llmitm_recordings": str(folder),
            "llmitm_store": "",
            "llmitm_console": "off",
            "llmitm_allow_record_in_ci": bool(setting(pytestconfig, "allow-record-in-ci")),
            "llmitm_miss_advice": MISS_ADVICE,
        }
        if config:
            base["llmitm_config"] = config
        proxy = LlmitmProxy(base, folder, session, _before_record(pytestconfig), log)
        try:
            yield proxy
        finally:
            try:
                proxy.stop()
            finally:
                logger.removeHandler(log)
                logger.setLevel(level)


@pytest.fixture
def llmitm(
    llmitm_proxy: LlmitmProxy, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[LlmitmScope]:
    """Point the openai SDK (``OPENAI_BASE_URL``) at the proxy, in this test's own scope."""
    wanted = scope_settings(request.node, llmitm_proxy.session)
    llmitm_proxy.use(wanted.proxy)
    _reclaim_ctx(llmitm_proxy)
    base_url = llmitm_proxy.base_url(wanted.scope)
    monkeypatch.setenv("OPENAI_BASE_URL", base_url)
    if llmitm_proxy.mode == "replay" and not os.environ.get("OPENAI_API_KEY"):
        monkeypatch.setenv("OPENAI_API_KEY", "sk-llmitm-replay-needs-no-key")
    current = LlmitmScope(base_url, wanted.scope, llmitm_proxy)
    request.node.stash[_SCOPE_KEY] = current
    llmitm_proxy.log.lines = current.log
    try:
        yield current
    finally:
        llmitm_proxy.log.lines = None


def _reclaim_ctx(proxy: LlmitmProxy) -> None:
    """A test that made its own mitmproxy master (``taddons.context()`` does) left it in
    ``mitmproxy.ctx``, which llmitm's addons read: point it back at the session's master."""
    reclaim_ctx = _import_proxy().reclaim_ctx
    if proxy.server is not None and proxy.server.master is not None:
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
