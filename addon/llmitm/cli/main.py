"""``llmitm``: the command line's entry point, which hands each command to its module.

llmitm run [--config FILE] [--base-url] [--replay DIR | --record DIR] [mitmdump options] [-- CMD]
llmitm translate --to {chat,responses} [--reasoning MODE] [FILE|-]
llmitm usage [--db PATH] [--since YYYY-MM-DD|7d|24h] [--by endpoint|model|day|route] [--json]
llmitm rec ls | show ID | diff A B | diff --last-miss | export | import | verify | check-secrets
           | prune    (see llmitm.cli.rec)
llmitm completion bash|zsh|fish

Every command's ``--help`` ends with an example (``examples``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from llmitm import __version__
from llmitm.cli import translate
from llmitm.cli.examples import add_examples

DESCRIPTION = "An LLM-aware mitmproxy addon: Chat Completions <-> Responses translation."


def _top() -> tuple[argparse.ArgumentParser, Any]:
    parser = argparse.ArgumentParser(prog="llmitm", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"llmitm {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    return parser, commands


def _translate_parser() -> argparse.ArgumentParser:
    """The parser of ``llmitm translate`` alone: a whole process translating a stream pays
    for importing the translators, not the store, the console or mitmproxy's options."""
    parser, commands = _top()
    translate.add_parser(commands)
    add_examples(parser)
    return parser


def _parser() -> argparse.ArgumentParser:
    from llmitm.cli import completion, rec, usage
    from llmitm.cli.run_args import add_run_options

    parser, commands = _top()
    # For --help and completion only: main() hands run's arguments to it before argparse
    # sees them (they are mitmdump's too).
    run = commands.add_parser(
        "run",
        help="run the proxy, alone or around a command: llmitm run [--config FILE] "
        "[mitmdump options] [-- COMMAND ...] (llmitm run --help)",
    )
    add_run_options(run)
    translate.add_parser(commands)
    usage.add_parser(commands)
    rec.add_parser(commands)
    completion.add_parser(commands)
    add_examples(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["run"]:
        # run's options are mitmdump's, which argparse must not interpret.
        from llmitm.cli.run import run

        return run(argv[1:])
    if argv[:1] == ["translate"]:
        return translate.translate_command(_translate_parser().parse_args(argv))
    args = _parser().parse_args(argv)
    from llmitm.cli import completion, rec, usage

    if args.command == "translate":
        return translate.translate_command(args)
    if args.command == "usage":
        return usage.usage_command(args.db, args.since, args.by, args.json)
    if args.command == "rec":
        return rec.rec_command(args)
    if args.command == "completion":
        return completion.completion_command(_parser(), args.shell)
    raise AssertionError(f"unhandled command {args.command}")  # argparse requires a command


if __name__ == "__main__":
    sys.exit(main())
