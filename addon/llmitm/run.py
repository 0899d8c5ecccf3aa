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

from llmitm.command_env import command_environment, mode_kind, mode_problem, write_ca_bundles
from llmitm.errors import UserError
from llmitm.routing.config import ConfigError, load_config
from llmitm.transparent.command import TransparentRun, command_problem
from llmitm.transparent.namespace import NamespaceError
from llmitm.transparent.plan import user_modes

OPENAI_ORIGIN = "https://api.openai.com"
READY_TIMEOUT_S = 60.0


class RunUsageError(UserError, ValueError):
    """The command line of ``llmitm run`` is wrong."""


@dataclass(slots=True)
class RunArgs:
    config: str | None = None
    base_url: bool = False
    transparent: bool = False
    mitmdump: list[str] = field(default_factory=list)
    command: list[str] = field(default_factory=list)
    replay: str | None = None
    record: str | None = None
    fail_on_unused: bool = False
    report: str | None = None
    junit: str | None = None


# Options of llmitm run that take a value, and what to call that value in an error.
_VALUED = {
    "--config": ("config", "a file"),
    "--replay": ("replay", "a recordings folder"),
    "--record": ("record", "a recordings folder"),
    "--report": ("report", "a file"),
    "--junit": ("junit", "a file"),
}


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
        name, equals, inline = item.partition("=")
        if name in _VALUED:
            if equals:
                value = inline
                index += 1
            elif index + 1 < len(items):
                value = items[index + 1]
                index += 2
            else:
                value = ""
                index += 1
            attribute, what = _VALUED[name]
            if not value:
                raise RunUsageError(f"{name} needs {what}")
            setattr(args, attribute, value)
            continue
        if item == "--base-url":
            args.base_url = True
        elif item == "--transparent":
            args.transparent = True
        elif item == "--fail-on-unused":
            args.fail_on_unused = True
        else:
            args.mitmdump.append(item)
        index += 1
    if args.replay and args.record:
        raise RunUsageError("--replay and --record exclude each other")
    if (args.fail_on_unused or args.report or args.junit) and not args.replay:
        raise RunUsageError("--fail-on-unused, --report and --junit go with --replay")
    if args.transparent and not args.command:
        raise RunUsageError("--transparent goes with a command: llmitm run --transparent -- CMD")
    if args.command and not args.transparent:  # --transparent checks its own (command_problem)
        modes = user_modes(args.mitmdump) or ["regular"]
        fixed_port = _gives(args.mitmdump, "--listen-port", "-p", "listen_port")
        problem = mode_problem(modes, base_url=args.base_url, fixed_port=fixed_port)
        # local mode is judged by the machine (command_problem says what stops it here).
        if problem and not any(mode_kind(spec) == "local" for spec in modes):
            raise RunUsageError(problem)
    return args


def mitmdump_argv(
    args: RunArgs, listenfile: str | None = None, report: str | None = None
) -> list[str]:
    """mitmdump's arguments (its master already holds llmitm's addons: ``addons.entry``):
    safe defaults, then the user's options (which win: mitmdump takes the last value of an
    option)."""
    argv = ["--set", "connection_strategy=lazy"]
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
    # A mode the user sets (rewrite, once, …) wins: mitmdump refuses an option set twice.
    own_mode = _gives(user, "--set=llmitm_record", None, "llmitm_record")
    if args.replay:
        argv += [] if own_mode else ["--set", "llmitm_record=replay"]
        argv += ["--set", f"llmitm_recordings={args.replay}"]
    if args.record:
        argv += [] if own_mode else ["--set", "llmitm_record=record"]
        argv += ["--set", f"llmitm_recordings={args.record}"]
    if report:
        argv += ["--set", f"llmitm_replay_report={report}"]
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
        from llmitm.addons.entry import run_mitmdump

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
                "llmitm.addons.entry",
                *mitmdump_argv(args, str(listenfile), report),
                *(namespace.proxy_args() if namespace else ()),
            ],
            stdin=subprocess.DEVNULL,
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


def write_junit(args: RunArgs, report: Path) -> None:
    """The replay report as JUnit XML at ``--junit`` (nothing without it, or without a
    report: the proxy failed to start, which the exit status already says)."""
    if not args.junit or not args.replay or not report.is_file():
        return
    from llmitm.replay import folder as folder_format
    from llmitm.replay.junit import junit_xml
    from llmitm.store import folder as folder_files

    scopes: dict[str, int] = {}
    scope_of: dict[str, str] = {}
    try:
        for interaction in folder_files.read_folder(Path(args.replay)):
            scopes[interaction.scope] = scopes.get(interaction.scope, 0) + 1
            scope_of[interaction.id] = interaction.scope
    except folder_format.FolderError as exc:
        print(f"llmitm run: {exc}", file=sys.stderr)  # the report still lists the problems
    document = orjson.loads(report.read_bytes())
    data = junit_xml(document, scopes, scope_of, fail_on_unused=args.fail_on_unused)
    try:
        Path(args.junit).write_bytes(data)
    except OSError as exc:
        print(f"llmitm run: cannot write {args.junit}: {exc.strerror}", file=sys.stderr)


def replay_verdict(report: Path, status: int, *, fail_on_unused: bool) -> int:
    """The exit status of a replayed command: its own when it failed, else 1 on any miss,
    on drift refused by ``llmitm_strict_drift``, or (when asked) on an unused recording; the
    report's gist goes to stderr."""
    if not report.is_file():
        print("llmitm run: the proxy wrote no replay report", file=sys.stderr)
        return status or 1
    document = orjson.loads(report.read_bytes())
    misses, unused = document.get("misses", []), document.get("unused", [])
    refused = document.get("drift", []) if document.get("strict_drift") else []
    print(
        f"llmitm run: replay: {document.get('hits', 0)} hit(s), {len(misses)} miss(es), "
        f"{len(unused)} unused recording(s)",
        file=sys.stderr,
    )
    for miss in misses:
        print(
            f"  miss: {miss['request']} model={miss['model']} key={miss['key']} "
            f"scope={miss['scope']} ({miss['reason']}); closest {miss['closest']}",
            file=sys.stderr,
        )
    for drift in refused:
        print(f"  drift: {drift['id']} (llmitm_strict_drift)", file=sys.stderr)
    if fail_on_unused:
        for item in unused:
            print(f"  unused: {item['id']} {item['route']} scope={item['scope']}", file=sys.stderr)
    if status:
        return status
    return 1 if misses or refused or (fail_on_unused and unused) else 0


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
