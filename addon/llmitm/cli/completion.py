"""``llmitm completion bash|zsh|fish``: a completion script for the shell, generated from the
same argparse tree that parses the command line (with shtab), so it never lists a command or
option that does not exist."""

from __future__ import annotations

import argparse
from typing import Any

import shtab

SHELLS = ("bash", "zsh", "fish")


def add_parser(commands: Any) -> None:
    completion = commands.add_parser(
        "completion",
        help="print a shell completion script: llmitm completion bash|zsh|fish",
        description="Print a completion script for llmitm's commands and options. Load it "
        "once in the current shell (bash: source <(llmitm completion bash)), or save it where "
        "the shell looks for completions.",
    )
    completion.add_argument("shell", choices=SHELLS)


def completion_command(parser: argparse.ArgumentParser, shell: str) -> int:
    print(shtab.complete(parser, shell=shell), end="")
    return 0
