"""Reading the first screen of a running ``llmitm run`` the way a person would: its lines as
they are printed, and the ``sdk`` line turned into the environment it tells an SDK to use."""

from __future__ import annotations

import queue
import shlex
import subprocess
import threading
import time
from typing import IO

FIRST_SCREEN_TIMEOUT_S = 60.0


def read_first_screen(
    process: subprocess.Popen[str],
    stream: IO[str] | None = None,
    timeout: float = FIRST_SCREEN_TIMEOUT_S,
) -> list[str]:
    """The lines ``process`` printed up to and including the first screen's ``command`` line
    (its last), from ``stream`` (default: its stdout); fails after ``timeout`` seconds."""
    source = stream if stream is not None else process.stdout
    assert source is not None
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        for line in source:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise TimeoutError(f"no first screen after {timeout} s: {seen}") from None
        if line is None:
            raise RuntimeError(f"llmitm ended before its first screen: {seen}")
        seen.append(line)
        if line.strip().startswith("command "):
            return seen


def screen_field(lines: list[str], label: str) -> str:
    """The text after ``label`` on the first screen."""
    for line in lines:
        head, _, rest = line.strip().partition(" ")
        if head == label:
            return rest.strip()
    raise LookupError(f"no {label} line in {lines}")


def sdk_environment(lines: list[str]) -> dict[str, str]:
    """The variables the ``sdk`` line assigns (``NAME=value`` words)."""
    return dict(word.split("=", 1) for word in shlex.split(screen_field(lines, "sdk")))
