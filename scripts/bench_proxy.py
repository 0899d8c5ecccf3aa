"""Benchmark llmitm as a proxy against plain mitmdump measured in the same run.

Everything runs on loopback as real processes on free ports: the fake upstream
(``llmitm.testing.fake_upstream``, one SSE event per chunk; a chat+responses one, a chat-only one
and a Responses-only one), plain mitmdump (``-s scripts/bench_passthrough_addon.py``: only
``flow.response.stream = True``) and one ``llmitm run`` whose config routes by model name.
Setups, the baselines once per client API:

  1 direct                   client → fake upstream
  2 mitmdump                 client → plain mitmdump (reverse mode) → fake upstream
  3 llmitm pass              client → llmitm → an endpoint that speaks the client's API
                             (a compatible one: its stream normalised, by default)
  3t llmitm pass trusted     the same endpoint with ``conformant = ["chat", "responses"]`` and
                             ``state = "native"``:
                             relayed by the guard, what 3 cost before default normalisation
  3n llmitm pass native      the same endpoint with ``state = "native"`` only: normalised,
                             its Responses state left to the server (3 keeps it, emulated)
  4 llmitm responses→chat    Responses client → llmitm → chat-only upstream
  5 llmitm chat→responses    chat client → llmitm → Responses-only upstream
  6 llmitm failover route    chat client → llmitm → relay (failover job) → the same upstream
                             as 3: a route with two endpoints, the first healthy

One lean asyncio HTTP/1.1 client in this process (its CPU is never counted) reads every
stream to its end. Per setup: the median wall time of a ``--events`` stream, the proxy
process's CPU per 1000 events, the time to the first content-bearing event and its increase
over direct, and ``--concurrency`` concurrent streams' total wall time, per-stream p50/p99,
CPU and TTFT — each with its ratio to plain mitmdump relaying the same client API. Streams of
all setups are interleaved round by round, so drift on the machine hits them alike, and every
other round runs them in reverse order, so none always runs right after another.

    python scripts/bench_proxy.py [--events N] [--runs R] [--concurrency C] [--setups a,b]
                                  [--event-delay-ms M]   # paced, LLM-like streams
                                  [--console live|lines] # + each llmitm setup with a console
                                  [--twin-set llmitm_record=record]  # + each llmitm setup
                                                    # through a twin with these options
                                  [--llmitm-set llmitm_record=off]  # any llmitm option
                                  [--twin-code ../other-checkout]  # + each llmitm setup
                                                    # through a twin running that code

Unpaced (the default) the fake writes as fast as the proxy reads, so a slower proxy reads
more events per chunk; ``--event-delay-ms`` gives every event its own read and wake-up.

Logs of every process stay in a temporary directory printed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import math
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import orjson

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
FAKE_UPSTREAM = (sys.executable, "-m", "llmitm.testing.fake_upstream")
PASSTHROUGH_ADDON = ROOT / "scripts" / "bench_passthrough_addon.py"
CLK_TCK = os.sysconf("SC_CLK_TCK")
READY_TIMEOUT_S = 60.0
STREAM_TIMEOUT_S = 600.0
SETTLE_S = 0.05  # after a measured stream: let the proxy finish the flow before reading CPU
TTFT_EVENTS = 20
QUIET = ["--set", "termlog_verbosity=warn", "--set", "flow_detail=0"]

Api = Literal["chat", "responses"]
PATHS: dict[Api, str] = {"chat": "/v1/chat/completions", "responses": "/v1/responses"}
# The first event that carries answer text: a chat delta with non-empty content (the role
# chunk's "content":"" is not one), a Responses output_text delta.
CONTENT: dict[Api, re.Pattern[bytes]] = {
    "chat": re.compile(rb'"content":"[^"]'),
    "responses": re.compile(rb"response\.output_text\.delta"),
}
TERMINAL: dict[Api, bytes] = {"chat": b"data: [DONE]", "responses": b"response.completed"}
# Paced, the fake waits before every event but the first: before the first text delta once in
# chat (after the role chunk), four times in Responses (created, in_progress, item, part).
PACED_BEFORE_CONTENT: dict[Api, int] = {"chat": 1, "responses": 4}

CONFIG = """\
[endpoints.both]
kind = "compatible"
base_url = "{both}/v1"
apis = ["chat", "responses"]

[endpoints.chat-only]
kind = "compatible"
base_url = "{chat}/v1"
apis = ["chat"]

[endpoints.responses-only]
kind = "compatible"
base_url = "{responses}/v1"
apis = ["responses"]

[endpoints.both-again]
kind = "compatible"
base_url = "{both}/v1"
apis = ["chat", "responses"]

[endpoints.both-trusted]
kind = "compatible"
base_url = "{both}/v1"
apis = ["chat", "responses"]
conformant = ["chat", "responses"]
state = "native"

[endpoints.both-native]
kind = "compatible"
base_url = "{both}/v1"
apis = ["chat", "responses"]
state = "native"

[[routes]]
models = ["bench-pass"]
endpoints = ["both"]

[[routes]]
models = ["bench-native"]
endpoints = ["both-native"]

[[routes]]
models = ["bench-trusted"]
endpoints = ["both-trusted"]

[[routes]]
models = ["bench-failover"]
endpoints = ["both", "both-again"]

[[routes]]
models = ["bench-over-chat"]
endpoints = ["chat-only"]

[[routes]]
models = ["bench-over-responses"]
endpoints = ["responses-only"]
"""

PROFILE_DIR: Path | None = None
"""``--profile DIR``: each llmitm process runs under cProfile and writes DIR/<name>.prof."""

TARGET_RATIO = 1.3
CONSOLE_TARGET = 1.05
RECORD_TARGET = 1.10
TARGET_TTFT_MS = 2.0


# --- setups and their measurements -------------------------------------------------------------


@dataclass
class Setup:
    key: str
    label: str
    api: Api
    via: Literal["direct", "mitmdump", "llmitm", "llmitm-twin"]
    model: str
    endpoint: str | None = None
    """The ``x-llmitm-endpoint`` llmitm must answer with (None: the header must be absent)."""
    upstream: Api | None = None
    """The API the fake upstream speaks (None: the client's)."""
    port: int = 0
    pid: int | None = None
    walls: list[float] = field(default_factory=list)
    ttfts: list[float] = field(default_factory=list)
    cpu: float = 0.0
    conc_totals: list[float] = field(default_factory=list)
    conc_streams: list[float] = field(default_factory=list)
    conc_ttfts: list[float] = field(default_factory=list)
    conc_cpu: float = 0.0
    delay_ms: int = 0
    _requests: dict[tuple[int, bool], bytes] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.upstream = self.upstream or self.api

    @property
    def paced_ttft_s(self) -> float:
        """The fake's deliberate delay before the first text delta of a paced stream."""
        assert self.upstream is not None
        return PACED_BEFORE_CONTENT[self.upstream] * self.delay_ms / 1000

    def request(self, events: int, paced: bool) -> bytes:
        cached = self._requests.get((events, paced))
        if cached is not None:
            return cached
        if self.api == "chat":
            body = {"model": self.model, "messages": [{"role": "user", "content": "hi"}]}
        else:
            body = {"model": self.model, "input": "hi"}
        content = orjson.dumps({**body, "stream": True})
        pace = f";event_delay_ms={self.delay_ms}" if paced and self.delay_ms else ""
        head = (
            f"POST {PATHS[self.api]} HTTP/1.1\r\n"
            f"host: 127.0.0.1:{self.port}\r\n"
            "authorization: Bearer sk-bench\r\n"
            "content-type: application/json\r\n"
            "accept: text/event-stream\r\n"
            f"x-fake-scenario: text;events={events}{pace}\r\n"
            f"content-length: {len(content)}\r\n\r\n"
        )
        self._requests[events, paced] = request = head.encode() + content
        return request


def twin_of(setup: Setup, what: str) -> Setup:
    """``setup`` through a second llmitm process that differs by ``what`` (its console mode
    and/or ``--twin-set`` options)."""
    return Setup(
        f"{setup.key}+twin",
        f"{setup.label} +{what}",
        setup.api,
        "llmitm-twin",
        setup.model,
        setup.endpoint,
        setup.upstream,
    )


def all_setups() -> list[Setup]:
    return [
        Setup("direct-chat", "1 direct · chat", "chat", "direct", "bench-pass"),
        Setup("direct-responses", "1 direct · responses", "responses", "direct", "bench-pass"),
        Setup("mitmdump-chat", "2 mitmdump · chat", "chat", "mitmdump", "bench-pass"),
        Setup(
            "mitmdump-responses", "2 mitmdump · responses", "responses", "mitmdump", "bench-pass"
        ),
        Setup("llmitm-chat", "3 llmitm pass · chat", "chat", "llmitm", "bench-pass", "both"),
        Setup(
            "llmitm-responses",
            "3 llmitm pass · responses",
            "responses",
            "llmitm",
            "bench-pass",
            "both",
        ),
        # The same endpoint trusted (conformant = [...]): its streams relayed by the guard, as
        # every compatible endpoint's were before they were normalised by default.
        Setup(
            "llmitm-trusted-chat",
            "3t llmitm pass trusted · chat",
            "chat",
            "llmitm",
            "bench-trusted",
            "both-trusted",
        ),
        Setup(
            "llmitm-trusted-responses",
            "3t llmitm pass trusted · responses",
            "responses",
            "llmitm",
            "bench-trusted",
            "both-trusted",
        ),
        # Normalised, but its Responses state left to the server: what emulated state costs.
        Setup(
            "llmitm-native-responses",
            "3n llmitm pass native · responses",
            "responses",
            "llmitm",
            "bench-native",
            "both-native",
        ),
        Setup(
            "llmitm-relay-chat",
            "6 llmitm failover route · chat",
            "chat",
            "llmitm",
            "bench-failover",
            "both",
        ),
        Setup(
            "responses-to-chat",
            "4 llmitm responses→chat",
            "responses",
            "llmitm",
            "bench-over-chat",
            "chat-only",
            "chat",
        ),
        Setup(
            "chat-to-responses",
            "5 llmitm chat→responses",
            "chat",
            "llmitm",
            "bench-over-responses",
            "responses-only",
            "responses",
        ),
    ]


SCHEDSTAT = os.path.exists("/proc/self/schedstat")


def cpu_ticks(pid: int) -> float:
    """user + system CPU of a process and all its threads, from /proc/<pid>/stat (in ticks of
    1/CLK_TCK s: too coarse for one stream, used as the cross-check of the whole run)."""
    with open(f"/proc/{pid}/stat", "rb") as stat:
        fields = stat.read().rpartition(b")")[2].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime (fields 14, 15)


def cpu_seconds(pid: int | None) -> float:
    """CPU time of a process: the sum over its threads of /proc/<pid>/task/*/schedstat's
    nanoseconds on a CPU (the kernel's exact runtime), or /proc/<pid>/stat's ticks without it."""
    if pid is None:
        return 0.0
    if not SCHEDSTAT:
        return cpu_ticks(pid)
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat", "rb") as schedstat:
                total += int(schedstat.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread ended between listdir and open
    return total / 1e9


# --- processes --------------------------------------------------------------------------------


class Processes:
    """Child processes with their logs in ``tmp``; ``stop_all`` ends every one of them."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.running: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(
        self, name: str, argv: list[str], env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        with (self.tmp / f"{name}.log").open("wb") as log:
            process = subprocess.Popen(
                argv,
                env={**os.environ, **env} if env else None,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=ROOT,
                start_new_session=True,  # Ctrl-C reaches only us; we stop them in order
            )
        self.running.append((name, process))
        return process

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")

    def wait_ready(self, name: str, process: subprocess.Popen[bytes], ready) -> object:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            result = ready()
            if result is not None:
                return result
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited with {process.returncode}:\n{self.log(name)}")
            time.sleep(0.05)
        raise TimeoutError(f"{name} not ready after {READY_TIMEOUT_S:.0f} s:\n{self.log(name)}")

    def stop_all(self) -> None:
        for _name, process in self.running:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for _name, process in self.running:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.running.clear()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def accepting(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def start_fake(procs: Processes, apis: str) -> int:
    name = f"fake-{apis.replace(',', '-')}"
    port_file = procs.tmp / f"{name}.port"
    argv = [*FAKE_UPSTREAM, "--port", "0", "--port-file", str(port_file)]
    process = procs.start(name, [*argv, "--apis", apis])

    def ready() -> int | None:
        text = port_file.read_text().strip() if port_file.exists() else ""
        return int(text) if text else None

    return procs.wait_ready(name, process, ready)  # type: ignore[return-value]


def start_mitmdump(procs: Processes, upstream: str) -> tuple[int, int]:
    port = free_port()
    process = procs.start(
        "mitmdump",
        [
            str(BIN / "mitmdump"),
            "-s", str(PASSTHROUGH_ADDON),
            "--mode", f"reverse:{upstream}",
            "--listen-host", "127.0.0.1",
            "--listen-port", str(port),
            "--set", "connection_strategy=lazy",
            "--set", f"confdir={procs.tmp / 'confdir-mitmdump'}",
            *QUIET,
        ],
    )  # fmt: skip
    procs.wait_ready("mitmdump", process, lambda: True if accepting(port) else None)
    return port, process.pid


CONSOLE_TERMINAL = {
    # rich draws the live console only on an interactive terminal: these make it treat the
    # log file as one, so the twin setups pay for the full live display.
    "FORCE_COLOR": "1",
    "TTY_INTERACTIVE": "1",
    "TERM": "xterm-256color",
    "COLUMNS": "120",
    "LINES": "40",
}


def start_llmitm(
    procs: Processes,
    upstream: str,
    config: str,
    console: str = "off",
    twin: bool = False,
    extra: Sequence[str] = (),
    code: str | None = None,
    env: dict[str, str] | None = None,
    name: str | None = None,
    run_under: Sequence[str] = (),
) -> tuple[int, int]:
    """``llmitm run`` with ``llmitm_console=console`` (``off`` for the plain llmitm setups:
    the console and other options are measured by the ``+twin`` ones, against these), running
    the llmitm of the checkout ``code`` (default: this one), with ``env`` added to its
    environment; ``name`` tells several such processes' files apart. ``run_under``: a command
    that runs the proxy's Python (a profiler, valgrind), given its argv."""
    name = name or ("llmitm-twin" if twin else "llmitm")
    config_path = procs.tmp / f"{name}.toml"
    if code:
        # An older checkout knows neither the ``conformant`` nor the ``state`` key, and never
        # normalised nor kept a Responses server's state: the trusted endpoint is a plain one
        # there, relayed by the same guard.
        kept = [
            line for line in config.splitlines() if not line.startswith(("conformant", "state"))
        ]
        config = "\n".join(kept)
    config_path.write_text(config)
    listenfile = procs.tmp / f"{name}-listen.json"
    process = procs.start(
        name,
        [
            *run_under,
            *(
                [str(BIN / "python"), "-m", "cProfile", "-o", str(PROFILE_DIR / f"{name}.prof")]
                if PROFILE_DIR
                else [str(BIN / "python")] if run_under else []
            ),
            str(BIN / "llmitm"), "run",
            "--config", str(config_path),
            "--mode", f"reverse:{upstream}",
            "--listen-port", "0",
            "--set", f"confdir={procs.tmp / 'confdir-llmitm'}",
            "--set", f"llmitm_listenfile={listenfile}",
            "--set", f"llmitm_console={console}",
            # Its own store, never the user's (recording is on by default), unless ``extra``
            # names one (mitmdump refuses an option set twice).
            *(
                []
                if any(item.startswith("llmitm_store=") for item in extra)
                else ["--set", f"llmitm_store={procs.tmp / f'{name}.db'}"]
            ),
            *[arg for item in extra for arg in ("--set", item)],
            *QUIET,
        ],
        env={
            **(CONSOLE_TERMINAL if console == "live" else {}),
            **({"PYTHONPATH": str(Path(code).resolve() / "addon")} if code else {}),
            **(env or {}),
        }
        or None,
    )  # fmt: skip
    listening = procs.wait_ready(
        name,
        process,
        lambda: orjson.loads(listenfile.read_bytes()) if listenfile.exists() else None,
    )
    assert isinstance(listening, dict)
    (port,) = (
        int(server["addresses"][0][1])
        for server in listening["servers"]
        if server["type"] == "reverse"
    )
    if listening["pid"] != process.pid:
        raise RuntimeError(f"{name} runs as pid {listening['pid']}, not {process.pid}")
    return port, process.pid


def overridden(base: Sequence[str], override: Sequence[str]) -> list[str]:
    """``OPTION=VALUE`` items of ``base`` with those of ``override`` in their place (mitmdump
    refuses an option given twice)."""
    merged = {item.partition("=")[0]: item for item in base}
    merged.update({item.partition("=")[0]: item for item in override})
    return list(merged.values())


def start_stack(
    procs: Processes,
    setups: list[Setup],
    console: str = "off",
    extra: Sequence[str] = (),
    twin_extra: Sequence[str] = (),
    twin_code: str | None = None,
) -> None:
    vias = {setup.via for setup in setups}
    both = f"http://127.0.0.1:{start_fake(procs, 'chat,responses')}"
    where: dict[str, tuple[int, int | None]] = {"direct": (int(both.rpartition(":")[2]), None)}
    if "mitmdump" in vias:
        where["mitmdump"] = start_mitmdump(procs, both)
    if vias & {"llmitm", "llmitm-twin"}:
        chat = f"http://127.0.0.1:{start_fake(procs, 'chat')}"
        responses = f"http://127.0.0.1:{start_fake(procs, 'responses')}"
        config = CONFIG.format(both=both, chat=chat, responses=responses)
        if "llmitm" in vias:
            where["llmitm"] = start_llmitm(procs, both, config, extra=extra)
        if "llmitm-twin" in vias:
            where["llmitm-twin"] = start_llmitm(
                procs,
                both,
                config,
                console,
                twin=True,
                extra=overridden(extra, twin_extra),
                code=twin_code,
            )
    for setup in setups:
        setup.port, setup.pid = where[setup.via]


# --- the client -------------------------------------------------------------------------------


@dataclass(slots=True)
class Sample:
    status: int
    headers: dict[str, str]
    ttft: float | None
    total: float
    events: int
    ended: bool
    """The client API's terminal event arrived."""
    tail: bytes


class SSEStream(asyncio.Protocol):
    """One request, its SSE response read to the end with just enough parsing: the head, the
    chunked framing, the first content-bearing event, the event count, the terminal event."""

    TAIL = 64

    def __init__(
        self, request: bytes, content: re.Pattern[bytes], terminal: bytes, done: asyncio.Future
    ) -> None:
        self.request = request
        self.content = content
        self.terminal = terminal
        self.ended = False
        self.done = done
        self.transport: asyncio.Transport | None = None
        self.start = 0.0
        self.ttft: float | None = None
        self.status = 0
        self.headers: dict[str, str] | None = None
        self.framing = "close"
        self.remaining = 0  # bytes left in the current chunk (or the content-length body)
        self.need_crlf = False
        self.buffer = bytearray()
        self.events = 0
        self.tail = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.start = time.perf_counter()
        transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        if self.done.done():
            return
        try:
            self._receive(data)
        except Exception as exc:
            self._fail(exc)

    def eof_received(self) -> bool:
        if self.framing == "close" and self.headers is not None:
            self._finish()
        else:
            self._fail(ConnectionError("the connection closed before the end of the stream"))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(exc or ConnectionError("the connection was lost"))

    def _receive(self, data: bytes) -> None:
        if self.headers is None:
            self.buffer += data
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            self._head(bytes(self.buffer[:end]))
            data = bytes(self.buffer[end + 4 :])
            self.buffer.clear()
        if self.framing != "chunked":
            self._payload(data)
            if self.framing == "length":
                self.remaining -= len(data)
                if self.remaining <= 0:
                    self._finish()
            return
        buffer = self.buffer
        buffer += data
        pos, size = 0, len(buffer)
        while pos < size:
            if self.remaining:
                take = min(self.remaining, size - pos)
                self._payload(bytes(buffer[pos : pos + take]))
                pos += take
                self.remaining -= take
                self.need_crlf = not self.remaining
            elif self.need_crlf:
                if size - pos < 2:
                    break
                pos += 2
                self.need_crlf = False
            else:
                eol = buffer.find(b"\r\n", pos)
                if eol < 0:
                    break
                length = int(bytes(buffer[pos:eol]).split(b";", 1)[0], 16)
                pos = eol + 2
                if not length:
                    self._finish()
                    return
                self.remaining = length
        del buffer[:pos]

    def _head(self, head: bytes) -> None:
        status_line, *lines = head.decode("utf-8", "replace").split("\r\n")
        self.status = int(status_line.split()[1])
        headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        self.headers = headers
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self.framing = "chunked"
        elif "content-length" in headers:
            self.framing = "length"
            self.remaining = int(headers["content-length"])

    def _payload(self, piece: bytes) -> None:
        tail = self.tail + piece
        if self.ttft is None and self.content.search(tail):
            self.ttft = time.perf_counter() - self.start
        self.events += piece.count(b"\n\n") + (self.tail[-1:] == b"\n" and piece[:1] == b"\n")
        if not self.ended and self.terminal in tail:
            self.ended = True
        self.tail = tail[-self.TAIL :] if self.status == 200 else tail  # errors: keep it all

    def _finish(self) -> None:
        if self.done.done():
            return
        total = time.perf_counter() - self.start
        assert self.headers is not None
        sample = Sample(
            self.status, self.headers, self.ttft, total, self.events, self.ended, self.tail
        )
        self.done.set_result(sample)
        if self.transport is not None:
            self.transport.close()

    def _fail(self, exc: BaseException) -> None:
        if not self.done.done():
            self.done.set_exception(exc)
        if self.transport is not None:
            self.transport.close()


async def stream(setup: Setup, events: int, paced: bool = True) -> Sample:
    """One streamed request of ``setup`` for ``events`` text deltas, checked."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Sample] = loop.create_future()
    request = setup.request(events, paced)
    transport, _ = await loop.create_connection(
        lambda: SSEStream(request, CONTENT[setup.api], TERMINAL[setup.api], done),
        "127.0.0.1",
        setup.port,
    )
    try:
        sample = await asyncio.wait_for(done, STREAM_TIMEOUT_S)
    finally:
        transport.close()
    check(setup, sample, events)
    return sample


def check(setup: Setup, sample: Sample, events: int) -> None:
    """The stream is a complete, successful answer in the client's API, routed as planned."""
    problem = None
    if sample.status != 200:
        problem = f"HTTP {sample.status}"
    elif sample.ttft is None:
        problem = "no content-bearing event"
    elif not sample.ended:
        problem = f"no {TERMINAL[setup.api].decode()} at the end"
    elif sample.events < events:
        problem = f"only {sample.events} events"
    elif sample.headers.get("x-llmitm-endpoint") != setup.endpoint:
        problem = f"x-llmitm-endpoint {sample.headers.get('x-llmitm-endpoint')!r}"
    if problem:
        body = sample.tail[-2000:].decode("utf-8", "replace")
        raise RuntimeError(f"{setup.label}: {problem}; headers {sample.headers}; body …{body}")


# --- the benchmark ----------------------------------------------------------------------------


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def busy_cpu_seconds() -> float:
    """CPU time all CPUs spent busy since boot (/proc/stat: all but idle and iowait)."""
    with open("/proc/stat", "rb") as stat:
        fields = [int(value) for value in stat.readline().split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


async def measure(setups: list[Setup], args: argparse.Namespace, children: list[int]) -> list[str]:
    """Fill in the setups' measurements; return notes on the run's CPU: the proxies' totals
    by both sources, and what processes other than this benchmark's used meanwhile."""
    proxies = {setup.pid: setup.via for setup in setups if setup.pid is not None}
    start_cpu = {pid: (cpu_seconds(pid), cpu_ticks(pid)) for pid in proxies}
    start_own = time.process_time() + sum(cpu_seconds(pid) for pid in children)
    start_busy, start_wall = busy_cpu_seconds(), time.monotonic()
    await _measure(setups, args)
    own = time.process_time() + sum(cpu_seconds(pid) for pid in children) - start_own
    foreign = busy_cpu_seconds() - start_busy - own
    wall = time.monotonic() - start_wall
    checks = []
    for pid, name in proxies.items():
        exact, ticks = cpu_seconds(pid) - start_cpu[pid][0], cpu_ticks(pid) - start_cpu[pid][1]
        checks.append(f"{name} {exact:.2f} s vs {ticks:.2f} s")
    source = "schedstat" if SCHEDSTAT else "stat ticks"
    return [
        f"Proxy CPU over the whole run, {source} vs stat ticks: " + "; ".join(checks),
        f"Run: {wall:.0f} s; this benchmark's processes used {own / wall:.2f} CPUs, all other "
        f"processes {max(foreign, 0) / wall:.2f} of {os.cpu_count()} (well above 0: noisy figures)",
    ]


def in_turn(setups: list[Setup], rnd: int) -> list[Setup]:
    """The setups in order on even rounds and in reverse on odd ones, so no setup always runs
    right after another: a twin identical to its setup, always run second, measured ~2.5%
    cheaper (and one that differs, flattered as much)."""
    return setups if rnd % 2 == 0 else setups[::-1]


async def _measure(setups: list[Setup], args: argparse.Namespace) -> None:
    progress(f"warm-up: {args.warmup} stream(s) per setup")
    for _ in range(args.warmup):
        for setup in setups:
            await stream(setup, args.events, paced=False)
    for run in range(args.runs):
        progress(f"single streams: round {run + 1}/{args.runs}")
        for setup in in_turn(setups, run):
            before = cpu_seconds(setup.pid)
            sample = await stream(setup, args.events)
            await asyncio.sleep(SETTLE_S)
            setup.cpu += cpu_seconds(setup.pid) - before
            setup.walls.append(sample.total)
    progress(f"time to first token: {args.ttft_runs} short stream(s) per setup")
    # Back to back, no pause: after ~50 ms idle a CPU can wake up several ms late (+3 ms on
    # mitmdump's 3.5 ms on a 2-CPU VM), which is no proxy's doing; the long runs above pause
    # only to settle their CPU reading.
    for _ in range(args.ttft_runs):
        for setup in setups:
            setup.ttfts.append((await stream(setup, TTFT_EVENTS, paced=False)).ttft or 0.0)
    for rnd in range(args.concurrent_rounds):
        for setup in in_turn(setups, rnd):
            progress(
                f"{args.concurrency} concurrent streams, round {rnd + 1}/"
                f"{args.concurrent_rounds}: {setup.label}"
            )
            before = cpu_seconds(setup.pid)
            start = time.perf_counter()
            samples = await asyncio.gather(
                *(stream(setup, args.events) for _ in range(args.concurrency))
            )
            setup.conc_totals.append(time.perf_counter() - start)
            await asyncio.sleep(SETTLE_S)
            setup.conc_cpu += cpu_seconds(setup.pid) - before
            setup.conc_streams += [sample.total for sample in samples]
            setup.conc_ttfts += [(sample.ttft or 0.0) - setup.paced_ttft_s for sample in samples]


# --- the report -------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100
    low = math.floor(k)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (k - low)


@dataclass
class Figures:
    wall_ms: float
    cpu_ms: float | None  # per 1000 events
    ttft_ms: float
    conc_total_s: float
    conc_p50_s: float
    conc_p99_s: float
    conc_cpu_ms: float | None
    conc_ttft_ms: float


def figures(setup: Setup, args: argparse.Namespace) -> Figures:
    proxied = setup.pid is not None
    single_events = args.runs * args.events
    conc_events = args.concurrent_rounds * args.concurrency * args.events
    return Figures(
        wall_ms=statistics.median(setup.walls) * 1000,
        cpu_ms=setup.cpu / single_events * 1e6 if proxied else None,
        ttft_ms=statistics.median(setup.ttfts) * 1000,
        conc_total_s=statistics.median(setup.conc_totals),
        conc_p50_s=percentile(setup.conc_streams, 50),
        conc_p99_s=percentile(setup.conc_streams, 99),
        conc_cpu_ms=setup.conc_cpu / conc_events * 1e6 if proxied else None,
        conc_ttft_ms=statistics.median(setup.conc_ttfts) * 1000,
    )


def num(value: float | None, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def ratio(value: float | None, base: float | None) -> str:
    if value is None or base is None or base <= 0:
        return "–"
    return f"{value / base:.2f}×"


def signed(value: float | None) -> str:
    return "–" if value is None else f"{value:+.2f}"


def report(setups: list[Setup], args: argparse.Namespace) -> list[str]:
    """Print both tables; return the target verdicts of the llmitm setups."""
    figs = {setup.key: figures(setup, args) for setup in setups}
    mitm = {api: figs.get(f"mitmdump-{api}") for api in ("chat", "responses")}
    direct = {api: figs.get(f"direct-{api}") for api in ("chat", "responses")}
    width = max(len(setup.label) for setup in setups) + 2

    def added(value: float, base: Figures | None, attr: str) -> float | None:
        return None if base is None else value - getattr(base, attr)

    print()
    print(
        f"Single stream: {args.events} events, median of {args.runs} runs; TTFT: median of "
        f"{args.ttft_runs} {TTFT_EVENTS}-event streams"
        + (
            f"; measured streams paced at {args.event_delay_ms} ms/event"
            if args.event_delay_ms
            else ""
        )
    )
    head = ("setup", "wall ms", "×mitm", "CPU ms/1k ev", "×mitm", "TTFT ms", "+direct", "×mitm",
            "Δmitm ms")  # fmt: skip
    line = f"{{:{width}}} {{:>9}} {{:>7}} {{:>13}} {{:>7}} {{:>8}} {{:>8}} {{:>7}} {{:>9}}"
    print(line.format(*head))
    for setup in setups:
        f, m, d = figs[setup.key], mitm[setup.api], direct[setup.api]
        plus = added(f.ttft_ms, d, "ttft_ms")
        mitm_plus = None if m is None else added(m.ttft_ms, d, "ttft_ms")
        print(
            line.format(
                setup.label,
                num(f.wall_ms, ".1f"),
                ratio(f.wall_ms, m and m.wall_ms),
                num(f.cpu_ms, ".1f"),
                ratio(f.cpu_ms, m and m.cpu_ms),
                num(f.ttft_ms, ".2f"),
                signed(plus),
                ratio(plus, mitm_plus),
                signed(added(f.ttft_ms, m, "ttft_ms")),
            )
        )

    print()
    print(
        f"{args.concurrency} concurrent streams of {args.events} events"
        + (f", median of {args.concurrent_rounds} rounds" if args.concurrent_rounds > 1 else "")
        + "; p50/p99 and TTFT p50 over all streams"
    )
    head = ("setup", "total s", "×mitm", "p50 s", "×mitm", "p99 s", "×mitm", "CPU ms/1k ev",
            "×mitm", "TTFT p50", "+direct", "Δmitm ms")  # fmt: skip
    line = (
        f"{{:{width}}} {{:>8}} {{:>7}} {{:>7}} {{:>7}} {{:>7}} {{:>7}} {{:>13}} {{:>7}} "
        "{:>9} {:>8} {:>9}"
    )
    print(line.format(*head))
    for setup in setups:
        f, m, d = figs[setup.key], mitm[setup.api], direct[setup.api]
        print(
            line.format(
                setup.label,
                num(f.conc_total_s, ".2f"),
                ratio(f.conc_total_s, m and m.conc_total_s),
                num(f.conc_p50_s, ".2f"),
                ratio(f.conc_p50_s, m and m.conc_p50_s),
                num(f.conc_p99_s, ".2f"),
                ratio(f.conc_p99_s, m and m.conc_p99_s),
                num(f.conc_cpu_ms, ".1f"),
                ratio(f.conc_cpu_ms, m and m.conc_cpu_ms),
                num(f.conc_ttft_ms, ".1f"),
                signed(added(f.conc_ttft_ms, d, "conc_ttft_ms")),
                signed(added(f.conc_ttft_ms, m, "conc_ttft_ms")),
            )
        )

    verdicts = []
    for setup in setups:
        m = mitm[setup.api]
        if setup.via != "llmitm" or m is None:
            continue
        f = figs[setup.key]
        single = [
            ("wall", f.wall_ms / m.wall_ms, True),
            ("CPU/ev", (f.cpu_ms or 0) / (m.cpu_ms or 1e-9), True),
            ("TTFT", f.ttft_ms - m.ttft_ms, False),
        ]
        concurrent = [
            ("total", f.conc_total_s / m.conc_total_s, True),
            ("p50", f.conc_p50_s / m.conc_p50_s, True),
            ("p99", f.conc_p99_s / m.conc_p99_s, True),
            ("CPU/ev", (f.conc_cpu_ms or 0) / (m.conc_cpu_ms or 1e-9), True),
            ("TTFT", f.conc_ttft_ms - m.conc_ttft_ms, False),
        ]
        verdicts.append(f"  {setup.label}")
        for title, checks in (("1 stream", single), (f"{args.concurrency} streams", concurrent)):
            parts = []
            for name, value, is_ratio in checks:
                limit = TARGET_RATIO if is_ratio else TARGET_TTFT_MS
                shown = f"{value:.2f}×" if is_ratio else f"{value:+.2f} ms"
                parts.append(f"{name} {shown} {'ok' if value <= limit else 'MISS'}")
            verdicts.append(f"    {title}: " + ", ".join(parts))
    return verdicts


def twin_report(setups: list[Setup], args: argparse.Namespace) -> list[str]:
    """What the twin's difference costs: each +twin setup's proxy CPU over the plain one."""
    by_key = {setup.key: setup for setup in setups}
    target = CONSOLE_TARGET if args.console else RECORD_TARGET
    lines = [
        f"Overhead of {twin_label(args)}: proxy CPU of the twin over the same setup without it "
        f"(target ≤ {target:.2f}× at {args.concurrency} streams)"
    ]
    for setup in setups:
        twin = by_key.get(setup.key.removesuffix("+twin"))
        if setup.via != "llmitm-twin" or twin is None:
            continue
        on, off = figures(setup, args), figures(twin, args)
        single = (on.cpu_ms or 0) / (off.cpu_ms or 1e-9)
        concurrent = (on.conc_cpu_ms or 0) / (off.conc_cpu_ms or 1e-9)
        verdict = "ok" if concurrent <= target else "MISS"
        lines.append(
            f"  {twin.label}: 1 stream {single:.3f}×, {args.concurrency} streams "
            f"{concurrent:.3f}× {verdict} ({off.conc_cpu_ms:.1f} → {on.conc_cpu_ms:.1f} "
            "CPU ms/1k ev)"
        )
    return lines


def twin_label(args: argparse.Namespace) -> str:
    parts = [f"console {args.console}"] if args.console else []
    if args.twin_code:
        parts.append(f"the code of {args.twin_code}")
    return ", ".join(parts + args.twin_set)


LEGEND = f"""\
How each figure is measured:
  wall ms       median time to relay one whole stream: from writing the request (on a fresh
                connection, already open) to the chunked body's terminating 0-chunk
  CPU ms/1k ev  CPU time of the proxy process (all threads: /proc/<pid>/task/*/schedstat,
                the kernel's ns runtime; /proc/<pid>/stat ticks without it), read before and
                50 ms after each measured stream, summed, per 1000 text-delta events; the
                client runs in the bench process and is never counted; direct has no proxy
  TTFT ms       median time from writing the request to the first content-bearing event (a
                chat delta with content, a Responses output_text.delta), over short streams
                run back to back, setups interleaved
  +direct       TTFT added over direct to the same fake with the same API
  ×mitm         the figure divided by plain mitmdump's for the same client API (for +direct:
                llmitm's added TTFT over mitmdump's added TTFT)
  Δmitm ms      TTFT minus plain mitmdump's for the same client API
  total s       wall time of all concurrent streams, started at once on separate connections
  p50/p99 s     percentiles of the concurrent streams' own wall times
  TTFT p50      median TTFT of the concurrent streams; unpaced streams saturate the proxy, so
                it measures queueing (see --event-delay-ms for paced, LLM-like streams)
  --event-delay-ms M  paces the measured single and concurrent streams (not the warm-up and
                TTFT ones) at M ms per event, as a model would; the concurrent TTFT then has
                the fake's deliberate delay before its first text delta taken off (M ms for a
                chat upstream, 4·M for Responses)
Targets: llmitm translating ≤ {TARGET_RATIO}× plain mitmdump's proxy CPU per event and wall time,
≤ {TARGET_TTFT_MS:g} ms added median TTFT beyond mitmdump, also at 64 concurrent streams."""


def describe_llmitm() -> str:
    spec = importlib.util.find_spec("llmitm")
    origin = Path(spec.origin).parent if spec and spec.origin else "?"
    try:
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--", "addon"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return f"llmitm from {origin}"
    if not str(origin).startswith(str(ROOT)):
        return f"llmitm from {origin}"
    state = " (addon/ has uncommitted changes)" if dirty else ""
    return f"llmitm from {origin}; repo at {head}{state}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    keys = [setup.key for setup in all_setups()]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2000, help="text deltas per stream")
    parser.add_argument("--runs", type=int, default=7, help="measured single streams per setup")
    parser.add_argument("--concurrency", type=int, default=64, help="concurrent streams")
    parser.add_argument("--concurrent-rounds", type=int, default=1)
    parser.add_argument(
        "--event-delay-ms",
        type=int,
        default=0,
        help="pace every stream: the fake waits this long between events (0: full speed)",
    )
    parser.add_argument("--warmup", type=int, default=2, help="unmeasured streams per setup")
    parser.add_argument(
        "--ttft-runs", type=int, default=30, help=f"{TTFT_EVENTS}-event streams for TTFT"
    )
    parser.add_argument(
        "--setups", default=",".join(keys), help="comma-separated subset of: " + ", ".join(keys)
    )
    parser.add_argument(
        "--llmitm-set",
        action="append",
        default=[],
        metavar="OPTION=VALUE",
        help="a --set for llmitm (repeatable), e.g. llmitm_record=off",
    )
    parser.add_argument(
        "--profile",
        metavar="DIR",
        help="run each llmitm process under cProfile, writing DIR/llmitm.prof and "
        "DIR/llmitm-twin.prof at the end (for finding costs: the figures are then cProfile's)",
    )
    parser.add_argument(
        "--console",
        choices=("live", "lines", "off"),
        help="also measure each llmitm setup through a second llmitm running its console in "
        "this mode (live: drawn as on a terminal), against the plain one (console off); "
        "off measures two identical processes: the noise floor of the comparison",
    )
    parser.add_argument(
        "--twin-set",
        action="append",
        default=[],
        metavar="OPTION=VALUE",
        help="also measure each llmitm setup through a second llmitm with this --set on top of "
        "--llmitm-set (repeatable), against the plain one: e.g. --llmitm-set llmitm_record=off "
        "--twin-set llmitm_record=record measures what recording costs",
    )
    parser.add_argument(
        "--twin-code",
        metavar="CHECKOUT",
        help="also measure each llmitm setup through a second llmitm running the code of this "
        "checkout (e.g. a worktree of the previous commit), against the plain one",
    )
    args = parser.parse_args(argv)
    args.selected = [part.strip() for part in args.setups.split(",") if part.strip()]
    unknown = set(args.selected) - set(keys)
    if unknown or not args.selected:
        parser.error(f"unknown setups {sorted(unknown)}; known: {', '.join(keys)}")
    if min(args.events, args.runs, args.concurrency, args.concurrent_rounds, args.ttft_runs) < 1:
        parser.error("--events, --runs, --concurrency, --*-rounds and --ttft-runs must be >= 1")
    if args.warmup < 0 or args.event_delay_ms < 0:
        parser.error("--warmup and --event-delay-ms must be >= 0")
    return args


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.profile:
        global PROFILE_DIR
        PROFILE_DIR = Path(args.profile).resolve()
        PROFILE_DIR.mkdir(parents=True, exist_ok=True)
    setups = []
    for setup in all_setups():
        if setup.key in args.selected:
            setups.append(setup)
            if (args.console or args.twin_set or args.twin_code) and setup.via == "llmitm":
                setups.append(twin_of(setup, twin_label(args)))
    for setup in setups:
        setup.delay_ms = args.event_delay_ms
    signal.signal(signal.SIGTERM, _interrupt)
    tmp = Path(tempfile.mkdtemp(prefix="llmitm-bench-proxy-"))
    procs = Processes(tmp)
    try:
        progress(f"starting processes (logs in {tmp})")
        start_stack(
            procs, setups, args.console or "off", args.llmitm_set, args.twin_set, args.twin_code
        )
        children = [process.pid for _name, process in procs.running]
        notes = asyncio.run(measure(setups, args, children))
    except KeyboardInterrupt:
        progress("interrupted")
        return 130
    finally:
        with contextlib.suppress(KeyboardInterrupt):
            procs.stop_all()
    print(
        f"{platform.python_implementation()} {platform.python_version()}, "
        f"{os.cpu_count()} CPUs; {describe_llmitm()}"
    )
    verdicts = report(setups, args)
    print()
    print(LEGEND)
    if verdicts:
        print("Against the targets:")
        print("\n".join(verdicts))
    if args.console or args.twin_set or args.twin_code:
        print("\n".join(twin_report(setups, args)))
    print("\n".join(notes))
    print(f"\nProcess logs: {tmp}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
