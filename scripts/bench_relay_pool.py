"""Benchmark a failover route's upstream connections over TLS against mitmproxy's direct path,
measured in the same run.

One ``llmitm run`` (reverse mode, recording off) with two routes to local TLS upstreams
(``llmitm.testing.tls_upstream``: a CA made at start-up, trusted through
``ssl_verify_upstream_trusted_ca``), each route with an upstream of its own so each counts
its own handshakes, and each upstream in a process of its own (on the client's event loop,
an upstream writing a stream's later events would hold the client's read of the first):

  direct    a route with one endpoint: mitmproxy's own connection to the upstream
  failover  a route with two endpoints (the first healthy): llmitm's relay and its client

The client (in this process, never measured as the proxy) keeps one HTTP/1.1 connection per
setup open (``--client-http2``: one TLS connection speaking HTTP/2, so that mitmproxy's direct
path speaks HTTP/2 to an upstream offering it as well: it offers HTTP/2 upstream only to a
client that spoke it), as an SDK does, and sends streamed chat requests one at a time,
alternating the setups request by request (reversed every other round). Per setup: the median
and p90 time to the first body byte (TTFB) of the 2nd..Nth request, the proxy process's CPU
per request, the TLS handshakes the upstream saw per 100 requests, and the upstream's own
median time from a request's last read to its answer's first body write (``upstream``: the
part of the TTFB that is neither the proxy's nor the network's; the HTTP/2 side of this
Python upstream costs more than its HTTP/1.1 side, where a real upstream's would not). ``--twin-code
CHECKOUT`` runs the same setups through a second llmitm running an older checkout's code
(e.g. a worktree of the commit before the pool), with upstreams of its own.

On a loaded machine the wall TTFB is mostly waiting for a CPU (every process that wakes
queues behind the others), which says little about the path. So each request also reads the
proxy's CPU time (``/proc/<pid>/task/*/schedstat``) at its start and right after its first
byte (``CPU 1st byte``): with ``--event-delay-ms`` longer than the proxy's work on an event,
nothing but the path to the first byte runs in between, on an idle machine or a loaded one.

    python scripts/bench_relay_pool.py [--requests N] [--events E] [--event-delay-ms D]
                                       [--http2] [--client-http2] [--twin-code ../before]
"""

from __future__ import annotations

import argparse
import asyncio
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import bench_proxy
import h2.config
import h2.connection
import h2.events
import orjson
from bench_proxy import Processes, cpu_seconds, start_llmitm

CONFIG = """\
[routing]
connect_timeout = 5
first_byte_timeout = 30

[endpoints.direct]
kind = "compatible"
base_url = "{direct}/v1"
apis = ["chat"]

[endpoints.a]
kind = "compatible"
base_url = "{failover}/v1"
apis = ["chat"]

[endpoints.b]
kind = "compatible"
base_url = "{failover}/v1"
apis = ["chat"]

[[routes]]
models = ["direct-*"]
endpoints = ["direct"]

[[routes]]
models = ["failover-*"]
endpoints = ["a", "b"]
"""
SETTLE_S = 0.02  # after a request: let the proxy finish the flow before reading its CPU


@dataclass
class Upstream:
    """A local TLS upstream (``llmitm.testing.tls_upstream``) running in a process of its own;
    its counts are read once it has stopped."""

    process: subprocess.Popen[bytes]
    port: int
    ca_file: str
    stats_file: Path
    handshakes: int = 0
    protocols: list[str] = field(default_factory=list)
    answer_ms: float = 0.0
    """The median time from the read that completed a request to the write of its answer's
    first body piece: the upstream's own share of the TTFB."""

    @classmethod
    def start(cls, procs: Processes, name: str, args: argparse.Namespace) -> Upstream:
        port_file = procs.tmp / f"{name}.port"
        stats_file = procs.tmp / f"{name}.stats.json"
        command = [
            sys.executable, "-m", "llmitm.testing.tls_upstream",
            "--port-file", str(port_file), "--stats-file", str(stats_file),
            "--events", str(args.events), "--event-delay-ms", str(args.event_delay_ms),
            *(["--http2"] if args.http2 else []),
        ]  # fmt: skip
        process = procs.start(name, command)

        def ready() -> list[str] | None:
            text = port_file.read_text().split() if port_file.exists() else []
            return text if len(text) == 2 else None

        port, ca_file = procs.wait_ready(name, process, ready)  # type: ignore[misc]
        return cls(process, int(port), ca_file, stats_file)

    @property
    def base_url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def stop(self) -> None:
        """Stop the process and read what it counted."""
        if self.process.poll() is None:
            self.process.terminate()
        self.process.wait(timeout=10)
        stats = orjson.loads(self.stats_file.read_bytes())
        self.handshakes = stats["handshakes"]
        self.protocols = sorted(stats["protocols"])
        self.answer_ms = stats["answer_ms"] or 0.0


@dataclass
class Setup:
    name: str
    model: str
    upstream: Upstream
    port: int = 0
    pid: int = 0
    connection: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
    h2: H2Client | None = None
    ttfb: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    cpu_first: list[float] = field(default_factory=list)


@dataclass
class Sample:
    ttfb: float
    cpu: float
    cpu_first: float
    """The proxy's CPU from the request's start to its first byte."""


class H2Client:
    """One TLS connection to the proxy speaking HTTP/2 (h2), one stream at a time."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        config = h2.config.H2Configuration(client_side=True, header_encoding=None)
        self.state = h2.connection.H2Connection(config=config)
        self.state.initiate_connection()
        self.writer.write(self.state.data_to_send())
        self.events: list[h2.events.Event] = []

    @classmethod
    async def open(cls, port: int) -> H2Client:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE  # the proxy's own certificate
        context.set_alpn_protocols(["h2"])
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
        protocol = writer.get_extra_info("ssl_object").selected_alpn_protocol()
        if protocol != "h2":
            raise RuntimeError(f"the proxy did not speak HTTP/2 (ALPN {protocol!r})")
        return cls(reader, writer)

    def send(self, port: int, body: bytes) -> int:
        stream_id = self.state.get_next_available_stream_id()
        head = [
            (b":method", b"POST"),
            (b":authority", f"127.0.0.1:{port}".encode()),
            (b":scheme", b"https"),
            (b":path", b"/v1/chat/completions"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ]
        self.state.send_headers(stream_id, head)
        self.state.send_data(stream_id, body, end_stream=True)
        self.writer.write(self.state.data_to_send())
        return stream_id

    async def next_event(self, stream_id: int) -> h2.events.Event:
        while True:
            for index, event in enumerate(self.events):
                if getattr(event, "stream_id", stream_id) == stream_id:
                    return self.events.pop(index)
            data = await self.reader.read(65536)
            if not data:
                raise RuntimeError("the proxy closed the HTTP/2 connection")
            for event in self.state.receive_data(data):
                if isinstance(event, h2.events.DataReceived):
                    self.state.acknowledge_received_data(
                        event.flow_controlled_length, event.stream_id
                    )
                if isinstance(
                    event,
                    (h2.events.ResponseReceived, h2.events.DataReceived, h2.events.StreamEnded,
                     h2.events.StreamReset),
                ):  # fmt: skip
                    self.events.append(event)
            self.writer.write(self.state.data_to_send())


async def one_request_h2(setup: Setup, body: bytes) -> Sample:
    """:func:`one_request` over the setup's HTTP/2 connection."""
    if setup.h2 is None:
        setup.h2 = await H2Client.open(setup.port)
    client = setup.h2
    cpu = cpu_seconds(setup.pid)
    started = time.perf_counter()
    stream_id = client.send(setup.port, body)
    data = b""
    ttfb = cpu_first = 0.0
    while True:
        event = await client.next_event(stream_id)
        if isinstance(event, h2.events.ResponseReceived):
            status = dict(event.headers or [])[b":status"]
            if status != b"200":
                raise RuntimeError(f"{setup.name}: status {status!r}")
        elif isinstance(event, h2.events.DataReceived):
            if not data:
                ttfb = time.perf_counter() - started
                cpu_first = cpu_seconds(setup.pid) - cpu
            data += event.data or b""
        elif isinstance(event, h2.events.StreamEnded):
            break
        else:
            raise RuntimeError(f"{setup.name}: {event!r}")
    if b"[DONE]" not in data:
        raise RuntimeError(f"{setup.name}: the stream did not end with [DONE]")
    await asyncio.sleep(SETTLE_S)
    return Sample(ttfb, cpu_seconds(setup.pid) - cpu, cpu_first)


async def one_request(setup: Setup, events: int, client_http2: bool = False) -> Sample:
    """One streamed request on the setup's kept-alive connection."""
    body = orjson.dumps(
        {
            "model": setup.model,
            "stream": True,
            "messages": [{"role": "user", "content": f"hi ({events} events)"}],
        }
    )
    if client_http2:
        return await one_request_h2(setup, body)
    if setup.connection is None:
        setup.connection = await asyncio.open_connection("127.0.0.1", setup.port)
    reader, writer = setup.connection
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:{setup.port}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode()
    cpu = cpu_seconds(setup.pid)
    started = time.perf_counter()
    writer.write(head + body)
    response_head = await reader.readuntil(b"\r\n\r\n")
    status = int(response_head.split(b" ", 2)[1])
    if status != 200:
        raise RuntimeError(f"{setup.name}: {response_head!r} {await reader.read(2000)!r}")
    if b"transfer-encoding: chunked" not in response_head.lower():
        raise RuntimeError(f"{setup.name}: not chunked: {response_head!r}")
    size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
    ttfb = time.perf_counter() - started
    cpu_first = cpu_seconds(setup.pid) - cpu
    data = await reader.readexactly(size + 2)
    while size:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        data += await reader.readexactly(size + 2)
    if b"[DONE]" not in data:
        raise RuntimeError(f"{setup.name}: the stream did not end with [DONE]")
    await asyncio.sleep(SETTLE_S)
    return Sample(ttfb, cpu_seconds(setup.pid) - cpu, cpu_first)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def measure(
    setups: list[Setup], requests: int, events: int, client_http2: bool = False
) -> None:
    for index in range(requests):
        order = setups if index % 2 == 0 else list(reversed(setups))
        for setup in order:
            sample = await one_request(setup, events, client_http2)
            if index:  # the 2nd..Nth request: the first pays the connections' set-up
                setup.ttfb.append(sample.ttfb)
                setup.cpu.append(sample.cpu)
                setup.cpu_first.append(sample.cpu_first)
    for setup in setups:
        if setup.connection is not None:
            setup.connection[1].close()
        if setup.h2 is not None:
            setup.h2.writer.close()


def report(setups: list[Setup], requests: int) -> list[str]:
    lines = [
        f"{'setup':<16} {'TTFB p50':>8} {'p90':>6} {'added':>6} {'CPU 1st byte':>12} "
        f"{'added':>6} {'CPU/req':>7} {'handshakes/100':>14} {'protocol':>8} {'upstream':>8}"
        "   (ms)"
    ]
    direct: dict[str, tuple[float, float]] = {}
    for setup in setups:
        ttfb = statistics.median(setup.ttfb) * 1000
        first = statistics.median(setup.cpu_first) * 1000
        twin = setup.name.partition(" ")[2]
        added = ["", ""]
        if setup.name.startswith("direct"):
            direct[twin] = (ttfb, first)
        elif twin in direct:
            added = [f"{ttfb - direct[twin][0]:+.2f}", f"{first - direct[twin][1]:+.2f}"]
        handshakes = setup.upstream.handshakes
        protocols = ",".join(setup.upstream.protocols) or "-"
        lines.append(
            f"{setup.name:<16} {ttfb:>8.2f} {percentile(setup.ttfb, 0.9) * 1000:>6.2f} "
            f"{added[0]:>6} {first:>12.2f} {added[1]:>6} "
            f"{statistics.median(setup.cpu) * 1000:>7.2f} "
            f"{handshakes * 100 / requests:>14.1f} {protocols:>8} {setup.upstream.answer_ms:>8.2f}"
        )
    return lines


async def run(args: argparse.Namespace, procs: Processes) -> list[str]:
    setups: list[Setup] = []
    twins = [("", None)] + ([("before", args.twin_code)] if args.twin_code else [])
    bundle = procs.tmp / "upstream-cas.pem"
    for suffix, code in twins:
        direct = Upstream.start(procs, f"upstream-direct{suffix}", args)
        failover = Upstream.start(procs, f"upstream-failover{suffix}", args)
        cas = b"".join(Path(u.ca_file).read_bytes() for u in (direct, failover))
        bundle.write_bytes(bundle.read_bytes() + cas if bundle.exists() else cas)
        name = f"llmitm-{suffix}" if suffix else "llmitm"
        config = CONFIG.format(direct=direct.base_url, failover=failover.base_url)
        extra = [f"ssl_verify_upstream_trusted_ca={bundle}", "llmitm_record=off"]
        port, pid = start_llmitm(
            procs, "http://127.0.0.1:9", config, extra=extra, code=code, name=name
        )
        label = f" {suffix}" if suffix else ""
        setups.append(Setup(f"direct{label}", "direct-m", direct, port, pid))
        setups.append(Setup(f"failover{label}", "failover-m", failover, port, pid))
    await measure(setups, args.requests, args.events, args.client_http2)
    for setup in setups:
        setup.upstream.stop()
    return report(setups, args.requests)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200, help="requests per setup")
    parser.add_argument("--events", type=int, default=20, help="text deltas per stream")
    parser.add_argument("--http2", action="store_true", help="the upstreams offer HTTP/2")
    parser.add_argument(
        "--client-http2",
        action="store_true",
        help="the client speaks HTTP/2 to the proxy over TLS (mitmproxy's direct path then "
        "speaks HTTP/2 to an upstream offering it)",
    )
    parser.add_argument(
        "--event-delay-ms",
        type=float,
        default=0.0,
        help="the upstreams wait this long between events (after the first)",
    )
    parser.add_argument(
        "--twin-code",
        metavar="CHECKOUT",
        help="also measure both setups through an llmitm running this checkout's code",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="run each llmitm under cProfile, writing DIR/<name>.prof (the figures are then "
        "cProfile's)",
    )
    args = parser.parse_args()
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
        bench_proxy.PROFILE_DIR = args.profile.resolve()
    procs = Processes(Path(tempfile.mkdtemp(prefix="llmitm-bench-relay-pool-")))
    try:
        lines = asyncio.run(run(args, procs))
    finally:
        procs.stop_all()
    print(
        f"{args.requests} streamed chat requests per setup ({args.events} events each), one "
        f"kept-alive client connection per setup, TLS upstreams"
        f"{' offering HTTP/2' if args.http2 else ' (HTTP/1.1)'}"
        f"{', the client speaking HTTP/2' if args.client_http2 else ''}; "
        "TTFB and CPU of the 2nd..Nth"
    )
    print("\n".join(lines))
    print(f"logs: {procs.tmp}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
