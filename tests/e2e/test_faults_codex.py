"""Codex in its default configuration against an upstream that stalls mid-stream.

Without an idle limit Codex waits five minutes for the next event of a silent stream. Under
``llmitm run -- codex exec`` with ``[routing] stream_idle_timeout`` at one second, each
attempt's stream ends a second after going silent with ``error`` + ``response.failed`` —
over Codex's default WebSocket transport as over HTTPS — which Codex reads as a failed
stream of its own API: it retries, then gives up with llmitm's message, and exits.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from .conftest import codex_env
from .processes import LLMITM, fake_upstream

pytestmark = pytest.mark.slow

CONFIG = """
[routing]
stream_idle_timeout = 1

[endpoints.local]
kind = "compatible"
base_url = "{url}/v1"
apis = ["chat"]
headers = {{ x-fake-scenario = "text;stall_after=2" }}

[[routes]]
models = ["*"]
hosts = ["api.openai.com"]
endpoints = ["local"]
"""


@pytest.mark.parametrize("transport", ["websocket", "https"])
def test_codex_hears_a_stalled_stream_as_an_error_and_exits(
    codex_bin: Path, tmp_path: Path, transport: str
) -> None:
    with fake_upstream(tmp_path, "chat") as fake:
        (tmp_path / "llmitm.toml").write_text(CONFIG.format(url=fake.url))
        home, work = tmp_path / "codex-home", tmp_path / "work"
        home.mkdir()
        work.mkdir()
        env = codex_env(home, {"OPENAI_API_KEY": "sk-test"})
        for key in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY"):
            env.pop(key, None)
        argv = [
            str(LLMITM), "run", "--config", str(tmp_path / "llmitm.toml"),
            "--set", f"confdir={tmp_path / 'confdir'}",
            "--set", f"llmitm_store={tmp_path / 'llmitm.db'}",
            *(["--set", "llmitm_websocket=refuse"] if transport == "https" else []),
            "-q", "--", str(codex_bin), "exec", "--skip-git-repo-check", "Say hello.",
        ]  # fmt: skip
        started = time.monotonic()
        process = subprocess.Popen(
            argv, cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        try:
            _, stderr_bytes = process.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            pytest.fail("Codex hung on a stalled stream", pytrace=False)
        took = time.monotonic() - started
    stderr = stderr_bytes.decode(errors="replace")
    assert process.returncode != 0, stderr[-3000:]
    # llmitm's own words, as the failure of Codex's stream (not a timeout of its own).
    assert "stream disconnected before completion" in stderr, stderr[-3000:]
    assert "ended without a finish_reason" in stderr, stderr[-3000:]
    assert took < 60  # retries of 1 s stalls, not Codex's 300 s idle limit
