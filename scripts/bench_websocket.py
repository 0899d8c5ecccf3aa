"""A Responses stream over llmitm's WebSocket against the same stream over HTTPS SSE.

    python scripts/bench_websocket.py [--events N] [--runs R]

One llmitm process (reverse listener, a route to the chat-only fake upstream, so every event
is translated chat → Responses) serves both doors. Each run times, client side, one whole
``text;events=N`` Responses stream: once through ``client.responses.connect()`` (the socket:
llmitm's socket job sends the call back through the proxy and re-frames each SSE event as a
WebSocket message) and once through ``client.responses.create(stream=True)``. The two alternate
within each run; medians of R runs and the median of the per-run ratios (socket / SSE) are
printed, with the proxy's CPU seconds over all runs of each kind (measured from its process).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import openai
import orjson

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
CONFIG = """
[endpoints.chat-only]
kind = "compatible"
base_url = "http://127.0.0.1:{port}/v1"
apis = ["chat"]

[[routes]]
models = ["*"]
endpoints = ["chat-only"]
"""


def wait_file(path: Path) -> bytes:
    for _ in range(600):
        if path.exists() and path.stat().st_size:
            return path.read_bytes()
        time.sleep(0.05)
    raise TimeoutError(path)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args()
    model = f"text;events={args.events}"
    with tempfile.TemporaryDirectory(prefix="bench-ws-") as scratch:
        tmp = Path(scratch)
        fake = subprocess.Popen(
            [sys.executable, "-m", "llmitm.testing.fake_upstream", "--port", "0",
             "--port-file", str(tmp / "port"), "--apis", "chat"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        (tmp / "llmitm.toml").write_text(CONFIG.format(port=int(wait_file(tmp / "port"))))
        proxy = subprocess.Popen(
            [str(BIN / "llmitm"), "run", "--config", str(tmp / "llmitm.toml"),
             "--mode", "reverse:https://api.openai.com", "--listen-port", "0",
             "--set", f"confdir={tmp / 'confdir'}", "--set", f"llmitm_store={tmp / 'db'}",
             "--set", "llmitm_record=off", "--set", f"llmitm_listenfile={tmp / 'listen.json'}",
             "--set", "termlog_verbosity=warn", "--set", "flow_detail=0"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            listening = orjson.loads(wait_file(tmp / "listen.json"))
            port = listening["servers"][0]["addresses"][0][1]
            client = openai.OpenAI(
                base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-bench", max_retries=0
            )
            run(client, model, args.runs, proxy.pid)
        finally:
            proxy.terminate()
            fake.terminate()
            proxy.wait(10)
            fake.wait(10)


def run(client: openai.OpenAI, model: str, runs: int, pid: int) -> None:
    socket_times: list[float] = []
    sse_times: list[float] = []
    cpu = {"socket": 0.0, "sse": 0.0}
    with client.responses.connect() as connection:

        def over_socket() -> None:
            connection.response.create(model=model, input="hi", store=False)
            for event in connection:
                if event.type in ("response.completed", "error", "response.failed"):
                    assert event.type == "response.completed", event
                    return

        def over_sse() -> None:
            with client.responses.create(model=model, input="hi", stream=True) as stream:
                for event in stream:
                    if event.type == "response.completed":
                        return
            raise AssertionError("the stream did not complete")

        for warm_up in (over_socket, over_sse):
            warm_up()
        for number in range(runs):
            order = [("socket", over_socket), ("sse", over_sse)]
            for kind, call in order if number % 2 == 0 else reversed(order):
                before_cpu, started = cpu_seconds(pid), time.perf_counter()
                call()
                elapsed = time.perf_counter() - started
                cpu[kind] += cpu_seconds(pid) - before_cpu
                (socket_times if kind == "socket" else sse_times).append(elapsed)
    ratios = [a / b for a, b in zip(socket_times, sse_times, strict=True)]
    print(f"{model}, {runs} runs each (median wall, client side)")
    print(f"  WebSocket : {statistics.median(socket_times) * 1000:8.1f} ms")
    print(f"  HTTPS SSE : {statistics.median(sse_times) * 1000:8.1f} ms")
    print(f"  ratio socket/SSE (median of runs): {statistics.median(ratios):.3f}")
    print(f"  proxy CPU: socket {cpu['socket']:.2f} s, SSE {cpu['sse']:.2f} s")


if __name__ == "__main__":
    main()
