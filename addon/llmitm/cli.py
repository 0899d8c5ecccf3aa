"""The ``llmitm`` command line: argument parsing and I/O only; the work lives in the core.

llmitm translate --to {chat,responses} [--reasoning MODE] [FILE|-]
llmitm usage [--db PATH] [--since YYYY-MM-DD|7d|24h] [--by endpoint|model|day|route] [--json]
llmitm rec ls | show ID | diff A B | diff --last-miss | export | import | verify | check-secrets
           | prune    (see llmitm.rec_cli)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from llmitm import __version__
from llmitm.translate.context import TranslateOptions
from llmitm.translate.document import UnreadableInput, translate_document
from llmitm.translate.errors import TranslationError
from llmitm.wire.ids import CountingIds, fixed_clock
from llmitm.wire.modes import REASONING_MODES

EXIT_UNREADABLE = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llmitm",
        description="An LLM-aware mitmproxy addon: Chat Completions <-> Responses translation.",
    )
    parser.add_argument("--version", action="version", version=f"llmitm {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser(
        "run",
        help="run the proxy: llmitm run [--config FILE] [--base-url] [--replay DIR "
        "[--fail-on-unused] [--report FILE] | --record DIR] [mitmdump options] [-- COMMAND ...]",
        add_help=False,
    )

    translate = commands.add_parser(
        "translate",
        help="translate a request body, response body or SSE stream between the two APIs",
        description="Read a request body, a JSON response body or an SSE stream (the kind is "
        "detected from the content) and write its translation for the other API to stdout.",
    )
    translate.add_argument("--to", required=True, choices=("chat", "responses"))
    translate.add_argument(
        "--reasoning",
        choices=REASONING_MODES,
        default="think-tags",
        help="how reasoning reaches a chat client (default: think-tags)",
    )
    translate.add_argument("--model", help="model name to show in translated output")
    translate.add_argument(
        "--strict", action="store_true", help="refuse hosted tools and unsupported fields"
    )
    translate.add_argument(
        "--drop-unsupported",
        action="store_true",
        help="drop fields with no equivalent (n, stop) instead of refusing them",
    )
    translate.add_argument(
        "--think-open-missing",
        action="store_true",
        help="chat content starts inside <think> without the opening tag",
    )
    translate.add_argument(
        "--no-usage", action="store_true", help="omit the usage chunk from chat streams"
    )
    translate.add_argument(
        "--fixed-ids",
        action="store_true",
        help="deterministic ids and clock (reproducible output for tests and diffs)",
    )
    translate.add_argument("file", nargs="?", default="-", help="input file, or - for stdin")

    usage = commands.add_parser(
        "usage",
        help="token usage recorded by the proxy, summed per endpoint, model, day or route",
        description="Sum the token usage the proxy recorded (read-only; safe while it runs).",
    )
    usage.add_argument("--db", help="the store's file (default: $XDG_DATA_HOME/llmitm/llmitm.db)")
    usage.add_argument("--since", help="YYYY-MM-DD (UTC), or a span such as 7d, 24h, 30m")
    # Checked by the command, not argparse: a mistake is one line, exit 2.
    usage.add_argument("--by", default="endpoint", help="endpoint (default), model, day, route")
    usage.add_argument("--json", action="store_true", help="JSON for machines")

    from llmitm.rec_cli import add_parser as add_rec_parser

    add_rec_parser(commands)
    return parser


def _read(path: str) -> bytes:
    if path == "-":
        return sys.stdin.buffer.read()
    return Path(path).read_bytes()


def _translate(args: argparse.Namespace) -> int:
    try:
        data = _read(args.file)
    except OSError as exc:
        print(f"llmitm translate: cannot read {args.file}: {exc.strerror}", file=sys.stderr)
        return EXIT_UNREADABLE
    options = TranslateOptions(
        reasoning=args.reasoning,
        strict=args.strict,
        drop_unsupported=args.drop_unsupported,
        think_open_missing=args.think_open_missing,
        **({"ids": CountingIds(), "clock": fixed_clock(0.0)} if args.fixed_ids else {}),
    )
    try:
        result = translate_document(
            data, args.to, options, model=args.model, include_usage=not args.no_usage
        )
    except UnreadableInput as exc:
        print(f"llmitm translate: cannot translate: {exc}", file=sys.stderr)
        return EXIT_UNREADABLE
    except TranslationError as exc:
        print(f"llmitm translate: cannot translate: {exc.message}", file=sys.stderr)
        return EXIT_UNREADABLE
    for warning in result.warnings:
        print(f"llmitm translate: warning: {warning}", file=sys.stderr)
    sys.stdout.buffer.write(result.output)
    sys.stdout.buffer.flush()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["run"]:
        # run's options are mitmdump's, which argparse must not interpret.
        from llmitm.run import run

        return run(argv[1:])
    args = _parser().parse_args(argv)
    if args.command == "translate":
        return _translate(args)
    if args.command == "usage":
        from llmitm.usage_report import usage_command

        return usage_command(args.db, args.since, args.by, args.json)
    if args.command == "rec":
        from llmitm.rec_cli import rec_command

        return rec_command(args)
    raise AssertionError(f"unhandled command {args.command}")  # argparse requires a command


if __name__ == "__main__":
    sys.exit(main())
