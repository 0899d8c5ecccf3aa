"""The llmitm content view in a real browser: mitmweb with llmitm's addons on loopback, a
Responses stream translated from a chat-only upstream sent through it by the openai SDK, and
headless Chromium opening the flow. The flow list shows the client's path, mitmweb picks the
llmitm view by itself ("auto"), and it shows both sides of the call, labelled: the Request tab
what the client sent and what went upstream, the Response tab what the upstream answered and
what the client got; the screenshots stay in test-artifacts/ (git-ignored).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from .browser import chromium, open_page
from .processes import ROOT, Upstream, _stop, fake_upstream

pytestmark = pytest.mark.slow

MITMWEB = Path(sys.executable).with_name("mitmweb")
ADDON = ROOT / "addon" / "llmitm_addon.py"
ARTIFACT = ROOT / "test-artifacts" / "mitmweb-llmitm-view.png"
REQUEST_ARTIFACT = ROOT / "test-artifacts" / "mitmweb-llmitm-request.png"
LIST_ARTIFACT = ROOT / "test-artifacts" / "mitmweb-llmitm-list.png"

CONFIG = """
[endpoints.chat-only]
kind = "compatible"
base_url = "{url}/v1"
apis = ["chat"]

[[routes]]
models = ["over-chat*"]
endpoints = ["chat-only"]
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Web:
    def __init__(self, proxy_port: int, web_port: int, token: str) -> None:
        self.proxy_port = proxy_port
        self.web_port = web_port
        self.token = token

    def api(self, path: str) -> object:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.web_port}{path}",
            headers={"Authorization": f"Bearer {self.token}"},
        )
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(request, timeout=10) as answer:
            return json.loads(answer.read())


@pytest.fixture
def mitmweb(tmp_path: Path) -> Iterator[tuple[Web, Upstream]]:
    with fake_upstream(tmp_path, "chat") as upstream:
        config = tmp_path / "llmitm.toml"
        config.write_text(CONFIG.format(url=upstream.url))
        listenfile = tmp_path / "listen.json"
        web = Web(0, free_port(), secrets.token_hex(16))
        log = tmp_path / "mitmweb.log"
        argv = [
            str(MITMWEB), "-s", str(ADDON),
            "--mode", "reverse:http://127.0.0.1:9",
            "--listen-host", "127.0.0.1", "--listen-port", "0",
            "--web-host", "127.0.0.1", "--web-port", str(web.web_port),
            "--no-web-open-browser",
            "--set", f"web_password={web.token}",
            "--set", f"confdir={tmp_path / 'confdir'}",
            "--set", f"llmitm_config={config}",
            "--set", f"llmitm_listenfile={listenfile}",
            "--set", f"llmitm_store={tmp_path / 'llmitm.db'}",
        ]  # fmt: skip
        with log.open("wb") as output:
            process = subprocess.Popen(
                argv, stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        try:
            deadline = time.monotonic() + 60
            while not (listenfile.exists() and listenfile.stat().st_size):
                if process.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"mitmweb did not start:\n{log.read_text(errors='replace')}")
                time.sleep(0.1)
            listening = json.loads(listenfile.read_bytes())
            web.proxy_port = int(listening["servers"][0]["addresses"][0][1])
            yield web, upstream
        finally:
            _stop(process)


def test_mitmweb_shows_a_translated_stream_in_the_llmitm_view(
    mitmweb: tuple[Web, Upstream], tmp_path: Path
) -> None:
    web, upstream = mitmweb
    client = openai.OpenAI(
        base_url=f"http://127.0.0.1:{web.proxy_port}/v1", api_key="sk-test", max_retries=0
    )
    with client.responses.stream(model="over-chat-web", input="Say hello") as stream:
        for _event in stream:
            pass
        assert stream.get_final_response().output_text == "Hello from the fake upstream."

    flows = web.api("/flows")
    assert isinstance(flows, list) and flows
    flow_id = flows[-1]["id"]
    assert flows[-1]["request"]["path"] == "/v1/responses"  # the client's call, not upstream's
    # The server side first: mitmweb's own content API picks the view by itself.
    shown = web.api(f"/flows/{flow_id}/response/content/auto.json")
    assert isinstance(shown, dict) and shown["view_name"] == "llmitm", shown
    assert "llmitm · Responses stream · model over-chat-web" in shown["text"]
    assert "upstream answered (Chat Completions)" in shown["text"]
    assert "llmitm · Chat Completions stream" in shown["text"]
    assert shown["text"].count("Hello from the fake upstream.") == 2
    sent = web.api(f"/flows/{flow_id}/request/content/auto.json")
    assert isinstance(sent, dict) and sent["view_name"] == "llmitm", sent
    assert "client sent (Responses API) · POST http://127.0.0.1:9/v1/responses" in sent["text"]
    assert f"sent upstream (Chat Completions) · POST {upstream.url}" in sent["text"]

    async def look() -> tuple[str, str, str]:
        with chromium(tmp_path) as websocket_url:
            page = await open_page(websocket_url)
            base = f"http://127.0.0.1:{web.web_port}/?token={web.token}"

            async def load(fragment: str) -> None:
                # mitmweb reads its route when the page loads, not when only the fragment
                # changes: each tab gets a page of its own.
                await page.call("Page.navigate", url="about:blank")
                await page.call("Page.navigate", url=f"{base}#{fragment}")

            await load("/flows")
            listed = await page.wait_for_text("/v1/responses", "200")
            await page.screenshot(LIST_ARTIFACT)
            await load(f"/flows/{flow_id}/request")
            request_tab = await page.wait_for_text(
                "client sent (Responses API)",
                "sent upstream (Chat Completions)",
                "/v1/chat/completions",
                "llmitm · Chat Completions request",
            )
            await page.screenshot(REQUEST_ARTIFACT)
            await load(f"/flows/{flow_id}/response")
            response_tab = await page.wait_for_text(
                "upstream answered (Chat Completions)",
                "client got (Responses API)",
                "llmitm · Responses stream",
                "Hello from the fake upstream.",
                "finish: completed",
            )
            await page.screenshot(ARTIFACT)
            page.connection.close()
            return listed, request_tab, response_tab

    listed, request_tab, response_tab = asyncio.run(look())
    # The list names the client's path only: the upstream's is in the view, labelled.
    assert "/v1/chat/completions" not in listed.split("client sent")[0]
    assert "llmitm" in request_tab and "llmitm" in response_tab  # the view menu names it
    assert ARTIFACT.stat().st_size > 10_000 and REQUEST_ARTIFACT.stat().st_size > 10_000
