"""``llmitm run``'s command line: llmitm's own options split from mitmdump's and from the
command after ``--`` (a ``--mode`` that cannot carry a command's traffic refused here, before
anything starts), the mitmdump arguments they become, and the help that lists them.

mitmdump's options pass through untouched, so argparse never parses this command line; the
parser :func:`add_run_options` builds only prints the help and feeds shell completion.
"""

from __future__ import annotations

import argparse
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field

from llmitm.cli.command_env import mode_kind, mode_problem
from llmitm.errors import UserError
from llmitm.transparent.plan import user_modes

OPENAI_ORIGIN = "https://api.openai.com"


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
    verbose: int = 0
    """``-v``: mitmproxy's connection and flow lines; ``-vv``: its debug log too."""
    help: bool = False
    help_mitmdump: bool = False


# llmitm run's own options for --help and completion: (flags, metavar or None, help).
RUN_OPTIONS: tuple[tuple[tuple[str, ...], str | None, str], ...] = (
    (("--config",), "FILE", "llmitm's TOML configuration: endpoints, routes, settings"),
    (
        ("--base-url",),
        None,
        "with a command: add a reverse listener and set OPENAI_BASE_URL for it",
    ),
    (
        ("--transparent",),
        None,
        "run the command in a network namespace of its own whose TCP and DNS go to llmitm "
        "(for programs that ignore proxy variables; Linux, needs nftables)",
    ),
    (("--record",), "DIR", "record every call into the recordings folder DIR"),
    (("--replay",), "DIR", "serve the recordings folder DIR and never go upstream"),
    (
        ("--fail-on-unused",),
        None,
        "with --replay and a command: fail when a recording was never served",
    ),
    (("--report",), "FILE", "with --replay: write the replay report (JSON) to FILE"),
    (("--junit",), "FILE", "with --replay: write the replay report as JUnit XML to FILE"),
    (
        ("-v", "--verbose"),
        None,
        "show mitmproxy's connection and flow lines (hidden by default); -vv: its debug log",
    ),
    (("--help-mitmdump",), None, "show mitmdump's options (all of them work here too)"),
)

RUN_EXAMPLES = """\
mitmdump's options work here too (--mode, --listen-port, --set OPTION=VALUE, ...):
see them with llmitm run --help-mitmdump, and llmitm's --set options with
llmitm run --options.

examples:
  llmitm run --config llmitm.toml
  llmitm run --config llmitm.toml --mode reverse:https://api.openai.com -p 8081
  OPENAI_API_KEY=sk-local llmitm run --config codex-local.toml -- codex exec "hello"
  llmitm run --replay tests/recordings --fail-on-unused -- pytest
"""


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """llmitm run's own options on ``parser`` (for its help and shell completion)."""
    for flags, metavar, text in RUN_OPTIONS:
        if metavar is None:
            parser.add_argument(*flags, action="store_true", help=text)
        else:
            parser.add_argument(*flags, metavar=metavar, help=text)
    parser.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        metavar="-- COMMAND ...",
        help="a command to run with the proxy and CA variables set; llmitm exits with its status",
    )


def run_help() -> str:
    """``llmitm run --help``: llmitm's options, then where mitmdump's are."""
    parser = argparse.ArgumentParser(
        prog="llmitm run",
        usage="llmitm run [llmitm options] [mitmdump options] [-- COMMAND ...]",
        description="Run the proxy (mitmdump with llmitm's addons), alone or around a command.",
        epilog=RUN_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_run_options(parser)
    return parser.format_help()


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
        elif item in ("-v", "--verbose"):
            args.verbose += 1
        elif item == "-vv":
            args.verbose += 2
        elif item in ("-h", "--help"):
            args.help = True
        elif item == "--help-mitmdump":
            args.help_mitmdump = True
        else:
            args.mitmdump.append(item)
        index += 1
    if args.help or args.help_mitmdump:
        return args  # nothing else is judged: the help is all that is shown
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
    """mitmdump's arguments (its master already holds llmitm's addons: ``addons.hosts.entry``):
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
    if args.command:
        argv += ["--set", "llmitm_wrapped=true"]  # the first screen says a command runs
    argv += _verbosity(args)
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


def _verbosity(args: RunArgs) -> list[str]:
    """Quiet by default: mitmproxy's connection lines and per-flow lines are hidden, llmitm's
    lines, warnings and errors stay; ``-v`` keeps mitmdump's default log, ``-vv`` is mitmdump's
    own ``-v`` (debug). An option the user sets wins."""
    if args.verbose >= 2:
        return ["-v"]
    if args.verbose:
        return []
    user = args.mitmdump
    argv = []
    if not _gives(user, "--set=llmitm_quiet", None, "llmitm_quiet"):
        argv += ["--set", "llmitm_quiet=true"]
    if not _gives(user, "--flow-detail", None, "flow_detail"):
        argv += ["--set", "flow_detail=0"]
    return argv


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


def _free_port() -> int:
    """A loopback port nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
