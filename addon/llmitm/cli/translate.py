"""``llmitm translate``: a request body, JSON response body or SSE stream read from a file or
stdin and written to stdout as its translation for the other API (the kind is detected from
the content). Unreadable input is one line on stderr and exit status 2."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from llmitm.translate.context import TranslateOptions
from llmitm.translate.document import UnreadableInput, translate_document
from llmitm.translate.errors import TranslationError
from llmitm.wire.ids import CountingIds, fixed_clock
from llmitm.wire.modes import REASONING_MODES

EXIT_UNREADABLE = 2


def add_parser(commands: Any) -> None:
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


def _read(path: str) -> bytes:
    if path == "-":
        return sys.stdin.buffer.read()
    return Path(path).read_bytes()


def translate_command(args: argparse.Namespace) -> int:
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
