"""Benchmark one huge SSE event (default 20 MiB of text in a single chat delta) through llmitm
against plain mitmdump, measured in the same run.

A stream whose cost grows with the square of an event's size hides behind small events: the
usual benchmarks (``scripts/bench_proxy.py``) never hold an event across reads. Here the
upstream (this script run with ``--serve``, a process of its own) writes a chat stream —
the role chunk, ONE content delta of ``--mib`` MiB, the finish chunk, ``[DONE]`` — in 64 KiB
chunked writes, and the client reads it to the end through:

  direct            client → upstream
  mitmdump          client → plain mitmdump (``scripts/bench_passthrough_addon.py``)
  llmitm pass       client → llmitm, a single-endpoint route (the stream guard)
  llmitm failover   client → llmitm → relay, a two-endpoint route
  llmitm →responses a Responses client → llmitm → this chat upstream (the translator)

Runs are interleaved round by round. Prints each setup's median wall time, its ratio to
mitmdump, the MiB its client read, that ratio per byte read (a Responses client reads the text
five times: the delta and four closing events repeat it), the proxy's median CPU time per run
and its ratio to mitmdump's (robust to a loaded machine, where wall times are not) and the
proxy's RSS after the last run. ``--setups pass,failover,translated`` picks llmitm's routes
(mitmdump always runs).

``--waves N`` measures memory instead: llmitm processes that differ only in how freed heap
goes back (glibc's defaults; a fixed mmap threshold; a fixed trim threshold; llmitm's
``malloc_trim`` after a flow that grew the heap, its default) each take
N waves of the pass and the translated route, and their RSS is printed after every wave,
with each variant's median time per event.

    python scripts/bench_big_event.py [--mib 20] [--runs 5] [--setups pass,translated]
    python scripts/bench_big_event.py --waves 7
    python scripts/bench_big_event.py --runs 3 --profile DIR   # then pstats DIR/llmitm.prof
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import bench_proxy
import orjson
from bench_proxy import Processes, cpu_seconds, start_llmitm, start_mitmdump

WRITE = 64 << 10

CONFIG = """\
[endpoints.up]
kind = "compatible"
base_url = "{up}/v1"
apis = ["chat"]

[endpoints.up-again]
kind = "compatible"
base_url = "{up}/v1"
apis = ["chat"]

[[routes]]
models = ["big-pass"]
endpoints = ["up"]

[[routes]]
models = ["big-failover"]
endpoints = ["up", "up-again"]

[[routes]]
models = ["big-translated"]
endpoints = ["up"]
"""


def chat_stream(mib: int) -> bytes:
    def chunk(delta: dict, finish: str | None = None) -> bytes:
        payload = {
            "id": "chatcmpl-big",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "big",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        return b"data: " + orjson.dumps(payload) + b"\n\n"

    return (
        chunk({"role": "assistant", "content": ""})
        + chunk({"content": "word " * ((mib << 20) // 5)})
        + chunk({}, "stop")
        + b"data: [DONE]\n\n"
    )


# --- the upstream (--serve) -------------------------------------------------------------------


async def serve(port_file: Path, mib: int) -> None:
    body = chat_stream(mib)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:  # one response per connection, then close: the clients read to the end
            if True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                await reader.readexactly(length)
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                    b"transfer-encoding: chunked\r\n\r\n"
                )
                for start in range(0, len(body), WRITE):
                    piece = body[start : start + WRITE]
                    writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                    await writer.drain()
                writer.write(b"0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port_file.write_text(str(server.sockets[0].getsockname()[1]))
    async with server:
        await server.serve_forever()


def start_upstream(procs: Processes, mib: int) -> int:
    port_file = procs.tmp / "upstream.port"
    argv = [sys.executable, __file__, "--serve", str(port_file), "--mib", str(mib)]
    process = procs.start("upstream", argv)

    def ready() -> int | None:
        text = port_file.read_text().strip() if port_file.exists() else ""
        return int(text) if text else None

    return procs.wait_ready("upstream", process, ready)  # type: ignore[return-value]


# --- the client -------------------------------------------------------------------------------


async def fetch(port: int, model: str, api: str) -> tuple[float, int]:
    """One streamed request read to its end: wall seconds and body bytes."""
    if api == "chat":
        path = "/v1/chat/completions"
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": True}
        terminal = b"[DONE]"
    else:
        path = "/v1/responses"
        body = {"model": model, "input": "hi", "stream": True}
        terminal = b"response.completed"
    data = orjson.dumps(body)
    started = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\ncontent-type: application/json\r\n"
        f"authorization: Bearer sk-bench\r\ncontent-length: {len(data)}\r\n"
        f"connection: close\r\n\r\n".encode()
        + data
    )
    received = 0
    tail = b""
    ended = False
    while chunk := await asyncio.wait_for(reader.read(1 << 20), 120):
        received += len(chunk)
        ended = ended or terminal in tail + chunk[:64] or terminal in chunk
        tail = chunk[-64:]
    writer.close()
    elapsed = time.perf_counter() - started
    if not ended:
        raise RuntimeError(f"{model}: the stream did not end with its terminal event: {tail!r}")
    return elapsed, received


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


NO_TRIM = ["llmitm_malloc_trim=false"]
ALLOCATORS: dict[str, tuple[dict[str, str], list[str]]] = {
    "glibc defaults": ({}, NO_TRIM),
    "mmap 128 KiB": ({"MALLOC_MMAP_THRESHOLD_": str(128 << 10)}, NO_TRIM),
    "trim 128 KiB": ({"MALLOC_TRIM_THRESHOLD_": str(128 << 10)}, NO_TRIM),
    "malloc_trim": ({}, []),
}
"""The allocator variants ``--waves`` compares: glibc's environment settings (read when a
process starts; any of them also stops glibc raising its mmap threshold after each large
free), and llmitm's own ``malloc_trim`` after flows that grew the heap (on by default)."""


def waves(procs: Processes, upstream: str, config: str, count: int) -> None:
    started = {
        label: start_llmitm(
            procs,
            upstream,
            config,
            extra=["llmitm_record=off", *options],
            env=env,
            name=f"llmitm-{index}",
        )
        for index, (label, (env, options)) in enumerate(ALLOCATORS.items())
    }
    print("RSS MiB after each wave (one event per route per wave)")
    print(f"{'wave':<6}" + "".join(f"{label:>18}" for label in started))
    print(f"{'start':<6}" + "".join(f"{rss_mb(pid):>18.0f}" for _port, pid in started.values()))
    times: dict[str, list[float]] = {label: [] for label in started}
    for wave in range(1, count + 1):
        for label, (port, _pid) in started.items():
            for model, api in (("big-pass", "chat"), ("big-translated", "responses")):
                elapsed, _size = asyncio.run(fetch(port, model, api))
                times[label].append(elapsed)
        time.sleep(1.0)  # what each process keeps once it has settled, not mid-clean-up
        row = "".join(f"{rss_mb(pid):>18.0f}" for _port, pid in started.values())
        print(f"{wave:<6}{row}", flush=True)
    medians = "".join(f"{statistics.median(t):>18.2f}" for t in times.values())
    print(f"{'s/ev':<6}{medians}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=20, help="size of the one content delta")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--waves", type=int, default=0, help="measure RSS over N waves")
    parser.add_argument(
        "--profile", type=Path, help="run llmitm under cProfile, writing DIR/<name>.prof"
    )
    parser.add_argument(
        "--setups",
        default="",
        help="comma-separated subset of: pass, failover, translated (mitmdump always runs)",
    )
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(args.serve, args.mib))
        return 0
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
        bench_proxy.PROFILE_DIR = args.profile.resolve()
    with tempfile.TemporaryDirectory(prefix="llmitm-bench-big-") as tmp:
        procs = Processes(Path(tmp))
        try:
            up = start_upstream(procs, args.mib)
            upstream = f"http://127.0.0.1:{up}"
            if args.waves:
                waves(procs, upstream, CONFIG.format(up=upstream), args.waves)
                return 0
            mitmdump_port, mitmdump_pid = start_mitmdump(procs, upstream)
            config = CONFIG.format(up=upstream)
            llmitm_port, llmitm_pid = start_llmitm(
                procs, upstream, config, extra=["llmitm_record=off"]
            )
            setups = [
                ("direct", up, "big", "chat", None),
                ("mitmdump", mitmdump_port, "big", "chat", mitmdump_pid),
                ("llmitm pass", llmitm_port, "big-pass", "chat", llmitm_pid),
                ("llmitm failover", llmitm_port, "big-failover", "chat", llmitm_pid),
                ("llmitm →responses", llmitm_port, "big-translated", "responses", llmitm_pid),
            ]
            if args.setups:
                chosen = {f"llmitm {name}" for name in args.setups.split(",")}
                chosen |= {"llmitm →responses"} if "llmitm translated" in chosen else set()
                setups = [s for s in setups if not s[0].startswith("llmitm") or s[0] in chosen]
            times: dict[str, list[float]] = {name: [] for name, *_ in setups}
            cpu: dict[str, list[float]] = {name: [] for name, *_ in setups}
            sizes: dict[str, int] = {}
            for round_ in range(args.runs):
                order = setups if round_ % 2 == 0 else setups[::-1]
                for name, port, model, api, pid in order:
                    cpu_before = cpu_seconds(pid)
                    elapsed, sizes[name] = asyncio.run(fetch(port, model, api))
                    cpu[name].append(cpu_seconds(pid) - cpu_before)
                    print(f"  {name}: {elapsed:.2f} s", file=sys.stderr, flush=True)
                    times[name].append(elapsed)
            base = statistics.median(times["mitmdump"])
            cpu_base = statistics.median(cpu["mitmdump"])
            print(f"one {args.mib} MiB event, median of {args.runs} runs")
            # The client's bytes: a Responses stream repeats the text in its closing events.
            print(
                f"{'setup':<20} {'median s':>9} {'× mitmdump':>11} {'MiB read':>9}"
                f" {'× per byte':>11} {'CPU s':>6} {'× CPU':>6} {'proxy RSS MiB':>14}"
            )
            for name, _port, _model, _api, pid in setups:
                median = statistics.median(times[name])
                rss = f"{rss_mb(pid):.0f}" if pid else "–"
                read = sizes[name] / (1 << 20)
                per_byte = median / base / (sizes[name] / sizes["mitmdump"])
                cpu_s = statistics.median(cpu[name])
                cpu_cells = f"{cpu_s:>6.2f} {cpu_s / cpu_base:>6.2f}" if pid else f"{'–':>13}"
                print(
                    f"{name:<20} {median:>9.2f} {median / base:>11.2f} {read:>9.0f}"
                    f" {per_byte:>11.2f} {cpu_cells} {rss:>14}"
                )
        finally:
            procs.stop_all()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
