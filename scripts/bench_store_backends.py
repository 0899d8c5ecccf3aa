"""Benchmark llmitm's store backends: the same proxy with its store in SQLite and in
PostgreSQL, recording on, in the same run.

Real processes on loopback, as ``scripts/bench_proxy.py`` starts them (its helpers are
reused): the fake upstream, two ``llmitm run`` with the same config — one with
``llmitm_store`` a SQLite file, one with a ``postgresql://`` URL to a real server started
here (``tests/helpers/postgres.py``, ``durable=True``: fsync on, as a server normally runs),
its password in ``PGPASSWORD``. Each round sends ``--concurrency`` concurrent streams of
``--events`` text deltas through one proxy, then the other (the order alternates), and waits
``--settle`` seconds for the recording writes to commit. Measured per round:

- each proxy process's CPU (its threads' schedstat runtime) per stream, the writes included;
- the PostgreSQL server's own CPU per stream: the postmaster and every backend it forked
  (the proxy's writer and readers), summed from /proc — work SQLite does inside the proxy.

    python scripts/bench_store_backends.py [--concurrency 64] [--events 200] [--runs 7]

Reports medians over the rounds and the ratio PostgreSQL / SQLite of the proxy's CPU (target
at most 1.05). Logs stay in a temporary directory printed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import bench_proxy as bp

sys.path.insert(0, str(bp.ROOT))
from tests.helpers.postgres import postgres_server

TARGET_RATIO = 1.05


@dataclass
class Backend:
    name: str
    setup: bp.Setup
    proxy_cpu: list[float] = field(default_factory=list)
    server_cpu: list[float] = field(default_factory=list)


def process_tree_cpu(root: int) -> float:
    """CPU seconds of ``root`` and its live children (PostgreSQL forks a backend per
    connection; the connections of the measured proxy live as long as it does)."""
    pids = [root]
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                ppid = int(stat.read().rpartition(b")")[2].split()[1])
        except (FileNotFoundError, ProcessLookupError):
            continue
        if ppid == root:
            pids.append(int(entry))
    total = 0.0
    for pid in pids:
        try:
            total += bp.cpu_seconds(pid)
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


async def wave(setup: bp.Setup, concurrency: int, events: int) -> None:
    await asyncio.gather(*(bp.stream(setup, events) for _ in range(concurrency)))


async def measure(backends: list[Backend], server_pid: int, args: argparse.Namespace) -> None:
    for setup in (b.setup for b in backends):  # warm-up: imports, first connections
        await wave(setup, min(8, args.concurrency), args.events)
    await asyncio.sleep(args.settle)
    for rnd in range(args.runs):
        for backend in backends if rnd % 2 == 0 else backends[::-1]:
            proxy0 = bp.cpu_seconds(backend.setup.pid)
            server0 = process_tree_cpu(server_pid)
            await wave(backend.setup, args.concurrency, args.events)
            await asyncio.sleep(args.settle)  # the recording writes commit
            backend.proxy_cpu.append(
                (bp.cpu_seconds(backend.setup.pid) - proxy0) / args.concurrency
            )
            backend.server_cpu.append((process_tree_cpu(server_pid) - server0) / args.concurrency)
        bp.progress(f"round {rnd + 1}/{args.runs}")


def report(backends: list[Backend], args: argparse.Namespace) -> list[str]:
    sqlite, postgres = backends
    lines = [
        f"{args.concurrency} concurrent streams of {args.events} events, recording on, "
        f"{args.runs} rounds (medians; CPU per stream, ms)",
        f"{'':28} {'proxy CPU':>10} {'database server CPU':>20}",
    ]
    for backend in backends:
        proxy = statistics.median(backend.proxy_cpu) * 1000
        server = statistics.median(backend.server_cpu) * 1000
        server_text = f"{server:.2f}" if backend is postgres else "– (in the proxy)"
        lines.append(f"{backend.name:28} {proxy:10.2f} {server_text:>20}")
    ratios = [p / s for p, s in zip(postgres.proxy_cpu, sqlite.proxy_cpu, strict=True)]
    ratio = statistics.median(ratios)
    verdict = "within" if ratio <= TARGET_RATIO else "OVER"
    lines.append(
        f"proxy CPU PostgreSQL / SQLite: {ratio:.3f}× (per-round ratios "
        f"{min(ratios):.3f}–{max(ratios):.3f}; {verdict} the {TARGET_RATIO}× target)"
    )
    return lines


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--events", type=int, default=200)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--settle", type=float, default=1.5, help="seconds after each wave")
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="llmitm-bench-store-"))
    procs = bp.Processes(tmp)
    with postgres_server(durable=True) as server:
        try:
            dsn = server.create_database()
            upstream = f"http://127.0.0.1:{bp.start_fake(procs, 'chat,responses')}"
            config = bp.CONFIG.format(both=upstream, chat=upstream, responses=upstream)
            backends = []
            for name, store, env in (
                ("llmitm · SQLite store", str(tmp / "store.db"), None),
                ("llmitm · PostgreSQL store", dsn, server.env()),
            ):
                port, pid = bp.start_llmitm(
                    procs,
                    upstream,
                    config,
                    extra=[f"llmitm_store={store}", "llmitm_record=record"],
                    env=env,
                    name="llmitm-" + name.split()[-2].lower(),
                )
                setup = bp.Setup(name, name, "chat", "llmitm", "bench-pass", "both")
                setup.port, setup.pid = port, pid
                backends.append(Backend(name, setup))
            assert server.process is not None
            started = time.monotonic()
            asyncio.run(measure(backends, server.process.pid, args))
            recorded = server.psql("SELECT count(*) FROM rec_interactions", dsn.rsplit("/", 1)[1])
            lines = report(backends, args)
            lines.append(
                f"recordings in PostgreSQL: {recorded.strip()}; {time.monotonic() - started:.0f} s"
            )
        finally:
            procs.stop_all()
    print("\n".join(lines))
    print(f"logs: {tmp}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
