"""Benchmark ``llmitm translate`` as a whole process against an orjson floor process.

The engine alone is measured by ``bench_translate.py``; a user runs the command, which also
starts Python, imports llmitm, reads the file, finds what it is and writes the result. So
both sides here are whole processes on the same file: ``python -m llmitm.cli translate --to
API FILE`` and ``python scripts/bench_translate_cli.py --floor FILE``, which reads the file,
splits it into events, parses and re-serialises each with orjson, and writes them out (the
least any translator must do with the same bytes). Output goes to ``/dev/null`` for both.

Runs alternate (floor, CLI, floor, CLI, …) so drift on a shared machine hits both alike, and
each is timed by its CPU time (user + system, from ``wait4``), not wall time. Prints the
median events per CPU second of each and their ratio, per direction.

    python scripts/bench_translate_cli.py [--events N] [--runs R]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson
from bench_translate import chat_stream, responses_stream

HERE = Path(__file__).resolve()


def floor_main(path: str) -> None:
    """The floor process: split, ``orjson.loads`` and ``orjson.dumps`` every event, write."""
    loads, dumps = orjson.loads, orjson.dumps
    data = Path(path).read_bytes()
    out = []
    for block in data.split(b"\n\n"):
        start = block.find(b"data: ")
        if start < 0:
            continue
        payload = block[start + 6 :]
        if payload == b"[DONE]":
            out.append(b"data: [DONE]\n\n")
        else:
            out.append(b"data: " + dumps(loads(payload)) + b"\n\n")
    sys.stdout.buffer.write(b"".join(out))
    sys.stdout.buffer.flush()


def cpu_seconds(command: list[str]) -> float:
    """The user + system CPU time of ``command`` run to its end (its output discarded)."""
    with open(os.devnull, "wb") as devnull:
        process = subprocess.Popen(command, stdout=devnull, stderr=subprocess.PIPE)
        _pid, status, usage = os.wait4(process.pid, 0)
        stderr = process.stderr.read() if process.stderr else b""
        process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed: {stderr.decode(errors='replace')}")
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--floor", metavar="FILE", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.floor:
        floor_main(args.floor)
        return
    python = sys.executable
    cases = [
        ("responses -> chat", "chat", responses_stream),
        ("chat -> responses", "responses", chat_stream),
        ("responses -> responses (normalise)", "responses", responses_stream),
    ]
    header = ("direction", "events", "CLI ev/s", "floor ev/s", "ratio", "CLI s", "floor s")
    print("{:36} {:>8} {:>10} {:>10} {:>6} {:>7} {:>7}".format(*header))
    with tempfile.TemporaryDirectory() as folder:
        for label, to, make in cases:
            path = Path(folder) / f"{make.__name__}.sse"
            if not path.exists():
                path.write_bytes(make(args.events))
            events = path.read_bytes().count(b"\n\n")
            cli = [python, "-m", "llmitm.cli", "translate", "--to", to, str(path)]
            floor = [python, str(HERE), "--floor", str(path)]
            cli_s, floor_s = [], []
            for _ in range(args.runs):
                floor_s.append(cpu_seconds(floor))
                cli_s.append(cpu_seconds(cli))
            c, f = statistics.median(cli_s), statistics.median(floor_s)
            row = (label, events, events / c, events / f, f / c, c, f)
            print("{:36} {:>8} {:>10,.0f} {:>10,.0f} {:>6.2f} {:>7.2f} {:>7.2f}".format(*row))


if __name__ == "__main__":
    main()
