"""Scale probe: many concurrent paced streams through one proxy process, against plain mitmdump
measured in the same run.

Real processes on loopback (from ``bench_proxy.py``): the fake upstream pacing every event
(``text;events=N;event_delay_ms=M``), plain mitmdump (reverse mode, ``stream = True``) and one
``llmitm run`` with its defaults (recording on) routing ``bench-pass`` to a compatible endpoint
(its streams normalised) and ``bench-over-chat`` to a chat-only one (Responses clients
translated). One asyncio client in this process (its CPU is never counted) opens ``--streams``
streams, started over ``--ramp`` seconds so the listen backlog never drops a SYN, and reads
them all to their end. Per setup and round:

- the proxy's RSS once warmed up (before its first round) and its peak while streams run
  (sampled every 20 ms from /proc), and that growth per concurrent stream (each llmitm setup
  has a process of its own);
- the proxy's CPU per event (its threads' runtime from /proc over the round, divided by the
  events the client read);
- time to the first text event and the whole stream's duration, p50 and p99 over the streams,
  and what each adds to the same figures of the direct setup (client → fake upstream, which
  has the same pacing, client and load on the upstream) in the same round.

Setups run one after the other within a round, in reverse order every other round, so drift on
the machine hits them alike; figures are the median over rounds.

    python scripts/bench_scale.py [--streams 1000] [--events 50] [--event-delay-ms 200]
                                  [--ramp 5] [--rounds 3] [--setups direct,mitmdump,llmitm]
                                  [--llmitm-set llmitm_record=off]

Setups: ``direct``, ``mitmdump``, ``llmitm`` (chat, passthrough), ``llmitm-translated``
(a Responses client over a chat upstream). Everything is bounded: every stream has a deadline
(``--timeout``), and the whole run stops after its rounds. The fd limit is raised to the hard
limit first (children inherit it): 1000 streams hold ~3000 sockets across the processes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

# A sibling script, importable once its folder is on the path.
from bench_proxy import (
    CONFIG,
    CONTENT,
    TERMINAL,
    Processes,
    Setup,
    SSEStream,
    check,
    cpu_seconds,
    start_fake,
    start_llmitm,
    start_mitmdump,
)

SETUPS = {
    "direct": ("direct", "chat", "direct", "bench-pass", None, None),
    "mitmdump": ("mitmdump", "chat", "mitmdump", "bench-pass", None, None),
    "llmitm": ("llmitm pass · chat", "chat", "llmitm", "bench-pass", "both", None),
    "llmitm-translated": (
        "llmitm responses→chat",
        "responses",
        "llmitm",
        "bench-over-chat",
        "chat-only",
        "chat",
    ),
}
SAMPLE_S = 0.02


def raise_fd_limit(wanted: int) -> int:
    """Raise this process's open-file limit toward ``wanted`` (up to the hard limit); the
    processes it starts inherit it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status", "rb") as status:
        for line in status:
            if line.startswith(b"VmRSS:"):
                return int(line.split()[1])
    return 0


@dataclass
class Round:
    cpu_per_event_us: float
    idle_mib: float
    peak_mib: float
    ttft: list[float]
    total: list[float]
    events: int
    wall: float


@dataclass
class Measured:
    setup: Setup
    rounds: list[Round] = field(default_factory=list)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def one_stream(setup: Setup, events: int, timeout: float) -> tuple[float, float, int]:
    loop = asyncio.get_running_loop()
    done: asyncio.Future = loop.create_future()
    request = setup.request(events, True)
    transport, _ = await loop.create_connection(
        lambda: SSEStream(request, CONTENT[setup.api], TERMINAL[setup.api], done),
        "127.0.0.1",
        setup.port,
    )
    try:
        sample = await asyncio.wait_for(done, timeout)
    finally:
        transport.close()
    check(setup, sample, events)
    assert sample.ttft is not None
    return sample.ttft, sample.total, sample.events


async def watch_rss(pid: int, peak: list[int], stop: asyncio.Event) -> None:
    while not stop.is_set():
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            peak[0] = max(peak[0], rss_kib(pid))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), SAMPLE_S)


async def measure(setup: Setup, args: argparse.Namespace) -> Round:
    pid = setup.pid
    idle = rss_kib(pid) if pid else 0
    peak = [idle]
    stop = asyncio.Event()
    watcher = asyncio.create_task(watch_rss(pid, peak, stop)) if pid else None
    cpu0 = cpu_seconds(pid)
    started = time.perf_counter()
    gap = args.ramp / max(1, args.streams)
    tasks = []
    for index in range(args.streams):
        tasks.append(asyncio.create_task(one_stream(setup, args.events, args.timeout)))
        if gap and index % 10 == 9:
            await asyncio.sleep(gap * 10)
    results = await asyncio.gather(*tasks)
    wall = time.perf_counter() - started
    await asyncio.sleep(0.5)  # the proxy finishes its flows (recording, usage) off the clock
    cpu = cpu_seconds(pid) - cpu0
    stop.set()
    if watcher is not None:
        await watcher
    events = sum(n for _, _, n in results)
    return Round(
        cpu_per_event_us=cpu / events * 1e6 if pid else 0.0,
        idle_mib=idle / 1024,
        peak_mib=peak[0] / 1024,
        ttft=[t for t, _, _ in results],
        total=[t for _, t, _ in results],
        events=events,
        wall=wall,
    )


def start(procs: Processes, names: list[str], llmitm_set: list[str], delay_ms: int) -> list[Setup]:
    both = f"http://127.0.0.1:{start_fake(procs, 'chat,responses')}"
    chat = f"http://127.0.0.1:{start_fake(procs, 'chat')}"
    where: dict[str, tuple[int, int | None]] = {"direct": (int(both.rpartition(":")[2]), None)}
    vias = {SETUPS[name][2] for name in names}
    if "mitmdump" in vias:
        where["mitmdump"] = start_mitmdump(procs, both)
    config = CONFIG.format(both=both, chat=chat, responses=chat)
    setups = []
    for name in names:
        label, api, via, model, endpoint, upstream = SETUPS[name]
        if via == "llmitm":
            # A process per llmitm setup: each one's memory is its own streams'.
            where[name] = start_llmitm(procs, both, config, extra=llmitm_set, name=name)
        setup = Setup(name, label, api, via, model, endpoint, upstream)  # type: ignore[arg-type]
        setup.port, setup.pid = where[via if via != "llmitm" else name]
        setup.delay_ms = delay_ms
        setups.append(setup)
    return setups


def report(measured: list[Measured], args: argparse.Namespace) -> None:
    by_key = {m.setup.key: m for m in measured}
    direct = by_key.get("direct")
    mitmdump = by_key.get("mitmdump")

    def med(m: Measured, f) -> float:
        return statistics.median(f(r) for r in m.rounds)

    print(
        f"\n{args.streams} concurrent streams of {args.events} events paced "
        f"{args.event_delay_ms} ms, started over {args.ramp:g} s; median of {args.rounds} rounds; "
        f"load average {args.load_before} before, {os.getloadavg()[0]:.1f} after"
    )
    head = (
        "setup", "CPU µs/event", "× mitmdump", "RSS warm→peak MiB", "KiB/stream",
        "TTFT p50/p99 ms", "+TTFT p99 vs direct", "stream p50/p99 s", "+p99 vs direct ms",
    )  # fmt: skip
    print(" | ".join(head))
    for m in measured:
        cpu = med(m, lambda r: r.cpu_per_event_us)
        ratio = (
            f"{cpu / med(mitmdump, lambda r: r.cpu_per_event_us):.2f}"
            if mitmdump and m.setup.pid and m is not mitmdump
            else "-"
        )
        # From the process warmed up (before its first round) to its highest peak.
        idle, peak = m.rounds[0].idle_mib, max(r.peak_mib for r in m.rounds)
        growth = (peak - idle) * 1024 / args.streams
        t50, t99 = med(m, lambda r: pct(r.ttft, 0.5)), med(m, lambda r: pct(r.ttft, 0.99))
        s50, s99 = med(m, lambda r: pct(r.total, 0.5)), med(m, lambda r: pct(r.total, 0.99))
        if direct is not None and m is not direct:
            # Per round, against the direct setup of the same round, then the median.
            pairs = list(zip(m.rounds, direct.rounds, strict=True))
            add_t = statistics.median(pct(a.ttft, 0.99) - pct(b.ttft, 0.99) for a, b in pairs)
            add_s = statistics.median(pct(a.total, 0.99) - pct(b.total, 0.99) for a, b in pairs)
            added = (f"{add_t * 1000:+.1f}", f"{add_s * 1000:+.0f}")
        else:
            added = ("-", "-")
        cells = (
            m.setup.label,
            f"{cpu:.1f}" if m.setup.pid else "-",
            ratio,
            f"{idle:.1f}→{peak:.1f}" if m.setup.pid else "-",
            f"{growth:.0f}" if m.setup.pid else "-",
            f"{t50 * 1000:.1f}/{t99 * 1000:.1f}",
            added[0],
            f"{s50:.2f}/{s99:.2f}",
            added[1],
        )
        print(" | ".join(cells))


async def run(args: argparse.Namespace, setups: list[Setup]) -> list[Measured]:
    measured = [Measured(s) for s in setups]
    # A short warm-up per setup: imports, first connections, caches.
    for setup in setups:
        await asyncio.gather(*(one_stream(setup, 5, args.timeout) for _ in range(20)))
    for index in range(args.rounds):
        order = measured if index % 2 == 0 else measured[::-1]
        for m in order:
            print(f"round {index + 1}: {m.setup.label}", file=sys.stderr, flush=True)
            m.rounds.append(await measure(m.setup, args))
    return measured


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--events", type=int, default=50)
    parser.add_argument("--event-delay-ms", type=int, default=200)
    parser.add_argument("--ramp", type=float, default=5.0, help="seconds to start them over")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=120.0, help="per stream, seconds")
    parser.add_argument("--setups", default="direct,mitmdump,llmitm")
    parser.add_argument("--llmitm-set", action="append", default=[], help="OPTION=VALUE")
    args = parser.parse_args(argv)
    names = [name.strip() for name in args.setups.split(",") if name.strip()]
    unknown = set(names) - set(SETUPS)
    if unknown or not names:
        parser.error(f"--setups: known are {', '.join(SETUPS)}")
    limit = raise_fd_limit(4 * args.streams + 1024)
    if limit < 3 * args.streams + 256:
        parser.error(f"the open-file limit is {limit}: too low for {args.streams} streams")
    args.load_before = f"{os.getloadavg()[0]:.1f}"
    tmp = Path(tempfile.mkdtemp(prefix="llmitm-bench-scale-"))
    procs = Processes(tmp)
    try:
        setups = start(procs, names, args.llmitm_set, args.event_delay_ms)
        measured = asyncio.run(run(args, setups))
    finally:
        procs.stop_all()
    report(measured, args)
    print(f"\nlogs: {tmp}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
