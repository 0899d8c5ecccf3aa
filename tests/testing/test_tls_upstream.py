"""The local TLS upstream as the benchmarks run it: a process of its own, started from the
command line, that paces its events as told and writes what it counted when stopped."""

from __future__ import annotations

import signal
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
import orjson
import pytest

BODY = b'{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}'
DELAY_MS = 40


@pytest.mark.parametrize("http2", [False, True], ids=["http1", "h2"])
def test_the_command_paces_events_and_writes_its_counts_when_stopped(
    tmp_path: Path, http2: bool
) -> None:
    port_file, stats_file = tmp_path / "port", tmp_path / "stats.json"
    command = [
        sys.executable, "-m", "llmitm.testing.tls_upstream", "--port-file", str(port_file),
        "--events", "2", "--event-delay-ms", str(DELAY_MS), "--stats-file", str(stats_file),
        *(["--http2"] if http2 else []),
    ]  # fmt: skip
    server = subprocess.Popen(command)
    try:
        deadline = time.monotonic() + 30
        while len(port_file.read_text().split() if port_file.exists() else []) < 2:
            assert time.monotonic() < deadline and server.poll() is None, "never listened"
            time.sleep(0.05)
        port, ca_file = port_file.read_text().split()
        verify = ssl.create_default_context(cafile=ca_file)
        gaps = []
        with httpx.Client(http2=http2, verify=verify, timeout=10) as client:
            for _ in range(2):
                url = f"https://127.0.0.1:{port}/v1/chat/completions"
                with client.stream("POST", url, content=BODY) as response:
                    assert response.http_version == ("HTTP/2" if http2 else "HTTP/1.1")
                    arrived = []
                    body = b""
                    for piece in response.iter_raw():
                        arrived.append(time.monotonic())
                        body += piece
                assert body.endswith(b"data: [DONE]\n\n")
                assert body.count(b"data: ") == 5  # the role, two words, the usage, [DONE]
                gaps.append(arrived[-1] - arrived[0])
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=10)
    # Four waits between five events: the answer takes at least that long after its first.
    assert min(gaps) >= 4 * DELAY_MS / 1000 * 0.9
    stats = orjson.loads(stats_file.read_bytes())
    assert stats["handshakes"] == 1
    assert stats["requests"] == 2
    assert stats["protocols"] == {"h2" if http2 else "http/1.1": 1}
    # The first event goes out before any wait: the server's share of the time to first byte.
    assert 0 < stats["answer_ms"] < DELAY_MS
