"""The command line explains itself: ``llmitm run --help`` lists llmitm's own options and says
where mitmdump's are, every command's help ends with an example, and ``llmitm completion``
prints a script each shell accepts, generated from the same parser (bash completes for real)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from llmitm.cli.examples import EXAMPLES, walk
from llmitm.cli.main import _parser, main
from llmitm.cli.run_args import RUN_OPTIONS, parse_run_args

LLMITM = (sys.executable, "-m", "llmitm.cli")
RUN_FLAGS = [
    "--config",
    "--base-url",
    "--record",
    "--replay",
    "--fail-on-unused",
    "--report",
    "--junit",
    "--transparent",
    "-v",
    "--verbose",
    "--help-mitmdump",
]


def llmitm(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*LLMITM, *argv], capture_output=True, text=True, timeout=60, check=False)


def test_run_help_lists_llmitms_options_with_help_and_points_at_mitmdumps() -> None:
    result = llmitm("run", "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: llmitm run ")
    for flag in RUN_FLAGS:
        line = next(line for line in result.stdout.splitlines() if f" {flag}" in line)
        assert len(line.split()) > 2, f"{flag} has no help: {line!r}"
    assert "llmitm run --help-mitmdump" in result.stdout
    assert "examples:\n  llmitm run --config llmitm.toml" in result.stdout
    assert len(result.stdout.splitlines()) < 60  # not mitmdump's 200 lines
    assert result.stderr == ""


# For each option in the help, a command line using it that parse_run_args accepts.
USING = {
    "--config": ["--config", "c.toml"],
    "--base-url": ["--base-url"],
    "--transparent": ["--transparent", "--", "true"],
    "--record": ["--record", "d"],
    "--replay": ["--replay", "d"],
    "--fail-on-unused": ["--replay", "d", "--fail-on-unused"],
    "--report": ["--replay", "d", "--report", "r.json"],
    "--junit": ["--replay", "d", "--junit", "r.xml"],
    "-v": ["-v"],
    "--verbose": ["--verbose"],
    "--help-mitmdump": ["--help-mitmdump"],
}


def test_every_option_in_the_help_is_llmitms_own_and_none_reaches_mitmdump() -> None:
    listed = {flag for flags, _, _ in RUN_OPTIONS for flag in flags}
    assert listed == set(USING)
    for flag, argv in USING.items():
        assert parse_run_args(argv).mitmdump == [], flag


def test_help_mitmdump_shows_mitmdumps_options_and_exits_0() -> None:
    result = llmitm("run", "--help-mitmdump")
    assert result.returncode == 0, result.stderr
    assert "--listen-port PORT" in result.stdout
    assert "--mode" in result.stdout


@pytest.mark.parametrize("words", sorted(words for words in EXAMPLES if words != ("run",)))
def test_every_commands_help_ends_with_an_example(
    words: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([*words, "--help"])
    assert exit_.value.code == 0
    help_text = capsys.readouterr().out
    tail = help_text.rstrip("\n").split("\n\n")[-1]
    assert tail.startswith(("example:\n", "examples:\n")), help_text
    for example in EXAMPLES[words]:
        assert f"\n  {example}" in tail
        assert example.startswith(" ".join(("llmitm", *words[:1])))


def test_every_command_in_the_tree_has_an_example() -> None:
    # _parser() raises on a command without one; this names the tree it walked.
    commands = {words for words, _ in walk(_parser())}
    assert commands == set(EXAMPLES)
    assert {("run",), ("rec", "ls"), ("completion",)} <= commands


def test_completion_rejects_an_unknown_shell(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["completion", "tcsh"])
    assert exit_.value.code == 2
    assert "invalid choice: 'tcsh'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("shell", "marker", "check"),
    [
        ("bash", "complete -o bashdefault -F _shtab_llmitm llmitm", ["bash", "-n"]),
        ("zsh", "#compdef llmitm", ["zsh", "-n"]),
        ("fish", "complete -c llmitm", ["fish", "--no-execute"]),
    ],
)
def test_completion_prints_a_script_the_shell_accepts(
    shell: str, marker: str, check: list[str], tmp_path: object
) -> None:
    result = llmitm("completion", shell)
    assert result.returncode == 0, result.stderr
    assert marker in result.stdout
    for word in ("run", "rec", "translate", "usage", "--config", "--replay", "check-secrets"):
        assert word in result.stdout, word
    if shutil.which(check[0]) is None:
        return  # the shell is not installed here; bash is, and is run below
    syntax = subprocess.run(
        check, input=result.stdout, capture_output=True, text=True, timeout=30, check=False
    )
    assert syntax.returncode == 0, syntax.stderr


def bash_complete(script: str, line: str) -> list[str]:
    """What bash offers for ``line`` (the cursor at its end) with ``script`` loaded."""
    words = line.split(" ")
    program = f"""
source /dev/stdin <<'LLMITM_COMPLETION'
{script}
LLMITM_COMPLETION
COMP_LINE={line!r}; COMP_POINT=${{#COMP_LINE}}
COMP_WORDS=({" ".join(repr(word) for word in words)}); COMP_CWORD={len(words) - 1}
_shtab_llmitm llmitm {words[-1]!r} {words[-2]!r}
printf '%s\\n' "${{COMPREPLY[@]}}"
"""
    result = subprocess.run(
        ["bash", "--norc", "--noprofile", "-c", program],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return sorted(filter(None, result.stdout.splitlines()))


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_bash_completes_commands_subcommands_and_run_options() -> None:
    script = llmitm("completion", "bash").stdout
    assert bash_complete(script, "llmitm r") == ["rec", "run"]
    assert "check-secrets" in bash_complete(script, "llmitm rec ")
    assert bash_complete(script, "llmitm run --rep") == ["--replay", "--report"]
    assert bash_complete(script, "llmitm completion ") == ["bash", "fish", "zsh"]
