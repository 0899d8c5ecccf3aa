"""``llmitm run``: mitmdump with llmitm's addons, alone or around a command.

    llmitm run [--config FILE] [--base-url] [mitmdump options …] [-- COMMAND …]

Alone it is mitmdump in this process, listening on 127.0.0.1:8080 in regular mode unless the
options say otherwise. With ``-- COMMAND`` it starts mitmdump as a child on a free port, waits
until it listens, runs the command with ``HTTPS_PROXY`` and the CA variables pointing at it
(``OPENAI_BASE_URL`` too with ``--base-url``, through an added reverse listener), stops the
proxy and exits with the command's status.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import orjson

import llmitm
from llmitm.routing.config import ConfigError, load_config

SCRIPT = Path(llmitm.__file__).parent / "addons" / "mitmproxy_script.py"
OPENAI_ORIGIN = "https://api.openai.com"
READY_TIMEOUT_S = 60.0
CA_VARIABLES = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS")


class RunUsageError(ValueError):
    """The command line of ``llmitm run`` is wrong."""


@dataclass(slots=True)
class RunArgs:
    config: str | None = None
    base_url: bool = False
    mitmdump: list[str] = field(default_factory=list)
    command: list[str] = field(default_factory=list)


def parse_run_args(argv: Sequence[str]) -> RunArgs:
    """Split llmitm's own options from mitmdump's and from the command after ``--``."""
    args = RunArgs()
    items = list(argv)
    if "--" in items:
        cut = items.index("--")
        items, args.command = items[:cut], items[cut + 1 :]
        if not args.command:
            raise RunUsageError("nothing to run after --")
    index = 0
    while index < len(items):
        item = items[index]
        if item == "--config":
            if index + 1 >= len(items):
                raise RunUsageError("--config needs a file")
            args.config = items[index + 1]
            index += 2
            continue
        if item.startswith("--config="):
            args.config = item.partition("=")[2]
            if not args.config:
                raise RunUsageError("--config needs a file")
        elif item == "--base-url":
            args.base_url = True
        else:
            args.mitmdump.append(item)
        index += 1
    return args


def mitmdump_argv(args: RunArgs, listenfile: str | None = None) -> list[str]:
    """mitmdump's arguments: llmitm's script and safe defaults, then the user's options
    (which win: mitmdump takes the last value of an option)."""
    argv = ["-s", str(SCRIPT), "--set", "connection_strategy=lazy"]
    user = args.mitmdump
    if not _gives(user, "--listen-host", None, "listen_host"):
        argv += ["--listen-host", "127.0.0.1"]
    if args.command and not _gives(user, "--listen-port", "-p", "listen_port"):
        argv += ["--listen-port", "0"]  # a free port: the command learns it from us
    if args.base_url:
        if not _gives(user, "--mode", "-m", "mode"):
            argv += ["--mode", "regular"]
        # On a port of its own: mitmproxy refuses two servers on one address, port 0 included.
        argv += ["--mode", f"reverse:{OPENAI_ORIGIN}@{_free_port()}"]
    if args.command and not _gives(user, "--llmitm-console", None, "llmitm_console"):
        # The command owns the terminal: a live display (or summary lines in its stdout)
        # would fight with its output. ``--set llmitm_console=lines`` brings them back.
        argv += ["--set", "llmitm_console=off"]
    if args.config:
        argv += ["--set", f"llmitm_config={args.config}"]
    if listenfile:
        argv += ["--set", f"llmitm_listenfile={listenfile}"]
    return argv + args.mitmdump


def _gives(user: Sequence[str], long: str, short: str | None, option: str) -> bool:
    """Whether the user's mitmdump arguments set ``option`` in any of mitmdump's spellings:
    ``--long v``, ``--long=v``, ``-s v``, ``-sv``, ``--set option=v``."""
    for index, item in enumerate(user):
        if item == long or item.startswith(long + "="):
            return True
        if short and item.startswith(short) and not item.startswith("--"):
            return True
        if item.startswith(option + "=") and index and user[index - 1] == "--set":
            return True
        if item == "--set=" + option or item.startswith(f"--set={option}="):
            return True
    return False


def run(argv: Sequence[str]) -> int:
    try:
        args = parse_run_args(argv)
    except RunUsageError as exc:
        print(f"llmitm run: {exc}", file=sys.stderr)
        return 2
    if args.config:
        try:
            load_config(args.config)  # fail here, in one line, not inside mitmdump
        except ConfigError as exc:
            print(f"llmitm run: {exc}", file=sys.stderr)
            return 2
    if not args.command:
        from llmitm.addons.entry import run_mitmdump

        return run_mitmdump(mitmdump_argv(args))
    return _run_command(args)


def _run_command(args: RunArgs) -> int:
    with tempfile.TemporaryDirectory(prefix="llmitm-run-") as scratch:
        listenfile = Path(scratch) / "listen.json"
        proxy = subprocess.Popen(
            [sys.executable, "-m", "llmitm.addons.entry", *mitmdump_argv(args, str(listenfile))],
            stdin=subprocess.DEVNULL,
        )
        try:
            listening = _wait_for(listenfile, proxy)
            if listening is None:
                print("llmitm run: the proxy did not start (see above)", file=sys.stderr)
                return proxy.wait() or 1
            env = dict(os.environ)
            env.update(command_environment(listening, base_url=args.base_url))
            try:
                return subprocess.run(args.command, env=env, check=False).returncode
            except FileNotFoundError:
                print(f"llmitm run: {args.command[0]}: command not found", file=sys.stderr)
                return 127
            except KeyboardInterrupt:
                return 130
        finally:
            _stop(proxy)


def command_environment(listening: dict, *, base_url: bool) -> dict[str, str]:
    """The variables that point a command at the proxy and make it trust mitmproxy's CA."""
    env: dict[str, str] = {}
    for server in listening["servers"]:
        host, port = server["addresses"][0]
        host = "127.0.0.1" if host in ("", "0.0.0.0", "::") else host
        host = f"[{host}]" if ":" in host else host  # an IPv6 literal in a URL
        if server["type"] == "regular" and "HTTPS_PROXY" not in env:
            env["HTTPS_PROXY"] = env["https_proxy"] = f"http://{host}:{port}"
        if server["type"] == "reverse" and base_url and "OPENAI_BASE_URL" not in env:
            env["OPENAI_BASE_URL"] = f"http://{host}:{port}/v1"
    for variable in CA_VARIABLES:
        env[variable] = listening["ca_file"]
    return env


def _free_port() -> int:
    """A loopback port nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_for(listenfile: Path, proxy: subprocess.Popen[bytes]) -> dict | None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if listenfile.exists():
            return orjson.loads(listenfile.read_bytes())
        if proxy.poll() is not None:
            return None
        time.sleep(0.05)
    return None


def _stop(proxy: subprocess.Popen[bytes]) -> None:
    if proxy.poll() is not None:
        return
    proxy.send_signal(signal.SIGTERM)
    try:
        proxy.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proxy.kill()
        proxy.wait()
