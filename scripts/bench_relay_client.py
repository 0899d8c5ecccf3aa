"""Benchmark the relay's upstream client alone: CPU and event-loop turns per request.

One process per measurement, alternating: the relay's ``UpstreamClient`` sends streamed chat
requests, one at a time, over one kept-alive connection to a minimal HTTP/1.1 server in the
same process (its work is the same in every setup), and reads each answer to its end. Per
setup: the median over ``--runs`` of the process CPU per request and the event-loop turns
per request (each turn runs every other ready callback first: on a busy proxy, latency).

  shipped   httpcore's request path with its locks and events as shipped (anyio's turns)
  fast      httpcore's request path with ``relay.fast_locks`` installed
  idle      as ``llmitm run`` has it: the fast locks, and a request on an idle pooled
            connection written and its answer's head read by ``relay.idle_http11``
  raw       the same request written and its answer read on a bare asyncio stream: the
            floor that any HTTP client adds to

With ``--http2`` the server is instead a local TLS upstream in a process of its own
(``llmitm.testing.tls_upstream``, three events an answer), so only the client is measured:

  tls-h1    the idle HTTP/1.1 path over TLS (the upstream offering HTTP/1.1 only)
  h2-core   HTTP/2 through httpcore's request path and body iterator
  h2-pooled as ``llmitm run`` has it: later requests open their stream on the pooled
            connection through ``relay.pooled_http2``

    python scripts/bench_relay_client.py [--requests 3000] [--runs 5] [--http2]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time

BODY = b'{"model":"x","messages":[{"role":"user","content":"hi"}],"stream":true}'
EVENT = b"data: {}\n\n"
ANSWER = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    + b"%x\r\n%s\r\n0\r\n\r\n" % (len(EVENT), EVENT)
)


async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            await reader.readexactly(length)
            writer.write(ANSWER)
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
        writer.close()


async def measure_tls(setup: str, requests: int) -> tuple[float, float]:
    """A ``--http2`` setup: CPU per request and CPU to the first body byte per request."""
    import ssl
    import tempfile
    from pathlib import Path

    from llmitm.relay import pooled_http2
    from llmitm.relay.client import UpstreamClient, UpstreamRequest, UpstreamSettings

    http2 = setup != "tls-h1"
    pooled_http2.ENABLED = pooled_http2.ENABLED and setup == "h2-pooled"
    port_file = Path(tempfile.mkdtemp(prefix="llmitm-bench-client-")) / "port"
    command = [sys.executable, "-m", "llmitm.testing.tls_upstream", "--port-file", str(port_file)]
    server = subprocess.Popen([*command, "--events", "3", *(["--http2"] if http2 else [])])
    try:
        while not port_file.exists() or not port_file.read_text():
            await asyncio.sleep(0.05)
        port, ca_file = port_file.read_text().split()
        context = ssl.create_default_context(cafile=ca_file)
        client = UpstreamClient(UpstreamSettings(tls_context=context, http2=http2))
        request = UpstreamRequest(
            "POST",
            f"https://127.0.0.1:{port}/v1/chat/completions",
            [("content-type", "application/json"), ("authorization", "Bearer sk-bench")],
            BODY,
        )
        first = 0.0

        async def one() -> None:
            nonlocal first
            started = time.process_time()
            answer = await client.send(request, connect_timeout=5)
            await answer.first_pieces()
            first += time.process_time() - started
            await answer.read_body()

        for _ in range(200):
            await one()
        first, started = 0.0, time.process_time()
        for _ in range(requests):
            await one()
        cpu = (time.process_time() - started) / requests
        await client.aclose()
    finally:
        server.terminate()
        server.wait()
    return cpu, first / requests


async def measure(setup: str, requests: int) -> tuple[float, float]:
    loop = asyncio.get_running_loop()
    turns = 0
    run_once = loop._run_once  # type: ignore[attr-defined]

    def counted() -> None:
        nonlocal turns
        turns += 1
        run_once()

    loop._run_once = counted  # type: ignore[attr-defined]
    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    headers = [("content-type", "application/json"), ("authorization", "Bearer sk-bench")]
    if setup == "raw":
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        request = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n" + b"".join(
            f"{k}: {v}\r\n".encode() for k, v in headers
        )
        request += b"content-length: %d\r\n\r\n%s" % (len(BODY), BODY)

        async def one() -> None:
            writer.write(request)
            await reader.readuntil(b"\r\n\r\n")
            await reader.readuntil(b"0\r\n\r\n")

    else:
        from llmitm.relay import fast_locks, idle_http11
        from llmitm.relay.client import UpstreamClient, UpstreamRequest

        # "shipped": taken as tried already, so the client's install leaves httpcore alone
        fast_locks._installed = fast_locks._patch() if setup != "shipped" else False
        idle_http11.ENABLED = idle_http11.ENABLED and setup == "idle"
        client = UpstreamClient()

        async def one() -> None:
            answer = await client.send(
                UpstreamRequest("POST", url, headers, BODY), connect_timeout=5
            )
            await answer.first_pieces()
            await answer.read_body()

    for _ in range(200):
        await one()
    turns, started = 0, time.process_time()
    for _ in range(requests):
        await one()
    cpu = (time.process_time() - started) / requests
    server.close()
    return cpu, turns / requests


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--http2", action="store_true", help="the TLS and HTTP/2 setups")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        tls = args.one in ("tls-h1", "h2-core", "h2-pooled")
        cpu, other = asyncio.run((measure_tls if tls else measure)(args.one, args.requests))
        print(cpu, other)
        return 0
    setups = ["shipped", "fast", "idle", "raw"]
    if args.http2:
        setups = ["tls-h1", "h2-core", "h2-pooled"]
    figures: dict[str, list[tuple[float, float]]] = {s: [] for s in setups}
    for run in range(args.runs):
        for setup in setups if run % 2 == 0 else setups[::-1]:
            out = subprocess.run(
                [sys.executable, __file__, "--one", setup, "--requests", str(args.requests)],
                capture_output=True, text=True, check=True,
            ).stdout.split()  # fmt: skip
            figures[setup].append((float(out[0]), float(out[1])))
    print(f"{args.requests} requests per run, median of {args.runs} runs")
    second = "CPU µs to 1st byte" if args.http2 else "loop turns/request"
    print(f"setup     CPU µs/request  {second}")
    for setup in setups:
        cpu = statistics.median(f[0] for f in figures[setup]) * 1e6
        other = statistics.median(f[1] for f in figures[setup])
        print(f"{setup:9} {cpu:14.0f} {other * 1e6 if args.http2 else other:19.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
