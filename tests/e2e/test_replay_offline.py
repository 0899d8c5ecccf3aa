"""Replay opens no socket at all: with the reverse target a tripwire, requests that are not
LLM calls get an OpenAI-shaped error naming replay mode, and a raw tunnel that mitmproxy
would pass through unseen (``ignore_hosts``) is refused before it dials."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import httpx2 as httpx
import pytest

from .processes import llmitm_proxy
from .test_record_replay import tripwire
from .test_routing import free_port

pytestmark = pytest.mark.slow

NOT_LLM_CALLS = [
    ("GET", "/v1/models", None),
    ("GET", "/health", None),
    ("POST", "/v1/embeddings", b'{"model": "m", "input": "a"}'),
    ("POST", "/upload/trace", b"binary"),
]


def test_replay_answers_what_is_no_llm_call_and_never_dials(tmp_path: Path) -> None:
    with tripwire() as wire:
        args = [
            "--set", "llmitm_record=replay",
            "--set", f"llmitm_store={tmp_path / 'empty.db'}",
            # Only the tunnel's spelling of the tripwire: the reverse target is 127.0.0.1.
            "--set", f"ignore_hosts=^localhost:{wire.port}$",
        ]  # fmt: skip
        modes = [f"reverse:{wire.url}", f"regular@{free_port()}"]
        with llmitm_proxy(tmp_path, modes=modes, extra=args) as proxy:
            base = f"http://127.0.0.1:{proxy.port()}"
            for method, path, body in NOT_LLM_CALLS:
                response = httpx.request(method, base + path, content=body, timeout=10)
                assert response.status_code == 502, (path, response.text)
                error = response.json()["error"]
                assert error["code"] == "replay_offline" and "replay mode" in error["message"]
                assert response.headers["x-llmitm-replay"] == "offline"
            assert httpx.get(f"{base}/_llmitm/status", timeout=10).status_code == 200
            # A tunnel to the tripwire that mitmproxy passes through as raw TCP.
            with socket.create_connection(("127.0.0.1", proxy.port("regular")), timeout=10) as s:
                s.sendall(f"CONNECT localhost:{wire.port} HTTP/1.1\r\n\r\n".encode())
                s.recv(4096)
                s.sendall(b"hello")
                s.settimeout(2)
                try:
                    while s.recv(4096):
                        pass
                except (TimeoutError, ConnectionResetError):
                    pass
            time.sleep(0.2)  # a dial would have reached the tripwire by now
    # ``tripwire`` fails the test on exit if anything connected to it.
