"""Benchmark big request bodies and memory per concurrent stream: llmitm against plain mitmdump
in the same run, with recording on (the default) and off.

Agents resend their whole, growing history on every turn, so a request body of hundreds of KB
to several MB is the common case, and what llmitm does with it before the upstream sees the
first byte is added to every turn. Everything runs on loopback as real processes (the same
fake upstreams, plain mitmdump and ``llmitm run`` as ``scripts/bench_proxy.py``; two llmitm
processes, one per ``llmitm_record`` setting):

  big body     a non-streamed Responses request of ``--sizes`` MB of input items (messages,
               function calls and their outputs, as an agent sends them):
               ``responses→chat``  translated for a chat-only upstream
               ``passthrough``     to an upstream that speaks Responses
               per setup: the median wall time of a request (the client's first byte sent to
               the answer's last byte read) and the proxy's CPU for it, including what it
               does after answering (read once the proxy's CPU has settled)
  memory       peak RSS (VmHWM) of each proxy after ``--streams`` concurrent paced Responses
               streams (translated to chat for llmitm), in rising order on fresh processes,
               and RSS once they ended; ``--memory-runs`` rounds, medians; with
               ``--before``, the llmitm setups also through that checkout

With ``--timeline N``, instead of the probe: each proxy on a fresh process (after a few
warm-up streams) takes one burst of N concurrent paced streams while its RSS is sampled every
10 ms, and the peak growth per stream over the RSS before the burst is told, with when it came
(``--timeline-runs`` rounds, interleaved; ``--stream-events`` per stream; ``--normalised``:
Responses streams normalised for a Responses upstream instead of translated over chat).

With ``--split``, the big bodies go to a stamping upstream instead (this script run with
``--stamped-upstream``: a thread per connection that answers every request at once with a
small chat completion or Response and notes when its first and last bytes came), and each
request's wall time is told in two: from the client's first byte to the upstream's first
(the body read, the proxy's request path, the upstream connection) and from the upstream's
answer to the client's last byte (the answer's path back). Clocks are comparable: every
process reads the same monotonic clock.

    python scripts/bench_big_request.py [--sizes 0.2,1,5] [--runs 7] [--streams 1,64,256]
                                        [--skip-memory] [--skip-big] [--before PATH] [--split]
                                        [--memory-runs 1] [--timeline N [--timeline-runs 2]
                                        [--stream-events 100] [--normalised]]

Requests of all setups are interleaved round by round, every other round in reverse order.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_proxy as bp  # the sibling script's processes and stream client

SETTLE_S = 0.02
SETTLE_LIMIT_S = 10.0
REQUEST_TIMEOUT_S = 120.0
STREAM_EVENTS = 100
STREAM_DELAY_MS = 20
TARGET_RATIO, TARGET_PLUS_MS = 1.3, 5.0


def input_items(megabytes: float) -> list[dict[str, object]]:
    """An agent's history of about ``megabytes`` MB: turns of a user message, a function call,
    its output and an assistant message, each text a few KB of varied words."""
    # A dash now and then, as models write: a text of ASCII alone would hide what decoding
    # and encoding a non-ASCII history costs.
    words = [f"word{n % 997}" if n % 60 else "—" for n in range(700)]
    text = " ".join(words)  # ~5.6 KB
    items: list[dict[str, object]] = []
    size, turn = 0, 0
    while size < megabytes * 1e6:
        turn += 1
        call = f"call_{turn:06d}"
        items += [
            {"role": "user", "content": [{"type": "input_text", "text": f"turn {turn}: {text}"}]},
            {
                "type": "function_call",
                "call_id": call,
                "name": "shell",
                "arguments": orjson.dumps({"cmd": f"cat file{turn}.txt"}).decode(),
            },
            {"type": "function_call_output", "call_id": call, "output": text},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": f"answer {turn}: {text[:2000]}"}],
            },
        ]
        size += 2 * len(text) + 2100
    return items


def big_request(port: int, model: str, megabytes: float) -> bytes:
    body = {
        "model": model,
        "input": input_items(megabytes),
        "instructions": "You are a benchmark.",
        "tools": [
            {
                "type": "function",
                "name": "shell",
                "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
            }
        ],
    }
    content = orjson.dumps(body)
    head = (
        "POST /v1/responses HTTP/1.1\r\n"
        f"host: 127.0.0.1:{port}\r\n"
        "authorization: Bearer sk-bench\r\n"
        "content-type: application/json\r\n"
        "x-fake-scenario: text\r\n"
        f"content-length: {len(content)}\r\n\r\n"
    )
    return head.encode() + content


def exchange(port: int, request: bytes) -> tuple[float, int, bytes]:
    """Send ``request`` on a new connection; the wall time from its first byte sent to the
    answer's last byte read, the status and the body."""
    sent, ended, status, body = timed_exchange(port, request)
    return ended - sent, status, body


def timed_exchange(port: int, request: bytes) -> tuple[float, float, int, bytes]:
    """:func:`exchange`, with the monotonic times of the first byte sent and the answer's
    last byte read."""
    with socket.create_connection(("127.0.0.1", port), timeout=REQUEST_TIMEOUT_S) as sock:
        sent = time.perf_counter()
        sock.sendall(request)
        buffer = b""
        while b"\r\n\r\n" not in buffer:
            piece = sock.recv(65536)
            if not piece:
                raise ConnectionError("closed before the answer's head")
            buffer += piece
        head, _, body = buffer.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        length = next(
            int(line.partition(":")[2])
            for line in lines[1:]
            if line.lower().startswith("content-length:")
        )
        while len(body) < length:
            piece = sock.recv(65536)
            if not piece:
                raise ConnectionError("closed before the answer's end")
            body += piece
        return sent, time.perf_counter(), status, body


# --- the stamping upstream (--split) ----------------------------------------------------------

_CHAT_ANSWER = orjson.dumps(
    {
        "id": "chatcmpl-stamped",
        "object": "chat.completion",
        "created": 1,
        "model": "stamped",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
)
_RESPONSES_ANSWER = orjson.dumps(
    {
        "id": "resp_stamped",
        "object": "response",
        "created_at": 1,
        "model": "stamped",
        "status": "completed",
        "output": [
            {
                "type": "message",
                "id": "msg_stamped",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": "ok", "annotations": []}],
            }
        ],
        "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2},
    }
)


def serve_stamped(port_file: Path) -> None:
    """The stamping upstream: prints ``first last answered`` (monotonic seconds) per request."""
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    port_file.write_text(str(listener.getsockname()[1]))

    def serve(conn: socket.socket) -> None:
        buffer = b""
        with conn:
            while True:
                first = None
                while b"\r\n\r\n" not in buffer:
                    piece = conn.recv(1 << 20)
                    if not piece:
                        return
                    first = first or time.perf_counter()
                    buffer += piece
                first = first or time.perf_counter()
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                length = next(
                    (int(v) for k, _, v in (x.partition(":") for x in lines[1:])
                     if k.strip().lower() == "content-length"),
                    0,
                )  # fmt: skip
                while len(buffer) < length:
                    piece = conn.recv(1 << 20)
                    if not piece:
                        return
                    buffer += piece
                buffer = buffer[length:]
                last = time.perf_counter()
                answer = _RESPONSES_ANSWER if "/responses" in lines[0] else _CHAT_ANSWER
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    b"content-length: %d\r\n\r\n" % len(answer) + answer
                )
                print(f"{first:.6f} {last:.6f} {time.perf_counter():.6f}", flush=True)

    while True:
        conn, _ = listener.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


def start_stamped(procs: bp.Processes) -> tuple[int, Path]:
    """The stamping upstream's port and the file its stamps go to."""
    port_file, stamps = procs.tmp / "stamped.port", procs.tmp / "stamped.txt"
    with stamps.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, __file__, "--stamped-upstream", str(port_file)],
            stdout=out,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    procs.running.append(("stamped", process))

    def ready() -> int | None:
        text = port_file.read_text().strip() if port_file.exists() else ""
        return int(text) if text else None

    return procs.wait_ready("stamped", process, ready), stamps  # type: ignore[return-value]


def last_stamp(stamps: Path, after: float) -> tuple[float, float, float]:
    """The stamping upstream's last ``(first, last, answered)``, once it is past ``after``."""
    deadline = time.monotonic() + SETTLE_LIMIT_S
    while time.monotonic() < deadline:
        lines = stamps.read_text().split()
        if len(lines) >= 3 and float(lines[-3]) > after:
            first, last, answered = (float(value) for value in lines[-3:])
            return first, last, answered
        time.sleep(0.005)
    raise RuntimeError("the stamping upstream noted no request")


def settled_cpu(pid: int) -> float:
    """The process's CPU once it stopped using any (its work after the answer included)."""
    deadline = time.monotonic() + SETTLE_LIMIT_S
    last = bp.cpu_seconds(pid)
    while time.monotonic() < deadline:
        time.sleep(SETTLE_S)
        now = bp.cpu_seconds(pid)
        if now - last < 0.0005:
            return now
        last = now
    return last


@dataclass
class BigSetup:
    label: str
    via: str
    model: str
    port: int = 0
    pid: int = 0
    walls: dict[float, list[float]] = field(default_factory=dict)
    cpus: dict[float, list[float]] = field(default_factory=dict)
    to_upstream: dict[float, list[float]] = field(default_factory=dict)
    """``--split``: from the client's first byte to the upstream's first."""
    back: dict[float, list[float]] = field(default_factory=dict)
    """``--split``: from the upstream's answer to the client's last byte."""


def big_setups(before: bool = False) -> list[BigSetup]:
    """The setups; with ``before``, the translated ones again through the other checkout."""
    again = [
        BigSetup("before: llmitm responses→chat, recording on", "before", "bench-over-chat"),
        BigSetup("before: llmitm responses→chat, recording off", "before-off", "bench-over-chat"),
    ]
    return [
        BigSetup("mitmdump", "mitmdump", "bench-pass"),
        BigSetup("llmitm responses→chat, recording on", "llmitm", "bench-over-chat"),
        BigSetup("llmitm responses→chat, recording off", "llmitm-off", "bench-over-chat"),
        BigSetup("llmitm passthrough, recording on", "llmitm", "bench-pass"),
        BigSetup("llmitm passthrough, recording off", "llmitm-off", "bench-pass"),
        *(again if before else []),
    ]


def run_big(
    setups: list[BigSetup], sizes: list[float], runs: int, stamps: Path | None = None
) -> None:
    for size in sizes:
        requests = {s.label: big_request(s.port, s.model, size) for s in setups}
        bp.progress(f"big body {size} MB ({len(next(iter(requests.values()))) / 1e6:.2f} MB)")
        for rnd in range(runs + 1):  # round 0 warms up
            order = setups if rnd % 2 else setups[::-1]
            for setup in order:
                before = settled_cpu(setup.pid)
                sent, ended, status, body = timed_exchange(setup.port, requests[setup.label])
                if status != 200:
                    raise RuntimeError(f"{setup.label}: HTTP {status}: {body[:500]!r}")
                cpu = settled_cpu(setup.pid) - before
                if rnd:
                    setup.walls.setdefault(size, []).append(ended - sent)
                    setup.cpus.setdefault(size, []).append(cpu)
                if rnd and stamps is not None:
                    first, _, answered = last_stamp(stamps, sent)
                    setup.to_upstream.setdefault(size, []).append(first - sent)
                    setup.back.setdefault(size, []).append(ended - answered)


def report_big(setups: list[BigSetup], sizes: list[float]) -> list[str]:
    base = setups[0]
    sized = " / ".join(f"{size:g}" for size in sizes)
    lines = [
        f"Big body: medians of wall (ms) and proxy CPU (ms) per request, {sized} MB of input",
        "| setup | wall | CPU | wall ÷ mitmdump's | target 1.3× + 5 ms met |",
        "| --- | --- | --- | --- | --- |",
    ]
    for setup in setups:
        walls = [statistics.median(setup.walls[s]) * 1e3 for s in sizes]
        cpus = [statistics.median(setup.cpus[s]) * 1e3 for s in sizes]
        base_walls = [statistics.median(base.walls[s]) * 1e3 for s in sizes]
        ratios = " / ".join(f"{w / b:.2f}×" for w, b in zip(walls, base_walls, strict=True))
        met = " / ".join(
            "yes" if w <= TARGET_RATIO * b + TARGET_PLUS_MS else "no"
            for w, b in zip(walls, base_walls, strict=True)
        )
        lines.append(
            f"| {setup.label} | {' / '.join(f'{w:.1f}' for w in walls)} | "
            f"{' / '.join(f'{c:.1f}' for c in cpus)} | {ratios} | "
            f"{met if setup is not base else '–'} |"
        )
    if base.to_upstream:
        lines += [
            "",
            "Split (--split): medians (ms) from the client's first byte to the upstream's "
            "first, and from the upstream's answer to the client's last byte",
            "| setup | to the upstream | answer back |",
            "| --- | --- | --- |",
        ]
        for setup in setups:
            ahead = [statistics.median(setup.to_upstream[s]) * 1e3 for s in sizes]
            back = [statistics.median(setup.back[s]) * 1e3 for s in sizes]
            lines.append(
                f"| {setup.label} | {' / '.join(f'{a:.1f}' for a in ahead)} | "
                f"{' / '.join(f'{b:.1f}' for b in back)} |"
            )
    return lines


# --- memory per concurrent stream ------------------------------------------------------------


def memory_kib(pid: int, field_name: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field_name} for {pid}")


def reset_peak(pid: int) -> None:
    """Start the process's peak RSS (VmHWM) again from its RSS now, so a level's peak is its
    own and not the start-up's or an earlier level's (Linux >= 4.0; elsewhere it stays)."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/clear_refs", "w") as clear_refs:
        clear_refs.write("5")


async def concurrent_streams(setup: bp.Setup, count: int) -> None:
    await asyncio.gather(*(bp.stream(setup, STREAM_EVENTS) for _ in range(count)))


Kind = tuple[str, str, str | None, tuple[str, ...], str | None]
"""A proxy of the memory probes: label, model, the endpoint it must reach, llmitm's extra
options, the checkout it runs (``None``: this one)."""


def memory_kinds(before: str | None, normalised: bool = False) -> list[Kind]:
    """Plain mitmdump, and llmitm with recording on and off (and through ``before``)."""
    model, endpoint = ("bench-pass", "both") if normalised else ("bench-over-chat", "chat-only")
    off = ("llmitm_record=off",)
    kinds: list[Kind] = [
        ("mitmdump", "bench-pass", None, (), None),
        ("llmitm, recording on", model, endpoint, (), None),
        ("llmitm, recording off", model, endpoint, off, None),
    ]
    if before:
        kinds += [
            ("before: llmitm, recording on", model, endpoint, (), before),
            ("before: llmitm, recording off", model, endpoint, off, before),
        ]
    return kinds


def interleaved(kinds: list[Kind], runs: int) -> Iterator[tuple[int, Kind]]:
    """Every kind, ``runs`` rounds, every other round in reverse order."""
    for rnd in range(runs):
        for kind in kinds if rnd % 2 == 0 else kinds[::-1]:
            yield rnd, kind


@contextlib.contextmanager
def fresh_proxy(folder: Path, kind: Kind) -> Iterator[tuple[int, bp.Setup]]:
    """``kind`` on a fresh process beside its fake upstreams, warmed up: its pid and the
    streams' setup; all stopped at the end."""
    label, model, endpoint, extra, code = kind
    procs = bp.Processes(folder)
    procs.tmp.mkdir()
    try:
        both = f"http://127.0.0.1:{bp.start_fake(procs, 'chat,responses')}"
        if label == "mitmdump":
            port, pid = bp.start_mitmdump(procs, both)
        else:
            chat = f"http://127.0.0.1:{bp.start_fake(procs, 'chat')}"
            config = bp.CONFIG.format(both=both, chat=chat, responses=both)
            port, pid = bp.start_llmitm(procs, both, config, extra=extra, code=code)
        setup = bp.Setup(label, label, "responses", "llmitm", model, endpoint, None)
        setup.port, setup.pid, setup.delay_ms = port, pid, STREAM_DELAY_MS
        asyncio.run(concurrent_streams(setup, 2))  # warm up: imports, first connections
        yield pid, setup
    finally:
        procs.stop_all()


TIMELINE_EVERY_S = 0.01
TIMELINE_AFTER_S = 1.5
"""How long RSS is still sampled after the burst's streams have ended (records are built)."""


def timeline_burst(pid: int, setup: bp.Setup, count: int) -> tuple[float, float, float]:
    """One burst of ``count`` streams with RSS sampled throughout: (peak growth per stream in
    KiB over the RSS before the burst, seconds from its start to the peak, to its end)."""
    before = memory_kib(pid, "VmRSS")
    samples: list[tuple[float, int]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            samples.append((time.monotonic(), memory_kib(pid, "VmRSS")))
            time.sleep(TIMELINE_EVERY_S)

    sampler = threading.Thread(target=sample)
    started = time.monotonic()
    sampler.start()
    try:
        asyncio.run(concurrent_streams(setup, count))
        ended = time.monotonic() - started
        time.sleep(TIMELINE_AFTER_S)
    finally:
        done.set()
        sampler.join()
    at, peak = max(samples, key=lambda sample: sample[1])
    return (peak - before) / count, at - started, ended


def run_timeline(
    tmp: Path, count: int, before: str | None, runs: int, normalised: bool
) -> list[str]:
    """:func:`timeline_burst` of each proxy on fresh processes, ``runs`` rounds interleaved."""
    kinds = memory_kinds(before, normalised)
    results: dict[str, list[tuple[float, float, float]]] = {kind[0]: [] for kind in kinds}
    for started, (rnd, kind) in enumerate(interleaved(kinds, runs), start=1):
        label = kind[0]
        with fresh_proxy(tmp / f"timeline-{started}", kind) as (pid, setup):
            asyncio.run(concurrent_streams(setup, 1))
            time.sleep(0.5)
            bp.progress(f"timeline, round {rnd + 1}: {label}, {count} streams")
            results[label].append(timeline_burst(pid, setup, count))
    path = "normalised for a Responses upstream" if normalised else "translated over chat"
    lines = [
        f"Timeline: one burst of {count} concurrent streams ({STREAM_EVENTS} events, one per "
        f"{STREAM_DELAY_MS} ms, {path}), RSS sampled every {TIMELINE_EVERY_S * 1000:.0f} ms; "
        "peak growth per stream over the RSS before the burst, and when (s from the start)",
        "| proxy | KiB per stream, median | each run: KiB at s (streams ended at s) |",
        "| --- | --- | --- |",
    ]
    base = statistics.median(r[0] for r in results["mitmdump"])
    for label, runs_results in results.items():
        median = statistics.median(r[0] for r in runs_results)
        each = "; ".join(f"{kib:.1f} at {at:.2f} ({end:.2f})" for kib, at, end in runs_results)
        ratio = "" if label == "mitmdump" else f" ({median / base:.2f}×)"
        lines.append(f"| {label} | {median:.1f}{ratio} | {each} |")
    return lines


def run_memory(tmp: Path, levels: list[int], before: str | None = None, runs: int = 1) -> list[str]:
    """Peak RSS per proxy at each level of concurrent streams, on fresh processes; with
    ``before``, the llmitm setups again through that checkout; ``runs`` rounds of every
    proxy, interleaved (every other round in reverse order), reported as medians."""
    kinds = memory_kinds(before)
    rows: dict[str, list[list[tuple[int, int]]]] = {kind[0]: [] for kind in kinds}
    for started, (rnd, kind) in enumerate(interleaved(kinds, runs), start=1):
        label = kind[0]
        values: list[tuple[int, int]] = []
        with fresh_proxy(tmp / f"memory-{started}", kind) as (pid, setup):
            for level in levels:
                bp.progress(f"memory, round {rnd + 1}: {label}, {level} concurrent streams")
                reset_peak(pid)
                asyncio.run(concurrent_streams(setup, level))
                time.sleep(0.3)
                values.append((memory_kib(pid, "VmHWM"), memory_kib(pid, "VmRSS")))
        rows[label].append(values)
    levels_text = " / ".join(map(str, levels))
    lines = [
        f"Memory: peak RSS (MiB) during {levels_text} concurrent streams (each level's own) "
        f"({STREAM_EVENTS} events, one per {STREAM_DELAY_MS} ms), RSS after them, and the "
        f"growth per stream from {levels[0]} to each later level; medians of {runs} run(s)",
        "| proxy | peak RSS | KiB per stream | RSS after the last | each run's per stream |",
        "| --- | --- | --- | --- | --- |",
    ]
    per_stream: dict[str, list[float]] = {}
    for label, runs_values in rows.items():
        peaks = [statistics.median(v[i][0] for v in runs_values) / 1024 for i in range(len(levels))]
        after = statistics.median(v[-1][1] for v in runs_values) / 1024
        grown = [
            [(v[i][0] - v[0][0]) / max(1, levels[i] - levels[0]) for v in runs_values]
            for i in range(1, len(levels))
        ]
        per_stream[label] = [statistics.median(g) for g in grown]
        each = "; ".join(" / ".join(f"{g[r]:.0f}" for g in grown) for r in range(runs))
        lines.append(
            f"| {label} | {' / '.join(f'{p:.1f}' for p in peaks)} | "
            f"{' / '.join(f'{g:.0f}' for g in per_stream[label])} | {after:.1f} | {each} |"
        )
    base = per_stream.get("mitmdump") or [1.0] * (len(levels) - 1)
    for label, grown in per_stream.items():
        if label != "mitmdump":
            ratios = " / ".join(f"{g / b:.2f}×" for g, b in zip(grown, base, strict=True))
            lines.append(f"{label}: {ratios} mitmdump's growth per stream")
    return lines


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--sizes", default="0.2,1,5", help="MB of input per request")
    parser.add_argument("--runs", type=int, default=7, help="measured rounds per size")
    parser.add_argument("--streams", default="1,64,256", help="levels of concurrent streams")
    parser.add_argument(
        "--memory-runs", type=int, default=1, help="rounds of the memory probe (medians)"
    )
    parser.add_argument(
        "--timeline", type=int, metavar="N", help="one burst of N streams, RSS sampled"
    )
    parser.add_argument("--timeline-runs", type=int, default=2, help="rounds of the timeline")
    parser.add_argument("--stream-events", type=int, default=STREAM_EVENTS)
    parser.add_argument(
        "--normalised", action="store_true", help="timeline: streams normalised, not translated"
    )
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--skip-big", action="store_true")
    parser.add_argument("--profile", metavar="DIR", help="run llmitm under cProfile into DIR")
    parser.add_argument(
        "--before", metavar="PATH", help="another checkout whose llmitm also translates"
    )
    parser.add_argument(
        "--split",
        action="store_true",
        help="big bodies to a stamping upstream: time to the upstream and back, apart",
    )
    parser.add_argument("--stamped-upstream", metavar="PORT_FILE", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.sizes = [float(size) for size in args.sizes.split(",")]
    args.streams = [int(level) for level in args.streams.split(",")]
    return args


def main(argv: list[str] | None = None) -> int:
    global STREAM_EVENTS
    args = parse_args(argv)
    STREAM_EVENTS = args.stream_events
    if args.stamped_upstream:
        serve_stamped(Path(args.stamped_upstream))
        return 0
    if args.profile:
        bp.PROFILE_DIR = Path(args.profile).resolve()
        bp.PROFILE_DIR.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="llmitm-bench-big-"))
    bp.progress(f"logs in {tmp}")
    lines: list[str] = []
    if not args.skip_big:
        procs = bp.Processes(tmp)
        setups = big_setups(before=bool(args.before))
        stamps: Path | None = None
        try:
            if args.split:
                port, stamps = start_stamped(procs)
                both = chat = f"http://127.0.0.1:{port}"
            else:
                both = f"http://127.0.0.1:{bp.start_fake(procs, 'chat,responses')}"
                chat = f"http://127.0.0.1:{bp.start_fake(procs, 'chat')}"
            config = bp.CONFIG.format(both=both, chat=chat, responses=both)
            where = {
                "mitmdump": bp.start_mitmdump(procs, both),
                "llmitm": bp.start_llmitm(procs, both, config),
                "llmitm-off": bp.start_llmitm(
                    procs, both, config, extra=("llmitm_record=off",), name="llmitm-off"
                ),
            }
            if args.before:
                where["before"] = bp.start_llmitm(
                    procs, both, config, code=args.before, name="llmitm-before"
                )
                where["before-off"] = bp.start_llmitm(
                    procs,
                    both,
                    config,
                    extra=("llmitm_record=off",),
                    code=args.before,
                    name="llmitm-before-off",
                )
            for setup in setups:
                setup.port, setup.pid = where[setup.via]
            run_big(setups, args.sizes, args.runs, stamps)
        finally:
            with contextlib.suppress(KeyboardInterrupt):
                procs.stop_all()
        lines += report_big(setups, args.sizes)
    if args.timeline:
        timeline = run_timeline(
            tmp, args.timeline, args.before, args.timeline_runs, args.normalised
        )
        lines += ["", *timeline]
    elif not args.skip_memory:
        lines += ["", *run_memory(tmp, args.streams, args.before, args.memory_runs)]
    print(f"{os.cpu_count()} CPUs; {bp.describe_llmitm()}")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
