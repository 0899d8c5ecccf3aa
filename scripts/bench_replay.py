"""Instant replay of a recorded 2000-event stream against plain mitmdump relaying it live.

    python scripts/bench_replay.py [--events N] [--runs R]

Records R ``text;events=N`` chat streams through llmitm from the fake upstream, then times
(wall, client side) the whole stream: llmitm replaying it (``llmitm_record=replay``, instant,
with the recorded answer played from the client leg and from the upstream leg through the
translator's guard) and plain mitmdump (``scripts/bench_passthrough_addon.py``) relaying the
same stream live from the fake. Median of R runs each, interleaved.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx2 as httpx
import orjson

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
BODY = {"model": "bench", "messages": [{"role": "user", "content": "hi"}], "stream": True}
QUIET = ["--set", "termlog_verbosity=warn", "--set", "flow_detail=0"]


def wait_file(path: Path) -> bytes:
    for _ in range(600):
        if path.exists() and path.stat().st_size:
            return path.read_bytes()
        time.sleep(0.05)
    raise TimeoutError(path)


def wait_port(port: int) -> None:
    for _ in range(600):
        try:
            httpx.get(f"http://127.0.0.1:{port}/", timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.05)


def llmitm(tmp: Path, name: str, upstream: str, *sets: str) -> tuple[subprocess.Popen, int]:
    listen = tmp / f"{name}.json"
    argv = [
        str(BIN / "llmitm"),
        "run",
        "--mode",
        f"reverse:{upstream}",
        "--listen-port",
        "0",
        "--set",
        f"confdir={tmp / 'conf'}",
        "--set",
        f"llmitm_listenfile={listen}",
        *QUIET,
    ]
    for item in sets:
        argv += ["--set", item]
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    port = orjson.loads(wait_file(listen))["servers"][0]["addresses"][0][1]
    return process, port


def stream(port: int, scenario: str) -> float:
    with httpx.Client(timeout=60) as client:
        start = time.perf_counter()
        response = client.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            content=orjson.dumps(BODY),
            headers={"x-fake-scenario": scenario, "content-type": "application/json"},
        )
        elapsed = time.perf_counter() - start
    ok = response.status_code == 200 and response.content.endswith(b"data: [DONE]\n\n")
    assert ok, (port, response.status_code, response.content[:300])
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    scenario = f"text;events={args.events}"
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="llmitm-bench-replay-") as scratch:
        tmp = Path(scratch)
        try:
            fake = subprocess.Popen(
                [sys.executable, "-m", "llmitm.testing.fake_upstream", "--port", "0",
                 "--port-file", str(tmp / "fake.port")], stdout=subprocess.DEVNULL)  # fmt: skip
            procs.append(fake)
            upstream = f"http://127.0.0.1:{int(wait_file(tmp / 'fake.port'))}"
            recorder, port = llmitm(tmp, "rec", upstream, f"llmitm_store={tmp / 'r.db'}")
            for _ in range(args.runs):  # each replay uses one recording (FIFO per key)
                stream(port, scenario)
            recorder.terminate()
            recorder.wait()
            setups: dict[str, int] = {}
            for name, source in (("llmitm replay (client leg)", "client"),
                                 ("llmitm replay (upstream leg)", "upstream")):  # fmt: skip
                process, setups[name] = llmitm(
                    tmp, source, "http://127.0.0.1:9", "llmitm_record=replay",
                    f"llmitm_store={tmp / 'r.db'}", f"llmitm_replay_from={source}",
                    "llmitm_match_profile=loose", "llmitm_match_ignore=messages",
                )  # fmt: skip
                procs.append(process)
            mitm_port = 48177
            procs.append(subprocess.Popen(
                [str(BIN / "mitmdump"), "-s", str(ROOT / "scripts" / "bench_passthrough_addon.py"),
                 "--mode", f"reverse:{upstream}", "--listen-host", "127.0.0.1",
                 "--listen-port", str(mitm_port), "--set", "connection_strategy=lazy",
                 "--set", f"confdir={tmp / 'conf2'}", *QUIET],
                stdout=subprocess.DEVNULL))  # fmt: skip
            wait_port(mitm_port)
            setups["mitmdump relaying live"] = mitm_port
            times: dict[str, list[float]] = {name: [] for name in setups}
            stream(mitm_port, scenario)  # warm-up
            for _ in range(args.runs):
                for name, port in setups.items():
                    times[name].append(stream(port, scenario))
        finally:
            for process in procs:
                process.terminate()
                process.wait()
    base = statistics.median(times["mitmdump relaying live"])
    print(f"{args.events}-event chat stream, median of {args.runs} runs (wall, client side):")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"  {name:30s} {median * 1000:8.1f} ms  {median / base:5.2f}× mitmdump")
    return 0


if __name__ == "__main__":
    sys.exit(main())
