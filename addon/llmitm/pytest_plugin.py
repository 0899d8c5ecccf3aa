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

The proxy is ``llmitm``'s mitmdump in a child process (a mitmproxy master owns process-wide
state, so it does not share the test process), started on first use and stopped — writing the
folder in recording modes — at the end of the session.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest

from llmitm.replay.pool import scope_path

MODES = ("replay", "once", "replay-or-record", "rewrite", "record", "off")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("llmitm", "llmitm record and replay")
    group.addoption("--llmitm-record-mode", choices=MODES, default="replay")
    group.addoption("--llmitm-recordings", default=None, metavar="DIR")
    group.addoption("--llmitm-upstream", default="https://api.openai.com", metavar="URL")
    group.addoption("--llmitm-config", default=None, metavar="FILE")


@dataclass
class LlmitmProxy:
    """The session's proxy: ``url`` is its reverse listener, ``folder`` the recordings."""

    url: str
    folder: Path
    mode: str
    process: subprocess.Popen[bytes]
    log: Path

    def base_url(self, scope: str) -> str:
        return f"{self.url}{scope_path(scope)}/v1"


@dataclass
class LlmitmScope:
    """What the ``llmitm`` fixture gives a test."""

    base_url: str
    scope: str
    proxy: LlmitmProxy


@pytest.fixture(scope="session")
def llmitm_proxy(pytestconfig: pytest.Config) -> Iterator[LlmitmProxy]:
    option = pytestconfig.getoption
    folder = Path(option("--llmitm-recordings") or pytestconfig.rootpath / "recordings")
    mode = option("--llmitm-record-mode")
    with tempfile.TemporaryDirectory(prefix="llmitm-pytest-") as scratch:
        tmp = Path(scratch)
        listenfile, log = tmp / "listen.json", tmp / "llmitm.log"
        argv = [
            sys.executable, "-m", "llmitm.addons.entry",
            "--mode", f"reverse:{option('--llmitm-upstream')}",
            "--listen-host", "127.0.0.1", "--listen-port", "0",
            "--set", "connection_strategy=lazy",
            "--set", f"confdir={tmp / 'confdir'}",
            "--set", f"llmitm_listenfile={listenfile}",
            "--set", f"llmitm_record={mode}",
            "--set", f"llmitm_recordings={folder}",
            "--set", "llmitm_store=",
            "--set", "termlog_verbosity=warn", "--set", "flow_detail=0",
        ]  # fmt: skip
        if option("--llmitm-config"):
            argv += ["--set", f"llmitm_config={option('--llmitm-config')}"]
        with log.open("wb") as out:
            process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        try:
            listening = _wait(listenfile, process, log)
            (port,) = [s["addresses"][0][1] for s in listening["servers"] if s["type"] == "reverse"]
            yield LlmitmProxy(f"http://127.0.0.1:{port}", folder, mode, process, log)
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()


@pytest.fixture
def llmitm(
    llmitm_proxy: LlmitmProxy, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> LlmitmScope:
    """Point the openai SDK (``OPENAI_BASE_URL``) at the proxy, in this test's own scope."""
    scope = request.node.nodeid
    base_url = llmitm_proxy.base_url(scope)
    monkeypatch.setenv("OPENAI_BASE_URL", base_url)
    if llmitm_proxy.mode == "replay" and not os.environ.get("OPENAI_API_KEY"):
        monkeypatch.setenv("OPENAI_API_KEY", "sk-llmitm-replay-needs-no-key")
    return LlmitmScope(base_url, scope, llmitm_proxy)


def _wait(listenfile: Path, process: subprocess.Popen[bytes], log: Path) -> dict:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if listenfile.exists() and listenfile.stat().st_size:
            return orjson.loads(listenfile.read_bytes())
        if process.poll() is not None:
            break
        time.sleep(0.05)
    raise RuntimeError(f"llmitm did not start:\n{log.read_text(errors='replace')}")
