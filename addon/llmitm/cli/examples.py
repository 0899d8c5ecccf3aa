"""An example at the end of every ``llmitm`` command's ``--help``, attached to the argparse tree
after the command modules built it, so each module keeps to its options.

:func:`add_examples` fails on a command without an example here: a new command gets one or
the command line does not start (and its test says which).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

# Keyed by the command's words after ``llmitm``; ``()`` is ``llmitm`` itself.
EXAMPLES: dict[tuple[str, ...], tuple[str, ...]] = {
    (): (
        "llmitm run --config llmitm.toml",
        "llmitm run -- codex exec 'list the files here'",
        "llmitm rec ls",
    ),
    ("run",): ("llmitm run --config llmitm.toml",),
    ("translate",): ("llmitm translate --to chat examples/azure-responses-stream.sse",),
    ("usage",): ("llmitm usage --since 7d --by model",),
    ("completion",): (
        "llmitm completion bash > ~/.local/share/bash-completion/completions/llmitm",
        "llmitm completion zsh > ~/.zfunc/_llmitm",
        "llmitm completion fish > ~/.config/fish/completions/llmitm.fish",
    ),
    ("rec",): ("llmitm rec ls --limit 10",),
    ("rec", "ls"): ("llmitm rec ls --limit 10", "llmitm rec ls --folder tests/recordings"),
    ("rec", "show"): ("llmitm rec show ID", "llmitm rec show ID --timeline"),
    ("rec", "diff"): ("llmitm rec diff --last-miss", "llmitm rec diff ID1 ID2"),
    ("rec", "why"): ("llmitm rec why request.json --folder tests/recordings",),
    ("rec", "export"): (
        "llmitm rec export tests/recordings",
        "llmitm rec export --har calls.har",
    ),
    ("rec", "import"): ("llmitm rec import tests/recordings",),
    ("rec", "verify"): ("llmitm rec verify tests/recordings",),
    ("rec", "migrate"): ("llmitm rec migrate tests/recordings",),
    ("rec", "check-secrets"): ("llmitm rec check-secrets tests/recordings",),
    ("rec", "prune"): ("llmitm rec prune --older-than 30d",),
}


def add_examples(parser: argparse.ArgumentParser) -> None:
    """Give ``parser`` and every command below it its examples as the help's epilog."""
    for words, command in walk(parser):
        if words not in EXAMPLES:
            raise LookupError(f"no --help example for: llmitm {' '.join(words)}".rstrip())
        lines = "\n".join(f"  {example}" for example in EXAMPLES[words])
        command.epilog = f"example{'s' if len(EXAMPLES[words]) > 1 else ''}:\n{lines}"
        command.formatter_class = ExampleFormatter


def walk(
    parser: argparse.ArgumentParser, words: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """``parser`` and each command below it, with the words that name it."""
    yield words, parser
    for action in parser._actions:  # argparse keeps its tree here, and nowhere public
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from walk(child, (*words, name))


class ExampleFormatter(argparse.HelpFormatter):
    """argparse's default, but indented lines (the examples) are kept as they are."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n  " in text:
            return "\n".join(indent + line for line in text.splitlines())
        return super()._fill_text(text, width, indent)
