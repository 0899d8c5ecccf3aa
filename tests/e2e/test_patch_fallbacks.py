"""A real mitmdump whose mitmproxy lacks the private module the cut-stream patch needs:
llmitm still loads, says so once, and serves — with mitmproxy's own behaviour on a cut.

The ``-s`` script hides ``mitmproxy.proxy.layers.http._events`` before it imports llmitm (as a
mitmproxy that renamed it would), so the guarded import in ``addons/patches/cut_streams.py``
fails. mitmproxy itself keeps working: it imported the module long before any script.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2 as httpx
import orjson
import pytest

from .processes import Upstream, fake_upstream

pytestmark = pytest.mark.slow

MITMDUMP = Path(sys.executable).with_name("mitmdump")

HIDING_SCRIPT = """
import sys

sys.modules["mitmproxy.proxy.layers.http._events"] = None  # a mitmproxy without it

from llmitm.addons import make_addons

addons = make_addons()
"""

CONFIG = """
[endpoints.local]
kind = "compatible"
base_url = "{url}/v1"
apis = ["chat"]

[[routes]]
models = ["gpt-*"]
endpoints = ["local"]
"""

WARNING = "cut upstream streams: mitmproxy"
HEADERS = {"authorization": "Bearer sk-test"}
BODY = {"model": "gpt-5", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstream]:
    with fake_upstream(tmp_path_factory.mktemp("patch-upstream"), "chat") as fake:
        yield fake


def _listening(listenfile: Path, process: subprocess.Popen[bytes], log: Path) -> int:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if listenfile.exists() and listenfile.stat().st_size:
            servers = orjson.loads(listenfile.read_bytes())["servers"]
            return int(servers[0]["addresses"][0][1])
        if process.poll() is not None:
            raise RuntimeError(f"mitmdump exited with {process.returncode}:\n{log.read_text()}")
        time.sleep(0.05)
    raise TimeoutError(f"mitmdump did not listen within 60 s:\n{log.read_text()}")


def test_without_the_private_module_llmitm_serves_and_says_so_once(
    tmp_path: Path, upstream: Upstream
) -> None:
    script = tmp_path / "hiding_addon.py"
    script.write_text(HIDING_SCRIPT)
    config = tmp_path / "llmitm.toml"
    config.write_text(CONFIG.format(url=upstream.url))
    listenfile, log = tmp_path / "listen.json", tmp_path / "mitmdump.log"
    argv = [
        str(MITMDUMP), "-s", str(script),
        "--mode", f"reverse:{upstream.url}",
        "--listen-host", "127.0.0.1", "--listen-port", "0",
        "--set", f"llmitm_config={config}",
        "--set", f"confdir={tmp_path / 'confdir'}",
        "--set", f"llmitm_listenfile={listenfile}",
        "--set", "llmitm_store=",
        "--set", "termlog_verbosity=warn",
        "--set", "flow_detail=0",
    ]  # fmt: skip
    with log.open("wb") as out:
        process = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=os.environ
        )
    try:
        port = _listening(listenfile, process, log)
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        with httpx.Client(timeout=30, headers=HEADERS) as client:
            answer = client.post(url, json=BODY)
            assert answer.status_code == 200, answer.text
            assert answer.json()["choices"][0]["message"]["content"]
            assert answer.headers["x-llmitm-endpoint"] == "local"  # llmitm routed it

            # The public path on a cut: mitmproxy closes the client's connection mid-body
            # (with the patch, the stream would end in an error chunk and [DONE]).
            cut = {"x-fake-scenario": "text;events=40;disconnect_after=4"}
            received = b""
            request = client.build_request("POST", url, json={**BODY, "stream": True}, headers=cut)
            stream = client.send(request, stream=True)
            assert stream.status_code == 200
            with pytest.raises(httpx.RemoteProtocolError):
                for chunk in stream.iter_bytes():
                    received += chunk
            stream.close()
            assert b"data: " in received and b"[DONE]" not in received

            again = client.post(url, json=BODY)  # and the proxy serves on
            assert again.status_code == 200, again.text
    finally:
        process.terminate()
        process.wait(timeout=30)
    output = log.read_text(errors="replace")
    assert output.count(WARNING) == 1, output
    assert "_events" in output  # the warning names what is missing
    assert "Traceback" not in output, output
