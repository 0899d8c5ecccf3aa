"""Every command the README and ``docs/`` show is run, as a newcomer would type it: in a
fresh folder holding the files the page defines (and a copy of ``examples/``), with
``llmitm`` on ``PATH``, a real ``llmitm run`` where the block says so, and llmitm's fake
upstream standing in for the model servers the pages name (``127.0.0.1:8081``, a healthy
one; ``127.0.0.1:8082``, one that answers every call ``429``). Exit status 0 is required
and the output shown must appear. The conventions are in ``docs/README.md``."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.docs.doctext import (
    ROOT,
    SHELL_LANGUAGES,
    Block,
    doc_pages,
    output_matches,
    read_page,
)

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
COMMAND_TIMEOUT = 120
# The model servers the docs' examples name, and what stands in for each.
STAND_INS = {"127.0.0.1:8081": (), "127.0.0.1:8082": ("--fault", "status=429;retry_after=30")}


def _runnable_pages() -> list[Path]:
    return [
        path
        for path in doc_pages()
        if any(b.language == "console" and not b.not_run for b in _blocks(path))
    ]


def _blocks(path: Path) -> list[Block]:
    return read_page(path).blocks


def _free_port() -> int:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        return free.getsockname()[1]


def _wait_for(path: Path, process: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if path.exists() and path.stat().st_size:
            return
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}")
        time.sleep(0.05)
    raise TimeoutError(f"{what} not ready after 60 s")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


@contextmanager
def _stand_ins(folder: Path) -> Iterator[dict[str, str]]:
    """A fake upstream for each address the docs name: ``{"127.0.0.1:8081": "127.0.0.1:P"}``."""
    started: list[subprocess.Popen[bytes]] = []
    addresses: dict[str, str] = {}
    try:
        for index, (address, options) in enumerate(STAND_INS.items()):
            port_file = folder / f".fake-{index}.port"
            process = subprocess.Popen(
                [sys.executable, "-m", "llmitm.testing.fake_upstream", "--port-file",
                 str(port_file), *options],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            started.append(process)
            _wait_for(port_file, process, f"the fake upstream for {address}")
            addresses[address] = f"127.0.0.1:{port_file.read_text().strip()}"
        yield addresses
    finally:
        for process in started:
            _stop(process)


def _substitute(text: str, addresses: dict[str, str]) -> str:
    for shown, real in addresses.items():
        text = text.replace(shown, real)
    return text


@contextmanager
def _proxy(args: str, folder: Path, env: dict[str, str]) -> Iterator[None]:
    """``llmitm run ARGS`` on ``$LLMITM_PORT`` while a block runs, stopped after it."""
    listenfile = folder / ".listening.json"
    listenfile.unlink(missing_ok=True)
    command = f"exec llmitm run {args} -p $LLMITM_PORT --set llmitm_listenfile={listenfile}"
    log = (folder / ".proxy.log").open("ab")
    process = subprocess.Popen(["bash", "-c", command], cwd=folder, env=env, stdout=log, stderr=log)
    try:
        _wait_for(listenfile, process, f"llmitm run {args}")
        yield
    finally:
        _stop(process)
        log.close()


def _run_page(path: Path, tmp_path: Path) -> None:
    page = read_page(path)
    folder = tmp_path / "work"
    folder.mkdir()
    shutil.copytree(ROOT / "examples", folder / "examples")  # as in a clone
    with _stand_ins(tmp_path) as addresses:
        for block in page.blocks:
            if block.file_name:
                target = folder / block.file_name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(_substitute(block.body, addresses), encoding="utf-8")
        env = dict(
            os.environ,
            PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}",
            LLMITM_PORT=str(_free_port()),
            OPENAI_API_KEY="sk-docs",
            XDG_DATA_HOME=str(tmp_path / "data"),
            NO_COLOR="1",
            COLUMNS="200",
        )
        env.pop("CI", None)  # a docs example may record, as a developer's machine does
        for block in page.blocks:
            if block.language != "console" or block.not_run:
                continue
            proxy = block.proxy_args
            with _proxy(proxy, folder, env) if proxy else _nothing():
                for command in block.commands():
                    shell = _substitute(command.text, addresses)
                    # One stream, as a terminal shows them: the proxy's lines and the
                    # command's interleave.
                    done = subprocess.run(
                        ["bash", "-c", shell], cwd=folder, env=env, stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT, text=True, timeout=COMMAND_TIMEOUT,
                    )  # fmt: skip
                    output = done.stdout
                    assert done.returncode == 0, f"{block.where}: $ {command.text}\n{output}"
                    missing = output_matches(command.expected, output)
                    assert missing is None, (
                        f"{block.where}: $ {command.text}\nexpected {missing!r} in:\n{output}"
                    )


@contextmanager
def _nothing() -> Iterator[None]:
    yield


@pytest.mark.parametrize("path", _runnable_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_console_block_runs_and_prints_what_it_shows(path: Path, tmp_path: Path) -> None:
    _run_page(path, tmp_path)


def test_every_shell_block_is_run_or_says_why_not() -> None:
    unmarked = [
        block.where
        for path in doc_pages()
        for block in read_page(path).blocks
        if block.language in SHELL_LANGUAGES - {"console"} and not block.not_run
    ]
    assert unmarked == [], "shell blocks neither run (```console) nor marked <!-- not run: … -->"
    reasons = [
        block.marker[1] for path in doc_pages() for block in read_page(path).blocks if block.not_run
    ]
    assert all(len(reason) > 10 for reason in reasons), reasons


def test_the_conventions_find_commands_and_output() -> None:
    """The extractor itself, on a block like the docs': a failing reader would run nothing."""
    block = Block(
        page=Path("x.md"), line=1, language="console",
        body="$ llmitm rec ls \\\n  --json\n[]\n$ echo hi\nhi\n",
    )  # fmt: skip
    commands = block.commands()
    assert [c.text for c in commands] == ["llmitm rec ls \\\n  --json", "echo hi"]
    assert commands[0].expected == ("[]",)
    assert output_matches(("a … c",), "x\na b c\n") is None
    assert output_matches(("a … c", "x"), "x\na b c\n") == "x"
    assert output_matches(("a c",), "a b c\n") == "a c"  # within one line, as shown
    assert shutil.which("bash")
