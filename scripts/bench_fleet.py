"""What sharing the routing state costs: proxy CPU per request with a fleet's shared state in
PostgreSQL against the same proxy deciding alone, measured in the same run.

Real processes on loopback: a local PostgreSQL server (``tests/helpers/postgres.py``, durable
settings), the fake upstream, and two ``llmitm run`` with the same configuration and the same
database as their store — ``alone`` with ``--set llmitm_fleet=false`` (today's per-process
routing), ``shared`` with the fleet on. Two routes, every endpoint with a cap that the load
never reaches (so every request takes and frees a shared slot, and none waits):

  direct     one endpoint: mitmproxy's direct path (a slot per request)
  failover   two endpoints with affinity, every request a new conversation: a slot, an
             affinity look-up that misses, and a new pin written before the answer ends
             (the most the shared state costs a request)

Each round sends ``--concurrency`` streams of ``--events`` events per route to each proxy, the
proxies in turn (reversed every other round). Per proxy and route: the proxy
process's CPU per request (median of the rounds), the ratio shared / alone, and the database
server's CPU per request while the shared proxy ran (all its processes).

    python scripts/bench_fleet.py [--rounds 7] [--concurrency 64] [--events 20]
                                  [--event-delay-ms 0] [--spread-s 0]
                                  [--routes direct,failover] [--profile DIR]

All at once (the default), the takes of a burst go to the database in one statement; with
``--event-delay-ms 50 --spread-s 1`` the 64 streams overlap as steady traffic does (each
lasts about as long as the spread) and every request takes its slot on its own.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench_proxy  # the sibling script's processes and CPU reading
from bench_proxy import BIN, QUIET, Processes, cpu_seconds, start_fake

from tests.helpers.postgres import postgres_server

CONFIG = """\
[routing]
connect_timeout = 5
first_byte_timeout = 60
queue_size = 1000

[endpoints.capped]
kind = "compatible"
base_url = "{upstream}/v1"
apis = ["chat"]
max_concurrency = 1000

[endpoints.a]
kind = "compatible"
base_url = "{upstream}/v1"
apis = ["chat"]
max_concurrency = 1000

[endpoints.b]
kind = "compatible"
base_url = "{upstream}/v1"
apis = ["chat"]
max_concurrency = 1000

[[routes]]
models = ["direct-*"]
endpoints = ["capped"]

[[routes]]
models = ["failover-*"]
endpoints = ["a", "b"]
strategy = "weighted"
"""

ROUTES = ("direct", "failover")
PROFILE: Path | None = None
_conversations = itertools.count()


def start_proxy(
    procs: Processes, name: str, config: Path, dsn: str, env: dict[str, str], fleet: bool
) -> tuple[int, int]:
    listenfile = procs.tmp / f"{name}-listen.json"
    process = procs.start(
        name,
        [
            *(
                [str(BIN / "python"), "-m", "cProfile", "-o", str(PROFILE / f"{name}.prof")]
                if PROFILE
                else []
            ),
            str(BIN / "llmitm"), "run",
            "--config", str(config),
            "--mode", "reverse:http://127.0.0.1:9",
            "--listen-port", "0",
            "--set", f"confdir={procs.tmp / 'confdir'}",
            "--set", f"llmitm_listenfile={listenfile}",
            "--set", "llmitm_console=off",
            "--set", "llmitm_record=off",
            "--set", f"llmitm_store={dsn}",
            "--set", f"llmitm_fleet={'true' if fleet else 'false'}",
            *QUIET,
        ],
        env=env,
    )  # fmt: skip
    listening = procs.wait_ready(
        name,
        process,
        lambda: orjson.loads(listenfile.read_bytes()) if listenfile.exists() else None,
    )
    assert isinstance(listening, dict)
    port = int(listening["servers"][0]["addresses"][0][1])
    return process.pid, port


def server_cpu(postmaster: int) -> float:
    """CPU seconds of the database server: the postmaster and every backend it started."""
    total = cpu_seconds(postmaster)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[1]) == postmaster:
            total += cpu_seconds(int(entry))
    return total


async def one(
    client: httpx.AsyncClient, route: str, args: argparse.Namespace, delay: float
) -> None:
    await asyncio.sleep(delay)
    body = {
        "model": f"{route}-x",
        "messages": [{"role": "user", "content": f"Conversation {next(_conversations)}."}],
        "stream": True,
    }
    headers = {"x-fake-scenario": f"text;events={args.events};event_delay_ms={args.event_delay_ms}"}
    async with client.stream("POST", "/chat/completions", json=body, headers=headers) as r:
        await r.aread()
        if r.status_code != 200:
            raise RuntimeError(f"{route}: HTTP {r.status_code}")


async def wave(port: int, route: str, args: argparse.Namespace) -> None:
    """``--concurrency`` streams, all at once or their starts spread evenly over
    ``--spread-s`` seconds."""
    n = args.concurrency
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{port}/v1", timeout=120, limits=limits
    ) as client:
        await asyncio.gather(*(one(client, route, args, i * args.spread_s / n) for i in range(n)))


async def measure(
    proxies: dict[str, tuple[int, int]], postmaster: int, args: argparse.Namespace
) -> dict[tuple[str, str], dict[str, list[float]]]:
    results: dict[tuple[str, str], dict[str, list[float]]] = {
        (name, route): {"cpu": [], "db": []} for name in proxies for route in ROUTES
    }
    for _, port in proxies.values():  # warm-up: connections, imports, first pins
        for route in ROUTES:
            await wave(port, route, args)
    order = list(proxies)
    for rnd in range(args.rounds):
        for name in order if rnd % 2 == 0 else order[::-1]:
            pid, port = proxies[name]
            for route in ROUTES:
                await asyncio.sleep(0.3)  # releases and pins of the last wave settle
                cpu, db = cpu_seconds(pid), server_cpu(postmaster)
                await wave(port, route, args)
                await asyncio.sleep(0.3)
                results[(name, route)]["cpu"].append((cpu_seconds(pid) - cpu) / args.concurrency)
                results[(name, route)]["db"].append(
                    (server_cpu(postmaster) - db) / args.concurrency
                )
        print(f"round {rnd + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    return results


def report(results: dict[tuple[str, str], dict[str, list[float]]], args: argparse.Namespace):
    lines = [
        f"{args.concurrency} streams of {args.events} events (event delay"
        f" {args.event_delay_ms} ms, starts spread over {args.spread_s} s), {args.rounds} rounds"
        " (medians; CPU per request in ms)",
        f"{'route':<10} {'alone':>8} {'shared':>8} {'ratio':>7} {'db alone':>9} {'db shared':>10}",
    ]
    for route in ROUTES:
        alone = statistics.median(results[("alone", route)]["cpu"]) * 1000
        shared = statistics.median(results[("shared", route)]["cpu"]) * 1000
        db_alone = statistics.median(results[("alone", route)]["db"]) * 1000
        db_shared = statistics.median(results[("shared", route)]["db"]) * 1000
        ratios = [
            s / a
            for s, a in zip(
                results[("shared", route)]["cpu"], results[("alone", route)]["cpu"], strict=True
            )
        ]
        lines.append(
            f"{route:<10} {alone:>8.2f} {shared:>8.2f} {shared / alone:>6.2f}x "
            f"{db_alone:>9.2f} {db_shared:>10.2f}   (per-round ratios "
            f"{min(ratios):.2f}..{max(ratios):.2f})"
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--events", type=int, default=20)
    parser.add_argument("--event-delay-ms", type=int, default=0, help="pace the fake's events")
    parser.add_argument(
        "--spread-s", type=float, default=0.0, help="spread the streams' starts over this long"
    )
    parser.add_argument("--profile", type=Path, help="write each proxy's cProfile here")
    parser.add_argument("--routes", default="direct,failover", help="the routes to load")
    args = parser.parse_args()
    global PROFILE, ROUTES
    PROFILE = args.profile
    ROUTES = tuple(args.routes.split(","))
    procs = Processes(Path(tempfile.mkdtemp(prefix="llmitm-bench-fleet-")))
    try:
        with postgres_server(durable=True) as server:
            assert server.process is not None
            dsn = server.create_database()
            env = server.env()
            upstream = f"http://127.0.0.1:{start_fake(procs, 'chat')}"
            config = procs.tmp / "fleet.toml"
            config.write_text(CONFIG.format(upstream=upstream))
            proxies = {
                name: start_proxy(procs, name, config, dsn, env, fleet=name == "shared")
                for name in ("alone", "shared")
            }
            time.sleep(1)
            results = asyncio.run(measure(proxies, server.process.pid, args))
            print("\n".join(report(results, args)))
            procs.stop_all()
    finally:
        procs.stop_all()
        print(f"logs: {procs.tmp}")
    return 0


if __name__ == "__main__":
    bench_proxy.PROFILE_DIR = None
    sys.exit(main())
