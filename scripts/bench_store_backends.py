"""What the PostgreSQL store costs the proxy against SQLite, recording and routing included:
llmitm with a SQLite store (each proxy routing alone) against llmitm with a PostgreSQL store
(the fleet's shared routing state on, as a user gets it), measured in the same run.

Real processes on loopback, started with ``scripts/bench_proxy.py``'s helpers: the fake
upstream, a PostgreSQL server (``tests/helpers/postgres.py``, ``durable=True``: fsync on, as a
server normally runs; its password in ``PGPASSWORD``) and one ``llmitm run`` per setup, all
with the same configuration and recording on:

  sqlite          ``llmitm_store`` a SQLite file: per-process routing
  postgres        ``llmitm_store`` a ``postgresql://`` URL: the fleet on (the default)
  postgres-alone  the same with ``--set llmitm_fleet=false`` (opt in with ``--setups``):
                  what the shared routing state costs apart from the store
  postgres-code   with ``--code DIR``: the postgres setup running another checkout's llmitm
                  (before/after a change, in the same run)

Each PostgreSQL setup has a database of its own. Two routes, each endpoint capped above the
load (so every request takes and frees a shared slot and none waits):

  direct     one endpoint: mitmproxy's direct path
  failover   two endpoints with affinity, every request a new conversation: a slot, a pin
             look-up that misses, and a new pin (written with the slot's take)

Each round sends ``--concurrency`` concurrent streams of ``--events`` text deltas per route to
each setup, the setups in turn (reversed every other round), and waits ``--settle`` seconds
after each wave for the recording writes to commit. Two shapes of load: a **burst** (the
default: the streams start at once, unpaced) and **steady** traffic (``--event-delay-ms 50
--spread-s 1``: starts spread over a second, each stream about a second long). Measured per
wave: the proxy process's CPU per stream (its threads' schedstat runtime, the writes
included) and the PostgreSQL server's own CPU per stream (postmaster and every backend, from
/proc) — the work SQLite does inside the proxy.

    python scripts/bench_store_backends.py [--concurrency 64] [--events 200] [--runs 7]
        [--event-delay-ms 0] [--spread-s 0] [--routes direct,failover]
        [--setups sqlite,postgres[,postgres-alone]] [--code ../other-checkout]
        [--profile DIR]   # each proxy under cProfile, its profile written there at exit
        [--statements]    # also count the statements each wave sends the server, by kind

Reports per route the medians over the rounds, each setup's ratio to SQLite (the median of the
per-round ratios, and their spread; target at most 1.05 for postgres). Logs stay in a
temporary directory printed at the end.

``--statements`` turns on the server's ``log_statement = all`` and reports, per PostgreSQL
setup and route, the median number of statements a wave sent (asyncpg's pipelined
``executemany`` counts each row's execution), by kind. Logging every statement costs the
server and the disk: read the CPU figures of such a run as a rough guide only.
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
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bench_proxy as bp
import orjson

sys.path.insert(0, str(bp.ROOT))
from tests.helpers.postgres import postgres_server

TARGET_RATIO = 1.05

CONFIG = """\
[routing]
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
affinity = true
"""

ROUTES = {"direct": "capped", "failover": "a"}
"""Each route's model prefix and the endpoint that answers it (the first healthy one)."""

_conversations = itertools.count()


class Conversation(bp.Setup):
    """A route's chat stream that opens a new conversation on every request (so a route with
    affinity looks its pin up and writes a new one each time)."""

    def request(self, events: int, paced: bool) -> bytes:
        body = orjson.dumps(
            {
                "model": self.model,
                "messages": [{"role": "user", "content": f"Conversation {next(_conversations)}"}],
                "stream": True,
            }
        )
        pace = f";event_delay_ms={self.delay_ms}" if paced and self.delay_ms else ""
        head = (
            "POST /v1/chat/completions HTTP/1.1\r\n"
            f"host: 127.0.0.1:{self.port}\r\n"
            "authorization: Bearer sk-bench\r\n"
            "content-type: application/json\r\n"
            "accept: text/event-stream\r\n"
            f"x-fake-scenario: text;events={events}{pace}\r\n"
            f"content-length: {len(body)}\r\n\r\n"
        )
        return head.encode() + body


@dataclass
class Proxy:
    name: str
    pid: int
    port: int
    cpu: dict[str, list[float]] = field(default_factory=dict)
    """Proxy CPU per stream, by route, one value per round."""
    db: dict[str, list[float]] = field(default_factory=dict)
    """Database server CPU per stream, by route, one value per round."""
    database: str = ""
    """Its database's name (empty for SQLite)."""
    statements: dict[str, list[Counter[str]]] = field(default_factory=dict)
    """With ``--statements``: the statements of each wave by kind, by route."""


STATEMENT_KINDS = (
    ("llmitm_fleet_take", "slot take"),
    ("llmitm_fleet_release", "slot release"),
    ("INSERT INTO llmitm_fleet_pins", "pin write"),
    ("llmitm_fleet_pins", "pin look-up"),
    ("llmitm_fleet", "fleet, other"),
)
"""How a logged statement is told apart (the first match wins); any other is the store's."""


class StatementLog:
    """The server's log of every statement (``log_statement = all``), read wave by wave."""

    def __init__(self, server: Any) -> None:
        self.path = server.datadir.parent / "server.log"
        server.psql("ALTER SYSTEM SET log_statement = 'all'")
        server.psql("ALTER SYSTEM SET log_line_prefix = '@%d '")
        server.psql("SELECT pg_reload_conf()")
        self.offset = self.path.stat().st_size

    def since_last(self) -> dict[str, Counter[str]]:
        """The statements logged since the last call, by database and kind."""
        with self.path.open("rb") as log:
            log.seek(self.offset)
            text = log.read().decode(errors="replace")
            self.offset = log.tell()
        counts: dict[str, Counter[str]] = {}
        for line in text.splitlines():
            database, _, rest = line.partition(" ")
            if not database.startswith("@") or not (
                rest.startswith("LOG:  statement: ") or rest.startswith("LOG:  execute ")
            ):
                continue
            kind = next((k for marker, k in STATEMENT_KINDS if marker in rest), "store")
            counts.setdefault(database[1:], Counter())[kind] += 1
        return counts


def server_cpu(postmaster: int) -> float:
    """CPU seconds of the database server: the postmaster and every backend it forked (the
    measured proxy's connections live as long as it does)."""
    total = bp.cpu_seconds(postmaster)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                ppid = int(stat.read().rpartition(b")")[2].split()[1])
            if ppid == postmaster:
                total += bp.cpu_seconds(int(entry))
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


async def one(proxy: Proxy, route: str, args: argparse.Namespace, delay: float) -> None:
    await asyncio.sleep(delay)
    setup = Conversation(route, route, "chat", "llmitm", f"{route}-x", ROUTES[route])
    setup.port, setup.pid, setup.delay_ms = proxy.port, proxy.pid, args.event_delay_ms
    await bp.stream(setup, args.events, paced=bool(args.event_delay_ms))


async def wave(proxy: Proxy, route: str, args: argparse.Namespace) -> None:
    """``--concurrency`` streams, all at once or their starts spread over ``--spread-s``."""
    n = args.concurrency
    await asyncio.gather(*(one(proxy, route, args, i * args.spread_s / n) for i in range(n)))


async def measure(
    proxies: list[Proxy], postmaster: int, args: argparse.Namespace, log: StatementLog | None
) -> None:
    for proxy in proxies:  # warm-up: imports, first connections, first pins
        for route in args.routes:
            await wave(proxy, route, args)
    await asyncio.sleep(args.settle)
    if log is not None:
        log.since_last()
    for rnd in range(args.runs):
        for proxy in proxies if rnd % 2 == 0 else proxies[::-1]:
            for route in args.routes:
                cpu, db = bp.cpu_seconds(proxy.pid), server_cpu(postmaster)
                await wave(proxy, route, args)
                await asyncio.sleep(args.settle)  # recordings, releases and pins commit
                n = args.concurrency
                proxy.cpu.setdefault(route, []).append((bp.cpu_seconds(proxy.pid) - cpu) / n)
                proxy.db.setdefault(route, []).append((server_cpu(postmaster) - db) / n)
                if log is not None:  # the settle let the wave's last writes commit
                    counted = log.since_last().get(proxy.database, Counter())
                    proxy.statements.setdefault(route, []).append(counted)
        bp.progress(f"round {rnd + 1}/{args.runs}")


def report(proxies: list[Proxy], args: argparse.Namespace) -> list[str]:
    shape = (
        f"steady (events every {args.event_delay_ms} ms, starts spread over {args.spread_s} s)"
        if args.event_delay_ms or args.spread_s
        else "burst (all at once, unpaced)"
    )
    lines = [
        f"{args.concurrency} concurrent chat streams of {args.events} events, {shape}, "
        f"recording on, {args.runs} rounds; medians, CPU per stream in ms",
        f"{'route':<9} {'setup':<15} {'proxy CPU':>9} {'÷ SQLite':>9} {'per-round ratios':>17}"
        f" {'database CPU':>13}",
    ]
    sqlite = proxies[0]
    for route in args.routes:
        for proxy in proxies:
            cpu = statistics.median(proxy.cpu[route]) * 1000
            db = statistics.median(proxy.db[route]) * 1000
            db_text = "(in proxy)" if proxy is sqlite else f"{db:.2f}"
            if proxy is sqlite:
                ratio_text, spread = "", ""
            else:
                ratios = [p / s for p, s in zip(proxy.cpu[route], sqlite.cpu[route], strict=True)]
                ratio_text = f"{statistics.median(ratios):.3f}×"
                spread = f"{min(ratios):.2f}–{max(ratios):.2f}"
            lines.append(
                f"{route:<9} {proxy.name:<15} {cpu:>9.2f} {ratio_text:>9} {spread:>17}"
                f" {db_text:>13}"
            )
    code = next((p for p in proxies if p.name == "postgres-code"), None)
    postgres = next((p for p in proxies if p.name == "postgres"), None)
    if code is not None and postgres is not None:
        # The two PostgreSQL setups against each other, round by round: what the change
        # itself did, with SQLite's own noise out of the ratio.
        lines.append("postgres ÷ postgres-code, per round: median (spread)")
        for route in args.routes:
            ratios = [a / b for a, b in zip(postgres.cpu[route], code.cpu[route], strict=True)]
            lines.append(
                f"{route:<9} {statistics.median(ratios):.3f}× ({min(ratios):.2f}–{max(ratios):.2f})"
            )
    if args.statements:
        lines += statement_report(proxies, args)
    return lines


def statement_report(proxies: list[Proxy], args: argparse.Namespace) -> list[str]:
    kinds = [kind for _, kind in STATEMENT_KINDS] + ["store"]
    lines = [
        f"statements per wave of {args.concurrency} streams (medians; heartbeats included)",
        f"{'route':<9} {'setup':<15} {'all':>5} " + " ".join(f"{k:>13}" for k in kinds),
    ]
    for route in args.routes:
        for proxy in proxies:
            waves = proxy.statements.get(route)
            if not proxy.database or not waves:
                continue
            total = statistics.median(sum(c.values()) for c in waves)
            each = " ".join(f"{statistics.median(c[k] for c in waves):>13g}" for k in kinds)
            lines.append(f"{route:<9} {proxy.name:<15} {total:>5g} {each}")
    return lines


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--events", type=int, default=200)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--event-delay-ms", type=int, default=0, help="pace the fake's events")
    parser.add_argument(
        "--spread-s", type=float, default=0.0, help="spread the streams' starts over this long"
    )
    parser.add_argument("--settle", type=float, default=1.0, help="seconds after each wave")
    parser.add_argument("--routes", default="direct,failover")
    parser.add_argument("--setups", default="sqlite,postgres")
    parser.add_argument("--code", help="also run the postgres setup with this checkout's code")
    parser.add_argument("--profile", type=Path, help="write each proxy's cProfile here")
    parser.add_argument(
        "--statements", action="store_true", help="count each wave's statements (log_statement)"
    )
    args = parser.parse_args()
    args.routes = args.routes.split(",")
    args.setups = args.setups.split(",")
    if args.setups[0] != "sqlite":
        parser.error("--setups starts with sqlite, the baseline")
    if args.code:
        args.setups.append("postgres-code")
    return args


def main() -> int:
    args = parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="llmitm-bench-store-"))
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
        bp.PROFILE_DIR = args.profile.resolve()
    procs = bp.Processes(tmp)
    with postgres_server(durable=True) as server:
        try:
            upstream = f"http://127.0.0.1:{bp.start_fake(procs, 'chat')}"
            config = CONFIG.format(upstream=upstream)
            proxies = []
            for name in args.setups:
                store, env, extra, database = str(tmp / "store.db"), None, [], ""
                if name != "sqlite":
                    store, env = server.create_database(), server.env()
                    database = store.rsplit("/", 1)[1]
                if name == "postgres-alone":
                    extra = ["llmitm_fleet=false"]
                port, pid = bp.start_llmitm(
                    procs,
                    upstream,
                    config,
                    extra=[f"llmitm_store={store}", "llmitm_record=record", *extra],
                    env=env,
                    name=f"llmitm-{name}",
                    code=args.code if name == "postgres-code" else None,
                )
                proxies.append(Proxy(name, pid, port, database=database))
            assert server.process is not None
            log = StatementLog(server) if args.statements else None
            started = time.monotonic()
            asyncio.run(measure(proxies, server.process.pid, args, log))
            lines = report(proxies, args)
            lines.append(f"{time.monotonic() - started:.0f} s")
        finally:
            procs.stop_all()
    print("\n".join(lines))
    print(f"logs: {tmp}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
