"""Real processes for end-to-end tests: llmitm (``llmitm run`` → mitmdump) and the fake
upstream (``python -m llmitm.testing.fake_upstream``), each on a free loopback port, stopped
on exit."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[2]
LLMITM = Path(sys.executable).with_name("llmitm")
FAKE_UPSTREAM = (sys.executable, "-m", "llmitm.testing.fake_upstream")

TWO_ENDPOINTS = """
[endpoints.chat-only]
kind = "compatible"
base_url = "{chat}/v1"
apis = ["chat"]

[endpoints.responses-only]
kind = "openai"
base_url = "{responses}/v1"
apis = ["responses"]

[[routes]]
models = ["over-chat*"]
endpoints = ["chat-only"]

[[routes]]
models = ["over-responses*"]
endpoints = ["responses-only"]
"""
"""A chat-only and a Responses-only fake upstream behind routes chosen by model name
(``over-chat…`` / ``over-responses…``); format with ``chat=`` and ``responses=`` URLs."""


@dataclass
class Proxy:
    """A running llmitm process."""

    process: subprocess.Popen[bytes]
    listening: dict
    log: Path

    def port(self, kind: str = "reverse") -> int:
        for server in self.listening["servers"]:
            if server["type"] == kind:
                return int(server["addresses"][0][1])
        raise LookupError(f"no {kind} listener in {self.listening}")

    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port('reverse')}/v1"

    @property
    def ca_file(self) -> str:
        return self.listening["ca_file"]

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def _wait_for_file(path: Path, process: subprocess.Popen[bytes], log: Path) -> bytes:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if path.exists() and path.stat().st_size:
            return path.read_bytes()
        if process.poll() is not None:
            raise RuntimeError(f"process exited with {process.returncode}:\n{log.read_text()}")
        time.sleep(0.05)
    raise TimeoutError(f"not ready after 60 s:\n{log.read_text()}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextmanager
def llmitm_proxy(
    tmp: Path,
    *,
    config: str | None = None,
    modes: Sequence[str] = ("reverse:http://127.0.0.1:9",),
    extra: Sequence[str] = (),
    env: dict[str, str] | None = None,
) -> Iterator[Proxy]:
    """``llmitm run`` with ``config`` (TOML text) in ``modes``, a private confdir (its own CA)
    and a listen file to learn the ports."""
    tmp.mkdir(parents=True, exist_ok=True)
    argv = [str(LLMITM), "run"]
    if config is not None:
        config_path = tmp / "llmitm.toml"
        config_path.write_text(config)
        argv += ["--config", str(config_path)]
    listenfile = tmp / "listen.json"
    listenfile.unlink(missing_ok=True)  # a stale file would name a dead process's port
    log = tmp / "llmitm.log"
    for mode in modes:
        argv += ["--mode", mode]
    argv += [
        "--listen-port", "0",
        "--set", f"confdir={tmp / 'confdir'}",
        "--set", f"llmitm_listenfile={listenfile}",
        "--set", "termlog_verbosity=warn",
        "--set", "flow_detail=0",
        *extra,
    ]  # fmt: skip
    if not any(item.startswith("llmitm_store=") for item in extra):
        # Never the user's own store. (mitmproxy refuses a --set repeated for one option.)
        argv += ["--set", f"llmitm_store={tmp / 'llmitm.db'}"]
    with log.open("wb") as log_file:
        process = subprocess.Popen(
            argv,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
        )
    try:
        listening = orjson.loads(_wait_for_file(listenfile, process, log))
        yield Proxy(process, listening, log)
    finally:
        _stop(process)


@dataclass
class Upstream:
    process: subprocess.Popen[bytes]
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextmanager
def fake_upstream(
    tmp: Path, apis: str = "chat,responses", *, fault: str = "", name: str = "", id_prefix: str = ""
) -> Iterator[Upstream]:
    """The deterministic fake upstream as a process serving ``apis`` (``fault``: scenario
    options forced on every request; ``name`` tells several fakes' files apart; ``id_prefix``
    makes the response ids it mints its own)."""
    tmp.mkdir(parents=True, exist_ok=True)
    stem = name or f"fake-{apis.replace(',', '-')}"
    port_file = tmp / f"{stem}.port"
    log = tmp / f"{stem}.log"
    port_file.unlink(missing_ok=True)
    with log.open("wb") as log_file:
        process = subprocess.Popen(
            [*FAKE_UPSTREAM, "--port", "0", "--port-file", str(port_file),
             "--apis", apis, *(["--fault", fault] if fault else []),
             *(["--id-prefix", id_prefix] if id_prefix else [])],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
    try:
        port = int(_wait_for_file(port_file, process, log).strip())
        yield Upstream(process, port)
    finally:
        _stop(process)


def llmitm_run(
    tmp: Path,
    config: str,
    *command: str,
    options: Sequence[str] = (),
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``llmitm run --config <config> -- command`` as a user's shell starts it: an environment
    without proxy variables or OpenAI/Codex settings (what would point the app elsewhere), plus
    ``env``; the store off, mitmproxy's files in ``tmp``."""
    path = tmp / "llmitm.toml"
    path.write_text(config)
    inherited = {
        name: value
        for name, value in os.environ.items()
        if not re.fullmatch(r"(?i)(https?|all|no)_proxy|(OPENAI|CODEX)_\w+", name)
    }
    return subprocess.run(
        [str(LLMITM), "run", "--config", str(path), "--set", f"confdir={tmp / 'confdir'}",
         "--set", "llmitm_store=", "-q", *options, "--", *command],
        capture_output=True, text=True, timeout=90, check=False,
        env={**inherited, **(env or {})},
    )  # fmt: skip


def shown(result: subprocess.CompletedProcess[str]) -> str:
    """The ends of a finished process's output, for an assertion's message."""
    return f"--- stdout\n{result.stdout[-3000:]}\n--- stderr\n{result.stderr[-3000:]}"
