"""``llmitm run``: mitmdump with llmitm's addons, alone or around a command.

    llmitm run [--config FILE] [--base-url] [mitmdump options …] [-- COMMAND …]
    llmitm run --transparent [--config FILE] [mitmdump options …] -- COMMAND …
    llmitm run --replay DIR [--fail-on-unused] [--report FILE] [--junit FILE] … -- COMMAND …
    llmitm run --record DIR … [-- COMMAND …]

Alone it is mitmdump in this process, listening on 127.0.0.1:8080 in regular mode unless the
options say otherwise. With ``-- COMMAND`` it starts mitmdump as a child on a free port, waits
until it listens, runs the command with the proxy and CA variables real clients read pointing
at it (``command_env``; ``OPENAI_BASE_URL`` too with ``--base-url``, through an added reverse
listener), stops the proxy and exits with the command's status; a ``--mode`` that cannot carry
a command's traffic is refused before anything starts. ``--replay DIR`` serves the recordings
folder and never goes upstream; with a command, any miss (and, with ``--fail-on-unused``, any
recording never served) makes the exit status non-zero even when the command passed, and the JSON
report is written to ``--report`` (default ``DIR/../replay-report.json`` is not assumed:
without ``--report`` it is only summarised on stderr); ``--junit FILE`` writes it as JUnit
XML too, one testcase per scope (``replay.junit``). ``--record DIR`` writes the folder.
``--transparent`` runs the command in a network namespace of its own whose TCP and DNS go to
llmitm, for programs that ignore proxy variables (``llmitm.transparent``).

Here: starting, waiting for and stopping the proxy and the command. The command line is
parsed by ``run_args``; the replay report is judged and written as JUnit by ``run_report``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import orjson

from llmitm.cli.command_env import command_environment, write_ca_bundles
from llmitm.cli.run_args import RunArgs, RunUsageError, mitmdump_argv, parse_run_args, run_help
from llmitm.cli.run_report import replay_verdict, write_junit
from llmitm.routing.config import ConfigError, load_config
from llmitm.transparent.command import TransparentRun, command_problem
from llmitm.transparent.namespace import NamespaceError

READY_TIMEOUT_S = 60.0


def run(argv: Sequence[str]) -> int:
    try:
        args = parse_run_args(argv)
    except RunUsageError as exc:
        print(f"llmitm run: {exc}", file=sys.stderr)
        return 2
    if args.help:
        print(run_help(), end="")
        return 0
    if args.help_mitmdump:
        from llmitm.addons.hosts.entry import mitmdump_help

        return mitmdump_help()
    if args.config:
        try:
            load_config(args.config)  # fail here, in one line, not inside mitmdump
        except ConfigError as exc:
            print(f"llmitm run: {exc}", file=sys.stderr)
            return 2
    if args.replay and not Path(args.replay, "manifest.json").is_file():
        print(
            f"llmitm run: {args.replay}: not a recordings folder (no manifest.json)",
            file=sys.stderr,
        )
        return 2
    # A command line that cannot wrap the command fails here, before anything listens.
    wrap = {"transparent": args.transparent, "base_url": args.base_url}
    problem = command_problem(args.mitmdump, **wrap) if args.command else None
    if problem:
        print(f"llmitm run: {problem}", file=sys.stderr)
        return 2
    if not args.command:
        from llmitm.addons.hosts.entry import run_mitmdump

        if not args.junit:
            return run_mitmdump(mitmdump_argv(args, report=args.report))
        with tempfile.TemporaryDirectory(prefix="llmitm-run-") as scratch:
            report = args.report or str(Path(scratch) / "replay-report.json")
            status = run_mitmdump(mitmdump_argv(args, report=report))
            write_junit(args, Path(report))
            return status
    return _run_command(args)


def _run_command(args: RunArgs) -> int:
    with tempfile.TemporaryDirectory(prefix="llmitm-run-") as scratch:
        listenfile = Path(scratch) / "listen.json"
        report = args.report or (str(Path(scratch) / "replay-report.json") if args.replay else None)
        try:
            namespace = TransparentRun.prepare(Path(scratch)) if args.transparent else None
        except NamespaceError as exc:
            print(f"llmitm run: {exc}", file=sys.stderr)
            return 1
        proxy = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "llmitm.addons.hosts.entry",
                *mitmdump_argv(args, str(listenfile), report),
                *(namespace.proxy_args() if namespace else ()),
            ],
            stdin=subprocess.DEVNULL,
            # The command's stdout is its own: the proxy's lines (the first screen, llmitm's
            # log) go to stderr, each as it is written rather than when a buffer fills.
            stdout=_stderr_fd(),
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        status = 1
        try:
            listening = _wait_for(listenfile, proxy)
            if listening is None:
                print("llmitm run: the proxy did not start (see above)", file=sys.stderr)
                return proxy.wait() or 1
            try:
                env = _command_env(args, listening, Path(scratch))
            except OSError as exc:
                print(f"llmitm run: cannot write the CA bundles: {exc}", file=sys.stderr)
                return 1
            try:
                if namespace:
                    status = namespace.run(args.command, env, listening)
                else:
                    status = subprocess.run(args.command, env=env, check=False).returncode
            except NamespaceError as exc:
                print(f"llmitm run: {exc}", file=sys.stderr)
                return 1
            except FileNotFoundError:
                print(f"llmitm run: {args.command[0]}: command not found", file=sys.stderr)
                return 127
            except KeyboardInterrupt:
                return 130
        finally:
            _stop(proxy)
        if report is None:
            return status
        verdict = replay_verdict(Path(report), status, fail_on_unused=args.fail_on_unused)
        write_junit(args, Path(report))
        return verdict


def _command_env(args: RunArgs, listening: dict, scratch: Path) -> dict[str, str]:
    """The command's environment, its CA bundles written to ``scratch`` (gone with it)."""
    bundles, warnings = write_ca_bundles(listening["ca_file"], os.environ, scratch)
    for warning in warnings:
        print(f"llmitm run: {warning}", file=sys.stderr)
    return command_environment(
        listening, base_url=args.base_url, environ=os.environ, bundles=bundles
    )


def _stderr_fd() -> int:
    """This process's stderr as a file descriptor (2 when it is not a real file)."""
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return 2


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
