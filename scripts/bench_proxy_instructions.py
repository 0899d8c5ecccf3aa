"""The proxy's instructions per event, setup against setup, counted by valgrind.

CPU time per event moves by several percent from run to run on a loaded machine, more than
the few percent some costs are held to (default normalisation: ≤ 1.03× of a trusted
endpoint's passthrough). Instruction counts do not depend on the load. This runs one
``llmitm run`` process (the configuration of ``bench_proxy.py``) under ``valgrind
--tool=callgrind``, streams each setup's requests through it in turn, and has callgrind dump
its counters after each setup's streams (``callgrind_control --dump``, which also zeroes
them): every dump is the instructions the whole proxy process (all its threads) executed
for those streams alone. Setups are interleaved round by round, in reverse order every other
round, as in ``bench_proxy.py``.

Instructions are not time: a cache miss or a system call costs no more instructions than a
hit. They show what the Python code of a path does, which is what these setups differ by.

    python scripts/bench_proxy_instructions.py [--setups a,b] [--events N] [--rounds R]
                                               [--streams S] [--concurrency C]
                                               [--before ../older-checkout]
                                               [--ready-timeout SECONDS]

``--before`` runs a second process with the llmitm of another checkout (one that knows the
same configuration), each setup streamed through both in turn: before and after in one run.

Each round streams ``--streams`` streams of each setup one after another, then (with
``--concurrency``) that many at once. Needs valgrind; the proxy runs about 50 times slower.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import bench_proxy as bench

DEFAULT_SETUPS = "llmitm-trusted-responses,llmitm-native-responses,llmitm-responses"
BASELINE = {"responses": "llmitm-trusted-responses", "chat": "llmitm-trusted-chat"}
"""What each client API's setups are compared with: the same endpoint, trusted."""


def callgrind(out_dir: Path) -> list[str]:
    return [
        "valgrind",
        "--tool=callgrind",
        f"--callgrind-out-file={out_dir}/callgrind.out.%p",
        "--dump-instr=no",
    ]


def dump(pid: int, out_dir: Path) -> int:
    """Have callgrind dump (and zero) its counters; the instructions since the last dump."""
    before = set(out_dir.glob(f"callgrind.out.{pid}.*"))
    subprocess.run(["callgrind_control", "--dump", str(pid)], check=True, capture_output=True)
    (new,) = set(out_dir.glob(f"callgrind.out.{pid}.*")) - before
    match = re.search(rb"^(?:summary|totals): (\d+)", new.read_bytes(), re.MULTILINE)
    if match is None:
        raise RuntimeError(f"no instruction total in {new}")
    new.unlink()
    return int(match.group(1))


async def run(setups: list[bench.Setup], args: argparse.Namespace, out_dir: Path) -> dict:
    counts: dict[str, list[float]] = {setup.key: [] for setup in setups}
    concurrent: dict[str, list[float]] = {setup.key: [] for setup in setups}
    bench.progress("warm-up: one stream per setup")
    for setup in setups:
        await bench.stream(setup, args.events, paced=False)
    for pid in {setup.pid for setup in setups}:
        dump(pid, out_dir)  # type: ignore[arg-type]
    for rnd in range(args.rounds):
        for setup in bench.in_turn(setups, rnd):
            bench.progress(f"round {rnd + 1}/{args.rounds}: {setup.label}")
            for _ in range(args.streams):
                await bench.stream(setup, args.events, paced=False)
            await asyncio.sleep(bench.SETTLE_S * 20)
            pid = setup.pid
            assert pid is not None
            counts[setup.key].append(dump(pid, out_dir) / (args.streams * args.events))
            if args.concurrency:
                await asyncio.gather(
                    *(bench.stream(setup, args.events) for _ in range(args.concurrency))
                )
                await asyncio.sleep(bench.SETTLE_S * 20)
                per_event = dump(pid, out_dir) / (args.concurrency * args.events)
                concurrent[setup.key].append(per_event)
    return {"one after another": counts, f"{args.concurrency} at once": concurrent}


def report(setups: list[bench.Setup], results: dict, args: argparse.Namespace) -> None:
    print(
        f"Instructions per event of the whole llmitm process (callgrind), {args.events}-event "
        f"streams, median of {args.rounds} rounds (min–max)"
    )
    for title, counts in results.items():
        if not any(counts.values()):
            continue
        print(f"\n{title}:")
        medians = {key: statistics.median(values) for key, values in counts.items() if values}
        for setup in setups:
            values = counts[setup.key]
            base = medians.get(BASELINE[setup.api] + setup.key[len(setup.key.split("+")[0]) :])
            ratio = f"{medians[setup.key] / base:.3f}×" if base else "–"
            print(
                f"  {setup.label:40} {medians[setup.key]:>10,.0f} "
                f"({min(values):,.0f}–{max(values):,.0f})  {ratio}"
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setups", default=DEFAULT_SETUPS)
    parser.add_argument("--events", type=int, default=1000, help="text deltas per stream")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--streams", type=int, default=2, help="streams per setup and round")
    parser.add_argument(
        "--concurrency", type=int, default=0, help="also this many streams at once per round"
    )
    parser.add_argument("--before", metavar="CHECKOUT", help="also measure this checkout's code")
    parser.add_argument(
        "--ready-timeout",
        type=float,
        default=600.0,
        help="seconds a proxy may take to start under valgrind (more on a loaded machine)",
    )
    args = parser.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        parser.error("needs valgrind (callgrind and callgrind_control)")
    keys = [key.strip() for key in args.setups.split(",") if key.strip()]
    known = {setup.key: setup for setup in bench.all_setups()}
    unknown = [key for key in keys if key not in known or known[key].via != "llmitm"]
    if unknown:
        parser.error(f"not llmitm setups: {unknown}")
    setups = [known[key] for key in keys]
    for setup in setups:
        if BASELINE[setup.api] not in keys:
            parser.error(f"{setup.key} needs its baseline {BASELINE[setup.api]} in --setups")
    bench.READY_TIMEOUT_S = args.ready_timeout  # the proxy starts ~50 times slower
    tmp = Path(tempfile.mkdtemp(prefix="llmitm-bench-instructions-"))
    procs = bench.Processes(tmp)
    try:
        bench.progress(f"starting processes under valgrind (logs in {tmp})")
        both = f"http://127.0.0.1:{bench.start_fake(procs, 'chat,responses')}"
        chat = f"http://127.0.0.1:{bench.start_fake(procs, 'chat')}"
        responses = f"http://127.0.0.1:{bench.start_fake(procs, 'responses')}"
        config = bench.CONFIG.format(both=both, chat=chat, responses=responses)
        port, pid = bench.start_llmitm(procs, both, config, run_under=callgrind(tmp))
        for setup in setups:
            setup.port, setup.pid = port, pid
        if args.before:
            addon = str(Path(args.before).resolve() / "addon")
            before_port, before_pid = bench.start_llmitm(
                procs,
                both,
                config,
                env={"PYTHONPATH": addon},
                name="llmitm-before",
                run_under=callgrind(tmp),
            )
            twins = [bench.twin_of(setup, "before") for setup in setups]
            for twin in twins:
                twin.key = twin.key.replace("+twin", "+before")
                twin.port, twin.pid = before_port, before_pid
            setups = [s for pair in zip(setups, twins, strict=True) for s in pair]
        results = asyncio.run(run(setups, args, tmp))
    except KeyboardInterrupt:
        return 130
    finally:
        with contextlib.suppress(KeyboardInterrupt):
            procs.stop_all()
    report(setups, results, args)
    print(f"\nProcess logs: {tmp}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
